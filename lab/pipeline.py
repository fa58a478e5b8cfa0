"""Running the five notebooks headless and summarising a run: `python -m lab demo` / `summary`.

`run_notebooks` executes notebooks/01_explore ... 05_errors through papermill, in order, each
with the same Hydra overrides (the notebooks' `parameters` cell holds `overrides`), writing the
executed copies into `<run_dir>/notebooks/`. `summary` collects every stage's `metrics.json`
into `summary.json` and `summary.md` beside them. `make demo` is `python -m lab demo`.

Deliberately simple: stages run one after another in one process tree; sweeps over many runs
live in `lab.sweep`.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from lab.config import (LabError, atomic_write_json, atomic_write_text, compose, project_root, read_json, resolve_path,
                        run_lock)

STAGES = ["01_explore", "02_sft", "03_grpo", "04_vote", "05_errors"]

# The smallest budget on which every stage still runs end to end (tests and smoke runs).
SMOKE_OVERRIDES = ["data.n_train=16", "data.n_val=4", "data.explore_max=16", "infer.max_tokens=24",
                   "sft.max_steps=2", "sft.batch_size=4", "sft.warmup_ratio=0", "sft.save_steps=1000", "grpo.max_steps=1", "grpo.n_prompts=4",
                   "grpo.pass_rate_k=2", "grpo.drop_threshold=1.0", "grpo.drop_unsolved=false", "grpo.num_generations=2",
                   "grpo.prompts_per_step=2", "grpo.mask_truncated_completions=false", "vote.k=2"]


def run_notebooks(overrides: list[str], stages: list[str] = STAGES, out_dir: Path | None = None,
                  log_output: bool = True) -> Path:
    """Execute the stage notebooks with papermill; returns the run directory."""
    import papermill as pm

    cfg = compose(overrides)  # validated: a bad value stops here, before any stage folder is touched
    unknown = [s for s in stages if s not in STAGES or not (project_root() / "notebooks" / f"{s}.ipynb").is_file()]
    if unknown:
        raise LabError(f"{project_root() / 'notebooks'}: no stage notebook {unknown} (stages are {', '.join(STAGES)})")
    run_dir = resolve_path(cfg.run_dir)
    with run_lock(run_dir):  # one writer per run folder; the notebooks' kernels inherit the lock
        out_dir = out_dir or run_dir / "notebooks"
        out_dir.mkdir(parents=True, exist_ok=True)
        logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout, force=True)
        for name in stages:
            src = project_root() / "notebooks" / f"{name}.ipynb"
            t0 = time.time()
            print(f"\n=== {name}: running {src.name} -> {out_dir / src.name}", flush=True)
            pm.execute_notebook(str(src), str(out_dir / src.name), parameters={"overrides": list(overrides)},
                                cwd=str(project_root()), log_output=log_output, progress_bar=False,
                                kernel_name="python3")
            print(f"=== {name}: done in {time.time() - t0:.0f} s", flush=True)
    return run_dir


def stages_and_overrides(words: list[str]) -> tuple[list[str], list[str]]:
    """Sort a command line's words into stage names and Hydra overrides, each in the order given (later overrides
    win, as in Hydra), wherever they stand: `--stages 02_sft sft.max_steps=2` and `sft.max_steps=2 02_sft` mean
    the same. A word that is neither a stage nor an override (`key=value`, `+key=value`, `~key`) is refused, so
    nothing runs with settings the user did not mean."""
    out_stages, out_over = [], []
    for word in words:
        if word in STAGES:
            out_stages.append(word)
        elif "=" in word or word.startswith("~"):
            out_over.append(word)
        else:
            raise LabError(f"{word!r} is neither a stage ({', '.join(STAGES)}) nor a Hydra override (key=value)")
    return out_stages, out_over


def headline(run_dir: Path) -> dict:
    """Each stage's metrics.json, keyed by stage; stages that did not finish are listed as missing."""
    out = {}
    for name in STAGES:
        p = run_dir / name / "metrics.json"
        out[name] = read_json(p) if p.is_file() else {"missing": True}
    return out


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3f}"
    if isinstance(v, dict):
        return ", ".join(f"{k}: {_fmt(x)}" for k, x in v.items())
    if isinstance(v, list):
        return "[" + ", ".join(_fmt(x) for x in v[:40]) + (" ..." if len(v) > 40 else "") + "]"
    return str(v)


def summary(run_dir: Path) -> dict:
    """Write summary.json and summary.md for a run directory; returns the summary."""
    run_dir = Path(run_dir)
    stages = headline(run_dir)
    summ = {"run_dir": str(run_dir), "stages": stages,
            "total_wall_seconds": round(sum(s.get("wall_seconds", 0) for s in stages.values()), 1)}
    atomic_write_json(run_dir / "summary.json", summ)
    lines = [f"# Run summary: {run_dir.name}", "", f"Total wall time: {summ['total_wall_seconds']} s", ""]
    for name, metrics in stages.items():
        lines += [f"## {name}", "", "| metric | value |", "|---|---|"]
        lines += [f"| {k} | {_fmt(v)} |" for k, v in metrics.items()]
        lines.append("")
    atomic_write_text(run_dir / "summary.md", "\n".join(lines))
    return summ


def demo_main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab demo", description="run all five notebooks on the embedded default")
    p.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. seed=7 run_name=demo_seed7")
    p.add_argument("--stages", nargs="+", default=[], help="subset of stages to run (default: all five); stage "
                   "names and overrides may come in any order")
    p.parse_args(argv)  # usage and help; the words are sorted below, in their command-line order
    stages, overrides = stages_and_overrides([w for w in (sys.argv[1:] if argv is None else argv)
                                              if w not in ("--stages", "--")])
    t0 = time.time()
    run_dir = run_notebooks(overrides, stages or STAGES)
    summ = summary(run_dir)
    print(f"\nDemo finished in {time.time() - t0:.0f} s.")
    print(f"Executed notebooks: {run_dir / 'notebooks'}")
    print(f"Summary: {run_dir / 'summary.md'} and {run_dir / 'summary.json'}")
    print(json.dumps({k: {m: v for m, v in s.items() if m in HEADLINE_KEYS} for k, s in summ["stages"].items()},
                     indent=1))
    return 0


HEADLINE_KEYS = {"accuracy_before", "accuracy_after", "accuracy_sft_start", "greedy_accuracy", "maj_at_k",
                 "pass_at_k", "accuracy", "wall_seconds", "n_train", "n_val"}


def summary_main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab summary", description="collect a run's stage metrics")
    p.add_argument("run_dir", help="a run directory, e.g. outputs/demo")
    args = p.parse_args(argv)
    run_dir = resolve_path(args.run_dir)
    if not run_dir.is_dir():
        raise LabError(f"{run_dir}: run directory not found")
    summary(run_dir)
    print(f"wrote {run_dir / 'summary.md'} and {run_dir / 'summary.json'}")
    return 0
