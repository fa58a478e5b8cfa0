"""Numeral system puzzles: decimal numbers written in a hidden numeral system (always Roman so far).

parse   -> examples [(int, str)] and the query number
solve   -> checks that every example is the standard Roman numeral of its number; if so, writes the
           query in Roman numerals, one line per nonzero place value:
               38 = 30 + 8
               30 -> XXX
               8 -> VIII
               XXX + VIII = XXXVIII
           Anything else (a non-Roman system, a number outside 1..3999) is `undetermined` with a reason.
generate_one -> a puzzle with `n_examples` examples and values drawn from 1..`max_value`.

Derivation: every example converted (place values, one numeral each, joined) and compared, then the query.
Deliberately simple: only standard subtractive Roman numerals; no attempt to infer other systems.
"""

from __future__ import annotations

import random
import re

from .check import ROMAN, _places, line_rules
from .common import Category, Solution, arrow_pairs, finish, missing, undetermined

NAME = "numeral_system"
HEADER = ("In Alice's Wonderland, numbers are secretly converted into a different numeral system. "
          "Some examples are given below:")
QUERY_RE = re.compile(r"write the number\s+(\d+)\s+in the Wonderland numeral system", re.I)

_PLACES = [  # (place value, roman digits for 1..9 of that place)
    (1000, ["M", "MM", "MMM"]),
    (100, ["C", "CC", "CCC", "CD", "D", "DC", "DCC", "DCCC", "CM"]),
    (10, ["X", "XX", "XXX", "XL", "L", "LX", "LXX", "LXXX", "XC"]),
    (1, ["I", "II", "III", "IV", "V", "VI", "VII", "VIII", "IX"]),
]


def parts(n: int) -> list[int]:
    """The nonzero place values of n, largest first: 1994 -> [1000, 900, 90, 4]."""
    out = []
    for place, _ in _PLACES:
        d = n // place % 10 if place < 1000 else n // 1000
        if d:
            out.append(d * place)
    return out


def part_roman(p: int) -> str:
    for place, digits in _PLACES:
        if p >= place:
            return digits[p // place - 1]
    raise ValueError(p)


def to_roman(n: int) -> str:
    if not 1 <= n <= 3999:
        raise ValueError(f"{n} outside 1..3999")
    return "".join(part_roman(p) for p in parts(n))


def parse(prompt: str):
    """(examples [(int, str)], query int or None)."""
    examples = []
    for left, right in arrow_pairs(prompt):
        if left.isdigit():
            examples.append((int(left), right))
    m = QUERY_RE.search(prompt)
    return examples, (int(m.group(1)) if m else None)


def trace_lines(n: int) -> list[str]:
    ps = parts(n)
    lines = [f"{n} = " + " + ".join(map(str, ps))]
    lines += [f"{p} -> {part_roman(p)}" for p in ps]
    lines.append(" + ".join(part_roman(p) for p in ps) + f" = {to_roman(n)}")
    return lines


def solve(prompt: str) -> Solution:
    examples, query = parse(prompt)
    if (none := missing(NAME, examples, query, "no query number found", "no examples found")):
        return none
    bad = [(n, r) for n, r in examples if not (1 <= n <= 3999 and to_roman(n) == r)]
    if bad:
        return undetermined(NAME, f"examples are not standard Roman numerals, e.g. {bad[0][0]} -> {bad[0][1]}")
    if not 1 <= query <= 3999:
        return undetermined(NAME, f"query {query} outside the Roman range 1..3999")
    ans = to_roman(query)
    return Solution(answer=ans, status="solved", trace=finish(trace_lines(query), ans), category=NAME)


def make_prompt(examples: list[tuple[int, str]], query: int) -> str:
    lines = [HEADER] + [f"{n} -> {r}" for n, r in examples]
    lines.append(f"Now, write the number {query} in the Wonderland numeral system.")
    return "\n".join(lines)


def generate_one(rng: random.Random, max_value: int = 100, n_examples: int = 4):
    """(prompt, answer, subtype) for one puzzle; values drawn from 1..max_value."""
    max_value = max(1, min(int(max_value), 3999))
    k = min(int(n_examples), max_value)
    values = rng.sample(range(1, max_value + 1), k) if k else []
    query = rng.randint(1, max_value)
    return make_prompt([(v, to_roman(v)) for v in values], query), to_roman(query), ""


def derive(prompt: str, sol: Solution) -> list[str]:
    ex, q = parse(prompt)
    lines = ["note write each example in Roman numerals and compare, then the query"]

    def conv(n, tag):
        ps = parts(n)
        lines.append(f"{tag}: places {n} = {' '.join(map(str, ps))}")
        for p in ps:
            lines.append(f"{tag}: roman {p} = {part_roman(p)}")
        rs = [part_roman(p) for p in ps]
        lines.append(f"{tag}: cat {' '.join(rs)} = {''.join(rs)}")
        return "".join(rs)

    for n, (v, r) in enumerate(ex, 1):
        got = conv(v, f"ex{n}")
        lines.append(f"ex{n}: eq {got} {r} = {'yes' if got == r else 'no'}")
    conv(q, "q")
    return lines


# a compact line: place values, a place's numeral and the join are recomputed (by the checker's own table)
check_line = line_rules(
    (r"(\d+) = ([\d +]+)", lambda n, ps: _places(n) == " ".join(ps.split(" + ")), "wrong place values"),
    (r"(\d+) -> ([IVXLCDM]+)", lambda p, r: ROMAN.get(int(p)) == r, "wrong numeral"),
    (r"([IVXLCDM +]+) = ([IVXLCDM]+)", lambda ps, r: ps.replace(" + ", "") == r, "wrong join"))


CATEGORY = Category(NAME, "numeral system", "num", "numeral", parse, solve, generate_one, derive, check_line)
