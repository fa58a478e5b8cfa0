"""Shared pieces of the puzzle engine: the Solution record, the Category record, trace endings, prompt-line helpers.

Every solver returns a `Solution`; every trace ends with `finish(lines, answer)`, so the last two
lines are always `</think>` and `\\boxed{answer}` with nothing after. Every category module defines one
`CATEGORY = Category(...)` with all the rest of the lab needs of it; `categories.TABLE` lists them.
Deliberately simple: no class hierarchy, a category is a record of plain functions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

STATUSES = ("solved", "ambiguous", "undetermined")


@dataclass
class Solution:
    """One solved (or not) puzzle. `trace` is the whole completion after `<think>\\n`."""
    answer: str
    status: str
    trace: str
    category: str
    subtype: str = ""
    reason: str = ""
    method: str = ""  # which part of the solver answered (bits: the rule level), for the per-method tables
    detail: dict | None = None  # what a derivation trace needs from the search (the rule found), never the answer


@dataclass(frozen=True)
class Category:
    """One puzzle category: what `solve`, `generate`, `classify`, the derivation writer, the checker and
    `analysis` need of it. A new category is one module defining one of these plus one line in `categories.TABLE`."""
    name: str      # the category as data, metrics and reports spell it
    key: str       # substring of the prompt's opening sentence that identifies it (checked in table order)
    prefix: str    # generated ids are <prefix>-<seed>-<index>
    answer: str    # 'bits' (a binary string), 'number', 'numeral' (Roman numeral, or a number), 'text'
    parse: Callable      # prompt -> (examples, query or None)
    solve: Callable      # prompt[, the batch input] -> Solution
    generate: Callable   # (random.Random, **difficulty) -> (prompt, answer, subtype)
    derive: Callable     # (prompt, Solution) -> derivation step lines (None: keep the compact trace, unsolved only)
    check_line: Callable  # (line, prompt, state dict) -> True if a compact line's computation replays, False
    #                      if it is a claim; raises check.Fail if it is wrong
    compact_answer: Callable | None = None  # (lines, box, state, tail) -> the answer a compact trace ends with,
    #                                          where it is not the last line's `= VALUE`
    subtype: Callable | None = None  # prompt -> subtype ('' without it)
    input: str = ""                  # the extra solver argument from the batch: 'vocab' (cipher), 'priors' (equations)
    learn: Callable | None = None    # prompts -> that argument (built from the batch's prompts, never its answers)
    ops: dict = field(default_factory=dict)       # derivation operations of its own: name -> (Replay, args) -> result
    branches: dict = field(default_factory=dict)  # derivation lines without a result: name -> (Replay, args) -> None


def has_key(prompt, key: str) -> bool:
    """Whether `key` is in the prompt's opening (`categories.classify` reads the keys in table order)."""
    return isinstance(prompt, str) and key in prompt[:300].lower()


def finish(lines: list[str], answer: str) -> str:
    """The trace: the step lines, then `</think>`, then `\\boxed{answer}` (nothing after)."""
    return "\n".join([*lines, "</think>", f"\\boxed{{{answer}}}"])


def undetermined(category: str, reason: str, subtype: str = "", answer: str = "",
                 lines: list[str] | None = None) -> Solution:
    """A Solution that says plainly the solver could not decide; the trace still ends in a box."""
    lines = lines if lines is not None else [f"cannot solve: {reason}"]
    return Solution(answer=answer, status="undetermined", trace=finish(lines, answer),
                    category=category, subtype=subtype, reason=reason)


def missing(category: str, examples, query, no_query: str, no_examples: str, subtype: str = "") -> Solution | None:
    """The `undetermined` Solution for a prompt without a query or without examples; None when it has both."""
    if query is None or query == "":
        return undetermined(category, no_query, subtype)
    if not examples:
        return undetermined(category, no_examples, subtype)
    return None


ARROW_RE = re.compile(r"^\s*(.+?)\s*->\s*(.+?)\s*$")


def arrow_pairs(text: str) -> list[tuple[str, str]]:
    """All `left -> right` lines of a prompt, stripped, in order."""
    out = []
    for line in text.splitlines():
        m = ARROW_RE.match(line)
        if m and "input -> output" not in line:
            out.append((m.group(1), m.group(2)))
    return out


def make_id(prefix: str, seed: int, i: int) -> str:
    return f"{prefix}-{seed}-{i:04d}"


def estimate_tokens(text: str) -> int:
    """Real-tokenizer tokens without a tokenizer (an estimate, not a measurement): Nemotron's tokenizer writes each
    digit as one token and a space before a digit as another; a run of letters or a punctuation mark counts one."""
    return len(re.findall(r"[A-Za-z]+|\d| (?=\d)|[^\w\s]", text)) + text.count("\n")
