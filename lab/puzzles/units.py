"""Unit conversion puzzles: a hidden factor maps measurements (x unit -> y), y rounded as shown.

Each example pins the factor to [(y-h)/x, (y+h)/x] with h half a unit in the last decimal of y;
the factor is the middle of the intersection (median of the ratios if they do not meet), and the
answer is x*factor rounded like the examples. Trace:
    factor = out/in
    6.69/10.08 = 0.6637
    ...
    factor = 0.6636
    25.09*0.6636 = 16.65
Derivation: the intervals of `factor.fit_lines` (y -+ half a unit, divided by x), their middle (or the median of
the ratios), then the query. The compact lines are checked by `check_line`.
Deliberately simple: a pure factor (no offset, as for temperatures); the unit name is ignored.
"""

from __future__ import annotations

import random
import re

from .common import Category, Solution, finish, missing
from .factor import check_line, fit, fit_lines

NAME = "unit_conversion"
HEADER = "In Alice's Wonderland, a secret unit conversion is applied to measurements. For example:"
NUM = r"(-?\d+(?:\.\d+)?)"
EX_RE = re.compile(rf"^\s*{NUM}\s*([^\d\n]*?)\s+becomes\s+{NUM}[^\d\n]*$", re.M)  # units of any words
QUERY_RE = re.compile(rf"convert the following measurement:\s*{NUM}\s*(\S*)")
UNITS = ["m", "cm", "km", "g", "kg", "s", "L", "ft", "in", "lb"]


def parse(prompt: str):
    """(examples [(x_str, y_str)], query x_str or None)."""
    m = QUERY_RE.search(prompt)
    return [(x, y) for x, _, y in EX_RE.findall(prompt)], (m.group(1) if m else None)


def solve(prompt: str) -> Solution:
    ex, q = parse(prompt)
    ex = [(x, y) for x, y in ex if float(x) != 0]
    if (none := missing(NAME, ex, q, "no query measurement found", "no 'x becomes y' examples found")):
        return none
    f, dec = fit([(float(x), y) for x, y in ex])
    ans = f"{float(q) * f:.{dec}f}"
    lines = ["factor = out/in"] + [f"{y}/{x} = {float(y) / float(x):.4f}" for x, y in ex]
    lines += [f"factor = {f:.4f}", f"{q}*{f:.4f} = {ans}"]
    return Solution(ans, "solved", finish(lines, ans), NAME)


def make_prompt(examples: list[tuple[str, str]], query: str, unit: str) -> str:
    lines = [HEADER] + [f"{x} {unit} becomes {y}" for x, y in examples]
    lines.append(f"Now, convert the following measurement: {query} {unit}")
    return "\n".join(lines)


def generate_one(rng: random.Random, n_examples: int = 5, f_min: float = 0.3, f_max: float = 3.0,
                 x_max: float = 50.0):
    """(prompt, answer, subtype); factor uniform in [f_min, f_max], inputs in [1, x_max], 2 decimals."""
    f = rng.uniform(f_min, f_max)
    unit = rng.choice(UNITS)
    xs = [f"{rng.uniform(1.0, x_max):.2f}" for _ in range(int(n_examples) + 1)]
    q = xs.pop()
    return make_prompt([(x, f"{float(x) * f:.2f}") for x in xs], q, unit), f"{float(q) * f:.2f}", ""


def derive(prompt: str, sol: Solution) -> list[str]:
    ex, q = parse(prompt)
    ex = [(x, y) for x, y in ex if float(x) != 0]
    lines = ["note factor = out/in: each example bounds it, the output being rounded"]
    f = fit_lines([(f"ex{n}", x, y) for n, (x, y) in enumerate(ex, 1)], lines, "ratios")
    lines.append(f"q: mul {q} {f} = {sol.answer}")
    return lines


CATEGORY = Category(NAME, "unit conversion", "unit", "number", parse, solve, generate_one, derive, check_line)
