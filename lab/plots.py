"""The lab's stage plots: small functions that take a table and return a matplotlib Figure.

Every notebook shows these and saves them as PNG in its stage folder (`save`). Error-analysis
plots live in `lab.errors`. Deliberately plain: matplotlib defaults, one figure per question.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure


def save(fig: Figure, path: str | Path) -> Path:
    """Write the figure as PNG atomically (temp file + rename) and return the path."""
    from lab.errors import save_figure

    return save_figure(fig, path)


def line(df: pd.DataFrame, x: str, ys: list[str], title: str, ylabel: str = "") -> Figure:
    """One line per column in `ys` against `x` (training curves)."""
    fig = Figure(figsize=(6, 3.5))
    ax = fig.subplots()
    for y in ys:
        if y in df:
            ax.plot(df[x], df[y], marker=".", label=y)
    ax.set_xlabel(x)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def before_after(table: pd.DataFrame, title: str, labels=("before", "after")) -> Figure:
    """Grouped bars of accuracy per category: columns `category` and the two labels."""
    fig = Figure(figsize=(6, 3.5))
    ax = fig.subplots()
    x = range(len(table))
    w = 0.38
    for i, lab in enumerate(labels):
        ax.bar([v + (i - 0.5) * w for v in x], table[lab], width=w, label=lab)
    ax.set_xticks(list(x), table["category"], rotation=20, fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def curves(df: pd.DataFrame, x: str, ys: list[str], title: str, xlabel: str | None = None) -> Figure:
    """Accuracy-style curves (0..1) against k or tokens."""
    fig = line(df, x, ys, title, ylabel="accuracy")
    ax = fig.axes[0]
    ax.set_ylim(0, 1.02)
    ax.set_xlabel(xlabel or x)
    return fig


def histogram(df: pd.DataFrame, column: str, by: str, title: str, xlabel: str) -> Figure:
    """Overlaid histograms of `column`, one per value of `by`."""
    fig = Figure(figsize=(6, 3.5))
    ax = fig.subplots()
    for key, g in df.groupby(by):
        ax.hist(g[column], bins=30, alpha=0.5, label=str(key))
    ax.set_xlabel(xlabel)
    ax.set_ylabel("count")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
