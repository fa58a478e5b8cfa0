"""03_grpo: GRPO from the SFT adapter: the pool's pass rates, the prompts dropped by the threshold, the curriculum
order, training, the saved adapter scored against its start, its submission packed. `grpo` runs the steps below in
order; notebooks/03_grpo.ipynb runs the same steps as cells, and scripts/train_grpo.py runs `grpo` under `accelerate
launch`. A resumed run reuses the pass rates and order it recorded (the same GRPO settings and start adapter)."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pandas as pd

from lab import LabError
from lab.core.io import atomic_write_csv, is_main_process, read_json
from lab.core.run import Stage, stage_input, stage_output
from lab.eval import greedy
from lab.model.lora import Trainee
from lab.recipes import common
from lab.train import launch as launch_lib


def grpo(stage: Stage, launch=None, evaluate_adapter: bool = True) -> dict:
    """The whole stage: `common.split`, `grpo_start`, `grpo_model`, `grpo_run`, `pass_rates`, `drop_solved`,
    `prompt_order`, `grpo_train`, `score_adapter`, `grpo_scores`, `common.pack_adapter`,
    `common.finish_training`. `launch` and `evaluate_adapter` as in `lab.recipes.sft.sft`."""
    cfg = stage.cfg
    train, val = common.split(stage)
    start = grpo_start(stage, evaluate_adapter)
    run = grpo_run(stage, train, grpo_model(stage, start))
    rates = pass_rates(stage, run)
    kept = drop_solved(stage, run, rates)
    prompt_order(stage, run, rates, kept)
    trained = grpo_train(stage, run, launch)
    if not trained.main:
        return trained.metrics
    scores = None
    if evaluate_adapter:
        scores = grpo_scores(stage, start, score_adapter(stage, val))
    return common.finish_training(stage, trained, scores, common.pack_adapter(stage, cfg.grpo.adapter_dir), launch)


@dataclasses.dataclass
class Start:
    """Where GRPO starts: 02_sft's finished folder and its held-out accuracy (None after its `--no-eval`)."""
    dir: Path
    accuracy: float | None


def grpo_start(stage: Stage, evaluate_adapter: bool = True) -> Start:
    """02_sft's finished folder and held-out accuracy; an evaluation of GRPO's adapter compares against it, so
    without it (02_sft's `--no-eval`) only `evaluate_adapter=False` may go on."""
    sft_dir = stage_output(stage.cfg, "02_sft")
    sft_accuracy = read_json(sft_dir / "metrics.json", kind=dict).get("accuracy_after")
    if evaluate_adapter and sft_accuracy is None:
        raise LabError(f"{sft_dir / 'metrics.json'}: no accuracy_after (02_sft ran with --no-eval), which 03_grpo's "
                       "evaluation compares against; rerun 02_sft with its evaluation, or skip this one (--no-eval)")
    return Start(dir=sft_dir, accuracy=sft_accuracy)


def grpo_model(stage: Stage, start: Start) -> Trainee:
    """The base model with `grpo.init_adapter` loaded trainable (`lab.model.models.load`), after the rollout back-end
    is checked (a refused one fails before the model loads)."""
    from lab.model import models
    from lab.model.lora import target_table
    from lab.plan.preflight import check_backend

    cfg = stage.cfg
    check_backend(cfg)
    model, tokenizer = models.load(cfg, adapter=stage_input(cfg, cfg.grpo.init_adapter), trainable=True)
    print(f"starting from {cfg.grpo.init_adapter}"
          + (f" (held-out accuracy {start.accuracy:.3f})" if start.accuracy is not None else ""))
    return Trainee(model, tokenizer, target_table(model))


def grpo_run(stage: Stage, train: pd.DataFrame, trainee: Trainee):
    """The GRPO run on that model (`lab.train.grpo.GrpoRun`: a pool of `grpo.n_prompts` training puzzles, the
    completion budget, the rewards, TRL's checks, the rollout engine, the resume point); `trainee` is emptied."""
    from lab.train import checkpoints
    from lab.train import grpo as grpo_lib

    model, tokenizer = trainee.take("grpo_run")
    return grpo_lib.GrpoRun(stage.cfg, train, model, tokenizer, stage.checkpoint_dir,
                            resume_asked=checkpoints.asked_to_resume(stage.overrides, "grpo.resume"))


def pass_rates(stage: Stage, run) -> pd.DataFrame:
    """Each pool prompt's pass rate over `grpo.pass_rate_k` samples from the start adapter, sampled as the rollouts
    sample (`pass_rates.csv`: id, n, correct, pass_rate). A resumed run reuses the ones it recorded."""
    if run.resumed:
        print(f"resuming: reusing the pass rates and prompt order recorded in {run.out} "
              f"({len(run.record['order'])} prompts)")
        return _recorded(stage, run, "pass_rates.csv")
    rates = run.pass_rates()
    atomic_write_csv(stage.path("pass_rates.csv"), rates)
    return rates


def drop_solved(stage: Stage, run, rates: pd.DataFrame) -> list[str]:
    """The ids kept for training: a prompt solved at or above `grpo.drop_threshold` is dropped (an all-correct group
    has zero reward variance: nothing to learn), and with `grpo.drop_unsolved` one never solved
    (`lab.data.curriculum.select`). A resumed run keeps what it recorded."""
    from lab.data import curriculum

    g = stage.cfg.grpo
    if run.resumed:
        return [str(i) for i in run.record["order"]]
    kept, _ = curriculum.select(rates, threshold=g.drop_threshold, drop_unsolved=g.drop_unsolved)
    if not kept:
        run.close()  # the rollout engine, if any: nothing will be trained
        raise LabError(f"{stage.dir}: no training prompt has a pass rate below {g.drop_threshold}"
                       + (" and above 0" if g.drop_unsolved else "") + f" over {g.pass_rate_k} samples (see "
                       f"{stage.path('pass_rates.csv')}): nothing to learn from. A start that solves nothing "
                       "needs more SFT, not GRPO; or set grpo.drop_unsolved=false.")
    print(f"{len(kept)} of {len(rates)} prompts kept (drop_threshold={g.drop_threshold}, "
          f"drop_unsolved={g.drop_unsolved})")
    return kept


def prompt_order(stage: Stage, run, rates: pd.DataFrame, kept: list[str]) -> pd.DataFrame:
    """The kept prompts in training order (`lab.data.curriculum.order`: with `grpo.curriculum` high to low pass rate,
    `grpo.curriculum_shape` linear or stepped; else a seeded shuffle), recorded in the run's checkpoint folder so a
    resumed run trains the same order; writes `prompt_order.csv`. A resumed run reuses the order it recorded."""
    from lab.data import curriculum

    cfg, g = stage.cfg, stage.cfg.grpo
    if run.resumed:
        return _recorded(stage, run, "prompt_order.csv")
    chosen = curriculum.order(run.pool[run.pool["id"].isin(set(kept))], rates, curriculum=g.curriculum,
                              shape=g.curriculum_shape, seed=cfg.seed)
    table = chosen[["id", "category", "pass_rate", "bucket"]] if "category" in chosen else \
        chosen[["id", "pass_rate", "bucket"]]
    atomic_write_csv(stage.path("prompt_order.csv"), table)
    run.keep_order(chosen["id"].tolist(), curriculum.selection_summary(rates, threshold=g.drop_threshold,
                                                                       drop_unsolved=g.drop_unsolved))
    for name in ("pass_rates.csv", "prompt_order.csv"):  # beside the record: a resumed run's fresh folder gets them
        if is_main_process():
            shutil.copyfile(stage.path(name), run.out / name)
    return table


def _recorded(stage: Stage, run, name: str) -> pd.DataFrame | None:
    """A table a resumed run recorded beside its run record, copied back into the stage folder (by the main
    process) and returned; None where the record has none."""
    src = run.out / name
    if not src.is_file():
        return None
    if is_main_process():
        shutil.copyfile(src, stage.path(name))
    return pd.read_csv(src, dtype={"id": str})


def grpo_train(stage: Stage, run, launch=None) -> common.Trained:
    """GRPO on the recorded order (`lab.train.grpo.GrpoRun.train`: checkpoints and resume, the guard rails, the
    gradient check, the adapter saved to `grpo.adapter_dir`), then the training model's memory released. Writes
    `train_log.csv`, `gradient_check.csv`, `frozen_check.csv` (`refinements.csv` with `grpo.refine`) and, on the main
    process, `rewards.png`."""
    from lab.core import plots
    from lab.train.rewards import log_bounds

    cfg = stage.cfg
    result = run.train()
    metrics, log = save_trained(stage, result), result.log
    del result, run  # the saved adapter is scored, never the in-memory model
    main = launch_lib.main_alone(launch)
    fig = None
    if main:
        rewards = [c for c in log.columns if c.startswith("rewards/") and c.endswith("/mean")]
        fig = common.save_figure(stage, plots.line(log, "step", ["reward", *rewards],
                                                   "GRPO rewards per step (mean over the step's completions)",
                                                   "reward", n=cfg.grpo.prompts_per_step * cfg.grpo.num_generations,
                                                   bounds=log_bounds(cfg.grpo.rewards)), "rewards.png")
    return common.Trained(metrics=metrics, log=log, figure=fig, main=main)


def save_trained(stage: Stage, result) -> dict:
    """What `lab.train.grpo.GrpoRun.train` returned, written into the stage folder (`train_log.csv`, the gradient
    check, `refinements.csv`; `common.save_training`); returns its metrics with every warning."""
    if result.refinements:
        atomic_write_csv(stage.path("refinements.csv"), pd.DataFrame(result.refinements))
    metrics = common.save_training(stage, result, "grpo")
    late = []
    if failed := metrics.get("gradient_check_failed"):
        late.append(f"gradient check failed for: {', '.join(failed)} (see gradient_check.csv, frozen_check.csv)")
    if not result.finished and metrics["lora_weight_change"] == 0.0:
        late.append("the adapter did not change: every step had zero advantage or no scorable completion")
        print(f"WARNING: {late[-1]}")
    metrics["warnings"] = result.warnings + late
    return metrics


def score_adapter(stage: Stage, val: pd.DataFrame) -> pd.DataFrame:
    """The saved adapter's greedy predictions on the held-out puzzles (`predictions.csv`, cached by content, so
    04_vote's greedy pass of this adapter is this evaluation): the adapter as written to disk."""
    return greedy.evaluate(stage.cfg, val, stage.cfg.grpo.adapter_dir, stage.path("predictions.csv"))


def grpo_scores(stage: Stage, start: Start, after: pd.DataFrame) -> common.Scores:
    """GRPO's adapter against the SFT start (02_sft's predictions), overall and per category (metrics:
    accuracy_sft_start, accuracy_after, delta, per_category); writes `accuracy.png`."""
    from lab.eval.analysis import load_predictions

    before = load_predictions(start.dir / "predictions.csv")
    acc, sft_accuracy = float(after["correct"].mean()), float(start.accuracy)
    print(f"held-out accuracy: SFT start {sft_accuracy:.3f} -> after GRPO {acc:.3f}")
    fig = common.save_figure(stage, greedy.accuracy_figure(before, after, "SFT start", "after GRPO", "GRPO"),
                             "accuracy.png")
    per_category = greedy.per_category(sft=before, grpo=after)
    metrics = {"accuracy_sft_start": sft_accuracy, "accuracy_after": acc, "delta": float(acc - sft_accuracy),
               "per_category": per_category}
    return common.Scores(metrics=metrics, table=pd.DataFrame.from_dict(per_category, orient="index"), figure=fig)
