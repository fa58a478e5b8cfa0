"""One function per stage, made of public steps: the work of each notebook, called by the notebook cell by cell and
by the stage function (and its script) in the same order, so a notebook and its script write the same files and
metrics.

`open_stage(name, overrides)` is every notebook's first step: the environment (`environment`: nothing downloaded,
quiet tokenizers), the real-model preflight (`lab.train.preflight`), then the stage folder (`lab.core.run.Stage`).
`explore`, `sft`, `grpo`, `vote` and `errors` each take the open stage, do the stage's work, write its files
(tables, plots, predictions, the adapter's submission.zip), finish the stage and return its metrics. Each is its
steps in order, and notebooks/0N_*.ipynb call those steps as cells:
  01_explore  explore_split, explore_solvers, explore_audit, explore_finish
  02_sft      split, score_base, sft_model, sft_train, (gradient_check), score_adapter, sft_scores, pack_adapter,
              finish_training
  03_grpo     split, grpo_start, grpo_model, grpo_train, (gradient_check), score_adapter, grpo_scores,
              pack_adapter, finish_training
  05_errors   final_predictions, error_budget, analyse_errors, (failure_examples), changes_since_sft, errors_finish
A step that draws a plot saves its PNG and returns the matplotlib figure; `show(fig, table, ...)` draws it inline in a
notebook (and the tables that have rows).
scripts/train_sft.py and train_grpo.py call the same `sft` / `grpo` under `accelerate launch` (with accelerate's
state: every process trains, the main process alone evaluates).

Every greedy evaluation goes through `evaluate`, cached in `<run_dir>/evaluations/` by its key
(`evaluation_key`: the base model's and the adapter's content hashes, the puzzles, the sampling settings and the
budget): 03_grpo's evaluation of its adapter and 04_vote's greedy pass of the same adapter are one pass, and 02_sft's
evaluation of the base model is generated once per model, puzzles and settings. Every `Generator` of a stage is
made here.

What it simplifies:
1. A stage runs in one process (or one accelerate launch); stages hand each other files through the run folder.
2. The cache is keyed by content and never pruned: a changed adapter, model, puzzle or setting is another key, so
   another file; old entries stay until the run folder is deleted.
3. A notebook's steps are meant to run once each, in order (as "Run all" does); a step run again rewrites its
   files, and training twice in one kernel trains from a fresh model only through `sft_model` / `grpo_model`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from pathlib import Path

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from lab import LabError
from lab.core.io import atomic_file, atomic_write_csv, atomic_write_json, read_json
from lab.core.paths import resolve_path
from lab.core.run import Stage, stage_input, stage_output

# what torchrun / accelerate set for a process of a launch; removed once the main process evaluates alone
DIST_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
            "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")


def environment() -> None:
    """Nothing is downloaded at run time, and the tokenizers' thread pool stays quiet after a fork; set before
    transformers or huggingface_hub is imported (they read these when imported)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def open_stage(name: str, overrides, new_run: bool = False) -> Stage:
    """A notebook's first step: `environment`, the real-model preflight (`lab.train.preflight.check`: one list of what is
    missing on this machine, before anything is touched), then the stage folder.

    Without run_name (or run_dir) a stage after 01_explore joins the current run (`lab.core.run.current_run`: the
    newest run whose earlier stage finished), so notebooks opened one after the other share one run folder; the
    first line says which. `new_run=True`, or no such run, starts a new time-stamped one."""
    environment()
    from lab.core.console import quiet_progress_bars
    from lab.train import preflight

    quiet_progress_bars()  # library bars freeze at their first frame in a saved notebook; the lab's own line counts
    from lab.core.config import compose, names_run, parse_overrides
    from lab.core.paths import on_kaggle
    from lab.core.run import JOINS_AFTER, current_run

    if not isinstance(overrides, DictConfig):
        overrides = parse_overrides(overrides)
        if not new_run and not names_run(overrides):
            joined = current_run(resolve_path(compose(overrides).run_dir).parent, name)
            if joined is not None:
                overrides = [*overrides, f"run_name={joined.name}"]
                print(f"joining the current run {joined} (the newest where {' or '.join(JOINS_AFTER[name])} "
                      "finished); new_run=True starts a new one", flush=True)
    preflight.check(name, overrides)
    cfg = overrides if isinstance(overrides, DictConfig) else compose(overrides)
    if preflight.applies(name, cfg):  # how long it will take on gpu=, projected before anything loads
        from lab.train.estimate import stage_projection

        for line in stage_projection(name, cfg):
            print(line, flush=True)

    if on_kaggle():  # the planned output against Kaggle's kept 20 GB, before anything is written (lab.train.output_plan)
        from lab.train import output_plan

        output_plan.check(cfg, name)
    switches = fast_paths(name, cfg)  # e.g. ["sft.fused_mamba=off"]: the stage composes with them (config.yaml)
    if not switches:
        stage = Stage(name, overrides)
    elif isinstance(overrides, DictConfig):
        cfg = cfg.copy()
        for s in switches:
            OmegaConf.update(cfg, *s.split("=", 1))
        stage = Stage(name, overrides, cfg=cfg)
    else:
        stage = Stage(name, [*parse_overrides(overrides), *switches])
    print(f"run_dir = {stage.run_dir}   seed = {stage.cfg.seed}   model = {stage.cfg.model.name}   "
          f"data = {stage.cfg.data.source}")
    return stage


def fast_paths(name: str, cfg: DictConfig, calibration: dict | None = None) -> list[str]:
    """The run's fast paths decided (`lab.train.fast_paths`): the overrides that switch each `auto` one that cannot
    or must not run here to its exact path, each with one printed line saying which, why and what it costs.
    `calibration`: the card's calibration (`exact.<path>`), when there is one."""
    from lab.train import estimate
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


def _save(stage: Stage, fig, name: str):
    """`lab.core.plots.save` into the stage folder; returns the figure (for `show`)."""
    from lab.core import plots

    plots.save(fig, stage.path(name))
    return fig


# ---- 01_explore -------------------------------------------------------------------------------------------------

def explore(stage: Stage) -> dict:
    """The split, puzzles per category, what the solvers answer, trace lengths in the model's tokens, the trace
    audit, and one trace per category (`trace_examples.csv`): `explore_split`, `explore_solvers`, `explore_audit`,
    `explore_finish`, the cells of notebooks/01_explore.ipynb."""
    train, val, counts = explore_split(stage)
    solved = explore_solvers(stage, train)
    audit = explore_audit(stage, solved)
    return explore_finish(stage, train, val, counts, solved, audit)


def explore_split(stage: Stage) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(train, val, counts): the split (`split`) and its puzzles per category, subtype and split
    (`categories.csv`)."""
    train, val = split(stage)
    counts = (pd.concat([train.assign(split="train"), val.assign(split="val")])
              .groupby(["category", "subtype", "split"]).size().unstack("split", fill_value=0).reset_index())
    atomic_write_csv(stage.path("categories.csv"), counts)
    return train, val, counts


def explore_solvers(stage: Stage, train: pd.DataFrame):
    """The solvers over at most `data.explore_max` training puzzles, with trace lengths in tokens of the model's
    tokenizer (`data.tokenizer_path` when set). Writes `solver_status.csv`, `solver_methods.csv`,
    `solver_equation_families.csv`, `trace_tokens.png`, `trace_tokens.csv` (both trace styles, against the budget).
    Returns a namespace: sample, solved (one row per puzzle), style, counter (the tokenizer counted with), status,
    methods, families, tokens (tables) and figure (the trace-length histogram)."""
    from types import SimpleNamespace

    from lab import puzzles
    from lab.core import plots
    from lab.data import dataset as data
    from lab.model import models

    cfg = stage.cfg
    tokenizer = models.load_tokenizer(cfg)
    counter = data.count_tokenizer(cfg, tokenizer)  # data.tokenizer_path when set, else the model's own tokenizer
    style = data.trace_style(cfg)  # the style SFT trains on
    sample = train.sample(n=min(cfg.data.explore_max, len(train)), random_state=cfg.seed)
    solved = puzzles.solve_frame(sample, tokenizer=counter, style=style)
    status = solved.groupby(["category", "status"]).size().unstack("status", fill_value=0).reset_index()
    methods, families = puzzles.method_table(solved), puzzles.family_table(solved)
    atomic_write_csv(stage.path("solver_status.csv"), status)
    atomic_write_csv(stage.path("solver_methods.csv"), methods)
    atomic_write_csv(stage.path("solver_equation_families.csv"), families)
    fig = _save(stage, plots.histogram(solved, "trace_tokens", "category", "Solver trace length",
                                       "tokens (model tokenizer)"), "trace_tokens.png")
    # both styles, counted as the completion the scorer sees, against the budget
    other = "compact" if style == "derivation" else "derivation"
    both = pd.concat([solved.assign(trace_style=style),
                      puzzles.solve_frame(sample, tokenizer=counter, style=other).assign(trace_style=other)])
    tokens = puzzles.token_table(both)
    atomic_write_csv(stage.path("trace_tokens.csv"), tokens)
    return SimpleNamespace(sample=sample, solved=solved, style=style, counter=counter, status=status,
                           methods=methods, families=families, tokens=tokens, figure=fig)


def explore_audit(stage: Stage, solved):
    """The trace audit of `explore_solvers`' traces (`lab.puzzles.audit.audit_frame`; `python -m lab puzzles audit`
    prints the same) and one trace per category. Writes `trace_audit.csv`, `trace_shapes.csv`,
    `trace_examples.csv`. Returns a namespace: audit, shapes, breaks (referential breaks), examples."""
    from types import SimpleNamespace

    from lab.puzzles.audit import audit_frame

    audit, shapes, breaks = audit_frame(solved.solved.assign(prompt=solved.sample["prompt"].tolist(),
                                                             trace_style=solved.style), solved.counter)
    atomic_write_csv(stage.path("trace_audit.csv"), audit)
    atomic_write_csv(stage.path("trace_shapes.csv"), shapes)
    examples = solved.solved.groupby("category").head(1)[["category", "status", "trace"]].sort_values("category")
    atomic_write_csv(stage.path("trace_examples.csv"), examples)
    return SimpleNamespace(audit=audit, shapes=shapes, breaks=breaks, examples=examples)


def explore_finish(stage: Stage, train: pd.DataFrame, val: pd.DataFrame, counts: pd.DataFrame, solved,
                   audit) -> dict:
    """01_explore's metrics.json from the steps' results; finishes the stage."""
    s = solved.solved
    metrics = {
        "n_train": len(train), "n_val": len(val),
        "per_category": counts.groupby("category")[["train", "val"]].sum().to_dict("index"),
        "solver_solved_share": float((s["status"] == "solved").mean()),
        "trace_tokens_mean": float(s["trace_tokens"].mean()),
        "trace_ref_breaks": len(audit.breaks),
    }
    if "correct" in s:
        metrics["solver_accuracy"] = float(s["correct"].mean())
    return stage.finish(metrics)


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
    train, val = split(stage)
    before = None
    if evaluate_adapter and _processes(launch) == 1:  # the training model is not loaded yet (vLLM needs the GPU)
        before = score_base(stage, val)
    trained = sft_train(stage, train, sft_model(stage), launch)
    if not trained.main:
        return trained.metrics
    scores = None
    if evaluate_adapter:
        if before is None:
            before = score_base(stage, val)
        scores = sft_scores(stage, before, score_adapter(stage, val, cfg.sft.adapter_dir))
    return finish_training(stage, trained, scores, pack_adapter(stage, cfg.sft.adapter_dir), launch)


def score_base(stage: Stage, val: pd.DataFrame, cached: bool = True) -> pd.DataFrame:
    """The base model's greedy predictions on the held-out puzzles (`predictions_before.csv`, through `evaluate`,
    cached like every evaluation: a rerun reuses it; generating leaves torch's random state as it was)."""
    before = evaluate(stage, val, None, "predictions_before.csv", cached=cached)
    print(f"held-out accuracy before training: {before['correct'].mean():.3f}")
    return before


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
                           f"make a fresh one first (stages.sft_model / stages.grpo_model)")
        model, tokenizer = self.model, self.tokenizer
        self.release()
        return model, tokenizer

    def __repr__(self) -> str:
        state = "released" if self.model is None else type(self.model).__name__
        return f"Trainee({state}; LoRA on:\n{self.table.to_string(index=False)})"


def sft_model(stage: Stage) -> Trainee:
    """The base model with the configured LoRA attached (`lab.train.sft.model_with_lora`: every configured family
    must match, the rank at most Kaggle's); writes `lora_targets.csv`."""
    from lab.train import sft as sft_lib

    return Trainee(*sft_lib.model_with_lora(stage.cfg, stage))


def sft_train(stage: Stage, train: pd.DataFrame, trainee: Trainee, launch=None):
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
    _stopped_note(stage, metrics, "sft")  # a wall-clock budget stop: how the next run (or Kaggle kernel) resumes
    del model, tokenizer, lora  # the saved adapter is scored, never the in-memory model
    main = _main_alone(launch)
    fig = _save(stage, plots.line(log, "step", ["loss"], "SFT training loss", "loss"), "loss.png") if main else None
    return SimpleNamespace(metrics=metrics, log=log, figure=fig, main=main)


def gradient_check(stage: Stage) -> tuple[pd.DataFrame | None, pd.DataFrame | None]:
    """(gradients, frozen): the gradient check the training step wrote (`lab.model.lora.GradientCheck.save`: every
    LoRA family received a gradient and moved; the frozen weights did not), None where it was off."""
    read = lambda name: pd.read_csv(stage.path(name)) if stage.path(name).is_file() else None  # noqa: E731
    return read("gradient_check.csv"), read("frozen_check.csv")


def score_adapter(stage: Stage, val: pd.DataFrame, adapter_dir) -> pd.DataFrame:
    """The saved adapter's greedy predictions on the held-out puzzles (`predictions.csv`, through `evaluate`, cached
    by content): the adapter as written to disk, never the in-memory model."""
    after = evaluate(stage, val, adapter_dir, "predictions.csv")
    return after


def sft_scores(stage: Stage, before: pd.DataFrame, after: pd.DataFrame):
    """Accuracy before and after SFT, overall and per category; writes `accuracy.png`. Returns a namespace: metrics
    (accuracy_before, accuracy_after, lift, per_category), table (per category), figure."""
    from types import SimpleNamespace

    print(f"held-out accuracy: before SFT {before['correct'].mean():.3f}, after {after['correct'].mean():.3f}")
    per_category = _per_category(before=before, after=after)
    fig = _save(stage, _accuracy_plot(before, after, "before SFT", "after SFT", "SFT"), "accuracy.png")
    metrics = {"accuracy_before": float(before["correct"].mean()), "accuracy_after": float(after["correct"].mean()),
               "lift": float(after["correct"].mean() - before["correct"].mean()), "per_category": per_category}
    return SimpleNamespace(metrics=metrics, table=pd.DataFrame.from_dict(per_category, orient="index"), figure=fig)


def finish_training(stage: Stage, trained, scores, problems: list[str], launch=None) -> dict:
    """02_sft's or 03_grpo's metrics.json: the zip's problems, the scores (None without an evaluation), the
    training metrics, the number of processes; finishes the stage."""
    scored = scores.metrics if scores is not None else {}
    return stage.finish({"submission_problems": problems, **scored, **trained.metrics,
                         "processes": _processes(launch)})


# ---- 03_grpo ----------------------------------------------------------------------------------------------------

def grpo(stage: Stage, launch=None, evaluate_adapter: bool = True) -> dict:
    """GRPO from the SFT adapter (`lab.train.grpo.train`: pass rates, prompt order, training), the saved adapter's greedy
    held-out accuracy against the SFT start, the submission zip: the steps `split`, `grpo_start`, `grpo_model`,
    `grpo_train`, `score_adapter`, `grpo_scores`, `pack_adapter`, `finish_training` (the cells of
    notebooks/03_grpo.ipynb). `launch` and `evaluate_adapter` as in `sft`."""
    cfg = stage.cfg
    train, val = split(stage)
    start = grpo_start(stage, evaluate_adapter)
    trained = grpo_train(stage, train, grpo_model(stage, start), launch)
    if not trained.main:
        return trained.metrics
    scores = None
    if evaluate_adapter:
        scores = grpo_scores(stage, start, score_adapter(stage, val, cfg.grpo.adapter_dir))
    return finish_training(stage, trained, scores, pack_adapter(stage, cfg.grpo.adapter_dir), launch)


def grpo_start(stage: Stage, evaluate_adapter: bool = True):
    """Where GRPO starts: 02_sft's finished folder and its held-out accuracy (None after `--no-eval`, which an
    evaluation of GRPO's adapter refuses: it compares against it). Returns a namespace: dir, accuracy."""
    from types import SimpleNamespace

    sft_dir = stage_output(stage.cfg, "02_sft")
    sft_accuracy = read_json(sft_dir / "metrics.json").get("accuracy_after")
    if evaluate_adapter and sft_accuracy is None:
        raise LabError(f"{sft_dir / 'metrics.json'}: no accuracy_after (02_sft ran with --no-eval), which 03_grpo's "
                       "evaluation compares against; rerun 02_sft with its evaluation, or skip this one (--no-eval)")
    return SimpleNamespace(dir=sft_dir, accuracy=sft_accuracy)


def grpo_model(stage: Stage, start) -> Trainee:
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
    return Trainee(model, tokenizer, target_table(model))


def grpo_train(stage: Stage, train: pd.DataFrame, trainee: Trainee, launch=None):
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
    _stopped_note(stage, metrics, "grpo")
    del model, tokenizer  # the saved adapter is scored, never the in-memory model
    main = _main_alone(launch)
    fig = None
    if main:
        rewards = [c for c in log.columns if c.startswith("rewards/") and c.endswith("/mean")]
        fig = _save(stage, plots.line(log, "step", ["reward", *rewards],
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
    fig = _save(stage, _accuracy_plot(before, after, "SFT start", "after GRPO", "GRPO"), "accuracy.png")
    per_category = _per_category(sft=before, grpo=after)
    metrics = {"accuracy_sft_start": sft_accuracy, "accuracy_after": acc, "delta": float(acc - sft_accuracy),
               "per_category": per_category}
    return SimpleNamespace(metrics=metrics, table=pd.DataFrame.from_dict(per_category, orient="index"), figure=fig)


# ---- 04_vote ----------------------------------------------------------------------------------------------------

TRAINING_STAGES = (("03_grpo", "grpo"), ("02_sft", "sft"))  # latest first: (stage, the config node with adapter_dir)


def vote_adapter(cfg) -> tuple[str, Path]:
    """(what it is, path) of the adapter 04_vote samples: `vote.adapter` when set (its stage, if it lies in one of this
    run's, must have finished: `stage_input`), else the latest finished training stage's: 03_grpo's adapter, or
    02_sft's when 03_grpo did not finish (e.g. skipped: its rollouts cost minutes per step). A 03_grpo that
    finished but is no longer current (02_sft rerun since) is passed over for 02_sft, with a note."""
    from lab.core import lineage

    if cfg.vote.adapter:
        p = stage_input(cfg, cfg.vote.adapter)
        try:
            where = lineage.stage_of(p.relative_to(resolve_path(cfg.run_dir)).as_posix()) or "vote.adapter"
        except ValueError:
            where = "vote.adapter"
        return where, p
    run_dir = resolve_path(cfg.run_dir)
    for name, node in TRAINING_STAGES:
        if not (run_dir / name / "metrics.json").is_file():
            if (run_dir / name).is_dir():
                print(f"note: {run_dir / name} has no finished output (no metrics.json): voting with an earlier "
                      "stage's adapter")
            continue
        stale = lineage.problems(run_dir, name)
        if stale:
            print(f"note: {name} finished but is not current ({'; '.join(stale)}): voting with an earlier stage's "
                  "adapter")
            continue
        return name, stage_input(cfg, cfg[node].adapter_dir)
    raise LabError(f"{run_dir}: no finished training stage (03_grpo or 02_sft) to vote with; run 02_sft first, or "
                   "set vote.adapter=PATH")


def vote(stage: Stage) -> dict:
    """Greedy predictions and k samples per held-out puzzle from `vote_adapter` (03_grpo's adapter, else 02_sft's,
    or `vote.adapter`), every voting method of `lab.eval.vote` replayed on that one sample table (accuracy against k
    and against tokens), and with `vote.live_early_stop` early stopping sampled for real
    (`lab.eval.vote.early_stop_live`: its tokens were generated; the replayed early_stop row is the what-if)."""
    from dataclasses import replace

    from lab.data import dataset as data
    from lab.model import generate
    from lab.core import plots
    from lab.eval import vote as vote_lib

    cfg, v = stage.cfg, stage.cfg.vote
    train, val = data.prepare(cfg)
    source, adapter = vote_adapter(cfg)  # its stage must have finished
    print(f"voting with {source}'s adapter ({adapter}): k={v.k}, temperature={v.temperature}")
    live = None
    with generate.Generator(cfg, adapter=adapter) as gen:
        greedy = evaluate(stage, val, adapter, "predictions.csv", gen=gen)
        spec = generate.Sampling.competition(cfg, n=v.k, temperature=v.temperature, top_p=v.top_p, logprobs=v.logprobs)
        samples = generate.sample_table(gen, val, spec, cache=stage.path("samples.jsonl"))
        if v.live_early_stop and "early_stop" in v.methods:
            opts = {o: x for o, x in dict(v.options.get("early_stop", {})).items() if o in ("window", "agree",
                                                                                             "stop_prob")}
            by_id = val.assign(id=val["id"].astype(str)).set_index("id", drop=False)

            def draw(ids, rnd, n):  # round r: its own seed and cache file, so a killed run resumes round by round
                return generate.sample_table(gen, by_id.loc[ids].reset_index(drop=True),
                                             replace(spec, n=n, seed=spec.seed + 1_000_003 * (rnd + 1)),
                                             cache=stage.path(f"early_stop_round{rnd}.jsonl"))

            live, live_samples = vote_lib.early_stop_live(draw, by_id["id"].tolist(), v.k,
                                                          version=cfg.infer.metric_version, **opts)
            atomic_write_csv(stage.path("early_stop_live.csv"), live)
            atomic_write_csv(stage.path("early_stop_live_samples.csv"), live_samples)
    atomic_write_csv(stage.path("samples.csv"), samples)
    accuracy = float(greedy["correct"].mean())
    print(f"greedy accuracy {accuracy:.3f}; {len(samples)} samples")
    curves = vote_lib.curves(samples, K=v.k)
    atomic_write_csv(stage.path("curves.csv"), curves)
    plots.save(plots.vote_k(curves, greedy=accuracy, n=len(greedy)), stage.path("vote_k.png"))
    rows = [{"method": "greedy (Kaggle)", "accuracy": accuracy, "tokens_per_puzzle": float(greedy["tokens"].mean()),
             "tokens": "generated"}]
    for method in v.methods:
        s = vote_lib.summary(vote_lib.replay(samples, method, k=v.k, **dict(v.options.get(method, {}))))
        what = "replayed what-if" if method == "early_stop" else "generated"  # early_stop's saving is not spent here
        rows.append({"method": method + (" (replayed what-if)" if method == "early_stop" else ""),
                     "accuracy": s["accuracy"], "tokens_per_puzzle": s["tokens_used"], "tokens": what})
    if live is not None:
        s = vote_lib.summary(live)
        rows.append({"method": "early_stop (live)", "accuracy": s["accuracy"], "tokens_per_puzzle": s["tokens_used"],
                     "tokens": "generated"})
        print(f"early stopping, sampled in rounds: accuracy {s['accuracy']:.3f}, {s['samples_used']:.2f} samples and "
              f"{s['tokens_used']:.0f} tokens per puzzle generated, against {v.k} samples and "
              f"{float(samples.groupby('id')['tokens'].sum().mean()):.0f} tokens in full")
    methods = pd.DataFrame(rows)
    atomic_write_csv(stage.path("methods.csv"), methods)
    plots.save(plots.vote_tokens(curves, methods, n=len(greedy)), stage.path("vote_tokens.png"))
    at_k = curves.loc[curves["k"] == v.k].iloc[0]
    metrics = {"adapter_stage": source, "adapter": str(adapter), "k": v.k, "greedy_accuracy": accuracy,
               "maj_at_k": float(at_k["maj_at_k"]), "pass_at_k": float(at_k["pass_at_k"]),
               "methods": methods.set_index("method").to_dict("index")}
    if live is not None:
        metrics["early_stop_live"] = {**vote_lib.summary(live), "tokens_in_full": float(
            samples.groupby("id")["tokens"].sum().mean())}
    return stage.finish(metrics)


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
    room was skipped: `generate.SKIPPED`), else `infer.max_tokens`."""
    from lab.competition.prompts import chat_prompt
    from lab.model import generate, models

    cfg = stage.cfg
    tok = models.load_tokenizer(cfg)
    kept = [chat_prompt(tok, p) for p, why in zip(pred["prompt"], pred["finish_reason"]) if why != generate.SKIPPED]
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


# ---- greedy evaluation, cached by its key -----------------------------------------------------------------------

def evaluation_key(cfg, adapter, puzzles: pd.DataFrame) -> dict:
    """What a greedy evaluation's predictions depend on: the base model's content hash (`generate.model_hash`), the
    adapter's (`lineage.content_hash`; None for the base model alone), a sha256 of the puzzles (id, prompt, answer,
    category, subtype), the seed, every `infer` setting (greedy sampling, max_tokens, metric version, engine), and
    the back-end, dtype and max_model_len (`generate.engine_settings`, as the samples cache's key). Paths are left
    out: 03_grpo's adapter in its working folder and the same adapter read by 04_vote from the finished one are the
    same key."""
    from lab.model import generate, models
    from lab.core.lineage import content_hash

    cols = [c for c in ("id", "prompt", "answer", "category", "subtype") if c in puzzles.columns]
    return {"model_sha256": generate.model_hash(models.model_path(cfg)),
            "adapter_sha256": content_hash(resolve_path(adapter)) if adapter is not None else None,
            "puzzles_sha256": hashlib.sha256(puzzles[cols].astype(str).to_csv(index=False).encode()).hexdigest(),
            "seed": cfg.seed, **generate.engine_settings(cfg, cfg.model.generation_backend)}


def evaluate(stage: Stage, puzzles: pd.DataFrame, adapter, name: str, gen=None, cached: bool = True) -> pd.DataFrame:
    """Greedy predictions (the competition's settings, `generate.predictions`) of the base model plus `adapter`
    (None: the base model alone) on `puzzles`, written to the stage's file `name` and returned as
    `lab.eval.analysis.load_predictions` reads them. `gen`: a Generator of that adapter already open (else one is made
    only when needed). Cached as `<run_dir>/evaluations/<key digest>.csv` beside its key (`.json`), both written
    atomically: an evaluation with the same key is copied from there instead of generated again.

    `cached=False` always generates (and stores nothing). 02_sft's evaluation of the base model before training is
    cached like the others: `generate.generate_hf` seeds its batches inside `torch.random.fork_rng`, so torch's
    random state after it (from which SFT initialises the LoRA next) is the same whether it was generated or reused
    (tests/test_caches.py checks both)."""
    from lab.model import generate
    from lab.eval.analysis import load_predictions

    key = evaluation_key(stage.cfg, adapter, puzzles)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    entry = resolve_path(stage.cfg.run_dir) / "evaluations" / f"{digest}.csv"
    out = stage.path(name)
    if cached and entry.is_file():
        print(f"greedy evaluation: the same model, adapter, puzzles and settings as {entry}; reused, not generated")
        _copy(entry, out)
    else:
        with contextlib.nullcontext(gen) if gen is not None else generate.Generator(stage.cfg, adapter=adapter) as g:
            generate.predictions(g, puzzles, out_csv=out)
        if cached:
            atomic_write_json(entry.with_suffix(".json"), key)
            _copy(out, entry)  # the CSV last: its presence means a complete entry
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
