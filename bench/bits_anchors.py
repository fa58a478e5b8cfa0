"""How the bits derivation finds its layout on the page, measured on a solved CSV (the output of
`python -m lab puzzles solve --trace-style derivation --tokenizer ...`).

The derivation (`lab.puzzles.bits._anchored`) scans bits 7 and 0 on no bit and on each bit, then goes through the
layouts in order, scanning a layout's bits at the anchors 7, 0, 6, 1 just before it where no passed set explains
them (`bitlayout.scans_before`), and tries each that passes until one fits every example; a trace that would pass
`bits.TOKEN_CAP` states its layout instead (`note choose`). For every bits puzzle that some layout fits, this script
prints how many anchor scans the trace writes up to the fit, how many layouts pass every anchor (of
`bitlayout.LAYOUTS`), how many are tried up to the fit, how many it passes over without writing a line (a scan
written earlier rules them out: the walk the checker enforces and the audit cannot see), and, from the CSV, the share of solved bits traces that
derive their layout, state it, or recall a rule, with their real-tokenizer lengths (`trace_tokens`).

Usage: `python bench/bits_anchors.py SOLVED.csv`. Deliberately simple: counts only (figures in RESULTS.md).
"""

from __future__ import annotations

import sys

import pandas as pd

from lab.puzzles.bitlayout import FIRST, LAYOUTS, candidates, first_scans, scans_before, shift_tables
from lab.puzzles.bitrules import parse


def measure(prompt: str) -> dict | None:
    """Scans written, layouts passing every anchor, the tries up to the first fit, and the layouts passed over with
    no line written (ruled out by a scan written earlier); None when no layout fits."""
    ex, q = parse(prompt)
    xs, ys = [a for a, _ in ex], [b for _, b in ex]
    fits = {tuple(f[0]) for f in shift_tables(xs, ys, q)}
    if not fits:
        return None
    written = {(p, c): ok for p in FIRST for c, _, ok in first_scans(xs, ys, p)}
    scans, tries, silent = len(written), 0, 0
    for cps in LAYOUTS:
        new, tried = scans_before(cps, written, xs, ys)
        scans, tries, silent = scans + len(new), tries + tried, silent + (not new and not tried)
        if tried and cps in fits:
            break
    return {"scans": scans, "passing": len(candidates(xs, ys)), "tries": tries, "silent": silent}


def main(path: str) -> None:
    df = pd.read_csv(path, dtype={"trace": str})
    bits = df[df.category == "bit_manipulation"]
    if bits.empty:
        sys.exit(f"{path}: no bit_manipulation rows")
    r = pd.DataFrame([m for m in map(measure, bits.prompt) if m])
    print(f"{len(r)} of {len(bits)} bits puzzles in {path} fit a layout")
    for col, what in (("scans", "anchor scans written"),
                      ("passing", f"layouts passing every anchor (of {len(LAYOUTS)})"),
                      ("tries", "layouts tried up to the fit"),
                      ("silent", "layouts passed over with no line, up to the fit")):
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
