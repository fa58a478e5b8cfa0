"""Shared pieces of the trace engine: the Solution record, trace endings, prompt-line helpers.

Every solver returns a `Solution`; every trace ends with `finish(lines, answer)`, so the last two
lines are always `</think>` and `\\boxed{answer}` with nothing after. Deliberately simple: no
class hierarchy, each category module has plain functions `parse`, `solve`, `generate_one`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .categories import CATEGORIES  # noqa: F401 - re-exported; the list is written in categories.TABLE

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


def finish(lines: list[str], answer: str) -> str:
    """The trace: the step lines, then `</think>`, then `\\boxed{answer}` (nothing after)."""
    return "\n".join([*lines, "</think>", f"\\boxed{{{answer}}}"])


def undetermined(category: str, reason: str, subtype: str = "", answer: str = "",
                 lines: list[str] | None = None) -> Solution:
    """A Solution that says plainly the solver could not decide; the trace still ends in a box."""
    lines = lines if lines is not None else [f"cannot solve: {reason}"]
    return Solution(answer=answer, status="undetermined", trace=finish(lines, answer),
                    category=category, subtype=subtype, reason=reason)


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
