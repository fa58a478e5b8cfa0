"""How far the two boundary bits (the "anchor tables") narrow the bits layout, measured on a solved CSV: the
groundwork for deriving the shifts a, b, c on the page (issue 29) instead of stating them (`note choose`).

In the competition's layout each output bit p (0 = the leftmost) is one function F of x's bits at p of rotl a,
shl b and shr c. At bit 0 shr reads 0, so y0 is a function of x bit a and x bit b alone; at bit 7 shl reads 0, so
y7 is a function of x bit a-1 (mod 8) and x bit 7-c alone. Each anchor can therefore be tested on the examples
alone, with one or two input columns, before any full table is written. For every puzzle whose derivation states a
layout (`note choose`), this script prints:
- whether the smallest set of input columns that explains y7 (and y0) is the chosen layout's own set there
  (constant first, then single columns, then pairs; the first set no example contradicts);
- the number of column-set scans that search needs at the two anchors;
- how many layouts pass both anchors (of 575: rotl a in none/0..7, shl b and shr c in none/1..7), and the rank,
  among them in the derivation's order (fewest copies, then rotl/shl/shr, then smaller shifts), of the first one
  whose full table no example contradicts; and whether that layout's prediction is the solver's answer.

Usage: `python bench/bits_anchors.py SOLVED.csv` (the output of `python -m lab.puzzles solve`).
Deliberately simple: counts only; it writes no trace and the scan costs no tokens here (RESULTS.md has figures).
"""

from __future__ import annotations

import re
import sys
from itertools import combinations, product

import pandas as pd

from lab.puzzles.bitrules import SHIFT_KINDS, b8, parse, shift_tables


def columns(values: list[int]) -> list[str]:
    """Column i: bit i of every value, in example order."""
    return ["".join(b8(v)[i] for v in values) for i in range(8)]


def explains(cols: list[str], y: str) -> bool:
    """True when y is a function of these columns on the examples (no two examples share a key with two bits)."""
    table: dict[str, str] = {}
    return all(table.setdefault("".join(c[e] for c in cols), bit) == bit for e, bit in enumerate(y))


def anchor_columns(layout, p: int) -> set[int]:
    """The input columns the layout reads at output bit p (a shifted-out bit reads 0: no column)."""
    out = set()
    for kind, k in layout:
        i = (p + k) % 8 if kind == "rotl" else p + k if kind == "shl" else p - k
        if kind == "rotl" or 0 <= i <= 7:
            out.add(i)
    return out


def smallest_set(x_cols, y) -> tuple[tuple[int, ...], int]:
    """The first column set (none, singles, pairs) that explains y, and how many sets were scanned."""
    sets = [()] + [(i,) for i in range(8)] + list(combinations(range(8), 2))
    for n, s in enumerate(sets, 1):
        if explains([x_cols[i] for i in s], y):
            return s, n
    return (), len(sets)


LAYOUTS = sorted({tuple(c for c in cs if c) for cs in product([None] + [("rotl", a) for a in range(8)],
                                                              [None] + [("shl", b) for b in range(1, 8)],
                                                              [None] + [("shr", c) for c in range(1, 8)])} - {()},
                 key=lambda cs: (len(cs), [SHIFT_KINDS.index(k) for k, _ in cs], [k for _, k in cs]))


def measure(prompt: str, answer: str, chosen: str) -> dict:
    ex, q = parse(prompt)
    xs, ys = [a for a, _ in ex], [b for _, b in ex]
    x_cols, y_cols = columns(xs), columns(ys)
    row = {"scans": 0}
    for p, name in ((7, "last"), (0, "first")):
        s, n = smallest_set(x_cols, y_cols[p])
        truth = next(lay for lay in LAYOUTS if " ".join("x" if k == "rotl" and v == 0 else f"{k}{v}" for k, v in lay)
                     == chosen)
        row[f"{name}_exact"] = set(s) == anchor_columns(truth, p)
        row["scans"] += n
    passing = [lay for lay in LAYOUTS
               if all(explains([x_cols[i] for i in sorted(anchor_columns(lay, p))], y_cols[p]) for p in (0, 7))]
    fits = {tuple(f[0]): f[2] for f in shift_tables(xs, ys, q)}
    rank = next((r for r, lay in enumerate(passing) if lay in fits), None)
    row.update(passing=len(passing), rank=rank,
               first_fit_is_answer=rank is not None and fits[passing[rank]] == str(answer).zfill(8))
    return row


def main(path: str) -> None:
    df = pd.read_csv(path, dtype=str)
    rows = []
    for prompt, answer, trace in zip(df.prompt, df.answer, df.trace.fillna("")):
        m = re.search(r"^note choose (.*)$", trace, re.M)
        if m:
            rows.append(measure(prompt, answer, m.group(1)))
    r = pd.DataFrame(rows)
    if r.empty:
        sys.exit(f"{path}: no derivation states a bits layout (`note choose`): solve with trace_style derivation")
    print(f"{len(r)} bits traces that state a layout, in {path}")
    print(f"smallest anchor set is the layout's own: bit 7 {r.last_exact.mean():.3f}, bit 0 {r.first_exact.mean():.3f}")
    print(f"column-set scans for both anchors: median {r.scans.median():.0f}, max {r.scans.max()}")
    print(f"layouts passing both anchors (of {len(LAYOUTS)}): median {r.passing.median():.0f}, "
          f"p90 {r.passing.quantile(0.9):.0f}, max {r.passing.max()}")
    print(f"rank of the first full fit among them: median {r['rank'].median():.0f}, "
          f"p90 {r['rank'].quantile(0.9):.0f}, max {r['rank'].max()}; its prediction is the solver's answer in "
          f"{int(r.first_fit_is_answer.sum())} of {len(r)}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__.split("\n\n")[-2])
    main(sys.argv[1])
