"""The data-mix knobs of conf/data (lab.data.dataset): per-category oversampling weights, per-category trace styles and
synthetic-only training with the real file held for validation. Literal frames; no model."""

import importlib

import pandas as pd
import pytest

from lab import LabError
from lab.core.config import compose
from lab.data.dataset import category_weights, oversample, prepare, trace_styles


def frame():
    rows = [("b1", "bit_manipulation"), ("b2", "bit_manipulation"), ("g1", "gravity"), ("g2", "gravity"),
            ("g3", "gravity"), ("g4", "gravity"), ("c1", "text_cipher"), ("n1", "numeral_system")]
    return pd.DataFrame({"id": [r[0] for r in rows], "category": [r[1] for r in rows],
                         "prompt": ["p"] * len(rows), "completion": ["c"] * len(rows)})


def test_oversample_copies_whole_parts_samples_fractions_and_drops_zero():
    df = frame()
    out = oversample(df, {"bit_manipulation": 2, "gravity": 0.5, "text_cipher": 0}, seed=1)
    n = out["category"].value_counts().to_dict()
    assert n == {"bit_manipulation": 4, "gravity": 2, "numeral_system": 1}
    assert list(out.loc[out["category"] == "bit_manipulation", "id"]) == ["b1", "b2", "b1", "b2"]
    assert set(out.loc[out["category"] == "gravity", "id"]) <= {"g1", "g2", "g3", "g4"}
    again = oversample(df, {"bit_manipulation": 2, "gravity": 0.5, "text_cipher": 0}, seed=1)
    assert out.equals(again)
    assert oversample(df, {}, seed=1) is df
    with pytest.raises(LabError, match="category"):
        oversample(df.drop(columns="category"), {"gravity": 2}, seed=1)


def test_weights_are_a_sweepable_override_checked_and_warned(tmp_path, capsys):
    base = [f"run_dir={tmp_path}"]
    assert category_weights(compose(base)) == {}
    assert category_weights(compose(base + ["+data.weights.gravity=2"])) == {"gravity": 2.0}
    assert "WARNING" not in capsys.readouterr().out
    assert category_weights(compose(base + ["+data.weights.bit_manipulation=4"])) == {"bit_manipulation": 4.0}
    assert "beyond 3x" in capsys.readouterr().out
    with pytest.raises(LabError, match="not a category"):
        category_weights(compose(base + ["+data.weights.bits=2"]))
    with pytest.raises(LabError, match=">= 0"):
        category_weights(compose(base + ["+data.weights.gravity=-1"]))
    with pytest.raises(Exception):  # the schema types the weights: a word is refused when the config is composed
        compose(base + ["+data.weights.gravity=lots"])


def test_trace_styles_per_category(tmp_path):
    base = [f"run_dir={tmp_path}", "data.trace_style=derivation"]
    styles = trace_styles(compose(base + ["+data.trace_styles.bit_manipulation=compact"]))
    assert styles["bit_manipulation"] == "compact" and styles["gravity"] == "derivation"
    assert set(trace_styles(compose(base)).values()) == {"derivation"}
    with pytest.raises(LabError, match="trace_styles.gravity"):
        trace_styles(compose(base + ["+data.trace_styles.gravity=verbose"]))


def test_sft_examples_use_each_categorys_style(monkeypatch):
    from lab.train import sft
    from lab.puzzles.common import Solution

    seen, inputs = [], []

    def fake_solve(prompt, vocab=None, priors=None, style="compact"):
        seen.append((prompt, style))
        inputs.append((vocab, priors))
        return Solution("1", "solved", "t\n</think>\n\\boxed{1}", "x", "")

    class Tok:
        eos_token = "<eos>"

        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": text.split()}

    monkeypatch.setattr(importlib.import_module("lab.puzzles.solve"), "solve", fake_solve)  # the module
    monkeypatch.setattr("lab.data.sft_examples.chat_prompt", lambda tok, p: p)
    puzzles = pd.DataFrame({"id": ["a", "b"], "prompt": ["pa", "pb"], "answer": ["1", "1"],
                            "category": ["bit_manipulation", "gravity"]})
    ex, counts = sft.sft_examples(Tok(), puzzles, 100, {"bit_manipulation": "compact", "gravity": "derivation"})
    assert seen == [("pa", "compact"), ("pb", "derivation")]
    assert counts["kept"] == 2 and list(ex["category"]) == ["bit_manipulation", "gravity"]
    # every category's batch input, built from the frame's prompts as `solve_frame` does (the equations' priors too)
    from lab.puzzles import batch_inputs

    want = batch_inputs(puzzles["prompt"])
    assert set(want) == {"vocab", "priors"} and len(inputs) == 2
    assert all(v == want["vocab"] and vars(p) == vars(want["priors"]) for v, p in inputs)


def test_synthetic_train_holds_the_whole_real_file_for_validation(tmp_path):
    from lab.puzzles import generate

    real = pd.concat([generate("gravity", 5, seed=99), generate("numeral_system", 5, seed=99)], ignore_index=True)
    real["id"] = [f"real{i}" for i in range(len(real))]
    path = tmp_path / "train.csv"
    real[["id", "prompt", "answer"]].to_csv(path, index=False)
    base = [f"run_dir={tmp_path / 'run'}", "data=competition", f"data.path={path}",
            "data.categories=[gravity,numeral_system]"]
    train, val = prepare(compose(base + ["data.synthetic_train=true", "data.n_train=3"]))
    assert sorted(val["id"]) == sorted(real["id"])
    assert len(train) == 6 and not set(train["id"]) & set(real["id"])
    assert not set(train["prompt"]) & set(real["prompt"])
    with pytest.raises(LabError, match="n_train"):
        prepare(compose([f"run_dir={tmp_path / 'run2'}", "data=competition", f"data.path={path}",
                         "data.synthetic_train=true"]))


def test_sft_phases_are_checked(tmp_path):
    from lab.train.sft import phases

    assert phases(compose([f"run_dir={tmp_path}"])) == ["traces"]
    assert phases(compose([f"run_dir={tmp_path}", "sft.phases=[drills,traces]"])) == ["drills", "traces"]
    with pytest.raises(LabError, match="phases"):
        phases(compose([f"run_dir={tmp_path}", "sft.phases=[traces,drills]"]))
