"""How the bits derivation finds its layout on the page, measured on a solved CSV (the output of
`python -m lab.puzzles solve --trace-style derivation --tokenizer ...`).

The derivation (`lab.puzzles.bits._anchored`) scans the two boundary bits (at bit 7 every shl reads 0, at bit 0
every shr; pairs of bits only once the tries reach a class of layouts that reads two there, and only the pairs
that class can read given the other anchor: `bitlayout.written_scans`), then tries, in order, each layout whose
bits there hold a set that passed, until one fits every example (each example's copy written once, cited by later
tries);
a trace that would pass `bits.TOKEN_CAP` states its layout instead (`note choose`). For every bits puzzle that some
layout fits, this script prints how many anchor scans the trace writes, how many layouts pass both anchors (of
`bitlayout.LAYOUTS`), how many are tried before the fit, and, from the CSV, the share of solved bits traces that
derive their layout, state it, or recall a rule, with their real-tokenizer lengths (`trace_tokens`).

Usage: `python bench/bits_anchors.py SOLVED.csv`. Deliberately simple: counts only (figures in RESULTS.md).
"""

from __future__ import annotations

import sys

import pandas as pd

from lab.puzzles.bitlayout import LAYOUTS, anchor_candidates, anchor_scans, phase, shift_tables, written_scans
from lab.puzzles.bitrules import parse
from lab.puzzles.bits import ANCHORS


def measure(prompt: str) -> dict | None:
    """Scans written, layouts passing both anchors, and the tries up to the first fit; None when no layout fits."""
    ex, q = parse(prompt)
    xs, ys = [a for a, _ in ex], [b for _, b in ex]
    fits = {tuple(f[0]) for f in shift_tables(xs, ys, q)}
    if not fits:
        return None
    scans = {p: anchor_scans(xs, ys, p) for p in ANCHORS}
    cands = anchor_candidates(scans)
    tries, fit = next((i, c) for i, c in enumerate(cands, 1) if c in fits)
    return {"scans": len(written_scans(scans, phase(fit))), "passing": len(cands), "tries": tries}


def main(path: str) -> None:
    df = pd.read_csv(path, dtype={"trace": str})
    bits = df[df.category == "bit_manipulation"]
    if bits.empty:
        sys.exit(f"{path}: no bit_manipulation rows")
    r = pd.DataFrame([m for m in map(measure, bits.prompt) if m])
    print(f"{len(r)} of {len(bits)} bits puzzles in {path} fit a layout")
    for col, what in (("scans", "anchor scans written"),
                      ("passing", f"layouts passing both anchors (of {len(LAYOUTS)})"),
                      ("tries", "layouts tried up to the fit")):
        print(f"{what}: median {r[col].median():.0f}, p90 {r[col].quantile(0.9):.0f}, max {r[col].max()}")
    solved = bits[bits.status == "solved"]
    styles = {"derived (try)": solved.trace.str.contains("\ntry "),
              "stated (note choose)": solved.trace.str.contains("note choose"),
              "recall": solved.trace.str.contains("recall")}
    for name, mask in styles.items():
        tok = solved.trace_tokens[mask] if "trace_tokens" in solved else pd.Series(dtype=float)
        print(f"{name}: {mask.mean():.3f} of {len(solved)} solved"
              + (f", tokens median {tok.median():.0f}, max {tok.max():.0f}" if len(tok) else ""))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python bench/bits_anchors.py SOLVED.csv")
    main(sys.argv[1])
