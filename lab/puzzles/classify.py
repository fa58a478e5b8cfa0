"""Which category (and, for equations, which subtype) a prompt belongs to, from its opening wording.

Subtypes: equation_transformation has four, named `<kind>_<mode>`:
  kind  numeric   the examples' left sides are digits with one operator symbol (34/44 = 1)
        symbolic  anything else (strings of punctuation, the cryptarithm-like kind)
  mode  deduce    the query's operator symbol occurs in some example, so its meaning can be inferred
        guess     it does not: the answer can only be guessed
Every other category has subtype "". Unrecognised text gives ("unknown", ""), never a guess.
Deliberately simple: keyword tests on the fixed competition wording, no fuzzy matching.
"""

from __future__ import annotations

import re

from .categories import BY_NAME, TABLE

KEYS = [(c.key, c.name) for c in TABLE]  # (substring of the opening sentence, category), checked in order

EQ_LINE_RE = re.compile(r"^\s*(\S.*?) = (.*?)\s*$")
NUMERIC_LHS_RE = re.compile(r"^\d+\D\d+$")


def equation_parts(prompt: str):
    """(examples [(lhs, rhs)], query or None) for an equation prompt.

    A backtick is a symbol like any other, not quoting: in the real example line `` `!*[{ = '"[` ``
    the left side is the five symbols `` `!*[{ `` (operands `` `! `` and ``[{``, operator ``*``, the
    shape of the query ``[[-!'``) and the result is the four symbols `` '"[` ``."""
    body, _, tail = prompt.partition("Now, determine the result for:")
    examples = []
    for line in body.splitlines()[1:]:
        m = EQ_LINE_RE.match(line)
        if m:
            examples.append((m.group(1), m.group(2)))
    q = tail.strip() if _ else None
    return examples, (q or None)


def operator_of(lhs: str) -> str | None:
    """The operator symbol of a left side: the non-digit between two numbers, else the middle char."""
    m = re.fullmatch(r"\d+(\D)\d+", lhs)
    if m:
        return m.group(1)
    return lhs[len(lhs) // 2] if len(lhs) % 2 == 1 and len(lhs) >= 3 else None


def equation_subtype(prompt: str) -> str:
    examples, q = equation_parts(prompt)
    lhs = [a for a, _ in examples] + ([q] if q else [])
    numeric = bool(lhs) and all(NUMERIC_LHS_RE.match(s) for s in lhs)
    ops = {operator_of(a) for a, _ in examples}
    mode = "deduce" if q and operator_of(q) in ops else "guess"
    return f"{'numeric' if numeric else 'symbolic'}_{mode}"


def classify(prompt: str) -> tuple[str, str]:
    if not isinstance(prompt, str):
        return "unknown", ""
    head = prompt[:300].lower()
    for key, cat in KEYS:
        if key in head:
            return cat, (equation_subtype(prompt) if BY_NAME[cat].module == "equations" else "")
    return "unknown", ""
