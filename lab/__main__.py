"""`python -m lab COMMAND ...`: the lab's one command line. Each command lives in the package that owns it; this
table is the only list of them (`python -m lab --help` prints it)."""

from __future__ import annotations

import importlib
import os
import sys

from lab import LabError
from lab.core import console

COMMANDS = {
    # running the notebooks
    "demo": ("lab.runs.pipeline", "demo_main", "run the five stage notebooks on the embedded default (or overrides)"),
    "summary": ("lab.runs.pipeline", "summary_main", "collect a run's stage metrics into summary.md/json"),
    "sweep": ("lab.runs.cli", "sweep_main", "run notebooks over a grid of overrides (papermill + Hydra)"),
    "report": ("lab.runs.cli", "report_main", "one table and plots across a sweep's jobs"),
    # scoring and comparing
    "score": ("lab.eval.cli", "score_main", "score PREDICTIONS.csv against --gold GOLD.csv"),
    "compare": ("lab.eval.cli", "compare_main", "puzzles fixed and broken between RUN_A and RUN_B"),
    "puzzles": ("lab.puzzles.cli", "main", "solve | check | audit | generate: the per-category solvers"),
    # the config and the GPU plan
    "schema": ("lab.core.schema", "main", "every config key's type, help and range [GROUP]"),
    "memory": ("lab.plan.memory_cli", "main", "trace one training step on fake tensors: peak GPU memory, does it fit"),
    "estimate": ("lab.plan.estimate", "main", "projected SFT, GRPO, evaluation and vote time on the gpu= card"),
    "calibrate": ("lab.train.calibrate", "main",
                  "on the card: each fast path's exactness and the step's speed, for estimate"),
    # the submission and Kaggle
    "pack": ("lab.model.submission", "pack_main", "ADAPTER_DIR OUT.zip: pack a Kaggle submission.zip"),
    "check": ("lab.model.submission", "check_main", "ZIP: every problem of a submission.zip; exit 0 when valid"),
    "gate": ("lab.kaggle.gate", "main", "ZIP --model DIR: the zip served by vLLM as the scorer does"),
    "kaggle": ("lab.kaggle.kernel", "main",
               "dataset | build [--chain] | run --chain | plan: offline Kaggle kernels within Kaggle's limits"),
}


def usage() -> str:
    return "usage: python -m lab COMMAND [ARGS]   (python -m lab COMMAND --help for its options)\n\ncommands:\n" + \
        "\n".join(f"  {name:<8} {help_}" for name, (_, _, help_) in COMMANDS.items())


def main(argv: list[str] | None = None) -> int:
    """Run one command; every error becomes one line on stderr (`lab.core.console.report_error`), the traceback only
    with `--debug` (anywhere on the line) or LAB_DEBUG=1."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--debug" in argv:
        argv.remove("--debug")
        os.environ[console.DEBUG_ENV] = "1"  # the stage kernels a command starts inherit it
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        if argv and argv[0] not in ("-h", "--help"):
            print(f"error: no command {argv[0]!r}", file=sys.stderr)
        print(usage())
        return 0 if argv[:1] in ([], ["-h"], ["--help"]) else 2
    module, func, _ = COMMANDS[argv[0]]
    try:
        return int(getattr(importlib.import_module(module), func)(argv[1:]) or 0)
    except (Exception, KeyboardInterrupt) as e:
        if console.debugging() and not isinstance(e, LabError):
            raise
        return console.report_error(e)


if __name__ == "__main__":
    sys.exit(main())
