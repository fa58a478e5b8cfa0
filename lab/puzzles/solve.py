"""Dispatch by category: solve (never raising), write derivation traces, replay traces; whole frames; token counts.

`solve(prompt)` classifies the prompt, runs that category's solver and turns any exception into an
`undetermined` Solution with the error as reason; with `style="derivation"` the category's `derive` rewrites
the trace. `solve_frame(df)` does it for a DataFrame (with a progress line for big frames,
`lab.core.console.Progress`) and, when the frame has a gold `answer` column, adds `correct` via
lab.competition.metric.verify (the competition metric; an error there is raised, never replaced). `solve_frame`
first builds each category's batch input from the frame's prompts
(`Category.learn`: the cipher's pooled vocabulary, so a query word its own examples never spell out can still be
read; the equations' priors from the numeric equation prompts' examples, never a gold answer).
`replay` / `check_frame` replay traces with `lab.puzzles.check` and the category's own checker and operations.
Deliberately simple: a plain process pool for big frames, nothing cached between calls.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from lab.core.schema import COMPETITION
from lab.competition.metric import verify

from .categories import BY_NAME, classify
from .check import replay_compact, replay_derivation
from .common import Solution, estimate_tokens, finish, undetermined

STYLES = ("compact", "derivation")


def solve(prompt: str, vocab=None, priors=None, style: str = "compact", **inputs) -> Solution:
    """The Solution for one prompt; malformed or unknown prompts give status 'undetermined'.
    `style`: the trace style, 'compact' (the rule, then applied) or 'derivation' (the search written out,
    see `derivation`); the answer, status and method are the same in both.
    The batch inputs a category's solver takes (`Category.input`), by name: `vocab`, the batch's cipher vocabulary
    (`cipher.vocabulary(prompts)`); `priors`, the batch's equation priors (`eqsolve.learn_priors(prompts)`; default:
    eqsolve.DEFAULT_COUNTS); a new category's by keyword. `batch_inputs(prompts)` builds them all."""
    inputs = {"vocab": vocab, "priors": priors, **inputs}
    try:
        category, subtype = classify(prompt)
    except Exception as e:  # noqa: BLE001 - solve never raises
        return undetermined("unknown", f"classify failed: {type(e).__name__}: {e}")
    if category == "unknown":
        return undetermined("unknown", "prompt wording not recognised")
    cat = BY_NAME[category]
    try:
        sol = cat.solve(prompt, inputs.get(cat.input)) if cat.input else cat.solve(prompt)
    except Exception as e:  # noqa: BLE001
        return undetermined(category, f"solver error: {type(e).__name__}: {e}", subtype)
    sol.subtype = sol.subtype or subtype
    if style == "derivation":
        sol = derivation(prompt, sol)
    elif style != "compact":
        raise ValueError(f"trace style {style!r} is not one of {STYLES}")
    return sol


def derivation(prompt: str, sol: Solution) -> Solution:
    """The same Solution with its trace written by its category's `derive` (`data.trace_style: derivation`): the
    solver's search, one local step a line in `check`'s grammar; the answer, status and method stay the solver's.
    An unsolved puzzle keeps its compact trace when the derivation cannot be written (nothing trains on it); a
    solved one whose derivation fails gets a `note no derivation` line that `check` rejects, never a compact trace."""
    cat = BY_NAME.get(sol.category)
    if cat is None:
        return sol
    try:
        lines = cat.derive(prompt, sol)
    except Exception as e:  # noqa: BLE001 - a solved puzzle without a derivation shows up in `check`
        if sol.status != "solved":
            return sol
        lines = [f"note no derivation: {type(e).__name__}: {e}"]
    if lines is None:
        return sol
    sol.trace = finish(lines, sol.answer)
    return sol


def batch_inputs(prompts) -> dict:
    """{input name: value} of every category's batch input (`Category.learn`) from a batch's prompts."""
    return {c.input: c.learn(prompts) for c in BY_NAME.values() if c.input}


_TOKENIZERS: dict[str, object] = {}


def trace_tokens(trace: str, tokenizer=None) -> int:
    """Tokens in a trace with `tokenizer` (an HF tokenizer or a local folder path); without one,
    an ESTIMATE: max(whitespace words, characters / 3.5), rounded up."""
    if tokenizer is not None:
        if isinstance(tokenizer, (str, Path)):
            key = str(tokenizer)
            if key not in _TOKENIZERS:
                from transformers import AutoTokenizer
                _TOKENIZERS[key] = AutoTokenizer.from_pretrained(key, local_files_only=True)
            tokenizer = _TOKENIZERS[key]
        return len(tokenizer(trace, add_special_tokens=False)["input_ids"])
    return estimate_tokens(trace)


def _solve_timed(prompt, inputs, style="compact"):
    t0 = time.perf_counter()
    s = solve(prompt, style=style, **inputs)
    return s, time.perf_counter() - t0


def solve_frame(df, tokenizer=None, progress: bool | None = None, workers: int | None = None,
                style: str = "compact"):
    """DataFrame with id, category, subtype, status, method, answer, trace, trace_tokens, reason, seconds
    (+ correct when df has a gold `answer` column); `style` is the trace style (see `solve`).
    `workers`: processes (default: up to 4 for frames of 500 rows or more, else 1); `seconds` is each
    puzzle's own solve time. Each category's batch input is built from the frame's prompts (`batch_inputs`)."""
    import pandas as pd

    prompts = df["prompt"].tolist()
    inputs = batch_inputs(prompts)
    progress = len(df) >= 200 if progress is None else progress
    if workers is None:
        workers = min(4, os.cpu_count() or 1) if len(prompts) >= 500 else 1
    bar = None
    if progress:
        from lab.core.console import Progress  # one line redrawn in a notebook, plain lines elsewhere

        bar = Progress("solving", len(prompts), "puzzles")
    results = []
    if workers > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=workers) as pool:
            for r in pool.map(_solve_timed, prompts, [inputs] * len(prompts), [style] * len(prompts), chunksize=32):
                results.append(r)
                if bar is not None:
                    bar.update(1)
    else:
        for p in prompts:
            results.append(_solve_timed(p, inputs, style))
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    ids = df["id"].tolist() if "id" in df.columns else [str(i) for i in range(len(df))]
    rows = [{"id": pid, "category": s.category, "subtype": s.subtype, "status": s.status, "method": s.method,
             "answer": s.answer, "trace": s.trace, "trace_tokens": trace_tokens(s.trace, tokenizer), "reason": s.reason,
             "seconds": dt}
            for pid, (s, dt) in zip(ids, results)]
    out = pd.DataFrame(rows, columns=["id", "category", "subtype", "status", "method", "answer", "trace",
                                      "trace_tokens", "reason", "seconds"])
    if "answer" in df.columns:
        out["correct"] = [bool(verify(g, p)) for g, p in zip(df["answer"].tolist(), out["answer"].tolist())]
    return out


def token_table(out, budget: int | None = None):
    """Trace tokens per category (and `trace_style` when the frame has it): n, p50, p90, p99, max, and the
    share over `budget` (default: the competition's `max_tokens`, `lab.core.schema.COMPETITION`). The trace is the
    whole completion the scorer sees after `<think>\\n`."""
    budget = COMPETITION.max_tokens if budget is None else budget
    keys = ["category"] + (["trace_style"] if "trace_style" in out else [])
    g = out.groupby(keys)["trace_tokens"]
    table = g.quantile([0.5, 0.9, 0.99]).unstack().rename(columns={0.5: "p50", 0.9: "p90", 0.99: "p99"}).round(0)
    table.insert(0, "n", g.size())
    table["max"] = g.max()
    table["over_budget"] = g.apply(lambda t: round(float((t > budget).mean()), 4))
    return table.reset_index()


def method_table(out):
    """Puzzles per category and solver method of a `solve_frame` result: n, solved, and accuracy when
    it has gold answers (`correct`). Rows without a method (undetermined, or categories that have one
    way only) are left out."""
    g = out[out["method"] != ""].groupby(["category", "method"])
    table = g.size().rename("n").to_frame()
    table["solved"] = g["status"].apply(lambda s: int((s == "solved").sum()))
    if "correct" in out:
        table["accuracy"] = g["correct"].mean().round(4)
    return table.reset_index().sort_values(["category", "n"], ascending=[True, False])


def replay(style: str, category: str, prompt: str, trace: str):
    """(ok, failing line, message, recalls or claims) of one trace (`check.replay_derivation` with the category's own
    operations, or `check.replay_compact` with its line checker); a category no table row names replays no line."""
    cat = BY_NAME.get(category)
    if style == "derivation":
        return replay_derivation(prompt, trace, cat and cat.ops, cat and cat.branches)
    if cat is None:
        return replay_compact(prompt, trace, lambda line, prompt, state: False)
    return replay_compact(prompt, trace, cat.check_line, cat.compact_answer)


def check_frame(df, style: str | None = None):
    """Replays every solved row of a solve output (columns prompt, category, status, trace, and trace_style
    unless `style` is given). -> (per-row DataFrame [id, category, style, ok, line, message, recalls],
    summary DataFrame per category and style [n, replayed, share, unchecked_lines_mean]); `recalls` counts a
    derivation's `let`/`recall` lines, or a compact trace's claim lines: what the replay takes on trust)."""
    import pandas as pd

    rows = []
    for _, r in df.iterrows():
        if r["status"] != "solved":
            continue
        st = style or r.get("trace_style", "compact") or "compact"
        ok, line, msg, rec = replay(st, r["category"], r["prompt"], r["trace"])
        rows.append({"id": r.get("id", ""), "category": r["category"], "style": st, "ok": ok, "line": line,
                     "message": msg, "recalls": rec})
    res = pd.DataFrame(rows, columns=["id", "category", "style", "ok", "line", "message", "recalls"])
    g = res.groupby(["category", "style"])
    summary = g.size().rename("n").to_frame()
    summary["replayed"] = g["ok"].sum().astype(int)
    summary["share"] = (summary["replayed"] / summary["n"]).round(4)
    summary["unchecked_lines_mean"] = g["recalls"].mean().round(1)
    return res, summary.reset_index()
