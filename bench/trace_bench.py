"""Learnability probe: the same small model trained on each trace style, held-out accuracy per style and category.

`python bench/trace_bench.py [--categories bits equations] [--seeds 3] [--smoke] [-- HYDRA_OVERRIDES ...]`

What it measures
  For each category where the styles differ most (bits with two-copy rules, `complexity=2`; numeric equations),
  a sweep (`lab.sweep`, stages 01_explore and 02_sft) over `data.trace_style=compact,derivation` x seeds 1..N:
  each job generates that category's synthetic puzzles, trains the configured model (the tiny demo's by default)
  with SFT on the solver's traces in that style, and scores the saved adapter greedily on the held-out puzzles.
  Per category x style x seed: held-out accuracy with its 95% Wilson interval (`lab.errors.wilson_interval`),
  the traces' median tokens (`01_explore/trace_tokens.csv`, the model's own tokenizer), and the wall seconds;
  then per category x style the accuracy pooled over seeds. Output: a printed table and
  `outputs/bench/trace_bench.json` / `trace_bench.md`, written atomically; every figure comes from the run.
  Long traces need room: the tiny model is given `model.max_model_len` and its position limit of 8,192 tokens
  and the whole 7,680-token completion budget (overridable). On a GPU the same command takes `model=nemotron_nano`.

What it simplifies
  * A study, not a tuned result: one SFT recipe for both styles (the config's), no GRPO, greedy decoding only.
  * The sweep's own caching applies: a rerun keeps finished jobs (`--force` reruns them).
  * `--smoke` (the pipeline's smallest budget: 16 training puzzles, 2 optimiser steps, 24 new tokens) checks the
    plumbing only; its accuracies say nothing about learnability.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CATEGORIES = {  # probe name -> (category, generator knobs for data.difficulty)
    "bits": ("bit_manipulation", "{complexity: 2}"),
    "equations": ("equation_transformation", "{symbolic: 0.0, guess: 0.0}"),
}
ROOMY = ["model.max_model_len=8192", "model.architecture.max_position_embeddings=8192", "infer.max_tokens=7680"]


def job_rows(sweep_dir: Path, probe: str, wall: float) -> list[dict]:
    import pandas as pd

    from lab.config import load_saved
    from lab.errors import wilson_interval
    from lab.sweep import find_jobs

    rows = []
    for job in find_jobs(sweep_dir):
        cfg = load_saved(job / "config.yaml")
        pred = job / "02_sft" / "predictions.csv"
        row = {"probe": probe, "style": cfg.data.trace_style, "seed": cfg.seed, "n": 0, "correct": 0,
               "accuracy": None, "lo": None, "hi": None, "trace_tokens_p50": None, "sweep_wall_s": round(wall, 1)}
        if pred.is_file():
            p = pd.read_csv(pred, dtype=str, keep_default_na=False)
            k, n = int((p["correct"] == "True").sum()), len(p)
            lo, hi = wilson_interval(k, n)
            row.update(n=n, correct=k, accuracy=round(k / n, 4) if n else None, lo=round(lo, 4), hi=round(hi, 4))
        tok = job / "01_explore" / "trace_tokens.csv"
        if tok.is_file():
            t = pd.read_csv(tok)
            t = t[t["trace_style"] == row["style"]]
            row["trace_tokens_p50"] = float(t["p50"].iloc[0]) if len(t) else None
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    import pandas as pd

    from lab.config import atomic_write_json, atomic_write_text, resolve_path
    from lab.errors import wilson_interval
    from lab.sweep import markdown_table, sweep

    ap = argparse.ArgumentParser(prog="bench/trace_bench.py")
    ap.add_argument("--categories", nargs="+", default=list(CATEGORIES), choices=list(CATEGORIES))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="the pipeline's smallest budget: checks the plumbing only")
    ap.add_argument("--force", action="store_true", help="rerun finished jobs")
    ap.add_argument("--out", default="outputs/bench")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for every job (e.g. model=nemotron_nano)")
    args = ap.parse_args(argv)
    out = resolve_path(args.out)
    rows = []
    for probe in args.categories:
        cat, knobs = CATEGORIES[probe]
        overrides = [f"data.categories=[{cat}]", f"+data.difficulty.{cat}={knobs}",
                     "data.trace_style=compact,derivation", *ROOMY, *args.overrides]
        t0 = time.perf_counter()
        sweep_dir, _ = sweep(overrides, name=f"trace_bench_{probe}" + ("_smoke" if args.smoke else ""),
                             stages=["01_explore", "02_sft"], seeds=args.seeds, smoke=args.smoke, force=args.force)
        rows += job_rows(sweep_dir, probe, time.perf_counter() - t0)
    table = pd.DataFrame(rows).sort_values(["probe", "style", "seed"])
    pooled = []
    for (probe, style), g in table.groupby(["probe", "style"]):
        k, n = int(g["correct"].sum()), int(g["n"].sum())
        lo, hi = wilson_interval(k, n)
        pooled.append({"probe": probe, "style": style, "seeds": len(g), "n": n,
                       "accuracy": round(k / n, 4) if n else None, "lo": round(lo, 4), "hi": round(hi, 4),
                       "trace_tokens_p50": g["trace_tokens_p50"].median()})
    pooled = pd.DataFrame(pooled)
    text = ("## Trace learnability probe" + (" (SMOKE budget: plumbing only)" if args.smoke else "") + "\n\n"
            + markdown_table(table) + "\n\npooled over seeds:\n\n" + markdown_table(pooled) + "\n")
    print(text)
    atomic_write_text(out / "trace_bench.md", text)
    atomic_write_json(out / "trace_bench.json", {"smoke": args.smoke, "jobs": table.to_dict("records"),
                                                 "pooled": pooled.to_dict("records"), "overrides": args.overrides})
    return 0


if __name__ == "__main__":
    sys.exit(main())
