"""Greedy evaluations: the competition's one-completion predictions of a model and adapter, cached by what they
depend on (`evaluation_key`), and two of them compared per category.

The cache is a folder of sealed CSVs (`lab.core.cache`), one per key: 03_grpo's score of its adapter and 04_vote's
greedy pass of the same adapter are one evaluation, generated once. A file its seal does not vouch for is generated
again.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
from pathlib import Path

import pandas as pd

from lab.core import cache
from lab.core.io import atomic_file
from lab.core.lineage import content_hash, model_hash
from lab.core.paths import resolve_path
from lab.eval import sampling
from lab.eval.analysis import accuracy_table, compare, load_predictions


def evaluation_key(cfg, adapter, puzzles: pd.DataFrame) -> dict:
    """What a greedy evaluation's predictions depend on: the base model's content hash, the adapter's (None for the
    base model alone), a sha256 of the puzzles (id, prompt, answer, category, subtype), the seed and
    `sampling.engine_settings` (every `infer` setting, the back-end, dtype and max_model_len). Paths are left out:
    03_grpo's adapter in its working folder and the same adapter in the finished one are the same key."""
    from lab.model import models

    cols = [c for c in ("id", "prompt", "answer", "category", "subtype") if c in puzzles.columns]
    return {"model_sha256": model_hash(models.model_path(cfg)),
            "adapter_sha256": content_hash(resolve_path(adapter)) if adapter is not None else None,
            "puzzles_sha256": hashlib.sha256(puzzles[cols].astype(str).to_csv(index=False).encode()).hexdigest(),
            "seed": cfg.seed, **sampling.engine_settings(cfg, cfg.model.generation_backend)}


def evaluate(cfg, puzzles: pd.DataFrame, adapter, out_csv: Path, cached: bool = True, gen=None) -> pd.DataFrame:
    """Greedy predictions (`sampling.predictions`) of the base model plus `adapter` (None: the base model alone) on
    `puzzles`, written to `out_csv` and returned as `load_predictions` reads them. `gen`: a Generator of that adapter
    already open (else one is made only when needed). Kept in `<run_dir>/evaluations/` as `<key digest>.csv` and
    sealed; a sealed entry of the same key is copied instead of generated. `cached=False` always generates and keeps
    nothing.

    Reusing an entry leaves torch's random state as generating would: `generate.generate_hf` seeds its batches
    inside `torch.random.fork_rng` (02_sft initialises its LoRA next)."""
    from lab.model import generate

    cache_dir = resolve_path(cfg.run_dir) / "evaluations" if cached else None
    key = evaluation_key(cfg, adapter, puzzles) if cache_dir is not None else None
    entry = cache.entry(cache_dir, key, suffix=".csv") if cache_dir is not None else None
    if entry is not None and cache.load(entry, key, "greedy evaluation"):
        print(f"greedy evaluation: the same model, adapter, puzzles and settings as {entry} (its content hash "
              "checked); reused, not generated")
        _copy(entry, out_csv)
        return load_predictions(out_csv)
    with contextlib.nullcontext(gen) if gen is not None else generate.Generator(cfg, adapter=adapter) as g:
        sampling.predictions(g, puzzles, out_csv=out_csv)
    if entry is not None:
        _copy(out_csv, entry)
        cache.store(entry, key)
    return load_predictions(out_csv)


def _copy(src: Path, dst: Path) -> None:
    with atomic_file(dst) as tmp:
        shutil.copyfile(src, tmp)


def per_category(**preds: pd.DataFrame) -> dict:
    """{category: {name: accuracy}} for each named predictions table."""
    table = pd.DataFrame({k: p.groupby("category")["correct"].mean() for k, p in preds.items()})
    return table.to_dict("index")


def accuracy_figure(a: pd.DataFrame, b: pd.DataFrame, name_a: str, name_b: str, by: str):
    """Held-out accuracy per category of two evaluations side by side, titled with the puzzles fixed and broken."""
    from lab.core import plots

    net = compare(a, b)[0].set_index("category").loc["all"]
    return plots.accuracy_bars({name_a: accuracy_table(a), name_b: accuracy_table(b)},
                               f"Held-out accuracy, greedy: {net['fixed']:.0f} puzzles fixed, "
                               f"{net['broken']:.0f} broken by {by}")
