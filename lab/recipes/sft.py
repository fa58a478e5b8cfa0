"""02_sft: the base model scored, a LoRA attached and trained on solver traces, the saved adapter scored, its
submission packed. `sft` runs the steps below in order; notebooks/02_sft.ipynb runs the same steps as cells, and
scripts/train_sft.py runs `sft` under `accelerate launch`."""

from __future__ import annotations

import pandas as pd

from lab.core.io import atomic_write_csv
from lab.core.run import Stage
from lab.eval import greedy
from lab.model.lora import Trainee
from lab.recipes import common
from lab.train import launch as launch_lib


def sft(stage: Stage, launch=None, evaluate_adapter: bool = True) -> dict:
    """The whole stage: `common.split`, `score_base`, `sft_model`, `sft_examples`, `sft_train`,
    `score_adapter`, `sft_scores`, `common.pack_adapter`, `common.finish_training`.

    `launch`: accelerate's PartialState under `accelerate launch`: every process trains, the main process alone
    evaluates and finishes the stage (the others return their training metrics). Under several processes the base
    model is scored after training, so no process waits through a long evaluation in a collective.
    `evaluate_adapter=False` (`--no-eval`) skips both evaluations."""
    cfg = stage.cfg
    train, val = common.split(stage)
    before = None
    if evaluate_adapter and launch_lib.processes(launch) == 1:  # before the training model loads (vLLM: the GPU)
        before = score_base(stage, val)
    trainee = sft_model(stage)
    examples = sft_examples(stage, train, trainee)
    trained = sft_train(stage, examples, trainee, launch)
    if not trained.main:
        return trained.metrics
    scores = None
    if evaluate_adapter:
        if before is None:
            before = score_base(stage, val)
        scores = sft_scores(stage, before, score_adapter(stage, val))
    return common.finish_training(stage, trained, scores, common.pack_adapter(stage, cfg.sft.adapter_dir), launch)


def score_base(stage: Stage, val: pd.DataFrame, cached: bool = True) -> pd.DataFrame:
    """The base model's greedy predictions on the held-out puzzles (`predictions_before.csv`; `lab.eval.greedy`
    caches every evaluation by content; generating leaves torch's random state as it was)."""
    before = greedy.evaluate(stage.cfg, val, None, stage.path("predictions_before.csv"), cached=cached)
    print(f"held-out accuracy before training: {before['correct'].mean():.3f}")
    return before


def score_adapter(stage: Stage, val: pd.DataFrame) -> pd.DataFrame:
    """The saved adapter's greedy predictions on the held-out puzzles (`predictions.csv`, cached by content): the
    adapter as written to disk, never the in-memory model."""
    return greedy.evaluate(stage.cfg, val, stage.cfg.sft.adapter_dir, stage.path("predictions.csv"))


def sft_model(stage: Stage) -> Trainee:
    """The base model with the configured LoRA attached (`lab.train.sft.model_with_lora`: every configured family
    must match, the rank at most Kaggle's); writes what received a LoRA, `lora_targets.csv`."""
    from lab.train import sft as sft_lib

    model, tokenizer, table = sft_lib.model_with_lora(stage.cfg)
    atomic_write_csv(stage.path("lora_targets.csv"), table)
    return Trainee(model, tokenizer, table)


def sft_examples(stage: Stage, train: pd.DataFrame, trainee: Trainee):
    """The training examples (`lab.train.sft.training_examples`: the solver traces whose answer the metric accepts,
    in `data.trace_style`, overlong ones counted and dropped); writes `sft_examples.csv` (id, category, tokens).
    Returns `lab.train.sft.Examples` (table, counts)."""
    from lab.train import sft as sft_lib

    examples = sft_lib.training_examples(stage.cfg, trainee.tokenizer, train)
    atomic_write_csv(stage.path("sft_examples.csv"), examples.table[["id", "category", "tokens"]])
    return examples


def sft_train(stage: Stage, examples, trainee: Trainee, launch=None) -> common.Trained:
    """SFT (`lab.train.sft.train`: checkpoints and resume, the gradient check, the adapter saved to
    `sft.adapter_dir`), then the training model's memory released (`trainee` is emptied). Writes `train_log.csv`,
    `gradient_check.csv`, `frozen_check.csv` and, on the main process, `loss.png`."""
    from lab.core import plots
    from lab.train import checkpoints
    from lab.train import sft as sft_lib

    lora = (*trainee.take("sft_train"), trainee.table)
    result = sft_lib.train(stage.cfg, lora, examples, stage.checkpoint_dir,
                           resume_asked=checkpoints.asked_to_resume(stage.overrides, "sft.resume"))
    metrics, log = common.save_training(stage, result, "sft"), result.log
    del result, lora  # the saved adapter is scored, never the in-memory model
    main = launch_lib.main_alone(launch)
    fig = None
    if main:
        fig = common.save_figure(stage, plots.line(log, "step", ["loss"], "SFT training loss", "loss"), "loss.png")
    return common.Trained(metrics=metrics, log=log, figure=fig, main=main)


def sft_scores(stage: Stage, before: pd.DataFrame, after: pd.DataFrame) -> common.Scores:
    """Accuracy before and after SFT, overall and per category (metrics: accuracy_before, accuracy_after, lift,
    per_category); writes `accuracy.png`."""
    print(f"held-out accuracy: before SFT {before['correct'].mean():.3f}, after {after['correct'].mean():.3f}")
    per_category = greedy.per_category(before=before, after=after)
    fig = common.save_figure(stage, greedy.accuracy_figure(before, after, "before SFT", "after SFT", "SFT"),
                             "accuracy.png")
    metrics = {"accuracy_before": float(before["correct"].mean()), "accuracy_after": float(after["correct"].mean()),
               "lift": float(after["correct"].mean() - before["correct"].mean()), "per_category": per_category}
    return common.Scores(metrics=metrics, table=pd.DataFrame.from_dict(per_category, orient="index"), figure=fig)
