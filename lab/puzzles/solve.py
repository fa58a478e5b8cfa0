"""Solving prompts: dispatch by category, never raise, count trace tokens, solve whole frames.

`solve(prompt)` classifies the prompt, runs that category's solver and turns any exception into an
`undetermined` Solution with the error as reason. `solve_frame(df)` does it for a DataFrame (with a
tqdm bar for big frames) and, when the frame has a gold `answer` column, adds `correct` via
lab.metric.verify (the competition metric; an error there is raised, never replaced).
`solve_frame` first pools the plaintext words of every cipher example in the frame, so a cipher
query word that its own examples never spell out can still be read (see `cipher.vocabulary`), and
learns the equation priors from the frame's own numeric equation prompts (`equations.learn_priors`:
their examples only, never a gold answer).
Deliberately simple: a plain process pool for big frames, nothing cached between calls.
"""

from __future__ import annotations

import importlib
import os
import time
from pathlib import Path

from lab.schema import COMPETITION
from lab.metric import verify

from .categories import BY_NAME
from .classify import classify
from .common import Solution, undetermined


def category_module(category: str):
    """The module under lab.puzzles that parses, solves and generates `category` (see categories.TABLE)."""
    return importlib.import_module(f"lab.puzzles.{BY_NAME[category].module}")


STYLES = ("compact", "derivation")


def solve(prompt: str, vocab=None, priors=None, style: str = "compact") -> Solution:
    """The Solution for one prompt; malformed or unknown prompts give status 'undetermined'.
    `style`: the trace style, 'compact' (the rule, then applied) or 'derivation' (the search written out,
    see `lab.puzzles.derive`); the answer, status and method are the same in both.
    `vocab`: the batch's cipher vocabulary (`cipher.vocabulary(prompts)`), passed to the cipher solver.
    `priors`: the batch's equation priors (`equations.learn_priors(prompts)`); default: equations.DEFAULT_COUNTS."""
    try:
        category, subtype = classify(prompt)
    except Exception as e:  # noqa: BLE001 - solve never raises
        return undetermined("unknown", f"classify failed: {type(e).__name__}: {e}")
    if category == "unknown":
        return undetermined("unknown", "prompt wording not recognised")
    try:
        module = category_module(category)
        batch = BY_NAME[category].batch
        if batch == "vocab":
            sol = module.solve(prompt, vocab)
        elif batch == "priors":
            sol = module.solve(prompt, priors)
        else:
            sol = module.solve(prompt)
    except Exception as e:  # noqa: BLE001
        return undetermined(category, f"solver error: {type(e).__name__}: {e}", subtype)
    sol.subtype = sol.subtype or subtype
    if style == "derivation":
        from .derive import derivation
        sol = derivation(prompt, sol)
    elif style != "compact":
        raise ValueError(f"trace style {style!r} is not one of {STYLES}")
    return sol


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


def estimate_tokens(text: str) -> int:
    """Rough token count without a tokenizer (an estimate, not a measurement)."""
    return max(len(text.split()), -(-len(text) * 2 // 7))


def _solve_timed(prompt, vocab=None, priors=None, style="compact"):
    t0 = time.perf_counter()
    s = solve(prompt, vocab, priors, style)
    return s, time.perf_counter() - t0


def solve_frame(df, tokenizer=None, progress: bool | None = None, workers: int | None = None,
                style: str = "compact"):
    """DataFrame with id, category, subtype, status, method, answer, trace, trace_tokens, reason, seconds
    (+ correct when df has a gold `answer` column); `style` is the trace style (see `solve`).
    `workers`: processes (default: up to 4 for frames of 500 rows or more, else 1); `seconds` is each
    puzzle's own solve time. Cipher puzzles share the vocabulary of every cipher example in the frame
    (see `cipher.vocabulary`)."""
    import pandas as pd

    from .cipher import vocabulary
    from .equations import learn_priors

    prompts = df["prompt"].tolist()
    vocab = vocabulary(prompts)
    priors = learn_priors(prompts)
    progress = len(df) >= 200 if progress is None else progress
    if workers is None:
        workers = min(4, os.cpu_count() or 1) if len(prompts) >= 500 else 1
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(prompts), desc="solving", unit="puzzle")
    results = []
    if workers > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=workers) as pool:
            for r in pool.map(_solve_timed, prompts, [vocab] * len(prompts), [priors] * len(prompts),
                              [style] * len(prompts), chunksize=32):
                results.append(r)
                if bar is not None:
                    bar.update(1)
    else:
        for p in prompts:
            results.append(_solve_timed(p, vocab, priors, style))
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
    share over `budget` (default: the competition's `max_tokens`, `lab.schema.COMPETITION`). The trace is the whole completion the scorer sees after `<think>\\n`."""
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
