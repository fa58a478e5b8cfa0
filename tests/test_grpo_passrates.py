"""GRPO's pass-rate sampling keeps its samples as they come: a run killed part-way resumes without resampling the
prompts it finished (`lab.train.grpo.pass_rate_table` with a cache)."""

import json

import pandas as pd
import pytest

import lab.model.generate as G
from lab.core.config import compose
from lab.model import models
from lab.train import grpo

PUZZLE = ("In Alice's Wonderland, numbers are secretly converted into a different numeral system. Some examples are "
          "given below:\n11 -> XI\n15 -> XV\nNow, write the number {} in the Wonderland numeral system.")
POOL = pd.DataFrame({"id": [f"p{i}" for i in range(6)], "prompt": [PUZZLE.format(30 + i) for i in range(6)],
                     "answer": ["XXX", "XXXI", "XXXII", "XXXIII", "XXXIV", "XXXV"]})


REAL_GENERATE_HF = G.generate_hf


class Killed(Exception):
    pass


def _counting_generate_hf(monkeypatch, die_after=None):
    """generate_hf as it is, counting the prompts it is given per call; raising on call `die_after` + 1."""
    calls = []
    real = REAL_GENERATE_HF

    def wrapped(model, tokenizer, prompts, spec, progress=True, batch_size=32):
        if die_after is not None and len(calls) >= die_after:
            raise Killed()
        calls.append(len(prompts))
        return real(model, tokenizer, prompts, spec, progress, batch_size)

    monkeypatch.setattr(G, "generate_hf", wrapped)
    return calls


def test_a_killed_pass_rate_run_resumes_without_resampling(tmp_path, monkeypatch):
    cfg = compose([f"run_dir={tmp_path}", "grpo.pass_rate_k=2", "infer.batch_size=4", "grpo.temperature=1.0"])
    model, tok = models.load(cfg)
    cache = tmp_path / "checkpoints" / "03_grpo" / "pass_rate_samples.jsonl"

    full_calls = _counting_generate_hf(monkeypatch)
    full = grpo.pass_rate_table(cfg, model, tok, POOL, budget=4)  # no cache: the reference run
    assert full_calls == [2, 2, 2]  # infer.batch_size 4 / pass_rate_k 2 = 2 prompts per generate call

    _counting_generate_hf(monkeypatch, die_after=2)
    with pytest.raises(Killed):
        grpo.pass_rate_table(cfg, model, tok, POOL, budget=4, cache=cache)
    kept = [json.loads(l) for l in cache.read_text().splitlines()[1:]]
    assert sorted({r["id"] for r in kept}) == ["p0", "p1", "p2", "p3"] and len(kept) == 8  # two calls' prompts

    again_calls = _counting_generate_hf(monkeypatch)
    rates = grpo.pass_rate_table(cfg, model, tok, POOL, budget=4, cache=cache)
    assert again_calls == [2]  # only the two prompts the killed run never finished
    assert rates["id"].tolist() == POOL["id"].tolist() and (rates["n"] == 2).all()
    pd.testing.assert_frame_equal(rates.iloc[:4], full.iloc[:4])  # what was kept is what an unbroken run gives

    once_more = _counting_generate_hf(monkeypatch)
    pd.testing.assert_frame_equal(grpo.pass_rate_table(cfg, model, tok, POOL, budget=4, cache=cache), rates)
    assert once_more == []
    changed = compose([f"run_dir={tmp_path}", "grpo.pass_rate_k=2", "infer.batch_size=4", "grpo.temperature=0.5"])
    other = _counting_generate_hf(monkeypatch)
    grpo.pass_rate_table(changed, model, tok, POOL, budget=4, cache=cache)  # another spec: sampled afresh
    assert other == [2, 2, 2]
