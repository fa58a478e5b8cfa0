"""Gravity puzzles: d = 0.5*g*t^2 with a hidden g; examples (t, d) and a query t.

The examples' distances are rounded to 2 decimals, so each example pins g to an interval
[2(d-0.005)/t^2, 2(d+0.005)/t^2]; g is the middle of the intersection of all intervals (the
median of the point estimates if the intervals do not meet, e.g. when the times were rounded too).
The answer is 0.5*g*t^2 rounded to 2 decimals. Trace (one line per example, then the query):
    g = 2*d/t^2
    2*14.92/1.37^2 = 15.8980
    ...
    g = 15.9000
    4.41^2 = 19.4481
    0.5*15.9000*19.4481 = 154.62
Derivation: per example t^2 and 0.5 t^2, then the intervals of `factor.fit_lines` (d -+ half a unit, divided by
0.5 t^2), their middle (or the median of 2d/t^2), then the query. The compact lines are checked by `check_line`.
Deliberately simple: the formula is taken as given in the prompt; no other physics.
"""

from __future__ import annotations

import random
import re
from fractions import Fraction

from .common import Category, Solution, finish, missing
from .factor import check_line, decimals, fit, fit_lines, fmt

NAME = "gravity"
HEADER = ("In Alice's Wonderland, the gravitational constant has been secretly changed. "
          "Here are some example observations:")
NUM = r"(-?\d+(?:\.\d+)?)"
EX_RE = re.compile(rf"For t = {NUM}\s*s, distance = {NUM}\s*m")
QUERY_RE = re.compile(rf"falling distance for t = {NUM}\s*s")


def parse(prompt: str):
    """(examples [(t_str, d_str)], query t_str or None)."""
    m = QUERY_RE.search(prompt)
    return EX_RE.findall(prompt), (m.group(1) if m else None)


def solve(prompt: str) -> Solution:
    ex, q = parse(prompt)
    ex = [(t, d) for t, d in ex if float(t) > 0]
    if (none := missing(NAME, ex, q, "no query time found", "no (t, distance) examples found")):
        return none
    g, dec = fit([(0.5 * float(t) ** 2, d) for t, d in ex])
    tq = float(q)
    ans = f"{0.5 * g * tq * tq:.{dec}f}"
    lines = ["g = 2*d/t^2"] + [f"2*{d}/{t}^2 = {2 * float(d) / float(t) ** 2:.4f}" for t, d in ex]
    lines += [f"g = {g:.4f}", f"{q}^2 = {tq * tq:.4f}", f"0.5*{g:.4f}*{tq * tq:.4f} = {ans}"]
    return Solution(ans, "solved", finish(lines, ans), NAME)


def make_prompt(examples: list[tuple[str, str]], query: str) -> str:
    lines = [HEADER] + [f"For t = {t}s, distance = {d} m" for t, d in examples]
    lines.append(f"Now, determine the falling distance for t = {query}s given d = 0.5*g*t^2.")
    return "\n".join(lines)


def generate_one(rng: random.Random, n_examples: int = 5, g_min: float = 4.0, g_max: float = 20.0,
                 t_max: float = 5.0):
    """(prompt, answer, subtype); g uniform in [g_min, g_max], times in [1, t_max] with 2 decimals."""
    g = rng.uniform(g_min, g_max)
    ts = [f"{rng.uniform(1.0, t_max):.2f}" for _ in range(int(n_examples) + 1)]
    q = ts.pop()
    ex = [(t, f"{0.5 * g * float(t) ** 2:.2f}") for t in ts]
    return make_prompt(ex, q), f"{0.5 * g * float(q) ** 2:.2f}", ""


def derive(prompt: str, sol: Solution) -> list[str]:
    ex, q = parse(prompt)
    ex = [(t, d) for t, d in ex if float(t) > 0]
    lines, pairs = ["note g = 2d/t^2: each example bounds g, the output being rounded"], []
    for n, (t, d) in enumerate(ex, 1):
        sq = fmt(Fraction(t) ** 2, 2 * decimals(t))
        half = fmt(Fraction(t) ** 2 / 2, 2 * decimals(t) + 1)
        lines.append(f"ex{n}: sq {t} = {sq}")
        lines.append(f"ex{n}: mul 0.5 {sq} = {half}")
        pairs.append((f"ex{n}", half, d))
    g = fit_lines(pairs, lines, "2d/t^2")
    sq = fmt(Fraction(q) ** 2, 2 * decimals(q))
    lines.append(f"q: sq {q} = {sq}")
    half = fmt(Fraction(q) ** 2 / 2, 2 * decimals(q) + 1)
    lines.append(f"q: mul 0.5 {sq} = {half}")
    lines.append(f"q: mul {g} {half} = {sol.answer}")
    return lines


CATEGORY = Category(NAME, "gravitational constant", "grav", "number", parse, solve, generate_one, derive,
                    check_line)
