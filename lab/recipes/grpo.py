"""03_grpo: GRPO from the SFT adapter, scored against its start, its submission packed."""

from __future__ import annotations

import pandas as pd

from lab import LabError
from lab.core.io import read_json
from lab.core.run import Stage, stage_input, stage_output
from lab.recipes import common


# ---- 03_grpo ----------------------------------------------------------------------------------------------------

def grpo(stage: Stage, launch=None, evaluate_adapter: bool = True) -> dict:
    """GRPO from the SFT adapter (`lab.train.grpo.train`: pass rates, prompt order, training), the saved adapter's greedy
    held-out accuracy against the SFT start, the submission zip: the steps `split`, `grpo_start`, `grpo_model`,
    `grpo_train`, `score_adapter`, `grpo_scores`, `pack_adapter`, `finish_training` (the cells of
    notebooks/03_grpo.ipynb). `launch` and `evaluate_adapter` as in `sft`."""
    cfg = stage.cfg
    train, val = common.split(stage)
    start = grpo_start(stage, evaluate_adapter)
    trained = grpo_train(stage, train, grpo_model(stage, start), launch)
    if not trained.main:
        return trained.metrics
    scores = None
    if evaluate_adapter:
        scores = grpo_scores(stage, start, common.score_adapter(stage, val, cfg.grpo.adapter_dir))
    return common.finish_training(stage, trained, scores, common.pack_adapter(stage, cfg.grpo.adapter_dir), launch)


def grpo_start(stage: Stage, evaluate_adapter: bool = True):
    """Where GRPO starts: 02_sft's finished folder and its held-out accuracy (None after `--no-eval`, which an
    evaluation of GRPO's adapter refuses: it compares against it). Returns a namespace: dir, accuracy."""
    from types import SimpleNamespace

    sft_dir = stage_output(stage.cfg, "02_sft")
    sft_accuracy = read_json(sft_dir / "metrics.json", kind=dict).get("accuracy_after")
    if evaluate_adapter and sft_accuracy is None:
        raise LabError(f"{sft_dir / 'metrics.json'}: no accuracy_after (02_sft ran with --no-eval), which 03_grpo's "
                       "evaluation compares against; rerun 02_sft with its evaluation, or skip this one (--no-eval)")
    return SimpleNamespace(dir=sft_dir, accuracy=sft_accuracy)


def grpo_model(stage: Stage, start) -> common.Trainee:
    """The base model with `grpo.init_adapter` loaded trainable (`lab.model.models.load`), after the rollout back-end
    is checked (a refused one fails before the model loads)."""
    from lab.model import models
    from lab.model.lora import target_table
    from lab.train import grpo as grpo_lib

    cfg = stage.cfg
    grpo_lib.check_backend(cfg)
    model, tokenizer = models.load(cfg, adapter=stage_input(cfg, cfg.grpo.init_adapter), trainable=True)
    print(f"starting from {cfg.grpo.init_adapter}"
          + (f" (held-out accuracy {start.accuracy:.3f})" if start.accuracy is not None else ""))
    return common.Trainee(model, tokenizer, target_table(model))


def grpo_train(stage: Stage, train: pd.DataFrame, trainee: common.Trainee, launch=None):
    """GRPO (`lab.train.grpo.train`: pass rates, the prompt order, training, checkpoints and resume, the gradient
    check, the adapter saved to `grpo.adapter_dir`), then the training model's memory released (`trainee` is
    emptied). Writes `pass_rates.csv`, `prompt_order.csv`, `train_log.csv`, `gradient_check.csv`,
    `frozen_check.csv` and, on the main process, `rewards.png`. Returns a namespace as `sft_train`'s."""
    from types import SimpleNamespace

    from lab.core import plots
    from lab.train import grpo as grpo_lib
    from lab.train.rewards import log_bounds

    cfg = stage.cfg
    model, tokenizer = trainee.take("grpo_train")
    metrics, model, log = grpo_lib.train(cfg, stage, train, model, tokenizer)
    common._stopped_note(stage, metrics, "grpo")
    del model, tokenizer  # the saved adapter is scored, never the in-memory model
    main = common._main_alone(launch)
    fig = None
    if main:
        rewards = [c for c in log.columns if c.startswith("rewards/") and c.endswith("/mean")]
        fig = common._save(stage, plots.line(log, "step", ["reward", *rewards],
                                      "GRPO rewards per step (mean over the step's completions)", "reward",
                                      n=cfg.grpo.prompts_per_step * cfg.grpo.num_generations,
                                      bounds=log_bounds(cfg.grpo.rewards)), "rewards.png")
    return SimpleNamespace(metrics=metrics, log=log, figure=fig, main=main)


def grpo_scores(stage: Stage, start, after: pd.DataFrame):
    """GRPO's adapter against the SFT start (02_sft's predictions), overall and per category; writes
    `accuracy.png`. Returns a namespace as `sft_scores`' (metrics: accuracy_sft_start, accuracy_after, delta,
    per_category)."""
    from types import SimpleNamespace

    from lab.eval.analysis import load_predictions

    before = load_predictions(start.dir / "predictions.csv")
    acc, sft_accuracy = float(after["correct"].mean()), float(start.accuracy)
    print(f"held-out accuracy: SFT start {sft_accuracy:.3f} -> after GRPO {acc:.3f}")
    fig = common._save(stage, common._accuracy_plot(before, after, "SFT start", "after GRPO", "GRPO"), "accuracy.png")
    per_category = common._per_category(sft=before, grpo=after)
    metrics = {"accuracy_sft_start": sft_accuracy, "accuracy_after": acc, "delta": float(acc - sft_accuracy),
               "per_category": per_category}
    return SimpleNamespace(metrics=metrics, table=pd.DataFrame.from_dict(per_category, orient="index"), figure=fig)
