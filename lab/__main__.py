"""`python -m lab COMMAND ...`: the lab's command line. Each command lives in the module that owns it."""

from __future__ import annotations

import importlib
import sys

from lab import LabError

COMMANDS = {
    "demo": ("lab.pipeline", "demo_main", "run all five notebooks on the embedded default"),
    "summary": ("lab.pipeline", "summary_main", "collect a run's stage metrics into summary.md/json"),
    "score": ("lab.cli", "score_main", "score PREDICTIONS.csv against --gold GOLD.csv"),
    "compare": ("lab.cli", "compare_main", "puzzles fixed and broken between RUN_A and RUN_B"),
    "sweep": ("lab.cli", "sweep_main", "run notebooks over a grid of overrides (papermill + Hydra)"),
    "report": ("lab.cli", "report_main", "one table and plots across a sweep's jobs"),
    "kaggle": ("lab.kaggle", "main", "build an offline Kaggle kernel or its dependency dataset"),
    "submission": ("lab.submission", "main", "pack ADAPTER_DIR OUT.zip / check ZIP: the Kaggle submission"),
    "memory": ("lab.memory", "main", "trace one training step on fake tensors: peak GPU memory, does it fit"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print("usage: python -m lab COMMAND [ARGS]\n\ncommands:")
        for name, (_, _, help_) in COMMANDS.items():
            print(f"  {name:<8} {help_}")
        return 0 if argv[:1] in ([], ["-h"], ["--help"]) else 2
    module, func, _ = COMMANDS[argv[0]]
    try:
        return int(getattr(importlib.import_module(module), func)(argv[1:]) or 0)
    except LabError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
