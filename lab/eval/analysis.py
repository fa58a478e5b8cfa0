"""Error analysis of one predictions table, and the difference between two: functions that return tables.

Input is a stage's `predictions.csv` (id, category, subtype, prompt, gold, completion, answer, correct, tokens,
finish_reason), read by `load_predictions` or built in memory (`normalise_predictions`). `classify_failure` gives
each wrong prediction one class, the first that applies in FAILURE_PRIORITY; around it: accuracy tables with Wilson
intervals, the taxonomy, the solver's view (`solver_view`: status, where a completion leaves the solver's trace,
solver or imitation), lengths against the budget, `compare` of two runs, and the `headline` numbers.
The classes' rules and what the analysis simplifies: docs/internals.md, lab.eval.analysis.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np
import pandas as pd

from lab import LabError
from lab.core.schema import COMPETITION
from lab.core.io import atomic_write_csv
from lab.core.stats import wilson_interval  # also lab.eval.analysis.wilson_interval, as before
from lab.competition.metric import extract_answer, read_table, verify
from lab.puzzles.categories import BY_NAME, CATEGORIES, TABLE
from lab.puzzles.solve import batch_inputs, solve

# --------------------------------------------------------------------------------------------
# constants

CATEGORY_ORDER = tuple(CATEGORIES)
NUMERIC_CATEGORIES = tuple(c.name for c in TABLE if c.answer == "number")
FAILURE_PRIORITY = ("truncated", "think_unclosed", "no_box", "empty_box", "wrong_format", "near_miss",
                    "right_in_reasoning", "wrong")
CLASSES = ("correct",) + FAILURE_PRIORITY
STATUSES = ("solved", "ambiguous", "undetermined")
REQUIRED_COLUMNS = ("id", "category", "gold", "completion")
NEAR_MISS_REL = 0.05

_BOX = "\\boxed{"  # exactly what lab.competition.metric looks for
_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")
_ROMAN = re.compile(r"[IVXLCDM]+", re.IGNORECASE)  # the metric ignores case
_BINARY = re.compile(r"[01]+")
_TRUE = {"true", "1", "1.0", "yes", "t", "y"}
_FALSE = {"false", "0", "0.0", "no", "f", "n", ""}


# --------------------------------------------------------------------------------------------
# loading and normalising


def _text(v: Any) -> str:
    return "" if pd.isna(v) else str(v)


def _to_bool(v: Any, where: str) -> bool:
    """True/False from a bool, 0/1 (int, float or text) or yes/no words; a LabError naming `where` for anything else."""
    s = str(v).strip().lower()
    if s in _TRUE:
        return True
    if s in _FALSE:
        return False
    raise LabError(f"{where}: column 'correct' has {v!r}; expected True/False")


def normalise_predictions(pred: pd.DataFrame, source: str = "predictions") -> pd.DataFrame:
    """A copy with every schema column present: text columns as str, `correct` bool, `tokens` Int64.

    Missing `answer` is extracted from the completion and missing `correct` is recomputed with
    the competition metric; missing `tokens` stays <NA>, missing `finish_reason` is ''.
    """
    if not isinstance(pred, pd.DataFrame):
        raise LabError(f"{source}: expected a DataFrame, got {type(pred).__name__}")
    missing = [c for c in REQUIRED_COLUMNS if c not in pred.columns]
    if missing:
        raise LabError(f"{source}: missing column(s) {missing}; have {list(pred.columns)}")
    df = pred.copy().reset_index(drop=True)
    for c in ("id", "category", "gold", "completion", "subtype", "prompt", "finish_reason"):
        if c not in df.columns:
            df[c] = ""
        df[c] = df[c].map(_text)
    if "answer" not in df.columns:
        df["answer"] = [extract_answer(c) for c in df["completion"]]
    df["answer"] = df["answer"].map(_text)
    if "correct" not in df.columns:
        df["correct"] = [verify(g, a) for g, a in zip(df["gold"], df["answer"])]
    else:
        df["correct"] = [_to_bool(v, f"{source} row {i + 1}") for i, v in enumerate(df["correct"])]
    df["correct"] = df["correct"].astype(bool)
    raw = (df["tokens"] if "tokens" in df.columns else pd.Series("", index=df.index)).map(lambda v: _text(v).strip())
    num = pd.to_numeric(raw.replace("", np.nan), errors="coerce")
    bad = num.isna() & (raw != "") & (raw.str.lower() != "nan")
    if bad.any():
        i = int(bad.to_numpy().argmax())
        raise LabError(f"{source} row {i + 1}: column 'tokens' has {raw.iloc[i]!r}; expected an integer")
    df["tokens"] = num.round().astype("Int64")
    df["finish_reason"] = df["finish_reason"].map(lambda v: v.strip().lower())
    return df


def load_predictions(path: str | os.PathLike) -> pd.DataFrame:
    """Read a predictions.csv (all strings, no NA guessing: `lab.competition.metric.read_table`) and normalise it."""
    return normalise_predictions(read_table(path, (), "predictions", unique_ids=False), source=str(path))


def _rank(order: Iterable[str] = ()):
    """A sort key: the values of `order` first, in that order, then any other value by its text."""
    pos = {v: i for i, v in enumerate(order)}
    return lambda v: (pos.get(v, len(pos)), str(v))


def ordered_categories(df: pd.DataFrame) -> list[str]:
    """The categories present, in CATEGORY_ORDER (others after, by name)."""
    return sorted(dict.fromkeys(df["category"]), key=_rank(CATEGORY_ORDER))


def _per_category(df: pd.DataFrame):
    """(category, its rows) for each category present (`ordered_categories`), then ('all', every row)."""
    for cat in ordered_categories(df) + ["all"]:
        yield cat, df if cat == "all" else df[df["category"] == cat]


# --------------------------------------------------------------------------------------------
# accuracy with Wilson intervals


def accuracy_table(pred: pd.DataFrame, by: Iterable[str] = ("category",), total: bool = True) -> pd.DataFrame:
    """Columns `*by, n, correct, accuracy, lo, hi`; a last row 'all' when `total`.

    `by` may name `status` (the solver's solved/ambiguous/undetermined on the prompt): it is
    added with `with_solver` when the table does not have it.
    """
    by = list(by)
    if not by:
        raise LabError("accuracy_table: `by` names no column")
    df = normalise_predictions(pred)
    if "status" in by and "status" not in pred.columns:
        df = with_solver(df)
    missing = [c for c in by if c not in df.columns]
    if missing:
        raise LabError(f"accuracy_table: no column(s) {missing} to group by")
    out = _sort_groups(df.groupby(by, sort=False)["correct"].agg(n="size", correct="sum").reset_index(), by)
    if total:
        total_row = {**dict.fromkeys(by, "all"), "n": len(df), "correct": df["correct"].sum()}
        out = pd.concat([out, pd.DataFrame([total_row])], ignore_index=True)
    ci = [wilson_interval(k, n) for k, n in zip(out["correct"], out["n"])]
    return out.assign(accuracy=out["correct"] / out["n"], lo=[c[0] for c in ci], hi=[c[1] for c in ci])  # 0/0: NaN


def _sort_groups(out: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    keys = [_rank({"category": CATEGORY_ORDER, "status": STATUSES}.get(c, ())) for c in by]
    idx = sorted(range(len(out)), key=lambda i: tuple(k(out[c].iloc[i]) for k, c in zip(keys, by)))
    return out.iloc[idx].reset_index(drop=True)


# --------------------------------------------------------------------------------------------
# the solver's view: status and trace per prompt, cached

_SOLVER_MEMO: dict[tuple[str, str], dict] = {}
SOLUTION_COLUMNS = ("prompt_sha", "fingerprint", "status", "solver_answer", "solver_trace", "solver_reason")


def solver_fingerprint() -> str:
    """A hash of lab/puzzles/*.py: a cached solution made by other solver code is stale."""
    h = hashlib.sha1()
    d = Path(__file__).resolve().parents[1] / "puzzles"
    for p in sorted(d.glob("*.py")):
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def solve_prompts(prompts: Iterable[str], cache_path: str | os.PathLike | None = None,
                  style: str = "compact") -> pd.DataFrame:
    """One row per prompt (in order): SOLUTION_COLUMNS, the trace in `style` (`data.trace_style`: the style the
    model was trained on), each category's batch input built from these prompts as `solve_frame` does. Reuses the
    memo and the CSV cache (keyed by solver code, style and the batch's prompts).

    The CSV at `cache_path` (if given) is read when present and rewritten with every solution
    this call needed; rows made with another solver fingerprint are ignored.
    """
    prompts = [str(p) for p in prompts]
    batch = hashlib.sha1("\n".join(sorted(set(prompts))).encode("utf-8")).hexdigest()[:12]
    fp = f"{solver_fingerprint()}-{style}-{batch}"
    inputs = None
    cache_path = Path(cache_path) if cache_path is not None else None
    try:  # an unreadable cache is no cache
        cached = read_table(cache_path, SOLUTION_COLUMNS, "solver cache") if cache_path else None
    except LabError:
        cached = None
    disk = {} if cached is None else {r["prompt_sha"]: {c: r[c] for c in SOLUTION_COLUMNS}
                                      for r in cached.to_dict("records") if r["fingerprint"] == fp}
    rows, fresh = [], False
    for p in prompts:
        sha = hashlib.sha1(p.encode("utf-8")).hexdigest()
        row = _SOLVER_MEMO.get((fp, sha)) or disk.get(sha)
        if row is None:
            fresh = True
            try:
                inputs = batch_inputs(prompts) if inputs is None else inputs
                s = solve(p, style=style, **inputs)
                row = {"status": str(s.status), "solver_answer": "" if s.answer is None else str(s.answer),
                       "solver_trace": str(s.trace or ""), "solver_reason": str(getattr(s, "reason", "") or "")}
            except Exception as e:  # noqa: BLE001 - the solver promises not to raise; do not die if it does
                row = {"status": "undetermined", "solver_answer": "", "solver_trace": "",
                       "solver_reason": f"solver raised {type(e).__name__}: {e}"}
            row = {"prompt_sha": sha, "fingerprint": fp, **row}
        _SOLVER_MEMO[(fp, sha)] = row
        rows.append(row)
    out = pd.DataFrame(rows, columns=SOLUTION_COLUMNS)
    if cache_path is not None and (fresh or not cache_path.is_file()):
        atomic_write_csv(cache_path, out.drop_duplicates("prompt_sha"))
    return out


def with_solver(pred: pd.DataFrame, solutions: pd.DataFrame | None = None,
                cache_path: str | os.PathLike | None = None, style: str = "compact") -> pd.DataFrame:
    """`pred` plus `status, solver_answer, solver_trace, solver_reason` (solved from `prompt`, trace in `style`).

    `solutions`, when given, is a table matched to `pred` by `id` holding at least `status` (and `solver_trace`):
    tests and notebooks can pass their own. Without it, a `pred` that already has `status` and `solver_trace`
    keeps them.
    """
    df = normalise_predictions(pred)
    if solutions is not None:
        if not {"id", "status"} <= set(solutions.columns):
            raise LabError(f"with_solver: solutions need an 'id' and a 'status' column; have {list(solutions.columns)}")
        sol = solutions.assign(id=solutions["id"].astype(str)).drop_duplicates("id").set_index("id")
        lost = [i for i in df["id"] if i not in sol.index]
        if lost:
            raise LabError(f"with_solver: no solution for id(s) {lost[:5]}")
        sol = sol.loc[df["id"]].reset_index()
    elif {"status", "solver_trace"} <= set(df.columns):
        sol = df
    elif (df["prompt"] == "").any():
        raise LabError("with_solver: some rows have no prompt, so the solver cannot see the puzzle")
    else:
        sol = solve_prompts(df["prompt"], cache_path=cache_path, style=style)
    for c in ("status", "solver_answer", "solver_trace", "solver_reason"):
        df[c] = [_text(v) for v in (sol[c] if c in sol.columns else [""] * len(df))]
    return df


# --------------------------------------------------------------------------------------------
# failure taxonomy


def _as_number(s: str) -> float | None:
    s = str(s).strip()
    v = float(s) if _NUMBER.fullmatch(s) else math.nan  # the pattern is a subset of float()'s syntax
    return v if math.isfinite(v) else None


def _wrong_format(category: str, gold: str, answer: str) -> bool:
    a, g = answer.strip(), gold.strip()
    kind = BY_NAME[category].answer if category in BY_NAME else ""
    if kind == "bits":
        width = len(g) if _BINARY.fullmatch(g) else 8
        return not (_BINARY.fullmatch(a) and len(a) == width)
    if kind == "numeral":
        if _as_number(g) is not None and not _ROMAN.fullmatch(g):
            return _as_number(a) is None
        return not _ROMAN.fullmatch(a)
    if kind == "number":
        return _as_number(a) is None
    return False


def _reasoning(completion: str) -> str:
    """The text before the final `\\boxed{` (all of it when there is no box)."""
    last = completion.rfind(_BOX)
    return completion[:last] if last >= 0 else completion


def _gold_in_text(gold: str, text: str, numeric: bool) -> bool:
    g = gold.strip()
    if not g:
        return False
    pat = r"(?<![\w.])" + re.escape(g) + r"(?![\w]|\.\d)"
    if re.search(pat, text, flags=re.IGNORECASE if not numeric else 0):
        return True
    gv = _as_number(g) if numeric else None
    return gv is not None and any(_as_number(m.group()) == gv for m in _NUMBER.finditer(text))


def _field(row: Mapping | pd.Series, name: str, default: Any = "") -> Any:
    v = row.get(name)
    return default if pd.isna(v) else v


def classify_failure(row: Mapping | pd.Series, budget: int | None = None) -> str:
    """One class from CLASSES for one prediction row (`correct` when the row is correct).

    The row needs `completion`, `gold`, `category`, `correct` (bool or 'True'/'False') and may
    have `answer` (else extracted), `finish_reason` and `tokens`. See docs/internals.md (lab.eval.analysis) for
    the classes and their priority.
    """
    completion = str(_field(row, "completion"))
    gold = str(_field(row, "gold"))
    category = str(_field(row, "category"))
    answer = _field(row, "answer", None)
    answer = extract_answer(completion) if answer is None else str(answer)
    correct = _field(row, "correct", None)
    correct = verify(gold, answer) if correct is None else _to_bool(correct, "classify_failure")
    if correct:
        return "correct"
    finish = str(_field(row, "finish_reason")).strip().lower()
    tokens = _field(row, "tokens", None)
    try:
        tokens = None if tokens is None or str(tokens).strip() == "" else int(float(tokens))
    except ValueError:
        tokens = None
    if finish == "length" or (budget is not None and tokens is not None and tokens >= budget):
        return "truncated"
    if "</think>" not in completion and ("<think>" in completion or _reasoning(completion).strip()):
        return "think_unclosed"
    if _BOX not in completion:
        return "no_box"
    if not answer.strip():
        return "empty_box"
    if _wrong_format(category, gold, answer):
        return "wrong_format"
    if category in NUMERIC_CATEGORIES:
        a, g = _as_number(answer), _as_number(gold)
        if a is not None and g is not None and abs(a - g) <= NEAR_MISS_REL * abs(g):
            return "near_miss"
    if _gold_in_text(gold, _reasoning(completion), numeric=category in NUMERIC_CATEGORIES):
        return "right_in_reasoning"
    return "wrong"


def with_failures(pred: pd.DataFrame, budget: int | None = None) -> pd.DataFrame:
    """`pred` (normalised) plus a `failure` column (one of CLASSES)."""
    df = normalise_predictions(pred)
    df["failure"] = [classify_failure(r, budget=budget) for r in df.to_dict("records")]
    return df


def _failures(pred: pd.DataFrame, budget: int | None) -> pd.DataFrame:
    return normalise_predictions(pred) if "failure" in pred.columns else with_failures(pred, budget=budget)


def taxonomy(pred: pd.DataFrame, budget: int | None = None) -> pd.DataFrame:
    """Counts per category (rows, then 'all') and class (columns, CLASSES order), plus `n`.

    A `failure` column already in `pred` is used as is; otherwise rows are classified here.
    """
    df = _failures(pred, budget)
    rows = []
    for cat, g in _per_category(df):
        counts = g["failure"].value_counts()
        rows.append({"category": cat, "n": int(len(g)), **{c: int(counts.get(c, 0)) for c in CLASSES}})
    return pd.DataFrame(rows, columns=["category", "n", *CLASSES])


def examples(pred: pd.DataFrame, cls: str, n: int = 5, category: str | None = None,
             budget: int | None = None) -> pd.DataFrame:
    """The first `n` rows (input order) of class `cls`, optionally of one category."""
    if cls not in CLASSES:
        raise LabError(f"examples: unknown class {cls!r}; choose from {list(CLASSES)}")
    df = _failures(pred, budget)
    sel = df[df["failure"] == cls]
    if category is not None:
        sel = sel[sel["category"] == category]
    cols = [c for c in ("id", "category", "subtype", "gold", "answer", "failure", "tokens", "finish_reason",
                        "completion") if c in sel.columns]
    return sel[cols].head(n).reset_index(drop=True)


# --------------------------------------------------------------------------------------------
# where the model leaves the solver's trace


def _steps(text: str) -> list[str]:
    return [s for s in (" ".join(line.split()) for line in str(text).splitlines()) if s]


def first_departure(completion: str, solver_trace: str | None) -> int | None:
    """1-based index of the first step (non-empty line, whitespace-normalised) where `completion`
    differs from `solver_trace`, compared in order.

    None when there is no trace, or when every model step matches the trace up to the model's
    end (a truncated prefix included). A model that goes on after the whole trace departs at
    len(trace) + 1.
    """
    if not solver_trace or not str(solver_trace).strip():
        return None
    model, trace = _steps(completion), _steps(solver_trace)
    for i, m in enumerate(model):
        if i >= len(trace) or m != trace[i]:
            return i + 1
    return None


def departure_table(pred: pd.DataFrame, solutions: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per prediction whose prompt has a solved or ambiguous solver trace (`with_solver`; an
    'undetermined' trace only says "cannot solve", so it is left out):
    `id, category, subtype, status, correct, trace_steps, model_steps, departure` (Int64, <NA>
    when the model followed the trace to its end), `model_step`, `trace_step` (the two lines
    at the departure) and `kind` (`line_kind` of the trace's line there, else the model's).
    """
    df = with_solver(pred, solutions=solutions)
    df = df[(df["solver_trace"].str.strip() != "") & df["status"].isin(["solved", "ambiguous"])]
    rows = []
    for r in df.to_dict("records"):
        model, trace = _steps(r["completion"]), _steps(r["solver_trace"])
        d = first_departure(r["completion"], r["solver_trace"])
        model_step = model[d - 1] if d else ""
        trace_step = trace[d - 1] if d and d <= len(trace) else ""
        rows.append({"id": r["id"], "category": r["category"], "subtype": r["subtype"], "status": r["status"],
                     "correct": bool(r["correct"]), "trace_steps": len(trace), "model_steps": len(model),
                     "departure": d if d is not None else pd.NA, "model_step": model_step, "trace_step": trace_step,
                     "kind": line_kind(trace_step or model_step)})
    out = pd.DataFrame(rows, columns=["id", "category", "subtype", "status", "correct", "trace_steps",
                                      "model_steps", "departure", "model_step", "trace_step", "kind"])
    out["departure"] = out["departure"].astype("Int64")
    return out


TAG_RE = re.compile(r"^(?:ex|q)\d*: (.*)$")


def line_kind(line: str) -> str:
    """What kind of trace line this is: a derivation step's operation (`cands`, `try`, `add`, `rev`, `eq`, `copy`,
    `note`, ... after its `ex3:`/`q:` tag), a compact line's label (`mode`, `rule`, `written`), `</think>` or `box`;
    else the line's shape with numbers written N (`|N-N| = N`), at most 24 characters. '' for no line."""
    s = " ".join(str(line).split())
    if not s:
        return ""
    m = TAG_RE.match(s)
    s = m.group(1) if m else s
    if s == "</think>":
        return s
    if s.startswith("\\boxed"):
        return "box"
    head = s.split()[0]
    if re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*:?", head):
        return head.rstrip(":")
    return re.sub(r"\d+", "N", s)[:24]


def imitation_table(pred: pd.DataFrame, departures: pd.DataFrame) -> pd.DataFrame:
    """Per category (then 'all'), whether a miss is the solver's or the imitation's: n, model accuracy, solver
    accuracy (the solver's answer against the gold), their gap (solver minus model), then over the rows with a
    solver trace (`departures`, from `departure_table`): the perfect-trace rate (the completion is the trace, line
    for line to its end), the median line where a completion first leaves it, and the most common kind of trace
    line there (`line_kind`) with its count. `pred` needs `solver_answer` (`with_solver`)."""
    df = normalise_predictions(pred)
    if "solver_answer" not in pred.columns:
        raise LabError("imitation_table: no 'solver_answer' column (add it with lab.eval.analysis.with_solver)")
    df["solver_correct"] = [verify(g, _text(a)) if _text(a) else False
                            for g, a in zip(df["gold"], pred["solver_answer"])]
    rows = []
    for cat, g in _per_category(df):
        d = departures if cat == "all" else departures[departures["category"] == cat]
        perfect = d[d["departure"].isna() & (d["model_steps"] == d["trace_steps"])]
        left = d[d["departure"].notna()]
        kinds = left["kind"].value_counts() if "kind" in left and len(left) else pd.Series(dtype=int)
        model, solver = float(g["correct"].mean()), float(g["solver_correct"].mean())  # NaN for no rows
        rows.append({"category": cat, "n": int(len(g)), "model_accuracy": round(model, 4),
                     "solver_accuracy": round(solver, 4), "solver_minus_model": round(solver - model, 4),
                     "with_trace": int(len(d)),
                     "perfect_trace_rate": round(len(perfect) / len(d), 4) if len(d) else float("nan"),
                     "median_departure": float(left["departure"].astype(float).median()) if len(left) else float("nan"),
                     "departure_kind": str(kinds.index[0]) if len(kinds) else "",
                     "departure_kind_n": int(kinds.iloc[0]) if len(kinds) else 0})
    return pd.DataFrame(rows)


def departure_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per category (then 'all'): rows with a trace, how many never departed, median departure
    step, and the median departure as a fraction of the trace length."""
    rows = []
    for cat, g in _per_category(table):
        dep = g[g["departure"].notna()]
        frac = (dep["departure"].astype(float) / dep["trace_steps"].clip(lower=1)).astype(float)
        rows.append({"category": cat, "n": int(len(g)), "followed": int(g["departure"].isna().sum()),
                     "median_departure": float(dep["departure"].astype(float).median()),  # NaN for no rows
                     "median_fraction": float(frac.median())})
    return pd.DataFrame(rows, columns=["category", "n", "followed", "median_departure", "median_fraction"])


# --------------------------------------------------------------------------------------------
# completion lengths against the budget


def length_table(pred: pd.DataFrame, budget: int | None = None) -> pd.DataFrame:
    """Completion tokens per category (then 'all') and outcome (correct / wrong):
    n, mean, median, p90, max, at_budget (finish_reason 'length' or tokens >= budget; default: the competition's
    `max_tokens`, `lab.core.schema.COMPETITION`)."""
    budget = COMPETITION.max_tokens if budget is None else budget
    df = normalise_predictions(pred)
    rows = []
    for cat, g in _per_category(df):
        for outcome, h in (("correct", g[g["correct"]]), ("wrong", g[~g["correct"]])):
            t = h["tokens"].dropna().astype(float)
            at = (h["finish_reason"] == "length") | (h["tokens"].fillna(-1).astype(int) >= budget)
            rows.append({"category": cat, "outcome": outcome, "n": int(len(h)), "mean": float(t.mean()),
                         "median": float(t.median()), "p90": float(t.quantile(0.9)), "max": float(t.max()),
                         "at_budget": int(at.sum()), "budget": int(budget)})  # NaN statistics for no tokens
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------
# comparing two runs


def compare(pred_a: pd.DataFrame, pred_b: pd.DataFrame, budget: int | None = None
            ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Puzzles fixed (wrong in A, right in B) and broken (right in A, wrong in B), on the ids
    both runs share.

    Returns (summary, examples): summary has per category (then 'all') `n, acc_a, acc_b,
    fixed, broken, net` (net = fixed - broken = correct_b - correct_a); examples has one row
    per changed puzzle: `id, category, subtype, change, gold, answer_a, answer_b, failure_a,
    failure_b`. `summary.attrs` holds `only_a` / `only_b`, ids present in one run only.
    """
    a = with_failures(pred_a, budget=budget)
    b = with_failures(pred_b, budget=budget)
    for name, d in (("A", a), ("B", b)):
        dup = d["id"][d["id"].duplicated()]
        if len(dup):
            raise LabError(f"compare: run {name} has duplicate id(s) {list(dup.unique()[:5])}")
    m = a.merge(b[["id", "gold", "answer", "correct", "failure"]], on="id", suffixes=("_a", "_b"))
    if m.empty:
        raise LabError("compare: the two runs share no puzzle id")
    differ = m[m["gold_a"].str.strip() != m["gold_b"].str.strip()]
    if len(differ):
        raise LabError(f"compare: {len(differ)} shared id(s) have different gold answers (e.g. "
                       f"{differ['id'].iloc[0]!r}); the runs were evaluated on different data")
    m["change"] = np.select([~m["correct_a"] & m["correct_b"], m["correct_a"] & ~m["correct_b"]],
                            ["fixed", "broken"], default="")
    rows = []
    for cat, g in _per_category(m):
        fixed, broken = int((g["change"] == "fixed").sum()), int((g["change"] == "broken").sum())
        rows.append({"category": cat, "n": int(len(g)), "acc_a": float(g["correct_a"].mean()),
                     "acc_b": float(g["correct_b"].mean()), "fixed": fixed, "broken": broken,
                     "net": fixed - broken})
    summary = pd.DataFrame(rows, columns=["category", "n", "acc_a", "acc_b", "fixed", "broken", "net"])
    summary.attrs["only_a"] = sorted(set(a["id"]) - set(b["id"]))
    summary.attrs["only_b"] = sorted(set(b["id"]) - set(a["id"]))
    ch = m[m["change"] != ""].rename(columns={"gold_a": "gold"})
    ch = ch.assign(_o=ch["change"].map({"fixed": 0, "broken": 1}), _c=ch["category"].map(_rank(CATEGORY_ORDER)))
    ch = ch.sort_values(["_o", "_c"], kind="stable")
    ex = ch[["id", "category", "subtype", "change", "gold", "answer_a", "answer_b", "failure_a", "failure_b"]]
    return summary, ex.reset_index(drop=True)


# --------------------------------------------------------------------------------------------
# the solver's tables and the headline


@dataclass
class SolverView:
    """The solver's side of an analysis (`solver_view`): `failures` with the solver's columns and the departure line
    added, accuracy by solver status, the departure table, its summary and the imitation table."""
    failures: pd.DataFrame
    by_status: pd.DataFrame
    departures: pd.DataFrame
    departure_summary: pd.DataFrame
    imitation: pd.DataFrame


def solver_view(failures: pd.DataFrame, cache_path: str | os.PathLike | None = None,
                style: str = "compact") -> SolverView:
    """Each prediction's prompt solved (`with_solver`, trace in `style`: the style the model was trained on; the
    solutions cached at `cache_path`), then accuracy by solver status, where completions leave the trace and
    whether a miss is the solver's or the imitation's."""
    df = with_solver(failures, cache_path=cache_path, style=style)
    dep = departure_table(df)
    dep_map = dict(zip(dep["id"], dep["departure"]))
    df["departure"] = pd.array([dep_map.get(i, pd.NA) for i in df["id"]], dtype="Int64")
    return SolverView(df, accuracy_table(df, ("status",)), dep, departure_summary(dep), imitation_table(df, dep))


FAILURE_COLUMNS = ("id", "category", "subtype", "gold", "answer", "correct", "failure", "tokens", "finish_reason",
                   "status", "solver_answer", "departure")


def failures_table(failures: pd.DataFrame) -> pd.DataFrame:
    """One row per prediction with its class (and the solver's status, answer and departure when present)."""
    return failures[[c for c in FAILURE_COLUMNS if c in failures.columns]]


def _jsonable(v: Any) -> Any:
    """A table cell as JSON: a numpy scalar as Python's, NaN as None."""
    v = v.item() if isinstance(v, np.generic) else v
    return None if isinstance(v, float) and math.isnan(v) else v


def _by(table: pd.DataFrame, key: str, cols: Iterable[str] | None = None, total: bool = False) -> dict:
    """{row[key]: {column: JSON value}} over the rows of a table (the 'all' row only with `total`)."""
    return {r[key]: {k: _jsonable(r[k]) for k in (cols or r) if k != key}
            for r in table.to_dict("records") if total or r[key] != "all"}


def headline(accuracy: pd.DataFrame, tax: pd.DataFrame, budget: int, solver: SolverView | None = None
             ) -> dict[str, Any]:
    """The analysis in JSON-serialisable numbers: n, accuracy, accuracy_by_category {category: {n, correct,
    accuracy, lo, hi}}, taxonomy {category: {class: count}} ('all' included), truncated, budget, and with the
    solver imitation and accuracy_by_status."""
    total, counts = accuracy[accuracy["category"] == "all"].iloc[0], _by(tax, "category", CLASSES, total=True)
    metrics: dict[str, Any] = {
        "n": int(total["n"]), "accuracy": _jsonable(total["accuracy"]),
        "accuracy_by_category": _by(accuracy, "category", ("n", "correct", "accuracy", "lo", "hi")),
        "taxonomy": counts, "truncated": counts["all"]["truncated"], "budget": int(budget)}
    if solver is not None:
        metrics["imitation"] = _by(solver.imitation, "category", total=True)
        metrics["accuracy_by_status"] = _by(solver.by_status, "status", ("n", "correct", "accuracy"))
    return metrics
