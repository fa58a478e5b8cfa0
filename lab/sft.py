"""The SFT warm-up: a LoRA adapter on solver traces, with TRL's SFTTrainer over PEFT.

What it guarantees, because each of these silently cost teams days (each has a test in
tests/test_sft.py on the tiny model):
- every configured LoRA target family must match something in the model, or it is an error
  that names the target and lists the families that do exist; the rank is at most 32 (Kaggle's
  vLLM `max_lora_rank`); after wrapping, every configured family must own trainable LoRA
  parameters, or it is an error. The table of
  what received a LoRA (family, count, trainable parameters) is printed and saved before training;
- the gradient check: at the first optimiser step every family is checked for a non-zero
  gradient, after training for LoRA weights that moved (every tensor of every family), and a
  sample of frozen base tensors (one per distinct layer-agnostic name: embeddings, lm_head,
  router, conv1d, the wrapped base weights, the fused experts...) for having NOT moved;
- the SFT data: prompt = the chat template's generation prompt for the exact Kaggle user
  message (ends with `<think>\\n`), completion = solver trace + eos; the loss mask starts where
  the tokenised prompt ends (TRL tokenises prompt and prompt+completion separately);
- examples longer than the sequence budget are counted and dropped, never cut;
- resume: with `sft.resume=true` a run continues from its newest checkpoint (optimizer,
  scheduler, RNG and data position restored by the Trainer) and reaches the same adapter as an
  uninterrupted run; with `sft.resume=false` old checkpoints are deleted first, so a later
  resume cannot pick up a stale run. `sft.wall_clock_budget_min` saves a checkpoint and stops
  cleanly once the budget is spent (checked after every optimiser step).

Module families of Nemotron-H (same names in the tiny model and the real one):
attention `q_proj/k_proj/v_proj/o_proj`, Mamba `in_proj/out_proj`, shared expert
`shared_experts.up_proj/down_proj`, routed experts `experts` (fused 3-D parameters
`experts.up_proj/down_proj`, targeted with PEFT's `target_parameters`; PEFT nests one
ParamWrapper in the other and saves them as `experts.base_layer.lora_*` = up_proj and
`experts.lora_*` = down_proj; `lab.submission` converts them for vLLM), and `lm_head`. TRL 1.15's
SFTTrainer refuses an `lm_head` LoRA because its fused head computes log-probabilities from
`lm_head.weight` directly; `lab.lora` lets the trainer accept it and makes the fused head apply it
(chunked, the full logits never built), so it trains (tests/test_lora.py).

`out_proj`: PEFT 0.21 refuses it for Nemotron-H because, in training mode,
`NemotronHMamba2Mixer.forward` first calls the module-level function
`mamba2_split_conv1d_scan_combined(..., outproj_weight=self.out_proj.weight, ...)` and returns
its result when it is not None. With `mamba_ssm` installed that is the fused CUDA kernel, which
multiplies by `out_proj.weight` itself: a LoRA on `out_proj` would get no gradient. Without it
(CPU), the decorated fallback returns None and the PyTorch path calls `self.out_proj(...)`.
The lab offers `out_proj` anyway (teams reported it as their largest single gain, and vLLM
applies it at scoring): it lifts PEFT's refusal for `out_proj` only (never `conv1d`), and
`guard_fused_mamba_out_proj` replaces that module-level function in
`transformers.models.nemotron_h.modeling_nemotron_h` by a wrapper that returns None (so the
PyTorch path runs, with the conv and scan kernels still used) while a mixer whose `out_proj`
carries a LoRA is running, and calls the original otherwise. The "which mixer is running" signal
is a context variable set by forward hooks on each mixer, so it survives deepcopy, gradient
checkpointing recomputation and device moves. The gradient check proves `out_proj` trains.
Not covered: the `trust_remote_code` modeling file (refused with a clear error when an
`out_proj` LoRA meets a mixer class without that module-level function) and hub kernels that
replace the mixer's whole forward (`use_kernels=True`, not used by the lab).

Deliberately simple: one adapter, one dataset, no packing; the gradient check compares a
strided sample of each tensor (at most 65,536 values; the whole tensor on the tiny model), not
every value of the big ones, so it stays cheap on the 30B model.
"""

from __future__ import annotations

import contextvars
import re
import shutil
import sys
import time
from pathlib import Path

import pandas as pd
from omegaconf import DictConfig

from lab.config import LabError, atomic_write_csv, resolve_path
from lab.data import trace_style
from lab.prompts import chat_prompt

MAX_RANK = 32

# family name -> (kind, suffix) : kind "module" matches nn.Linear names ending in suffix,
# kind "param" matches fused parameters (PEFT target_parameters) ending in suffix.
FAMILIES = {
    "q_proj": [("module", "q_proj")],
    "k_proj": [("module", "k_proj")],
    "v_proj": [("module", "v_proj")],
    "o_proj": [("module", "o_proj")],
    "in_proj": [("module", "in_proj")],
    "out_proj": [("module", "out_proj")],
    "shared_experts.up_proj": [("module", "shared_experts.up_proj")],
    "shared_experts.down_proj": [("module", "shared_experts.down_proj")],
    "experts": [("param", "mixer.experts.up_proj"), ("param", "mixer.experts.down_proj")],
    "lm_head": [("module", "lm_head")],
}

def _base(model):
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def available_families(model) -> dict[str, int]:
    """Family -> number of matching modules/parameters in `model` (families with 0 are absent)."""
    import torch.nn as nn

    base = _base(model)
    linear = [n for n, m in base.named_modules() if isinstance(m, nn.Linear)]
    params = [n for n, _ in base.named_parameters()]
    counts = {}
    for fam, rules in FAMILIES.items():
        c = 0
        for kind, suffix in rules:
            names = linear if kind == "module" else params
            c += sum(1 for n in names if n == suffix or n.endswith("." + suffix))
        counts[fam] = c
    return counts


def _existing(avail: dict[str, int]) -> str:
    return ", ".join(f"{f} ({c})" for f, c in sorted(avail.items()) if c)


def check_targets(cfg: DictConfig) -> list[str]:
    """Validate `sft.lora` without a model: rank, dropout with experts. Returns the targets."""
    lc = cfg.sft.lora
    r = int(lc.r)
    if not 1 <= r <= MAX_RANK:
        raise LabError(f"conf/sft: lora.r={r} is not allowed: Kaggle's vLLM loads LoRA rank <= {MAX_RANK} "
                       f"(max_lora_rank={MAX_RANK}); use 1..{MAX_RANK}")
    targets = [str(t) for t in lc.targets]
    if not targets:
        raise LabError("conf/sft: lora.targets is empty")
    if "experts" in targets and float(lc.dropout) > 0:
        raise LabError(f"conf/sft: lora.dropout={lc.dropout} with the 'experts' family: PEFT's ParamWrapper (fused "
                       "expert parameters) does not support dropout; set sft.lora.dropout=0")
    return targets


def lora_config(cfg: DictConfig, model):
    """A PEFT LoraConfig for the configured families; unknown or unmatched families are errors."""
    from peft import LoraConfig

    lc = cfg.sft.lora
    targets = check_targets(cfg)
    avail = available_families(model)
    model_type = getattr(getattr(_base(model), "config", None), "model_type", "?")
    modules, params = [], []
    for fam in targets:
        if fam not in FAMILIES or avail[fam] == 0:
            raise LabError(f"conf/sft: LoRA target '{fam}': no such module exists in this model ({model_type}); "
                           f"the module families that exist are: {_existing(avail)}")
        for kind, suffix in FAMILIES[fam]:
            (modules if kind == "module" else params).append(suffix)
    return LoraConfig(r=int(lc.r), lora_alpha=int(lc.alpha), lora_dropout=float(lc.dropout),
                      target_modules=modules or None, target_parameters=params or None, bias="none",
                      task_type="CAUSAL_LM")


class _allow_out_proj:
    """Lift PEFT's Mamba refusal for `out_proj` only (see the module docstring); `conv1d` stays refused."""

    def __enter__(self):
        import peft.tuners.tuners_utils as tu

        self._tu, self._original = tu, tu._check_lora_target_modules_mamba
        original = self._original

        def check(peft_config, model, target_name):
            if target_name != "out_proj":
                original(peft_config, model, target_name)

        tu._check_lora_target_modules_mamba = check
        return self

    def __exit__(self, *exc):
        self._tu._check_lora_target_modules_mamba = self._original
        return False


# ---- the fused Mamba kernel guard ------------------------------------------------------------

FUSED_FN = "mamba2_split_conv1d_scan_combined"
_TORCH_PATH = contextvars.ContextVar("lab_mamba_out_proj_lora", default=False)


class _FusedScanGuard:
    """Stands in for `mamba2_split_conv1d_scan_combined` in the mixer's module.

    Returns None (the mixer's documented "no kernel, use the PyTorch path" answer) while a mixer
    whose `out_proj` has a LoRA is running; otherwise calls the function it replaced.
    """

    _lab_guard = True

    def __init__(self, inner):
        self.inner = inner
        self.__wrapped__ = inner

    def __call__(self, *args, **kwargs):
        if _TORCH_PATH.get():
            return None
        return self.inner(*args, **kwargs)


def _has_lora(module) -> bool:
    return hasattr(module, "lora_A") and len(getattr(module, "lora_A", {})) > 0


def _mixer_pre_hook(module, args):
    _TORCH_PATH.set(_has_lora(module.out_proj))


def _mixer_post_hook(module, args, output):
    _TORCH_PATH.set(False)


def guard_fused_mamba_out_proj(model) -> int:
    """Make every Mamba-2 mixer whose `out_proj` has a LoRA take the PyTorch path in training.

    Installs `_FusedScanGuard` in the mixer class's module (once) and forward hooks on each mixer
    (once per mixer). Returns the number of mixers whose out_proj currently has a LoRA.
    """
    n = 0
    for _, mod in _base(model).named_modules():
        if not (type(mod).__name__.endswith("Mamba2Mixer") and hasattr(mod, "out_proj")):
            continue
        has = _has_lora(mod.out_proj)
        n += has
        if getattr(mod, "_lab_out_proj_hooks", False):
            continue
        module = sys.modules[type(mod).__module__]
        fn = getattr(module, FUSED_FN, None)
        if fn is None:
            if has:
                raise LabError(f"{type(mod).__module__}.{type(mod).__name__} has no module-level {FUSED_FN}, so "
                               "lab.sft cannot keep its fused Mamba kernel from bypassing the out_proj LoRA; use "
                               "transformers' own Nemotron-H (model.trust_remote_code=false) or drop out_proj")
            continue
        if not getattr(fn, "_lab_guard", False):
            setattr(module, FUSED_FN, _FusedScanGuard(fn))
        mod.register_forward_pre_hook(_mixer_pre_hook)
        mod.register_forward_hook(_mixer_post_hook, always_call=True)
        mod._lab_out_proj_hooks = True
    return n


# ---- target table ------------------------------------------------------------------------------

def family_of(param_name: str) -> str | None:
    """The family a LoRA parameter belongs to, from its name."""
    if "lora_" not in param_name:
        return None
    if ".experts." in param_name and "shared_experts" not in param_name:
        return "experts"
    for fam in ("shared_experts.up_proj", "shared_experts.down_proj"):
        if fam in param_name:
            return fam
    for fam in ("q_proj", "k_proj", "v_proj", "o_proj", "in_proj", "out_proj", "lm_head"):
        if f".{fam}." in param_name:
            return fam
    return "other"


def target_table(model) -> pd.DataFrame:
    """Family, number of LoRA-wrapped modules/parameters, trainable parameters."""
    rows: dict[str, dict] = {}
    for name, p in model.named_parameters():
        fam = family_of(name)
        if fam is None or not p.requires_grad:
            continue
        r = rows.setdefault(fam, {"family": fam, "tensors": 0, "trainable_params": 0})
        r["tensors"] += 1
        r["trainable_params"] += p.numel()
    df = pd.DataFrame(list(rows.values()), columns=["family", "tensors", "trainable_params"])
    df["modules"] = df["tensors"] // 2  # one lora_A and one lora_B per wrapped module or parameter
    return df[["family", "modules", "trainable_params"]].sort_values("family").reset_index(drop=True)


def check_table(cfg: DictConfig, table: pd.DataFrame, backend: str = "hf") -> None:
    """Every configured family must own trainable LoRA parameters after wrapping; else a loud error."""
    have = dict(zip(table["family"], table["trainable_params"]))
    missing = [f for f in (str(t) for t in cfg.sft.lora.targets) if not have.get(f)]
    if missing:
        raise LabError(f"LoRA families configured but without trainable LoRA parameters after wrapping ({backend}): "
                       f"{', '.join(missing)}; what did get a LoRA:\n{table.to_string(index=False)}")


def attach_lora(cfg: DictConfig, model):
    """Wrap `model` with the configured LoRA; returns (peft_model, target table)."""
    from peft import get_peft_model

    config = lora_config(cfg, model)
    with _allow_out_proj():
        pm = get_peft_model(model, config)
    guard_fused_mamba_out_proj(pm)
    table = target_table(pm)
    check_table(cfg, table)
    return pm, table


# ---- data -------------------------------------------------------------------------------------

def sft_examples(tokenizer, puzzles: pd.DataFrame, max_seq_len: int,
                 style: str = "compact") -> tuple[pd.DataFrame, dict]:
    """Prompt/completion pairs from solver traces whose answer the competition metric accepts.

    prompt = the exact Kaggle prompt rendered by the chat template (ends with `<think>\\n`);
    completion = the solver trace in `style` (`data.trace_style`; reasoning, `</think>`, `\\boxed{answer}`) + end-of-turn token.
    Returns the examples and counts of what was kept, not solved, wrong, or too long. Cipher
    puzzles share the vocabulary of all the frame's cipher examples, as in `solve_frame`.
    """
    from lab.metric import verify
    from lab.puzzles import solve
    from lab.puzzles.cipher import vocabulary

    vocab = vocabulary(puzzles["prompt"])
    rows, counts = [], {"puzzles": len(puzzles), "kept": 0, "unsolved": 0, "solver_wrong": 0, "overlong": 0}
    for _, row in puzzles.iterrows():
        sol = solve(row["prompt"], vocab, style=style)
        if sol.status != "solved":
            counts["unsolved"] += 1
            continue
        if "answer" in row and not verify(str(row["answer"]), sol.answer):
            counts["solver_wrong"] += 1
            continue
        prompt = chat_prompt(tokenizer, row["prompt"])
        completion = sol.trace + tokenizer.eos_token
        n_tok = len(tokenizer(prompt + completion, add_special_tokens=False)["input_ids"])
        if n_tok > max_seq_len:
            counts["overlong"] += 1
            continue
        rows.append({"id": row["id"], "category": row.get("category", ""), "prompt": prompt,
                     "completion": completion, "tokens": n_tok})
        counts["kept"] += 1
    return pd.DataFrame(rows, columns=["id", "category", "prompt", "completion", "tokens"]), counts


# ---- gradient check ---------------------------------------------------------------------------

_SAMPLE = 65536


def _sample(t):
    flat = t.detach().reshape(-1)
    step = max(1, flat.numel() // _SAMPLE)
    return flat[::step][:_SAMPLE].float().clone()


class GradientCheck:
    """Per LoRA family: gradient norm at the first optimiser step, and whether every tensor moved;
    plus a sample of frozen base tensors (one per layer-agnostic name) that must NOT move."""

    def __init__(self, model):
        self.model = model
        self.before = {n: _sample(p) for n, p in model.named_parameters() if p.requires_grad}
        self.frozen: dict[str, object] = {}
        seen = set()
        for n, p in model.named_parameters():
            key = re.sub(r"\.\d+\.", ".N.", n)
            if p.requires_grad or key in seen or p.numel() == 0:
                continue
            seen.add(key)
            self.frozen[n] = _sample(p)
        self.grad_norm: dict[str, float] = {}

    def record_grads(self):
        if self.grad_norm:
            return
        for n, p in self.model.named_parameters():
            if p.requires_grad:
                fam = family_of(n) or "other"
                g = 0.0 if p.grad is None else float(p.grad.detach().float().norm())
                self.grad_norm[fam] = self.grad_norm.get(fam, 0.0) + g

    def report(self) -> pd.DataFrame:
        moved: dict[str, float] = {}
        still: dict[str, int] = {}
        tensors: dict[str, int] = {}
        for n, p in self.model.named_parameters():
            if n in self.before:
                fam = family_of(n) or "other"
                d = float((_sample(p) - self.before[n]).abs().sum())
                moved[fam] = moved.get(fam, 0.0) + d
                tensors[fam] = tensors.get(fam, 0) + 1
                still[fam] = still.get(fam, 0) + (d == 0.0)
        fams = sorted(set(moved) | set(self.grad_norm))
        df = pd.DataFrame({"family": fams, "grad_norm_step1": [self.grad_norm.get(f, 0.0) for f in fams],
                           "weight_change": [moved.get(f, 0.0) for f in fams],
                           "tensors": [tensors.get(f, 0) for f in fams],
                           "tensors_unchanged": [still.get(f, 0) for f in fams]})
        df["ok"] = (df["grad_norm_step1"] > 0) & (df["weight_change"] > 0) & (df["tensors_unchanged"] == 0)
        return df

    def frozen_report(self) -> pd.DataFrame:
        params = dict(self.model.named_parameters())
        rows = []
        for n, s in self.frozen.items():
            change = float((_sample(params[n]) - s).abs().max()) if n in params else float("nan")
            rows.append({"tensor": n, "max_abs_change": change, "unchanged": change == 0.0})
        return pd.DataFrame(rows, columns=["tensor", "max_abs_change", "unchanged"])


# ---- trainer ------------------------------------------------------------------------------------

def _callbacks(check: GradientCheck | None, budget_min: float):
    from transformers import TrainerCallback

    class LabCallback(TrainerCallback):
        """Gradient snapshot at the first optimiser step; wall-clock budget: save and stop."""

        def __init__(self):
            self.t0 = time.time()
            self.stopped_by_budget = False

        def on_train_begin(self, args, state, control, **kw):
            self.t0 = time.time()

        def on_pre_optimizer_step(self, args, state, control, **kw):
            if check is not None:
                check.record_grads()

        def on_step_end(self, args, state, control, **kw):
            if budget_min and (time.time() - self.t0) / 60 >= budget_min and state.global_step < state.max_steps:
                print(f"wall-clock budget of {budget_min} min reached at step {state.global_step}: saving and stopping")
                control.should_save = True
                control.should_training_stop = True
                self.stopped_by_budget = True
            return control

    return [LabCallback()]


def training_args(cfg: DictConfig, output_dir: Path, **extra):
    """SFTConfig from `conf/sft`; every value from the config, none from library defaults that matter."""
    import torch
    from trl import SFTConfig

    from lab.config import tracking_args

    s = cfg.sft
    return SFTConfig(
        output_dir=str(output_dir), num_train_epochs=float(s.epochs), max_steps=int(s.max_steps),
        learning_rate=float(s.learning_rate), warmup_steps=float(s.warmup_ratio),
        lr_scheduler_type=str(s.lr_scheduler_type), per_device_train_batch_size=int(s.batch_size),
        gradient_accumulation_steps=int(s.grad_accum), weight_decay=float(s.weight_decay),
        logging_steps=int(s.logging_steps), save_steps=int(s.save_steps), save_total_limit=int(s.save_total_limit),
        max_length=int(s.max_seq_len), completion_only_loss=True, packing=False, seed=int(cfg.seed),
        data_seed=int(cfg.seed), **tracking_args(cfg, "02_sft"), use_cpu=not torch.cuda.is_available(),
        bf16=str(cfg.model.dtype) == "bfloat16" and torch.cuda.is_available(), dataloader_num_workers=0,
        disable_tqdm=False, save_only_model=False, gradient_checkpointing=bool(s.gradient_checkpointing), **extra)


def build_trainer(cfg: DictConfig, output_dir: Path, peft_model, tokenizer, examples: pd.DataFrame, callbacks=()):
    """The SFTTrainer `train` uses (exposed so tests can inspect its tokenised dataset)."""
    from datasets import Dataset
    from trl import SFTTrainer

    from lab.lora import install_fused_lora_head, trainer_accepts_head_lora
    from lab.trl_cpu import use_text_progress

    with trainer_accepts_head_lora(peft_model):  # an lm_head LoRA: see lab.lora
        trainer = SFTTrainer(model=peft_model, args=training_args(cfg, output_dir), processing_class=tokenizer,
                             train_dataset=Dataset.from_pandas(examples[["prompt", "completion"]],
                                                               preserve_index=False),
                             callbacks=list(callbacks))
    install_fused_lora_head(peft_model)  # SFTTrainer's fused head: temperature 1, log_probs/entropy/is_top1
    use_text_progress(trainer)
    return trainer


def load_model(cfg: DictConfig):
    """(model, tokenizer) that SFT trains: Unsloth's own loader with `sft.backend=unsloth` (lab.sft_unsloth, which
    imports unsloth before transformers/TRL/PEFT), else `lab.models.load`."""
    from lab import models

    if str(cfg.sft.backend) == "unsloth":
        from lab import sft_unsloth

        return sft_unsloth.load(cfg)
    return models.load(cfg)


def train(cfg: DictConfig, stage, train_puzzles: pd.DataFrame, model=None, tokenizer=None):
    """Train the SFT adapter into `cfg.sft.adapter_dir`.

    Returns (metrics, peft_model, tokenizer, log_df): metrics has the example counts, loss, steps,
    the target table, the gradient check and whether the wall-clock budget stopped the run.
    """
    from transformers.trainer_utils import get_last_checkpoint

    from lab import trl_cpu

    backend = str(cfg.sft.backend)
    if backend not in ("hf", "unsloth"):
        raise LabError(f"conf/sft: backend={backend!r} is not one of hf, unsloth")
    check_targets(cfg)
    attach = attach_lora
    if backend == "unsloth":
        from lab import sft_unsloth

        sft_unsloth.check_targets(cfg)  # before loading 30B weights
        attach = sft_unsloth.attach_lora
    if model is None:
        model, tokenizer = load_model(cfg)
    trl_cpu.install()
    examples, counts = sft_examples(tokenizer, train_puzzles, int(cfg.sft.max_seq_len), trace_style(cfg))
    if cfg.sft.n_train:
        examples = examples.sample(frac=1.0, random_state=int(cfg.seed)).head(int(cfg.sft.n_train))
    if examples.empty:
        raise LabError(f"{stage.dir}: no SFT examples left ({counts})")
    print(f"SFT examples: {counts}")
    atomic_write_csv(stage.path("sft_examples.csv"), examples[["id", "category", "tokens"]])

    pm, table = attach(cfg, model)
    print("LoRA targets:\n" + table.to_string(index=False))
    atomic_write_csv(stage.path("lora_targets.csv"), table)

    check = GradientCheck(pm) if cfg.sft.gradient_check else None
    out = stage.path("checkpoints")
    if not cfg.sft.resume and out.exists():
        shutil.rmtree(out)  # a fresh run: stale checkpoints must not be resumed later
    callbacks = _callbacks(check, float(cfg.sft.wall_clock_budget_min))
    trainer = build_trainer(cfg, out, pm, tokenizer, examples, callbacks)
    last = get_last_checkpoint(str(out)) if cfg.sft.resume and out.is_dir() else None
    if last:
        print(f"resuming from {last}")
    result = trainer.train(resume_from_checkpoint=last)
    adapter_dir = resolve_path(str(cfg.sft.adapter_dir))
    save_adapter(pm, adapter_dir)
    log = pd.DataFrame([h for h in trainer.state.log_history if "loss" in h])
    atomic_write_csv(stage.path("train_log.csv"), log)
    metrics = {"examples": counts, "train_loss": float(result.training_loss), "steps": int(trainer.state.global_step),
               "max_steps": int(trainer.state.max_steps), "resumed_from": last,
               "stopped_by_budget": bool(callbacks[0].stopped_by_budget), "backend": backend,
               "trainable_params": int(table["trainable_params"].sum()),
               "lora_targets": dict(zip(table["family"], table["modules"].astype(int)))}
    if check is not None:
        rep, frozen = check.report(), check.frozen_report()
        atomic_write_csv(stage.path("gradient_check.csv"), rep)
        atomic_write_csv(stage.path("frozen_check.csv"), frozen)
        bad = rep.loc[~rep["ok"], "family"].tolist() + [f"frozen:{t}" for t in frozen.loc[~frozen["unchanged"], "tensor"]]
        if bad:
            print(f"WARNING: gradient check failed for: {', '.join(bad)} (see gradient_check.csv, frozen_check.csv)")
        metrics["gradient_check_failed"] = bad
    return metrics, pm, tokenizer, log


def save_adapter(model, adapter_dir: Path) -> Path:
    """Save only the LoRA weights (never full embedding/lm_head copies), atomically (temp folder + rename).

    Under several processes (`accelerate launch`, torchrun) only the main process writes, after the
    LoRA weights are gathered when DeepSpeed ZeRO-3 shards them; every process waits for the write.
    """
    import contextlib

    import torch.distributed as dist
    from transformers.integrations import is_deepspeed_zero3_enabled

    from lab.config import atomic_dir

    adapter_dir = Path(adapter_dir)
    distributed = dist.is_available() and dist.is_initialized()
    gather = contextlib.nullcontext()
    if is_deepspeed_zero3_enabled():
        import deepspeed

        gather = deepspeed.zero.GatheredParameters([p for n, p in model.named_parameters() if "lora_" in n],
                                                   modifier_rank=None)
    with gather:
        if not distributed or dist.get_rank() == 0:
            with atomic_dir(adapter_dir) as tmp:
                model.save_pretrained(str(tmp), save_embedding_layers=False)
    if distributed:
        dist.barrier()
    return adapter_dir
