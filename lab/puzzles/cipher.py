"""Text cipher puzzles: a hidden letter substitution; examples `cipher -> plain`, query cipher text.

`solve` reads the letter key from the aligned examples; query letters the key does not cover are found by matching
each query word against known plaintext words of the same length (consistent with the key, the word's letter
pattern and bijectivity), repeated until nothing changes. Known words, in tie-break order: the puzzle's own example
words, the batch vocabulary (`vocabulary(prompts)`, built by `solve_frame`), the built-in list WORDS. `solved` if
every query letter is fixed, `ambiguous` if a word still has several matches, `undetermined` if one has none.
`method` says where the weakest query word came from. Trace:
    key: t=c r=a b=t w=i
    trb = cat
    hffk = ?oo? = book
Only a-z is substituted (anything else stands for itself, case is kept); no letter frequencies or language model.
The solver and the derivation in detail: docs/internals.md, lab.puzzles.cipher.
"""

from __future__ import annotations

import random
import re
import string
from collections import Counter

from .check import Fail, _fits
from .common import Category, Solution, finish, has_key, missing

NAME = "text_cipher"
KEY = "encryption rules"
HEADER = "In Alice's Wonderland, secret encryption rules are used on text. Here are some examples:"
QUERY_RE = re.compile(r"decrypt the following text:\s*(.+?)\s*$", re.S)
PAIR_RE = re.compile(r"^\s*(.+?)\s*->\s*(.+?)\s*$", re.M)

SUBJECTS = ("alice queen king rabbit hatter cat mouse turtle dragon knight princess wizard student teacher "
            "bird caterpillar duchess gardener child fox owl unicorn").split()
VERBS = ("discovers imagines reads chases follows draws writes sees explores creates dreams watches finds "
         "paints studies remembers opens hides carries builds found saw read").split()
ADJECTIVES = ("hidden golden ancient magical mysterious bright dark silver strange wise curious clever "
              "colorful secret little quiet happy").split()
OBJECTS = ("book key map door garden forest castle valley river mirror potion crystal treasure puzzle story "
           "message tower cave ocean island library palace clock card tea cake").split()
PREPOSITIONS = "near in under above inside beyond around through behind".split()
WORDS = list(dict.fromkeys(SUBJECTS + VERBS + ADJECTIVES + OBJECTS + PREPOSITIONS + ["the"]))


def parse(prompt: str):
    """(examples [(cipher, plain)], query or None)."""
    body, sep, tail = prompt.partition("Now, decrypt the following text:")
    ex = [(c, p) for c, p in PAIR_RE.findall(body) if len(c.split()) == len(p.split())]
    q = " ".join(tail.split()) if sep else ""
    return ex, (q if re.search(r"[a-z]", q) else None)


def vocabulary(prompts) -> Counter:
    """Plaintext words of every cipher example in `prompts` (prompts without the cipher's key are skipped),
    counted: the vocabulary a whole file shares. Built from the prompts only, never from answers."""
    words: Counter = Counter()
    for p in prompts:
        if has_key(p, KEY):
            words.update(w for _, plain in parse(p)[0] for w in plain.split() if w.isalpha())
    return words


def _core(word: str) -> str:
    """The word without its edge punctuation (the whole word if that leaves nothing)."""
    return re.sub(r"^[^a-z]+|[^a-z]+$", "", word) or word


def build_key(examples):
    c2p, p2c = {}, {}
    for c, p in examples:
        for cw, pw in zip(c.split(), p.split()):
            if len(cw) != len(pw):
                continue
            for a, b in zip(cw, pw):
                if a not in string.ascii_lowercase or b not in string.ascii_lowercase:
                    continue
                if c2p.get(a, b) == b and p2c.get(b, a) == a:
                    c2p[a], p2c[b] = b, a
    return c2p, p2c


def matches(cw: str, c2p: dict, p2c: dict, vocab: list[str]) -> list[str]:
    out = []
    for w in vocab:
        if len(w) != len(cw):
            continue
        local, ok = {}, True
        for a, b in zip(cw, w):
            if a in c2p:
                ok = c2p[a] == b
            else:
                ok = local.setdefault(a, b) == b and p2c.get(b) in (None, a)
            if not ok:
                break
        if ok and len(set(local.values())) == len(local):
            out.append(w)
    return out


def solve(prompt: str, vocab: Counter | None = None) -> Solution:
    """`vocab`: the batch vocabulary (see `vocabulary`), used after the puzzle's own example words."""
    ex, q = parse(prompt)
    if (none := missing(NAME, ex, q, "no query text found", "no 'cipher -> plain' examples found")):
        return none
    c2p, p2c = build_key(ex)
    for ch in set(q) - set(string.ascii_lowercase):  # anything but a-z stands for itself
        c2p[ch] = p2c[ch] = ch
    base = dict(c2p)
    words = [_core(w) for w in q.split()]
    pooled = [w for w, _ in vocab.most_common()] if vocab else []
    own = [w for _, p in ex for w in p.split()]
    vocab = list(dict.fromkeys(own + pooled + WORDS))
    changed = True
    while changed:
        changed = False
        for cw in words:
            if all(a in c2p for a in cw):
                continue
            m = matches(cw, c2p, p2c, vocab)
            if len(m) == 1:
                for a, b in zip(cw, m[0]):
                    c2p[a], p2c[b] = b, a
                changed = True
    status, reason, out, lines = "solved", "", [], []
    sources = ["key"]  # where the query's plain words came from, the weakest last
    used = sorted({a for a in q if a in base and a in string.ascii_lowercase}, key=q.index)
    lines.append("key: " + " ".join(f"{a}={base[a]}" for a in used))
    for full, cw in zip(q.split(), words):
        pre, post = full[:full.find(cw)], full[full.find(cw) + len(cw):]
        partial = "".join(base.get(a, "?") for a in cw)
        if all(a in c2p for a in cw):
            pw = "".join(c2p[a] for a in cw)
        else:
            m = matches(cw, c2p, p2c, vocab)
            if m:
                pw = m[0]
                status, reason = (("ambiguous", f"'{cw}' matches {len(m)} words") if status == "solved"
                                  else (status, reason))
            else:
                pw = "".join(c2p.get(a, "?") for a in cw)
                status, reason = "undetermined", f"'{cw}' matches no known word"
        if partial != pw or "?" in pw:
            sources.append("no word" if "?" in pw else "examples' words" if pw in own else "batch words"
                           if pw in pooled else "word list")
        out.append(pre + pw + post)
        lines.append(f"{cw} = {pw}" if partial == pw else f"{cw} = {partial} = {pw}")
    ans = " ".join(out)
    order = ["key", "examples' words", "batch words", "word list", "no word"]
    method = max(sources, key=order.index)
    return Solution(ans, status, finish(lines, ans), NAME, "", reason, method)


def sentence(rng: random.Random) -> str:
    words = []
    if rng.random() < 0.4:
        words.append(rng.choice(ADJECTIVES))
    words += [rng.choice(SUBJECTS), rng.choice(VERBS)]
    if rng.random() < 0.5:
        words.append(rng.choice(PREPOSITIONS))
    if rng.random() < 0.3:
        words.append(rng.choice(ADJECTIVES))
    words.append(rng.choice(OBJECTS))
    return " ".join(words)


def make_prompt(examples: list[tuple[str, str]], query: str) -> str:
    lines = [HEADER] + [f"{c} -> {p}" for c, p in examples]
    lines.append(f"Now, decrypt the following text: {query}")
    return "\n".join(lines)


def generate_one(rng: random.Random, n_examples: int = 4):
    """(prompt, answer, subtype); a random letter permutation and `n_examples` random sentences."""
    perm = list(string.ascii_lowercase)
    rng.shuffle(perm)
    key = dict(zip(string.ascii_lowercase, perm))
    enc = lambda s: "".join(key.get(ch, ch) for ch in s)  # noqa: E731
    plains = [sentence(rng) for _ in range(int(n_examples) + 1)]
    q = plains.pop()
    return make_prompt([(enc(p), p) for p in plains], enc(q)), q, ""


def derive(prompt: str, sol: Solution) -> list[str]:
    ex, q = parse(prompt)
    c2p, _ = build_key(ex)
    pairs = [(cw, pw) for c, p in ex for cw, pw in zip(c.split(), p.split()) if len(cw) == len(pw)]
    own = {w for _, p in ex for w in p.split()}
    lines = ["note read each query letter from an example word that contains it; match the rest to a known word"]
    words = []
    for full, pw in zip(q.split(), sol.answer.split()):
        cw = _core(full)
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
            core = _core(pw)
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


def check_line(line: str, prompt: str, state: dict) -> bool:
    """A compact line: a word read from the key alone is a computation, the key and a matched word are claims."""
    if line.startswith("key: "):
        return False
    m = re.fullmatch(r"(\S+) = (?:(\S+) = )?(\S+)", line)
    if m:
        cw, partial, pw = m.groups()
        if len(cw) != len(pw) or (partial and _fits(partial, pw) != "yes"):
            raise Fail("the word does not fit")
        return bool(not partial)
    return False


def compact_answer(lines: list[str], box: str, state: dict, tail: str) -> str:
    """The words of the `cw = pw` lines, joined; the box may keep the query's edge punctuation."""
    words = [ln.rsplit(" = ", 1)[-1] for ln in lines if " = " in ln and not ln.startswith("key:")]
    return box if box.split() == words or [_core(w) for w in box.split()] == words else " ".join(words)


CATEGORY = Category(NAME, KEY, "ciph", "text", parse, solve, generate_one, derive, check_line,
                    compact_answer, input="vocab", learn=vocabulary)
