"""The equation-transformation category: its Category object, its derivation traces and its compact-line checker.

The rule model is `eqrules`, the solvers `eqsolve`; the symbolic written search is `eqsearch`. Derivation (`derive`):
  numeric   the query operator's candidate meanings, modes `plain` then `reversed`, meanings in `eqrules.MEANINGS`
            order, each computed on that operator's examples in turn until one rejects it; the first that no
            example rejects is kept when it gives the solver's answer (for a `solved` puzzle every fitting reading
            does, unless the other operators rule it out); otherwise a note says the solver's priors set it aside,
            and the search goes on to the solver's reading. The output format (reversal, the subtraction marker in
            front or at the end) is its own step.
  symbolic  the written signature search (`eqsearch.search_lines`); where it cannot give the solver's answer
            within its bounds, or the puzzle is not `solved`, the stated fallback: the solver's digit map recalled
            (`let` lines) with each operator's meaning, every example verified under them, then the query.
An unsolved puzzle the solver found no reading for keeps its compact trace (nothing trains on it).
Compact traces (`check_line`): the differences, sums, products, remainders and joins are recomputed; the mode,
the meanings and the digit map are claims.
Simplifies: the arithmetic of a meaning is written by one function (`_eq_value`) for both kinds and the search.
"""

from __future__ import annotations

from .check import line_rules
from .common import Category, Solution
from .eqsearch import BRANCHES, OPS, Unfit, search_lines
from .eqrules import KEY, MODES, SUB, compute, equation_parts, equation_subtype, meanings_for
from .eqsolve import NAME, by_operator, generate_one, learn_priors, solve, split_lhs, split_numeric


def _eq_value(meaning: str, x: str, y: str, mode: str, sym: str, tag: str, lines: list[str]) -> str | None:
    """Appends the lines computing `meaning` on operand strings x, y; returns the written result (None: undefined)."""

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


def derive(prompt: str, sol: Solution) -> list[str] | None:
    if sol.status != "solved" and not sol.method:
        return None
    return (_symbolic if sol.subtype.startswith("symbolic") else _numeric)(prompt, sol)


# a compact line: differences, sums, products, remainders and joins are recomputed; the rest are claims
check_line = line_rules(
    (r"\|(\d+)-(\d+)\| = (\d+)", lambda a, b, r: abs(int(a) - int(b)) == int(r), "wrong difference"),
    (r"(\d+)([+*])(\d+)(?:([+-])1)? = (-?\d+)", lambda a, op, b, pm, r: int(r) == {"+": 1, "-": -1, None: 0}[pm]
     + (int(a) + int(b) if op == "+" else int(a) * int(b)), "wrong sum or product"),
    (r"(\d+) mod (\d+) = (\d+)", lambda a, b, r: int(a) % int(b) == int(r), "wrong remainder"),
    (r"(\d+) joined to (\d+) = (\d+)", lambda a, b, r: a + b == r, "wrong join"))


CATEGORY = Category(NAME, KEY, "eq", "text", equation_parts, solve, generate_one, derive, check_line,
                    subtype=equation_subtype, input="priors", learn=learn_priors, ops=OPS, branches=BRANCHES)
