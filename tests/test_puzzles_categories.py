"""The category table in lab/puzzles/categories.py is the one place the category list is written."""

import ast
import importlib
from pathlib import Path

import pytest

from lab.puzzles import CATEGORIES, classify, generate
from lab.puzzles.categories import BY_NAME, TABLE, category

LAB = Path(__file__).resolve().parents[1] / "lab"


def _string_literals(path: Path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value


def test_category_names_are_written_only_in_the_table_and_their_own_module():
    # "gravity" is also the name of its module, which callers may name as a module; every other name is
    # a category only, so a literal of it anywhere else in lab/ is a second copy of the list.
    names = {c.name: c for c in TABLE if c.name not in {r.module for r in TABLE}}
    assert len(names) == len(TABLE) - 1
    found = []
    for path in sorted(LAB.rglob("*.py")):
        rel = path.relative_to(LAB).as_posix()
        if rel == "puzzles/categories.py":
            continue
        for line, value in _string_literals(path):
            row = names.get(value)
            if row is not None and rel != f"puzzles/{row.module}.py":
                found.append(f"lab/{rel}:{line} {value!r}")
    assert not found, "category names written outside lab/puzzles/categories.py:\n" + "\n".join(found)


def test_the_checker_sees_a_planted_copy(tmp_path):
    # the scan above must be able to fail: a file with a category name as a literal is found
    bad = tmp_path / "x.py"
    bad.write_text('KINDS = ("unit_conversion", "other")\n"""docstring"""\n', encoding="utf-8")
    assert ("unit_conversion" in [v for _, v in _string_literals(bad)])


@pytest.mark.parametrize("row", TABLE, ids=lambda r: r.name)
def test_each_row_is_complete(row):
    module = importlib.import_module(f"lab.puzzles.{row.module}")
    assert module.CATEGORY == row.name
    for fn in ("solve", "generate_one"):
        assert callable(getattr(module, fn)), (row.module, fn)
    assert row.answer in ("bits", "number", "numeral", "text") and row.batch in ("", "vocab", "priors")
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
