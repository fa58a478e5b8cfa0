"""Every plot of the lab, in one style: small functions that take a table and return a matplotlib Figure.

Stage notebooks, the error analysis (`lab.recipes.errors`), the voting notebook and the sweep report
(`lab.runs.sweep_report.report`) all draw here; `save` writes a PNG atomically.

The style, once for all: the Okabe-Ito palette (told apart with any colour vision), constrained layout,
whole-number ticks for steps and k, readable legend names (`label` turns TRL's log keys such as
`rewards/correctness/mean` into `correctness`), accuracy bars with their Wilson 95% interval and their
value written on them (a bar of 0 still shows as a line and a "0.00"), and the greedy score as a
dashed reference line on the voting curves. Every estimate carries its interval: Wilson 95% for accuracies
(bars, the voting curves and markers, given the puzzle count `n`), a 95% normal interval for GRPO's per-step reward
means (given the completions per step), clipped to the reward's range. Legends sit where they cover no data;
whole-number counts get whole-number bins with no comb of empty ones; a share is drawn on 0..1.

What it simplifies: one PNG writer, one figure factory and one palette instead of one per module; no
pyplot state (figures are plain `Figure` objects, saved with the Agg canvas, safe in any backend).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Iterable, Mapping

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from lab.core.io import atomic_file
from lab.core.stats import wilson_interval

# Okabe & Ito (2008), "Color Universal Design": blue, orange, bluish green, reddish purple, sky blue, vermillion,
# yellow, black
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")
GREY = "#999999"
DPI = 110

_NAMES = {"reward": "total reward (weighted)", "loss": "training loss", "pass_at_k": "pass@k (any sample right)",
          "maj_at_k": "maj@k (majority vote)"}  # the series the stages plot


def label(key: str) -> str:
    """A readable legend name for a log or table column: `rewards/correctness/mean` -> `correctness`."""
    if key in _NAMES:
        return _NAMES[key]
    parts = key.split("/")
    if len(parts) == 3 and parts[0] == "rewards":
        return parts[1].replace("_", " ") + ("" if parts[2] == "mean" else f" ({parts[2]})")
    return key.replace("_", " ")


def figure(width: float = 6.4, height: float = 3.8) -> Figure:
    return Figure(figsize=(width, height), layout="constrained", dpi=DPI)


def axes(fig: Figure, *grid) -> Axes:
    """An axes in the lab's style: palette, light grid behind the data."""
    ax = fig.add_subplot(*grid)
    ax.set_prop_cycle(color=PALETTE)
    ax.grid(alpha=0.3)
    ax.set_axisbelow(True)
    return ax


def save(fig: Figure, path: str | os.PathLike) -> Path:
    """Write the figure as PNG atomically (temporary file in the same folder, then rename) and return the path."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    path = Path(path)
    FigureCanvasAgg(fig)
    with atomic_file(path, ".png") as tmp:
        fig.savefig(tmp, format="png", dpi=DPI)
    return path


def _integer_x(ax, values) -> None:
    """Whole-number ticks: every value when there are few (a one-step run shows "1", not 0.95 ... 1.05)."""
    vals = sorted({int(v) for v in pd.to_numeric(pd.Series(list(values)), errors="coerce").dropna()})
    if 0 < len(vals) <= 12:
        ax.set_xticks(vals)
        if len(vals) == 1:
            ax.set_xlim(vals[0] - 1, vals[0] + 1)
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _wilson(acc, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Wilson 95% bounds (lo, hi) of accuracies `acc` over `n` puzzles, each taken as round(acc * n) of n (an
    average over sample windows, maj@k and pass@k, is treated so too: the headline table's convention)."""
    pairs = [wilson_interval(int(round(float(a) * n)), int(n)) if n and a == a else (math.nan, math.nan)
             for a in np.atleast_1d(acc)]
    return np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])


def _integer_bins(values: pd.Series, max_bins: int = 30):
    """Bin edges at half-integers, each bin a whole number of units wide: the narrowest width (from the one that
    gives at most `max_bins` bins) that leaves no empty bin between the smallest and the largest value, so counts
    that fall on a lattice (every 4 tokens) draw no comb of empty bins; the narrowest width when none up to an
    eighth of the range does. None when the values are not all whole numbers."""
    v = pd.to_numeric(values, errors="coerce").dropna()
    if not len(v) or not np.allclose(v, np.round(v)):
        return None
    x = np.round(v.to_numpy()).astype(int)
    lo, hi = int(x.min()), int(x.max())
    first = max(1, math.ceil((hi - lo + 1) / max_bins))
    for width in range(first, max(first, (hi - lo + 1) // 8) + 1):
        if np.bincount((x - lo) // width).all():
            return np.arange(lo, hi + width + 1, width) - 0.5
    return np.arange(lo, hi + first + 1, first) - 0.5


# ---- stage plots -------------------------------------------------------------------------------------

def line(df: pd.DataFrame, x: str, ys: Iterable[str], title: str, ylabel: str = "", n: int | None = None,
         bounds: Mapping[str, tuple[float, float]] | None = None) -> Figure:
    """One line per column of `ys` (those present) against `x`; steps and k on whole-number ticks. With `n` (the
    values each point averages, e.g. GRPO's completions per step) and a std column beside a line (`reward_std` for
    `reward`, `rewards/f/std` for `rewards/f/mean`), a band shows the 95% normal interval of that mean, mean +- 1.96
    std / sqrt(n), clipped to the series' `bounds` (lo, hi) where given: a mean of rewards in [0, 1] stays in it."""
    fig = figure()
    ax = axes(fig)
    banded = False
    for y in ys:
        if y in df:
            mean = pd.to_numeric(df[y], errors="coerce")
            drawn = ax.plot(df[x], mean, marker="o", markersize=3, label=label(y))
            sd = y.removesuffix("/mean") + "/std" if y.endswith("/mean") else f"{y}_std"
            if n and sd in df:
                half = 1.96 * pd.to_numeric(df[sd], errors="coerce") / math.sqrt(n)
                lo_b, hi_b = (bounds or {}).get(y, (-math.inf, math.inf))
                ax.fill_between(df[x], (mean - half).clip(lower=lo_b), (mean + half).clip(upper=hi_b),
                                color=drawn[0].get_color(), alpha=0.2, linewidth=0)
                banded = True
    if x in ("step", "k") and x in df:
        _integer_x(ax, df[x])
    if not ax.lines:
        ax.text(0.5, 0.5, "nothing logged", ha="center", va="center", transform=ax.transAxes)
    values = pd.concat([pd.to_numeric(df[y], errors="coerce") for y in ys if y in df] or [pd.Series(dtype=float)])
    if values.notna().any() and values.max() - values.min() < 1e-12:
        _value_axis(ax, values.dropna())  # a flat line reads as its value, not as noise blown up to +-0.04
    ax.set_xlabel("optimiser step" if x == "step" else label(x))
    ax.set_ylabel(ylabel)
    ax.set_title(title + (f"\nbands: 95% interval of each mean over {n} values (normal approximation"
                          + (", within the reward's range)" if bounds else ")") if banded else ""),
                 fontsize=10 if banded else None)
    if ax.get_legend_handles_labels()[1]:
        ax.legend(fontsize=8)
    return fig


def accuracy_bars(tables: Mapping[str, pd.DataFrame], title: str, by: str = "category") -> Figure:
    """Grouped bars of accuracy per group, one series per table, each with its Wilson 95% interval and value.

    Each table is `lab.eval.analysis.accuracy_table` output (`by, n, correct, accuracy, lo, hi`, a last row `all`);
    groups are those of the first table, in its order (one group alone: its `all` row, the same bar, is left out).
    The tick label carries n.
    """
    names = list(tables)
    first = tables[names[0]].reset_index(drop=True)
    if len(first) == 2 and str(first[by].iloc[-1]) == "all":  # one group: its 'all' row is the same bar again
        first = first.iloc[:1]
    groups = [str(g) for g in first[by]]
    fig = figure(max(6.0, 0.9 * len(groups) * max(1, len(names)) * 0.6 + 2.5), 4.0)
    ax = axes(fig)
    ax.grid(False, axis="x")
    w = 0.8 / len(names)
    x = np.arange(len(groups))
    for i, name in enumerate(names):
        t = tables[name].assign(_g=tables[name][by].astype(str)).set_index("_g").reindex(groups)
        acc = t["accuracy"].astype(float).fillna(0.0).to_numpy()
        lo = (acc - t["lo"].astype(float).fillna(0.0).to_numpy()).clip(min=0)
        hi = (t["hi"].astype(float).fillna(1.0).to_numpy() - acc).clip(min=0)
        pos = x + (i - (len(names) - 1) / 2) * w
        colour = PALETTE[i % len(PALETTE)]
        ax.bar(pos, acc, width=w * 0.92, color=colour, edgecolor=colour, linewidth=1.2, label=name)
        ax.errorbar(pos, acc, yerr=[lo, hi], fmt="none", ecolor="black", elinewidth=1, capsize=3)
        for p, a, h in zip(pos, acc, acc + hi):
            ax.text(p, h + 0.015, f"{a:.2f}", ha="center", va="bottom", fontsize=7,
                    rotation=90 if len(names) > 2 else 0)
    ns = first["n"].tolist()
    many = len(groups) > 4
    ax.set_xticks(x, [f"{g}\n(n={n})" for g, n in zip(groups, ns)], rotation=20 if many else 0,
                  ha="right" if many else "center", fontsize=8)
    ax.set_ylim(0, 1.15)
    ax.set_ylabel("accuracy (bars: Wilson 95%)")
    ax.set_title(title)
    if len(names) > 1:
        ax.legend(fontsize=8, loc="upper left", ncol=len(names))
    return fig


def histogram(df: pd.DataFrame, column: str, by: str, title: str, xlabel: str) -> Figure:
    """Histograms of `column`, one outlined series per value of `by` (overlaps stay readable)."""
    fig = figure()
    ax = axes(fig)
    values = pd.to_numeric(df[column], errors="coerce").dropna()
    bins = _integer_bins(values)
    if bins is None:
        bins = np.histogram_bin_edges(values, bins=30) if len(values) else 10
    for i, (key, g) in enumerate(df.groupby(by)):
        ax.hist(pd.to_numeric(g[column], errors="coerce").dropna(), bins=bins, histtype="step", linewidth=1.6,
                color=PALETTE[i % len(PALETTE)], label=f"{key} ({len(g)})")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(xlabel)
    ax.set_ylabel("puzzles")
    ax.set_title(title)
    ax.legend(fontsize=8)
    return fig


# ---- voting ------------------------------------------------------------------------------------------

def vote_k(curves: pd.DataFrame, greedy: float | None, title: str = "Accuracy against samples per puzzle",
           n: int | None = None) -> Figure:
    """pass@k and maj@k against k (from `lab.eval.vote.curves`, which estimates both on the same samples, so they
    meet at k = 1), with the greedy score as a dashed line; the last point's value written beside it. With `n`
    (puzzles), each curve and the greedy line carry a Wilson 95% band (`_wilson`)."""
    fig = figure(6.4, 4.4)
    ax = axes(fig)
    for i, col in enumerate(("pass_at_k", "maj_at_k")):
        ax.plot(curves["k"], curves[col], marker="o", markersize=3, color=PALETTE[i], label=label(col))
        if n:
            lo, hi = _wilson(curves[col], n)
            ax.fill_between(curves["k"], lo, hi, color=PALETTE[i], alpha=0.15, linewidth=0)
        ax.annotate(f"{curves[col].iloc[-1]:.2f}", (curves["k"].iloc[-1], curves[col].iloc[-1]),
                    textcoords="offset points", xytext=(4, 0), va="center", fontsize=8, color=PALETTE[i],
                    annotation_clip=False)
    if greedy is not None:
        ax.axhline(greedy, color="black", linestyle="--", linewidth=1, label=f"greedy (Kaggle's setting) {greedy:.2f}")
        if n:
            lo, hi = _wilson([greedy], n)
            ax.axhspan(lo[0], hi[0], color="black", alpha=0.07, linewidth=0)
    _integer_x(ax, curves["k"])
    k0, k1 = float(curves["k"].min()), float(curves["k"].max())
    # room for the end labels
    ax.set_xlim(k0 - 0.3 if k0 == k1 else k0 - 0.03 * (k1 - k0), k1 + max(0.4, 0.12 * (k1 - k0)))
    ax.set_xlabel("k (samples per puzzle)")
    ax.set_ylabel("accuracy" + (f" (bands: Wilson 95%, n={n})" if n else ""))
    ax.set_ylim(0, 1.02)
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, frameon=False)  # below the data
    return fig


def vote_tokens(curves: pd.DataFrame, methods: pd.DataFrame,
                title: str = "Accuracy against tokens spent per puzzle", n: int | None = None) -> Figure:
    """maj@k as a line against tokens per puzzle, and each voting method (`method, accuracy, tokens_per_puzzle`;
    a method named 'greedy ...' is drawn in black) as one marker in its own colour and shape. With `n` (puzzles):
    a Wilson 95% band on the line and a Wilson 95% bar on every marker. The legend sits below the axes, so it
    covers no marker."""
    fig = figure(6.4, 4.6)
    ax = axes(fig)
    ax.plot(curves["tokens_per_puzzle"], curves["maj_at_k"], color=GREY, marker=".", label="maj@k, k = 1, 2, ...")
    if n:
        lo, hi = _wilson(curves["maj_at_k"], n)
        ax.fill_between(curves["tokens_per_puzzle"], lo, hi, color=GREY, alpha=0.2, linewidth=0)
    markers = "sD^vP*X"
    for i, m in enumerate(methods.itertuples(index=False)):
        greedy = str(m.method).startswith("greedy")
        colour = "black" if greedy else PALETTE[(i - 1) % len(PALETTE)]
        if n:
            lo, hi = _wilson([m.accuracy], n)
            ax.errorbar([m.tokens_per_puzzle], [m.accuracy], yerr=[[m.accuracy - lo[0]], [hi[0] - m.accuracy]],
                        fmt="none", ecolor=colour, elinewidth=1, capsize=3, zorder=2)
        ax.scatter(m.tokens_per_puzzle, m.accuracy, s=60, zorder=3, marker="o" if greedy else markers[i % len(markers)],
                   color=colour, label=f"{m.method}: {m.accuracy:.2f}")
    ax.set_xlabel("tokens per puzzle")
    ax.set_ylabel("accuracy" + (f" (Wilson 95%, n={n})" if n else ""))
    ax.set_ylim(0, 1.02)
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=2, frameon=False)
    return fig


# ---- error analysis ----------------------------------------------------------------------------------

# one colour per outcome class (lab.eval.analysis.CLASSES): right in green, plain wrong in vermillion, the rest apart
CLASS_COLOURS = {"correct": "#009E73", "truncated": "#56B4E9", "think_unclosed": "#CC79A7", "no_box": GREY,
                 "empty_box": "#F0E442", "wrong_format": "#E69F00", "near_miss": "#0072B2",
                 "right_in_reasoning": "#332288", "wrong": "#D55E00"}


def taxonomy(tax: pd.DataFrame) -> Figure:
    """Stacked horizontal bars: each category's share of every outcome class (correct first)."""
    classes = [c for c in CLASS_COLOURS if c in tax]
    fig = figure(8.0, 0.55 * len(tax) + 1.8)
    ax = axes(fig)
    ax.grid(False)
    y = np.arange(len(tax))
    left = np.zeros(len(tax))
    n = tax["n"].clip(lower=1).to_numpy(dtype=float)
    for c in classes:
        share = tax[c].to_numpy(dtype=float) / n
        if share.sum() == 0:
            continue
        ax.barh(y, share, left=left, color=CLASS_COLOURS[c], label=c.replace("_", " "))
        left += share
    ax.set_yticks(y, [f"{c} (n={k})" for c, k in zip(tax["category"], tax["n"])])
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of predictions")
    ax.set_title("Outcome classes per category")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=5, fontsize=8, frameon=False)
    return fig


def lengths(df: pd.DataFrame, budget: int, categories: list[str]) -> Figure:
    """Completion tokens per category, correct (filled) against wrong (outlined), a dashed line at the completion
    budget (the tokens a completion may use: min(max_tokens, context length - prompt tokens), which the caller
    computes, e.g. with `lab.model.generate.completion_budgets`; not the context length). Integer-aware bins.

    `df` is a normalised predictions table (`correct` bool, `tokens` Int64)."""
    cats = categories or ["(none)"]
    ncols = min(3, len(cats))
    nrows = math.ceil(len(cats) / ncols)
    fig = figure(4.2 * ncols, 3.6 * nrows)
    tmax = df["tokens"].dropna().max() if df["tokens"].notna().any() else 0
    top = int(max(float(budget), float(tmax)))
    width = max(1, math.ceil((top + 1) / 30))
    bins = np.arange(0, top + 2 * width, width) - 0.5  # whole tokens per bin: no comb
    for i, cat in enumerate(cats):
        ax = axes(fig, nrows, ncols, i + 1)
        g = df[df["category"] == cat]
        right, wrong = (g[g["correct"]]["tokens"].dropna().astype(float),
                        g[~g["correct"]]["tokens"].dropna().astype(float))
        if len(right):
            ax.hist(right, bins=bins, color=PALETTE[0], alpha=0.55, label=f"correct ({len(right)})")
        if len(wrong):
            ax.hist(wrong, bins=bins, histtype="step", linewidth=1.8, color=PALETTE[1], label=f"wrong ({len(wrong)})")
        if not g["tokens"].notna().any():
            ax.text(0.5, 0.5, "no token counts", ha="center", va="center", transform=ax.transAxes)
        ax.axvline(budget, color="black", linestyle="--", linewidth=1, label=f"completion budget {budget}")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(cat, fontsize=10)
        ax.set_xlabel("completion tokens")
        ax.set_ylabel("predictions")
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=2, frameon=False)  # below
    return fig


# ---- sweeps ------------------------------------------------------------------------------------------

def ordered(values) -> list:
    """Distinct values, numerically sorted when they all read as numbers, else as text."""
    vals = list(dict.fromkeys(values))
    try:
        return sorted(vals, key=float)
    except (TypeError, ValueError):
        return sorted(vals, key=str)


def _value_axis(ax, values: pd.Series) -> None:
    """A y range that shows the data: a share (every value in [0, 1]) on 0..1, so a flat line reads as its value,
    not as noise blown up to +-0.04; any other flat series gets a margin of its own size."""
    if not len(values):
        return
    lo, hi = float(values.min()), float(values.max())
    if 0 <= lo and hi <= 1:
        ax.set_ylim(-0.02, 1.05)
    elif hi - lo < 1e-12:
        pad = max(abs(lo) * 0.1, 1.0)
        ax.set_ylim(lo - pad, hi + pad)


def sweep_against(df: pd.DataFrame, metric: str, param: str, others: list[str]) -> Figure:
    """Mean and min-max (over seeds and repeats) of `metric` for each value of `param`; one line per other setting;
    single jobs as faint dots."""
    fig = figure(6.4, 4.0)
    ax = axes(fig)
    xs = ordered(df[param].astype(str))
    groups = list(df.groupby([df[k].astype(str) for k in others], sort=False)) if others else [((), df)]
    orders = [ordered(df[k].astype(str)) for k in others]
    groups.sort(key=lambda kg: [o.index(v) for o, v in zip(orders, kg[0])])  # pandas' keys: tuples for a list of keys
    for i, (key, g) in enumerate(groups):
        name = ", ".join(f"{k}={v}" for k, v in zip(others, key)) or None
        colour = PALETTE[i % len(PALETTE)]
        shift = (i - (len(groups) - 1) / 2) * 0.06
        jobs = pd.DataFrame({"x": g[param].astype(str).map(xs.index) + shift,
                             "v": pd.to_numeric(g[metric], errors="coerce")}).dropna().sort_values("x", kind="stable")
        ax.scatter(jobs["x"], jobs["v"], s=12, alpha=0.35, color=colour)
        st = jobs.groupby("x")["v"].agg(["mean", "min", "max"])
        if len(st):
            ax.errorbar(st.index, st["mean"], yerr=[st["mean"] - st["min"], st["max"] - st["mean"]], marker="o",
                        capsize=4, label=name, color=colour)
    ax.set_xticks(range(len(xs)), xs, rotation=20 if max(map(len, xs)) > 6 else 0, fontsize=8)
    _value_axis(ax, pd.to_numeric(df[metric], errors="coerce").dropna())
    ax.set_xlabel(param)
    ax.set_ylabel(metric)
    n_seeds = df["seed"].nunique() if "seed" in df else 1
    ax.set_title(f"{metric} against {param}\nmean, min-max over {n_seeds} seed(s); dots: single jobs", fontsize=9)
    if ax.get_legend_handles_labels()[1]:
        ax.legend(fontsize=7)
    return fig


def sweep_seeds(df: pd.DataFrame, metrics: list[str]) -> Figure:
    """Seeds-only sweep: one bar per seed for each headline metric, its value on it, the mean as a black line."""
    fig = figure(max(6.0, 1.8 * len(metrics) + 2), 4.0)
    ax = axes(fig)
    ax.grid(False, axis="x")
    seeds = ordered(df["seed"].astype(str)) if "seed" in df else ["(one run)"]
    w = 0.8 / max(len(seeds), 1)
    for i, s in enumerate(seeds):
        g = df[df["seed"].astype(str) == s] if "seed" in df else df
        vals = [pd.to_numeric(g[m], errors="coerce").mean() for m in metrics]
        pos = [j + (i - (len(seeds) - 1) / 2) * w for j in range(len(metrics))]
        ax.bar(pos, vals, width=w * 0.92, color=PALETTE[i % len(PALETTE)], label=f"seed {s}")
        for p, v in zip(pos, vals):
            if not math.isnan(v):
                ax.text(p, v, f"{v:.2f}", ha="center", va="bottom" if v >= 0 else "top", fontsize=6)
    for j, m in enumerate(metrics):
        mean = pd.to_numeric(df[m], errors="coerce").mean()
        if not math.isnan(mean):
            ax.hlines(mean, j - 0.42, j + 0.42, color="black", linewidth=2)
            ax.annotate(f"mean {mean:.3f}", (j, mean), textcoords="offset points", xytext=(0, 8), ha="center",
                        fontsize=7)
    ax.axhline(0, color=GREY, linewidth=0.5)
    ax.set_xticks(range(len(metrics)), metrics, rotation=15, fontsize=7)
    ax.set_title(f"Headline metrics per seed ({len(seeds)} seeds); black: mean", fontsize=9)
    ax.legend(fontsize=7, ncol=min(len(seeds), 5))
    return fig
