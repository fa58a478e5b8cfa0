"""Equation transformation puzzles: two operands around a hidden operator symbol (`34/44 = 1`).

Hidden rule model (shared by solver and generator):
  mode   plain: operands read as written, result written as computed
         reversed: operands read with their digits reversed, result string reversed
  op     one of OPS per operator symbol (a+b, a-b, b-a, |a-b|, a*b, a+b+1, a+b-1, a*b+1, a*b-1,
         concatenation ab / ba)
  neg    how a negative result is written: '-' as usual, or the operator symbol in its place
         (so in reversed mode 25-96 = -71 is written `17/` for the operator '/')
Subtypes (see classify): numeric (digits) or symbolic (each digit written as a secret symbol, a
cryptarithm), deduce (the query's operator occurs in the examples) or guess (it does not).

Numeric solver: every (mode, neg, op) consistent with all examples of each operator; the mode
explaining the most operators wins; the query operator's consistent ops, in OPS order, give the
answer (ambiguous if they disagree).
Symbolic solver (per mode): for each example, its candidates (meaning, digits) come from a
precomputed table of the equality pattern of x+y+result over all 00..99 operand pairs (so
`[[+!' = '@` only meets digit strings with the same repeats); an arc-consistency pass prunes
candidates that no example sharing a symbol or the operator agrees with; a depth-first join
(indexed on already bound symbols, node budget, solution cap) finds the consistent symbol->digit
maps and meanings. Every solution, completed in every way for query symbols the examples never
fix, votes on the query's answer: one answer is `solved`, several (or some unwritable: a result
digit whose symbol never appears) `ambiguous`. Guess subtype: status undetermined, the answer
uses the first op (in OPS order) not taken by another operator.
`method` is the query operator's reading, mode and meaning (`reversed b-a`), so a table over a
file shows which meanings its puzzles use.
Traces (numeric; symbolic adds a `digits:` line and the decoded query):
    mode: reversed
    / means b-a (fits 2 examples)
    69/52: a = 96, b = 25
    25-96 = -71
    answer: 17/
Deliberately simplified: the op list is this project's guess at the hidden rules; rules outside
it are reported undetermined, never forced. The symbolic solver assumes the digit-substitution
model and operands of exactly two symbols (5-symbol left sides, like the one real example seen,
`` `!*[{ = '"[` ``, where the backtick is a symbol); other symbolic puzzles (string rewrites, say)
are undetermined.
The generator draws its operator meanings from the same OPS list, so round trips are optimistic.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from functools import lru_cache
from itertools import permutations
from operator import itemgetter

from .classify import equation_parts
from .common import Solution, finish, undetermined

CATEGORY = "equation_transformation"
HEADER = "In Alice's Wonderland, a secret set of transformation rules is applied to equations. Below are a few examples:"

OPS = {
    "a+b": lambda a, b: a + b,
    "a-b": lambda a, b: a - b,
    "b-a": lambda a, b: b - a,
    "|a-b|": lambda a, b: abs(a - b),
    "a*b": lambda a, b: a * b,
    "ab": lambda a, b: None,  # concatenation, handled on strings
    "ba": lambda a, b: None,
    "a+b+1": lambda a, b: a + b + 1,
    "a+b-1": lambda a, b: a + b - 1,
    "a*b+1": lambda a, b: a * b + 1,
    "a*b-1": lambda a, b: a * b - 1,
}
OP_NAMES = list(OPS)
MODES = ("plain", "reversed")
NEGS = ("op", "-")  # ties go to the operator symbol, as in the one real example
OPERATOR_POOL = "+-*/|\\&%^#@<>:;!?~{}[]()$"
SYMBOL_POOL = "!\"#$%&'()*+,-./:;<>?@[\\]^_`{|}~"  # the backtick too: it is a symbol in the real rows


def compute(op: str, x: str, y: str, mode: str, neg: str, sym: str) -> str:
    """The written result of operator meaning `op` on operand strings x, y (digits)."""
    if mode == "reversed":
        x, y = x[::-1], y[::-1]
    if op == "ab":
        s = x + y
    elif op == "ba":
        s = y + x
    else:
        s = str(OPS[op](int(x), int(y)))
    if mode == "reversed":
        s = s[::-1]
    return s.replace("-", sym) if neg == "op" else s


def split_lhs(lhs: str):
    """(x, operator, y) for a 5-character left side, else None."""
    lhs = lhs.strip()
    return (lhs[:2], lhs[2], lhs[3:]) if len(lhs) == 5 else None


# ---------------------------------------------------------------- numeric

def split_numeric(lhs: str):
    """(x, operator, y) for digits-operator-digits (any number of digits), else None."""
    m = re.fullmatch(r"(\d+)(\D)(\d+)", lhs.strip())
    return m.groups() if m else None


def numeric_candidates(examples):
    """{operator: {(mode, neg): [op, ...]}} of meanings consistent with all its examples."""
    by_op: dict[str, list] = {}
    for lhs, rhs in examples:
        p = split_numeric(lhs)
        if p:
            by_op.setdefault(p[1], []).append((p[0], p[2], rhs))
    out = {}
    for sym, exs in by_op.items():
        out[sym] = {(m, n): [op for op in OP_NAMES if all(compute(op, x, y, m, n, sym) == r for x, y, r in exs)]
                    for m in MODES for n in NEGS}
    return out


def best_mode(cands) -> tuple[str, str]:
    score = Counter()
    for per in cands.values():
        for key, ops in per.items():
            score[key] += bool(ops)
    order = [(m, n) for m in MODES for n in NEGS]
    return max(order, key=lambda k: (score[k], -order.index(k)))


def solve_numeric(examples, query, subtype) -> Solution:
    q = split_numeric(query)
    if not q:
        return undetermined(CATEGORY, f"query {query!r} is not two numbers around an operator", subtype)
    x, sym, y = q
    cands = numeric_candidates(examples)
    if not cands:
        return undetermined(CATEGORY, "no parseable numeric examples", subtype)
    mode, neg = best_mode(cands)
    if sym not in cands:  # guess: an op no other operator uses
        taken = {ops[0] for per in cands.values() for ops in [per[(mode, neg)]] if ops}
        op = next(o for o in OP_NAMES if o not in taken)
        ans = compute(op, x, y, mode, neg, sym)
        lines = [f"mode: {mode}", f"{sym} never appears in the examples: guess {sym} means {op}",
                 *operand_lines(x, sym, y, op, mode), f"answer: {ans}"]
        return undetermined(CATEGORY, f"operator {sym!r} never appears in the examples", subtype, ans, lines)
    ops = cands[sym][(mode, neg)]
    if not ops:  # the best global mode does not fit this operator: any mode that does
        fits = [(k, v) for k, v in cands[sym].items() if v]
        if not fits:
            return undetermined(CATEGORY, f"no known rule fits the examples of {sym!r}", subtype)
        (mode, neg), ops = fits[0]
    preds = Counter(compute(op, x, y, mode, neg, sym) for op in ops)
    ans = compute(ops[0], x, y, mode, neg, sym)
    n = sum(1 for lhs, _ in examples if (split_numeric(lhs) or "  ")[1] == sym)
    lines = [f"mode: {mode}", f"{sym} means {ops[0]} (fits {n} examples)", *operand_lines(x, sym, y, ops[0], mode),
             f"answer: {ans}"]
    status = "solved" if len(preds) == 1 else "ambiguous"
    reason = "" if status == "solved" else f"{len(ops)} meanings of {sym!r} fit and disagree"
    return Solution(ans, status, finish(lines, ans), CATEGORY, subtype, reason, f"{mode} {ops[0]}")


def operand_lines(x: str, sym: str, y: str, op: str, mode: str) -> list[str]:
    a, b = (x[::-1], y[::-1]) if mode == "reversed" else (x, y)
    if op in ("ab", "ba"):
        val = a + b if op == "ab" else b + a
    else:
        val = str(OPS[op](int(a), int(b)))
    expr = op.replace("a", "A").replace("b", "B").replace("A", a).replace("B", b)
    return [f"{x}{sym}{y}: a = {a}, b = {b}", f"{expr} = {val}"]


# ---------------------------------------------------------------- symbolic

def canon(s, op_mark=None) -> tuple:
    """The equality pattern of a string: each char -> index of its first occurrence (op_mark kept)."""
    first: dict = {}
    return tuple("OP" if ch == op_mark else first.setdefault(ch, len(first)) for ch in s)


@lru_cache(maxsize=None)
def pattern_table(op: str, mode: str, neg: str) -> dict:
    """Equality pattern of (x digits + y digits + written result) -> [digit string], all 00..99 pairs.
    A negative sign written as the operator symbol is the marker '\x00' (pattern token OP)."""
    table: dict = {}
    for i in range(100):
        for j in range(100):
            x, y = f"{i:02d}", f"{j:02d}"
            d = x + y + compute(op, x, y, mode, neg, "\x00")
            table.setdefault(canon(d, "\x00"), []).append(d)
    return table


def solve_symbolic(examples, query, subtype, cap: int = 500, budget: int = 200_000) -> Solution:
    q = split_lhs(query)
    if not q:
        return undetermined(CATEGORY, f"query {query!r} is not 5 symbols", subtype)
    exs = [(p[0], p[1], p[2], rhs) for lhs, rhs in examples if (p := split_lhs(lhs))]
    if not exs:
        return undetermined(CATEGORY, "no parseable symbolic examples", subtype)
    guess = q[1] not in {e[1] for e in exs}
    solutions = []
    for mode in MODES:
        domains = []
        for x, sym, y, rhs in exs:
            s = x + y + rhs
            key = canon(s, sym)
            cands = [((op, neg), d) for op in OP_NAMES for neg in NEGS
                     for d in pattern_table(op, mode, neg).get(key, ())]
            domains.append((sym, s, cands))
        domains = _order(_reduce(domains))
        found: list = []
        _join(domains, 0, {}, {}, {}, mode, found, cap, {"nodes": 0, "budget": budget})
        solutions += found
    if not solutions:
        return undetermined(CATEGORY, "symbolic: no digit map and known rules fit", subtype)
    votes, first, unwritable = Counter(), {}, 0
    for mode, s2d, ops in solutions:
        op = ops.get(q[1])
        if op is None:
            taken = {v[0] for v in ops.values()}
            op = (next(o for o in OP_NAMES if o not in taken), "op")
        for full in _completions(s2d, q[0] + q[2]):
            ans = _encode_answer(op, q, mode, full)
            if ans is None:
                unwritable += 1
                continue
            votes[ans] += 1
            first.setdefault(ans, (mode, full, op))
    if not votes:
        return undetermined(CATEGORY, "symbolic: query symbols or result digits not covered by the examples", subtype)
    ans = votes.most_common(1)[0][0]
    mode, s2d, (op, neg) = first[ans]
    x, sym, y = q
    d = lambda s: "".join(s2d[c] for c in s)  # noqa: E731
    used = list(dict.fromkeys(x + y + "".join(ch for ch in ans if ch in s2d)))
    lines = ["digits: " + " ".join(f"{c}={s2d[c]}" for c in used), f"mode: {mode}",
             f"{sym} means {op}" + (" (guess)" if guess else ""),
             f"{query} -> {d(x)}{sym}{d(y)}", *operand_lines(d(x), sym, d(y), op, mode)[1:],
             f"written: {compute(op, d(x), d(y), mode, neg, sym)}", f"answer: {ans}"]
    if guess:
        return undetermined(CATEGORY, f"operator {sym!r} never appears in the examples", subtype, ans, lines)
    status = "solved" if len(votes) == 1 and not unwritable else "ambiguous"
    reason = "" if status == "solved" else (f"{len(solutions)} digit maps give {len(votes)} answers"
                                            + (f", {unwritable} unwritable" if unwritable else ""))
    return Solution(ans, status, finish(lines, ans), CATEGORY, subtype, reason, f"{mode} {op}")


def _completions(s2d: dict, symbols: str):
    """s2d extended in every injective way to the query's symbols the examples never fixed."""
    new = [c for c in dict.fromkeys(symbols) if c not in s2d]
    free = [d for d in "0123456789" if d not in s2d.values()]
    if len(new) > len(free):
        return
    for digits in permutations(free, len(new)):
        yield {**s2d, **dict(zip(new, digits))}


def _encode_answer(op_neg, q, mode, s2d):
    op, neg = op_neg
    x, sym, y = q
    if any(c not in s2d or not s2d[c].isdigit() for c in x + y):
        return None
    val = compute(op, "".join(s2d[c] for c in x), "".join(s2d[c] for c in y), mode, neg, sym)
    d2s = {v: k for k, v in s2d.items()}
    if neg == "op":
        d2s["-"] = sym
    out = [d2s.get(ch) for ch in val]
    return None if None in out else "".join(out)


def _reduce(domains, rounds: int = 8):
    """Arc consistency, cheaply: an operator keeps only meanings that fit all its examples, and a
    candidate survives only if every other example sharing symbols (or the operator) has a
    candidate agreeing with it on them. Revises against changed examples only, at most `rounds`."""
    domains = [(sym, s, list(c)) for sym, s, c in domains]
    links = {}  # (i, j) -> (getter on i's digits, getter on j's digits, same operator)
    for i, (sym_i, s_i, _) in enumerate(domains):
        for j, (sym_j, s_j, _) in enumerate(domains):
            shared = sorted({c for c in s_i if c != sym_i and c in s_j and c != sym_j})
            if i != j and (shared or sym_i == sym_j):
                gi = itemgetter(*[s_i.index(c) for c in shared]) if shared else (lambda d: ())
                gj = itemgetter(*[s_j.index(c) for c in shared]) if shared else (lambda d: ())
                links[(i, j)] = (gi, gj, sym_i == sym_j)
    dirty = set(range(len(domains)))
    for _ in range(rounds):
        if not dirty:
            break
        changed = set()
        keysets = {}
        for (i, j), (gi, gj, same_op) in links.items():
            if j not in dirty:
                continue
            if (i, j) not in keysets:
                keysets[(i, j)] = {(m if same_op else None, gj(d)) for m, d in domains[j][2]}
            keys = keysets[(i, j)]
            c_i = domains[i][2]
            kept = [(m, d) for m, d in c_i if (m if same_op else None, gi(d)) in keys]
            if len(kept) < len(c_i):
                domains[i] = (domains[i][0], domains[i][1], kept)
                changed.add(i)
        dirty = changed
    return domains


def _order(domains):
    """Join order and indexes. Smallest domain first, then always the example with the fewest
    symbols not yet seen (its operator already seen counts as known), ties by domain size. Each
    example's candidates are indexed by the digits of its symbols bound earlier (and its operator's
    meaning if bound earlier), so the search only ever visits consistent candidates."""
    rest, out, seen, seen_ops = list(domains), [], set(), set()
    while rest:
        sym, s, cands = min(rest, key=lambda t: (len(set(t[1]) - seen) + (t[0] not in seen_ops), len(t[2])))
        rest.remove((sym, s, cands))
        pos = [j for j, c in enumerate(s) if c in seen and c != sym]
        use_op = sym in seen_ops
        index: dict = {}
        for meaning, digits in cands:
            index.setdefault((meaning if use_op else None, tuple(digits[j] for j in pos)), []).append((meaning, digits))
        out.append((sym, s, pos, use_op, index))
        seen |= {c for c in s if c != sym}
        seen_ops.add(sym)
    return out


def _join(domains, i, s2d, d2s, ops, mode, solutions, cap, state):
    """Depth-first join of the examples' local (meaning, digits) candidates into one injective map;
    stops at `cap` solutions or after state['budget'] candidate checks."""
    if len(solutions) >= cap or state["nodes"] >= state["budget"]:
        return
    if i == len(domains):
        solutions.append((mode, dict(s2d), dict(ops)))
        return
    sym, s, pos, use_op, index = domains[i]
    key = (ops[sym] if use_op else None, tuple(s2d[s[j]] for j in pos))
    for meaning, digits in index.get(key, ()):
        state["nodes"] += 1
        added, ok = [], True
        for c, dg in zip(s, digits):
            if dg == "\x00" or c in s2d:
                continue
            if dg in d2s:
                ok = d2s[dg] == c
                if not ok:
                    break
                continue
            s2d[c], d2s[dg] = dg, c
            added.append(c)
        if ok:
            new_op = sym not in ops
            ops[sym] = meaning
            _join(domains, i + 1, s2d, d2s, ops, mode, solutions, cap, state)
            if new_op:
                del ops[sym]
        for c in added:
            del d2s[s2d.pop(c)]
        if len(solutions) >= cap or state["nodes"] >= state["budget"]:
            return


# ---------------------------------------------------------------- entry points

def parse(prompt: str):
    return equation_parts(prompt)


def solve(prompt: str) -> Solution:
    from .classify import equation_subtype

    examples, query = equation_parts(prompt)
    subtype = equation_subtype(prompt)
    if not query:
        return undetermined(CATEGORY, "no query found", subtype)
    if not examples:
        return undetermined(CATEGORY, "no examples found", subtype)
    if subtype.startswith("numeric"):
        return solve_numeric(examples, query, subtype)
    return solve_symbolic(examples, query, subtype)


def make_prompt(examples: list[tuple[str, str]], query: str) -> str:
    lines = [HEADER] + [f"{lhs} = {rhs}" for lhs, rhs in examples]
    lines.append(f"Now, determine the result for: {query}")
    return "\n".join(lines)


def generate_one(rng: random.Random, n_examples: int = 5, n_operators: int = 3, symbolic: float = 0.0,
                 guess: float = 0.0, ops: str = "all", neg: str = "op", **_):
    """(prompt, answer, subtype). `symbolic`/`guess`: probability of that kind of puzzle;
    `ops`: 'simple' (a+b, a-b, b-a, a*b, ab) or 'all' (OPS); `neg`: 'op', '-' or 'random'
    (symbolic puzzles always write a negative sign as the operator symbol)."""
    names = ["a+b", "a-b", "b-a", "a*b", "ab"] if ops == "simple" else OP_NAMES
    is_sym = rng.random() < float(symbolic)
    is_guess = rng.random() < float(guess)
    k = max(1, min(int(n_operators), len(names)))
    mode = rng.choice(MODES)
    neg = rng.choice(NEGS) if neg == "random" else neg
    if is_sym:
        digits = rng.sample(SYMBOL_POOL, 10)
        operators = rng.sample([c for c in SYMBOL_POOL if c not in digits], k + 1)
        neg = "op"
    else:
        operators = rng.sample(OPERATOR_POOL, k + 1)
    meaning = dict(zip(operators, rng.sample(names, k) + [rng.choice(names)]))
    shown, hidden = operators[:k], operators[k]
    enc = (lambda s: "".join(digits[int(ch)] if ch.isdigit() else ch for ch in s)) if is_sym else (lambda s: s)

    def one(sym):
        x, y = str(rng.randint(10, 99)), str(rng.randint(10, 99))
        return enc(x) + sym + enc(y), enc(compute(meaning[sym], x, y, mode, neg, sym))

    n = max(1, int(n_examples))
    ex_syms = (shown * n)[:n] if n >= k else rng.sample(shown, n)
    rng.shuffle(ex_syms)
    q_sym = hidden if is_guess else rng.choice(sorted(set(ex_syms)))
    examples = [one(s) for s in ex_syms]
    query, answer = one(q_sym)
    kind = ("symbolic" if is_sym else "numeric") + ("_guess" if is_guess else "_deduce")
    return make_prompt(examples, query), answer, kind
