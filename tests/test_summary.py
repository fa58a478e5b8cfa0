"""The run summary's headline table and the lab's plots, on hand-made stage folders and tables (no model)."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from lab.core import plots
from lab.core.io import atomic_write_csv, atomic_write_json
from lab.eval.analysis import accuracy_table, wilson_interval
from lab.runs.pipeline import headline_table, summary


def preds(correct: list[bool]) -> pd.DataFrame:
    return pd.DataFrame({"id": [f"p{i}" for i in range(len(correct))], "category": "numeral_system",
                         "gold": "X", "completion": ["\\boxed{X}" if c else "\\boxed{V}" for c in correct],
                         "answer": ["X" if c else "V" for c in correct], "correct": correct, "tokens": 10})


@pytest.fixture()
def run(tmp_path):
    before = [False] * 10
    sft = [True] * 4 + [False] * 6
    grpo = [True] * 3 + [False] * 5 + [True] * 2  # p3 broken, p8 and p9 fixed
    for stage, name, c in (("02_sft", "predictions_before.csv", before), ("02_sft", "predictions.csv", sft),
                           ("03_grpo", "predictions.csv", grpo), ("04_vote", "predictions.csv", grpo)):
        atomic_write_csv(tmp_path / stage / name, preds(c))
    metrics = {"01_explore": {"n_train": 40, "n_val": 10, "solver_solved_share": 1.0, "wall_seconds": 3.0},
               "02_sft": {"accuracy_before": 0.0, "accuracy_after": 0.4, "loss_per_step": [1.0] * 20, "wall_seconds": 60.0},
               "03_grpo": {"accuracy_sft_start": 0.4, "accuracy_after": 0.5, "reward_per_step": [0.1] * 20,
                           "wall_seconds": 90.0},
               "04_vote": {"k": 8, "greedy_accuracy": 0.5, "maj_at_k": 0.6, "pass_at_k": 0.9, "wall_seconds": 30.0},
               "05_errors": {"n": 10, "accuracy": 0.5, "truncated": 2, "fixed_since_sft": 2, "broken_since_sft": 1,
                             "wall_seconds": 5.0}}
    for stage, m in metrics.items():
        atomic_write_json(tmp_path / stage / "metrics.json", m)
    return tmp_path


def test_headline_table_has_intervals_and_fixed_broken_against_the_previous_stage(run):
    rows = {(r["stage"], r["metric"]): r for r in headline_table(run)}
    sft = rows[("02_sft", "accuracy after SFT")]
    lo, hi = wilson_interval(4, 10)
    assert sft["value"] == 0.4 and sft["n"] == 10 and sft["ci95"] == f"[{lo:.2f}, {hi:.2f}]"
    assert sft["fixed / broken"] == "4 / 0"
    assert rows[("03_grpo", "accuracy after GRPO")]["fixed / broken"] == "2 / 1"
    assert rows[("04_vote", "greedy accuracy (Kaggle's setting)")]["fixed / broken"] == "0 / 0"
    assert rows[("04_vote", "maj@8")]["ci95"] and rows[("04_vote", "pass@8")]["value"] == 0.9
    assert rows[("05_errors", "accuracy of the final predictions")]["fixed / broken"] == "2 / 1 since SFT"


def test_summary_md_is_one_table_without_per_step_lists(run):
    s = summary(run)
    md = (run / "summary.md").read_text()
    assert s["total_wall_seconds"] == 188.0 and "Wall time: 188 s" in md
    header = [ln for ln in md.splitlines() if ln.startswith("| stage")]
    assert len(header) == 1 and "95% interval" in header[0] and "fixed / broken vs previous stage" in header[0]
    assert "[1.0" not in md and "0.1, 0.1" not in md  # the per-step series stay in summary.json and the CSVs
    assert s["stages"]["02_sft"]["loss_per_step"] == [1.0] * 20
    assert re.search(r"\| 01_explore +\| training puzzles +\| 40 +\|", md)  # counts stay whole numbers
    assert re.search(r"\| 03_grpo +\| accuracy after GRPO +\| 0\.500 +\| \[0\.24, 0\.76\] +\| 10 +\| 2 / 1", md)


def test_accuracy_bars_show_every_value_and_interval_even_a_zero():
    before, after = accuracy_table(preds([False] * 10)), accuracy_table(preds([True] * 4 + [False] * 6))
    fig = plots.accuracy_bars({"before SFT": before, "after SFT": after}, "t")
    ax = fig.axes[0]
    texts = [t.get_text() for t in ax.texts]
    assert texts.count("0.00") == 1 and texts.count("0.40") == 1  # one category: its bar, not 'all' again
    bars = [p for p in ax.patches]
    assert len(bars) == 2 and all(b.get_linewidth() > 0 for b in bars)  # a bar of 0 still shows its edge
    caps = [c for c in ax.collections]  # one error-bar collection per series
    assert len(caps) == 2
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["before SFT", "after SFT"]


def test_vote_k_has_the_greedy_line_and_integer_ks():
    cv = pd.DataFrame({"k": [1, 2, 3], "pass_at_k": [0.4, 0.6, 0.7], "maj_at_k": [0.4, 0.45, 0.5]})
    fig = plots.vote_k(cv, greedy=0.42)
    ax = fig.axes[0]
    names = [t.get_text() for t in ax.get_legend().get_texts()]
    assert names == ["pass@k (any sample right)", "maj@k (majority vote)", "greedy (Kaggle's setting) 0.42"]
    fig.canvas.draw() if hasattr(fig.canvas, "draw") else None
    ticks = ax.xaxis.get_major_locator().tick_values(1, 3)
    assert np.allclose(ticks, np.round(ticks))


def test_line_names_trls_keys_readably():
    log = pd.DataFrame({"step": [1, 2, 3], "reward": [0.1, 0.2, 0.3], "rewards/correctness/mean": [0, 0.5, 1.0]})
    ax = plots.line(log, "step", ["reward", "rewards/correctness/mean"], "t", "reward").axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["total reward (weighted)", "correctness"]
    assert ax.get_xlabel() == "optimiser step"


def test_line_with_nothing_logged_still_draws():
    """A run shorter than logging_steps logs no loss: the notebook's plot says so instead of failing."""
    ax = plots.line(pd.DataFrame(), "step", ["loss"], "SFT training loss", "loss").axes[0]
    assert [t.get_text() for t in ax.texts] == ["nothing logged"]
