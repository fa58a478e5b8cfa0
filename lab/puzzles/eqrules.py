"""Equation transformation puzzles' prompt and rule model: the wording, parsing a prompt, its subtype, and what an
operator can mean (`MEANINGS` in `FAMILIES`, each in a `mode`: plain, or reversed: operands and result read with their
digits reversed) with the result it writes (`compute`).

The solvers and the generator (`eqsolve`), the written search (`eqsearch`) and the derivation and its checker
(`equations`) all read this one model. The meanings and their marker forms: docs/internals.md, lab.puzzles.eqsolve.
"""

from __future__ import annotations

import re

KEY = "transformation rules is applied to equations"
HEADER = ("In Alice's Wonderland, a secret set of transformation rules is applied to equations. "
          "Below are a few examples:")

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
    """`numeric` or `symbolic`, `_deduce` or `_guess` (see `equations`)."""
    examples, q = equation_parts(prompt)
    lhs = [a for a, _ in examples] + ([q] if q else [])
    numeric = bool(lhs) and all(NUMERIC_LHS_RE.match(s) for s in lhs)
    ops = {operator_of(a) for a, _ in examples}
    mode = "deduce" if q and operator_of(q) in ops else "guess"
    return f"{'numeric' if numeric else 'symbolic'}_{mode}"


ARITH = {
    "a+b": lambda a, b: a + b, "a+b+1": lambda a, b: a + b + 1, "a+b-1": lambda a, b: a + b - 1,
    "a*b": lambda a, b: a * b, "a*b+1": lambda a, b: a * b + 1, "a*b-1": lambda a, b: a * b - 1,
    "mod": lambda a, b: max(a, b) % min(a, b) if min(a, b) else None,
}
SUB = {  # meaning -> (when the marker is written, where)
    "|a-b|": ("never", "front"), "a-b": ("a<b", "front"), "b-a": ("a>b", "front"), "±|a-b|": ("always", "front"),
    "a-b end": ("a<b", "end"), "b-a end": ("a>b", "end"), "±|a-b| end": ("always", "end"),
}
FAMILIES = {"add": ["a+b", "a+b+1", "a+b-1"], "mul": ["a*b", "a*b+1", "a*b-1"], "concat": ["ab", "ba"],
            "mod": ["mod"], "sub": list(SUB)}
FAMILY = {m: f for f, ms in FAMILIES.items() for m in ms}
MEANINGS = list(FAMILY)
MODES = ("plain", "reversed")


def family(meaning: str) -> str:
    return FAMILY.get(meaning, "")


def meanings_for(mode: str, sym: str) -> list[str]:
    """The meanings an operator symbol can have in a mode (a marker at the end: reversed mode, not `-`)."""
    return [m for m in MEANINGS if not m.endswith(" end") or (mode == "reversed" and sym != "-")]


def compute(meaning: str, x: str, y: str, mode: str, sym: str) -> str | None:
    """The written result of `meaning` on operand digit strings x, y; None where undefined."""
    if mode == "reversed":
        x, y = x[::-1], y[::-1]
    if meaning == "ab":
        s = x + y
    elif meaning == "ba":
        s = y + x
    elif meaning in SUB:
        when, where = SUB[meaning]
        a, b = int(x), int(y)
        s = str(abs(a - b))
        if mode == "reversed":
            s = s[::-1]
        if a != b and (when == "always" or (when == "a<b" and a < b) or (when == "a>b" and a > b)):
            s = sym + s if where == "front" else s + sym
        return s
    else:
        v = ARITH[meaning](int(x), int(y))
        if v is None or v < 0:
            return None
        s = str(v)
    return s[::-1] if mode == "reversed" else s


def explain(meaning: str, a: str, b: str) -> str:
    """The computation line for read operands a, b (`|96-25| = 71`)."""
    if meaning in ("ab", "ba"):
        return f"{a} joined to {b} = {a + b}" if meaning == "ab" else f"{b} joined to {a} = {b + a}"
    if meaning in SUB:
        return f"|{a}-{b}| = {abs(int(a) - int(b))}"
    if meaning == "mod":
        hi, lo = max(int(a), int(b)), min(int(a), int(b))
        return f"{hi} mod {lo} = {ARITH['mod'](int(a), int(b))}"
    expr = meaning.replace("a", "A").replace("b", "B").replace("A", a).replace("B", b)
    return f"{expr} = {ARITH[meaning](int(a), int(b))}"


def operand_lines(x: str, sym: str, y: str, meaning: str, mode: str) -> list[str]:
    a, b = (x[::-1], y[::-1]) if mode == "reversed" else (x, y)
    return [f"{x}{sym}{y}: a = {a}, b = {b}", explain(meaning, a, b)]
