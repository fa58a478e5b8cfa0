"""The competition's bit layout: each output bit p (0 = the leftmost) is one function F of the bits at p of up to three
copies of x, rotl a, shl b and shr c (`SHIFT_KINDS`). The layouts in the derivation's order (`LAYOUTS`), the layouts
the examples allow with their tables (`shift_tables`), the anchor scans of the boundary bits the derivation writes
(`anchor_scan(s)`, `anchor_candidates`: at bit 7 every shl reads 0, at bit 0 every shr; `pairs_to_scan` and
`written_scans`: which of them a trace writes, and when), and the generator's random
layout (`random_layout`, `layout_apply`). The trace is written by `bits`; the named-rule solver is `bitrules`.
Simplifies: 8-bit values as ints, bits as strings MSB first (`b8`).
"""

from __future__ import annotations

import random
from itertools import combinations, product


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


# The classes of layouts in the derivation's order, with the output bits whose pairs of x bits must be scanned
# before a class is tried: one copy and shl+shr read at most one bit of x at bit 7 and at bit 0, rotl+shl two at
# bit 0, rotl+shr two at bit 7, all three two at both. Fewest copies first (a layout that fits fits with any copy
# added); among two copies, shl+shr first, since it needs no pair scanned.
PHASES = (((("rotl",), ("shl",), ("shr",), ("shl", "shr")), ()), ((("rotl", "shl"),), (0,)),
          ((("rotl", "shr"),), (7,)), ((("rotl", "shl", "shr"),), (0, 7)))
_CLASS = [kinds for classes, _ in PHASES for kinds in classes]


def phase(cps) -> int:
    """The index in `PHASES` of a layout's class."""
    kinds = tuple(k for k, _ in cps)
    return next(i for i, (classes, _) in enumerate(PHASES) if kinds in classes)


# Every layout: a subset of (rotl a, shl b, shr c), a in 0..7 (0: x itself), b and c in 1..7, in the derivation's
# order: by class (`PHASES`), then smaller shifts.
LAYOUTS = sorted({tuple(c for c in cs if c) for cs in product([None] + [("rotl", a) for a in range(8)],
                                                              [None] + [("shl", b) for b in range(1, 8)],
                                                              [None] + [("shr", c) for c in range(1, 8)])} - {()},
                 key=lambda cps: (_CLASS.index(tuple(k for k, _ in cps)), [k for _, k in cps]))


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


ANCHOR_SETS = [()] + [(i,) for i in range(8)] + list(combinations(range(8), 2))  # the order the anchors are scanned


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


def anchor_scans(xs: list[int], ys: list[int], p: int) -> list[tuple[tuple, str, bool]]:
    """The scans of output bit p (`ANCHOR_SETS` in order), skipping a set that holds one already passed (it passes
    too). -> [(cols, text, passed)]."""
    done = []
    for cols in ANCHOR_SETS:
        if not any(ok and set(c) <= set(cols) for c, _, ok in done):
            done.append((cols, *anchor_scan(xs, ys, p, cols)))
    return done


def pairs_to_scan(scans: dict, i: int, p: int) -> set[tuple]:
    """The pairs of x bits that class `i` of `PHASES` needs scanned at anchor p (`scans`: p -> `anchor_scans`): the
    pairs its layouts read at p, among the layouts whose bits at the other anchor hold a set that passed. Rotl with
    shl (or shr) reads one bit at the other anchor, whose scans are all written by then; all three copies read two
    bits at both, so the first anchor of the class scans every pair and the second is restricted by the first."""
    pair_bits = PHASES[i][1]
    if len(pair_bits) == 2 and p == pair_bits[0]:
        return {c for c, _, _ in scans[p] if len(c) == 2}
    other = 7 - p
    passed = [set(c) for c, _, ok in scans[other] if ok]
    return {tuple(sorted(anchor_columns(cps, p))) for cps in LAYOUTS if phase(cps) == i
            and len(anchor_columns(cps, p)) == 2 and any(c <= anchor_columns(cps, other) for c in passed)}


def written_scans(scans: dict, upto: int) -> list[tuple[int, tuple, str, bool, int]]:
    """The scans a derivation writes once its tries reach class `upto` of `PHASES`: every no-bit and one-bit scan
    of both anchors first, then, as each class that reads two bits at an anchor is reached, the pairs it needs there
    (`pairs_to_scan`) not yet written. -> [(anchor, cols, text, passed, class that writes it)]."""
    out = [(p, c, t, ok, 0) for p in (7, 0) for c, t, ok in scans[p] if len(c) < 2]
    done = set()
    for i in range(upto + 1):
        for p in PHASES[i][1]:
            need = pairs_to_scan(scans, i, p)
            for c, t, ok in scans[p]:
                if len(c) == 2 and c in need and (p, c) not in done:
                    done.add((p, c))
                    out.append((p, c, t, ok, i))
    return out


def anchor_candidates(scans: dict) -> list:
    """`LAYOUTS` (in order) whose columns at each anchor bit p (`scans`: p -> `anchor_scans`) hold a passed set."""
    passed = {p: [set(c) for c, _, ok in done if ok] for p, done in scans.items()}
    return [cps for cps in LAYOUTS if all(any(c <= anchor_columns(cps, p) for c in passed[p]) for p in passed)]


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
