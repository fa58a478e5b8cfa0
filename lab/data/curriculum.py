"""Prompt selection and curriculum for GRPO: which training prompts to keep, and in what order.

Pure pandas/numpy on tables; no model. In the order 03_grpo uses them, on the pass rates `lab.eval.vote.pass_rates`
measures (per id, the share of correct samples):
- `select(pass_rates, threshold, drop_unsolved)`: drops prompts solved at or above `threshold` (an all-correct
  group has zero reward variance, so GRPO learns nothing from it) and, with `drop_unsolved`, prompts no sample
  solved (all wrong: the same zero variance; DAPO's dynamic-sampling filter, applied once up front). Kept
  unsolved prompts leave GRPO only the format term's variance; both counts are in `selection_summary`.
- `order(puzzles, pass_rates, curriculum, shape, seed=...)`: curriculum on, high to low pass rate (`linear`:
  ties in a seeded order; `stepped`: `buckets` equal contiguous buckets shuffled within); off, a seeded shuffle.
  TRL's GRPOTrainer shuffles its dataset by default: pass `GRPOConfig(shuffle_dataset=False)` or the order is
  lost; past the end of the order the trainer starts it again from the easy end.

What it simplifies:
1. Pass rates are measured once, before training, never refreshed as the model improves (no online
   re-estimation as in DAPO's dynamic sampling).
2. The pass rate is the only difficulty signal (no per-category balancing).
3. Stepped buckets are cut by rank, so equal pass rates may straddle a bucket boundary.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from lab import LabError

__all__ = ["SHAPES", "select", "selection_summary", "order"]

SHAPES = ("linear", "stepped")


def _check_rates(pass_rates: pd.DataFrame) -> pd.DataFrame:
    """A checked copy with ids as str; clear errors for missing columns, duplicates, rates outside [0, 1]."""
    if not isinstance(pass_rates, pd.DataFrame):
        raise LabError(f"pass rates must be a DataFrame[id, n, correct, pass_rate], got {type(pass_rates).__name__}")
    missing = [c for c in ("id", "pass_rate") if c not in pass_rates.columns]
    if missing:
        raise LabError(f"pass-rate table lacks column(s) {missing}; columns are {list(pass_rates.columns)}")
    df = pass_rates.copy()
    df["id"] = df["id"].astype(str)
    dup = df["id"][df["id"].duplicated()].unique()
    if len(dup):
        raise LabError(f"pass-rate table has duplicate id(s) {list(dup[:5])}")
    rate = pd.to_numeric(df["pass_rate"], errors="coerce")
    bad = df["id"][rate.isna() | (rate < 0) | (rate > 1)]
    if len(bad):
        raise LabError(f"pass_rate must be a number in [0, 1]; not so for id(s) {list(bad[:5])}")
    df["pass_rate"] = rate.astype(float)
    return df.reset_index(drop=True)


def _check_threshold(threshold: float) -> float:
    try:
        t = float(threshold)
    except (TypeError, ValueError):
        raise LabError(f"threshold must be a number in (0, 1], got {threshold!r}") from None
    if not 0.0 < t <= 1.0:
        raise LabError(f"threshold must be in (0, 1], got {threshold!r}")
    return t


def _dropped(df: pd.DataFrame, threshold: float, drop_unsolved: bool) -> pd.Series:
    return (df["pass_rate"] >= threshold) | ((df["pass_rate"] == 0) if drop_unsolved else False)


def select(pass_rates: pd.DataFrame, threshold: float = 0.75, drop_unsolved: bool = False
           ) -> tuple[list[str], pd.DataFrame]:
    """(kept_ids, dropped): keep prompts with pass_rate < threshold (and > 0 with `drop_unsolved`), in table
    order; `dropped` holds the rows of the others."""
    t = _check_threshold(threshold)
    df = _check_rates(pass_rates)
    out = _dropped(df, t, drop_unsolved)
    return df.loc[~out, "id"].tolist(), df.loc[out].reset_index(drop=True)


def selection_summary(pass_rates: pd.DataFrame, threshold: float = 0.75, drop_unsolved: bool = False) -> dict:
    """Counts of a `select`: total, kept, dropped (solved, plus unsolved with `drop_unsolved`), solved
    (pass rate >= threshold), unsolved (pass rate 0, dropped or kept)."""
    t = _check_threshold(threshold)
    df = _check_rates(pass_rates)
    dropped = int(_dropped(df, t, drop_unsolved).sum())
    return {"threshold": t, "drop_unsolved": bool(drop_unsolved), "total": int(len(df)),
            "kept": int(len(df)) - dropped, "dropped": dropped, "solved": int((df["pass_rate"] >= t).sum()),
            "unsolved": int((df["pass_rate"] == 0).sum())}


def order(puzzles: pd.DataFrame, pass_rates: pd.DataFrame | None, curriculum: bool, shape: str = "linear", *,
          seed: int, buckets: int = 4) -> pd.DataFrame:
    """The rows of `puzzles` (needs an ``id`` column) in training order, index reset, with two columns added
    (replacing any of the same name): ``pass_rate`` (NaN where unknown) and ``bucket`` (the stepped bucket,
    0 = easiest; <NA> otherwise).

    curriculum=True: easy to hard by pass rate, `shape` linear or stepped (`buckets` buckets); every
    puzzle needs a pass rate. curriculum=False: a seeded shuffle; `pass_rates` may be None. The
    shape is validated either way, so a typo in the config fails before a long run, not after.
    """
    if shape not in SHAPES:
        raise LabError(f"unknown curriculum shape {shape!r}; allowed: {', '.join(SHAPES)}")
    if isinstance(buckets, bool) or not isinstance(buckets, (int, np.integer)) or buckets < 1:
        raise LabError(f"buckets must be an int >= 1, got {buckets!r}")
    if "id" not in puzzles.columns:
        raise LabError(f"puzzles table lacks column 'id'; columns are {list(puzzles.columns)}")
    keys = puzzles["id"].astype(str)
    dup = keys[keys.duplicated()].unique()
    if len(dup):
        raise LabError(f"puzzles table has duplicate id(s) {list(dup[:5])}")
    if curriculum and pass_rates is None:
        raise LabError("curriculum is on but no pass rates were given; estimate them first (lab.eval.vote.pass_rates)")

    out = puzzles.drop(columns=[c for c in ("pass_rate", "bucket") if c in puzzles.columns]).reset_index(drop=True)
    if pass_rates is not None:
        rates = _check_rates(pass_rates).set_index("id")["pass_rate"]
        out["pass_rate"] = keys.map(rates).to_numpy(dtype=float)
    else:
        out["pass_rate"] = np.nan
    out["bucket"] = pd.array([pd.NA] * len(out), dtype="Int64")

    rng = np.random.default_rng(int(seed))
    perm = rng.permutation(len(out))
    if not curriculum:
        return out.iloc[perm].reset_index(drop=True)

    unknown = keys[out["pass_rate"].isna().to_numpy()]
    if len(unknown):
        raise LabError(f"{len(unknown)} puzzle(s) have no pass rate, e.g. {list(unknown[:5])}; "
                       "estimate pass rates for every training prompt, or turn the curriculum off")
    shuffled = out.iloc[perm]
    ranked = shuffled.sort_values("pass_rate", ascending=False, kind="stable").reset_index(drop=True)
    if shape == "linear":
        return ranked
    parts = []
    for b, idx in enumerate(np.array_split(np.arange(len(ranked)), int(buckets))):
        part = ranked.iloc[idx[rng.permutation(len(idx))]].copy()
        part["bucket"] = pd.array([b] * len(part), dtype="Int64")
        parts.append(part)
    return pd.concat(parts).reset_index(drop=True)
