"""The steps every stage shares: opening it (environment, preflight, the config composed once, fast paths), the
split, figures shown inline, the cached greedy evaluation, saving what training returned, packing the adapter,
finishing a training stage.

A stage is one notebook of a run (`Stage`, named "02_sft"); it runs in one process (or one accelerate launch) and
hands later stages files through the run folder. Every greedy evaluation goes through `evaluate`, cached in
`<run_dir>/evaluations/` by `evaluation_key`, so 03_grpo's score of its adapter and 04_vote's greedy pass are one."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
from pathlib import Path

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from lab import LabError
from lab.core import lineage
from lab.core.io import atomic_file
from lab.core.paths import resolve_path
from lab.core.run import Stage

# what torchrun / accelerate set for a process of a launch; removed once the main process evaluates alone
DIST_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
            "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")


def environment() -> None:
    """Nothing is downloaded at run time, and the tokenizers' thread pool stays quiet after a fork; set before
    transformers or huggingface_hub is imported (they read these when imported)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


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


class Trainee:
    """The model a training step trains, with its tokenizer and the table of what carries a LoRA (family, modules,
    trainable parameters). The training step empties it (`release`): the saved adapter is scored afterwards, never
    the in-memory model, and a notebook variable must not keep that model's memory alive (vLLM needs the GPU)."""

    def __init__(self, model, tokenizer, table: pd.DataFrame):
        self.model, self.tokenizer, self.table = model, tokenizer, table

    def release(self) -> None:
        self.model = self.tokenizer = None

    def take(self, step: str) -> tuple:
        """(model, tokenizer), emptying this holder; a holder already trained is refused."""
        if self.model is None:
            raise LabError(f"{step}: this model was already trained (its holder is emptied by the training step); "
                           f"make a fresh one first (lab.recipes.sft.sft_model / lab.recipes.grpo.grpo_model)")
        model, tokenizer = self.model, self.tokenizer
        self.release()
        return model, tokenizer

    def __repr__(self) -> str:
        state = "released" if self.model is None else type(self.model).__name__
        return f"Trainee({state}; LoRA on:\n{self.table.to_string(index=False)})"


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


def save_training(stage: Stage, log: pd.DataFrame, check) -> list[str] | None:
    """What a training run returned, written into the stage folder: `train_log.csv`, and the gradient check's
    `gradient_check.csv` and `frozen_check.csv` (`lab.model.lora.GradientCheck.save`). Returns what the check found
    failed (None without a check); each failure is printed as a warning."""
    from lab.core.io import atomic_write_csv

    atomic_write_csv(stage.path("train_log.csv"), log)
    if check is None:
        return None
    failed = check.save(stage.dir)
    if failed:
        print(f"WARNING: gradient check failed for: {', '.join(failed)} (see gradient_check.csv, frozen_check.csv)")
    return failed


def gradient_check(stage: Stage) -> tuple[pd.DataFrame | None, pd.DataFrame | None]:
    """(gradients, frozen): the gradient check the training step wrote (every LoRA family received a gradient and
    moved; the frozen weights did not), None where it was off."""
    read = lambda name: pd.read_csv(stage.path(name)) if stage.path(name).is_file() else None  # noqa: E731
    return read("gradient_check.csv"), read("frozen_check.csv")


def score_adapter(stage: Stage, val: pd.DataFrame, adapter_dir) -> pd.DataFrame:
    """The saved adapter's greedy predictions on the held-out puzzles (`predictions.csv`, through `evaluate`, cached
    by content): the adapter as written to disk, never the in-memory model."""
    return evaluate(stage, val, adapter_dir, "predictions.csv")


def finish_training(stage: Stage, trained: Trained, scores: Scores | None, problems: list[str], launch=None) -> dict:
    """02_sft's or 03_grpo's metrics.json: the zip's problems, the scores (None without an evaluation), the
    training metrics, the number of processes; finishes the stage."""
    scored = scores.metrics if scores is not None else {}
    return stage.finish({"submission_problems": problems, **scored, **trained.metrics,
                         "processes": _processes(launch)})


# ---- greedy evaluation, cached by its key -----------------------------------------------------------------------

def evaluation_key(cfg, adapter, puzzles: pd.DataFrame) -> dict:
    """What a greedy evaluation's predictions depend on: the base model's content hash (`lineage.model_hash`), the
    adapter's (`lineage.content_hash`; None for the base model alone), a sha256 of the puzzles (id, prompt, answer,
    category, subtype), the seed, every `infer` setting (greedy sampling, max_tokens, metric version, engine), and
    the back-end, dtype and max_model_len (`sampling.engine_settings`, as the samples cache's key). Paths are left
    out: 03_grpo's adapter in its working folder and the same adapter read by 04_vote from the finished one are the
    same key."""
    from lab.eval import sampling
    from lab.model import models
    from lab.core.lineage import content_hash, model_hash

    cols = [c for c in ("id", "prompt", "answer", "category", "subtype") if c in puzzles.columns]
    return {"model_sha256": model_hash(models.model_path(cfg)),
            "adapter_sha256": content_hash(resolve_path(adapter)) if adapter is not None else None,
            "puzzles_sha256": hashlib.sha256(puzzles[cols].astype(str).to_csv(index=False).encode()).hexdigest(),
            "seed": cfg.seed, **sampling.engine_settings(cfg, cfg.model.generation_backend)}


def evaluate(stage: Stage, puzzles: pd.DataFrame, adapter, name: str, gen=None, cached: bool = True) -> pd.DataFrame:
    """Greedy predictions (the competition's settings, `sampling.predictions`) of the base model plus `adapter`
    (None: the base model alone) on `puzzles`, written to the stage's file `name` and returned as
    `lab.eval.analysis.load_predictions` reads them. `gen`: a Generator of that adapter already open (else one is made
    only when needed). Cached as `<run_dir>/evaluations/<key digest>.csv`, sealed by `<key digest>.json` (the key and
    the CSV's content hash, `lineage.seal`, written last): an evaluation whose seal holds the same key and whose CSV
    still has that hash is copied from there instead of generated again; anything else is generated again.

    `cached=False` always generates (and stores nothing). 02_sft's evaluation of the base model before training is
    cached like the others: `generate.generate_hf` seeds its batches inside `torch.random.fork_rng`, so torch's
    random state after it (from which SFT initialises the LoRA next) is the same whether it was generated or reused
    (the cache tests check both)."""
    from lab.eval import sampling
    from lab.eval.analysis import load_predictions
    from lab.model import generate

    key = evaluation_key(stage.cfg, adapter, puzzles)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    entry = resolve_path(stage.cfg.run_dir) / "evaluations" / f"{digest}.csv"
    out = stage.path(name)
    why = None
    if cached:
        try:
            lineage.check_seal(entry.with_suffix(".json"), key)
        except lineage.Unsealed as e:
            why = None if not entry.with_suffix(".json").exists() and not entry.exists() else str(e)
        else:
            print(f"greedy evaluation: the same model, adapter, puzzles and settings as {entry} (its content hash "
                  "checked); reused, not generated")
            _copy(entry, out)
            return load_predictions(out)
    if why:
        print(f"note: greedy evaluation cache not reused: {why}; generating it again")
    with contextlib.nullcontext(gen) if gen is not None else generate.Generator(stage.cfg, adapter=adapter) as g:
        sampling.predictions(g, puzzles, out_csv=out)
    if cached:
        _copy(out, entry)
        lineage.seal(entry.with_suffix(".json"), key, [entry])  # the seal last: it vouches for a complete entry
    return load_predictions(out)


def _copy(src: Path, dst: Path) -> None:
    with atomic_file(dst) as tmp:
        shutil.copyfile(src, tmp)


# ---- shared by the stages -----------------------------------------------------------------------------------------

def _per_category(**preds: pd.DataFrame) -> dict:
    """{category: {name: accuracy}} for each named predictions table."""
    table = pd.DataFrame({k: p.groupby("category")["correct"].mean() for k, p in preds.items()})
    return table.to_dict("index")


def _accuracy_plot(a: pd.DataFrame, b: pd.DataFrame, name_a: str, name_b: str, by: str):
    from lab.core import plots
    from lab.eval.analysis import accuracy_table, compare

    net = compare(a, b)[0].set_index("category").loc["all"]  # puzzles fixed and broken between the two
    return plots.accuracy_bars({name_a: accuracy_table(a), name_b: accuracy_table(b)},
                               f"Held-out accuracy, greedy: {net['fixed']:.0f} puzzles fixed, "
                               f"{net['broken']:.0f} broken by {by}")


def pack_adapter(stage: Stage, adapter_dir) -> list[str]:
    """`<stage>/submission.zip` from the adapter (the layout vLLM loads, in the submission dtype), and
    `submission.check`'s problems (empty: valid)."""
    from lab.model import submission

    zip_path = submission.pack(adapter_dir, stage.path("submission.zip"), dtype=submission.SUBMISSION_DTYPE)
    problems = submission.check(zip_path)
    # where it lies once the stage finishes (it is written into the stage's fresh folder, swapped in by finish)
    print(stage.final / zip_path.name, "valid" if not problems else problems)
    return problems


def _stopped_note(stage: Stage, metrics: dict, group: str) -> None:
    """A training stage stopped by its wall-clock budget: the newest checkpoint kept where the next run finds it (on
    Kaggle copied from scratch into /kaggle/working, `lab.train.checkpoints.keep_for_resume`) and the note saying
    how to resume, printed and kept in the metrics (`resume_note`)."""
    from lab.core.io import is_main_process
    from lab.train import checkpoints

    if not metrics.get("stopped_by_budget") or not is_main_process():
        return

    note = checkpoints.keep_for_resume(stage.checkpoint_dir, stage.run_dir / "checkpoints" / stage.name, stage.name,
                                       group)
    print(f"NOTE: {note}", flush=True)
    metrics["resume_note"] = note


def _processes(launch) -> int:
    return 1 if launch is None else launch.num_processes


def _main_alone(launch) -> bool:
    """After training (the caller has deleted its training model): release the memory; under a launch of several
    processes, end the process group and the launcher's variables so that the main process evaluates alone (vLLM
    must not find the training model on the GPU, a live process group or RANK/WORLD_SIZE). True on the main
    process."""
    from lab.model.generate import release_memory

    release_memory()
    if launch is None:
        return True
    main = launch.is_main_process
    if launch.num_processes > 1:
        import torch

        launch.wait_for_everyone()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        for k in DIST_ENV:
            os.environ.pop(k, None)
    return main
