"""Equation transformation puzzles, the solvers and the generator: two operands around a hidden operator (`34/44 = 1`).

One rule model (`eqrules`) for the numeric and the symbolic solver and the generator: a `mode` per puzzle (plain, or
reversed: operands and result read with their digits reversed) and a `meaning` per operator, each from its own family
(add, mul, concat, mod, sub with its marker forms). Symbolic puzzles are the same model behind a digit substitution.
Priors (`learn_priors`, from a batch's prompts, never an answer; DEFAULT_COUNTS otherwise) weigh every reading that
fits the examples; the answer with the most weight wins. The numeric solver enumerates the fitting readings per
mode; the symbolic one joins each example's candidates into symbol->digit maps, up to counted (never timed) caps,
so a rerun stops at the same place anywhere. `solved` only when every fitting hypothesis gives the same answer and
the search was complete; else `ambiguous` (best-weighted answer) or `undetermined`. `method` names the query
operator's mode and meaning. The meanings, the relaxations, the traces and the caps: docs/internals.md,
lab.puzzles.eqsolve.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from functools import lru_cache
from itertools import permutations, product
from operator import itemgetter

from .common import Solution, finish, has_key, missing, undetermined
from .eqrules import (FAMILIES, FAMILY, HEADER, KEY, MEANINGS, MODES, compute, equation_parts, equation_subtype, family,
                      meanings_for, operand_lines)

NAME = "equation_transformation"

OPERATOR_POOL = "+-*/|\\&%^#@<>:;!?~{}[]()$\"'`"
SYMBOL_POOL = "!\"#$%&'()*+,-./:;<>?@[\\]^_`{|}~"  # the backtick too: it is a symbol in the real rows


# ---------------------------------------------------------------- priors

def sym_class(sym: str) -> str:
    return sym if sym in "+-*" else "other"


USUAL = {"+": "add", "-": "sub", "*": "mul"}


def unseen_family_weight(fam: str, sym: str) -> float:
    """Prior of an operator that no example shows having family `fam`: its usual meaning for
    `+ - *`, otherwise add / multiply / subtract about evenly; concatenation and mod rarely.
    Hand-set: no example shows such an operator, so no prompt can teach these shares."""
    rare = {"concat": 0.03, "mod": 0.03}
    if fam in rare:
        return rare[fam]
    if sym in USUAL:
        return 0.7 if USUAL[sym] == fam else 0.12
    return 0.31


class Prior:
    """P(mode), P(family | operator symbol class) and P(meaning | family), from counts of
    deducible modes, families (by symbol class) and meanings (`learn_priors`). Families by class
    are smoothed toward the all-class shares (pseudo-count `k`); meanings within a family are
    pooled over classes (+0.5 each) and normalised over the meanings the mode and symbol allow."""

    def __init__(self, modes: Counter, families: Counter, meanings: Counter, k: float = 4.0):
        self.modes, self.fam_by_class, self.var, self.k = Counter(modes), Counter(families), Counter(meanings), k
        self.fam = Counter()
        for (_, f), c in self.fam_by_class.items():
            self.fam[f] += c
        n = sum(self.fam.values())
        self.base = {f: (self.fam[f] + 1) / (n + len(FAMILIES)) for f in FAMILIES}
        nm = sum(self.modes[m] for m in MODES)
        self.mode_p = {m: (self.modes[m] + 1) / (nm + 2) for m in MODES}
        self._cache: dict = {}

    def variant(self, m: str, sym: str, mode: str) -> float:
        allowed = [v for v in FAMILIES[FAMILY[m]] if v in meanings_for(mode, sym)]
        return (self.var[m] + 0.5) / sum(self.var[v] + 0.5 for v in allowed)

    def meaning(self, m: str, sym: str, mode: str) -> float:
        """P(meaning) of an operator the examples show."""
        key = (m, sym_class(sym), mode, sym == "-")
        if key not in self._cache:
            cls, fam = key[1], FAMILY[m]
            n = sum(c for (k, _), c in self.fam_by_class.items() if k == cls)
            p_fam = (self.fam_by_class[(cls, fam)] + self.k * self.base[fam]) / (n + self.k)
            self._cache[key] = p_fam * self.variant(m, sym, mode)
        return self._cache[key]

    def unseen(self, m: str, sym: str, mode: str) -> float:
        """P(meaning) of an operator no example shows (before ruling out used families)."""
        return unseen_family_weight(FAMILY[m], sym) * self.variant(m, sym, mode)

    def mode(self, mode: str) -> float:
        return self.mode_p[mode]

    def as_dict(self) -> dict:
        """The counts, in DEFAULT_COUNTS' shape."""
        families = {f"{c} {f}": n for (c, f), n in sorted(self.fam_by_class.items())}
        return {"modes": dict(self.modes), "families": families, "meanings": dict(sorted(self.var.items()))}


# Counts learn_priors gives on the development sample's prompts (its examples, never its answers);
# used when a puzzle is solved on its own. solve_frame learns its batch's own counts instead.
DEFAULT_COUNTS = {
    "modes": {"plain": 46, "reversed": 101},
    "families": {
        "* add": 7, "* concat": 14, "* mul": 37, "* sub": 2, "+ add": 46, "+ concat": 9, "+ mul": 3, "+ sub": 3,
        "- add": 8, "- concat": 1, "- mod": 5, "- mul": 2, "- sub": 31, "other add": 45, "other concat": 20,
        "other mod": 4, "other mul": 48, "other sub": 39,
    },
    "meanings": {
        "a*b": 41, "a*b+1": 17, "a*b-1": 32, "a+b": 63, "a+b+1": 20, "a+b-1": 23, "a-b": 7, "ab": 36, "b-a end": 3,
        "ba": 4, "mod": 9, "|a-b|": 6, "±|a-b|": 4, "±|a-b| end": 1,
    },
}


def default_prior() -> Prior:
    families = Counter({tuple(k.split(" ", 1)): v for k, v in DEFAULT_COUNTS["families"].items()})
    return Prior(Counter(DEFAULT_COUNTS["modes"]), families, Counter(DEFAULT_COUNTS["meanings"]))


# ---------------------------------------------------------------- numeric

def split_numeric(lhs: str):
    """(x, operator, y) for digits-operator-digits (any number of digits), else None."""
    m = re.fullmatch(r"(\d+)(\D)(\d+)", lhs.strip())
    return m.groups() if m else None


def by_operator(examples) -> dict:
    by_op: dict[str, list] = {}
    for lhs, rhs in examples:
        p = split_numeric(lhs)
        if p:
            by_op.setdefault(p[1], []).append((p[0], p[2], rhs.strip()))
    return by_op


def numeric_hypotheses(by_op: dict, prior: Prior):
    """[(weight, mode, {operator: meaning})] of every joint reading that fits: one mode, a fitting
    meaning per operator, distinct families. Where none exists, the readings that leave out the
    fewest operators (rules outside the model), then share the fewest families, are kept."""
    out = []
    for mode in MODES:
        fits = {sym: [m for m in meanings_for(mode, sym) if all(compute(m, x, y, mode, sym) == r for x, y, r in exs)]
                for sym, exs in by_op.items()}
        syms = [s for s in fits if fits[s]]
        for combo in product(*(fits[s] for s in syms)):
            w = prior.mode(mode)
            for s, m in zip(syms, combo):
                w *= prior.meaning(m, s, mode)
            cost = (len(fits) - len(syms), len(combo) - len({FAMILY[m] for m in combo}))
            out.append((cost, w, mode, dict(zip(syms, combo))))
    best = min((h[0] for h in out), default=None)
    return [h[1:] for h in out if h[0] == best]


def query_readings(hyps, sym: str, prior: Prior):
    """[(weight, mode, meaning, guessed)] for the query operator over the hypotheses: its own meaning
    where the examples show it, else each meaning of an unused family (prior, renormalised)."""
    out = []
    for w, mode, ops in hyps:
        if sym in ops:
            out.append((w, mode, ops[sym], False))
            continue
        used = {FAMILY[m] for m in ops.values()}
        free = [m for m in meanings_for(mode, sym) if FAMILY[m] not in used]
        z = sum(prior.unseen(m, sym, mode) for m in free)
        out += [(w * prior.unseen(m, sym, mode) / z, mode, m, True) for m in free]
    return out


def solve_numeric(examples, query, subtype, prior: Prior | None = None) -> Solution:
    prior = prior or default_prior()
    q = split_numeric(query)
    if not q:
        return undetermined(NAME, f"query {query!r} is not two numbers around an operator", subtype)
    x, sym, y = q
    by_op = by_operator(examples)
    if not by_op:
        return undetermined(NAME, "no parseable numeric examples", subtype)
    seen = sym in by_op
    hyps = numeric_hypotheses(by_op, prior)
    if seen:
        hyps = [h for h in hyps if sym in h[2]]
    votes, best = Counter(), {}
    for w, mode, m, _ in query_readings(hyps, sym, prior):
        ans = compute(m, x, y, mode, sym)
        if ans is None:
            continue
        votes[ans] += w
        if w > best.get(ans, (0,))[0]:
            best[ans] = (w, mode, m)
    if not votes:
        return undetermined(NAME, f"no known rule fits the examples of {sym!r}", subtype)
    ans = max(votes, key=votes.get)
    _, mode, m = best[ans]
    written = compute(m, x, y, mode, sym)
    if seen:
        n = len(by_op[sym])
        head = f"{sym} means {m} (fits {n} example{'s' if n > 1 else ''})"
    else:
        head = f"{sym} never appears in the examples: guess {sym} means {m}"
    lines = [f"mode: {mode}", head, *operand_lines(x, sym, y, m, mode), f"written: {written}", f"answer: {ans}"]
    method = f"{mode} {m}"
    if not seen:
        sol = undetermined(NAME, f"operator {sym!r} never appears in the examples", subtype, ans, lines)
        sol.method = method
        return sol
    status = "solved" if len(votes) == 1 else "ambiguous"
    share = votes[ans] / sum(votes.values())
    reason = "" if status == "solved" else f"{len(votes)} answers fit; best has {share:.2f} of the prior weight"
    return Solution(ans, status, finish(lines, ans), NAME, subtype, reason, method)


def learn_priors(prompts, minimum: int = 50) -> Prior:
    """Counts of deducible modes, families and meanings over the numeric equation prompts' examples
    (never their answers): a puzzle's mode when only one mode fits all its operators; an operator's
    family (by symbol class), and its meaning, when every fitting reading of the puzzle gives it
    the same one. Families and meanings are counted apart: a subtraction's marker form is often
    left open by examples that still rule out every other family. A batch with fewer than
    `minimum` deducible families (a handful of puzzles, or symbolic ones only) gets the default."""
    flat = Prior(Counter(), Counter(), Counter())
    modes, families, meanings = Counter(), Counter(), Counter()
    for p in prompts:
        if not has_key(p, KEY):
            continue
        examples, _ = equation_parts(p)
        if not examples or not all(split_numeric(lhs) for lhs, _ in examples):
            continue
        by_op = by_operator(examples)
        hyps = [h for h in numeric_hypotheses(by_op, flat) if len(h[2]) == len(by_op)
                and len({FAMILY[m] for m in h[2].values()}) == len(by_op)]
        if not hyps:
            continue
        hmodes = {h[1] for h in hyps}
        if len(hmodes) == 1:
            modes[hmodes.pop()] += 1
        for sym in by_op:
            ms = {h[2][sym] for h in hyps}
            fams = {FAMILY[m] for m in ms}
            if len(fams) == 1:
                families[(sym_class(sym), fams.pop())] += 1
            if len({(h[1], h[2][sym]) for h in hyps}) == 1:
                meanings[ms.pop()] += 1
    if sum(families.values()) < minimum:
        return default_prior()
    return Prior(modes, families, meanings)


# ---------------------------------------------------------------- symbolic

def split_lhs(lhs: str):
    """(x, operator, y) for a 5-character left side, else None."""
    lhs = lhs.strip()
    return (lhs[:2], lhs[2], lhs[3:]) if len(lhs) == 5 else None


def canon(s, op_mark=None) -> tuple:
    """The equality pattern of a string: each char -> index of its first occurrence (op_mark kept)."""
    first: dict = {}
    return tuple("OP" if ch == op_mark else first.setdefault(ch, len(first)) for ch in s)


@lru_cache(maxsize=None)
def pattern_table(meaning: str, mode: str) -> dict:
    """Equality pattern of (x digits + y digits + written result) -> [digit string], all 00..99 pairs.
    The marker is '\x00' (pattern token OP)."""
    table: dict = {}
    for i in range(100):
        for j in range(100):
            x, y = f"{i:02d}", f"{j:02d}"
            r = compute(meaning, x, y, mode, "\x00")
            if r is not None:
                d = x + y + r
                table.setdefault(canon(d, "\x00"), []).append(d)
    return table


# The symbolic search's work per puzzle, counted, not clocked, so the answer and the trace are the same on every
# rerun: the join's nodes (candidates tried), then the votes (a completion of a map under one reading of the query).
JOIN_CAP = 1_000_000
VOTE_CAP = 50_000


def solve_symbolic(examples, query, subtype, prior: Prior | None = None, cap: int = 5_000,
                   join_cap: int = JOIN_CAP, vote_cap: int = VOTE_CAP) -> Solution:
    prior = prior or default_prior()
    q = split_lhs(query)
    if not q:
        return undetermined(NAME, f"query {query!r} is not 5 symbols", subtype)
    exs = [(p[0], p[1], p[2], rhs.strip()) for lhs, rhs in examples if (p := split_lhs(lhs))]
    if not exs:
        return undetermined(NAME, "no parseable symbolic examples", subtype)
    seen = q[1] in {e[1] for e in exs}
    state = {"work": 0, "budget": join_cap, "stopped": False}
    solutions = _symbolic_solutions(exs, cap, state)
    if not solutions:  # two operators of one family (rare in the real file): allow it
        solutions = _symbolic_solutions(exs, cap, state, repeat=True)
    if not solutions and seen:  # another operator's rule is outside the model: its examples only
        solutions = _symbolic_solutions([e for e in exs if e[1] == q[1]], cap, state)
    if not solutions:
        reason = "symbolic: no digit map and known rules fit" + (" (work cap)" if state["stopped"] else "")
        return undetermined(NAME, reason, subtype)
    votes, first, unwritable = Counter(), {}, 0
    votes_cast = 0
    for n, (mode, s2d, ops) in enumerate(solutions):
        if n and votes_cast >= vote_cap:
            state["stopped"] = True  # the votes so far decide
            break
        w = prior.mode(mode)
        for s, m in ops.items():
            w *= prior.meaning(m, s, mode)
        readings = query_readings([(w, mode, ops)], q[1], prior)
        comps = list(_completions(s2d, q[0] + q[2]))
        votes_cast += max(len(comps) * len(readings), 1)
        for full in comps:
            d2s = {v: k for k, v in full.items()}
            for wq, _, m, _ in readings:
                ans = _encode_answer(m, q, mode, full, d2s)
                if ans is None:
                    unwritable += 1
                    continue
                votes[ans] += wq / len(comps)
                first.setdefault(ans, (mode, full, m, ops))
    if not votes:
        return undetermined(NAME, "symbolic: query symbols or result digits not covered by the examples", subtype)
    ans = max(votes, key=votes.get)
    mode, s2d, m, ops = first[ans]
    x, sym, y = q
    d = lambda s: "".join(s2d[c] for c in s)  # noqa: E731
    used = list(dict.fromkeys(x + y + "".join(ch for ch in ans if ch in s2d)))
    lines = ["digits: " + " ".join(f"{c}={s2d[c]}" for c in used), f"mode: {mode}",
             f"{sym} means {m}" + ("" if seen else " (guess)"),
             f"{query} -> {d(x)}{sym}{d(y)}", *operand_lines(d(x), sym, d(y), m, mode)[1:],
             f"written: {compute(m, d(x), d(y), mode, sym)}", f"answer: {ans}"]
    method = f"{mode} {m}"
    capped = " (search stopped at the work cap)" if state["stopped"] else (
        " (search stopped at the solution cap)" if len(solutions) >= cap else "")
    if not seen:
        sol = undetermined(NAME, f"operator {sym!r} never appears in the examples{capped}", subtype, ans, lines)
        sol.method = method
        return sol
    status = "solved" if len(votes) == 1 and not unwritable and not capped else "ambiguous"
    reason = "" if status == "solved" else (f"{len(solutions)} digit maps give {len(votes)} answers"
                                            + (f", {unwritable} unwritable" if unwritable else "") + capped)
    return Solution(ans, status, finish(lines, ans), NAME, subtype, reason, method,
                    {"mode": mode, "s2d": s2d, "ops": ops, "meaning": m})


def _symbolic_solutions(exs, cap, state, repeat: bool = False):
    """[(mode, symbol->digit, {operator: meaning})] for both modes, as the join finds them."""
    solutions: list = []
    op_chars = {e[1] for e in exs}
    for mode in MODES:
        domains = []
        for x, sym, y, rhs in exs:
            s = x + y + rhs
            if any(c in op_chars for c in x + y) or any(c in op_chars and c != sym for c in rhs):
                domains.append((sym, s, []))
                continue
            key = canon(s, sym)
            domains.append((sym, s, [(m, dg) for m in meanings_for(mode, sym)
                                     for dg in pattern_table(m, mode).get(key, ())]))
        if any(not c for _, _, c in domains):
            continue
        domains = _order(_reduce(domains))
        found: list = []
        state["repeat"] = repeat
        _join(domains, 0, {}, {}, {}, mode, found, cap, state)
        solutions += found
    return solutions


def _completions(s2d: dict, symbols: str):
    """s2d extended in every injective way to the query's symbols the examples never fixed."""
    new = [c for c in dict.fromkeys(symbols) if c not in s2d]
    free = [d for d in "0123456789" if d not in s2d.values()]
    if len(new) > len(free):
        return
    for digits in permutations(free, len(new)):
        yield {**s2d, **dict(zip(new, digits))}


def _encode_answer(meaning, q, mode, s2d, d2s):
    x, sym, y = q
    if any(c not in s2d for c in x + y):
        return None
    val = _compute_cached(meaning, "".join(s2d[c] for c in x), "".join(s2d[c] for c in y), mode, sym)
    if val is None:
        return None
    out = [ch if ch == sym else d2s.get(ch) for ch in val]
    return None if None in out else "".join(out)


_compute_cached = lru_cache(maxsize=1 << 16)(compute)


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
    """Depth-first join of the examples' local (meaning, digits) candidates into one injective map,
    operators' families distinct; stops at `cap` solutions or past state['budget'] units of work (state['stopped'])."""
    if len(solutions) >= cap or state["stopped"]:
        return
    if i == len(domains):
        solutions.append((mode, dict(s2d), dict(ops)))
        return
    sym, s, pos, use_op, index = domains[i]
    key = (ops[sym] if use_op else None, tuple(s2d[s[j]] for j in pos))
    for meaning, digits in index.get(key, ()):
        state["work"] += 1
        if state["work"] > state["budget"]:
            state["stopped"] = True
            return
        new_op = sym not in ops
        if new_op and not state["repeat"] and FAMILY[meaning] in {FAMILY[m] for m in ops.values()}:
            continue
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
            ops[sym] = meaning
            _join(domains, i + 1, s2d, d2s, ops, mode, solutions, cap, state)
            if new_op:
                del ops[sym]
        for c in added:
            del d2s[s2d.pop(c)]
        if len(solutions) >= cap or state["stopped"]:
            return


# ---------------------------------------------------------------- tables

def family_table(out):
    """Equation puzzles of a `solve_frame` result by kind (numeric / symbolic), the query operator's
    family and the mode: n, solved, and accuracy when it has gold answers. Puzzles no reading fits
    (no method) count as family 'none'."""
    import pandas as pd

    eqs = out[out["category"] == NAME].copy()
    cols = ["kind", "family", "mode", "n", "solved"] + (["accuracy"] if "correct" in out else [])
    if eqs.empty:
        return pd.DataFrame(columns=cols)
    eqs["kind"] = eqs["subtype"].str.split("_").str[0] + eqs["subtype"].str.endswith("guess").map(
        {True: " (operator unseen)", False: ""})
    eqs["mode"] = [m.split(" ", 1)[0] or "none" for m in eqs["method"]]
    eqs["family"] = [family(m.split(" ", 1)[-1]) or "none" for m in eqs["method"]]
    g = eqs.groupby(["kind", "family", "mode"])
    table = g.size().rename("n").to_frame()
    table["solved"] = g["status"].apply(lambda s: int((s == "solved").sum()))
    if "correct" in eqs:
        table["accuracy"] = g["correct"].mean().round(4)
    return table.reset_index()[cols]


# ---------------------------------------------------------------- entry points

def solve(prompt: str, prior: Prior | None = None) -> Solution:
    examples, query = equation_parts(prompt)
    subtype = equation_subtype(prompt)
    if (none := missing(NAME, examples, query, "no query found", "no examples found", subtype)):
        return none
    if subtype.startswith("numeric"):
        return solve_numeric(examples, query, subtype, prior)
    return solve_symbolic(examples, query, subtype, prior)


def make_prompt(examples: list[tuple[str, str]], query: str) -> str:
    lines = [HEADER] + [f"{lhs} = {rhs}" for lhs, rhs in examples]
    lines.append(f"Now, determine the result for: {query}")
    return "\n".join(lines)


SIMPLE = ["a+b", "a*b", "ab", "a-b", "mod"]


def generate_one(rng: random.Random, n_examples: int = 5, n_operators: int = 3, symbolic: float = 0.0,
                 guess: float = 0.0, ops: str = "all", marker: str = "any", mode: str = "any", meaning: str = "any"):
    """(prompt, answer, subtype). `symbolic`/`guess`: probability of that kind of puzzle; `ops`:
    'simple' (one meaning per family: a+b, a*b, ab, a-b, mod) or 'all' (every meaning); `marker`: the
    subtraction meaning ('any', or one of SUB, e.g. 'b-a end'); `mode`: 'any', 'plain' or 'reversed';
    `meaning`: 'any', or the query operator's meaning. Every operator gets a meaning from its own
    family; a guess puzzle's query operator too (a family no shown operator has)."""
    is_sym = rng.random() < float(symbolic)
    is_guess = rng.random() < float(guess)
    mode = rng.choice(MODES) if mode == "any" else mode
    if meaning != "any" and meaning not in meanings_for(mode, "+"):
        raise ValueError(f"equation meaning {meaning!r} is not one of {MEANINGS} in {mode} mode")
    k = max(1, min(int(n_operators), len(FAMILIES) - 1))
    digits = rng.sample(SYMBOL_POOL, 10) if is_sym else None
    pool = [c for c in (SYMBOL_POOL if is_sym else OPERATOR_POOL) if not is_sym or c not in digits]
    if meaning.endswith(" end") and "-" in pool:
        pool.remove("-")  # a '-' operator never writes its marker at the end
    operators = rng.sample(pool, k + 1)
    shown, hidden = operators[:k], operators[k]
    n = max(1, int(n_examples))
    ex_syms = (shown * n)[:n] if n >= k else rng.sample(shown, n)
    rng.shuffle(ex_syms)
    q_sym = hidden if is_guess else rng.choice(sorted(set(ex_syms)))
    fams = rng.sample(list(FAMILIES), k + 1)
    if meaning != "any":  # the query's operator gets that meaning's family
        i, f = operators.index(q_sym), FAMILY[meaning]
        if f in fams:
            j = fams.index(f)
            fams[i], fams[j] = fams[j], fams[i]
        fams[i] = f
    rule = {}
    for sym, fam in zip(operators, fams):
        choices = [m for m in FAMILIES[fam] if m in meanings_for(mode, sym)]
        if ops == "simple":
            choices = [m for m in choices if m in SIMPLE]
        if fam == "sub" and marker in choices:
            choices = [marker]
        rule[sym] = meaning if sym == q_sym and meaning != "any" else rng.choice(choices)
    enc = (lambda s: "".join(digits[int(ch)] if ch.isdigit() else ch for ch in s)) if is_sym else (lambda s: s)

    def one(sym):
        while True:
            x, y = str(rng.randint(10, 99)), str(rng.randint(10, 99))
            r = compute(rule[sym], x, y, mode, sym)
            if r is not None:
                return enc(x) + sym + enc(y), enc(r)

    examples = [one(s) for s in ex_syms]
    query, answer = one(q_sym)
    kind = ("symbolic" if is_sym else "numeric") + ("_guess" if is_guess else "_deduce")
    return make_prompt(examples, query), answer, kind
