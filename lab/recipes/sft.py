"""02_sft: the base model scored, the SFT adapter trained and scored, its submission packed."""

from __future__ import annotations

import pandas as pd

from lab.core.run import Stage
from lab.recipes import common


# ---- 02_sft -----------------------------------------------------------------------------------------------------

def sft(stage: Stage, launch=None, evaluate_adapter: bool = True) -> dict:
    """Greedy held-out accuracy of the base model, SFT (`lab.train.sft.train`), the saved adapter's accuracy, the
    submission zip: the steps `split`, `score_base`, `sft_model`, `sft_train`, `score_adapter`, `sft_scores`,
    `pack_adapter`, `finish_training`, in that order (the cells of notebooks/02_sft.ipynb).

    `launch`: accelerate's PartialState under `accelerate launch` (scripts/train_sft.py): every process trains, the
    main process alone evaluates and finishes the stage (the others return their training metrics). Under several
    processes the base model is evaluated after training, so that no process waits through a long evaluation in a
    collective. `evaluate_adapter=False` (`--no-eval`) skips both evaluations."""
    cfg = stage.cfg
    train, val = common.split(stage)
    before = None
    if evaluate_adapter and common._processes(launch) == 1:  # the training model is not loaded yet (vLLM needs the GPU)
        before = score_base(stage, val)
    trained = sft_train(stage, train, sft_model(stage), launch)
    if not trained.main:
        return trained.metrics
    scores = None
    if evaluate_adapter:
        if before is None:
            before = score_base(stage, val)
        scores = sft_scores(stage, before, common.score_adapter(stage, val, cfg.sft.adapter_dir))
    return common.finish_training(stage, trained, scores, common.pack_adapter(stage, cfg.sft.adapter_dir), launch)


def score_base(stage: Stage, val: pd.DataFrame, cached: bool = True) -> pd.DataFrame:
    """The base model's greedy predictions on the held-out puzzles (`predictions_before.csv`, through `evaluate`,
    cached like every evaluation: a rerun reuses it; generating leaves torch's random state as it was)."""
    before = common.evaluate(stage, val, None, "predictions_before.csv", cached=cached)
    print(f"held-out accuracy before training: {before['correct'].mean():.3f}")
    return before


def sft_model(stage: Stage) -> common.Trainee:
    """The base model with the configured LoRA attached (`lab.train.sft.model_with_lora`: every configured family
    must match, the rank at most Kaggle's); writes `lora_targets.csv`."""
    from lab.train import sft as sft_lib

    return common.Trainee(*sft_lib.model_with_lora(stage.cfg, stage))


def sft_train(stage: Stage, train: pd.DataFrame, trainee: common.Trainee, launch=None):
    """SFT on the training puzzles' solver traces (`lab.train.sft.train`: examples, checkpoints and resume, the
    gradient check, the adapter saved to `sft.adapter_dir`), then the training model's memory released (`trainee`
    is emptied). Writes `sft_examples.csv`, `train_log.csv`, `gradient_check.csv`, `frozen_check.csv` and, on the
    main process, `loss.png`. Returns a namespace: metrics, log (the step log), figure (the loss), main (False on a
    launch's other processes, which stop here)."""
    from types import SimpleNamespace

    from lab.core import plots
    from lab.train import sft as sft_lib

    lora = (*trainee.take("sft_train"), trainee.table)
    metrics, model, tokenizer, log = sft_lib.train(stage.cfg, stage, train, lora=lora)  # unsloth: lab.train.sft_unsloth
    common._stopped_note(stage, metrics, "sft")  # a wall-clock budget stop: how the next run (or Kaggle kernel) resumes
    del model, tokenizer, lora  # the saved adapter is scored, never the in-memory model
    main = common._main_alone(launch)
    fig = common._save(stage, plots.line(log, "step", ["loss"], "SFT training loss", "loss"), "loss.png") if main else None
    return SimpleNamespace(metrics=metrics, log=log, figure=fig, main=main)


def sft_scores(stage: Stage, before: pd.DataFrame, after: pd.DataFrame):
    """Accuracy before and after SFT, overall and per category; writes `accuracy.png`. Returns a namespace: metrics
    (accuracy_before, accuracy_after, lift, per_category), table (per category), figure."""
    from types import SimpleNamespace

    print(f"held-out accuracy: before SFT {before['correct'].mean():.3f}, after {after['correct'].mean():.3f}")
    per_category = common._per_category(before=before, after=after)
    fig = common._save(stage, common._accuracy_plot(before, after, "before SFT", "after SFT", "SFT"), "accuracy.png")
    metrics = {"accuracy_before": float(before["correct"].mean()), "accuracy_after": float(after["correct"].mean()),
               "lift": float(after["correct"].mean() - before["correct"].mean()), "per_category": per_category}
    return SimpleNamespace(metrics=metrics, table=pd.DataFrame.from_dict(per_category, orient="index"), figure=fig)
