"""The bit-manipulation category: its Category object, its derivation trace and its compact-line checker.

The rule space and the solver are `bitrules`; the competition's layout and its anchor scans are `bitlayout`.
Derivation (`derive`): each output bit is one function F of the bits at its position of up to three copies (rotl a,
shl b, shr c), read off the examples on the page: `scan` lines at the anchor bits rule layouts out, `try` lines take
the layouts in `bitlayout.LAYOUTS` order, `fill` lines write each example's `key:bit` pairs until a key shows both
bits (the next `try`) or every example fits, and `table` collects F, from which the query is read. A trace that
would pass `TOKEN_CAP` states its layout instead; a puzzle no layout answers keeps the older screen of the 22 copies
of `bitrules.T_NAMES`. Written in binary, so the bit positions stay visible. `scan`, `fill` and `try` are this
category's own operations (`Category.ops`, `branches`), recomputed by the checker, so the search is replayed, not
taken on trust. In detail: docs/internals.md, lab.puzzles.bits.
"""

from __future__ import annotations

import functools
import re

from .bitlayout import (FIRST, LAYOUTS, anchor_scan, b8, candidates, first_scans, scans_before, shift_copy,
                        shift_name, shift_tables)
from .bitrules import NAME, NT, T_NAMES, apply_step, apply_t, generate_one, op2, op3, parse, rule_name, solve
from .check import BITS_RE, Fail
from .common import Category, Solution, estimate_tokens


def _value(rule, xv: int, tag: str, lines: list[str]) -> str:
    """Appends the lines computing `rule` on input xv; returns the written result."""

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
        return binop(rule[1], _value(rule[3], xv, tag, lines), b8(rule[2]))
    if kind == "xor":
        ng, names = rule[1], rule[2]
        vals = [copy(n) for n in names]
        r = vals[0]
        for v in vals[1:]:
            r = binop("XOR", r, v)
        return neg(r) if ng else r
    raise ValueError(f"no derivation for bits rule {kind}")


def derive(prompt: str, sol: Solution) -> list[str]:

    ex, q = parse(prompt)
    d = sol.detail or {}
    rule = d.get("rule")
    if "xor" in d:
        rule = ("xor", *d["xor"])
    layout = _anchored(ex, q, sol.answer) or _layout(ex, q, sol.answer)
    if layout is not None:
        return layout
    if rule is None and sol.method in ("affine per bit", "per bit"):
        return _per_bit(sol, ex, q)
    if rule is None:
        raise ValueError("the solver kept no rule")
    lines = ["note screen each single copy of x, example by example"]
    nots = {}
    found = None
    for name in T_NAMES:
        found_kind = ""  # NOT when the copy matches every example negated
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
        return lines + _table(rule, ex, q)
    name = rule_name(rule) if rule[0] != "xor" else (("NOT (" if rule[1] else "") + " XOR ".join(rule[2])
                                                        + (")" if rule[1] else ""))
    lines.append(f"note no single copy fits; recall the rule {name} and verify it on every example")
    if rule[0] in ("const", "mask"):
        lines.append(f"recall {b8(rule[1] if rule[0] == 'const' else rule[2])}")
    for n, (xv, yv) in enumerate(ex, 1):
        v = _value(rule, xv, f"ex{n}", lines)
        lines.append(f"ex{n}: eq {v} {b8(yv)} = {'yes' if v == b8(yv) else 'no'}")
    v = _value(rule, q, "q", lines)
    if rule[0] == "const":
        lines.append(f"copy {v}")
    return lines


def _key_lines(lines: list[str], names: list[str], copies: list, v: int, tag: str) -> str:
    """Append each copy of `v` (`copies[i](v)`, named `names[i]`; `x` itself is not written) and the keys line (the
    copies' bits at each position); returns the keys. Shared by the layout and the table-of-copies traces."""

    vals = []
    for nm, copy in zip(names, copies):
        out = b8(copy(v))
        if nm != "x":
            lines.append(f"{tag}: {nm} {b8(v)} = {out}")
        vals.append(out)
    ks = " ".join("".join(s[p] for s in vals) for p in range(8))
    lines.append(f"{tag}: keys {' '.join(vals)} = {ks}")
    return ks

def _read_query(lines: list[str], names: list[str], cps, table: dict, q: int) -> str:
    """Append F's table, the query's copies and keys, a `default` for each key no example shows and the `read`
    line; returns the bits read (the answer)."""
    lines.append("table = " + " ".join(f"{k}:{table[k]}" for k in sorted(table)))
    ks = _key_lines(lines, names, [functools.partial(shift_copy, kd, k) for kd, k in cps], q, "q")
    for k in sorted({k for k in ks.split() if k not in table}):
        lines.append(f"q: default {k} = {k}:0")
    read = "".join(table.get(k, "0") for k in ks.split())
    lines.append(f"q: read {ks} = {read}")
    return read


def _layout(ex, q, answer: str) -> list[str] | None:
    """The competition's layout: each output bit is one function F of the bits at its position of up to
    three copies (rotl a, shl b, shr c). The copies are chosen (one `note choose` line: the fewest copies,
    then the smallest shifts, among the layouts no example contradicts that give the answer), then per example
    the copies, their keys (the copies' bits per position) and the `key:bit` pairs; `table` collects the pairs
    (one bit per key, checked); the query's keys are read from it. A key no example shows reads 0 (`default`).
    None when no layout gives the answer (the caller falls back to the rule search)."""

    fits = [f for f in shift_tables([a for a, _ in ex], [b for _, b in ex], q) if f[2] == answer]
    if not fits:
        return None
    cps = min(fits, key=lambda f: bool(f[3]))[0]  # sorted already; a fit needing no default first
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
    _read_query(lines, names, cps, table, q)
    return lines


TOKEN_CAP = 6000  # an anchored trace estimated longer (`common.estimate_tokens`) states its layout instead
LAYOUT_NOTES = ("note each output bit is one function F of the bits at its position of rotl a, shl b and shr c "
                "(some may be absent)",
                "note at bit p rotl a reads x bit p+a (mod 8), shl b x bit p+b and shr c x bit p-c (0 outside 0-7): at "
                "bits 7, 0, 6 and 1 a layout reads at most two bits of x, save shl1 at 6 and shr1 at 1 with all three",
                "note scan which bits of x explain bits 7 and 0: none, then each bit")
TRY_NOTE = ("note try the layouts in order (one copy, shl shr, rotl shl, rotl shr, all three; smaller shifts first): "
            "skip a layout when the scan of its bits at 7, 0, 6 or 1 failed; else scan, in that order, its bits there "
            "that no passed set explains, skipping it at the first that fails; fill the examples that clashed first, "
            "the latest first; a key no example shows reads 0")


def _anchored(ex, q, answer: str) -> list[str] | None:
    """The layout derived on the page, as the module docstring says (anchors, tries in clash order, the table).
    None when the trace would pass `TOKEN_CAP` or the fit does not give `answer` (the caller states its layout
    instead)."""
    xs, ys = [a for a, _ in ex], [b for _, b in ex]
    lines, written = list(LAYOUT_NOTES), {}
    for p in FIRST:
        for cols, text, ok in first_scans(xs, ys, p):
            written[(p, cols)] = ok
            lines.append(f"scan {' '.join(map(str, (p, *cols)))} = {text}")
    lines.append(TRY_NOTE)
    copied = set()  # (example, copy) written already: a later try cites its line
    order = list(range(len(ex)))  # the fill order: the examples that clashed, the latest first, then the others
    for cps in LAYOUTS:
        scans, tried = scans_before(cps, written, xs, ys)
        lines += [f"scan {' '.join(map(str, (p, *cols)))} = {text}" for p, cols, text in scans]
        if not tried:
            continue
        if estimate_tokens('\n'.join(lines)) > TOKEN_CAP:
            return None
        names = [shift_name(kd, k) for kd, k in cps]
        lines.append("try " + " ".join(names))
        table, fits = {}, True
        for n in order:
            vals = []
            for nm, (kd, k) in zip(names, cps):
                vals.append(b8(shift_copy(kd, k, xs[n])))
                if nm != "x" and (n, nm) not in copied:
                    copied.add((n, nm))
                    lines.append(f"ex{n + 1}: {nm} {b8(xs[n])} = {vals[-1]}")
            text, fits = _fill(vals, b8(ys[n]), table)
            lines.append(f"ex{n + 1}: fill {' '.join(vals)} {b8(ys[n])} = {text}")
            if not fits:
                order = [n] + [i for i in order if i != n]
                break
        if not fits:
            continue
        read = _read_query(lines, names, cps, table, q)
        return lines if read == answer and estimate_tokens('\n'.join(lines)) <= TOKEN_CAP else None
    return None


def _fill(vals: list[str], y: str, table: dict) -> tuple[str, bool]:
    """Each position's `key:bit` (key: the copies' bits there, bit: y's) added to `table`, up to the first key the
    table holds with the other bit (then `clash`). -> (the text, no clash)."""
    out = []
    for p in range(8):
        key = "".join(v[p] for v in vals)
        out.append(f"{key}:{y[p]}")
        if table.setdefault(key, y[p]) != y[p]:
            return " ".join(out + ["clash"]), False
    return " ".join(out), True


def _examples(replay):
    ex, _ = parse(replay.prompt)
    return [a for a, _ in ex], [b for _, b in ex]


def _scan_op(replay, args) -> str:
    """`scan P [I [J]]`: output bit P against x's bits I, J on the prompt's examples (`bitlayout.anchor_scan`)."""
    if not 1 <= len(args) <= 3 or not all(a.isdigit() and int(a) < 8 for a in args):
        raise Fail("`scan` takes an output bit and up to two bits of x, each 0-7")
    p, *cols = map(int, args)
    return anchor_scan(*_examples(replay), p, cols)[0]


def _fill_op(replay, args) -> str:
    """`exN: fill COPY ... Y`: the copies of the layout last tried (`try`) on example N's input, then its output;
    each position's `key:bit`, checked against the pairs since the last `try`. N must be the next example in the
    fill order (those that clashed, the latest first, then the others)."""
    m = re.fullmatch(r"ex(\d+)", replay.tag or "")
    xs, ys = _examples(replay)
    st = replay.state
    if not m or not 1 <= int(m.group(1)) <= len(xs) or not st.get("tried"):
        raise Fail("`fill` belongs to an example (`exN:`) of a layout tried (`try`)")
    n, cps = int(m.group(1)) - 1, st["cands"][st["tried"] - 1]
    order = st.setdefault("order", list(range(len(xs))))
    if not st["open"] or st["filled"] == len(order):
        raise Fail("this layout " + ("clashed: the next line is a `try`" if not st["open"] else "fits every example"))
    if n != order[st["filled"]]:
        raise Fail(f"the next example to fill is ex{order[st['filled']] + 1}")
    want = [b8(shift_copy(kd, k, xs[n])) for kd, k in cps] + [b8(ys[n])]
    if list(args) != want:
        raise Fail(f"example {n + 1}'s copies for this layout and its output are {' '.join(want)}")
    *vals, y = args
    table = {}
    for pr in replay.pairs:
        k, b = pr.split(":")
        table[k] = b
    text, fits = _fill(vals, y, table)
    st["filled"] += 1
    if not fits:
        st["order"] = [n] + [i for i in order if i != n]
        st["open"] = False
    return text


def _try(replay, args):
    """`try LAYOUT`: the next layout, in order, whose bits pass at every anchor (`bitlayout.candidates`), once the
    layout before it clashed; a new table."""
    cps = []
    for nm in args:
        m = re.fullmatch(r"(rotl|shl|shr)(\d)", nm)
        cps.append(("rotl", 0) if nm == "x" else (m.group(1), int(m.group(2))) if m else None)
    if None in cps or tuple(cps) not in LAYOUTS:
        raise Fail(f"{' '.join(args)!r} is not a layout of rotl a, shl b, shr c (in that order)")
    st = replay.state
    if "cands" not in st:
        st["cands"] = candidates(*_examples(replay))
        st["tried"] = 0
    if st.get("open"):
        raise Fail("the layout tried before has not clashed")
    cands, n = st["cands"], st["tried"]
    if n >= len(cands) or cands[n] != tuple(cps):
        want = " ".join(shift_name(*c) for c in cands[n]) if n < len(cands) else "none"
        raise Fail(f"the next layout that passes every anchor scan is {want}")
    st.update(tried=n + 1, filled=0, open=True)
    replay.reset_pairs()


def _per_bit(sol: Solution, ex, q) -> list[str]:
    """The fallbacks, read from the compact trace's per-bit lines (`b3 = x0 ^ x5 ^ 1 = 1`, `b3 <- x0,x5: 01 -> 1`):
    affine: each output bit's XOR of input bits checked on every example, then the query's; per bit: each output
    bit's input bits per example, and the query's bit taken from an example with the same input bits."""

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


def _table(rule, ex, q) -> list[str]:

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


def _eval_bits(expr: str, x: int) -> int:
    """A bits rule name (`shl1 XOR NOT rotr3`, `MAJ(x, shl1, rotr2)`, `(a AND b) OR c`) evaluated on x."""
    env = {("_" + n): apply_t(n, x) for n in T_NAMES}
    env["MAJ"] = lambda a, b, c: (a & b) | (a & c) | (b & c)
    env["CH"] = lambda a, b, c: (a & b) | (~a & c)
    py = re.sub(r"\b([01]{8})\b", lambda m: str(int(m.group(1), 2)), expr)
    py = re.sub(r"\b(" + "|".join(T_NAMES) + r")\b", r"_\1", py)
    py = py.replace("XOR", "^").replace("AND", "&").replace("OR", "|").replace("NOT", "~")
    if not re.fullmatch(r"[\w\s()^&|~,]+", py):
        raise Fail(f"cannot read {expr!r}")
    return eval(py, {"__builtins__": {}}, env) & 255  # noqa: S307 - names and operators only, checked above


def check_line(line: str, prompt: str, state: dict) -> bool:
    """A compact line: True if it states a computation that replays, False if it is a claim; Fail if it is wrong."""
    if line.startswith("rule: "):
        state["rule"] = line[6:]
        return False
    m = re.fullmatch(r"x = ([01]{8})", line)
    if m:
        if not re.search(rf"determine the output for:\s*{m.group(1)}", prompt):
            raise Fail("x is not the prompt's query")
        state["x"] = int(m.group(1), 2)
        return True
    m = re.fullmatch(r"b(\d) = ([x\d ^]+) = ([01])", line)  # affine: an XOR of input bits (x0 the first)
    if m and "x" in state:
        xs = b8(state["x"])
        v = 0
        for t in m.group(2).split(" ^ "):
            v ^= 1 if t == "1" else 0 if t == "0" else int(xs[int(t[1:])])
        if v != int(m.group(3)):
            raise Fail(f"the XOR is {v}")
        state.setdefault("bits", []).append(m.group(3))
        return True
    m = re.fullmatch(r"b(\d) <- ([x\d,]+|none): (\d*|-) -> ([01])", line)  # per-bit fallback
    if m and "x" in state:
        xs = b8(state["x"])
        key = "".join(xs[int(t[1:])] for t in m.group(2).split(",")) if m.group(2) != "none" else "-"
        if key != m.group(3):
            raise Fail(f"the input bits are {key}")
        state.setdefault("bits", []).append(m.group(4))
        return False  # the bit read from the examples' table is a claim
    m = re.fullmatch(r"(.+) = ([01]{8})", line)
    if m and "x" in state and not line.startswith(("b", "table", "keys")):
        name = m.group(1)
        if ": " in name:  # a pipeline step `XOR shr2: a XOR b = c`
            return False
        if _eval_bits(name, state["x"]) != int(m.group(2), 2):
            raise Fail(f"{name} of x is {b8(_eval_bits(name, state['x']))}")
        return True
    return False

def compact_answer(lines: list[str], box: str, state: dict, tail: str) -> str:
    """The per-bit lines' bits joined, or a constant rule's constant, where the trace ends with them."""
    if len(state.get("bits", [])) == 8:
        tail = "".join(state["bits"])
    if BITS_RE.match(state.get("rule", "")) and (lines[-1] if lines else "").startswith("x = "):
        tail = state["rule"]  # a constant rule: the claimed constant is the answer
    return tail


CATEGORY = Category(NAME, "bit manipulation rule", "bit", "bits", parse, solve, generate_one, derive, check_line,
                    compact_answer, ops={"scan": _scan_op, "fill": _fill_op}, branches={"try": _try})
