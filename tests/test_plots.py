"""Every figure of the demo renders from small literal data, and none is empty (issue 28, item 10); the ones the
issue named carry intervals, show their whole legend and labels, draw the completion budget, and show the data."""

import functools

import numpy as np
import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PolyCollection

from lab.core import plots
from lab.eval.analysis import accuracy_table, length_table, taxonomy, with_failures

PRED = pd.DataFrame({
    "id": [str(i) for i in range(8)], "category": ["bit_manipulation"] * 4 + ["gravity"] * 4, "subtype": "",
    "gold": ["1010", "0110", "1111", "0000", "9.8", "4.9", "1.2", "3.3"],
    "completion": ["\\boxed{1010}", "\\boxed{0111}", "\\boxed{1111}", "no box", "\\boxed{9.8}", "\\boxed{5.0}",
                   "</think>\\boxed{1.2}", "\\boxed{3.3}"],
    "answer": ["1010", "0111", "1111", "", "9.8", "5.0", "1.2", "3.3"],
    "correct": [True, False, True, False, True, False, True, True], "tokens": [12, 30, 15, 48, 20, 22, 18, 40],
    "finish_reason": ["stop"] * 3 + ["length"] + ["stop"] * 4})
CURVES = pd.DataFrame({"k": [1, 2, 3, 4], "pass_at_k": [0.4, 0.55, 0.62, 0.66], "maj_at_k": [0.4, 0.45, 0.47, 0.5],
                       "tokens_per_puzzle": [30.0, 60.0, 90.0, 120.0]})
METHODS = pd.DataFrame({"method": ["greedy (Kaggle)", "majority", "early_stop"], "accuracy": [0.45, 0.5, 0.48],
                        "tokens_per_puzzle": [28.0, 120.0, 64.0]})
GRPO_LOG = pd.DataFrame({"step": [1, 2, 3], "reward": [0.2, 0.35, 0.3], "reward_std": [0.3, 0.25, 0.2],
                         "rewards/correctness/mean": [0.1, 0.3, 0.25], "rewards/correctness/std": [0.3, 0.4, 0.4]})


@functools.cache
def _demo_figures():
    df = with_failures(PRED)
    solved = pd.DataFrame({"trace_tokens": [40, 41, 41, 44, 52, 60, 61, 61], "category": ["a"] * 4 + ["b"] * 4})
    acc = accuracy_table(PRED)
    return {
        "trace_tokens.png": plots.histogram(solved, "trace_tokens", "category", "Solver trace length", "tokens"),
        "loss.png": plots.line(pd.DataFrame({"step": [10, 20], "loss": [2.0, 1.1]}), "step", ["loss"], "SFT loss"),
        "accuracy.png": plots.accuracy_bars({"before SFT": acc, "after SFT": acc}, "Held-out accuracy"),
        "rewards.png": plots.line(GRPO_LOG, "step", ["reward", "rewards/correctness/mean"], "GRPO rewards", "reward",
                                  n=8),
        "vote_k.png": plots.vote_k(CURVES, greedy=0.45, n=40),
        "vote_tokens.png": plots.vote_tokens(CURVES, METHODS, n=40),
        "accuracy_by_category.png": plots.accuracy_bars({"final": acc}, "Held-out accuracy by category"),
        "taxonomy.png": plots.taxonomy(taxonomy(PRED)),
        "lengths.png": plots.lengths(df, 45, ["bit_manipulation", "gravity"]),
    }


def _drawn(ax) -> int:
    """Data artists with something in them: lines with points, bars with height, filled or scattered collections."""
    n = sum(1 for ln in ax.lines if len(ln.get_xdata()) and not ln.get_label().startswith("_child"))
    n += sum(1 for p in ax.patches if p.get_extents().width > 0 and p.get_extents().height > 0)
    n += sum(1 for c in ax.collections if (len(c.get_offsets()) or len(c.get_paths())))
    return n


@pytest.mark.parametrize("name", list(_demo_figures()))
def test_every_demo_figure_renders_and_is_not_empty(name, tmp_path):
    import matplotlib.image as mpimg

    fig = _demo_figures()[name]
    assert all(_drawn(ax) > 0 for ax in fig.axes), name
    png = plots.save(fig, tmp_path / name)
    img = mpimg.imread(png)
    assert img.shape[0] > 100 and img.std() > 0.01  # an image with content, not one flat colour


def test_estimates_carry_intervals():
    figs = _demo_figures()
    for name in ("vote_k.png", "vote_tokens.png", "rewards.png"):
        ax = figs[name].axes[0]
        bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
        bars = [c for c in ax.collections if type(c).__name__ == "LineCollection"]  # errorbar whiskers
        assert bands or bars, name
    assert "95%" in figs["rewards.png"].axes[0].get_title()


def _extent(fig, artist):
    fig.canvas = FigureCanvasAgg(fig) if not isinstance(fig.canvas, FigureCanvasAgg) else fig.canvas
    fig.canvas.draw()
    return artist.get_window_extent(fig.canvas.get_renderer())


def test_vote_tokens_legend_hides_no_marker_and_vote_k_end_labels_are_inside():
    fig = plots.vote_tokens(CURVES, METHODS, n=40)
    ax = fig.axes[0]
    legend = _extent(fig, ax.get_legend())
    points = ax.transData.transform(METHODS[["tokens_per_puzzle", "accuracy"]].to_numpy())
    assert not any(legend.contains(x, y) for x, y in points)
    assert {t.get_text() for t in ax.get_legend().get_texts()} >= {f"{m}: {a:.2f}" for m, a in
                                                                   zip(METHODS["method"], METHODS["accuracy"])}
    fig = plots.vote_k(CURVES, greedy=0.45, n=40)
    ax = fig.axes[0]
    box = _extent(fig, ax)
    for label in ax.texts:
        e = label.get_window_extent(fig.canvas.get_renderer())
        assert box.x0 <= e.x0 and e.x1 <= box.x1, label.get_text()  # the end labels sit inside the axes


def test_lengths_draws_the_completion_budget_it_is_given():
    fig = plots.lengths(with_failures(PRED), 45, ["bit_manipulation", "gravity"])
    ax = fig.axes[0]
    budget = [ln for ln in ax.lines if ln.get_linestyle() == "--"]
    assert budget and budget[0].get_xdata()[0] == 45 and "completion budget 45" in budget[0].get_label()
    assert length_table(PRED, 45)["budget"].iloc[0] == 45


def test_integer_counts_get_whole_number_bins():
    fig = plots.histogram(pd.DataFrame({"t": [40, 41, 41, 44, 52], "c": "a"}), "t", "c", "t", "tokens")
    edges = np.unique(np.round([v for p in fig.axes[0].patches for v in p.get_path().vertices[:, 0]], 6))
    assert np.allclose(edges % 1, 0.5)  # every edge between two integers: no empty comb teeth


def test_a_flat_sweep_accuracy_shows_its_value_on_0_to_1():
    df = pd.DataFrame({"seed": [1, 2, 1, 2], "sft.learning_rate": ["1e-4", "1e-4", "2e-4", "2e-4"],
                       "accuracy": [0.0, 0.0, 0.0, 0.0]})
    lo, hi = plots.sweep_against(df, "accuracy", "sft.learning_rate", []).axes[0].get_ylim()
    assert lo <= 0 and hi >= 1


def test_a_flat_reward_curve_is_not_blown_up_to_noise():
    log = pd.DataFrame({"step": [1, 2], "reward": [0.0, 0.0], "reward_std": [0.0, 0.0]})
    lo, hi = plots.line(log, "step", ["reward"], "GRPO rewards", "reward", n=4).axes[0].get_ylim()
    assert hi - lo >= 1
