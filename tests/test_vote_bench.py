"""bench/vote_bench.py's plumbing on hand-made sample tables (no model): its exit codes, vote rows, temperature
scan and config overrides."""

from __future__ import annotations

import pandas as pd
import pytest
from omegaconf import OmegaConf


def test_bench_without_adapter_exits_2(tmp_path, capsys, bench):
    assert bench("vote_bench").main(["--adapter", str(tmp_path / "none")]) == 2
    assert "make demo" in capsys.readouterr().err


def _samples(answers: dict, gold: dict) -> pd.DataFrame:
    """A samples table, 10 tokens a sample; correct answers are the confident ones (mean log-prob -0.1 vs -2)."""
    return pd.DataFrame([{"id": pid, "category": "t", "gold": gold[pid], "sample": j, "answer": x, "tokens": 10,
                          "finish_reason": "stop", "mean_logprob": -0.1 if x == gold[pid] else -2.0}
                         for pid, ans in answers.items() for j, x in enumerate(ans)])


def test_bench_vote_rows_on_a_hand_made_table(bench):
    bench = bench("vote_bench")
    samples = _samples({"a": ["1", "1", "2", "1"], "b": ["2", "3", "3", "3"], "c": ["5", "5", "5", "5"]},
                       {"a": "1", "b": "2", "c": "5"})
    out = {(r["method"], tuple(sorted(r["options"].items()))): r for r in bench.vote_rows(samples, 4, "final")}
    maj = out[("majority", ())]
    assert maj["accuracy"] == pytest.approx(2 / 3) and maj["token_ratio"] == 1.0 and maj["delta_points"] == 0
    conf = out[("confidence", (("keep_top", 0.25),))]  # the confident trace of b is its correct one
    assert conf["accuracy"] == 1.0 and conf["wins"] == 1 and conf["losses"] == 0
    assert conf["delta_points"] == pytest.approx(100 / 3)
    assert conf["delta_ci95_points"] == pytest.approx(100 * 1.96 * ((1 / 3 - 1 / 9) / 3) ** 0.5)
    assert maj["delta_ci95_points"] == 0.0
    es = out[("early_stop", (("agree", 1.0), ("window", 2)))]
    assert es["token_ratio"] == pytest.approx((2 + 4 + 2) / 12)  # a and c stop after their first window
    md = bench.markdown({"adapter": "A", "finished": "now", "git_commit": "x",
                         "voting": {"k": 4, "puzzles": 3, "temperature": 1.0, "top_p": 1.0, "seed": 0,
                                    "baseline_accuracy": maj["accuracy"], "baseline_tokens_per_puzzle": 40.0,
                                    "methods": list(out.values()), "greedy_decode": None, "curve": [],
                                    "sampling": {"rows_drawn_now": 0, "tokens_drawn_now": 0, "wall_seconds": 0.0}}})
    assert "maj@4" in md and "confidence keep_top=0.25" in md
    assert "against the sampling temperature" not in md  # no scan, no section


def test_bench_temperature_scan_row(bench):
    bench = bench("vote_bench")
    samples = _samples({"a": ["1", "1", "1", "1"], "b": ["2", "3", "2", "3"], "c": ["4", "5", "5", "5"]},
                       {"a": "1", "b": "3", "c": "5"})
    r = bench.scan_row(samples, 4, "final", {"window": 2, "agree": 1.0})
    # one sample (maj@1 of lab.eval.vote.curves, the mean over all 4 samples): a 4/4, b 2/4, c 3/4; maj@4: a, c (b ties
    # 2-2, the first-seen '2' wins); pass@4: all three
    assert (r["first_sample"], r["maj_at_k"], r["pass_at_k"]) == (pytest.approx(0.75), pytest.approx(2 / 3), 1.0)
    # early stop: a stops after its first window ("1","1"); b and c run to the end (no window agrees)
    assert r["early_stop_token_ratio"] == pytest.approx((2 + 4 + 4) / 12)
    assert (r["early_stop_delta_points"], r["wins"], r["losses"]) == (0.0, 0, 0)
    md = bench.markdown({"adapter": "A", "finished": "now", "git_commit": "x",
                         "voting": {"k": 4, "puzzles": 3, "temperature": 0.5, "top_p": 1.0, "seed": 0,
                                    "baseline_accuracy": r["maj_at_k"], "baseline_tokens_per_puzzle": 40.0,
                                    "methods": [], "greedy_decode": None, "curve": [],
                                    "temperature_scan": [{"temperature": 0.5, **r}],
                                    "sampling": {"rows_drawn_now": 0, "tokens_drawn_now": 0, "wall_seconds": 0.0}}})
    assert "| 0.5 | 0.750 | 0.667 | 1.000 | 0.667 | +0.0 | 0.833 | 3.3 | 0 | 0 |" in md


def test_bench_config_overrides(tmp_path, bench):
    bench = bench("vote_bench")
    stage = tmp_path / "03_grpo"
    (stage / "adapter").mkdir(parents=True)
    (stage / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create({"seed": 1, "infer": {"batch_size": 32}})))
    cfg, src = bench.load_config(stage / "adapter", ["infer.batch_size=64", "seed=3"])
    assert (cfg.infer.batch_size, cfg.seed, src) == (64, 3, str(stage / "config.yaml"))
