"""The registry of puzzle categories, and `classify`: every other module reads the category list from here.

Each category is one module under `lab.puzzles` that defines `CATEGORY = common.Category(...)`: its name, the
words of the competition's opening sentence that identify it, the prefix of generated ids, the kind of answer
(`analysis` uses it for `wrong_format` and `near_miss`), and its functions: parse, solve, generate, the derivation
trace, the compact-line checker, the subtype and the extra batch input its solver takes. A new category is one
module plus its line in `TABLE` (and the import above it).
Deliberately simple: a tuple of frozen records, no plug-in loading.
"""

from __future__ import annotations

from .bits import CATEGORY as BITS
from .cipher import CATEGORY as CIPHER
from .common import Category, has_key
from .equations import CATEGORY as EQUATIONS
from .gravity import CATEGORY as GRAVITY
from .numeral import CATEGORY as NUMERAL
from .units import CATEGORY as UNITS

TABLE: tuple[Category, ...] = (BITS, GRAVITY, UNITS, CIPHER, NUMERAL, EQUATIONS)

BY_NAME = {c.name: c for c in TABLE}
CATEGORIES = [c.name for c in TABLE]


def category(name: str) -> Category:
    """The category `name`; ValueError naming the known categories otherwise."""
    if name not in BY_NAME:
        raise ValueError(f"unknown category {name!r}; choose from {CATEGORIES}")
    return BY_NAME[name]


def classify(prompt: str) -> tuple[str, str]:
    """(category, subtype) from the prompt's opening wording, keys checked in table order; ('unknown', '') when
    no key matches, never a guess. Subtypes: equations have four, `<kind>_<mode>` (`eqrules.equation_subtype`);
    every other category has ''."""
    for c in TABLE:
        if has_key(prompt, c.key):
            return c.name, (c.subtype(prompt) if c.subtype else "")
    return "unknown", ""
