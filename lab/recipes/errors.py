"""05_errors: where the final adapter's greedy predictions fail, and what changed since 02_sft.

`errors` runs the steps below in order; notebooks/05_errors.ipynb calls the same steps, one cell each, and draws the
figures and tables they return. The analysis itself (the failure taxonomy, the tables) is `lab.eval.analysis`,
which returns data; every file of `<run_dir>/05_errors/` is written here."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from lab import LabError
from lab.core.io import atomic_write_csv, atomic_write_json
from lab.core.run import Stage, stage_output
from lab.recipes import common

if TYPE_CHECKING:
    from lab.eval.analysis import SolverView

# what the analysis writes besides metrics.json (listed in errors_metrics.json); the solver's tables need prompts
ANALYSIS_FILES = ("accuracy_by_category.csv", "accuracy_by_subtype.csv", "accuracy_by_category.png", "taxonomy.csv",
                  "taxonomy.png", "lengths.csv", "lengths.png", "failures.csv", "errors_metrics.json")
SOLVER_FILES = ("solutions.csv", "accuracy_by_status.csv", "departures.csv", "departure_summary.csv", "imitation.csv")


def errors(stage: Stage) -> dict:
    """The whole stage, step by step (what the pipeline's headless callers run)."""
    pred = final_predictions(stage)
    budget = error_budget(stage, pred)
    failures = classify(pred, budget)
    by_category = accuracy(stage, failures)
    classes = taxonomy(stage, failures)
    solver = solver_or_imitation(stage, failures)
    lengths(stage, failures, budget)
    changes = changes_since_sft(stage, pred)
    return errors_finish(stage, failures, solver, by_category, classes, budget, changes)


def final_predictions(stage: Stage) -> pd.DataFrame:
    """04_vote's greedy predictions of the final adapter (`lab.eval.analysis.load_predictions`)."""
    from lab.eval import analysis

    return analysis.load_predictions(stage_output(stage.cfg, "04_vote", "predictions.csv"))


def error_budget(stage: Stage, pred: pd.DataFrame) -> int:
    """The completion budget the evaluation allowed: that of the prompts that were generated (a prompt with no
    room was skipped: `sampling.SKIPPED`), else `infer.max_tokens`."""
    from lab.competition.prompts import chat_prompt
    from lab.eval import sampling
    from lab.model import generate, models

    cfg = stage.cfg
    tok = models.load_tokenizer(cfg)
    kept = [chat_prompt(tok, p) for p, why in zip(pred["prompt"], pred["finish_reason"]) if why != sampling.SKIPPED]
    budget = (generate.completion_budget(tok, kept, cfg.infer.max_tokens, cfg.model.max_model_len) if kept
              else cfg.infer.max_tokens)
    print(f"{len(pred)} predictions, completion budget {budget} tokens")
    return budget


def classify(pred: pd.DataFrame, budget: int) -> pd.DataFrame:
    """The taxonomy: one failure class per prediction (`lab.eval.analysis.classify_failure`, first match in
    FAILURE_PRIORITY: truncated at `budget`, `</think>` never written, no box, empty box, wrong format, numeric
    near miss, right answer in the reasoning, wrong)."""
    from lab.eval import analysis

    failures = analysis.with_failures(pred, budget=budget)
    if failures.empty:
        raise LabError("05_errors: no predictions to analyse")
    print(f"{len(failures)} predictions, accuracy {failures['correct'].mean():.3f}")
    return failures


def accuracy(stage: Stage, failures: pd.DataFrame) -> common.Drawn:
    """Accuracy per category with Wilson 95% intervals (`accuracy_by_category.csv`, `.png`), and per subtype
    (`accuracy_by_subtype.csv`)."""
    from lab.core import plots
    from lab.eval import analysis

    table = analysis.accuracy_table(failures, ("category",))
    atomic_write_csv(stage.path("accuracy_by_category.csv"), table)
    atomic_write_csv(stage.path("accuracy_by_subtype.csv"), analysis.accuracy_table(failures, ("category", "subtype")))
    fig = plots.accuracy_bars({"final": table}, "Held-out accuracy by category")
    plots.save(fig, stage.path("accuracy_by_category.png"))
    return common.Drawn(table, fig)


def taxonomy(stage: Stage, failures: pd.DataFrame) -> common.Drawn:
    """Counts per category and failure class (`taxonomy.csv`, `taxonomy.png`)."""
    from lab.core import plots
    from lab.eval import analysis

    table = analysis.taxonomy(failures)
    atomic_write_csv(stage.path("taxonomy.csv"), table)
    fig = plots.taxonomy(table)
    plots.save(fig, stage.path("taxonomy.png"))
    return common.Drawn(table, fig)


def failure_examples(failures: pd.DataFrame, cls: str, n: int = 1) -> pd.DataFrame:
    """Up to `n` predictions of failure class `cls` (`lab.eval.analysis.examples`); shown, not written."""
    from lab.eval import analysis

    return analysis.examples(failures, cls, n=n)


def solver_or_imitation(stage: Stage, failures: pd.DataFrame) -> SolverView | None:
    """The solver on every prompt, traces in the trained style (`solutions.csv`, its cache): accuracy by solver
    status, where completions first leave the solver's trace, and per category whether a miss is the solver's or
    the imitation's (`accuracy_by_status.csv`, `departures.csv`, `departure_summary.csv`, `imitation.csv`). None
    when some prediction has no prompt."""
    from lab.data import dataset as data
    from lab.eval import analysis

    if not (failures["prompt"] != "").all():
        return None
    view = analysis.solver_view(failures, cache_path=stage.path("solutions.csv"), style=data.trace_style(stage.cfg))
    for name, table in (("accuracy_by_status.csv", view.by_status), ("departures.csv", view.departures),
                        ("departure_summary.csv", view.departure_summary), ("imitation.csv", view.imitation)):
        atomic_write_csv(stage.path(name), table)
    return view


def lengths(stage: Stage, failures: pd.DataFrame, budget: int) -> common.Drawn:
    """Completion tokens per category, correct against wrong, and how many hit the budget (`lengths.csv`,
    `lengths.png`)."""
    from lab.core import plots
    from lab.eval import analysis

    table = analysis.length_table(failures, budget)
    atomic_write_csv(stage.path("lengths.csv"), table)
    fig = plots.lengths(failures, budget, analysis.ordered_categories(failures))
    plots.save(fig, stage.path("lengths.png"))
    return common.Drawn(table, fig)


def changes_since_sft(stage: Stage, pred: pd.DataFrame) -> pd.DataFrame:
    """Puzzles fixed and broken between 02_sft's predictions and `pred`, per category and over all
    (`compare_sft_vs_final.csv`)."""
    from lab.eval import analysis

    changes, _ = analysis.compare(analysis.load_predictions(stage_output(stage.cfg, "02_sft", "predictions.csv")), pred)
    atomic_write_csv(stage.path("compare_sft_vs_final.csv"), changes)
    return changes


def errors_finish(stage: Stage, failures: pd.DataFrame, solver: SolverView | None, by_category: common.Drawn,
                  classes: common.Drawn, budget: int, changes: pd.DataFrame) -> dict:
    """`failures.csv` (one row per prediction with its class), `errors_metrics.json` (the headline and the files
    written) and metrics.json (the headline and the net change since 02_sft); finishes the stage."""
    from lab.eval import analysis

    table = analysis.failures_table(failures if solver is None else solver.failures)
    atomic_write_csv(stage.path("failures.csv"), table)
    headline = analysis.headline(by_category.table, classes.table, budget, solver)
    files = sorted(ANALYSIS_FILES + (SOLVER_FILES if solver is not None else ()))
    atomic_write_json(stage.path("errors_metrics.json"), {**headline, "files": files})
    net = changes.set_index("category").loc["all"]  # the row over all categories (the others add up to it)
    return stage.finish({**headline, "fixed_since_sft": int(net["fixed"]), "broken_since_sft": int(net["broken"])})
