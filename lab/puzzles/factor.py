"""A hidden factor read from rounded outputs: the part gravity (d = g/2 * t^2) and unit conversion (y = f * x) share.

Each example (x, y) pins the factor to [(y-h)/x, (y+h)/x], h half a unit in the last decimal of the outputs;
the factor is the middle of the intersection (the median of the ratios if the intervals do not meet), rounded to
4 decimals. `fit` is the solver's; `fit_lines` writes the same search as derivation lines (the intervals, their
largest low end and smallest high end, then their middle or the median); `check_line` replays both categories'
compact lines (`2*14.92/1.37^2 = 15.8980`, `6.69/10.08 = 0.6637`, `4.41^2 = 19.4481`, `25.09*0.6636 = 16.65`).
Simplifies: one solver search, one trace writer and one compact checker for the two categories.
"""

from __future__ import annotations

import statistics
from fractions import Fraction

from .check import _num, _numeric_ok, line_rules


def decimals(s: str) -> int:
    return len(s.split(".")[1]) if "." in s else 0


def estimate(pairs: list[tuple[float, float]], half_step: float) -> float:
    """The middle of the intersection of the intervals x*f in [y-h, y+h] (f = y/x over examples)."""
    lo = max((y - half_step) / x for x, y in pairs)
    hi = min((y + half_step) / x for x, y in pairs)
    if lo <= hi:
        return (lo + hi) / 2
    return statistics.median(y / x for x, y in pairs)


def fit(pairs: list[tuple[float, str]]) -> tuple[float, int]:
    """(the factor rounded to 4 decimals, the outputs' decimals) for examples [(x, y as written)]."""
    dec = max(decimals(y) for _, y in pairs)
    return round(estimate([(x, float(y)) for x, y in pairs], 0.5 * 10 ** -dec), 4), dec


def fmt(v: Fraction, dec: int) -> str:
    """v rounded half-even to `dec` decimals, written with exactly that many."""
    q = round(v * 10 ** dec)
    s = f"{abs(q):0{dec + 1}d}"
    out = (s[:-dec] + "." + s[-dec:]) if dec else s
    return ("-" if q < 0 else "") + out


def fit_lines(pairs, lines: list[str], ratio_label: str) -> str:
    """pairs: [(tag, divisor string, output string)]; appends the interval lines; returns the factor (4 decimals)."""
    d_ex = max((o for _, _, o in pairs), key=decimals)
    dec_out = decimals(d_ex)
    unit = "0." + "0" * (dec_out - 1) + "1" if dec_out else "1"
    h = Fraction(unit) / 2
    lines.append(f"ulp {d_ex} = {unit}")
    lines.append(f"div {unit} 2 = {fmt(h, dec_out + 1)}")
    hs = fmt(h, dec_out + 1)
    los, his = [], []
    for tag, u, o in pairs:
        lo_n, hi_n = Fraction(o) - h, Fraction(o) + h
        lines.append(f"{tag}: sub {o} {hs} = {fmt(lo_n, dec_out + 1)}")
        lines.append(f"{tag}: add {o} {hs} = {fmt(hi_n, dec_out + 1)}")
        lo, hi = fmt(lo_n / Fraction(u), 8), fmt(hi_n / Fraction(u), 8)
        lines.append(f"{tag}: div {fmt(lo_n, dec_out + 1)} {u} = {lo}")
        lines.append(f"{tag}: div {fmt(hi_n, dec_out + 1)} {u} = {hi}")
        los.append(lo)
        his.append(hi)
    lo = max(los, key=Fraction)
    hi = min(his, key=Fraction)
    lines.append(f"max {' '.join(los)} = {lo}")
    lines.append(f"min {' '.join(his)} = {hi}")
    meet = Fraction(lo) <= Fraction(hi)
    lines.append(f"le {lo} {hi} = {'yes' if meet else 'no'}")
    if meet:
        f = fmt((Fraction(lo) + Fraction(hi)) / 2, 4)
        lines.append(f"mid {lo} {hi} = {f}")
        return f
    lines.append(f"note the intervals do not meet: the median of the {ratio_label}")
    rs = []
    for tag, u, o in pairs:
        r = fmt(Fraction(o) / Fraction(u), 8)
        lines.append(f"{tag}: div {o} {u} = {r}")
        rs.append(r)
    f = fmt(statistics.median([Fraction(r) for r in rs]), 4)
    lines.append(f"median {' '.join(rs)} = {f}")
    return f


def _product(*args: str) -> Fraction:
    out = Fraction(1)
    for a in args:
        out *= _num(a)
    return out


# a compact gravity or unit-conversion line: a ratio, a square or a product is recomputed; the rest are claims
check_line = line_rules(
    (r"2\*(\S+)/(\S+)\^2 = (\S+)", lambda d, t, r: _numeric_ok(2 * _num(d) / _num(t) ** 2, r), "wrong ratio"),
    (r"(\S+)/(\S+) = (\S+)", lambda a, b, r: _numeric_ok(_num(a) / _num(b), r), "wrong ratio"),
    (r"(\S+)\^2 = (\S+)", lambda a, r: _numeric_ok(_num(a) ** 2, r), "wrong square"),
    (r"(\S+)\*(\S+)\*(\S+) = (\S+)", lambda *a: _numeric_ok(_product(*a[:-1]), a[-1]), "wrong product"),
    (r"(\S+)\*(\S+) = (\S+)", lambda *a: _numeric_ok(_product(*a[:-1]), a[-1]), "wrong product"))
