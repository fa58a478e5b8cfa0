"""The project's line limit: every line of lab/ within 120 characters, so the code reads without side-scrolling.
One test per package, so a failure names where to look; scripts/code_stats.py --long lists the offenders too."""

from __future__ import annotations

from pathlib import Path

import pytest

LAB = Path(__file__).resolve().parent.parent / "lab"
LIMIT = 120
PACKAGES = sorted(p.name for p in LAB.iterdir() if (p / "__init__.py").is_file())


def long_lines(paths: list[Path], root: Path) -> list[str]:
    """Every line of `paths` over the limit as 'path:line: length', the path relative to `root`."""
    return [f"{path.relative_to(root)}:{i}: {len(line)}"
            for path in paths
            for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if len(line) > LIMIT]


@pytest.mark.parametrize("package", PACKAGES + ["(top)"])
def test_no_line_over_the_limit(package):
    paths = sorted(LAB.glob("*.py")) if package == "(top)" else sorted((LAB / package).rglob("*.py"))
    found = long_lines(paths, LAB.parent)
    assert not found, f"{len(found)} lines over {LIMIT} characters:\n" + "\n".join(found)


def test_every_module_is_covered():
    """The packages and the top-level modules together are every .py file of lab/."""
    covered = set(LAB.glob("*.py")) | {p for name in PACKAGES for p in (LAB / name).rglob("*.py")}
    assert covered == set(LAB.rglob("*.py"))


def test_the_check_finds_a_long_line(tmp_path):
    """Negative control: a 121-character line is found, a 120-character one is not."""
    f = tmp_path / "a.py"
    f.write_text("x = 1\n" + "#" * LIMIT + "\n" + "#" * (LIMIT + 1) + "\n", encoding="utf-8")
    assert long_lines([f], tmp_path) == [f"a.py:3: {LIMIT + 1}"]
