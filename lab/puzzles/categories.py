"""The one table of puzzle categories: every other module reads the category list from here.

Each row names a category and says what the callers need: the module under `lab.puzzles` that
parses, solves and generates it (`parse`, `solve`, `generate_one`), the words of the competition's
opening sentence that identify it (`classify`), the prefix of generated ids (`generate`), the kind of
answer (`errors` uses it for `wrong_format` and `near_miss`) and the extra batch argument its solver
takes (`solve`). A new category is one module plus one row.
Deliberately simple: a tuple of frozen dataclasses, no registry or plug-in loading.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Category:
    name: str     # the category as data, metrics and reports spell it
    module: str   # lab.puzzles.<module> holds parse / solve / generate_one
    key: str      # substring of the prompt's opening sentence that identifies it (checked in table order)
    prefix: str   # generated ids are <prefix>-<seed>-<index>
    answer: str   # 'bits' (a binary string), 'number', 'numeral' (Roman numeral, or a number), 'text'
    batch: str = ""  # extra argument the solver takes from the batch: 'vocab' (cipher words), 'priors' (equations)


TABLE = (
    Category("bit_manipulation", "bits", "bit manipulation rule", "bit", "bits"),
    Category("gravity", "gravity", "gravitational constant", "grav", "number"),
    Category("unit_conversion", "units", "unit conversion", "unit", "number"),
    Category("text_cipher", "cipher", "encryption rules", "ciph", "text", batch="vocab"),
    Category("numeral_system", "numeral", "numeral system", "num", "numeral"),
    Category("equation_transformation", "equations", "transformation rules is applied to equations", "eq", "text",
             batch="priors"),
)

BY_NAME = {c.name: c for c in TABLE}
CATEGORIES = [c.name for c in TABLE]


def category(name: str) -> Category:
    """The row for `name`; ValueError naming the known categories otherwise."""
    if name not in BY_NAME:
        raise ValueError(f"unknown category {name!r}; choose from {CATEGORIES}")
    return BY_NAME[name]
