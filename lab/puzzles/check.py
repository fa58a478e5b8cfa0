"""The trace checker: replays a solver trace line by line against its prompt (`python -m lab.puzzles check SOLVED.csv`).

Derivation traces (`trace_style: derivation`, built by `lab.puzzles.derive`) follow one small grammar, so
the replay is exact and the same for every category. A step line is `[tag: ]BODY`, where the optional tag
is one lowercase word and digits (`ex3:`, `q:`) that the checker ignores, and BODY is one of

  OP ARG ... = RESULT   one operation from `OPS` on the ARGs (whitespace-separated values); RESULT is
                        recomputed and must match. Every ARG must be *available*: written in the prompt
                        (as a whole value, not inside a longer number or word) or in an earlier line.
  copy VALUE            VALUE is available (a copy from the prompt or an earlier line).
  let SYMBOL = DIGIT    (symbolic equations) a recalled symbol->digit hypothesis; `decode`/`encode` use them.
  recall VALUE          a value the trace recalls rather than derives (a bits rule's mask, a cipher word
                        taken from the word list); it becomes available. Counted per category.
  note TEXT             prose; checked for nothing, and nothing in it becomes available.
Bit tables: `keys` (the copies' bits per position), `pairs` (`key:bit` per position), `table = ...` (every
pair written so far, one bit per key, else it fails), `default KEY = KEY:0` (only for a key no pair shows) and
`read KEYS = BITS` (each key's bit from an available pair).

Numbers: `add sub mul div sq mid max min median` compute exactly (fractions) and accept RESULT when it is
the exact value rounded to RESULT's own number of decimals (`div 14.915 0.93845 = 15.89322819`). After the
steps come `</think>` and `\\boxed{ANSWER}`; ANSWER must equal the last step's RESULT (or copied VALUE).

Compact traces (today's style) are replayed by `replay_compact`: the line shapes each category's compact
trace uses (`x = ...`, `shl1 = ...`, `6.69/10.08 = 0.6637`, `|37-12| = 25`, ...) are recomputed where they
state a computation; lines that state a choice (`rule: ...`, `mode: ...`, `factor = ...`, a cipher key) are
claims, counted but not recomputed, since the compact style never shows where they come from.

Simplifies: one grammar and one table of operations for every category (no per-category checker for
derivations); results are compared as written, so a wrong digit, a skipped step (a value used before it
is written) and a wrong box all fail at their own line.
"""

from __future__ import annotations

import re
from fractions import Fraction

from .categories import BY_NAME

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
EQ_OPS = {"sig", "readings", "cands", "fit", "rest"}  # symbolic equations' written search (`eqsearch`)
EQ_BRANCH = {"try", "assume", "back"}
STATEFUL |= EQ_OPS


def _decimals(v: str) -> int:
    return len(v.split(".")[1]) if "." in v else 0


def _numeric_ok(exact: Fraction, written: str) -> bool:
    got = _num(written)
    return abs(got - exact) <= Fraction(1, 2 * 10 ** _decimals(written))


class Replay:
    """The state of one replay: the prompt, the values written so far, the symbol map (`let` lines)."""

    def __init__(self, prompt: str):
        self.prompt = prompt
        self.values: set[str] = set()
        self.symbols: dict[str, str] = {}
        self.recalls = 0

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

    def step(self, body: str) -> str | None:
        """Replays one step; returns the value it produces (None for notes and lets)."""
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
        if head in EQ_BRANCH:
            self.eq_branch(head, rest.split())
            return None
        if " = " not in body:
            raise Fail("not `OP ARG ... = RESULT`, `copy`, `let`, `recall` or `note`")
        lhs, result = body.rsplit(" = ", 1)
        op, *args = lhs.split()
        if op not in OPS and op not in STATEFUL and op not in NUMERIC:
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
                want = self.stateful(op, args) if op in STATEFUL else OPS[op](*args)
            except TypeError as e:
                raise Fail(f"{op}: wrong number of arguments ({e})") from None
            except KeyError as e:
                raise Fail(f"{op}: {e}") from None
            if want != result:
                raise Fail(f"{op} {' '.join(args)} is {want!r}, not {result!r}")
        self.add(result)
        return result

    def search(self):
        """The symbolic search's state (`eqsearch.Search`), sharing this replay's symbol map."""
        from .eqsearch import Search

        if getattr(self, "_search", None) is None:
            self._search = Search(self.symbols)
        return self._search

    def eq_op(self, op, args):
        """`sig LHS RHS`, `readings SIG`, `cands LHS RHS` (recomputed from the catalog and the state),
        `fit RHS DIGITS` (yes binds the result's new symbols)."""
        from .eqsearch import readings, signature

        st = self.search()
        if op == "readings":
            (sig,) = args
            return " ".join(readings(sig)) or "none"
        if op == "rest":
            (c,) = args
            free = [d for d in "0123456789" if d not in st.s2d.values()]
            if c in st.s2d or len(free) != 1 or not self.available(c):
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

    def eq_branch(self, head, args):
        """`try CANDIDATE` (a candidate of the last `cands` line at this depth, that still agrees), `assume OP MEANING`
        (a meaning the catalog lists for a decoded example; the mode is the branch's), `back`."""
        from .eqsearch import MEANINGS as _M

        st = self.search()
        if head == "back":
            if args or not st.stack:
                raise Fail("back closes no open branch")
            st.back()
            return
        if head == "try":
            if len(args) != 1 or len(st.stack) not in st.points:
                raise Fail("a try line is `try CANDIDATE`, after a `cands` line at its depth")
            self.need(args)
            (cand,) = args
            x, sym, y, r = st.points[len(st.stack)]
            if cand not in st.candidates(x, sym, y, r):
                raise Fail(f"{cand} is not a candidate of {x}{sym}{y} = {r} under the bindings")
            st.take(x, sym, y, r, cand)
            return
        if len(args) != 2 or len(args[0]) != 1:
            raise Fail("an assume line is `assume OP MEANING`")
        sym, meaning = args[0], args[1].replace("_", " ")
        if meaning not in _M or st.mode is None or not st.family_free(sym, meaning) or sym in st.ops:
            raise Fail(f"{sym} cannot take {meaning} here")
        st.push()
        st.ops[sym] = meaning

    def stateful(self, op, args):
        if op in EQ_OPS:
            return self.eq_op(op, args)
        if op == "read":  # each key's bit from an available `key:bit` pair
            out = ""
            for k in args:
                hits = [b for b in "01" if self.available(f"{k}:{b}")]
                if len(hits) != 1:
                    raise Fail(f"key {k} is shown by no example (or with both bits)")
                out += hits[0]
            return out
        if op == "table":  # every `key:bit` pair written so far, one bit per key, keys in order
            pairs = sorted(v for v in self.values if PAIR_RE.match(v))
            keys = [p.split(":")[0] for p in pairs]
            clash = sorted({k for k in keys if keys.count(k) > 1})
            if args or clash:
                raise Fail("`table` takes no arguments" if args else f"key {clash[0]} is shown with both bits")
            return " ".join(pairs)
        if op == "default":  # the stated default for a key no example shows: it reads 0
            if len(args) != 1:
                raise Fail("`default` takes one key")
            (k,) = args
            if any(self.available(f"{k}:{b}") for b in "01"):
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


def replay_derivation(prompt: str, trace: str) -> tuple[bool, int, str, int]:
    """(ok, failing line number (1-based, 0 when ok), message, recall lines) for a derivation trace."""
    lines, box = split_trace(trace)
    if box is None:
        return False, len(lines) + 1, "no `</think>` then `\\boxed{...}`", 0
    r = Replay(prompt)
    last = None
    for i, line in enumerate(lines, 1):
        m = TAG_RE.match(line)
        body = m.group(2) if m else line
        try:
            v = r.step(body.strip())
        except Fail as e:
            return False, i, f"{line!r}: {e}", r.recalls
        if v is not None:
            last = v
    if last is None or box != last:
        return False, len(lines) + 1, f"boxed {box!r} is not the last step's result {last!r}", r.recalls
    return True, 0, "", r.recalls


# ---------------------------------------------------------------- compact traces

def _eval_bits(expr: str, x: int) -> int:
    """A bits rule name (`shl1 XOR NOT rotr3`, `MAJ(x, shl1, rotr2)`, `(a AND b) OR c`) evaluated on x."""
    from .bits import T_NAMES, apply_t

    env = {("_" + n): apply_t(n, x) for n in T_NAMES}
    env["MAJ"] = lambda a, b, c: (a & b) | (a & c) | (b & c)
    env["CH"] = lambda a, b, c: (a & b) | (~a & c)
    py = re.sub(r"\b([01]{8})\b", lambda m: str(int(m.group(1), 2)), expr)
    py = re.sub(r"\b(" + "|".join(T_NAMES) + r")\b", r"_\1", py)
    py = py.replace("XOR", "^").replace("AND", "&").replace("OR", "|").replace("NOT", "~")
    if not re.fullmatch(r"[\w\s()^&|~,]+", py):
        raise Fail(f"cannot read {expr!r}")
    return eval(py, {"__builtins__": {}}, env) & 255  # noqa: S307 - names and operators only, checked above


def _module(category: str) -> str:
    """The solver module that wrote a compact trace of `category` (its line shapes are checked below)."""
    return BY_NAME[category].module if category in BY_NAME else ""


def _check_compact_line(category: str, line: str, prompt: str, state: dict) -> bool:
    """True if the line states a computation that replays, False if it is a claim; Fail if it is wrong."""
    module = _module(category)
    if module == "bits":
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
            xs = _b8(state["x"])
            v = 0
            for t in m.group(2).split(" ^ "):
                v ^= 1 if t == "1" else 0 if t == "0" else int(xs[int(t[1:])])
            if v != int(m.group(3)):
                raise Fail(f"the XOR is {v}")
            state.setdefault("bits", []).append(m.group(3))
            return True
        m = re.fullmatch(r"b(\d) <- ([x\d,]+|none): (\d*|-) -> ([01])", line)  # per-bit fallback
        if m and "x" in state:
            xs = _b8(state["x"])
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
                raise Fail(f"{name} of x is {_b8(_eval_bits(name, state['x']))}")
            return True
        return False
    if module in ("gravity", "units"):
        m = re.fullmatch(r"2\*(\S+)/(\S+)\^2 = (\S+)", line) or re.fullmatch(r"(\S+)/(\S+) = (\S+)", line)
        if m:
            a, b, r = m.groups()
            exact = (2 if line.startswith("2*") else 1) * _num(a) / (_num(b) ** (2 if "^2" in line else 1))
            if not _numeric_ok(exact, r):
                raise Fail(f"is {float(exact):.8g}")
            return True
        m = re.fullmatch(r"(\S+)\^2 = (\S+)", line)
        if m:
            if not _numeric_ok(_num(m.group(1)) ** 2, m.group(2)):
                raise Fail("wrong square")
            return True
        m = re.fullmatch(r"(\S+)\*(\S+)\*(\S+) = (\S+)", line) or re.fullmatch(r"(\S+)\*(\S+) = (\S+)", line)
        if m:
            *fs, r = m.groups()
            exact = Fraction(1)
            for f in fs:
                exact *= _num(f)
            if not _numeric_ok(exact, r):
                raise Fail(f"is {float(exact):.8g}")
            state["last"] = r
            return True
        return False
    if module == "numeral":
        m = re.fullmatch(r"(\d+) = ([\d +]+)", line)
        if m:
            if _places(m.group(1)) != " ".join(m.group(2).split(" + ")):
                raise Fail("wrong place values")
            return True
        m = re.fullmatch(r"(\d+) -> ([IVXLCDM]+)", line)
        if m:
            if ROMAN.get(int(m.group(1))) != m.group(2):
                raise Fail("wrong numeral")
            return True
        m = re.fullmatch(r"([IVXLCDM +]+) = ([IVXLCDM]+)", line)
        if m:
            if m.group(1).replace(" + ", "") != m.group(2):
                raise Fail("wrong join")
            return True
        return False
    if module == "equations":
        m = re.fullmatch(r"\|(\d+)-(\d+)\| = (\d+)", line)
        if m:
            if abs(int(m.group(1)) - int(m.group(2))) != int(m.group(3)):
                raise Fail("wrong difference")
            return True
        m = re.fullmatch(r"(\d+)([+*])(\d+)(?:([+-])1)? = (-?\d+)", line)
        if m:
            a, op, b, pm, r = m.groups()
            v = int(a) + int(b) if op == "+" else int(a) * int(b)
            v += {"+": 1, "-": -1, None: 0}[pm]
            if v != int(r):
                raise Fail(f"is {v}")
            return True
        m = re.fullmatch(r"(\d+) mod (\d+) = (\d+)", line)
        if m:
            if int(m.group(1)) % int(m.group(2)) != int(m.group(3)):
                raise Fail("wrong remainder")
            return True
        m = re.fullmatch(r"(\d+) joined to (\d+) = (\d+)", line)
        if m:
            if m.group(1) + m.group(2) != m.group(3):
                raise Fail("wrong join")
            return True
        return False
    if module == "cipher":
        if line.startswith("key: "):
            return False
        m = re.fullmatch(r"(\S+) = (?:(\S+) = )?(\S+)", line)
        if m:
            cw, partial, pw = m.groups()
            if len(cw) != len(pw) or (partial and _fits(partial, pw) != "yes"):
                raise Fail("the word does not fit")
            return bool(not partial)
        return False
    return False


def replay_compact(category: str, prompt: str, trace: str) -> tuple[bool, int, str, int]:
    """(ok, failing line, message, claim lines) for a compact trace: computations recomputed, claims counted."""
    lines, box = split_trace(trace)
    if box is None:
        return False, len(lines) + 1, "no `</think>` then `\\boxed{...}`", 0
    state: dict = {}
    claims = 0
    for i, line in enumerate(lines, 1):
        try:
            if not _check_compact_line(category, line.strip(), prompt, state):
                claims += 1
        except Fail as e:
            return False, i, f"{line!r}: {e}", claims
    last = lines[-1] if lines else ""
    tail = last.rsplit("= ", 1)[-1].strip() if "= " in last else last.split(": ", 1)[-1].strip()
    module = _module(category)
    if module == "bits" and len(state.get("bits", [])) == 8:
        tail = "".join(state["bits"])
    if module == "bits" and BITS_RE.match(state.get("rule", "")) and last.startswith("x = "):
        tail = state["rule"]  # a constant rule: the claimed constant is the answer
    if module == "cipher":
        words = [ln.rsplit(" = ", 1)[-1] for ln in lines if " = " in ln and not ln.startswith("key:")]
        tail = box if box.split() == [w for w in words] or _cipher_words_match(box, words) else " ".join(words)
    if tail != box:
        return False, len(lines) + 1, f"boxed {box!r} is not the last step's result {tail!r}", claims
    return True, 0, "", claims


def _cipher_words_match(box: str, words: list[str]) -> bool:
    return [re.sub(r"^[^a-z]+|[^a-z]+$", "", w) or w for w in box.split()] == words


def replay(style: str, category: str, prompt: str, trace: str):
    if style == "derivation":
        return replay_derivation(prompt, trace)
    return replay_compact(category, prompt, trace)


def check_frame(df, style: str | None = None):
    """Replays every solved row of a solve output (columns prompt, category, status, trace, and trace_style
    unless `style` is given). -> (per-row DataFrame [id, category, style, ok, line, message, recalls],
    summary DataFrame per category and style [n, replayed, share, unchecked_lines_mean]); `recalls` counts a
    derivation's `let`/`recall` lines, or a compact trace's claim lines: what the replay takes on trust)."""
    import pandas as pd

    rows = []
    for _, r in df.iterrows():
        if r["status"] != "solved":
            continue
        st = style or r.get("trace_style", "compact") or "compact"
        ok, line, msg, rec = replay(st, r["category"], r["prompt"], r["trace"])
        rows.append({"id": r.get("id", ""), "category": r["category"], "style": st, "ok": ok, "line": line,
                     "message": msg, "recalls": rec})
    res = pd.DataFrame(rows, columns=["id", "category", "style", "ok", "line", "message", "recalls"])
    g = res.groupby(["category", "style"])
    summary = g.size().rename("n").to_frame()
    summary["replayed"] = g["ok"].sum().astype(int)
    summary["share"] = (summary["replayed"] / summary["n"]).round(4)
    summary["unchecked_lines_mean"] = g["recalls"].mean().round(1)
    return res, summary.reset_index()
