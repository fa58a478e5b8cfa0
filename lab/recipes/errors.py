"""05_errors: the final predictions' errors classified and compared with the SFT adapter's."""

from __future__ import annotations

import pandas as pd

from lab.core.io import atomic_write_csv
from lab.core.run import Stage, stage_output


# ---- 05_errors --------------------------------------------------------------------------------------------------

def errors(stage: Stage) -> dict:
    """Error analysis of 04_vote's greedy predictions (`lab.eval.analysis.analyse`: every table and plot) against the
    completion budget the evaluation allowed, and the puzzles fixed and broken since 02_sft: the steps
    `final_predictions`, `error_budget`, `analyse_errors`, `changes_since_sft`, `errors_finish` (the cells of
    notebooks/05_errors.ipynb)."""
    pred = final_predictions(stage)
    analysed = analyse_errors(stage, pred, error_budget(stage, pred))
    return errors_finish(stage, analysed, changes_since_sft(stage, pred))


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
    return (generate.completion_budget(tok, kept, cfg.infer.max_tokens, cfg.model.max_model_len) if kept
            else cfg.infer.max_tokens)


def analyse_errors(stage: Stage, pred: pd.DataFrame, budget: int):
    """`lab.eval.analysis.analyse` into the stage folder, against the trained trace style: every table (CSV) and plot
    (PNG). Returns a namespace: metrics (the headline), figures ({"accuracy_by_category", "taxonomy", "lengths"})."""
    from types import SimpleNamespace

    from lab.data import dataset as data
    from lab.eval import analysis

    figures: dict = {}
    headline = analysis.analyse(pred, stage.dir, budget=budget, style=data.trace_style(stage.cfg), figures=figures)
    print(f"{headline['n']} predictions, accuracy {headline['accuracy']:.3f}")
    return SimpleNamespace(metrics=headline, figures=figures)


def failure_examples(pred: pd.DataFrame, cls: str, budget: int, n: int = 1) -> pd.DataFrame:
    """Up to `n` predictions of failure class `cls` (`lab.eval.analysis.examples`) judged against `budget`."""
    from lab.eval import analysis

    return analysis.examples(pred, cls, n=n, budget=budget)


def changes_since_sft(stage: Stage, pred: pd.DataFrame) -> pd.DataFrame:
    """Puzzles fixed and broken between 02_sft's predictions and `pred`, per category and over all
    (`compare_sft_vs_final.csv`)."""
    from lab.eval import analysis

    changes, _ = analysis.compare(analysis.load_predictions(stage_output(stage.cfg, "02_sft", "predictions.csv")), pred)
    atomic_write_csv(stage.path("compare_sft_vs_final.csv"), changes)
    return changes


def errors_finish(stage: Stage, analysed, changes: pd.DataFrame) -> dict:
    """05_errors' metrics.json: the headline and the net change since 02_sft; finishes the stage."""
    net = changes.set_index("category").loc["all"]  # the row over all categories (the others add up to it)
    return stage.finish({**{k: v for k, v in analysed.metrics.items() if k != "files"},
                         "fixed_since_sft": int(net["fixed"]), "broken_since_sft": int(net["broken"])})
