"""Seeded puzzle generators in the competition's exact wording, one entry point for all categories.

`generate(category, n, seed, **difficulty)` -> DataFrame[id, prompt, answer, category, subtype],
all strings; ids are `<prefix>-<seed>-<index>` (e.g. num-1234-0007) and the frame is the same for
the same arguments. Difficulty knobs are the keyword arguments of each category's `generate` (`generate_one`):
`knobs(category)`; an unknown knob is refused naming the valid ones (`knob_problems`), never ignored. Deliberately
simple: one random.Random per call, no de-duplication
against real data.
"""

from __future__ import annotations

import inspect
import random

from .categories import category as lookup
from .common import make_id


def knobs(category: str) -> tuple[str, ...]:
    """The difficulty knobs of `category`'s generator: its parameters after the random source."""
    return tuple(inspect.signature(lookup(category).generate).parameters)[1:]


def knob_problems(category: str, given, where: str) -> list[str]:
    """`where.KEY is not a knob of ...` for each key of `given` that `category`'s generator does not take."""
    valid = knobs(category)
    return [f"{where}{k}: not a difficulty knob of {category} (its knobs: {', '.join(valid)})"
            for k in given or {} if k not in valid]


def generate(category: str, n: int, seed: int = 0, **difficulty):
    import pandas as pd

    cat = lookup(category)  # ValueError naming the known categories
    if found := knob_problems(category, difficulty, ""):
        raise ValueError("; ".join(found))
    rng = random.Random(f"{category}-{seed}")
    rows = []
    for i in range(int(n)):
        prompt, answer, subtype = cat.generate(rng, **difficulty)
        rows.append({"id": make_id(cat.prefix, seed, i), "prompt": prompt, "answer": str(answer),
                     "category": category, "subtype": subtype})
    return pd.DataFrame(rows, columns=["id", "prompt", "answer", "category", "subtype"], dtype=str)
