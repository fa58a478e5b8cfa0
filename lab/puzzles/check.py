"""The trace checker: replays a solver trace line by line against its prompt (`python -m lab puzzles check SOLVED.csv`).

Derivation traces follow one small grammar, the same for every category: a step line is `[tag: ]BODY`, BODY one of
`OP ARG ... = RESULT` (an operation of `OPS`, its RESULT recomputed; every ARG must be available: written in the
prompt as a whole value or in an earlier line), `copy VALUE`, `let SYMBOL = DIGIT`, `recall VALUE` (counted per
category), `note TEXT` (checked for nothing), and the bit-table lines. Numbers compute exactly (fractions) and a
RESULT is accepted when it is the exact value rounded to its own decimals. After the steps, `</think>` and
`\\boxed{ANSWER}`, ANSWER equal to the last step's result. A category may add operations (`Category.ops`,
`Category.branches`). Compact traces are replayed by `replay_compact` with the category's `check_line`: computations
recomputed, stated choices counted as claims. This module knows no category (`solve.replay` looks it up). A wrong
digit, a skipped step and a wrong box all fail at their own line. The grammar in full: docs/internals.md,
lab.puzzles.check.
"""

from __future__ import annotations

import re
from fractions import Fraction

TAG_RE = re.compile(r"^([a-z][a-z0-9]*): (.*)$")
BOX_RE = re.compile(r"\\boxed\{(.*)\}\s*$", re.S)
BITS_RE = re.compile(r"^[01]{8}$")
NUM_RE = re.compile(r"^-?\d+(\.\d+)?$")


class Fail(Exception):
    """A line that does not replay."""


# ---------------------------------------------------------------- operations

def _bits(v: str) -> int:
    if not BITS_RE.match(v):
        raise Fail(f"{v!r} is not 8 bits")
    return int(v, 2)


def _b8(v: int) -> str:
    return format(v & 255, "08b")


def _shift(kind: str, k: int):
    def f(a):
        x = _bits(a)
        if kind == "shl":
            r = x << k
        elif kind == "shr":
            r = x >> k
        elif kind == "rotl":
            r = (x << k) | (x >> (8 - k))
        else:
            r = (x >> k) | (x << (8 - k))
        return _b8(r)
    return f


def _num(v: str) -> Fraction:
    if not NUM_RE.match(v):
        raise Fail(f"{v!r} is not a number")
    return Fraction(v)


def _median(vals):
    s = sorted(vals)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


NUMERIC = {  # exact value from the arguments; RESULT must be it rounded to RESULT's decimals
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b, "sq": lambda a: a * a, "mid": lambda a, b: (a + b) / 2,
    "max": lambda *a: max(a), "min": lambda *a: min(a), "median": lambda *a: _median(a),
    "mod": lambda a, b: a % b, "absdiff": lambda a, b: abs(a - b),
}

ROMAN = {**{v: r for v, r in zip(range(1000, 4000, 1000), ["M", "MM", "MMM"])},
         **{v * 100: r for v, r in zip(range(1, 10), "C CC CCC CD D DC DCC DCCC CM".split())},
         **{v * 10: r for v, r in zip(range(1, 10), "X XX XXX XL L LX LXX LXXX XC".split())},
         **{v: r for v, r in zip(range(1, 10), "I II III IV V VI VII VIII IX".split())}}


def _places(n: str) -> str:
    if not n.isdigit():
        raise Fail(f"{n!r} is not a whole number")
    digits = n.lstrip("0")
    return " ".join(str(int(d) * 10 ** (len(digits) - 1 - i)) for i, d in enumerate(digits) if d != "0")


def _letter(cw: str, pw: str, c: str) -> str:
    if len(cw) != len(pw) or c not in cw:
        raise Fail(f"{c!r} is not a letter of {cw!r}, or {cw!r} and {pw!r} differ in length")
    got = {pw[i] for i, ch in enumerate(cw) if ch == c}
    if len(got) != 1:
        raise Fail(f"{c!r} stands for several letters in {cw!r} -> {pw!r}")
    return got.pop()


def _fits(pattern: str, word: str) -> str:
    ok = len(pattern) == len(word) and all(p in ("?", w) for p, w in zip(pattern, word))
    return "yes" if ok else "no"


def _keys(*vals: str) -> str:
    vs = [format(_bits(v), "08b") for v in vals]
    return " ".join("".join(v[p] for v in vs) for p in range(8))


def _pairs(*args: str) -> str:
    *keys, out = args
    if len(keys) != 8:
        raise Fail("pairs needs 8 keys and the output")
    o = format(_bits(out), "08b")
    return " ".join(f"{k}:{b}" for k, b in zip(keys, o))


def _roman(p: str) -> str:
    if not (p.isdigit() and int(p) in ROMAN):
        raise Fail(f"{p!r} is not a single place value")
    return ROMAN[int(p)]


def _pick(v: str, *pos: str) -> str:
    """The characters of v at the given 0-based positions."""
    if not all(p.isdigit() and int(p) < len(v) for p in pos):
        raise Fail(f"positions {pos} are not in {v!r}")
    return "".join(v[int(p)] for p in pos)


def _parity(s: str) -> str:
    if not set(s) <= {"0", "1"}:
        raise Fail(f"{s!r} is not bits")
    return str(s.count("1") % 2)


def _flip(b: str) -> str:
    if b not in ("0", "1"):
        raise Fail(f"{b!r} is not a bit")
    return "1" if b == "0" else "0"


OPS = {  # name -> function of the argument strings, giving the RESULT string
    **{f"shl{k}": _shift("shl", k) for k in range(1, 8)}, **{f"shr{k}": _shift("shr", k) for k in range(1, 8)},
    **{f"rotl{k}": _shift("rotl", k) for k in range(1, 8)}, **{f"rotr{k}": _shift("rotr", k) for k in range(1, 8)},
    "NOT": lambda a: _b8(~_bits(a)),
    "AND": lambda a, b: _b8(_bits(a) & _bits(b)), "OR": lambda a, b: _b8(_bits(a) | _bits(b)),
    "XOR": lambda a, b: _b8(_bits(a) ^ _bits(b)),
    "MAJ": lambda a, b, c: _b8((_bits(a) & _bits(b)) | (_bits(a) & _bits(c)) | (_bits(b) & _bits(c))),
    "CH": lambda a, b, c: _b8((_bits(a) & _bits(b)) | (~_bits(a) & _bits(c))),
    "keys": _keys, "pairs": _pairs,
    "eq": lambda a, b: "yes" if a == b else "no",
    "lt": lambda a, b: "yes" if _num(a) < _num(b) else "no",
    "le": lambda a, b: "yes" if _num(a) <= _num(b) else "no",
    "rev": lambda a: a[::-1],
    "cat": lambda *a: "".join(a),
    "join": lambda *a: " ".join(a),
    "ulp": lambda a: "0." + "0" * (len(a.split(".")[1]) - 1) + "1" if "." in a else "1",
    "places": _places,
    "roman": _roman,
    "letter": _letter, "fits": _fits,
    "pick": _pick, "parity": _parity, "flip": _flip,
}
STATEFUL = {"decode", "encode", "read", "table", "default"}
PAIR_RE = re.compile(r"^[01]{1,4}:[01]$")


def _decimals(v: str) -> int:
    return len(v.split(".")[1]) if "." in v else 0


def _numeric_ok(exact: Fraction, written: str) -> bool:
    got = _num(written)
    return abs(got - exact) <= Fraction(1, 2 * 10 ** _decimals(written))


def line_rules(*rules):
    """A compact-line checker (`Category.check_line`) from rules (regex, test, message): the first regex that
    matches the whole line decides, the line replays when `test(*groups)` holds, else Fail(message); a line no
    regex matches is a claim."""
    compiled = [(re.compile(rx), test, msg) for rx, test, msg in rules]

    def check_line(line: str, prompt: str, state: dict) -> bool:
        for rx, test, msg in compiled:
            m = rx.fullmatch(line)
            if m:
                if not test(*m.groups()):
                    raise Fail(msg)
                return True
        return False
    return check_line


class Replay:
    """The state of one replay: the prompt, the values written so far, the symbol map (`let` lines), and the
    category's own operations (`ops`: name -> (replay, args) -> result; `branches`: name -> (replay, args))."""

    def __init__(self, prompt: str, ops: dict | None = None, branches: dict | None = None):
        self.prompt = prompt
        self.values: set[str] = set()
        self.symbols: dict[str, str] = {}
        self.recalls = 0
        self.ops, self.branches = ops or {}, branches or {}
        self.pairs: list[str] = []  # the `key:bit` pairs written since the last `reset_pairs` (a new table)
        self.state: dict = {}       # a category's own replay state (its ops and branches)
        self.tag: str | None = None  # the tag of the line being replayed (`ex3` of `ex3: fill ...`)

    def available(self, v: str) -> bool:
        if v in self.values:
            return True
        for m in re.finditer(re.escape(v), self.prompt):
            before = self.prompt[m.start() - 1] if m.start() else " "
            after = self.prompt[m.end()] if m.end() < len(self.prompt) else " "
            if not (_same_class(before, v[0]) or _same_class(after, v[-1])):
                return True
        return False

    def need(self, args):
        for a in args:
            if len(a) > 1 and not self.available(a):  # a single character is a constant, never a hidden value
                raise Fail(f"{a!r} is neither in the prompt nor in an earlier line")

    def add(self, text: str):
        self.values.add(text)
        self.values.update(text.split())
        self.pairs += [v for v in text.split() if PAIR_RE.match(v)]

    def reset_pairs(self):
        """A new table starts: the pairs written so far no longer count (a layout tried and rejected)."""
        self.pairs = []

    def shown(self, key: str, bit: str) -> bool:
        return f"{key}:{bit}" in self.pairs

    def step(self, body: str, tag: str | None = None) -> str | None:
        """Replays one step (`tag`: its `exN:`-style tag, for the category's ops); returns the value it produces
        (None for notes and lets)."""
        self.tag = tag
        head, _, rest = body.partition(" ")
        if head == "note":
            return None
        if head == "copy":
            self.need([rest])
            self.add(rest)
            return rest
        if head == "recall":
            self.recalls += 1
            self.add(rest)
            return rest
        if head == "let":
            m = re.fullmatch(r"(\S+) = (\d)", rest)
            if not m:
                raise Fail("a let line is `let SYMBOL = DIGIT`")
            s, d = m.groups()
            if s in self.symbols and self.symbols[s] != d or d in self.symbols.values() and self.symbols.get(s) != d:
                raise Fail(f"{s} = {d} contradicts an earlier let")
            self.need([s])
            self.symbols[s] = d
            self.recalls += 1
            self.values.add(d)
            return None
        if head in self.branches:
            self.branches[head](self, rest.split())
            return None
        if " = " not in body:
            raise Fail("not `OP ARG ... = RESULT`, `copy`, `let`, `recall` or `note`")
        lhs, result = body.rsplit(" = ", 1)
        op, *args = lhs.split()
        if op not in OPS and op not in STATEFUL and op not in NUMERIC and op not in self.ops:
            raise Fail(f"unknown operation {op!r}")
        self.need(args)
        if op in NUMERIC:
            try:
                exact = NUMERIC[op](*map(_num, args))
            except (TypeError, ZeroDivisionError) as e:
                raise Fail(f"{op}: {e}") from None
            if not _numeric_ok(exact, result):
                raise Fail(f"{op} {' '.join(args)} is {float(exact):.10g}, not {result}")
        else:
            try:
                want = (self.ops[op](self, args) if op in self.ops else self.stateful(op, args) if op in STATEFUL
                        else OPS[op](*args))
            except TypeError as e:
                raise Fail(f"{op}: wrong number of arguments ({e})") from None
            except KeyError as e:
                raise Fail(f"{op}: {e}") from None
            if want != result:
                raise Fail(f"{op} {' '.join(args)} is {want!r}, not {result!r}")
        self.add(result)
        return result

    def stateful(self, op, args):
        if op == "read":  # each key's bit from an available `key:bit` pair
            out = ""
            for k in args:
                hits = [b for b in "01" if self.shown(k, b)]
                if len(hits) != 1:
                    raise Fail(f"key {k} is shown by no example (or with both bits)")
                out += hits[0]
            return out
        if op == "table":  # every `key:bit` pair written so far, one bit per key, keys in order
            pairs = sorted(set(self.pairs))
            keys = [p.split(":")[0] for p in pairs]
            clash = sorted({k for k in keys if keys.count(k) > 1})
            if args or clash:
                raise Fail("`table` takes no arguments" if args else f"key {clash[0]} is shown with both bits")
            return " ".join(pairs)
        if op == "default":  # the stated default for a key no example shows: it reads 0
            if len(args) != 1:
                raise Fail("`default` takes one key")
            (k,) = args
            if any(self.shown(k, b) for b in "01"):
                raise Fail(f"key {k} is shown by an example: no default")
            return f"{k}:0"
        (s,) = args
        if op == "decode":
            missing = [c for c in s if c not in self.symbols]
            if missing:
                raise Fail(f"no let for {missing[0]!r}")
            return "".join(self.symbols[c] for c in s)
        d2s = {d: c for c, d in self.symbols.items()}
        if any(c.isdigit() and c not in d2s for c in s):
            raise Fail(f"no let for a digit of {s}")
        return "".join(d2s.get(c, c) for c in s)


def _same_class(ch: str, edge: str) -> bool:
    """Whether `ch` would continue a value whose edge character is `edge` (a digit or a letter)."""
    if edge.isdigit() or edge == ".":
        return ch.isdigit() or ch == "."
    if edge.isalpha():
        return ch.isalpha()
    return False


def split_trace(trace: str):
    """(step lines, boxed answer or None): the lines before `</think>` and the box after it."""
    head, sep, tail = str(trace).partition("</think>")
    m = BOX_RE.search(tail) if sep else None
    return [ln for ln in head.splitlines() if ln.strip()], (m.group(1) if m else None)


def replay_derivation(prompt: str, trace: str, ops: dict | None = None,
                      branches: dict | None = None) -> tuple[bool, int, str, int]:
    """(ok, failing line number (1-based, 0 when ok), message, recall lines) for a derivation trace; `ops` and
    `branches`: the category's own operations (`Category.ops`, `Category.branches`)."""
    lines, box = split_trace(trace)
    if box is None:
        return False, len(lines) + 1, "no `</think>` then `\\boxed{...}`", 0
    r = Replay(prompt, ops, branches)
    last = None
    for i, line in enumerate(lines, 1):
        m = TAG_RE.match(line)
        body = m.group(2) if m else line
        try:
            v = r.step(body.strip(), m and m.group(1))
        except Fail as e:
            return False, i, f"{line!r}: {e}", r.recalls
        if v is not None:
            last = v
    if last is None or box != last:
        return False, len(lines) + 1, f"boxed {box!r} is not the last step's result {last!r}", r.recalls
    return True, 0, "", r.recalls


# ---------------------------------------------------------------- compact traces

def replay_compact(prompt: str, trace: str, check_line, compact_answer=None) -> tuple[bool, int, str, int]:
    """(ok, failing line, message, claim lines) for a compact trace: computations recomputed by the category's
    `check_line(line, prompt, state)`, claims counted; the box must equal the last line's `= VALUE` (or what the
    category's `compact_answer(lines, box, state, tail)` says the trace ends with)."""
    lines, box = split_trace(trace)
    if box is None:
        return False, len(lines) + 1, "no `</think>` then `\\boxed{...}`", 0
    state: dict = {}
    claims = 0
    for i, line in enumerate(lines, 1):
        try:
            if not check_line(line.strip(), prompt, state):
                claims += 1
        except Fail as e:
            return False, i, f"{line!r}: {e}", claims
    last = lines[-1] if lines else ""
    tail = last.rsplit("= ", 1)[-1].strip() if "= " in last else last.split(": ", 1)[-1].strip()
    if compact_answer is not None:
        tail = compact_answer(lines, box, state, tail)
    if tail != box:
        return False, len(lines) + 1, f"boxed {box!r} is not the last step's result {tail!r}", claims
    return True, 0, "", claims

