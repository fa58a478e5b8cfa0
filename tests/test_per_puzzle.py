"""Per-puzzle failures stay per-puzzle (issue 28, item 5): a held-out prompt too long for model.max_model_len is
skipped, named and scored wrong; the other puzzles of its batch are generated as usual."""

import pandas as pd

from lab.eval import sampling as S
from lab.model import generate as G
from lab.model import models
from lab.core.config import compose

PUZZLE = ("In Alice's Wonderland, numbers are secretly converted into a different numeral system. Some examples are "
          "given below:\n11 -> XI\n15 -> XV\nNow, write the number 38 in the Wonderland numeral system.")


def test_an_oversized_prompt_is_skipped_and_named_not_fatal(tmp_path, capsys):
    cfg = compose([f"run_dir={tmp_path}", "infer.max_tokens=4"])
    model, tok = models.load(cfg)
    huge = PUZZLE + " 12 -> XII" * 400  # far beyond the tiny model's max_model_len
    puzzles = pd.DataFrame({"id": ["ok1", "huge", "ok2"], "prompt": [PUZZLE, huge, PUZZLE],
                            "answer": ["XXXVIII"] * 3})
    with G.Generator(cfg, model=model, tokenizer=tok) as gen:
        pred = S.predictions(gen, puzzles, out_csv=tmp_path / "predictions.csv",
                             cache=tmp_path / "cache.jsonl")
        samples = S.sample_table(gen, puzzles, G.Sampling.competition(cfg, n=2, temperature=0.5), progress=False)
    assert pred["id"].tolist() == ["ok1", "huge", "ok2"]
    row = pred.set_index("id").loc["huge"]
    assert row["finish_reason"] == S.SKIPPED and not row["correct"] and row["tokens"] == 0
    assert set(pred.set_index("id").loc[["ok1", "ok2"], "finish_reason"]) <= {"stop", "length"}
    assert (pred.set_index("id").loc[["ok1", "ok2"], "tokens"] > 0).all()
    assert samples[samples["id"] == "huge"]["sample"].tolist() == [0, 1]  # all n samples, so voting counts it
    out = capsys.readouterr().out
    assert "1 of 3 puzzle(s) skipped" in out and "huge" in out and "max_model_len=384" in out
