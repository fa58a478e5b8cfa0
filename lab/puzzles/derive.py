"""Derivation traces (`data.trace_style: derivation`): the solver's search written out, one local step a line.

`derivation(prompt, sol)` rewrites a Solution's trace; the answer, status and method stay the solver's, so
the two styles differ in the trace only. Every line follows `lab.puzzles.check`'s grammar (an operation
on values written in the prompt or in earlier lines, a copy, a comparison, a declared recall), so
`python -m lab.puzzles check` replays it. Per category:
  bits        the competition's layout (`_bits_layout`): each output bit is one function F of the bits at
              its position of up to three copies, rotl a, shl b, shr c. A `note choose` line states the
              copies (the fewest, then the smallest shifts, among the layouts no example contradicts that
              give the answer: stated, not searched on the page); per example the copies, their keys and
              the `key:bit` pairs; `table` collects F (one bit per key, checked); the query's keys are
              read from it, a key no example shows reading 0 (`default`). F is never named. A puzzle no
              layout answers keeps the older trace: the 22 copies of `bits.T_NAMES` screened on the
              examples until one example rejects each; the first survivor is the rule, and when none
              survives the trace names the solver's rule (a note: recall) and verifies it on every example
              before applying it (tables of three or four copies: keys, pairs, read). Written in binary:
              hex would hide the bit positions the shifts and keys work on.
  equations   numeric: the query operator's candidate meanings, modes `plain` then `reversed`, meanings
              in `equations.MEANINGS` order, each computed on that operator's examples in turn until one
              rejects it; the first that no example rejects is kept when it gives the solver's answer (for a
              `solved` puzzle every fitting reading does, unless the other operators rule it out); otherwise
              a note says the solver's priors set it aside, and the search goes on to the solver's reading. The output format (reversal,
              the subtraction marker in front or at the end) is its own step. Symbolic: the digit map is
              too large a search to write out (10! maps), so the trace recalls the solver's map (`let`
              lines) and each operator's meaning, then verifies every example under them and applies them.
  gravity, units  per example the interval the rounded output allows (`d -+ half a unit`, divided by
              0.5 t^2 or by x), the largest low end and the smallest high end, their middle (or, when
              they do not meet, the median of the ratios), then the query.
  numerals    every example converted (place values, one numeral each, joined) and compared, then the query.
  cipher      each query letter read from an example word pair that contains it; a word the examples
              do not spell out is matched against a known word (copied when the examples show it,
              recalled otherwise) and checked to fit the letters known so far.
Unsolved puzzles keep their compact trace when the derivation cannot be written (nothing trains on them).

Simplifies: one function per category, each a plain loop over the examples; every value is printed
with the rounding the checker accepts, so the checker needs no knowledge of the solvers.
"""

from __future__ import annotations

import functools
from fractions import Fraction

from .categories import BY_NAME
from .common import Solution, finish

# ---------------------------------------------------------------- bits


def _bits_value(rule, xv: int, tag: str, lines: list[str]) -> str:
    """Appends the lines computing `rule` on input xv; returns the written result."""
    from .bits import NT, T_NAMES, apply_step, apply_t, b8, op2, op3

    def copy(name, v=xv):
        if name == "x":
            return b8(v)
        out = b8(apply_t(name, v))
        lines.append(f"{tag}: {name} {b8(v)} = {out}")
        return out

    def vcopy(i):
        base = copy(T_NAMES[i % NT])
        if i < NT:
            return base
        out = b8(~int(base, 2))
        lines.append(f"{tag}: NOT {base} = {out}")
        return out

    def binop(op, a, b):
        out = b8(op2(op, int(a, 2), int(b, 2)))
        lines.append(f"{tag}: {op} {a} {b} = {out}")
        return out

    def neg(a):
        out = b8(~int(a, 2))
        lines.append(f"{tag}: NOT {a} = {out}")
        return out

    kind = rule[0]
    if kind == "const":
        return b8(rule[1])
    if kind == "one":
        return vcopy(rule[1])
    if kind == "two":
        return binop(rule[1], vcopy(rule[2]), vcopy(rule[3]))
    if kind == "three":
        _, op, i, j, k, ng = rule
        a, b, c = (copy(T_NAMES[m]) for m in (i, j, k))
        if op in ("MAJ", "CH"):
            r = b8(op3(op, int(a, 2), int(b, 2), int(c, 2)))
            lines.append(f"{tag}: {op} {a} {b} {c} = {r}")
        elif op == "XOR3":
            r = binop("XOR", binop("XOR", a, b), c)
        else:
            o1, o2 = op.split("/")
            r = binop(o2, binop(o1, a, b), c)
        return neg(r) if ng else r
    if kind == "pipe":
        s = xv
        for st in rule[1]:
            if st[0] == "NOT":
                neg(b8(s))
            elif st[0] == "copy":
                copy(st[1], s)
            else:
                binop(st[0], b8(s), copy(st[1], s))
            s = apply_step(st, s)
        return b8(s)
    if kind == "mask":
        return binop(rule[1], _bits_value(rule[3], xv, tag, lines), b8(rule[2]))
    if kind == "xor":
        ng, names = rule[1], rule[2]
        vals = [copy(n) for n in names]
        r = vals[0]
        for v in vals[1:]:
            r = binop("XOR", r, v)
        return neg(r) if ng else r
    raise ValueError(f"no derivation for bits rule {kind}")


def _bits(prompt: str, sol: Solution) -> list[str]:
    from .bits import T_NAMES, apply_t, b8, parse, rule_name

    ex, q = parse(prompt)
    d = sol.detail or {}
    rule = d.get("rule")
    if "xor" in d:
        rule = ("xor", *d["xor"])
    layout = _bits_layout(ex, q, sol.answer)
    if layout is not None:
        return layout
    if rule is None and sol.method in ("affine per bit", "per bit"):
        return _bits_per_bit(sol, ex, q)
    if rule is None:
        raise ValueError("the solver kept no rule")
    lines = ["note screen each single copy of x, example by example"]
    nots = {}
    found = None
    for name in T_NAMES:
        ok = True
        for n, (xv, yv) in enumerate(ex, 1):
            tag = f"ex{n}"
            v = b8(apply_t(name, xv))
            if name != "x":
                lines.append(f"{tag}: {name} {b8(xv)} = {v}")
            if n not in nots:
                nots[n] = b8(~yv)
                lines.append(f"{tag}: NOT {b8(yv)} = {nots[n]}")
            same, opp = v == b8(yv), v == nots[n]
            lines.append(f"{tag}: eq {v} {b8(yv)} = {'yes' if same else 'no'}")
            if not same:
                lines.append(f"{tag}: eq {v} {nots[n]} = {'yes' if opp else 'no'}")
            if not (same or opp) or (n > 1 and found_kind != ("NOT" if opp else "")):
                ok = False
                break
            found_kind = "NOT" if opp else ""
        if ok:
            found = (name, found_kind)
            break
    if found and rule[0] == "one":
        name, neg = found
        lines.append(f"note every example fits {'NOT ' if neg else ''}{name}")
        v = b8(q)
        if name != "x":
            lines.append(f"q: {name} {b8(q)} = {b8(apply_t(name, q))}")
            v = b8(apply_t(name, q))
        if neg:
            lines.append(f"q: NOT {v} = {b8(~int(v, 2))}")
        return lines
    if rule[0] == "table":
        return lines + _bits_table(rule, ex, q)
    name = rule_name(rule) if rule[0] != "xor" else (("NOT (" if rule[1] else "") + " XOR ".join(rule[2])
                                                        + (")" if rule[1] else ""))
    lines.append(f"note no single copy fits; recall the rule {name} and verify it on every example")
    if rule[0] in ("const", "mask"):
        lines.append(f"recall {b8(rule[1] if rule[0] == 'const' else rule[2])}")
    for n, (xv, yv) in enumerate(ex, 1):
        v = _bits_value(rule, xv, f"ex{n}", lines)
        lines.append(f"ex{n}: eq {v} {b8(yv)} = {'yes' if v == b8(yv) else 'no'}")
    v = _bits_value(rule, q, "q", lines)
    if rule[0] == "const":
        lines.append(f"copy {v}")
    return lines


def _key_lines(lines: list[str], names: list[str], copies: list, v: int, tag: str) -> str:
    """Append each copy of `v` (`copies[i](v)`, named `names[i]`; `x` itself is not written) and the keys line (the
    copies' bits at each position); returns the keys. Shared by the layout and the table-of-copies traces."""
    from .bits import b8

    vals = []
    for nm, copy in zip(names, copies):
        out = b8(copy(v))
        if nm != "x":
            lines.append(f"{tag}: {nm} {b8(v)} = {out}")
        vals.append(out)
    ks = " ".join("".join(s[p] for s in vals) for p in range(8))
    lines.append(f"{tag}: keys {' '.join(vals)} = {ks}")
    return ks


def _bits_layout(ex, q, answer: str) -> list[str] | None:
    """The competition's layout: each output bit is one function F of the bits at its position of up to
    three copies (rotl a, shl b, shr c). The copies are chosen (one `note choose` line: the fewest copies,
    then the smallest shifts, among the layouts no example contradicts that give the answer), then per example
    the copies, their keys (the copies' bits per position) and the `key:bit` pairs; `table` collects the pairs
    (one bit per key, checked); the query's keys are read from it. A key no example shows reads 0 (`default`).
    None when no layout gives the answer (the caller falls back to the rule search)."""
    from .bits import b8, shift_copy, shift_name, shift_tables

    fits = [f for f in shift_tables([a for a, _ in ex], [b for _, b in ex], q) if f[2] == answer]
    if not fits:
        return None
    cps, _, _, unseen = min(fits, key=lambda f: bool(f[3]))  # sorted already; a fit needing no default first
    names = [shift_name(kd, k) for kd, k in cps]
    lines = ["note each output bit is one function F of the bits at its position of rotl a, shl b and shr c "
             "(some may be absent); read F as a table from the examples; a key no example shows reads 0",
             f"note choose {' '.join(names)}"]

    def keys(v, tag):
        return _key_lines(lines, names, [functools.partial(shift_copy, kd, k) for kd, k in cps], v, tag)

    table = {}
    for n, (xv, yv) in enumerate(ex, 1):
        ks = keys(xv, f"ex{n}")
        prs = [f"{k}:{b}" for k, b in zip(ks.split(), b8(yv))]
        lines.append(f"ex{n}: pairs {ks} {b8(yv)} = " + " ".join(prs))
        table.update(dict(p.split(":") for p in prs))
    lines.append("table = " + " ".join(f"{k}:{table[k]}" for k in sorted(table)))
    ks = keys(q, "q")
    for k in unseen:
        lines.append(f"q: default {k} = {k}:0")
    lines.append(f"q: read {ks} = " + "".join(table.get(k, "0") for k in ks.split()))
    return lines


def _bits_per_bit(sol: Solution, ex, q) -> list[str]:
    """The fallbacks, read from the compact trace's per-bit lines (`b3 = x0 ^ x5 ^ 1 = 1`, `b3 <- x0,x5: 01 -> 1`):
    affine: each output bit's XOR of input bits checked on every example, then the query's; per bit: each output
    bit's input bits per example, and the query's bit taken from an example with the same input bits."""
    import re

    from .bits import b8

    lines = [f"note no rule of copies fits; recall how each output bit depends on the input bits ({sol.method})"]
    bits = []
    for ln in sol.trace.split("\n"):
        m = re.fullmatch(r"b(\d) = ([x\d ^]+) = ([01])", ln)
        if m:
            i, terms = int(m.group(1)), m.group(2).split(" ^ ")
            pos = [t[1:] for t in terms if t.startswith("x")]
            one = "1" in terms

            def xor(v, tag):
                if not pos:
                    return "1" if one else "0"
                s = "".join(v[int(p)] for p in pos)
                lines.append(f"{tag}: pick {v} {' '.join(pos)} = {s}")
                r = str(s.count("1") % 2)
                lines.append(f"{tag}: parity {s} = {r}")
                if one:
                    lines.append(f"{tag}: flip {r} = {1 - int(r)}")
                    r = str(1 - int(r))
                return r

            for n, (xv, yv) in enumerate(ex, 1):
                r = xor(b8(xv), f"ex{n}")
                lines.append(f"ex{n}: pick {b8(yv)} {i} = {b8(yv)[i]}")
                lines.append(f"ex{n}: eq {r} {b8(yv)[i]} = {'yes' if r == b8(yv)[i] else 'no'}")
            bits.append(xor(b8(q), f"q{i}"))
            continue
        m = re.fullmatch(r"b(\d) <- ([x\d,]+|none): (\d*|-) -> ([01])", ln)
        if m:
            i = int(m.group(1))
            pos = [t[1:] for t in m.group(2).split(",")] if m.group(2) != "none" else []
            kq = "".join(b8(q)[int(p)] for p in pos)
            if pos:
                lines.append(f"q{i}: pick {b8(q)} {' '.join(pos)} = {kq}")
            for n, (xv, yv) in enumerate(ex, 1):
                k = "".join(b8(xv)[int(p)] for p in pos)
                if pos:
                    lines.append(f"ex{n}: pick {b8(xv)} {' '.join(pos)} = {k}")
                    lines.append(f"ex{n}: eq {k} {kq} = {'yes' if k == kq else 'no'}")
                if k == kq:
                    lines.append(f"ex{n}: pick {b8(yv)} {i} = {b8(yv)[i]}")
                    bits.append(b8(yv)[i])
                    break
            else:
                raise ValueError(f"output bit {i}: no example shows the query's input bits")
    if len(bits) != 8:
        raise ValueError("not 8 per-bit lines")
    lines.append(f"cat {' '.join(bits)} = {''.join(bits)}")
    return lines


def _bits_table(rule, ex, q) -> list[str]:
    from .bits import T_NAMES, apply_t, b8

    names = [T_NAMES[m] for m in rule[2:]]
    lines = [f"note no single copy fits; recall: each output bit is a function of the bits of {', '.join(names)} "
             "at its position; read the table from the examples"]

    def keys(xv, tag):
        return _key_lines(lines, names, [functools.partial(apply_t, nm) for nm in names], xv, tag)

    for n, (xv, yv) in enumerate(ex, 1):
        ks = keys(xv, f"ex{n}")
        lines.append(f"ex{n}: pairs {ks} {b8(yv)} = " + " ".join(f"{k}:{b}" for k, b in zip(ks.split(), b8(yv))))
    ks = keys(q, "q")
    tt = rule[1]
    lines.append(f"q: read {ks} = " + "".join(str(tt >> int(k, 2) & 1) for k in ks.split()))
    return lines


# ---------------------------------------------------------------- equations

def _eq_value(meaning: str, x: str, y: str, mode: str, sym: str, tag: str, lines: list[str]) -> str | None:
    """Appends the lines computing `meaning` on operand strings x, y; returns the written result (None: undefined)."""
    from .equations import SUB

    def L(s):
        lines.append(f"{tag}: {s}")

    a, b = x, y
    if mode == "reversed":
        a, b = x[::-1], y[::-1]
        L(f"rev {x} = {a}")
        L(f"rev {y} = {b}")
    if meaning in ("ab", "ba"):
        s = a + b if meaning == "ab" else b + a
        L(f"cat {a} {b} = {s}" if meaning == "ab" else f"cat {b} {a} = {s}")
    elif meaning in SUB:
        when, where = SUB[meaning]
        ia, ib = int(a), int(b)
        s = str(abs(ia - ib))
        L(f"absdiff {a} {b} = {s}")
        if mode == "reversed":
            L(f"rev {s} = {s[::-1]}")
            s = s[::-1]
        if when == "never":
            return s
        if when == "always":
            L(f"eq {a} {b} = {'yes' if a == b else 'no'}" if len(a) == len(b) else f"eq {ia} {ib} = no")
            mark = ia != ib
        else:
            lo, hi = (a, b) if when == "a<b" else (b, a)
            mark = int(lo) < int(hi)
            L(f"lt {lo} {hi} = {'yes' if mark else 'no'}")
        if mark:
            t = sym + s if where == "front" else s + sym
            L(f"cat {sym} {s} = {t}" if where == "front" else f"cat {s} {sym} = {t}")
            s = t
        return s
    elif meaning == "mod":
        hi, lo = max(int(a), int(b)), min(int(a), int(b))
        L(f"max {a} {b} = {hi}")
        L(f"min {a} {b} = {lo}")
        if lo == 0:
            return None
        s = str(hi % lo)
        L(f"mod {hi} {lo} = {s}")
    else:
        op = "add" if "+" in meaning[:3] else "mul"
        v = int(a) + int(b) if op == "add" else int(a) * int(b)
        L(f"{op} {a} {b} = {v}")
        if meaning.endswith(("+1", "-1")):
            w = v + 1 if meaning.endswith("+1") else v - 1
            L(f"{'add' if meaning.endswith('+1') else 'sub'} {v} 1 = {w}")
            v = w
        if v < 0:
            return None
        s = str(v)
    if mode == "reversed":
        L(f"rev {s} = {s[::-1]}")
        s = s[::-1]
    return s


def _numeric(prompt: str, sol: Solution) -> list[str]:
    from .classify import equation_parts
    from .equations import MODES, by_operator, compute, meanings_for, split_numeric

    examples, query = equation_parts(prompt)
    x, sym, y = split_numeric(query)
    mode, meaning = sol.method.split(" ", 1)
    exs = by_operator(examples).get(sym, [])
    lines = [f"note try each reading of {sym}: modes plain, reversed; meanings in a fixed order; "
             "each on the examples of " + sym + " until one fails"]
    earlier, keep = [], (mode, meaning)
    for md in MODES:
        for m in meanings_for(md, sym):
            lines.append(f"note {md} {m}")
            fits = True
            for n, (ex_x, ex_y, r) in enumerate(exs, 1):
                tag = f"ex{n}"
                v = _eq_value(m, ex_x, ex_y, md, sym, tag, lines)
                if v is None:
                    lines.append(f"note {m} is undefined here")
                    fits = False
                    break
                lines.append(f"{tag}: eq {v} {r} = {'yes' if v == r else 'no'}")
                if v != r:
                    fits = False
                    break
            if fits and exs and compute(m, x, y, md, sym) == sol.answer:
                keep = (md, m)  # the first reading that fits every example (the solver's answer, too)
                break
            if (md, m) == (mode, meaning):
                break
            if fits and exs:
                earlier.append(f"{md} {m}")
        else:
            continue
        break
    if earlier:
        lines.append(f"note {', '.join(earlier)} fit too; the solver's priors keep {mode} {meaning}")
    mode, meaning = keep
    lines.append(f"note keep {mode} {meaning}" if exs else f"note {sym} is never shown: guess {mode} {meaning}")
    v = _eq_value(meaning, x, y, mode, sym, "q", lines)
    if v is None:
        raise ValueError("the kept reading is undefined on the query")
    if not lines[-1].endswith(f" = {v}"):  # no marker written: the result is the difference written above
        lines.append(f"q: copy {v}")
    return lines


def _symbolic(prompt: str, sol: Solution) -> list[str]:
    """The written signature search (`eqsearch.search_lines`); where it cannot give the solver's answer
    within its bounds, the stated fallback: the solver's digit map recalled and verified (`_symbolic_recall`)."""
    from .classify import equation_parts
    from .eqsearch import Unfit, search_lines
    from .equations import split_lhs

    examples, query = equation_parts(prompt)
    exs = [(p[0], p[1], p[2], rhs.strip()) for lhs, rhs in examples if (p := split_lhs(lhs))]
    q = split_lhs(query)
    if sol.status != "solved":  # several readings fit: no search can end in one answer
        return [f"note fallback: the puzzle is {sol.status}"] + _symbolic_recall(prompt, sol)
    try:
        lines = search_lines(exs, q, _eq_value) if q and exs else None
    except Unfit as e:
        lines, why = None, str(e)
    else:
        why = "no parseable example"
    if lines and lines[-1] == f"copy {sol.answer}":
        return lines
    if lines:
        why = "the search's answer is not the solver's"
    return [f"note fallback: {why}"] + _symbolic_recall(prompt, sol)


def _symbolic_recall(prompt: str, sol: Solution) -> list[str]:
    from .classify import equation_parts
    from .equations import split_lhs

    d = sol.detail or {}
    if "s2d" not in d:
        raise ValueError("the symbolic solver kept no digit map")
    s2d, ops, mode = d["s2d"], dict(d["ops"]), d["mode"]
    examples, query = equation_parts(prompt)
    qx, qsym, qy = split_lhs(query)
    ops.setdefault(qsym, d["meaning"])
    lines = ["note the digit map is too large a search to write out: recall it and the meanings, verify every example",
             f"note mode {mode}; " + "; ".join(f"{s} means {m}" for s, m in ops.items())]
    lines += [f"let {c} = {v}" for c, v in s2d.items()]

    def run(x, sym, y, tag):
        dx, dy = "".join(s2d[c] for c in x), "".join(s2d[c] for c in y)
        lines.append(f"{tag}: decode {x} = {dx}")
        lines.append(f"{tag}: decode {y} = {dy}")
        v = _eq_value(ops[sym], dx, dy, mode, sym, tag, lines)
        if v is None:
            raise ValueError("undefined under the recalled reading")
        enc = "".join({dg: c for c, dg in s2d.items()}.get(ch, ch) for ch in v)
        lines.append(f"{tag}: encode {v} = {enc}")
        return enc

    n = 0
    for lhs, rhs in examples:
        p = split_lhs(lhs)
        if not p or p[1] not in ops or any(c not in s2d for c in p[0] + p[2]):
            continue
        n += 1
        enc = run(p[0], p[1], p[2], f"ex{n}")
        lines.append(f"ex{n}: eq {enc} {rhs.strip()} = {'yes' if enc == rhs.strip() else 'no'}")
    run(qx, qsym, qy, "q")
    return lines


# ---------------------------------------------------------------- gravity, units

def _fmt(v: Fraction, dec: int) -> str:
    """v rounded half-even to `dec` decimals, written with exactly that many."""
    q = round(v * 10 ** dec)
    s = f"{abs(q):0{dec + 1}d}"
    out = (s[:-dec] + "." + s[-dec:]) if dec else s
    return ("-" if q < 0 else "") + out


def _fit_factor(pairs, dec_out: int, lines: list[str], ratio_label: str) -> str:
    """pairs: [(tag, divisor string, output string)]; appends the interval lines; returns the factor (4 decimals)."""
    from .gravity import decimals

    d_ex = max((o for _, _, o in pairs), key=decimals)
    unit = "0." + "0" * (dec_out - 1) + "1" if dec_out else "1"
    h = Fraction(unit) / 2
    lines.append(f"ulp {d_ex} = {unit}")
    lines.append(f"div {unit} 2 = {_fmt(h, dec_out + 1)}")
    hs = _fmt(h, dec_out + 1)
    los, his = [], []
    for tag, u, o in pairs:
        lo_n, hi_n = Fraction(o) - h, Fraction(o) + h
        lines.append(f"{tag}: sub {o} {hs} = {_fmt(lo_n, dec_out + 1)}")
        lines.append(f"{tag}: add {o} {hs} = {_fmt(hi_n, dec_out + 1)}")
        lo, hi = _fmt(lo_n / Fraction(u), 8), _fmt(hi_n / Fraction(u), 8)
        lines.append(f"{tag}: div {_fmt(lo_n, dec_out + 1)} {u} = {lo}")
        lines.append(f"{tag}: div {_fmt(hi_n, dec_out + 1)} {u} = {hi}")
        los.append(lo)
        his.append(hi)
    lo = max(los, key=Fraction)
    hi = min(his, key=Fraction)
    lines.append(f"max {' '.join(los)} = {lo}")
    lines.append(f"min {' '.join(his)} = {hi}")
    meet = Fraction(lo) <= Fraction(hi)
    lines.append(f"le {lo} {hi} = {'yes' if meet else 'no'}")
    if meet:
        f = _fmt((Fraction(lo) + Fraction(hi)) / 2, 4)
        lines.append(f"mid {lo} {hi} = {f}")
        return f
    lines.append(f"note the intervals do not meet: the median of the {ratio_label}")
    rs = []
    for tag, u, o in pairs:
        r = _fmt(Fraction(o) / Fraction(u), 8)
        lines.append(f"{tag}: div {o} {u} = {r}")
        rs.append(r)
    from statistics import median
    f = _fmt(median([Fraction(r) for r in rs]), 4)
    lines.append(f"median {' '.join(rs)} = {f}")
    return f


def _gravity(prompt: str, sol: Solution) -> list[str]:
    from .gravity import decimals, parse

    ex, q = parse(prompt)
    ex = [(t, d) for t, d in ex if float(t) > 0]
    dec = max(decimals(d) for _, d in ex)
    lines, pairs = ["note g = 2d/t^2: each example bounds g, the output being rounded"], []
    for n, (t, d) in enumerate(ex, 1):
        sq = _fmt(Fraction(t) ** 2, 2 * decimals(t))
        half = _fmt(Fraction(t) ** 2 / 2, 2 * decimals(t) + 1)
        lines.append(f"ex{n}: sq {t} = {sq}")
        lines.append(f"ex{n}: mul 0.5 {sq} = {half}")
        pairs.append((f"ex{n}", half, d))
    g = _fit_factor(pairs, dec, lines, "2d/t^2")
    sq = _fmt(Fraction(q) ** 2, 2 * decimals(q))
    lines.append(f"q: sq {q} = {sq}")
    half = _fmt(Fraction(q) ** 2 / 2, 2 * decimals(q) + 1)
    lines.append(f"q: mul 0.5 {sq} = {half}")
    lines.append(f"q: mul {g} {half} = {sol.answer}")
    return lines


def _units(prompt: str, sol: Solution) -> list[str]:
    from .gravity import decimals
    from .units import parse

    ex, q = parse(prompt)
    ex = [(x, y) for x, y in ex if float(x) != 0]
    dec = max(decimals(y) for _, y in ex)
    lines = ["note factor = out/in: each example bounds it, the output being rounded"]
    f = _fit_factor([(f"ex{n}", x, y) for n, (x, y) in enumerate(ex, 1)], dec, lines, "ratios")
    lines.append(f"q: mul {q} {f} = {sol.answer}")
    return lines


# ---------------------------------------------------------------- numerals, cipher

def _numeral(prompt: str, sol: Solution) -> list[str]:
    from .numeral import parse, part_roman, parts

    ex, q = parse(prompt)
    lines = ["note write each example in Roman numerals and compare, then the query"]

    def conv(n, tag):
        ps = parts(n)
        lines.append(f"{tag}: places {n} = {' '.join(map(str, ps))}")
        rs = []
        for p in ps:
            lines.append(f"{tag}: roman {p} = {part_roman(p)}")
            rs.append(part_roman(p))
        lines.append(f"{tag}: cat {' '.join(rs)} = {''.join(rs)}")
        return "".join(rs)

    for n, (v, r) in enumerate(ex, 1):
        got = conv(v, f"ex{n}")
        lines.append(f"ex{n}: eq {got} {r} = {'yes' if got == r else 'no'}")
    conv(q, "q")
    return lines


def _cipher(prompt: str, sol: Solution) -> list[str]:
    import re
    import string

    from .cipher import build_key, parse

    ex, q = parse(prompt)
    c2p, _ = build_key(ex)
    pairs = [(cw, pw) for c, p in ex for cw, pw in zip(c.split(), p.split()) if len(cw) == len(pw)]
    own = {w for _, p in ex for w in p.split()}
    lines = ["note read each query letter from an example word that contains it; match the rest to a known word"]
    words = []
    for full, pw in zip(q.split(), sol.answer.split()):
        cw = re.sub(r"^[^a-z]+|[^a-z]+$", "", full) or full
        letters = []
        for ch in cw:
            if ch in c2p and ch in string.ascii_lowercase:
                src = next(((a, b) for a, b in pairs if ch in a and {b[i] for i, c in enumerate(a) if c == ch}
                            == {c2p[ch]}), None)
                if src is None:
                    letters.append("?")
                    continue
                lines.append(f"{cw}: letter {src[0]} {src[1]} {ch} = {c2p[ch]}")
                letters.append(c2p[ch])
            else:
                letters.append("?" if ch in string.ascii_lowercase else ch)
        partial = "".join(letters)
        lines.append(f"{cw}: cat {' '.join(letters)} = {partial}")
        if "?" in partial:
            core = re.sub(r"^[^a-z]+|[^a-z]+$", "", pw) or pw
            lines.append(f"{'copy' if core in own else 'recall'} {core}")
            lines.append(f"{cw}: fits {partial} {core} = {'yes' if len(partial) == len(core) else 'no'}")
            partial = core
        if full != cw:
            pre, post = full[:full.find(cw)], full[full.find(cw) + len(cw):]
            lines.append(f"{cw}: cat {' '.join(x for x in (pre, partial, post) if x)} = {pre + partial + post}")
            partial = pre + partial + post
        words.append(partial)
    lines.append(f"join {' '.join(words)} = {' '.join(words)}")
    return lines


BUILDERS = {"bits": _bits, "gravity": _gravity, "units": _units, "numeral": _numeral, "cipher": _cipher}  # by module


def derivation(prompt: str, sol: Solution) -> Solution:
    """The same Solution with its trace written as a derivation (see the module docstring)."""
    module = BY_NAME[sol.category].module if sol.category in BY_NAME else ""
    if module == "equations":
        build = _symbolic if sol.subtype.startswith("symbolic") else _numeric
    else:
        build = BUILDERS.get(module)
    if build is None or (sol.status != "solved" and not sol.method and module == "equations"):
        return sol
    try:
        lines = build(prompt, sol)
    except Exception as e:  # noqa: BLE001 - a solved puzzle without a derivation shows up in `check`
        if sol.status != "solved":
            return sol
        lines = [f"note no derivation: {type(e).__name__}: {e}"]
    sol.trace = finish(lines, sol.answer)
    return sol
