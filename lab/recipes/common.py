"""The steps every stage shares: opening it (environment, preflight, the config composed once, fast paths), the
split, figures shown inline, the cached greedy evaluation, saving what training returned, packing the adapter,
finishing a training stage.

A stage is one notebook of a run (`Stage`, named "02_sft"); it runs in one process (or one accelerate launch) and
hands later stages files through the run folder. Every greedy evaluation goes through `evaluate`, cached in
`<run_dir>/evaluations/` (`lab.eval.greedy`), so 03_grpo's score of its adapter and 04_vote's greedy pass are one."""

from __future__ import annotations

import dataclasses

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from lab import LabError
from lab.core import env
from lab.core.paths import resolve_path
from lab.core.run import Stage
from lab.train.launch import processes


def environment() -> None:
    """Nothing is downloaded at run time, and the tokenizers' thread pool stays quiet after a fork; set before
    transformers or huggingface_hub is imported (they read these when imported)."""
    env.setenv({"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}, keep=True)


def open_stage(name: str, overrides, new_run: bool = False) -> Stage:
    """A notebook's first step: `environment`, the config composed once, the real-model preflight
    (`lab.plan.preflight.check`: one list of what is missing on this machine, before anything is touched), the
    projection of how long it takes, the fast paths, then the stage folder.

    Without run_name (or run_dir) a stage after 01_explore joins the current run (`lab.core.run.current_run`: the
    newest run whose earlier stage finished), so notebooks opened one after the other share one run folder; the
    first line says which (the config is then composed again, with that run_name). `new_run=True`, or no such run,
    starts a new time-stamped one. `overrides` may be a composed config (taken as it is)."""
    environment()
    from lab.core.console import quiet_progress_bars
    from lab.plan import preflight

    quiet_progress_bars()  # library bars freeze at their first frame in a saved notebook; the lab's own line counts
    from lab.core.config import compose, names_run, parse_overrides
    from lab.core.paths import on_kaggle
    from lab.core.run import JOINS_AFTER, current_run

    if isinstance(overrides, DictConfig):
        cfg, overrides = overrides, None
    else:
        overrides = parse_overrides(overrides)
        cfg = compose(overrides)
        if not new_run and not names_run(overrides):
            joined = current_run(resolve_path(cfg.run_dir).parent, name)
            if joined is not None:
                overrides = [*overrides, f"run_name={joined.name}"]
                cfg = compose(overrides)
                print(f"joining the current run {joined} (the newest where {' or '.join(JOINS_AFTER[name])} "
                      "finished); new_run=True starts a new one", flush=True)
    preflight.check(name, cfg)
    from lab.data.dataset import check_data_settings

    check_data_settings(cfg)  # the free-form data knobs against what their consumers take
    if preflight.applies(name, cfg):  # how long it will take on gpu=, projected before anything loads
        from lab.plan.estimate import stage_projection

        for line in stage_projection(name, cfg):
            print(line, flush=True)

    if on_kaggle():  # the planned output against Kaggle's kept 20 GB, before anything is written (lab.plan.output_plan)
        from lab.plan import output_plan

        output_plan.check(cfg, name)
    switches = fast_paths(name, cfg)  # e.g. ["sft.fused_mamba=off"]: the stage runs with them (config.yaml)
    if switches:
        cfg = cfg.copy()
        for s in switches:
            OmegaConf.update(cfg, *s.split("=", 1))
    stage = Stage(name, [*overrides, *switches] if overrides is not None else (), cfg=cfg)
    print(f"run_dir = {stage.run_dir}   seed = {stage.cfg.seed}   model = {stage.cfg.model.name}   "
          f"data = {stage.cfg.data.source}")
    return stage


def fast_paths(name: str, cfg: DictConfig, calibration: dict | None = None) -> list[str]:
    """The run's fast paths decided (`lab.train.fast_paths`): the overrides that switch each `auto` one that cannot
    or must not run here to its exact path, each with one printed line saying which, why and what it costs.
    `calibration`: the card's calibration (`exact.<path>`), when there is one."""
    from lab.plan import estimate
    from lab.train import fast_paths as fp

    if calibration is None and name in fp.TRAINING_STAGES and str(cfg.gpu.name) in estimate.CARDS:
        try:  # the card's own calibration (python -m lab calibrate), when one applies to this model and recipe
            calibration, _ = estimate.load_calibration(cfg, estimate.card_of(cfg))
        except LabError:
            calibration = None
    switches, lines = fp.resolve(name, cfg, calibration)
    for line in lines:
        print(line, flush=True)
    return switches


# ---- shared steps -----------------------------------------------------------------------------------------------

def split(stage: Stage) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(train, val): the run's split (`lab.data.dataset.prepare`: made once per run folder under `<run_dir>/data/`,
    read back with its content hashes checked, so every stage sees the same puzzles)."""
    from lab.data import dataset as data

    train, val = data.prepare(stage.cfg)
    print(f"{len(train)} training puzzles, {len(val)} held out; model: {stage.cfg.model.name}")
    return train, val


def show(*items) -> None:
    """Draw figures (returned by the step that saved them as PNG) and display tables inline in a notebook, skipping
    None and tables without a row (a table of what the puzzles in the run have none of); nothing outside one
    (`lab.core.console.show_figure`)."""
    from lab.core.console import in_kernel, show_figure

    for item in items:
        if isinstance(item, pd.DataFrame):
            if len(item) and in_kernel():
                from IPython.display import display

                display(item)
        elif item is not None:
            show_figure(item)


def save_figure(stage: Stage, fig, name: str):
    """`lab.core.plots.save` into the stage folder; returns the figure (for `show`)."""
    from lab.core import plots

    plots.save(fig, stage.path(name))
    return fig


@dataclasses.dataclass
class Trained:
    """A training step's result: the stage's training metrics, the step log, the figure drawn from it (None off the
    main process) and whether this is the main process (a launch's other processes stop after training)."""
    metrics: dict
    log: pd.DataFrame
    figure: object
    main: bool


@dataclasses.dataclass
class Drawn:
    """A table a step wrote as CSV and the figure it saved as PNG (`show` draws it inline)."""
    table: pd.DataFrame
    figure: object  # a matplotlib Figure


@dataclasses.dataclass
class Scores:
    """The trained adapter's scores against where it started: metrics, the per-category table, the figure."""
    metrics: dict
    table: pd.DataFrame
    figure: object


def save_training(stage: Stage, result, group: str) -> dict:
    """What a training run (`lab.train.sft.train`, `lab.train.grpo.GrpoRun.train`) returned, written into the stage
    folder: `train_log.csv`, and the gradient check's `gradient_check.csv` and `frozen_check.csv`
    (`lab.model.lora.GradientCheck.save`). Returns its metrics with what the check found failed
    (`gradient_check_failed`, each failure printed as a warning) and, after a wall-clock budget stop, how the next run
    resumes (`resume_note`: the newest checkpoint kept in `<run_dir>/checkpoints/<stage>`; `group` is the config
    group, sft or grpo)."""
    from lab.core.io import atomic_write_csv
    from lab.train import checkpoints

    metrics = result.metrics
    atomic_write_csv(stage.path("train_log.csv"), result.log)
    if result.check is not None:
        failed = metrics["gradient_check_failed"] = result.check.save(stage.dir)
        if failed:
            print(f"WARNING: gradient check failed for: {', '.join(failed)} (see gradient_check.csv, "
                  "frozen_check.csv)")
    keep = stage.run_dir / "checkpoints" / stage.name
    if note := checkpoints.resume_note(metrics, stage.checkpoint_dir, keep, stage.name, group):
        metrics["resume_note"] = note
    return metrics


def gradient_check(stage: Stage) -> tuple[pd.DataFrame | None, pd.DataFrame | None]:
    """(gradients, frozen): the gradient check the training step wrote (every LoRA family received a gradient and
    moved; the frozen weights did not), None where it was off."""
    read = lambda name: pd.read_csv(stage.path(name)) if stage.path(name).is_file() else None  # noqa: E731
    return read("gradient_check.csv"), read("frozen_check.csv")


def finish_training(stage: Stage, trained: Trained, scores: Scores | None, problems: list[str], launch=None) -> dict:
    """02_sft's or 03_grpo's metrics.json: the zip's problems, the scores (None without an evaluation), the
    training metrics, the number of processes; finishes the stage."""
    scored = scores.metrics if scores is not None else {}
    return stage.finish({"submission_problems": problems, **scored, **trained.metrics,
                         "processes": processes(launch)})


def pack_adapter(stage: Stage, adapter_dir) -> list[str]:
    """`<stage>/submission.zip` from the adapter (the layout vLLM loads, in the submission dtype), and
    `submission.check`'s problems (empty: valid)."""
    from lab.model import submission

    zip_path = submission.pack(adapter_dir, stage.path("submission.zip"), dtype=submission.SUBMISSION_DTYPE)
    problems = submission.check(zip_path)
    # where it lies once the stage finishes (it is written into the stage's fresh folder, swapped in by finish)
    print(stage.final / zip_path.name, "valid" if not problems else problems)
    return problems
