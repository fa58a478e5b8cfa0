"""Learnability probe: the same small model trained on each trace style, held-out accuracy per style and category.

`python bench/trace_bench.py [--categories numerals equations] [--seeds 3] [--smoke] [--force] [--report]
[-- OVERRIDES ...]` (`--report`: run nothing, tabulate the finished jobs on disk)

What it does
  For each probe category, each style (`data.trace_style=compact|derivation`) and seeds 1..N, one job under
  `outputs/bench/trace_bench/<probe>/<style>/seed<k>/`: the category's synthetic puzzles (`lab.data.dataset.prepare`), a
  fresh tiny model built with that seed, one SFT run (`lab.train.sft.train`, the config's recipe, the 02_sft stage's
  folder layout and manifest), and the saved adapter scored greedily on the held-out puzzles (`lab.eval.sampling`).
  Per job: held-out accuracy with its 95% Wilson interval (`lab.eval.analysis.wilson_interval`), completions that hit
  the token cap, the training traces' p50 / max completion tokens (the model's own tokenizer), train loss and
  wall seconds; then per probe x style the accuracy pooled over seeds. Output: a printed table and
  `outputs/bench/trace_bench.json` / `trace_bench.md`, written atomically; every figure comes from the run.

  Probes: `numerals` (Roman numerals: the category the tiny demo model is known to learn; the derivation checks
  every example before the query), `equations` (numeric equations with a deducible operator: the derivation tries
  the operator's meanings in order), `bits` / `bits2` (one- and two-copy bit rules: derivations tens of times
  longer than the compact traces, so meant for a GPU). On a GPU the same command takes `model=nemotron_nano`.

What it simplifies
  1. A study, not a tuned result: one SFT recipe for both styles (the config's, one epoch), no GRPO, greedy only.
  2. No evaluation before training (02_sft's `accuracy_before`): a random tiny model scores 0 and never stops.
  3. The completion cap (`infer.max_tokens`) is per style: 1.25 x the longest training completion of that style
     (at least 64), so a model that never stops costs little; completions that hit it are counted (`capped`).
  4. A finished job is reused when its saved config (read back through the schema) equals this run's
     (`--force` reruns it).
  5. `--smoke` (16 puzzles, 2 optimiser steps) checks the plumbing only; its accuracies say nothing.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROBES = {  # probe name -> (category, generator knobs for data.difficulty)
    "numerals": ("numeral_system", "{}"),
    "equations": ("equation_transformation", "{symbolic: 0.0, guess: 0.0}"),
    "bits": ("bit_manipulation", "{complexity: 1}"),
    "bits2": ("bit_manipulation", "{complexity: 2}"),
}
STYLES = ("compact", "derivation")
ROOMY = ["model.max_model_len=8192", "model.architecture.max_position_embeddings=8192"]
SMOKE = ["data.n_train=16", "data.n_val=8", "sft.max_steps=2"]


def job_overrides(probe: str, style: str, seed: int, root: Path, extra: list[str]) -> list[str]:
    cat, knobs = PROBES[probe]
    return [f"data.categories=[{cat}]", f"+data.difficulty.{cat}={knobs}", f"data.trace_style={style}", *ROOMY,
            f"seed={seed}", f"run_name=trace_bench_{probe}_{style}_seed{seed}",
            f"run_dir={root / probe / style / f'seed{seed}'}", *extra]


def completion_cap(overrides: list[str]) -> tuple[int, list[int]]:
    """The per-style cap and the training completions' token counts, from the run's own split and tokenizer."""
    from lab.data import dataset as data
    from lab.data.sft_examples import sft_examples
    from lab.model import models
    from lab.core.config import compose

    cfg = compose(overrides)
    train, _ = data.prepare(cfg)
    tok = models.load_tokenizer(cfg)
    examples, _ = sft_examples(tok, train, cfg.sft.max_seq_len, data.trace_style(cfg))
    n = [len(tok(c, add_special_tokens=False)["input_ids"]) for c in examples["completion"]]
    return max(64, math.ceil(1.25 * max(n, default=0))), n


def run_job(overrides: list[str], force: bool) -> dict:
    """One job: train, score the saved adapter, finish the stage; a finished job with the same config is reused."""
    import numpy as np

    from lab.data import dataset as data
    from lab.eval import sampling
    from lab.model import generate
    from lab.recipes import sft as recipe
    from lab.core.config import compose, config_data, saved_config_matches
    from lab.core.io import read_json
    from lab.core.paths import resolve_path
    from lab.core.run import Stage

    from lab.core import owner

    first = compose(overrides)  # the job's run folder claimed before its split and tiny model are made in it
    owner.claim_run(first.run_dir, first.run_name, bool(first.overwrite))
    cap, n = completion_cap(overrides)
    overrides = [*overrides, f"infer.max_tokens={cap}"]
    cfg = compose(overrides)
    stage_dir = resolve_path(cfg.run_dir) / "02_sft"
    if not force and (stage_dir / "metrics.json").is_file() \
            and saved_config_matches(stage_dir / "config.yaml", config_data(cfg)):
        return read_json(stage_dir / "metrics.json")
    stage = Stage("02_sft", overrides)
    cfg = stage.cfg
    train, val = data.prepare(cfg)
    trainee = recipe.sft_model(stage)  # the 02_sft recipe's own steps: LoRA, examples, training (model released)
    metrics = recipe.sft_train(stage, recipe.sft_examples(stage, train, trainee), trainee).metrics
    generate.release_memory()
    with generate.Generator(cfg, adapter=cfg.sft.adapter_dir) as gen:
        pred = sampling.predictions(gen, val, out_csv=stage.path("predictions.csv"))
    return stage.finish({"n": len(pred), "correct": int(pred["correct"].sum()),
                         "capped": int((pred["finish_reason"] == "length").sum()), "max_tokens": cap,
                         "trace_tokens_p50": float(np.median(n)) if n else None, "trace_tokens_max": max(n, default=0),
                         "train_loss": metrics["train_loss"], "steps": metrics["steps"],
                         "examples": metrics["examples"]["kept"]})


def tables(rows: list[dict]):
    """(per job, pooled over seeds per probe x style): accuracy with its 95% Wilson interval."""
    import pandas as pd

    from lab.eval.analysis import wilson_interval

    def acc(k, n):
        lo, hi = wilson_interval(k, n)
        return {"accuracy": k / n if n else None, "lo": lo, "hi": hi}

    table = pd.DataFrame([{**r, **acc(r["correct"], r["n"])} for r in rows])
    pooled = [{"probe": probe, "style": style, "seeds": len(g), "n": int(g["n"].sum()),
               **acc(int(g["correct"].sum()), int(g["n"].sum())), "capped": int(g["capped"].sum()),
               "trace_tokens_p50": g["trace_tokens_p50"].median(), "wall_s": g["wall_s"].sum()}
              for (probe, style), g in table.groupby(["probe", "style"], sort=False)]
    return table, pd.DataFrame(pooled)


def main(argv: list[str] | None = None) -> int:
    from lab.core.config import split_at_dashes
    from lab.core.io import atomic_write_json, atomic_write_text, read_json
    from lab.core.paths import resolve_path
    from lab.runs.sweep_report import markdown_table

    own, extra = split_at_dashes(argv)
    ap = argparse.ArgumentParser(prog="bench/trace_bench.py")
    ap.add_argument("--categories", nargs="+", default=["numerals", "equations"], choices=list(PROBES))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="the smallest budget: checks the plumbing only")
    ap.add_argument("--force", action="store_true", help="rerun finished jobs")
    ap.add_argument("--report", action="store_true", help="run nothing: tabulate the finished jobs found on disk")
    ap.add_argument("--out", default="outputs/bench")
    args = ap.parse_args(own)
    out = resolve_path(args.out)
    root = out / ("trace_bench_smoke" if args.smoke else "trace_bench")
    extra = [*(SMOKE if args.smoke else []), *extra]
    t0 = time.perf_counter()
    rows = []
    for probe in args.categories:
        for style in STYLES:
            for seed in range(1, args.seeds + 1):
                print(f"[trace_bench] {probe} {style} seed {seed}", flush=True)
                if args.report:
                    done = root / probe / style / f"seed{seed}" / "02_sft" / "metrics.json"
                    if not done.is_file():
                        print(f"[trace_bench] {done}: not finished, left out of the table")
                        continue
                    m = read_json(done)
                else:
                    m = run_job(job_overrides(probe, style, seed, root, extra), args.force)
                rows.append({"probe": probe, "style": style, "seed": seed,
                             **{k: m[k] for k in ("n", "correct", "capped", "trace_tokens_p50", "trace_tokens_max",
                                                  "max_tokens", "train_loss", "steps")}, "wall_s": m["wall_seconds"]})
    if not rows:
        print(f"no finished jobs under {root}", file=sys.stderr)
        return 1
    table, pooled = tables(rows)
    wall = time.perf_counter() - t0
    text = ("## Trace learnability probe" + (" (SMOKE budget: plumbing only)" if args.smoke else "") + "\n\n"
            + markdown_table(table) + "\n\npooled over seeds:\n\n" + markdown_table(pooled)
            + f"\n\njob wall seconds in all: {table['wall_s'].sum():.0f}; this invocation: {wall:.0f} s"
            + f"; extra overrides: {extra}\n")
    print(text)
    atomic_write_text(out / ("trace_bench_smoke.md" if args.smoke else "trace_bench.md"), text)
    atomic_write_json(out / ("trace_bench_smoke.json" if args.smoke else "trace_bench.json"),
                      {"smoke": args.smoke, "jobs": table.to_dict("records"), "pooled": pooled.to_dict("records"), "overrides": extra})
    return 0


if __name__ == "__main__":
    sys.exit(main())
