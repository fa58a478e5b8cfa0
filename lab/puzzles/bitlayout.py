"""The competition's bit layout: each output bit p (0 = the leftmost) is one function F of the bits at p of up to three
copies of x, rotl a, shl b and shr c (`SHIFT_KINDS`). The layouts in the derivation's order (`LAYOUTS`), the layouts
the examples allow with their tables (`shift_tables`), the anchor scans of the boundary bits the derivation writes
(`ANCHORS`: the output bits where a layout reads at most two bits of x; `anchor_scan`, `first_scans`; `scans_before`:
which scans a trace writes before each try; `candidates`: the layouts it tries), and the generator's random
layout (`random_layout`, `layout_apply`). The trace is written by `bits`; the named-rule solver is `bitrules`.
Simplifies: 8-bit values as ints, bits as strings MSB first (`b8`).
"""

from __future__ import annotations

import functools
import random
from itertools import product


def b8(v: int) -> str:
    return format(int(v) & 255, "08b")


SHIFT_KINDS = ("rotl", "shl", "shr")  # out bit p = F(rotl(x, a)[p], shl(x, b)[p], shr(x, c)[p])


def shift_copy(kind: str, k: int, v: int) -> int:
    """rotl k (k = 0 is x itself), shl k or shr k of an 8-bit int."""
    if kind == "rotl":
        return ((v << k) | (v >> (8 - k))) & 255 if k else v
    return (v << k) & 255 if kind == "shl" else v >> k


def shift_name(kind: str, k: int) -> str:
    return "x" if kind == "rotl" and k == 0 else f"{kind}{k}"


# The classes of layouts in the derivation's order: fewest copies first (a layout that fits fits with any copy
# added); among two copies, shl+shr first (it reads one bit of x at bit 7 and at bit 0, the others two at one).
CLASSES = (("rotl",), ("shl",), ("shr",), ("shl", "shr"), ("rotl", "shl"), ("rotl", "shr"), ("rotl", "shl", "shr"))


# Every layout: a subset of (rotl a, shl b, shr c), a in 0..7 (0: x itself), b and c in 1..7, in the derivation's
# order: by class (`CLASSES`), then smaller shifts.
LAYOUTS = sorted({tuple(c for c in cs if c) for cs in product([None] + [("rotl", a) for a in range(8)],
                                                              [None] + [("shl", b) for b in range(1, 8)],
                                                              [None] + [("shr", c) for c in range(1, 8)])} - {()},
                 key=lambda cps: (CLASSES.index(tuple(k for k, _ in cps)), [k for _, k in cps]))


def anchor_columns(cps, p: int) -> set[int]:
    """The bits of x (0 = the leftmost) that a layout reads at output bit p: a shifted-out bit reads 0, no bit of x
    (at p = 7 every shl does, at p = 0 every shr)."""
    out = set()
    for kind, k in cps:
        i = (p + k) % 8 if kind == "rotl" else p + k if kind == "shl" else p - k
        if 0 <= i <= 7:
            out.add(i)
    return out


def shift_tables(x: list[int], y: list[int], q: int):
    """Every layout `out bit p = F(copies at p)` (`LAYOUTS`, in their order) whose table F (key: the copies' bits
    at p, MSB first in kind order) no example contradicts. -> [(copies [(kind, k)], table {key: bit}, prediction,
    keys the query needs that no example shows)]; an unshown key reads 0 (the stated default)."""

    def keys(v, cps):
        bits = [b8(shift_copy(kd, k, v)) for kd, k in cps]
        return ["".join(s[p] for s in bits) for p in range(8)]

    out = []
    for cps in LAYOUTS:
        table, ok = {}, True
        for xv, yv in zip(x, y):
            for k, bit in zip(keys(xv, cps), b8(yv)):
                if table.setdefault(k, bit) != bit:
                    ok = False
                    break
            if not ok:
                break
        if not ok:
            continue
        qk = keys(q, cps)
        unseen = sorted({k for k in qk if k not in table})
        out.append((list(cps), table, "".join(table.get(k, "0") for k in qk), unseen))
    return out


# The output bits where a layout reads at most two bits of x (`anchor_columns`), in the order they are checked: at
# bit 7 every shl reads 0 and at bit 0 every shr; at bit 6 a shl past 1 and at bit 1 a shr past 1 read 0 too.
ANCHORS = (7, 0, 6, 1)
FIRST = (7, 0)  # the anchors scanned on no bit and on each bit before any try (`first_scans`)


def anchor_scan(xs: list[int], ys: list[int], p: int, cols) -> tuple[str, bool]:
    """Whether output bit p is a function of x's bits `cols` on the examples, scanned example by example: each
    example's `key>bit` (key: x's bits at `cols`; just the bit when `cols` is empty), ending with `no` at the first
    key shown with the other bit or `yes` after the last example. -> (that text, passed)."""
    seen, out = {}, []
    for xv, yv in zip(xs, ys):
        key, bit = "".join(b8(xv)[i] for i in cols), b8(yv)[p]
        out.append(f"{key}>{bit}" if cols else bit)
        if seen.setdefault(key, bit) != bit:
            return " ".join(out + ["no"]), False
    return " ".join(out + ["yes"]), True


def first_scans(xs: list[int], ys: list[int], p: int) -> list[tuple[tuple, str, bool]]:
    """The scans of output bit p on no bit, then on each bit, skipping a bit when no bit passed (it passes too).
    -> [(cols, text, passed)]."""
    done = [((), *anchor_scan(xs, ys, p, ()))]
    if not done[0][2]:
        done += [((i,), *anchor_scan(xs, ys, p, (i,))) for i in range(8)]
    return done


def scans_before(cps, written: dict, xs: list[int], ys: list[int]) -> tuple[list[tuple[int, tuple, str]], bool]:
    """The scans a derivation writes before trying layout `cps`, given those written so far (`written`: {(anchor,
    cols): passed}, updated): at each anchor where the layout reads at most two bits of x, a set of them that passed
    lets it on; a written scan of exactly them that failed rules it out, with nothing scanned; else its bits there
    are scanned, in `ANCHORS` order, until one fails. -> ([(anchor, cols, text)], whether the layout is tried)."""
    todo = []
    for p in ANCHORS:
        cols = tuple(sorted(anchor_columns(cps, p)))
        if len(cols) > 2 or any(ok and set(c) <= set(cols) for (q, c), ok in written.items() if q == p):
            continue
        if (p, cols) in written:
            return [], False
        todo.append((p, cols))
    out = []
    for p, cols in todo:
        text, ok = anchor_scan(xs, ys, p, cols)
        written[(p, cols)] = ok
        out.append((p, cols, text))
        if not ok:
            return out, False
    return out, True


def candidates(xs: list[int], ys: list[int]) -> list:
    """`LAYOUTS` (in order) whose bits at every anchor where they read at most two bits of x pass their scan: the
    layouts a derivation tries, whatever scans it wrote to find them (a set holding one that passed passes too)."""
    passes = functools.cache(lambda p, cols: anchor_scan(xs, ys, p, cols)[1])
    return [cps for cps in LAYOUTS if all(passes(p, tuple(sorted(anchor_columns(cps, p)))) for p in ANCHORS
                                          if len(anchor_columns(cps, p)) <= 2)]


def layout_apply(cps, table: int, v: int) -> int:
    """out bit p = bit `key` of `table`, key the copies' bits at p (first copy the key's top bit)."""
    bits = [b8(shift_copy(kd, k, v)) for kd, k in cps]
    return int("".join(str(table >> int("".join(s[p] for s in bits), 2) & 1) for p in range(8)), 2)


def random_layout(rng: random.Random):
    """A rule of the competition's layout: 1 to 3 of (rotl a, shl b, shr c), a in 0..7 (0: x), b and c in 1..7,
    and a table F that depends on every copy and gives neither a constant nor a single copy on all 256 inputs."""
    while True:
        kinds = sorted(rng.sample(SHIFT_KINDS, rng.choice((1, 2, 2, 3, 3))), key=SHIFT_KINDS.index)
        cps = [(kd, rng.randrange(8) if kd == "rotl" else rng.randrange(1, 8)) for kd in kinds]
        m = len(cps)
        table = rng.randrange(1, 2 ** 2 ** m - 1)
        keys = range(2 ** m)
        if not all(any(table >> k & 1 != table >> (k ^ 1 << j) & 1 for k in keys) for j in range(m)):
            continue  # F ignores a copy
        outs = {layout_apply(cps, table, v) for v in range(256)}
        if len(outs) > 4:
            return cps, table
