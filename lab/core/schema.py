"""The config's schema: one dataclass per config group, each field typed, with its help text and its allowed range.

`conf/` holds the values; this module says what each key is and what it may be. `register()` stores `Config` in
Hydra's ConfigStore as `schema`, the first entry of `conf/config.yaml`'s defaults list, so every group's YAML is
merged onto its dataclass at compose: a wrong type (`seed=1.5`), a name its Enum lacks or an unknown key fails
there, naming the key. Ranges (`_help(..., ge=1)`) and cross-key rules (`rules`) are checked in `__post_init__`, as
TRL's `GRPOConfig` checks its own; `problems(cfg)` returns what they found, which `lab.core.config` raises as one
LabError. A field is `MISSING` until a YAML file sets it: the values have one home, conf/. The competition's fixed
limits are the defaults of the frozen `CompetitionLimits` (the read-only `competition` node; `COMPETITION` for code
without a config), and `rank_problem` is the one check of a LoRA rank against them. Names only a library knows and
paths that must exist are checked in lab/core/config.py. `python -m lab schema [GROUP]` prints every key.
The Hydra and OmegaConf behaviour this rests on: docs/internals.md, lab.core.schema.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import math
import operator
import os
import typing
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Dict, List, Optional

from omegaconf import MISSING, OmegaConf

from lab import LabError
from lab.core.paths import resolve_path


# back-end names: each member's name is its value (an Enum field takes a name), so a member reads as that string
GenerationBackend = StrEnum("GenerationBackend", ["hf", "vllm"])  # model.generation_backend, grpo.rollout_backend
TrainBackend = StrEnum("TrainBackend", ["hf", "unsloth"])  # model.train_backend, sft.backend
# fast paths (lab.train.fast_paths): auto takes the fast one where its kernel is here and its calibrated check passed
ExpertsPath = StrEnum("ExpertsPath", ["auto", "routed", "fold"])  # sft.lora.experts_path (lab.model.experts_lora)
PackedAttention = StrEnum("PackedAttention", ["auto", "varlen", "mask"])  # sft.packed_attention (lab.model.packed_rows)
Switch = StrEnum("Switch", ["auto", "on", "off"])  # sft.fused_mamba (lab.model.lora)
Tracker = StrEnum("Tracker", ["none", "tensorboard", "wandb", "mlflow"])  # report_to (lab.core.run.tracking_args)


# Names owned by packages above lab/core, which may not import them (pyproject.toml's layers contract), repeated here
# so that compose checks them before anything runs; a test holds each list to its owner.
VOTE_METHODS = ("greedy", "majority", "confidence", "early_stop")  # lab.eval.vote.METHODS
VOTE_OPTIONS = ("version", "keep_top", "conf_col", "window", "agree", "stop_prob")  # lab.eval.vote.OPTIONS
METRIC_VERSIONS = ("final", "legacy")  # lab.competition.metric.VERSIONS
REWARD_NAMES = ("correctness", "format", "length", "trace_agreement")  # lab.train.rewards.REWARDS
GRPO_LOSS_TYPES = ("dapo", "grpo", "bnpo", "dr_grpo", "cispo")  # lab.train.grpo_packed.LOSS_TYPES
OLD_LOGPROBS = ("trainer", "sampler")  # lab.train.grpo_packed.OLD_LOGPROBS
TRACE_STYLES = ("compact", "derivation")  # lab.data.dataset.TRACE_STYLES
SEED_MAX = 2**32 - 1  # numpy.random.seed (transformers.set_seed calls it) takes 0 .. 2**32 - 1
RENAMED = {"sft.stages": "sft.phases"}  # old key -> new key: a config that still says the old one is told the new


def renamed_problem(key: str) -> str | None:
    """The one sentence for a key that was renamed (`RENAMED`), else None."""
    new = RENAMED.get(key)
    return None if new is None else f"{key} is now called {new} (a stage is one notebook of a run); write {new}"


def choice_problems(key: str, values: Any, allowed: tuple[str, ...], what: str = "") -> list[str]:
    """`key=value is not [what, ]one of ...` for each of `values` (one value or a list) outside `allowed`."""
    values = [values] if isinstance(values, str) else list(values or [])
    return [f"{key}={v!r} is not {what + ', ' if what else ''}one of {', '.join(allowed)}" for v in values
            if v not in allowed]


BOUNDS = {"ge": (">=", operator.ge), "gt": (">", operator.gt), "le": ("<=", operator.le), "lt": ("<", operator.lt)}


def _help(text: str, default: Any = MISSING, **bounds: float) -> Any:
    """A field whose value comes from conf/ (`MISSING` until then), with its help text and its bounds (ge, gt, le,
    lt, in the order given: the first one broken is reported)."""
    assert set(bounds) <= set(BOUNDS), bounds
    return field(default=default, metadata={"help": text, "bounds": bounds})


def bound_problem(value: Any, bounds: dict) -> str | None:
    """What `value` must be, or None when it is within `bounds`; NaN (a float all the same) is not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return "must be a number"
    return next((f"must be {BOUNDS[op][0]} {b}" for op, b in bounds.items() if not BOUNDS[op][1](value, b)), None)


_SINK: contextvars.ContextVar[list | None] = contextvars.ContextVar("lab_schema_problems", default=None)


def _numbers(name: str, value: Any) -> list[tuple[str, float]]:
    """(key, value) for `value` when it is a float, or for each float in it when it is a dict or list (one level):
    what must be finite."""
    if isinstance(value, float):
        return [(name, value)]
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    return [(f"{name}.{k}", v) for k, v in items if isinstance(v, float)]


class Checked:
    """Base of every config dataclass: `__post_init__` checks each field against its bounds and the class's own
    `rules()`, and raises one LabError naming each key (`sft.grad_accum=0 must be >= 1`); inside `problems(cfg)` it
    adds them to that call's list instead, so one error lists the problems of every group."""

    def __post_init__(self) -> None:
        if any(getattr(self, f.name) == MISSING for f in dataclasses.fields(self)):
            return  # built by OmegaConf.structured to read the fields (docstring, 3.)
        prefix, found = key_of(type(self)), []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if bad := [k for k, v in _numbers(f.name, value) if not math.isfinite(v)]:  # inf or nan: never a setting
                found += [f"{prefix}{k}={v!r} must be a finite number" for k, v in _numbers(f.name, value) if k in bad]
            elif f.metadata.get("bounds") and value is not None and (why := bound_problem(value, f.metadata["bounds"])):
                found.append(f"{prefix}{f.name}={value!r} {why}" + (" (or null)" if "Optional" in str(f.type) else ""))
        found += self.rules()
        if found and (sink := _SINK.get()) is not None:
            sink.extend(found)
        elif found:
            raise LabError("; ".join(found))

    def rules(self) -> list[str]:
        """Problems across this class's fields (its cross-key rules); none by default."""
        return []


def problems(cfg) -> list[str]:
    """Every range and cross-key problem of `cfg` (a config on this schema, resolved or resolvable), in plain
    words: its dataclasses are built with `OmegaConf.to_object`, running every `__post_init__`."""
    token = _SINK.set([])
    try:
        OmegaConf.to_object(cfg)
        return _SINK.get()
    finally:
        _SINK.reset(token)


@functools.cache
def key_of(cls: type) -> str:
    """The dotted prefix of `cls`'s fields in the root config (`sft.lora.` for LoraConfig, `` for Config)."""
    def walk(c, prefix):
        yield c, prefix
        for f in dataclasses.fields(c):
            if dataclasses.is_dataclass(f.default_factory):
                yield from walk(f.default_factory, f"{prefix}{f.name}.")

    return dict(walk(Config, ""))[cls]


@dataclass(frozen=True)
class CompetitionLimits:
    """The competition's scoring settings (its final version): fixed by Kaggle, so their values live here, not in
    conf/. `cfg.competition` in a composed config (read-only); `COMPETITION` below for code without one."""

    temperature: float = _help("scoring sampling temperature (greedy)", 0.0)
    top_p: float = _help("scoring nucleus sampling", 1.0)
    max_tokens: int = _help("completion budget of the scorer's vLLM", 7680)
    max_model_len: int = _help("context length of the scorer's vLLM (prompt + completion)", 8192)
    max_num_seqs: int = _help("the scorer's vLLM concurrent sequences", 64)
    max_lora_rank: int = _help("the largest LoRA rank the scorer's vLLM loads", 32)
    gpu_memory_utilization: float = _help("the scorer's vLLM memory share", 0.85)
    tensor_parallel_size: int = _help("GPUs the scorer's vLLM spans", 1)
    enable_prefix_caching: bool = _help("the scorer's vLLM prefix caching", True)
    enable_chunked_prefill: bool = _help("the scorer's vLLM chunked prefill", True)
    metric_version: str = _help("final: the published metric; legacy: the earlier one (first `}`, binary as "
                                "floats)", "final")


COMPETITION = CompetitionLimits()


def rank_problem(key: str, rank: Any, limits: CompetitionLimits = COMPETITION) -> str | None:
    """Why `rank` (at `key`) is not a LoRA rank the scorer's vLLM loads, or None: a whole number from 1 to
    `limits.max_lora_rank`. vLLM 0.33 refuses an adapter whose largest rank, r or any rank_pattern value, is above
    its max_lora_rank (`PEFTHelper.validate_legal`, vllm/lora/peft_helper.py)."""
    if isinstance(rank, bool) or not isinstance(rank, int):
        return f"{key}={rank!r} must be a whole number"
    if rank < 1:
        return f"{key}={rank!r} must be >= 1"
    if rank > limits.max_lora_rank:
        return (f"{key}={rank!r} must be <= {limits.max_lora_rank} (competition.max_lora_rank: the largest LoRA rank "
                "Kaggle's vLLM loads)")
    return None


@dataclass
class DataConfig(Checked):
    """conf/data: where the puzzles come from and how they are split (01_explore, every stage's data)."""

    source: str = _help("synthetic: generate puzzles with lab.puzzles; competition: read the CSV at `path`")
    path: Optional[str] = _help("competition data: the train.csv to read; null: $LAB_DATA, data/train.csv, or the "
                                "Kaggle input mount, in that order (unused for synthetic data)")
    categories: Optional[List[str]] = _help("categories to keep or generate (see lab.puzzles.CATEGORIES); null: "
                                            "every category")
    n_train: Optional[int] = _help("synthetic: puzzles per category for training; competition: null keeps all rows "
                                   "not held out, else N of them drawn with the seed from every category in "
                                   "proportion (lab.data.dataset.sample_per_category)", ge=1)
    n_val: Optional[int] = _help("synthetic: puzzles per category held out; competition: null keeps every held-out "
                                 "row (val_fraction), else N of them drawn like n_train", ge=1)
    difficulty: Dict[str, Any] = _help("per-category generator options, e.g. {numeral_system: {max_value: 100}} "
                                       "(free-form; unused for competition data)")
    split_dir: str = _help("where train.csv / val.csv and split.json (with content hashes) go")
    explore_max: int = _help("01_explore runs the solvers on at most this many training puzzles", ge=1)
    val_fraction: float = _help("competition data: held-out share, stratified by category (below 1: something is "
                                 "left to train on)", ge=0, lt=1)
    trace_style: str = _help("compact: the rule, then applied; derivation: the search written out, one checked step "
                             "a line (each puzzle category's `derive`, lab/puzzles/<category>.py)")
    tokenizer_path: Optional[str] = _help("a local tokenizer folder (tokenizer.json, tokenizer_config.json) that "
                                          "counts trace tokens; null: the model's")
    weights: Dict[str, float] = _help("per-category oversampling of the SFT examples, e.g. {bit_manipulation: 2} "
                                      "(whole part copies, fraction a seeded sample; 0 drops; unnamed: 1); above 3 "
                                      "is warned about (lab.data.dataset.oversample)")
    synthetic_train: bool = _help("competition data: train on generated puzzles only (n_train per category, "
                                  "difficulty) and hold the whole real file for validation")
    trace_styles: Dict[str, str] = _help("per-category trace style for SFT, e.g. {bit_manipulation: compact}; "
                                         "categories not named use trace_style")
    resplit: bool = _help("competition data: when the data file changed since this run's split was made (split.json "
                          "records its sha256), make the split again instead of refusing (the run's later stages then "
                          "count as out of date); false: a changed file is an error naming the change")

    def rules(self) -> list[str]:
        # category names are checked by lab.data.dataset.category_problems, beside their one list (lab.puzzles)
        return (choice_problems("data.trace_style", self.trace_style, TRACE_STYLES)
                + [p for k, v in (self.trace_styles or {}).items()
                   for p in choice_problems(f"data.trace_styles.{k}", v, TRACE_STYLES)])


@dataclass
class LoraConfig(Checked):
    """conf/sft lora: the adapter SFT trains and GRPO continues (lab/model/lora.py)."""

    r: int = _help("LoRA rank, 1 to competition.max_lora_rank (Kaggle's vLLM loads no more; rank_problem)")
    alpha: int = _help("LoRA scaling numerator (scale = alpha / r)", gt=0)
    dropout: float = _help("LoRA dropout (PEFT's ParamWrapper, the routed experts, supports none: lab.model.lora "
                            "refuses it with the experts family)", ge=0)
    targets: List[str] = _help("module families that get a LoRA (lab/model/lora.py; lm_head trains through "
                               "lab.model.lora)")
    experts_path: ExpertsPath = _help("how the routed experts' LoRA runs: auto (routed unless its calibrated exactness "
                                      "check failed on this card: lab.train.fast_paths), routed (each expert's LoRA on "
                                      "the tokens routed to it, lab.model.experts_lora) or fold (PEFT's own W + B@A "
                                      "stack at every forward: ~1.2 GiB temporaries per MoE layer on the real model, "
                                      "+62% experts FLOPs); the same parameters and saved adapter either way")


@dataclass
class SftConfig(Checked):
    """conf/sft: supervised warm-up (02_sft), a LoRA adapter trained on solver traces with TRL's SFTTrainer."""

    backend: TrainBackend = _help("hf (transformers + PEFT + TRL) or unsloth (GPU only); follows "
                                   "model.train_backend")
    lora: LoraConfig = field(default_factory=LoraConfig, metadata={"help": "the LoRA adapter (r, alpha, dropout, "
                                                                            "targets)"})
    epochs: float = _help("passes over the training traces (used when max_steps is -1)")
    max_steps: int = _help(">0 caps optimiser steps (overrides epochs); -1: train for epochs")
    learning_rate: float = _help("peak learning rate, reached after warmup_ratio of the steps and then following "
                                 "lr_scheduler_type", gt=0)
    warmup_ratio: float = _help("share of steps spent warming up (passed as a float warmup_steps)", ge=0, le=1)
    lr_scheduler_type: str = _help("transformers scheduler name (SchedulerType: linear, cosine, constant, ...; "
                                   "checked when a stage opens, lab.core.config.library_problems)")
    batch_size: int = _help("sequences per device per step", ge=1)
    grad_accum: int = _help("gradient accumulation steps (effective batch = batch_size x grad_accum x GPUs)", ge=1)
    max_seq_len: int = _help("sequence budget; longer examples are counted and dropped, never cut", ge=1)
    packing: bool = _help("pack rows into micro-batches of up to pack_tokens tokens (TRL's best-fit-decreasing "
                          "packing, rows never cut; batch_size then counts packs, grad_accum packs per step), exact: "
                          "each row's Mamba state and attention start at its own first token and the loss is "
                          "token-weighted over the step as unpacked (lab/model/packed_rows.py); the real model "
                          "needs the mamba_ssm and causal_conv1d kernels for it; sft.backend=hf only")
    pack_tokens: Optional[int] = _help("with packing: the tokens of one pack (TRL's max_length), whole rows of up to "
                                       "max_seq_len each; null: max_seq_len. Longer packs spread the per-micro-step "
                                       "fixed cost over more tokens (lab.plan.estimate); their memory is traced at "
                                       "this length (lab.plan.memory)", ge=1)
    packed_attention: PackedAttention = _help("with packing: auto (varlen where torch's varlen_attn and CUDA are here "
                                  "and its calibrated check passed, else mask: lab.train.fast_paths), "
                                  "varlen (each row's attention alone: torch's varlen flash kernel on "
                                  "CUDA, one causal SDPA per row on CPU; no [T x T] mask) or mask (transformers' sdpa "
                                  "with its block-diagonal mask over the whole pack); lab/model/packed_rows.py")
    fused_mamba: Switch = _help("the fused Mamba-2 kernel (mamba_ssm's mamba_split_conv1d_scan_combined, the out_proj "
                                "LoRA applied after it; lab.model.lora): auto (on where mamba_ssm, causal_conv1d and "
                                "CUDA are here and its calibrated check passed: lab.train.fast_paths), on (refused "
                                "where impossible) or off (the unfused mixer: causal_conv1d_fn + the chunk scan)")
    gradient_checkpointing: bool = _help("recompute activations in the backward pass (TRL's SFTConfig default; the "
                                         "real model needs it)")
    weight_decay: float = _help("AdamW weight decay", ge=0)
    logging_steps: int = _help("log the loss every N optimiser steps", ge=1)
    save_steps: int = _help("checkpoint every N optimiser steps (for resume)", ge=1)
    save_total_limit: int = _help("checkpoints kept (each holds the adapter and its AdamW state)")
    resume: bool = _help("continue from the newest complete checkpoint (<run_dir>/checkpoints/02_sft) written with the "
                         "same training settings; other settings start afresh, or are an error when "
                         "sft.resume=true is passed explicitly; false deletes the checkpoints")
    wall_clock_budget_min: float = _help(">0: save and stop cleanly when this many minutes have passed; 0: no budget")
    gradient_check: bool = _help("after the first steps, check every LoRA family got a gradient and moved")
    n_train: Optional[int] = _help("null: all training traces; else the first N (after shuffling)", ge=1)
    adapter_dir: str = _help("where the trained adapter is saved (03_grpo reads it)")
    phases: List[str] = _help("SFT phases in order: [traces] (the solver traces), or [drills, traces]: first recall "
                              "drills of the symbolic signature catalog (lab.puzzles.eqsearch.drills), then the "
                              "traces, continuing the drills' adapter (saved beside adapter_dir as drills_adapter)")
    drill_n: int = _help("drills phase: catalog drill examples (signatures with at most eqsearch.MAX_CANDS candidates)")

    def rules(self) -> list[str]:
        if self.max_steps == -1:
            why = bound_problem(self.epochs, {"gt": 0})
            return [f"sft.epochs={self.epochs!r} {why} (or set sft.max_steps >= 1)"] if why else []
        why = bound_problem(self.max_steps, {"ge": 1})
        return [f"sft.max_steps={self.max_steps!r} {why} (or -1: train for sft.epochs)"] if why else []


@dataclass
class GrpoConfig(Checked):
    """conf/grpo: reinforcement learning (03_grpo) with TRL's GRPOTrainer, from the SFT adapter (lab/train/grpo.py)."""

    init_adapter: str = _help("the SFT adapter to start from")
    adapter_dir: str = _help("where the trained adapter is saved (04_vote reads it)")
    rollout_backend: GenerationBackend = _help(
        "hf: transformers generates from the in-memory adapter (CPU/GPU; the tiny demo's default); vllm: one vLLM "
        "engine samples from the adapter packed as the submission and served through a LoRARequest each round, never "
        "merged weights (lab.train.rollouts; the fast route on one GPU, engine and trainer taking turns with sleep "
        "mode; on CPU vLLM's CPU build); refine=true needs hf")
    steps_per_generation: int = _help(
        "optimiser steps fed by one generation round (TRL's steps_per_generation is this x the micro-steps of one "
        "step); > 1: TRL computes the old log-probabilities and its clipped ratio corrects the later steps' policy lag",
        ge=1)
    num_generations: int = _help("completions per prompt (the group)", ge=1)
    prompts_per_step: int = _help("distinct prompts per optimiser step", ge=1)
    per_device_train_batch_size: Optional[int] = _help(
        "completions per training micro-step (one forward/backward); must divide prompts_per_step x num_generations, "
        "and gradient accumulation makes up the rest so one optimiser step still covers every group "
        "(lab.plan.grpo_policy.micro_batch); null: all of a step's completions in one micro-step")
    max_steps: int = _help("optimiser steps", ge=1)
    learning_rate: float = _help("learning rate (constant schedule, no warmup)", gt=0)
    beta: float = _help("KL coefficient (0: no reference model, no KL term; >0: TRL keeps a frozen copy of the "
                        "start adapter)", ge=0)
    temperature: float = _help("rollout and pass-rate sampling temperature", gt=0)
    top_p: float = _help("rollout nucleus sampling", gt=0, le=1)
    max_completion_length: Optional[int] = _help("null: from the budget (model.max_model_len - longest prompt, <= "
                                                 "infer.max_tokens; refine: half); never TRL's 512")
    mask_truncated_completions: bool = _help("truncated completions get no reward and no loss (TRL's masking; DAPO "
                                             "overlong filtering)")
    gradient_checkpointing: bool = _help("recompute activations in the backward pass (needed for the 30B model; off "
                                         "is faster on the tiny one)")
    rewards: Dict[str, float] = _help("reward name -> weight; names from lab.train.rewards.REWARDS (correctness: 1 if "
                                      "the boxed answer passes the competition metric; format: </think> once, one "
                                      "final non-empty box, nothing after)")
    n_prompts: int = _help("training prompts drawn from the train split (the pool)", ge=1)
    pass_rate_k: int = _help("samples per pool prompt to estimate its pass rate (never re-estimated on resume)",
                              ge=1)
    drop_threshold: float = _help("drop prompts whose pass rate is >= this (already solved)")
    drop_unsolved: bool = _help("also drop prompts no sample solved (pass rate 0: no correctness signal)")
    curriculum: bool = _help("order prompts from high to low pass rate (easy -> hard); false: seeded shuffle")
    curriculum_shape: str = _help("linear: sorted; stepped: buckets shuffled within")
    refine: bool = _help("true: iterative refinement (iGRPO): train on refinements of the best of num_generations "
                         "drafts")
    logging_steps: int = _help("log every N steps", ge=1)
    save_steps: int = _help("checkpoint every N steps", ge=1)
    resume: bool = _help("continue from the newest complete checkpoint (<run_dir>/checkpoints/03_grpo) written with "
                         "the same configuration; another configuration starts afresh, or is an error when "
                         "grpo.resume=true is passed explicitly; false deletes the checkpoints")
    wall_clock_budget_min: float = _help(">0: save and stop cleanly after this many minutes; 0: no budget")
    gradient_check: bool = _help("after training, check every LoRA family got a gradient and moved, frozen weights "
                                 "did not")
    truncation_warn_share: float = _help("warn when more completions than this share are truncated")
    zero_variance_warn_share: float = _help("warn when more groups than this share have zero reward variance")
    vllm_gpu_memory_utilization: Optional[float] = _help(
        "vllm rollouts: GPU share of the rollout engine while it is awake (its weights, adapter slot and cache); with "
        "sleep mode the trainer's frozen weights are in CPU memory meanwhile, so on one card it can take most of it; "
        "null: gpu.max_use of the card less the trainer's LoRA and optimizer states "
        "(lab.plan.grpo_policy.engine_share; `python -m lab memory --stage grpo` prints both phases)", gt=0, le=1)
    vllm_sleep_mode: bool = _help("vllm rollouts on CUDA: engine and trainer take turns on the card (the engine "
                                  "sleeps while the trainer trains; the trainer's frozen weights go to CPU memory "
                                  "while the engine samples); false: both stay resident")
    vllm_sleep_level: Optional[int] = _help("vllm rollouts with sleep mode: 1, the engine keeps its weights in CPU "
                                            "memory while it sleeps (the host holds the weights twice at a switch); "
                                            "2, it discards them and reloads them from the model folder at each "
                                            "wake-up (once); null: 1 when the host's memory allows it "
                                            "(lab.plan.grpo_policy.sleep_level)", ge=1, le=2)

    loss_type: str = _help(f"TRL's GRPO loss ({', '.join(GRPO_LOSS_TYPES)}; dapo is TRL 1.15's default: token losses "
                           "over the step's completion tokens)")
    packing: bool = _help("train a step's completions in packs of pack_tokens (per-row Mamba state and attention, "
                          "lab.train.grpo_packed), each pack's backward before the next pack; false: TRL's padded "
                          "micro-batches of per_device_train_batch_size")
    pack_tokens: int = _help("with packing: tokens of one pack (one forward/backward); >= model.max_model_len, so any "
                             "prompt + completion fits", ge=1)
    old_logprobs: str = _help("trainer: the old policy's log-probs (policy lag, steps_per_generation > 1) from a "
                              "no-grad forward of the trainer; sampler: the rollout's (vllm, after temperature), no "
                              "forward; needs packing and rollout_backend=vllm. The gap is logged either way")
    max_num_seqs: Optional[int] = _help("vllm rollouts: sequences the rollout engine decodes at once (its own, not "
                                        "infer.max_num_seqs, the scorer's); null: infer.max_num_seqs. `python -m lab "
                                        "memory --stage grpo` checks its KV and Mamba state fit the engine's share",
                                        ge=1)

    def rules(self) -> list[str]:
        out = [*choice_problems("grpo.loss_type", self.loss_type, GRPO_LOSS_TYPES),
               *choice_problems("grpo.old_logprobs", self.old_logprobs, OLD_LOGPROBS)]
        if self.old_logprobs == "sampler" and not (self.packing and self.rollout_backend == "vllm"):
            out.append("grpo.old_logprobs=sampler needs grpo.packing=true and grpo.rollout_backend=vllm (the "
                       "sampler's log-probs come from vLLM; the packed loss fills a token vLLM did not score)")
        if self.packing and self.per_device_train_batch_size is not None:
            out.append("grpo.packing=true: the micro-steps are packs of grpo.pack_tokens; set "
                       "grpo.per_device_train_batch_size=null")
        if out:
            return out
        # the names themselves are checked where they are built (lab.train.rewards.build, before any rollout), whose
        # table a test may extend with a reward of its own
        if not self.rewards:
            return [f"grpo.rewards is empty: name at least one reward ({', '.join(REWARD_NAMES)}), e.g. "
                    "grpo.rewards={correctness: 1.0}"]
        return []


@dataclass
class ModelConfig(Checked):
    """conf/model: the base model, built here (tiny) or loaded (nemotron_nano)."""

    name: str = _help("label used in reports")
    path: str = _help("Hub id or local folder; for the tiny model, where it is built and saved (then reused)")
    build_tiny: bool = _help("true: build the tiny model from `architecture` if `path` is empty; false: load `path`")
    trust_remote_code: bool = _help("keep off: the transformers implementation of Nemotron-H is used (the repo's "
                                    "own modeling file is older and ~20x slower to generate)")
    dtype: str = _help("weights dtype (a torch dtype name: float32, bfloat16)")
    device: str = _help("auto: cuda if available, else cpu")
    max_model_len: int = _help("prompt + completion token budget for this model (Kaggle: "
                               "competition.max_model_len)", ge=1)
    generation_backend: GenerationBackend = _help("hf: transformers generate (CPU or GPU); vllm: GPU only")
    train_backend: TrainBackend = _help("hf: transformers + PEFT + TRL; unsloth: GPU only")
    head_init_std: Optional[float] = _help("std of the tiny model's random lm_head (frozen under LoRA); null when "
                                           "the model is loaded, not built")
    architecture: Optional[Dict[str, Any]] = _help("NemotronHConfig fields of the tiny model (free-form); null: "
                                                   "read from the checkpoint's config.json")


@dataclass
class InferConfig(Checked):
    """conf/infer: generation settings of every evaluation; kaggle.yaml points them at the competition's scoring
    settings (`competition`, CompetitionLimits)."""

    temperature: float = _help("sampling temperature (0: greedy)", ge=0)
    top_p: float = _help("nucleus sampling (1: no truncation)", gt=0, le=1)
    max_tokens: int = _help("completion budget; capped further by model.max_model_len - prompt length", ge=1)
    max_model_len: int = _help("vLLM context length", ge=1)
    max_num_seqs: int = _help("vLLM concurrent sequences")
    max_lora_rank: int = _help("the largest LoRA rank the lab's vLLM engines load, 1 to competition.max_lora_rank")
    gpu_memory_utilization: float = _help("vLLM memory share", gt=0, le=1)
    local_gpu_memory_utilization: Optional[float] = _help(
        "vLLM memory share of the lab's own evaluation engines (lab.model.generate.vllm_engine), not a scoring "
        "setting; null: gpu_memory_utilization. On a card where the scorer's share leaves no room for the Mamba state "
        "and KV cache after the weights (an 80 GB H100: docs/real_model.md, step 5) set e.g. 0.95; the "
        "scorer's stays competition.gpu_memory_utilization", gt=0, le=1)
    tensor_parallel_size: int = _help("vLLM tensor parallel size: GPUs one evaluation engine spans (the vllm back-end; "
                                      "e.g. infer.tensor_parallel_size=4 for local evaluation on 4 GPUs); the "
                                      "scorer's is competition.tensor_parallel_size", ge=1)
    enable_prefix_caching: bool = _help("vLLM prefix caching")
    enable_chunked_prefill: bool = _help("vLLM chunked prefill")
    metric_version: str = _help("final: the published metric; legacy: the earlier one (first `}`, binary as floats)")
    batch_size: int = _help("hf back-end: prompts per generate() call", ge=1)

    def rules(self) -> list[str]:
        return choice_problems("infer.metric_version", self.metric_version, METRIC_VERSIONS)


@dataclass
class VoteConfig(Checked):
    """conf/vote: inference-time voting (04_vote): k samples per held-out puzzle, compared with greedy."""

    adapter: Optional[str] = _help("the adapter whose samples are voted on; null: the latest finished training "
                                   "stage's (03_grpo, else 02_sft: lab.recipes.vote.vote_adapter)")
    k: int = _help("samples per puzzle", ge=1)
    temperature: float = _help("sampling temperature (`make bench` scans 0.1 / 0.3 / 0.5, RESULTS.md)", ge=0)
    top_p: float = _help("nucleus sampling", gt=0, le=1)
    logprobs: bool = _help("record token log-probabilities (confidence voting needs them)")
    methods: List[str] = _help("voting methods replayed on the samples (lab.eval.vote.METHODS)")
    live_early_stop: bool = _help("sample early_stop for real in rounds (lab.eval.vote.early_stop_live), besides "
                                  "its replay over the k samples")
    options: Dict[str, Any] = _help("per-method options passed to lab.eval.vote.replay (free-form), e.g. confidence: "
                                    "{keep_top: 0.5}; early_stop: {window: 1, agree: null, stop_prob: 0.9}")

    def rules(self) -> list[str]:
        found = choice_problems("vote.methods", self.methods, VOTE_METHODS)
        found += choice_problems("vote.options (its keys)", list(self.options or {}), VOTE_METHODS)
        for method, opts in (self.options or {}).items():
            if isinstance(opts, dict):
                found += choice_problems(f"vote.options.{method} (its keys)", list(opts), VOTE_OPTIONS)
            else:
                found.append(f"vote.options.{method}={opts!r} must be a mapping of options, e.g. {{keep_top: 0.5}}")
        return found


@dataclass
class KaggleConfig(Checked):
    """conf/kaggle: kernels built by `python -m lab kaggle build` (lab/kaggle/kernel.py); the command-line flags
    --competition / --model-source / --machine-shape override these."""

    competition: Optional[str] = _help("the competition whose data is attached (/kaggle/input/<slug>); null or '': "
                                       "none")
    model_source: Optional[str] = _help("the base model as a Kaggle Models handle owner/model/framework/instance/"
                                        "version (model_sources of the kernel); null or '': attach no model")
    machine_shape: Optional[str] = _help("the accelerator of a GPU kernel (kernel-metadata.json machine_shape, as "
                                         "`kaggle kernels push --accelerator`); null or '': Kaggle's default")
    python_version: str = _help("the Python (major.minor) of Kaggle's image: the dependency wheels are fetched for it "
                                "(`kaggle dataset --fetch-wheels`), scripts/build_mamba_wheels.sh builds for it, and a "
                                "built kernel's install cell stops when the image runs another")
    scratch_dir: Optional[str] = _help("on Kaggle, where training checkpoints go for a run inside /kaggle/working "
                                       "(disk Kaggle does not keep, outside the output limit; lab.core.paths."
                                       "checkpoint_root); null or '': <run_dir>/checkpoints")
    output_limit_gb: float = _help("what Kaggle keeps of a kernel's /kaggle/working, in GB (10^9 bytes): a stage on "
                                   "Kaggle prints its planned output against it and refuses a plan over it "
                                   "(lab.plan.output_plan; `python -m lab kaggle plan`)", gt=0)
    run_limit_h: float = _help("the longest a Kaggle kernel runs, in hours: on Kaggle a training stage's "
                               "wall-clock budget (sft/grpo.wall_clock_budget_min: 0) defaults to this minus "
                               "budget_margin_min minus the time since the kernel started", gt=0)
    adapter_dtype: Optional[str] = _help("on Kaggle, the dtype 02_sft and 03_grpo save their adapter in (bfloat16: "
                                         "what the zip holds and vLLM computes in, half the bytes of fp32 in the "
                                         "kept 20 GB; the checkpoints keep fp32); null or '': as trained (fp32)")
    budget_margin_min: float = _help("minutes kept free at the end of a Kaggle run for what follows training: saving "
                                     "the adapter and the resumable state, the held-out evaluation, the zip", ge=0)


@dataclass
class GpuConfig(Checked):
    """conf/gpu: the card training runs on, and the levers that make one training step fit it (lab.plan.memory traces
    the step; docs/memory.md)."""

    name: str = _help("label of the card (none: no card configured; the CPU demo)")
    memory_gib: Optional[float] = _help("the card's memory in GiB (torch.cuda.get_device_properties().total_memory "
                                        "/ 2**30); null: this machine's first CUDA device, if any")
    max_use: float = _help("02_sft/03_grpo refuse to start when the traced peak of one training micro-step exceeds "
                           "this share of memory_gib (the rest: CUDA context, allocator, fragmentation)")
    check: bool = _help("true: refuse to start when the trace does not fit; false: print the trace and go on anyway")
    optim: Optional[str] = _help("transformers optimizer name for SFT and GRPO (adamw_torch_fused, adamw_bnb_8bit: "
                                 "8-bit AdamW states, needs bitsandbytes); null: transformers' default")
    experts_rank: Optional[int] = _help("LoRA rank of the routed experts (PEFT rank_pattern, alpha scaled to keep "
                                        "alpha/r; lab.model.submission.pack keeps it for vLLM), 1 to sft.lora.r; null: "
                                        "sft.lora.r", ge=1)


@dataclass
class Config(Checked):
    """The root config (conf/config.yaml) and its groups. `experiment=competition` is a group choice, not a key: its
    file (`# @package _global_`) sets keys of the root and the groups."""

    data: DataConfig = field(default_factory=DataConfig, metadata={"help": "conf/data: the puzzles and the split"})
    sft: SftConfig = field(default_factory=SftConfig, metadata={"help": "conf/sft: supervised warm-up (02_sft)"})
    grpo: GrpoConfig = field(default_factory=GrpoConfig, metadata={"help": "conf/grpo: GRPO (03_grpo)"})
    model: ModelConfig = field(default_factory=ModelConfig, metadata={"help": "conf/model: the base model"})
    infer: InferConfig = field(default_factory=InferConfig, metadata={"help": "conf/infer: evaluation settings"})
    vote: VoteConfig = field(default_factory=VoteConfig, metadata={"help": "conf/vote: voting (04_vote)"})
    kaggle: KaggleConfig = field(default_factory=KaggleConfig, metadata={"help": "conf/kaggle: Kaggle kernels"})
    competition: CompetitionLimits = field(default_factory=CompetitionLimits, metadata={
        "help": "the competition's scoring settings and limits (fixed: lab/core/schema.py, read-only)"})
    gpu: GpuConfig = field(default_factory=GpuConfig, metadata={"help": "conf/gpu: the training card and its "
                                                                        "memory levers"})
    seed: int = _help("seeds Python, NumPy, torch, the data split and all sampling (numpy.random.seed's range)", ge=0,
                      le=SEED_MAX)
    run_name: str = _help("name of this run, its folder under outputs/: a new time-stamped one unless set "
                          "(`make demo` sets demo)")
    run_dir: str = _help("every stage writes into <run_dir>/<stage>/ (relative to the repo root)")
    overwrite: bool = _help("let a stage write where it would otherwise refuse (lab.core.owner): a folder without the "
                            "lab's run marker becomes this run's folder, and a path of the config (an adapter_dir, "
                            "the split_dir) that already exists outside this run is replaced", default=False)
    report_to: Tracker = _help("live training curves of 02_sft / 03_grpo: none, tensorboard "
                               "(<run_dir>/tensorboard), wandb or mlflow (TRL's integrations)")

    def rules(self) -> list[str]:
        p = [rank_problem("sft.lora.r", self.sft.lora.r, self.competition),
             rank_problem("infer.max_lora_rank", self.infer.max_lora_rank, self.competition),
             run_name_problem(self.run_name)]
        er = self.gpu.experts_rank
        if er is not None and er > self.sft.lora.r:
            p.append(f"gpu.experts_rank={er} must be <= sft.lora.r={self.sft.lora.r} (or null)")
        return [x for x in p if x]


def run_name_problem(name: Any) -> str | None:
    """Why `run_name` cannot name a run folder, or None: it must be a relative path that stays strictly inside
    outputs/ (`run_dir` defaults to outputs/<run_name>), so `../x`, `/tmp/x`, `a/../..`, `.` and an empty or blank
    name are refused. Any other text, non-ASCII included, is a folder name (a non-ASCII value must be quoted
    on the command line: `lab.core.config.compose` says how)."""
    text = "" if name is None else str(name)
    if not text.strip():
        return (f"run_name={text!r} is empty: the stage folders would land in outputs/ itself; "
                "give the run a name, e.g. run_name=my_run")
    norm = os.path.normpath(os.path.join("outputs", text))
    if os.path.isabs(text) or norm == "outputs" or not norm.startswith("outputs" + os.sep):
        return (f"run_name={text!r} leaves outputs/ (the run would write to {resolve_path(norm)}): a run name is a "
                "folder inside outputs/, e.g. run_name=my_run; to write elsewhere set run_dir=PATH")
    return None


GROUPS = {"data": DataConfig, "sft": SftConfig, "grpo": GrpoConfig, "model": ModelConfig, "infer": InferConfig,
          "vote": VoteConfig, "kaggle": KaggleConfig, "gpu": GpuConfig, "competition": CompetitionLimits}


def register() -> None:
    """Store `Config` in Hydra's ConfigStore as `schema` (conf/config.yaml's first default). Calling it again is
    harmless: the entry is replaced."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="schema", node=Config)


def help_lines(cls: type = Config, prefix: str = "") -> list[str]:
    """`key (type): help [bounds]` for every field of `cls`, nested dataclasses expanded (`sft.lora.r`); an Enum's
    type is its names (`hf | vllm`)."""
    out, hints = [], typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key, tp = f"{prefix}{f.name}", hints[f.name]
        if dataclasses.is_dataclass(f.default_factory):  # a nested group (sft.lora)
            out += help_lines(f.default_factory, f"{key}.")
            continue
        kind = " | ".join(tp.__members__) if isinstance(tp, type) and issubclass(tp, StrEnum) else f.type
        bounds = ", ".join(f"{BOUNDS[op][0]} {b}" for op, b in f.metadata.get("bounds", {}).items())
        out.append(f"{key} ({kind}): {f.metadata['help']}" + (f" [{bounds}]" if bounds else ""))
    return out


def main(argv: list[str] | None = None) -> int:
    """`python -m lab schema [GROUP]`: every key's type, help and range (one group's with GROUP)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m lab schema", description="every config key's type, help text and "
                                 "allowed range, as the composed config checks them")
    ap.add_argument("group", nargs="?", help=f"one group only: {' | '.join(GROUPS)}")
    group = ap.parse_args(list(argv or [])).group
    if group is not None and group not in GROUPS:
        raise LabError(f"no config group {group!r}; usage: python -m lab schema [{' | '.join(GROUPS)}]")
    print("\n".join(help_lines(GROUPS[group], f"{group}.") if group else help_lines()))
    return 0
