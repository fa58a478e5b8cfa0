"""The Nemotron reasoning lab: the logic behind the notebooks (README.md; the docs in docs/).

Packages, top to bottom as the import contract in pyproject.toml layers them (a package imports only those below):
  __main__     python -m lab COMMAND: the one table of commands
  kaggle       offline Kaggle kernels and their dataset; the gate (a submission.zip served by vLLM)
  runs         the one stage runner (papermill), the five notebooks headless, the run summary, sweeps, their report
  recipes      one module per notebook: its steps in order, called by the notebook cell by cell and by its script
  train        SFT and GRPO (TRL + PEFT), rewards, trainer callbacks, checkpoints, calibration on the card
  plan         before anything loads: the memory trace, the estimates, the Kaggle output plan, the preflight
  eval         voting and pass@k / maj@k, the error analysis, `score` and `compare`
  model        loading the model, LoRA, generation (HF / vLLM), packing and checking submission.zip
  data         the puzzle CSV, its split and the data mix; the GRPO curriculum
  puzzles      per-category solvers, traces, the trace checker and generators (lab/puzzles/README.md)
  competition  the competition's scorer and prompt, to the character
  core         plumbing: config and schema, run folders, paths, atomic io, lineage, console, stats, plots
Each package's __init__ says what its modules hold, one line each.
"""

__version__ = "0.1.0"


class LabError(Exception):
    """An error whose message names the file and the problem; shown to users as is."""

    def _render_traceback_(self) -> list[str]:
        """In IPython (Jupyter, papermill) the error is shown as this one line, not a traceback: the message is what
        helps (IPython/core/interactiveshell.py, `showtraceback`, calls this hook when an exception has it)."""
        return [f"LabError: {self}"]

