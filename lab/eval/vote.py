r"""Inference-time voting over sampled completions, and the pass@k / maj@k curves that judge it.

Pure functions of a *samples table* (one row per completion, as `lab.eval.sampling.sample_table` writes it: id,
category, gold, sample, answer, tokens, finish_reason, mean_logprob); no model is needed. Two answers are one vote
when the competition's `verify` says so. `METHODS` (greedy, majority, confidence, early_stop) are replayed offline by
`replay`; `early_stop_live` applies the early-stopping rule while sampling, so its token saving is real.
The answer classes, each method's rule, the estimators and what they simplify: docs/internals.md, lab.eval.vote.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable, Sequence

import numpy as np
import pandas as pd

from lab import LabError
from lab.competition.metric import NOT_FOUND, verify

# ----------------------------------------------------------------------------------------------
# answers and classes
# ----------------------------------------------------------------------------------------------

def _norm(answer) -> str:
    """An answer as a string; None/NaN (a missing extraction) becomes NOT_FOUND."""
    if answer is None or (isinstance(answer, float) and math.isnan(answer)) or answer is pd.NA:
        return NOT_FOUND
    return str(answer)


def is_answer(answer) -> bool:
    """False for NOT_FOUND, None/NaN and empty or blank strings: these never win a vote over a real answer."""
    a = _norm(answer)
    return a != NOT_FOUND and a.strip() != ""


def assign_classes(answers: Iterable, version: str = "final") -> tuple[list[int], list[str]]:
    """(labels, representatives): label i is the class of answers[i]; classes are numbered in first-seen order.

    answer joins the first class with ``verify(representative, answer, version)`` (docs/internals.md,
    lab.eval.vote).
    """
    reps: list[str] = []
    labels = [_join(reps, _norm(a), version) for a in answers]  # _join adds each new class to reps
    return labels, reps


def _join(reps: list[str], a: str, version: str) -> int:
    for ci, rep in enumerate(reps):
        if verify(rep, a, version):
            return ci
    reps.append(a)
    return len(reps) - 1


def _winner(labels: Sequence[int], reps: Sequence[str], weights: Sequence[float] | None = None) -> int:
    """Index of the winning class: largest total weight among real answers (no-answers only if nothing else);
    ties go to the class seen first (lowest index)."""
    totals = [0.0] * len(reps)
    for i, lab in enumerate(labels):
        totals[lab] += 1.0 if weights is None else float(weights[i])
    candidates = [c for c in range(len(reps)) if is_answer(reps[c])] or list(range(len(reps)))
    return max(candidates, key=lambda c: (totals[c], -c))  # an equal total keeps the earlier class


def weighted_vote(answers: Sequence, weights: Sequence[float], version: str = "final") -> str:
    """The representative of the class with the largest total weight (ties: first-seen class); NOT_FOUND if empty."""
    answers = list(answers)
    if len(answers) != len(weights):
        raise ValueError(f"{len(answers)} answers but {len(weights)} weights")
    if not answers:
        return NOT_FOUND
    labels, reps = assign_classes(answers, version)
    return reps[_winner(labels, reps, weights)]


def majority_vote(answers: Sequence, version: str = "final") -> str:
    """The most frequent answer class (ties: the class seen first); NOT_FOUND only if no real answer exists."""
    answers = list(answers)
    return weighted_vote(answers, [1.0] * len(answers), version)


def _n_keep(keep_top: float, n: int) -> int:
    if not 0.0 < float(keep_top) <= 1.0:
        raise ValueError(f"keep_top must be in (0, 1], got {keep_top}")
    return max(1, math.ceil(float(keep_top) * n - 1e-9))  # 1e-9: 0.1 * 30 is 3.0000000000000004


def confidence_vote(answers: Sequence, confidences: Sequence[float], keep_top: float = 0.5,
                    version: str = "final") -> str:
    """DeepConf-style: keep the most confident `keep_top` share of answered traces, vote weighted by exp(confidence).

    `confidences` are per-trace mean token log-probabilities (higher is more confident). Any NaN
    falls back to `majority_vote` over all answers. No-answers are ranked only if nothing else exists.
    """
    answers = [_norm(a) for a in answers]
    conf = np.asarray(confidences, dtype=float)
    if len(answers) != len(conf):
        raise ValueError(f"{len(answers)} answers but {len(conf)} confidences")
    _n_keep(keep_top, 1)  # validate keep_top even when there is nothing to vote on
    if not answers:
        return NOT_FOUND
    if np.isnan(conf).any():
        return majority_vote(answers, version)
    pool = [i for i, a in enumerate(answers) if is_answer(a)] or list(range(len(answers)))
    ranked = sorted(pool, key=lambda i: (-conf[i], i))  # most confident first; ties keep the earlier sample
    kept = sorted(ranked[:_n_keep(keep_top, len(pool))])  # back to sample order: first-seen tie-breaking
    return weighted_vote([answers[i] for i in kept], np.exp(conf[kept]), version)


def _can_be_overtaken(counts: Sequence[int], reps: Sequence[str], leader: int, remaining: int) -> bool:
    lead = counts[leader]
    if remaining > lead:  # a class not seen yet could take all remaining samples (it loses ties: seen later)
        return True
    return any(n + remaining > lead or (n + remaining == lead and c < leader)
               for c, n in enumerate(counts) if c != leader and is_answer(reps[c]))


def leader_probability(lead: int, runner_up: int) -> float:
    """P(p_lead > p_runner_up) given the two counts, uniform prior: the mass of Beta(lead+1, runner_up+1)
    above 1/2, which for whole counts is P(Binomial(lead + runner_up + 1, 1/2) <= lead)."""
    n = int(lead) + int(runner_up) + 1
    return sum(math.comb(n, i) for i in range(int(lead) + 1)) / 2 ** n


def _check_early_stop(window: int, agree: float | None, stop_prob: float | None) -> None:
    if int(window) < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    if agree is not None and not 0.0 < float(agree) <= 1.0:
        raise ValueError(f"agree must be in (0, 1] or None, got {agree}")
    if stop_prob is not None and not 0.5 < float(stop_prob) < 1.0:
        raise ValueError(f"stop_prob must be in (0.5, 1) or None, got {stop_prob}")


def _stops(labels: Sequence[int], reps: Sequence[str], budget: int, agree: float | None,
           stop_prob: float | None) -> bool:
    """Whether early stopping draws nothing more after the samples labelled so far (docs/internals.md, lab.eval.vote):
    the budget is spent, or the leading real answer holds `agree` of them, is the majority with probability
    `stop_prob`, or cannot be overtaken by the samples left. `early_stop_vote` (replayed) and `early_stop_live`
    (sampled) both decide with it."""
    used = len(labels)
    if used >= budget:
        return True
    leader = _winner(labels, reps)
    if not is_answer(reps[leader]):  # no real answer yet: go on
        return False
    counts = np.bincount(labels, minlength=len(reps)).tolist()
    if agree is not None and counts[leader] >= float(agree) * used - 1e-9:
        return True
    if stop_prob is not None:
        others = [n for c, n in enumerate(counts) if c != leader]
        if leader_probability(counts[leader], max(others, default=0)) >= float(stop_prob):
            return True
    return not _can_be_overtaken(counts, reps, leader, budget - used)


def early_stop_vote(answers: Sequence, tokens: Sequence[int], budget: int | None = None, window: int = 4,
                    agree: float | None = 1.0, version: str = "final", stop_prob: float | None = None
                    ) -> tuple[str, int, int]:
    """(answer, samples_used, tokens_used): the ``early_stop`` rule over `answers` in order, drawing at
    most `budget` samples (default: all given); tokens_used sums `tokens` of every drawn sample."""
    answers = [_norm(a) for a in answers]
    tokens = [int(t) for t in tokens]
    if len(answers) != len(tokens):
        raise ValueError(f"{len(answers)} answers but {len(tokens)} token counts")
    _check_early_stop(window, agree, stop_prob)
    budget = len(answers) if budget is None else min(int(budget), len(answers))
    if budget <= 0:
        return NOT_FOUND, 0, 0
    labels: list[int] = []
    reps: list[str] = []
    while not labels or not _stops(labels, reps, budget, agree, stop_prob):
        labels += [_join(reps, a, version) for a in answers[len(labels):min(len(labels) + int(window), budget)]]
    return reps[_winner(labels, reps)], len(labels), sum(tokens[:len(labels)])


def early_stop_live(draw: Callable[[list[str], int, int], pd.DataFrame], ids: Sequence[str], k: int,
                    window: int = 4, agree: float | None = 1.0, stop_prob: float | None = None,
                    version: str = "final") -> tuple[pd.DataFrame, pd.DataFrame]:
    """Early stopping that samples for real: rounds of `window` samples for every puzzle still open, each puzzle
    closed as soon as its answers so far meet the stopping rule (`_stops`, the rule `replay(..., "early_stop")`
    applies to samples drawn in full), at most `k` samples each.

    `draw(ids, round, n)` generates n samples for each of `ids` (round 0, 1, ...: the caller seeds each round
    apart) and returns a samples table (`lab.eval.sampling.sample_table`'s columns; at least id, answer, tokens; n
    rows per id). Returns (results, samples): `results` has `replay`'s columns (one row per id; samples_used and
    tokens_used are what was generated: the sum of the drawn completions' tokens), `samples` every drawn row, with
    `sample` numbered in drawing order across rounds and a `round` column. Replaying early_stop with the same
    window on `samples` gives the same answers and counts."""
    _check_early_stop(window, agree, stop_prob)
    if int(k) < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    ids = [str(i) for i in ids]
    labels: dict[str, list[int]] = {i: [] for i in ids}
    reps: dict[str, list[str]] = {i: [] for i in ids}
    drawn: dict[str, list[pd.DataFrame]] = {i: [] for i in ids}
    open_ids, rnd = list(ids), 0
    while open_ids:
        n = min(int(window), int(k) - len(labels[open_ids[0]]))  # every open puzzle has drawn as many
        table = _prepare(draw(list(open_ids), rnd, n))
        got = table.groupby("id", sort=False)
        sizes = got.size()
        wrong = [i for i in open_ids if sizes.get(i, 0) != n]
        if wrong or set(sizes.index) - set(open_ids):
            raise LabError(f"early_stop_live: round {rnd} asked for {n} sample(s) of {len(open_ids)} puzzle(s) and got "
                           f"{dict(sizes.head(5))} (e.g. wrong for {wrong[:5]})")
        for pid, g in got:
            g = g.assign(sample=range(len(labels[pid]), len(labels[pid]) + n), round=rnd)
            labels[pid] += [_join(reps[pid], _norm(a), version) for a in g["answer"]]
            drawn[pid].append(g)
        open_ids = [i for i in open_ids if not _stops(labels[i], reps[i], int(k), agree, stop_prob)]
        rnd += 1
    rows = []
    for pid in ids:
        g = pd.concat(drawn[pid])
        answer = reps[pid][_winner(labels[pid], reps[pid])]
        gold = _gold_of(g)
        rows.append({"id": pid, "category": g["category"].iloc[0], "answer": answer, "samples_used": len(g),
                     "tokens_used": int(g["tokens"].astype(int).sum()),
                     "correct": pd.NA if gold is None else bool(verify(gold, answer, version))})
    results = pd.DataFrame(rows, columns=RESULT_COLUMNS).astype(
        {"samples_used": "int64", "tokens_used": "int64", "correct": "boolean"})
    samples = pd.concat([g for pid in ids for g in drawn[pid]], ignore_index=True)
    return results, samples


# ----------------------------------------------------------------------------------------------
# replaying a method over a samples table
# ----------------------------------------------------------------------------------------------

def _m_greedy(g: pd.DataFrame, **_) -> tuple[str, int, int]:
    return _norm(g["answer"].iloc[0]), 1, int(g["tokens"].iloc[0])


def _m_majority(g: pd.DataFrame, version: str = "final", **_) -> tuple[str, int, int]:
    return majority_vote(g["answer"].tolist(), version), len(g), int(g["tokens"].sum())


def _m_confidence(g: pd.DataFrame, keep_top: float = 0.5, conf_col: str = "mean_logprob", version: str = "final",
                  **_) -> tuple[str, int, int]:
    conf = g[conf_col].astype(float).to_numpy() if conf_col in g.columns else np.full(len(g), np.nan)
    return confidence_vote(g["answer"].tolist(), conf, keep_top, version), len(g), int(g["tokens"].sum())


def _m_early_stop(g: pd.DataFrame, window: int = 4, agree: float | None = 1.0, version: str = "final",
                  stop_prob: float | None = None, **_) -> tuple[str, int, int]:
    return early_stop_vote(g["answer"].tolist(), g["tokens"].tolist(), None, window, agree, version, stop_prob)


# name -> function(per-id rows in sample order, already cut to the first k) -> (answer, samples_used, tokens_used)
METHODS: dict[str, Callable[..., tuple[str, int, int]]] = {
    "greedy": _m_greedy,
    "majority": _m_majority,
    "confidence": _m_confidence,
    "early_stop": _m_early_stop,
}
# every option any method reads; replay rejects others so a typo is not silently ignored
OPTIONS = ("version", "keep_top", "conf_col", "window", "agree", "stop_prob")

RESULT_COLUMNS = ["id", "category", "answer", "samples_used", "tokens_used", "correct"]


def _prepare(samples: pd.DataFrame, need_gold: bool = False) -> pd.DataFrame:
    """Checked copy, ids as str, sorted by (first appearance of id, sample); `sample` defaults to row order."""
    missing = [c for c in ("id", "answer", "tokens") if c not in samples.columns]
    if missing:
        raise LabError(f"samples table lacks column(s) {missing}; columns are {list(samples.columns)}")
    for col in ("answer", "gold"):
        if col in samples.columns and pd.api.types.is_numeric_dtype(samples[col]) and samples[col].notna().any():
            raise LabError(f"samples column {col!r} is numeric ({samples[col].dtype}); read answers as strings "
                           f"(e.g. dtype=str) or binary answers such as 0101 lose their leading zeros")
    df = samples.copy()
    df["id"] = df["id"].astype(str)
    if "sample" not in df.columns:
        df["sample"] = df.groupby("id", sort=False).cumcount()
    if "category" not in df.columns:
        df["category"] = ""
    if need_gold:
        if "gold" not in df.columns:
            raise LabError("samples table has no 'gold' column: correctness needs labeled data")
        unlabeled = df.loc[df["gold"].isna(), "id"].unique()
        if len(unlabeled):
            raise LabError(f"{len(unlabeled)} id(s) have no gold answer, e.g. {list(unlabeled[:5])}")
    df["_order"] = pd.factorize(df["id"])[0]
    df = df.sort_values(["_order", "sample"], kind="stable").drop(columns="_order")
    return df.reset_index(drop=True)


def _gold_of(g: pd.DataFrame):
    if "gold" not in g.columns:
        return None
    gold = g["gold"].iloc[0]
    return None if not isinstance(gold, str) and pd.isna(gold) else str(gold)  # pd.isna: None, NaN, NA


def replay(samples: pd.DataFrame, method: str, k: int | None = None, **opts) -> pd.DataFrame:
    """One row per id: id, category, answer, samples_used, tokens_used, correct (nullable bool; NA without gold).

    Uses the first `k` samples of each id in `sample` order (all of them when k is None).
    `opts` go to the method: version, keep_top, conf_col (confidence), window, agree, stop_prob (early_stop).
    """
    if method not in METHODS:
        raise ValueError(f"unknown voting method {method!r}; known: {', '.join(METHODS)}")
    unknown = sorted(set(opts) - set(OPTIONS))
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for replay; known: {', '.join(OPTIONS)}")
    if k is not None and int(k) < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    version = opts.get("version", "final")
    df = _prepare(samples)
    fn = METHODS[method]
    rows = []
    for pid, g in df.groupby("id", sort=False):
        g = g if k is None else g.head(int(k))
        answer, used, toks = fn(g, **opts)
        gold = _gold_of(g)
        rows.append({"id": pid, "category": g["category"].iloc[0], "answer": answer, "samples_used": int(used),
                     "tokens_used": int(toks),
                     "correct": pd.NA if gold is None else bool(verify(gold, answer, version))})
    out = pd.DataFrame(rows, columns=RESULT_COLUMNS)
    return out.astype({"samples_used": "int64", "tokens_used": "int64", "correct": "boolean"})


# ----------------------------------------------------------------------------------------------
# metrics
# ----------------------------------------------------------------------------------------------

def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: 1 - C(n-c, k) / C(n, k), as a stable product."""
    n, c, k = int(n), int(c), int(k)
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def _window_majority_ok(labels: np.ndarray, ok: np.ndarray, real: np.ndarray, k: int) -> float:
    """Share of the K cyclic windows of k consecutive samples whose majority vote is correct.

    Window r holds samples r, r+1, ..., r+k-1 (mod K). Its winner is the class with the most samples among
    real answers present (no-answers only when nothing else is there), ties to the class seen first in the
    window; the voted answer is the winner's first sample in the window, so a window of one sample is that
    sample. Classes are those of `assign_classes` over all K samples in sample order.
    """
    K = len(labels)
    idx = (np.arange(K)[:, None] + np.arange(k)[None, :]) % K          # (K windows, k positions)
    lab = labels[idx]
    n_cls = int(labels.max()) + 1
    onehot = lab[:, :, None] == np.arange(n_cls)[None, None, :]        # (K, k, classes)
    counts = onehot.sum(axis=1)
    present = counts > 0
    first = np.where(present, onehot.argmax(axis=1), k)               # first position of each class
    eligible = present & real[None, :]
    eligible = np.where(eligible.any(axis=1, keepdims=True), eligible, present)
    score = np.where(eligible, counts * (k + 1) - first, -1)          # most samples, then seen first
    win = score.argmax(axis=1)
    pos = first[np.arange(K), win]
    return float(ok[idx[np.arange(K), pos]].mean())


def _per_id(df: pd.DataFrame, K: int, version: str) -> list[dict]:
    """Per id, over its first K samples: correct count, mean tokens per sample, maj@k for k=1..K."""
    out = []
    for pid, g in df.groupby("id", sort=False):
        g = g.head(K)
        gold = _gold_of(g)
        answers = [_norm(a) for a in g["answer"]]
        labels, reps = assign_classes(answers, version)
        ok = np.array([bool(verify(gold, a, version)) for a in answers])
        real = np.array([is_answer(r) for r in reps])
        labels = np.asarray(labels)
        maj = [_window_majority_ok(labels, ok, real, k) for k in range(1, K + 1)]
        out.append({"c": int(ok.sum()), "mean_tok": float(g["tokens"].astype(int).mean()), "maj": maj})
    return out


def curves(samples: pd.DataFrame, K: int | None = None, version: str = "final") -> pd.DataFrame:
    """Per k = 1..K: pass@k, maj@k, mean tokens per puzzle, tokens per correct answer.

    Uses the first K samples of each id (K defaults to the fewest any id has), and both estimators
    average over all K of them, so they meet at k = 1 (the mean single-sample accuracy): pass@k is
    the unbiased estimate of Chen et al.; maj@k is the share of the K cyclic windows of k consecutive
    samples whose majority vote is right (every sample sits in exactly k windows). tokens_per_puzzle
    is k times the mean tokens of a sample (the cost of maj@k); tokens_per_correct is the total of
    those tokens over the maj@k-correct count (inf when none is correct).
    """
    df = _prepare(samples, need_gold=True)
    if df.empty:
        raise LabError("samples table is empty")
    sizes = df.groupby("id", sort=False).size()
    fewest = int(sizes.min())
    K = fewest if K is None else int(K)
    if K < 1:
        raise ValueError(f"K must be >= 1, got {K}")
    if K > fewest:
        short = list(sizes[sizes < K].index[:5])
        raise LabError(f"K={K} but some ids have only {fewest} samples, e.g. {short}")
    items, rows = _per_id(df, K, version), []
    for k in range(1, K + 1):
        n_maj = sum(it["maj"][k - 1] for it in items)
        tok = float(sum(k * it["mean_tok"] for it in items))
        rows.append({"k": k, "puzzles": len(items),
                     "pass_at_k": float(np.mean([pass_at_k(K, it["c"], k) for it in items])),
                     "maj_at_k": n_maj / len(items), "tokens_per_puzzle": tok / len(items),
                     "tokens_per_correct": tok / n_maj if n_maj else math.inf})
    return pd.DataFrame(rows)


def summary(results: pd.DataFrame) -> dict:
    """Totals of a `replay` table: puzzles, accuracy (over labeled ids), mean samples/tokens used, tokens per
    correct."""
    labeled = results["correct"].dropna().astype(bool)
    n_correct = int(labeled.sum())
    tok = float(results["tokens_used"].sum())
    return {"puzzles": int(len(results)),
            "accuracy": float(labeled.mean()) if len(labeled) else math.nan,
            "samples_used": float(results["samples_used"].mean()) if len(results) else 0.0,
            "tokens_used": float(results["tokens_used"].mean()) if len(results) else 0.0,
            "tokens_per_correct": tok / n_correct if n_correct else math.inf}


def pass_rates(samples: pd.DataFrame, version: str = "final") -> pd.DataFrame:
    """Per id (first-appearance order): n samples, correct samples, pass_rate = correct / n."""
    df = _prepare(samples, need_gold=True)
    ok = [bool(verify(str(g), a, version)) for g, a in zip(df["gold"], df["answer"].map(_norm))]
    df = df.assign(_ok=ok)
    out = df.groupby("id", sort=False)["_ok"].agg(n="size", correct="sum").reset_index()
    out = out.astype({"n": "int64", "correct": "int64"})
    out["pass_rate"] = out["correct"] / out["n"]
    return out[["id", "n", "correct", "pass_rate"]]
