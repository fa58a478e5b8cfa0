"""GRPO from the SFT adapter with TRL's GRPOTrainer, as steps 03_grpo runs (`lab.recipes.grpo`): `GrpoRun` opens a
run (prompt pool, completion budget, rewards, GRPOConfig, rollout engine, resume point), measures the pool's pass
rates, records the prompt order the recipe chose (`keep_order`) and trains it (`train`: the adapter saved to
`grpo.adapter_dir`). `grpo.rollout_backend` is `hf` (transformers samples from the in-memory adapter) or `vllm` (an
engine serves the adapter packed as the submission each round, `lab.train.rollouts`; never merged weights,
`lab.plan.preflight.check_backend`). Nothing here writes a stage's files. The design and the TRL/PEFT source it
rests on: docs/internals.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import math
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
from omegaconf import DictConfig

from lab import LabError
from lab.train import checkpoints
from lab.train.checkpoints import RUN_RECORD  # the checkpoint folder's run record (tests read it here)
from lab.data.dataset import trace_style
from lab.core.lineage import lora_checksum
from lab.model.generate import completion_budget
from lab.plan.preflight import check_backend  # a config check the preflight runs before anything loads
from lab.train.grpo_refine import refine_prompt_text, refine_rollout
from lab.core.io import check_replaceable, is_main_process, read_json
from lab.core.paths import resolve_path
from lab.competition.prompts import chat_prompt
from lab.train.sft import optim_args

# grpo keys that do not change the training trajectory: a resumed run may change them
RESUME_FREE_KEYS = ("max_steps", "save_steps", "logging_steps", "resume", "wall_clock_budget_min",
                    "truncation_warn_share", "zero_variance_warn_share", "gradient_check", "adapter_dir",
                    "init_adapter",
                    "vllm_gpu_memory_utilization", "vllm_sleep_mode", "vllm_sleep_level", "packing", "pack_tokens",
                    "max_num_seqs")


# ---- budget, prompts, schedule ----------------------------------------------------------------

def max_completion_length(cfg: DictConfig, tokenizer, puzzles: Sequence[str]) -> int:
    """GRPOConfig's `max_completion_length` for these raw puzzle texts: `lab.model.generate.completion_budget` with
    prompts counted as TRL counts them (with the tokenizer's special tokens); with `refine` the draft and the refinement
    share what the refinement prompt leaves, min(infer.max_tokens, (max_model_len - longest) // 2). Or
    `grpo.max_completion_length` when set, checked against that limit."""
    g, max_len = cfg.grpo, cfg.model.max_model_len
    prompts = [refine_prompt_text(tokenizer, p, "") if g.refine else chat_prompt(tokenizer, p) for p in puzzles]
    room = completion_budget(tokenizer, prompts, max_len, max_len, add_special_tokens=True)  # max_len - longest
    limit = room // 2 if g.refine else room
    what = f"(model.max_model_len - longest prompt) // 2 = {limit} (refine: drafts and refinements share the " \
        "context)" if g.refine else f"model.max_model_len - longest prompt = {limit}"
    if limit <= 0:
        raise LabError(f"refine=true: a prompt leaves {room} token(s) under model.max_model_len={max_len}, no room "
                       "for both a draft and a refinement")
    if g.max_completion_length is None:
        return min(cfg.infer.max_tokens, limit)
    b = g.max_completion_length
    if not 1 <= b <= limit:
        raise LabError(f"conf/grpo: max_completion_length={b} must be between 1 and {what}")
    return b


def build_dataset(tokenizer, puzzles: pd.DataFrame, style: str = "compact"):
    """Rendered Kaggle prompts plus the columns rewards read (answer, category, solver_trace in `style`, the
    `data.trace_style` 02_sft trained on), the id and the
    raw puzzle text (`refine` builds its prompts from it); one row per puzzle row, in order."""
    from datasets import Dataset

    from lab.puzzles import batch_inputs, solve

    inputs = batch_inputs(puzzles["prompt"])  # each category's batch input from the frame's prompts, as in solve_frame
    cache: dict[str, dict] = {}
    rows = []
    for _, r in puzzles.iterrows():
        key = str(r["id"])
        if key not in cache:
            sol = solve(r["prompt"], style=style, **inputs)
            cache[key] = {"prompt": chat_prompt(tokenizer, r["prompt"]), "answer": str(r["answer"]),
                          "category": str(r.get("category", "")),
                          "solver_trace": sol.trace if sol.status == "solved" else "", "id": key,
                          "puzzle": str(r["prompt"])}
        rows.append(cache[key])
    return Dataset.from_list(rows)


def schedule(order: Sequence[str], n_rows: int, shuffle: bool, seed: int) -> list[str]:
    """The ids in training order for the whole run: `order` repeated to `n_rows` rows; with `shuffle`, every
    pass after the first is reshuffled with `np.random.default_rng(seed + pass)`."""
    order = list(order)
    if not order:
        raise LabError("no training prompts to schedule")
    out: list[str] = []
    for p in range(math.ceil(n_rows / len(order))):  # the passes over `order`
        if p and shuffle:
            out += [order[i] for i in np.random.default_rng(int(seed) + p).permutation(len(order))]
        else:
            out += order
    return out[:n_rows]


def pass_rate_table(cfg: DictConfig, model, tokenizer, puzzles: pd.DataFrame, budget: int,
                    cache: Path | None = None, rollouts=None) -> pd.DataFrame:
    """`grpo.pass_rate_k` samples per training prompt from the in-memory model (transformers back-end), or with
    `rollouts` (a `lab.train.rollouts.VLLMRollouts`, rollout_backend=vllm) from its engine serving the start adapter
    packed, all prompts in one hand-over; sampled as the rollouts sample (`grpo.temperature`, `grpo.top_p`, the GRPO
    budget) -> [id, n, correct, pass_rate].

    With `cache` (`train` passes `<checkpoint_dir>/pass_rate_samples.jsonl`), the samples are appended after every
    generate call, one `infer.batch_size` of completions (`sample_table`'s chunk), keyed by the sampling spec and
    the start adapter's weights (`lab.eval.sampling.sample_key`: `lora_checksum` of the in-memory model): a run
    killed part-way keeps every prompt it finished, and the rerun samples only the rest."""
    from lab.eval import sampling
    from lab.eval.vote import pass_rates
    from lab.model import generate

    g = cfg.grpo
    spec = generate.Sampling(max_tokens=int(budget), n=g.pass_rate_k, temperature=float(g.temperature),
                             top_p=float(g.top_p), seed=int(cfg.seed))
    chunk = max(1, int(cfg.infer.batch_size) // int(g.pass_rate_k))  # the prompts of one generate call (hf)
    if cache is not None:
        Path(cache).parent.mkdir(parents=True, exist_ok=True)
    if rollouts is not None:  # the key names the in-memory adapter's checksum (`VLLMRollouts.pass_rate_generator`)
        with rollouts.pass_rate_generator() as gen:
            return pass_rates(sampling.sample_table(gen, puzzles, spec, cache=cache, chunk=chunk))
    gen = generate.Generator(cfg, model=model, tokenizer=tokenizer, backend="hf")
    return pass_rates(sampling.sample_table(gen, puzzles, spec, cache=cache, chunk=chunk))


# ---- GRPOConfig -------------------------------------------------------------------------------

def base_model_type(cfg: DictConfig) -> str | None:
    """The base model's `model_type` without loading it: nemotron_h for the tiny model (`lab.model.models.build_tiny`
    builds a NemotronHForCausalLM), else its config.json (local folder, Kaggle mount or Hub cache: transformers'
    `cached_file` with local_files_only, transformers/utils/hub.py); None if unknown."""
    if cfg.model.build_tiny:
        return "nemotron_h"
    from transformers.utils import cached_file

    from lab.model.models import model_path

    try:
        found = cached_file(model_path(cfg), "config.json", local_files_only=True)
        return json.loads(Path(found).read_text()).get("model_type")
    except (LabError, OSError, ValueError, TypeError):
        return None


def grpo_args(cfg: DictConfig, output_dir: Path, max_completion_length: int, reward_weights: list[float],
              cuda: bool | None = None):
    """GRPOConfig from `conf/grpo`: every value from the config, none left to a TRL default that matters
    (max_completion_length, shuffling, batch shape, learning rate, seed, precision). Constructing it never imports
    vLLM; TRL's own checks run here (`train` builds it before any sampling), and what they refuse is a LabError."""
    from trl import GRPOConfig

    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    from lab.core.run import tracking_args

    g = cfg.grpo
    from lab.plan.grpo_policy import micro_batch  # the trace and the preflight size the same micro-step

    micro, accum = micro_batch(cfg)
    kw = dict(
        output_dir=str(output_dir), max_steps=g.max_steps, learning_rate=g.learning_rate,
        per_device_train_batch_size=micro, gradient_accumulation_steps=accum,
        steps_per_generation=accum * int(g.steps_per_generation),
        num_generations=g.num_generations, max_completion_length=int(max_completion_length),
        temperature=g.temperature, top_p=g.top_p, top_k=0, beta=g.beta, loss_type=str(g.loss_type),
        reward_weights=[float(w) for w in reward_weights], mask_truncated_completions=g.mask_truncated_completions,
        shuffle_dataset=False,  # the lab's schedule is the order (see `schedule`)
        logging_steps=g.logging_steps, save_steps=g.save_steps, save_total_limit=2, seed=cfg.seed,
        data_seed=cfg.seed, **tracking_args(cfg, "03_grpo"), use_cpu=not cuda,
        bf16=cfg.model.dtype == "bfloat16" and cuda, dataloader_num_workers=0,
        gradient_checkpointing=g.gradient_checkpointing, lr_scheduler_type="constant", warmup_steps=0,
        log_completions=False, **optim_args(cfg),
    )
    check_backend(cfg)  # vllm: TRL's use_vllm stays False (its default); the rollouts come from rollout_func
    unknown = sorted(set(kw) - {f.name for f in dataclasses.fields(GRPOConfig)})
    if unknown:
        raise LabError(f"the installed TRL's GRPOConfig has no field(s) {unknown}; lab.train.grpo targets trl==1.15")
    try:
        return GRPOConfig(**kw)
    except ValueError as e:
        raise LabError(f"conf/grpo: TRL's GRPOConfig refuses these settings: {e}") from None


def install_packing(cfg: DictConfig, trainer, model, budget: int, puzzles: Sequence[str], tokenizer) -> None:
    """`grpo.packing`: the trainer's loss and log-probs computed in packs of `grpo.pack_tokens`
    (`lab.train.trl_private.install_packing`), rows kept apart by `lab.model.packed_rows` (varlen attention; the real
    model only with the Mamba kernels). Refuses a pack smaller than the longest prompt + the completion budget."""
    from lab.model import packed_rows
    from lab.train import trl_private

    g = cfg.grpo
    longest = max(len(tokenizer(chat_prompt(tokenizer, p))["input_ids"]) for p in puzzles)
    if int(g.pack_tokens) < longest + int(budget):
        raise LabError(f"conf/grpo: pack_tokens={g.pack_tokens} is below the longest prompt + completion "
                       f"({longest} + {budget}): such a row would fit no pack")
    if not cfg.model.build_tiny:
        packed_rows.require_kernels(model)
    packed_rows.install(model, attention="varlen")
    trl_private.install_packing(trainer, int(g.pack_tokens), str(g.old_logprobs))


# ---- resume and training ------------------------------------------------------------------------------------

def fingerprint(cfg: DictConfig, pool_ids: Sequence[str], model, budget: int) -> dict:
    """What must not change between a run and its resumption (`lab.train.checkpoints.fingerprint`: every
    trajectory-changing grpo key, seed, model and its content hash); the pass rates and prompt order of a run record
    are reused only under the same fingerprint, which adds the budget, the pool and the start adapter's checksum."""
    return checkpoints.fingerprint(
        cfg, "grpo", RESUME_FREE_KEYS, max_completion_length=int(budget),
        pool_sha256=hashlib.sha256("\n".join(map(str, pool_ids)).encode()).hexdigest(),
        start_adapter=lora_checksum(model, trainable=True))


def resume_point(cfg: DictConfig, out: Path, fp: dict, asked: bool = True
                 ) -> tuple[Path | None, dict | None, list[str]]:
    """(checkpoint to resume or None, the run record to reuse or None, notes): `lab.train.checkpoints.resume_point` with
    `grpo.resume` and `grpo.max_steps`; `asked=False` (resume not asked for explicitly) starts afresh with a note
    where the fingerprint changed, instead of refusing."""
    return checkpoints.resume_point(out, fp, resume=cfg.grpo.resume, asked=asked, what="grpo",
                                    max_steps=cfg.grpo.max_steps)


def _floats(log: pd.DataFrame, col: str) -> list[float | None]:
    """A logged column as JSON-safe floats; None where TRL logged nothing (e.g. every reward masked)."""
    values = pd.to_numeric(log[col], errors="coerce").astype(float).tolist() if col in log else []
    return [round(v, 4) if math.isfinite(v) else None for v in values]


def step_metrics(log: pd.DataFrame, reward_names: Sequence[str], beta: float) -> dict:
    """The per-step lists `train` returns (see the module docstring)."""
    m = {"logged_steps": [int(s) for s in log["step"]] if "step" in log else [],
         "reward_per_step": _floats(log, "reward"), "reward_std_per_step": _floats(log, "reward_std"),
         "rewards_per_step": {n: {"mean": _floats(log, f"rewards/{n}/mean"), "std": _floats(log, f"rewards/{n}/std")}
                              for n in reward_names},
         "completion_length_per_step": _floats(log, "completions/mean_length"),
         "truncated_share_per_step": _floats(log, "completions/clipped_ratio"),
         "zero_variance_share_per_step": _floats(log, "frac_reward_zero_std"),
         "grad_norm_per_step": _floats(log, "grad_norm")}
    if "correctness" in reward_names:
        m["correctness_per_step"] = m["rewards_per_step"]["correctness"]["mean"]
    if beta > 0:
        m["kl_per_step"] = _floats(log, "kl")
    return m


def _trainable_sample(model, size: int = 65536) -> dict:
    """A strided sample (at most `size` values, float32) of every trainable tensor: bounded memory on the 30B model."""
    out = {}
    for n, p in model.named_parameters():
        if p.requires_grad:
            flat = p.detach().reshape(-1)
            out[n] = flat[::max(1, flat.numel() // size)][:size].float().clone()
    return out


@dataclasses.dataclass
class Trained:
    """What `GrpoRun.train` returns: the metrics, the trained model, the step log, the gradient check (None when off
    or nothing was trained), the warnings so far (resume notes, guard rails), refine's records, and whether the
    checkpoint was already at `max_steps` (nothing trained)."""
    metrics: dict
    model: object
    log: pd.DataFrame
    check: object
    warnings: list[str]
    refinements: list[dict]
    finished: bool


class GrpoRun:
    """One GRPO run on `model` (the start adapter, trainable), in the order 03_grpo calls it: opening it picks the
    pool of `grpo.n_prompts` puzzles, the completion budget, the rewards, TRL's arguments (its checks run here,
    before any sampling), the rollout engine (vllm) and the resume point; then `pass_rates`, the recipe's choice of
    prompts and their order (`keep_order`), `train`. `close` shuts the engine (`train` does, however it ends)."""

    def __init__(self, cfg: DictConfig, train_puzzles: pd.DataFrame, model, tokenizer, checkpoint_dir: Path,
                 resume_asked: bool = False):
        from lab.train import trl_private
        from lab.train.callbacks import GroupSpread
        from lab.train.rewards import build

        g = self.g = cfg.grpo
        self.cfg, self.model, self.tokenizer, self.out = cfg, model, tokenizer, Path(checkpoint_dir)
        # an adapter_dir pointed outside the stage at a folder the lab did not make is refused before training
        check_replaceable(resolve_path(g.adapter_dir), "adapter (grpo.adapter_dir)")
        self.backend = check_backend(cfg)
        if self.backend == "vllm" and importlib.util.find_spec("vllm") is None:
            raise LabError("conf/grpo: rollout_backend=vllm but vllm is not installed (on a GPU: pip install -e "
                           "'.[gpu]'; on CPU, vLLM's CPU build: the lane's .venv-vllm, docs/vllm_lane.md); or set "
                           "grpo.rollout_backend=hf")
        trl_private.install()
        pool = train_puzzles.sample(n=min(g.n_prompts, len(train_puzzles)), random_state=cfg.seed)
        self.pool = pool.assign(id=pool["id"].astype(str)).reset_index(drop=True)
        self.budget = max_completion_length(cfg, tokenizer, self.pool["prompt"].tolist())
        self.funcs, self.weights = build(dict(g.rewards), max_completion_length=self.budget,
                                         eos_token_ids=[tokenizer.eos_token_id],
                                         truncation="mask" if g.mask_truncated_completions else "penalise",
                                         metric_version=cfg.infer.metric_version)
        self.spread = None
        self.names = [f.__name__ for f in self.funcs]
        if "correctness" in self.names:
            i = self.names.index("correctness")
            self.funcs[i] = self.spread = GroupSpread(self.funcs[i], g.num_generations)
        self.args = grpo_args(cfg, self.out, self.budget, self.weights)  # TRL's checks, before the costly sampling
        self.rollouts = None
        if self.backend == "vllm" and int(self.args.world_size) > 1:
            raise LabError(f"conf/grpo: rollout_backend=vllm runs in one process on one GPU (lab.train.rollouts), not "
                           f"{self.args.world_size} processes; launch one process, or set grpo.rollout_backend=hf")
        if self.backend == "vllm":  # one engine for the pass rates and every round, built at its first use
            from lab.train.rollouts import VLLMRollouts

            self.rollouts = VLLMRollouts(cfg, model, tokenizer, self.out, self.budget)
        try:
            self.fingerprint = fingerprint(cfg, self.pool["id"].tolist(), model, self.budget)
            self.last, self.record, notes = resume_point(cfg, self.out, self.fingerprint, asked=resume_asked)
        except BaseException:
            self.close()
            raise
        for n in notes:
            print(f"WARNING: {n}" if not n.startswith("resuming from") else n)
        self.notes = [n for n in notes if not n.startswith("resuming from")]

    @property
    def resumed(self) -> bool:
        """True when a run record of the same fingerprint holds the pass rates and prompt order to reuse."""
        return self.record is not None

    def pass_rates(self) -> pd.DataFrame:
        """`pass_rate_table` of the pool on the start model; the main process keeps its samples as they come in the
        checkpoint folder (a run killed while sampling resumes them), the others sample alone."""
        cache = self.out / "pass_rate_samples.jsonl" if is_main_process() else None
        try:
            return pass_rate_table(self.cfg, self.model, self.tokenizer, self.pool, self.budget, cache=cache,
                                   rollouts=self.rollouts)
        except BaseException:
            self.close()
            raise

    def keep_order(self, order: Sequence[str], selection: dict) -> None:
        """Record the prompt order (ids) and the selection's summary in the checkpoint folder's run record, under
        this run's fingerprint: a resumed run trains the same order."""
        self.record = {"fingerprint": self.fingerprint, "order": [str(i) for i in order], "selection": selection}
        checkpoints.write_record(self.out, self.record)

    def train(self) -> Trained:
        """GRPO on the recorded prompt order, then the adapter saved to `grpo.adapter_dir`; closes the run, which lets
        go of the model (the result holds it: deleting the result frees its memory)."""
        try:
            return self._train()
        finally:
            self.close()
            self.model = self.tokenizer = self.rollouts = None

    def close(self) -> None:
        if self.rollouts is not None and not getattr(self, "_closed", False):
            self.rollouts.close()
        self._closed = True

    def _train(self) -> Trained:
        import torch
        from trl import GRPOTrainer

        from lab.train import trl_private
        from lab.train.callbacks import GuardRails, trainer_callbacks, use_text_progress
        from lab.model.lora import (GradientCheck, allow_out_proj, install_fused_lora_head, save_adapter,
                                    trainer_accepts_head_lora)

        cfg, g, model, tokenizer, out, last = self.cfg, self.g, self.model, self.tokenizer, self.out, self.last
        if self.record is None:
            raise LabError("GrpoRun.train: no prompt order (keep_order first, or resume a run that recorded one)")
        record = self.record
        if torch.distributed.is_available() and torch.distributed.is_initialized():  # scripts/train_grpo.py, N ranks
            box = [record]  # every rank trains rank 0's prompt order (its own sampled pass rates could differ)
            torch.distributed.broadcast_object_list(box, src=0)
            record = box[0]
        order = [str(i) for i in record["order"]]
        by_id = self.pool.set_index("id")
        missing = [i for i in order if i not in by_id.index]
        if missing:
            raise LabError(f"{out / RUN_RECORD}: prompt ids {missing[:5]} are not in this run's pool")
        # every optimiser step takes prompts_per_step prompts per process: the schedule covers all processes' steps,
        # and the last round's whole generation batch (a round samples steps_per_generation steps' prompts at once)
        max_steps = g.max_steps  # >= 1: lab/core/schema.py
        rounds = math.ceil(max_steps / int(g.steps_per_generation)) * int(g.steps_per_generation)
        ids = schedule(order, rounds * g.prompts_per_step * int(self.args.world_size), shuffle=not g.curriculum,
                       seed=cfg.seed)
        ds = build_dataset(tokenizer, by_id.loc[ids].reset_index(), trace_style(cfg))

        check = GradientCheck(model) if g.gradient_check else None
        guard = GuardRails(g, self.spread)
        budget_stop = trainer_callbacks(check, checkpoints.wall_clock_budget(cfg, "grpo"))  # tests wrap it
        callbacks = [guard, *budget_stop]
        before = _trainable_sample(model)
        refinements: list[dict] = []
        finished = last is not None and checkpoints.step_of(last) >= max_steps
        if finished:  # nothing left to train: transformers would run one more step; take the checkpoint as it is
            print(f"{last} is already at grpo.max_steps={max_steps}: loading its adapter, no further training")
            model.load_adapter(str(last), adapter_name="default", is_trainable=True)
            state = read_json(last / "trainer_state.json", kind=dict)
            history, steps = state.get("log_history", []), int(state["global_step"])
        else:
            rollout = self.rollouts
            if g.refine:
                rows_by_prompt = {r["prompt"]: r for r in ds}
                rollout = refine_rollout(tokenizer, self.funcs, self.weights, rows_by_prompt, refinements)
            # beta > 0: TRL adds a "ref" copy of the adapter (out_proj included); an lm_head LoRA: see lab.model.lora
            with allow_out_proj(), trainer_accepts_head_lora(model):
                trainer = GRPOTrainer(model=model, reward_funcs=self.funcs, args=self.args,
                                      train_dataset=ds, processing_class=tokenizer,
                                      callbacks=[*callbacks, checkpoints.marker_callback()], rollout_func=rollout)
            use_text_progress(trainer)  # step lines from lab.train.callbacks.TrainProgress, not an HTML widget
            if self.rollouts is not None and not g.packing:  # packed: the packed loss logs the gap (install_packing)
                trl_private.watch_sampling_gap(trainer)  # rollout/logp_diff_*: where TRL computes the old log-probs
            # GRPOTrainer's fused head: its sampling temperature, log_probs and entropy (trl/trainer/grpo_trainer.py)
            install_fused_lora_head(model, temperature=float(trainer.temperature), outputs=("log_probs", "entropy"))
            if g.packing:  # a step's completions in packs (lab.train.grpo_packed), each row's state its own
                install_packing(cfg, trainer, model, self.budget, self.pool["prompt"].tolist(), tokenizer)
            with checkpoints.disk_full_guard(out, lambda: checkpoints.checkpoint_need(out, cfg, model)):
                trainer.train(resume_from_checkpoint=str(last) if last else None)
            history, steps = trainer.state.log_history, int(trainer.state.global_step)
        self.close()
        if "ref" in getattr(model, "peft_config", {}):
            model.delete_adapter("ref")  # TRL's frozen reference copy: not part of the trained adapter
        need = lambda: checkpoints.checkpoint_need(out, cfg, model)  # noqa: E731 - asked only when the disk is full
        with checkpoints.disk_full_guard(resolve_path(g.adapter_dir), need):
            from lab.core.paths import adapter_dtype

            save_adapter(model, resolve_path(g.adapter_dir), dtype=adapter_dtype(cfg))  # on Kaggle bf16

        log = pd.DataFrame([h for h in history if "completions/mean_length" in h])  # per-step logs
        after = _trainable_sample(model)
        changed = sum(float((after[n] - before[n]).abs().sum()) for n in after if n in before)
        sel = record.get("selection", {})
        spread = self.spread
        metrics = {
            "prompts_pool": len(self.pool), "prompts_dropped": int(sel.get("dropped", 0)),
            "prompts_unsolved": int(sel.get("unsolved", 0)), "prompts_trained": len(order),
            "max_completion_length": self.budget, "rollout_backend": self.backend, "refine": g.refine,
            "steps": steps, "max_steps": max_steps, "resumed_from": str(last) if last else None,
            "already_finished": finished, "stopped_by_budget": bool(budget_stop[0].stopped_by_budget),
            **step_metrics(log, self.names, g.beta),  # GroupSpread keeps the name of the reward it wraps
            # this process's reward calls since this run (re)started: one per step without refine
            "correctness_flat_group_share_per_step": [round(x, 4) for x in spread.shares] if spread else [],
            "lora_weight_change": changed,
            # vllm: per round its step, LoRA id, folder and seconds (lab.train.rollouts)
            "rollout_rounds": self.rollouts.rounds if self.rollouts is not None else [],
            # vllm on CUDA: the rounds' engine's real pool against its sizing (lab.plan.grpo_policy.pool_capacity)
            "rollout_pool": self.rollouts.pool if self.rollouts is not None else None,
        }
        return Trained(metrics, model, log, None if finished else check, list(self.notes) + guard.warnings,
                       refinements, finished)
