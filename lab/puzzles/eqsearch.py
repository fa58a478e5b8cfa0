"""Symbolic equations searched on the page: a signature catalog and a bounded, written depth-first search.

The catalog (`catalog()`) comes from the rule space, never from a file's rows: every reading of `equations` (mode x
meaning) applied to every operand pair 00..99, each example written as its signature (the symbol-repetition pattern
of `AB op CD = out`), mapped to its candidate readings: one finite table a model can recall, the same for every
puzzle. `search_lines` writes each example's signature and readings, then a depth-first search whose every line is
local (`cands`, `try`, `assume`, `fit`, `rest`, `back`). A puzzle whose search gives no single answer or exceeds
`MAX_CANDS` / `MAX_CHARS` gets the stated fallback trace (`equations._symbolic`). `Search` holds the state both the
writer and the checker use, so they agree by construction; `OPS` and `BRANCHES` are its lines for `check.Replay`.
The lines, the order of examples and what it simplifies: docs/internals.md, lab.puzzles.eqsearch.
"""

from __future__ import annotations

from functools import lru_cache

from .check import Fail
from .eqrules import FAMILY, MEANINGS, MODES, compute, meanings_for

MAX_CANDS = 150     # largest candidate list a branch point may write
MAX_CHARS = 11_500  # trace characters before the search gives up (the real tokenizer: see lab/puzzles/README.md)
LETTERS = "ABCDEFGHIJKLMN"


class Unfit(Exception):
    """The written search cannot give this puzzle's answer within its bounds."""


def signature(x: str, sym: str, y: str, r: str) -> str:
    """`ABoCD=EFC`: the symbol-repetition pattern of an example (operator `o`, or `-` for `-`)."""
    o = "-" if sym == "-" else "o"
    first: dict = {}

    def enc(s):
        return "".join(o if ch == sym else LETTERS[first.setdefault(ch, len(first))] for ch in s)
    return f"{enc(x)}{o}{enc(y)}={enc(r)}"


def code(mode: str, meaning: str) -> str:
    return f"{mode[0]}:{meaning.replace(' ', '_')}"


def uncode(c: str) -> tuple[str, str]:
    m, meaning = c.split(":", 1)
    return {"p": "plain", "r": "reversed"}[m], meaning.replace("_", " ")


@lru_cache(maxsize=None)
def catalog() -> dict:
    """signature -> [(mode, meaning, operand digits, result digits)], over every reading of the rule
    space and every operand pair 00..99, for an operator other than `-` (pattern `o`) and for `-`
    (the same entries less the markers at the end, which a `-` never writes)."""
    table: dict = {}
    for mode in MODES:
        for meaning in meanings_for(mode, "o"):
            for i in range(100):
                for j in range(100):
                    x, y = f"{i:02d}", f"{j:02d}"
                    r = compute(meaning, x, y, mode, "o")
                    if r is not None:
                        table.setdefault(_digit_signature(x, "o", y, r), []).append((mode, meaning, x + y, r))
    for sig, entries in list(table.items()):
        minus = [(m, mn, xy, r.replace("o", "-")) for m, mn, xy, r in entries if not mn.endswith(" end")]
        if minus:
            table[sig.replace("o", "-")] = minus
    return table


def _digit_signature(x, sym, y, r):
    first: dict = {}

    def enc(s):
        return "".join(sym if ch == sym else LETTERS[first.setdefault(ch, len(first))] for ch in s)
    return f"{enc(x)}{sym}{enc(y)}={enc(r)}"


def readings(sig: str) -> list[str]:
    """The readings (codes) that have candidates for a signature, in mode then `MEANINGS` order."""
    have = {(m, mn) for m, mn, _, _ in catalog().get(sig, ())}
    return [code(m, mn) for m in MODES for mn in MEANINGS if (m, mn) in have]


class Search:
    """Bindings (symbol -> digit), mode, operator meanings and the stack of open branches."""

    def __init__(self, symbols: dict | None = None):
        self.s2d = symbols if symbols is not None else {}
        self.mode: str | None = None
        self.ops: dict[str, str] = {}
        self.stack: list = []
        self.points: dict = {}  # open depth -> the example of the last `cands` line written at that depth

    def push(self):
        self.stack.append((dict(self.s2d), self.mode, dict(self.ops)))

    def back(self):
        if not self.stack:
            raise ValueError("back with no open branch")
        s2d, self.mode, self.ops = self.stack.pop()
        self.s2d.clear()
        self.s2d.update(s2d)

    def family_free(self, sym: str, meaning: str) -> bool:
        if sym in self.ops:
            return self.ops[sym] == meaning
        return FAMILY[meaning] not in {FAMILY[m] for s, m in self.ops.items() if s != sym}

    def fits(self, symbols: str, digits: str, sym: str) -> bool:
        """Whether digits can stand for symbols under the bindings (the operator matches itself)."""
        if len(symbols) != len(digits):
            return False
        new: dict = {}
        used = {d: c for c, d in self.s2d.items()}
        for c, d in zip(symbols, digits):
            if c == sym or d == sym:
                if c != d:
                    return False
                continue
            if not d.isdigit():
                return False
            want = self.s2d.get(c, new.get(c))
            if want is not None:
                if want != d:
                    return False
                continue
            if used.get(d, c) != c or d in new.values():
                return False
            new[c] = d
        return True

    def bind(self, symbols: str, digits: str, sym: str):
        for c, d in zip(symbols, digits):
            if c != sym:
                self.s2d[c] = d

    def candidates(self, x: str, sym: str, y: str, r: str) -> list[str]:
        """The catalog's candidates for an example that agree with the state, as `READING:OPS:RESULT`."""
        out = []
        for mode, meaning, xy, res in catalog().get(signature(x, sym, y, r), ()):
            if self.mode not in (None, mode) or not self.family_free(sym, meaning):
                continue
            if meaning not in meanings_for(mode, sym):
                continue
            written = res.replace("o", sym) if sym != "-" else res
            if self.fits(x + y + r, xy + written, sym):
                out.append(f"{code(mode, meaning)}:{xy}:{res}")
        return out

    def take(self, x: str, sym: str, y: str, r: str, cand: str):
        """Applies a listed candidate (a `try`)."""
        c, xy, res = cand.rsplit(":", 2)
        mode, meaning = uncode(c)
        written = res.replace("o", sym) if sym != "-" else res
        self.push()
        self.mode = mode
        self.ops[sym] = meaning
        self.bind(x + y + r, xy + written, sym)


def search_lines(exs, query, value, max_cands: int | None = None, max_chars: int | None = None) -> list[str]:
    """The written search for a symbolic puzzle: exs [(x, op, y, rhs)], query (x, op, y); `value(meaning, x, y, mode,
    sym, tag, lines)` appends a meaning's arithmetic lines and returns the written result (`equations._eq_value`,
    passed in: this module sits below `equations`). Raises Unfit."""
    lines: list[str] = ["note each example's signature and its catalog readings; "
                        "then search from the fewest candidates"]
    size = [len(lines[0])]

    def emit(s):
        lines.append(s)
        size[0] += len(s) + 1
        if size[0] > (max_chars or MAX_CHARS):
            raise Unfit("the written search is over its length cap")

    for n, (x, sym, y, r) in enumerate(exs, 1):
        sig = signature(x, sym, y, r)
        emit(f"ex{n}: sig {x}{sym}{y} {r} = {sig}")
        emit(f"ex{n}: readings {sig} = {' '.join(readings(sig)) or 'none'}")
    st = Search()
    answers: set = set()
    qx, qsym, qy = query

    def compute_ex(tag, x, sym, y, r):
        """Decode, compute under the operator's meaning, fit; True when the example fits."""
        dx, dy = "".join(st.s2d[c] for c in x), "".join(st.s2d[c] for c in y)
        emit(f"{tag}: decode {x} = {dx}")
        emit(f"{tag}: decode {y} = {dy}")
        sub: list[str] = []
        v = value(st.ops[sym], dx, dy, st.mode, sym, tag, sub)
        for s in sub:
            emit(s)
        if v is None:
            emit(f"note {st.ops[sym]} is undefined here")
            return False
        ok = st.fits(r, v, sym)
        emit(f"{tag}: fit {r} {v} = {'yes' if ok else 'no'}")
        if ok:
            st.bind(r, v, sym)
        return ok

    def finish_branch():
        left = [c for c in dict.fromkeys(qx + qy) if c not in st.s2d]
        free = [d for d in "0123456789" if d not in st.s2d.values()]
        if len(left) == 1 and len(free) == 1:  # nine symbols bound: the tenth takes the digit left
            emit(f"q: rest {left[0]} = {free[0]}")
            st.s2d[left[0]] = free[0]
        if qsym not in st.ops or any(c not in st.s2d for c in qx + qy):
            raise Unfit("a complete branch leaves the query's operator or a query symbol open")
        dx, dy = "".join(st.s2d[c] for c in qx), "".join(st.s2d[c] for c in qy)
        emit(f"q: decode {qx} = {dx}")
        emit(f"q: decode {qy} = {dy}")
        sub: list[str] = []
        v = value(st.ops[qsym], dx, dy, st.mode, qsym, "q", sub)
        for s in sub:
            emit(s)
        d2s = {d: c for c, d in st.s2d.items()}
        if v is None or any(ch.isdigit() and ch not in d2s for ch in v):
            raise Unfit("the query's result needs a digit no symbol stands for")
        enc = "".join(d2s.get(ch, ch) for ch in v)
        emit(f"q: encode {v} = {enc}")
        answers.add(enc)

    def dfs(pending):
        if not pending:
            finish_branch()
            return
        bound = [i for i in pending if all(c in st.s2d for c in exs[i][0] + exs[i][2])]
        ready = [i for i in bound if exs[i][1] in st.ops]
        if ready:
            i = ready[0]
            if compute_ex(f"ex{i + 1}", *exs[i]):
                dfs([j for j in pending if j != i])
            return
        if bound:
            i = bound[0]
            x, sym, y, r = exs[i]
            sig = signature(x, sym, y, r)
            for c in readings(sig):
                mode, meaning = uncode(c)
                if mode != st.mode or not st.family_free(sym, meaning):
                    continue
                emit(f"ex{i + 1}: assume {sym} {meaning.replace(' ', '_')}")
                st.push()
                st.ops[sym] = meaning
                if compute_ex(f"ex{i + 1}", x, sym, y, r):
                    dfs([j for j in pending if j != i])
                emit("back")
                st.back()
            return
        lists = {i: st.candidates(*exs[i]) for i in pending}
        i = min(pending, key=lambda j: (len(lists[j]), j))
        cands = lists[i]
        if len(cands) > (max_cands or MAX_CANDS):
            raise Unfit(f"the smallest candidate list has {len(cands)} entries")
        x, sym, y, r = exs[i]
        emit(f"ex{i + 1}: cands {x}{sym}{y} {r} = {' '.join(cands) or 'none'}")
        st.points[len(st.stack)] = (x, sym, y, r)
        for c in cands:
            emit(f"ex{i + 1}: try {c}")
            st.take(x, sym, y, r, c)
            dfs([j for j in pending if j != i])
            emit("back")
            st.back()

    dfs(list(range(len(exs))))
    if len(answers) != 1:
        raise Unfit(f"the search gives {len(answers)} answers")
    ans = answers.pop()
    emit(f"note every complete branch gives {ans}")
    emit(f"copy {ans}")
    return lines


def drills(n: int, seed: int) -> list[tuple[str, str]]:
    """(question, answer) recall drills of the catalog for a first SFT phase (`sft.phases: [drills, traces]`): n
    signatures drawn (seeded, without replacement) from those with at most `MAX_CANDS` candidates; the answer is the
    two lines a trace writes from the catalog, `readings SIG = ...` and `cands SIG = ...` (nothing bound)."""
    import random

    small = sorted(s for s, v in catalog().items() if len(v) <= MAX_CANDS)
    rng = random.Random(f"drills-{seed}")
    out = []
    for sig in rng.sample(small, min(int(n), len(small))):
        cands = " ".join(f"{code(m, mn)}:{xy}:{r}" for m, mn, xy, r in catalog()[sig])
        out.append((f"Signature catalog: the readings and candidates of {sig}",
                    f"readings {sig} = {' '.join(readings(sig))}\ncands {sig} = {cands}"))
    return out


# ---------------------------------------------------------------- the search's lines for the checker (check.Replay)

def _state(rp) -> Search:
    """The search state of one replay, sharing its symbol map (`let` lines)."""
    if getattr(rp, "eq_search", None) is None:
        rp.eq_search = Search(rp.symbols)
    return rp.eq_search


def _op(rp, op, args):
    """`sig LHS RHS`, `readings SIG`, `cands LHS RHS` (recomputed from the catalog and the state),
    `fit RHS DIGITS` (yes binds the result's new symbols)."""
    st = _state(rp)
    if op == "readings":
        (sig,) = args
        return " ".join(readings(sig)) or "none"
    if op == "rest":
        (c,) = args
        free = [d for d in "0123456789" if d not in st.s2d.values()]
        if c in st.s2d or len(free) != 1 or not rp.available(c):
            raise Fail(f"{c!r} is bound, or more than one digit is left")
        st.s2d[c] = free[0]
        return free[0]
    if op == "fit":
        r, v = args
        if not st.mode or not st.ops:
            raise Fail("fit before any branch")
        sym = next((s for s in st.ops if s in r or s in v), "")
        ok = st.fits(r, v, sym)
        if ok:
            st.bind(r, v, sym)
        return "yes" if ok else "no"
    lhs, r = args
    if len(lhs) != 5:
        raise Fail(f"{lhs!r} is not two symbols, an operator, two symbols")
    x, sym, y = lhs[:2], lhs[2], lhs[3:]
    if op == "sig":
        return signature(x, sym, y, r)
    st.points[len(st.stack)] = (x, sym, y, r)
    return " ".join(st.candidates(x, sym, y, r)) or "none"


def _branch(rp, head, args):
    """`try CANDIDATE` (a candidate of the last `cands` line at this depth, that still agrees), `assume OP MEANING`
    (a meaning the catalog lists for a decoded example; the mode is the branch's), `back`."""
    st = _state(rp)
    if head == "back":
        if args or not st.stack:
            raise Fail("back closes no open branch")
        st.back()
        return
    if head == "try":
        if len(args) != 1 or len(st.stack) not in st.points:
            raise Fail("a try line is `try CANDIDATE`, after a `cands` line at its depth")
        rp.need(args)
        (cand,) = args
        x, sym, y, r = st.points[len(st.stack)]
        if cand not in st.candidates(x, sym, y, r):
            raise Fail(f"{cand} is not a candidate of {x}{sym}{y} = {r} under the bindings")
        st.take(x, sym, y, r, cand)
        return
    if len(args) != 2 or len(args[0]) != 1:
        raise Fail("an assume line is `assume OP MEANING`")
    sym, meaning = args[0], args[1].replace("_", " ")
    if meaning not in MEANINGS or st.mode is None or not st.family_free(sym, meaning) or sym in st.ops:
        raise Fail(f"{sym} cannot take {meaning} here")
    st.push()
    st.ops[sym] = meaning


OPS = {op: (lambda rp, args, op=op: _op(rp, op, args)) for op in ("sig", "readings", "cands", "fit", "rest")}
BRANCHES = {head: (lambda rp, args, head=head: _branch(rp, head, args)) for head in ("try", "assume", "back")}
