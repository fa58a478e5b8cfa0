"""The figures' data, not their pixels: whole-number counts on a lattice get bins with no empty ones between them,
legends cover no drawn data, a reward band stays inside the reward's range, and a one-category run draws one bar."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg

from lab.core import plots
from lab.train.rewards import log_bounds


def test_integer_bins_leave_no_comb_on_a_lattice():
    """The demo's trace lengths: whole tokens, mostly every 4 (22 ... 64): the old width of 2 left every other bin
    empty; the bins now sit at half-integers and none inside the range is empty."""
    rng = np.random.default_rng(0)
    tokens = pd.Series(np.r_[4 * rng.integers(6, 17, 500), [22, 25, 26, 29, 30, 33, 34, 37]])
    edges = plots._integer_bins(tokens)
    assert np.allclose(edges % 1, 0.5) and len(set(np.diff(edges))) == 1  # half-integers, one whole width
    counts, _ = np.histogram(tokens, edges)
    assert counts.all() and counts.sum() == len(tokens)
    old = np.arange(22, 64 + 3, 2) - 0.5  # the width of 2 the range alone gave: a comb
    assert (np.histogram(tokens, old)[0] == 0).sum() >= 6
    dense = pd.Series(range(0, 300))
    assert len(plots._integer_bins(dense)) - 1 <= 30  # a dense range keeps at most 30 bins
    assert plots._integer_bins(pd.Series([0.5, 1.25])) is None  # not whole numbers: the caller's float bins


def _legend_overlaps(fig) -> list[str]:
    """What each axes' legend covers: a drawn point of a line, or a bar / histogram patch with height."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    r = canvas.get_renderer()
    hits = []
    for ax in fig.axes:
        leg = ax.get_legend()
        if leg is None:
            continue
        box = leg.get_window_extent(r)
        for ln in ax.get_lines():
            xy = ln.get_transform().transform(np.column_stack(ln.get_data()).astype(float))
            xy = xy[np.isfinite(xy).all(axis=1)]
            if any(box.contains(x, y) for x, y in xy):
                hits.append(f"line {ln.get_label()}")
        for p in ax.patches:
            e = p.get_window_extent(r)
            if e.height > 1 and e.overlaps(box):
                hits.append(f"patch {p.get_label()}")
    return hits


def test_legends_cover_no_data():
    k = np.arange(1, 9)
    curves = pd.DataFrame({"k": k, "pass_at_k": 0.9 + 0.01 * k, "maj_at_k": 0.88 + 0.01 * k})  # high from k=1
    fig = plots.vote_k(curves, greedy=0.9, n=100)
    assert fig.axes[0].get_legend() is not None and _legend_overlaps(fig) == []
    df = pd.DataFrame({"category": ["a"] * 60 + ["b"] * 60, "correct": [True, False] * 60,
                       "tokens": pd.array(list(np.arange(60) * 100) * 2, dtype="Int64")})
    fig = plots.lengths(df, budget=7680, categories=["a", "b"])
    assert _legend_overlaps(fig) == []


def test_the_old_legend_places_are_caught():
    """Negative control of the check above: the legend where vote_k put it before (upper left) over curves that
    start high covers them."""
    k = np.arange(1, 9)
    curves = pd.DataFrame({"k": k, "pass_at_k": 0.9 + 0.01 * k, "maj_at_k": 0.88 + 0.01 * k})
    fig = plots.vote_k(curves, greedy=0.9, n=100)
    fig.axes[0].legend(fontsize=8, loc="upper left")
    assert _legend_overlaps(fig)


def test_reward_bands_stay_in_the_rewards_range():
    """Means near 1 over 64 completions with a wide spread: the normal interval runs past 1; the band is clipped to
    the reward's range ([0, 1] for correctness, the weighted total's [0, 1.2] for correctness 1 + format 0.2)."""
    log = pd.DataFrame({"step": [1, 2, 3], "reward": [1.15, 1.18, 0.05], "reward_std": [0.3, 0.3, 0.2],
                        "rewards/correctness/mean": [0.97, 0.99, 0.02], "rewards/correctness/std": [0.2, 0.1, 0.15]})
    bounds = log_bounds({"correctness": 1.0, "format": 0.2})
    assert bounds["reward"] == (0.0, 1.2) and bounds["rewards/correctness/mean"] == (0.0, 1.0)
    fig = plots.line(log, "step", ["reward", "rewards/correctness/mean"], "r", n=64, bounds=bounds)
    bands = [c for c in fig.axes[0].collections]
    assert len(bands) == 2
    for band, (lo, hi) in zip(bands, (bounds["reward"], bounds["rewards/correctness/mean"])):
        y = band.get_paths()[0].vertices[:, 1]
        assert y.min() >= lo - 1e-12 and y.max() <= hi + 1e-12
    unclipped = plots.line(log, "step", ["rewards/correctness/mean"], "r", n=64)  # the old band: past 1 and 0
    y = unclipped.axes[0].collections[0].get_paths()[0].vertices[:, 1]
    assert y.max() > 1.0 and y.min() < 0.0
    assert log_bounds({"length": 0.5})["reward"] == (-0.5, 0.0)


def test_one_category_draws_one_bar_per_series():
    one = pd.DataFrame({"category": ["numeral_system", "all"], "n": [100, 100], "correct": [40, 40],
                        "accuracy": [0.4, 0.4], "lo": [0.31, 0.31], "hi": [0.5, 0.5]})
    assert len(plots.accuracy_bars({"final": one}, "t").axes[0].patches) == 1
    assert len(plots.accuracy_bars({"before": one, "after": one}, "t").axes[0].patches) == 2
    two = pd.DataFrame({"category": ["a", "b", "all"], "n": [50, 50, 100], "correct": [10, 30, 40],
                        "accuracy": [0.2, 0.6, 0.4], "lo": [0.1, 0.46, 0.31], "hi": [0.33, 0.72, 0.5]})
    assert len(plots.accuracy_bars({"final": two}, "t").axes[0].patches) == 3  # several: 'all' stays
