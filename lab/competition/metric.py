r"""The competition's scorer, reproduced to the character: answer extraction, comparison, accuracy.

`version="final"` (default, the published metric). Extraction, the first rule that fires (`judge` reports which as
`source`): 1. ``boxed``: each ``\boxed{`` up to the LAST ``}`` before the next ``\boxed{`` (an unclosed box taken
whole); the last non-empty one, stripped. 2. ``phrase``: ``The final answer is:``, ``Final answer is:``,
``Final answer\s*[:：]``, tried in that order, case-insensitively; the first with a match gives its last match.
3. ``number``: the last ``-?\d+(?:\.\d+)?``. 4. ``last_line``: the last non-blank line. 5. ``NOT_FOUND``.
Comparison (`verify`), both sides stripped: a gold answer of only ``0``/``1`` as a string, case-insensitively; else
``math.isclose(gold, pred, rel_tol=1e-2, abs_tol=1e-5)`` when both parse with ``float()``; else case-insensitive
string equality. `version="legacy"` (the earlier metric): the box stops at the FIRST ``}`` and binary answers are
compared as floats. No LaTeX normalisation, no unit stripping: the scorer is only as lenient as the competition's.
Every rule's edge cases (empty boxes, line breaks, what ``float()`` accepts) and where this goes beyond the
reference: docs/internals.md, lab.competition.metric. This module imports nothing of the lab's but `LabError`.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Iterable, Sequence

import pandas as pd

from lab import LabError

NOT_FOUND = "NOT_FOUND"
VERSIONS = ("final", "legacy")

_BOXED_START = re.compile(r"\\boxed\{")
_BOXED_LEGACY = re.compile(r"\\boxed\{([^}]*)\}")
_PHRASES = (
    re.compile(r"The final answer is:\s*([^\n]+)", re.IGNORECASE),
    re.compile(r"Final answer is:\s*([^\n]+)", re.IGNORECASE),
    re.compile(r"Final answer\s*[:：]\s*([^\n]+)", re.IGNORECASE),
)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_BINARY = re.compile(r"[01]+")


def _check_version(version: str) -> None:
    if version not in VERSIONS:
        raise ValueError(f"unknown metric version {version!r}; allowed: {', '.join(VERSIONS)}")


def boxed_candidates(text: str, version: str = "final") -> list[str]:
    """The content of every `\\boxed{` in `text` as the version's boxed rule reads it (module docstring), in order;
    empty ones included."""
    if version == "legacy":
        return _BOXED_LEGACY.findall(text)
    starts = [m.end() for m in _BOXED_START.finditer(text)]
    ends = [m.start() for m in _BOXED_START.finditer(text)][1:] + [len(text)]
    segments = [text[s:e] for s, e in zip(starts, ends)]
    return [seg[:seg.rfind("}")] if "}" in seg else seg for seg in segments]


def _extract(text: str | None, version: str = "final") -> tuple[str, str]:
    """(answer, source) where source is boxed / phrase / number / last_line / not_found."""
    _check_version(version)
    if text is None or text == "":
        return NOT_FOUND, "not_found"
    boxes = boxed_candidates(text, version)
    if boxes:
        non_empty = [b.strip() for b in boxes if b.strip()]
        return (non_empty[-1] if non_empty else boxes[-1].strip()), "boxed"
    for pattern in _PHRASES:
        found = pattern.findall(text)
        if found:
            return found[-1].strip(), "phrase"
    numbers = _NUMBER.findall(text)
    if numbers:
        return numbers[-1], "number"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if lines:
        return lines[-1], "last_line"
    return NOT_FOUND, "not_found"


def extract_answer(text: str | None, version: str = "final") -> str:
    """The answer the competition reads from a raw model output (see the module docstring)."""
    return _extract(text, version)[0]


def _as_float(s: str) -> float | None:
    try:
        return float(s)
    except (ValueError, TypeError, OverflowError):
        return None


def verify(gold: str, predicted: str, version: str = "final") -> bool:
    """Whether an extracted answer counts as correct for the gold answer (see the module docstring)."""
    _check_version(version)
    if not isinstance(gold, str):
        raise TypeError(f"gold answer must be a str, got {type(gold).__name__}: {gold!r}")
    gold = gold.strip()
    predicted = NOT_FOUND if predicted is None else str(predicted).strip()
    if version == "final" and _BINARY.fullmatch(gold):
        return predicted.lower() == gold.lower()
    g, p = _as_float(gold), _as_float(predicted)
    if g is not None and p is not None:
        return math.isclose(g, p, rel_tol=1e-2, abs_tol=1e-5)
    return predicted.lower() == gold.lower()


def judge(golds: Sequence[str], raw_outputs: Sequence[str | None], version: str = "final") -> pd.DataFrame:
    """One row per puzzle: gold, answer (extracted), correct, source (which extraction rule fired)."""
    _check_version(version)
    golds, raw_outputs = list(golds), list(raw_outputs)
    if len(golds) != len(raw_outputs):
        raise ValueError(f"{len(golds)} gold answers but {len(raw_outputs)} outputs")
    rows = []
    for gold, raw in zip(golds, raw_outputs):
        answer, source = _extract(raw, version)
        rows.append({"gold": gold, "answer": answer, "correct": verify(gold, answer, version), "source": source})
    return pd.DataFrame(rows, columns=["gold", "answer", "correct", "source"]).astype({"correct": bool})


def score(golds: Sequence[str], raw_outputs: Sequence[str | None], version: str = "final") -> float:
    """Fraction of raw outputs whose extracted answer is correct (0.0 for no rows)."""
    table = judge(golds, raw_outputs, version)
    return float(table["correct"].mean()) if len(table) else 0.0


# ----------------------------------------------------------------------------------------------
# reading a predictions or gold file (python -m lab score, lab.eval.cli.score_main)
# ----------------------------------------------------------------------------------------------

def read_table(path: str | Path, needed: Iterable[str], what: str, unique_ids: bool = True) -> pd.DataFrame:
    """A CSV read as strings, exactly; LabErrors name the file: not found, not UTF-8, empty, unreadable, a needed
    column missing, a duplicate id (when there is an `id` column and `unique_ids`)."""
    p = Path(path)
    if not p.is_file():
        raise LabError(f"{p}: {what} file not found")
    try:
        df = pd.read_csv(p, dtype=str, keep_default_na=False, encoding="utf-8")
    except UnicodeDecodeError as e:
        raise LabError(f"{p}: not UTF-8 text ({e})") from None
    except pd.errors.EmptyDataError:
        raise LabError(f"{p}: empty file (no header row)") from None
    except pd.errors.ParserError as e:
        raise LabError(f"{p}: not a readable CSV ({e})") from None
    missing = [c for c in needed if c not in df.columns]
    if missing:
        raise LabError(f"{p}: missing column(s) {missing}; columns are {list(df.columns)}")
    dup = df["id"][df["id"].duplicated()] if unique_ids and "id" in df.columns else []
    if len(dup):
        raise LabError(f"{p}: duplicate id(s) {list(dup.unique()[:5])}")
    return df
