"""The category registry (lab/puzzles/categories.py): one Category object per module, one line in TABLE.

A throwaway category defined in this file (mirrored words) goes through everything a real one does: generate,
classify, solve in both styles, the replay of both, `solve_frame` + `check_frame`, and the SFT dataset builder
(`lab.data.sft_examples`); no file of lab/ is touched to add it. Every registered category writes a derivation
(a category without one cannot be built, and a derivation that fails is never replaced by a compact trace)."""

import ast
import random
import re
from pathlib import Path

import pytest

from lab.puzzles import CATEGORIES, classify, generate, solve, solve_frame
from lab.puzzles import categories
from lab.puzzles.categories import BY_NAME, TABLE, category
from lab.puzzles.check import line_rules
from lab.puzzles.common import Category, Solution, arrow_pairs, finish, missing
from lab.puzzles.solve import check_frame, replay

LAB = Path(__file__).resolve().parents[1] / "lab"

# ---- a throwaway category: each example word is written backwards --------------------------------------

MIRROR = "mirrored_words"
HEADER = "In Alice's Wonderland, a secret mirror spell changes words. Here are some examples:"
QUERY_RE = re.compile(r"mirror the following word:\s*(\w+)")


def parse(prompt):
    m = QUERY_RE.search(prompt)
    return arrow_pairs(prompt), (m.group(1) if m else None)


def solve_mirror(prompt):
    ex, q = parse(prompt)
    if (none := missing(MIRROR, ex, q, "no query word", "no examples")):
        return none
    if any(b != a[::-1] for a, b in ex):
        return Solution("", "undetermined", finish(["rule: unknown"], ""), MIRROR, reason="not a mirror")
    return Solution(q[::-1], "solved", finish(["rule: reverse", f"{q} reversed = {q[::-1]}"], q[::-1]), MIRROR)


def generate_one(rng, n_examples=3, **_):
    words = ["".join(rng.choice("abcdefgh") for _ in range(rng.randint(3, 7))) for _ in range(n_examples + 1)]
    q = words.pop()
    lines = [HEADER, *(f"{w} -> {w[::-1]}" for w in words), f"Now, mirror the following word: {q}"]
    return "\n".join(lines), q[::-1], ""


def derive(prompt, sol):
    ex, q = parse(prompt)
    lines = ["note reverse each example's word and compare, then the query"]
    for n, (a, b) in enumerate(ex, 1):
        lines += [f"ex{n}: rev {a} = {a[::-1]}", f"ex{n}: eq {a[::-1]} {b} = {'yes' if a[::-1] == b else 'no'}"]
    return lines + [f"q: rev {q} = {q[::-1]}"]


check_line = line_rules((r"(\w+) reversed = (\w+)", lambda w, r: w[::-1] == r, "not the word reversed"))


TOY = Category(MIRROR, "mirror spell", "mir", "text", parse, solve_mirror, generate_one, derive, check_line)


@pytest.fixture
def with_toy(monkeypatch):
    """TOY registered as one more line of the table, for this test only."""
    monkeypatch.setattr(categories, "TABLE", TABLE + (TOY,))
    monkeypatch.setitem(BY_NAME, MIRROR, TOY)
    return TOY


def test_a_new_category_goes_through_solve_derive_check_and_generate(with_toy):
    df = generate(MIRROR, 6, seed=3)
    assert list(df["id"][:2]) == ["mir-3-0000", "mir-3-0001"] and set(df["category"]) == {MIRROR}
    for p, gold in zip(df["prompt"], df["answer"]):
        assert classify(p) == (MIRROR, "")
        compact, derived = solve(p), solve(p, style="derivation")
        assert compact.answer == derived.answer == gold and compact.status == derived.status == "solved"
        assert f"q: rev {parse(p)[1]} = {gold}" in derived.trace and derived.trace != compact.trace
        assert replay("compact", MIRROR, p, compact.trace)[0]
        assert replay("derivation", MIRROR, p, derived.trace)[0]
        assert not replay("compact", MIRROR, p, compact.trace.replace(f"= {gold}\n", "= zzz\n"))[0]
        assert not replay("derivation", MIRROR, p, derived.trace.replace(f"rev {parse(p)[1]} =", "rev abc ="))[0]
    for style in ("compact", "derivation"):
        out = solve_frame(df, style=style, workers=1).assign(prompt=df["prompt"].tolist())
        assert out["correct"].all()
        rows, _ = check_frame(out, style=style)
        assert len(rows) == len(df) and rows["ok"].all(), rows["message"].tolist()


def test_a_new_category_becomes_sft_rows(with_toy):
    pytest.importorskip("transformers")
    from lab.model.models import build_tiny_tokenizer
    from lab.train.sft import sft_examples

    tok = build_tiny_tokenizer()
    df = generate(MIRROR, 4, seed=1)
    rows, counts = sft_examples(tok, df, 10_000, style="derivation")
    assert counts["kept"] == 4 and list(rows["category"]) == [MIRROR] * 4
    for completion, p in zip(rows["completion"], df["prompt"]):
        assert completion == solve(p, style="derivation").trace + tok.eos_token and "ex1: rev " in completion


def test_a_category_without_a_derivation_cannot_be_built():
    with pytest.raises(TypeError, match="derive"):
        Category(MIRROR, "mirror spell", "mir", "text", parse, solve_mirror, generate_one, check_line=check_line)


def test_a_failing_derivation_is_never_a_silent_compact_trace(monkeypatch):
    def broken(prompt, sol):
        raise KeyError("no rule kept")

    toy = Category(MIRROR, "mirror spell", "mir", "text", parse, solve_mirror, generate_one, broken, check_line)
    monkeypatch.setattr(categories, "TABLE", TABLE + (toy,))
    monkeypatch.setitem(BY_NAME, MIRROR, toy)
    p = generate_one(random.Random(0))[0]
    s = solve(p, style="derivation")
    assert s.status == "solved" and s.trace.startswith("note no derivation: KeyError")
    assert not replay("derivation", MIRROR, p, s.trace)[0]


@pytest.mark.parametrize("cat", TABLE, ids=lambda c: c.name)
def test_every_registered_category_writes_its_own_derivation(cat):
    """No registered category falls back to its compact trace: each solved puzzle's derivation differs from the
    compact trace and replays in the derivation grammar (with the category's own operations)."""
    assert callable(cat.derive) and callable(cat.check_line) and callable(cat.parse)
    df = generate(cat.name, 6, seed=2)
    n = 0
    for p in df["prompt"]:
        compact, derived = solve(p), solve(p, style="derivation")
        if compact.status != "solved":
            continue
        n += 1
        assert derived.trace != compact.trace and not derived.trace.startswith("note no derivation")
        assert replay("derivation", cat.name, p, derived.trace)[0]
        assert replay("compact", cat.name, p, compact.trace)[0]
    assert n >= 3, f"only {n} of 6 generated {cat.name} puzzles solved"


# ---- the registry itself ---------------------------------------------------------------------------------

def _string_literals(path: Path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value


def test_each_category_name_is_written_once_in_lab():
    # "gravity" is also the name of its module; every other name is a category only, so a second literal of it
    # anywhere in lab/ is a second copy of the list. The one literal is in the module that solves the category.
    names = {c.name: c for c in TABLE if c.name != "gravity"}
    where: dict[str, list[str]] = {n: [] for n in names}
    for path in sorted(LAB.rglob("*.py")):
        for line, value in _string_literals(path):
            if value in names:
                where[value].append(f"{path.relative_to(LAB).as_posix()}:{line}")
    for name, places in where.items():
        home = names[name].solve.__module__.replace(".", "/").removeprefix("lab/") + ".py"
        assert [p.split(":")[0] for p in places] == [home], (name, places)


def test_the_checker_sees_a_planted_copy(tmp_path):
    # the scan above must be able to fail: a file with a category name as a literal is found
    bad = tmp_path / "x.py"
    bad.write_text('KINDS = ("unit_conversion", "other")\n"""docstring"""\n', encoding="utf-8")
    assert ("unit_conversion" in [v for _, v in _string_literals(bad)])


@pytest.mark.parametrize("row", TABLE, ids=lambda r: r.name)
def test_each_row_is_complete(row):
    assert row.answer in ("bits", "number", "numeral", "text") and row.input in ("", "vocab", "priors")
    assert bool(row.input) == (row.learn is not None)
    df = generate(row.name, 2, seed=1)
    assert list(df["category"]) == [row.name] * 2
    assert all(i.startswith(f"{row.prefix}-1-") for i in df["id"])
    assert all(classify(p)[0] == row.name for p in df["prompt"])


def test_table_order_and_lookup():
    assert CATEGORIES == [c.name for c in TABLE] and len(set(CATEGORIES)) == len(CATEGORIES) == 6
    assert len({c.prefix for c in TABLE}) == len({c.key for c in TABLE}) == len(TABLE)
    assert category("gravity") is BY_NAME["gravity"]
    with pytest.raises(ValueError, match="unknown category 'nope'"):
        category("nope")
