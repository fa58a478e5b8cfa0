"""The project's line limit: every line of lab/ within 120 characters, so the code reads without side-scrolling.
scripts/code_stats.py --long lists the offenders too."""

from __future__ import annotations

from pathlib import Path

LAB = Path(__file__).resolve().parent.parent / "lab"
LIMIT = 120


def long_lines(root: Path) -> list[str]:
    """Every line over the limit under `root` as 'path:line: length'."""
    return [f"{path.relative_to(root.parent)}:{i}: {len(line)}"
            for path in sorted(root.rglob("*.py"))
            for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if len(line) > LIMIT]


def test_no_line_of_lab_over_the_limit():
    found = long_lines(LAB)
    assert not found, f"{len(found)} lines over {LIMIT} characters:\n" + "\n".join(found)


def test_the_check_finds_a_long_line(tmp_path):
    """Negative control: a 121-character line is found, a 120-character one is not."""
    pkg = tmp_path / "lab"
    pkg.mkdir()
    (pkg / "a.py").write_text("x = 1\n" + "#" * LIMIT + "\n" + "#" * (LIMIT + 1) + "\n", encoding="utf-8")
    assert long_lines(pkg) == [f"lab/a.py:3: {LIMIT + 1}"]
