"""How much of lab/ is prose: lines, docstring lines, comment lines, their share, citations of library source files
and lines over the project's 120-character limit, per package and in all.

    .venv/bin/python scripts/code_stats.py [--long] [ROOT]

A docstring line is a line of a module's, class's or function's docstring (ast); a comment line is a line that holds
only a `#` comment (tokenize; a comment after code leaves its line a code line). The share is (docstring + comment
lines) / all lines. A citation is a path ending in `.py` whose first part is neither one of this repository's folders
nor one of lab's packages (`peft/tuners/lora/layer.py`, not `lab/core/io.py` or `model/lora.py`). `--long` lists
every line over the limit as path:line: length.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import tokenize
from collections import Counter
from pathlib import Path

LIMIT = 120
OWN = {"lab", "tests", "scripts", "bench", "notebooks", "conf", "docs", "kaggle_kernel", "accelerate", ".ci",
       "competition", "core", "data", "eval", "model", "plan", "puzzles", "recipes", "runs", "train"}  # not kaggle/
CITATION = re.compile(r"(?<![\w./-])((?:[A-Za-z_][\w-]*/)+[A-Za-z_]\w*\.py)\b")
COLUMNS = ("lines", "docstring", "comment", "share", "citations", "long")


def docstring_lines(tree: ast.AST) -> set[int]:
    """The line numbers covered by every module, class and function docstring of `tree`."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                lines.update(range(first.lineno, first.end_lineno + 1))
    return lines


def comment_lines(text: str) -> set[int]:
    """The line numbers that hold only a `#` comment."""
    lines = text.splitlines()
    return {tok.start[0] for tok in tokenize.generate_tokens(io.StringIO(text).readline)
            if tok.type == tokenize.COMMENT and not lines[tok.start[0] - 1][:tok.start[1]].strip()}


def file_stats(path: Path) -> tuple[Counter, list[tuple[int, int]]]:
    """One file's counts and its long lines as (line number, length)."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    docs = docstring_lines(ast.parse(text))
    comments = comment_lines(text) - docs
    long = [(i, len(line)) for i, line in enumerate(lines, 1) if len(line) > LIMIT]
    citations = sum(1 for m in CITATION.finditer(text) if m.group(1).split("/")[0] not in OWN)
    return Counter(lines=len(lines), docstring=len(docs), comment=len(comments), citations=citations,
                   long=len(long)), long


def package(path: Path, lab: Path) -> str:
    """`lab.core` for lab/core/x.py, `lab` for lab/__main__.py."""
    parts = path.relative_to(lab).parts
    return "lab" if len(parts) == 1 else f"lab.{parts[0]}"


def row(name: str, c: Counter) -> str:
    share = (c["docstring"] + c["comment"]) / c["lines"] if c["lines"] else 0.0
    return (f"| {name} | {c['lines']} | {c['docstring']} | {c['comment']} | {share:.0%} | {c['citations']} "
            f"| {c['long']} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", nargs="?", default=Path(__file__).resolve().parent.parent, type=Path,
                        help="the repository (default: this one)")
    parser.add_argument("--long", action="store_true", help="list every line over the limit")
    args = parser.parse_args()
    lab = args.root / "lab"
    per_package: dict[str, Counter] = {}
    long_lines: list[str] = []
    for path in sorted(lab.rglob("*.py")):
        counts, long = file_stats(path)
        per_package.setdefault(package(path, lab), Counter()).update(counts)
        long_lines += [f"{path.relative_to(args.root)}:{i}: {n}" for i, n in long]
    print("| package | " + " | ".join(COLUMNS) + " |")
    print("|---" * (len(COLUMNS) + 1) + "|")
    for name, counts in sorted(per_package.items()):
        print(row(name, counts))
    print(row("**all of lab/**", sum(per_package.values(), Counter())))
    if args.long:
        print("\n".join(["", f"lines over {LIMIT} characters:"] + long_lines))


if __name__ == "__main__":
    main()
