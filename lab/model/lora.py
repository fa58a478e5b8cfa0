"""LoRA for Nemotron-H: the family table, attaching the adapter, the guards that make every family really train, the
gradient check, saving. Every module that names LoRA families reads `TABLE` (lab.train.sft, sft_unsloth, grpo,
lab.model.models, lab.plan.memory, lab.model.submission): "support a new model" starts here.

- Every configured family must match a module and, once wrapped, own trainable LoRA parameters (`check_table`);
  `GradientCheck` proves that each family gets a gradient and moves while sampled base tensors do not.
- `out_proj` of the Mamba-2 mixers: PEFT refuses it, and the fused CUDA kernel multiplies by its weight itself, so
  `allow_out_proj` lifts the refusal and `guard_fused_mamba_out_proj` runs the kernel without out_proj and then the
  module, LoRA included (`sft.fused_mamba=off` takes the unfused mixer instead).
- `lm_head`: TRL's fused head reads the bare weight and would ignore a LoRA wrapper; `trainer_accepts_head_lora` and
  `install_fused_lora_head` give it `[W | B]` and `[h ; s A h]`, the same linear map, still tile by tile.
- `save_adapter`: only the LoRA weights, atomically, from the main process.
The library source each guard rests on, what is supported and what is refused: docs/internals.md, lab.model.lora.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import re
import sys
import types
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from unittest import mock

from omegaconf import DictConfig

from lab import LabError

if TYPE_CHECKING:
    import pandas as pd

@dataclass(frozen=True)
class Family:
    """One row of the LoRA family table."""

    name: str                           # what `sft.lora.targets` names; the target table's `family`
    group: str                          # attention, mamba, moe, mlp, head
    peft: tuple[tuple[str, str], ...]   # (kind, suffix): "module" matches nn.Linear names ending in suffix, "param"
    #                                     fused parameters (PEFT target_parameters); empty: the lab does not train it
    packed: str                         # regex of the module name in a packed adapter (what vLLM 0.33 loads), after
    #                                     `(model|backbone).layers.N.mixer.`; for the head group, the whole name


TABLE = (
    Family("q_proj", "attention", (("module", "q_proj"),), "q_proj"),
    Family("k_proj", "attention", (("module", "k_proj"),), "k_proj"),
    Family("v_proj", "attention", (("module", "v_proj"),), "v_proj"),
    Family("o_proj", "attention", (("module", "o_proj"),), "o_proj"),
    Family("in_proj", "mamba", (("module", "in_proj"),), "in_proj"),
    Family("out_proj", "mamba", (("module", "out_proj"),), "out_proj"),
    Family("shared_experts.up_proj", "moe", (("module", "shared_experts.up_proj"),), r"shared_experts\.up_proj"),
    Family("shared_experts.down_proj", "moe", (("module", "shared_experts.down_proj"),),
           r"shared_experts\.down_proj"),
    Family("experts", "moe", (("param", "mixer.experts.up_proj"), ("param", "mixer.experts.down_proj")),
           r"experts\.(?P<expert>\d+)\.(?:up_proj|down_proj)"),  # packed: split per expert (lab.model.submission)
    Family("lm_head", "head", (("module", "lm_head"),), "lm_head"),
    # modules of other Nemotron-H variants that vLLM 0.33 serves a LoRA on; the lab trains neither
    Family("latent_proj", "moe", (), "fc1_latent_proj|fc2_latent_proj"),
    Family("mlp", "mlp", (), "up_proj|down_proj"),
)
# family name -> [(kind, suffix)]: the families the lab trains
FAMILIES = {f.name: list(f.peft) for f in TABLE if f.peft}


def _base(model):
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def available_families(model) -> dict[str, int]:
    """Family -> number of matching modules/parameters in `model` (families with 0 are absent)."""
    import torch.nn as nn

    base = _base(model)
    linear = [n for n, m in base.named_modules() if isinstance(m, nn.Linear)]
    params = [n for n, _ in base.named_parameters()]
    return {fam: sum(n == suffix or n.endswith("." + suffix)
                     for kind, suffix in rules for n in (linear if kind == "module" else params))
            for fam, rules in FAMILIES.items()}


def check_targets(cfg: DictConfig) -> list[str]:
    """Refuse `sft.lora` targets this module cannot train, without a model (before one is loaded): none, or the
    'experts' family with dropout. Returns the targets. (The rank is the schema's: `lab.core.schema.rank_problem`.)"""
    lc = cfg.sft.lora
    targets = [str(t) for t in lc.targets]
    if not targets:
        raise LabError("conf/sft: lora.targets is empty")
    if "experts" in targets and lc.dropout > 0:
        raise LabError(f"conf/sft: lora.dropout={lc.dropout} with the 'experts' family: PEFT's ParamWrapper (fused "
                       "expert parameters) does not support dropout; set sft.lora.dropout=0")
    return targets


def lora_config(cfg: DictConfig, model):
    """A PEFT LoraConfig for exactly the configured families; unknown or unmatched families are errors.

    `target_modules` is always a list, empty when only fused parameters (the routed experts) are targeted: PEFT 0.21
    (`LoraModel._prepare_adapter_config`, peft/tuners/lora/model.py) replaces `target_modules=None` by its default
    targets for the model type (`TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING`, peft/utils/constants.py:
    q/k/v/o_proj for nemotron_h), which would add the attention families without a word."""
    from peft import LoraConfig

    lc = cfg.sft.lora
    targets = check_targets(cfg)
    avail = available_families(model)
    model_type = getattr(getattr(_base(model), "config", None), "model_type", "?")
    modules, params = [], []
    for fam in targets:
        if fam not in FAMILIES or avail[fam] == 0:
            exist = ", ".join(f"{f} ({c})" for f, c in sorted(avail.items()) if c)
            raise LabError(f"conf/sft: LoRA target '{fam}': no such module exists in this model ({model_type}); "
                           f"the module families that exist are: {exist}")
        for kind, suffix in FAMILIES[fam]:
            (modules if kind == "module" else params).append(suffix)
    rank_pattern, alpha_pattern = expert_patterns(cfg)
    return LoraConfig(r=lc.r, lora_alpha=lc.alpha, lora_dropout=lc.dropout,
                      target_modules=modules, target_parameters=params or None, bias="none",
                      task_type="CAUSAL_LM", rank_pattern=rank_pattern, alpha_pattern=alpha_pattern)


def expert_patterns(cfg: DictConfig) -> tuple[dict, dict]:
    """PEFT rank_pattern/alpha_pattern for `gpu.experts_rank` (routed experts at a lower rank, same alpha/r scale;
    1 to sft.lora.r, lab/core/schema.py); empty when unset. PEFT matches the keys against `...mixer.experts.up_proj`
    (`get_pattern_key`, peft/utils/other.py), which `shared_experts.up_proj` does not match;
    `lab.model.submission.pack` rewrites them for vLLM's per-expert names. PEFT 0.21 warns that these keys "did not
    match any targeted module and were ignored" (`tuners_utils.py` checks module names, not targeted parameters); they
    are applied: rank and scale are checked on the wrapped model by the memory trace's tests."""
    er, lc = cfg.gpu.experts_rank, cfg.sft.lora
    if er is None or int(er) == lc.r or "experts" not in [str(t) for t in lc.targets]:
        return {}, {}
    er = int(er)
    keys = [r"experts\.up_proj", r"experts\.down_proj"]
    return {k: er for k in keys}, {k: lc.alpha * er / lc.r for k in keys}


def allow_out_proj():
    """A context that lifts PEFT's Mamba refusal for `out_proj` only (module docstring); `conv1d` stays refused."""
    import peft.tuners.tuners_utils as tu

    original = tu._check_lora_target_modules_mamba

    def check(peft_config, model, target_name):
        if target_name != "out_proj":
            original(peft_config, model, target_name)

    return mock.patch.object(tu, "_check_lora_target_modules_mamba", check)


# ---- the fused Mamba kernel guard ------------------------------------------------------------

FUSED_FN = "mamba2_split_conv1d_scan_combined"
_RUNNING = contextvars.ContextVar("lab_mamba_mixer", default=None)  # the Mamba-2 mixer running now


def fused_mamba(cfg: DictConfig) -> bool:
    """Whether the mixers may take the fused kernel: sft.fused_mamba on or auto (lab.train.fast_paths has set it to
    off when the stage opened where the kernel is missing or failed its calibration)."""
    return str(cfg.sft.get("fused_mamba", "auto")) != "off"


class _FusedScanGuard:
    """`mamba2_split_conv1d_scan_combined` in the mixer's module (module docstring). For a mixer switched off
    (`sft.fused_mamba=off`): None, the mixer's "no fused result" answer, so it runs conv and chunk scan. While a mixer
    whose `out_proj` has a LoRA runs: the fused kernel WITHOUT its out_proj (`outproj_weight=None`), then the mixer's
    own `out_proj` module (base + LoRA); None where the kernel is absent (the CPU). Otherwise the function it
    replaced, unchanged.

    Rests on mamba_ssm 2.3.2's `mamba_ssm/ops/triton/ssd_combined.py`, `MambaSplitConv1dScanCombinedFn` (not installed
    here; read in its published source): with `outproj_weight=None` (and `outproj_bias=None`, which it asserts) forward
    returns the gated, group-RMS-normed scan output [batch, seq, d_inner] that it would otherwise multiply by
    out_proj, and backward skips the out_proj step (`if outproj_weight is not None: dout = F.linear(dout, W.t())`).
    NOT RUN ON A GPU: the CPU tests check the plumbing with a stand-in for the kernel."""

    def __init__(self, inner):
        self.inner = inner

    def __call__(self, *args, **kwargs):
        mixer = _RUNNING.get()
        if mixer is None:
            return self.inner(*args, **kwargs)
        if not getattr(mixer, "_lab_fused_mamba", True):
            return None
        if not _has_lora(mixer.out_proj):
            return self.inner(*args, **kwargs)
        if kwargs.get("return_final_states"):
            return None  # the final states come back beside the output: leave that case to the PyTorch path
        out = self.inner(*args, **{**kwargs, "outproj_weight": None, "outproj_bias": None})
        return None if out is None else mixer.out_proj(out)


def _has_lora(module) -> bool:
    return len(getattr(module, "lora_A", ())) > 0


def _mixer_pre_hook(module, args):
    _RUNNING.set(module)


def _mixer_post_hook(module, args, output):
    _RUNNING.set(None)


def guard_fused_mamba_out_proj(model, fused: bool = True) -> int:
    """Make every Mamba-2 mixer whose `out_proj` has a LoRA apply it in training (fused kernel without out_proj, then
    `out_proj`; the PyTorch path without the kernel): `_FusedScanGuard` in
    the mixer class's module and forward hooks on each mixer, each installed once. `fused` False (`sft.fused_mamba=off`,
    `fused_mamba(cfg)`): every mixer takes the unfused path. Returns the number of mixers whose out_proj has a LoRA."""
    n = 0
    for _, mod in _base(model).named_modules():
        if not (type(mod).__name__.endswith("Mamba2Mixer") and hasattr(mod, "out_proj")):
            continue
        has = _has_lora(mod.out_proj)
        n += has
        mod._lab_fused_mamba = bool(fused)
        if getattr(mod, "_lab_out_proj_hooks", False):
            continue
        module = sys.modules[type(mod).__module__]
        fn = getattr(module, FUSED_FN, None)
        if fn is None:
            if has:
                raise LabError(f"{type(mod).__module__}.{type(mod).__name__} has no module-level {FUSED_FN}, so "
                               "lab.model.lora cannot keep its fused Mamba kernel from bypassing the out_proj LoRA; "
                               "use transformers' own Nemotron-H (model.trust_remote_code=false) or drop out_proj")
            continue
        if not isinstance(fn, _FusedScanGuard):
            setattr(module, FUSED_FN, _FusedScanGuard(fn))
        mod.register_forward_pre_hook(_mixer_pre_hook)
        mod.register_forward_hook(_mixer_post_hook, always_call=True)
        mod._lab_out_proj_hooks = True
    return n


@contextlib.contextmanager
def fused_mamba_as(model, fused: bool):
    """Within the block, every Mamba-2 mixer of `model` (guarded by `guard_fused_mamba_out_proj`) takes (`fused`) or
    leaves the fused kernel, as `sft.fused_mamba` sets them for a run (calibrate's comparisons); as before after it."""
    mixers = [m for m in _base(model).modules() if hasattr(m, "_lab_fused_mamba")]
    before = [m._lab_fused_mamba for m in mixers]
    for m in mixers:
        m._lab_fused_mamba = bool(fused)
    try:
        yield
    finally:
        for m, b in zip(mixers, before):
            m._lab_fused_mamba = b


# ---- target table ------------------------------------------------------------------------------

def family_of(param_name: str) -> str | None:
    """The family a LoRA parameter belongs to, from its name."""
    if "lora_" not in param_name:
        return None
    if ".experts." in param_name and "shared_experts" not in param_name:
        return "experts"
    return next((fam for fam in FAMILIES if fam != "experts" and f".{fam}." in param_name), "other")


def target_table(model) -> pd.DataFrame:
    """Family, number of LoRA-wrapped modules/parameters, trainable parameters."""
    import pandas as pd

    rows = [(fam, p.numel()) for n, p in model.named_parameters() if p.requires_grad and (fam := family_of(n))]
    df = pd.DataFrame(rows, columns=["family", "trainable_params"]).groupby("family", as_index=False).agg(
        modules=("trainable_params", "size"), trainable_params=("trainable_params", "sum"))
    df["modules"] //= 2  # one lora_A and one lora_B per wrapped module or parameter
    return df


class Trainee:
    """The model a training step trains, with its tokenizer and its `target_table`. The training step empties it
    (`take`): the saved adapter is scored afterwards, never the in-memory model, and a notebook variable must not keep
    that model's memory alive (vLLM needs the GPU)."""

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


def check_table(cfg: DictConfig, table: pd.DataFrame, backend: str = "hf") -> None:
    """Exactly the configured families own trainable LoRA parameters after wrapping: a configured family without
    them, or one that got them without being asked for (e.g. a library's default targets), is a loud error."""
    have = dict(zip(table["family"], table["trainable_params"]))
    targets = [str(t) for t in cfg.sft.lora.targets]
    missing = [f for f in targets if not have.get(f)]
    extra = sorted(f for f, n in have.items() if n and f not in targets)
    problems = ([f"configured but without trainable LoRA parameters: {', '.join(missing)}"] if missing else []) + \
        ([f"trainable LoRA parameters on families not in sft.lora.targets: {', '.join(extra)}"] if extra else [])
    if problems:
        raise LabError(f"LoRA families after wrapping ({backend}) differ from sft.lora.targets={targets}: "
                       f"{'; '.join(problems)}; what did get a LoRA:\n{table.to_string(index=False)}")


def attach_lora(cfg: DictConfig, model):
    """Wrap `model` with the configured LoRA; returns (peft_model, target table)."""
    from peft import get_peft_model

    config = lora_config(cfg, model)
    with allow_out_proj():
        pm = get_peft_model(model, config)
    guard_fused_mamba_out_proj(pm, fused=fused_mamba(cfg))
    table = target_table(pm)
    check_table(cfg, table)
    switch_experts_lora(cfg, pm)
    return pm, table


def switch_experts_lora(cfg: DictConfig, model) -> str:
    """Put the routed experts' LoRA on `sft.lora.experts_path` (routed: `lab.model.experts_lora`; fold: PEFT's own),
    checking every MoE layer's experts module was switched; prints and returns the path taken ("none" without an
    experts LoRA)."""
    from lab.model import experts_lora

    path, n = experts_lora.apply(str(cfg.sft.lora.get("experts_path", "routed")), model)
    if n:
        print(f"experts LoRA: {path} on {n} MoE layers" + (" (lab.model.experts_lora: routed tokens only)"
                                                           if path == "routed" else " (PEFT's fold: W + B@A stacks)"))
    return path


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
        first = {}  # layer-agnostic name -> (name, tensor) of the first frozen tensor of that name
        for n, p in model.named_parameters():
            if not p.requires_grad and p.numel():
                first.setdefault(re.sub(r"\.\d+\.", ".N.", n), (n, p))
        self.frozen = {n: _sample(p) for n, p in first.values()}
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
        import pandas as pd

        moved, seen, tensors, still = defaultdict(float), defaultdict(int), defaultdict(int), defaultdict(int)
        for n, p in self.model.named_parameters():
            if n in self.before:
                fam = family_of(n) or "other"
                d = float((_sample(p) - self.before[n]).abs().sum())
                moved[fam] += d
                seen[fam] += self.before[n].numel()
                tensors[fam] += 1
                still[fam] += d == 0.0
        fams = sorted(set(moved) | set(self.grad_norm))
        df = pd.DataFrame({"family": fams, "grad_norm_step1": [self.grad_norm.get(f, 0.0) for f in fams],
                           # the mean |change| of one LoRA weight (sampled), in the weights' own units
                           "mean_abs_weight_change": [moved[f] / seen[f] if seen.get(f) else 0.0 for f in fams],
                           "tensors": [tensors.get(f, 0) for f in fams],
                           "tensors_unchanged": [still.get(f, 0) for f in fams]})
        df["ok"] = (df["grad_norm_step1"] > 0) & (df["mean_abs_weight_change"] > 0) & (df["tensors_unchanged"] == 0)
        return df

    def frozen_report(self) -> pd.DataFrame:
        import pandas as pd

        params = dict(self.model.named_parameters())
        rows = []
        for n, s in self.frozen.items():
            change = float((_sample(params[n]) - s).abs().max()) if n in params else float("nan")
            rows.append({"tensor": n, "max_abs_change": change, "unchanged": change == 0.0})
        return pd.DataFrame(rows, columns=["tensor", "max_abs_change", "unchanged"])

    def save(self, folder: Path) -> list[str]:
        """Write gradient_check.csv (`report`) and frozen_check.csv (`frozen_report`) into `folder`; returns what
        failed: each family not ok, and `frozen:<tensor>` for each frozen tensor that moved (SFT and GRPO alike)."""
        from lab.core.io import atomic_write_csv

        rep, frozen = self.report(), self.frozen_report()
        atomic_write_csv(folder / "gradient_check.csv", rep)
        atomic_write_csv(folder / "frozen_check.csv", frozen)
        return (rep.loc[~rep["ok"], "family"].tolist()
                + [f"frozen:{t}" for t in frozen.loc[~frozen["unchanged"], "tensor"]])


# ---- the lm_head LoRA under TRL's fused head --------------------------------------------------

def head_lora(model):
    """The PEFT LoRA layer on the output head, or None when the head has no LoRA."""
    from peft.tuners.lora import LoraLayer

    head = _base(model).get_output_embeddings()
    return head if isinstance(head, LoraLayer) else None


def trainer_accepts_head_lora(model):
    """A context (wrap the trainer's construction in it) in which `get_output_embeddings()` returns the head's frozen
    base layer (module docstring); nothing when the head has no LoRA."""
    head = head_lora(model)
    if head is None:
        return contextlib.nullcontext()
    return mock.patch.object(_base(model), "get_output_embeddings", lambda: head.base_layer)


def full_weight(t):
    """`t` whole: an FSDP2-sharded parameter (a `DTensor`) is gathered with `full_tensor()`, as TRL's fused head does
    (`trl/trainer/utils.py`, `add_fused_lm_head`); the gather is differentiable, so the gradient reaches the shard."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def head_as_linear(head, x, fp32: bool = False):
    """(hidden, weight, bias) of one linear map equal to the LoRA head applied to `x` ([tokens, hidden]).

    `W x + sum_a s_a B_a A_a drop_a(x)` = `[W | B_1 | ...] @ [x ; s_1 A_1 drop_1(x) ; ...]`; both parts in the
    base weight's dtype (what autocast does to PEFT's own LoRA matmuls in bf16 training), or float32 with `fp32`
    (TRL's `cast_lm_head_to_fp32`). Every weight is read through `full_weight`, and `A` is applied as a plain
    matmul on that full weight (never through the module), so FSDP2-sharded weights give whole ones.
    """
    import torch

    base = head.base_layer
    w0 = full_weight(base.weight)
    dtype = torch.float32 if fp32 else w0.dtype
    bias = None if base.bias is None else full_weight(base.bias).to(dtype)
    xs, ws = [x.to(dtype)], [w0.to(dtype)]
    if not (head.disable_adapters or head.merged):
        for name in head.active_adapters:
            if name not in head.lora_A:
                continue
            if head.use_dora.get(name) or getattr(head, "lora_bias", {}).get(name):
                raise LabError(f"lm_head LoRA adapter '{name}': DoRA and LoRA bias on lm_head are not supported by "
                               "lab.model.lora's fused head; use a plain LoRA")
            a, b = full_weight(head.lora_A[name].weight), full_weight(head.lora_B[name].weight)
            ax = torch.nn.functional.linear(head.lora_dropout[name](x.to(a.dtype)), a)
            xs.append((head.scaling[name] * ax).to(dtype))
            ws.append(b.to(dtype))
    if len(xs) == 1:
        return xs[0], ws[0], bias
    return torch.cat(xs, -1), torch.cat(ws, 1), bias


def install_fused_lora_head(model, temperature: float = 1.0,
                            outputs: tuple[str, ...] = ("log_probs", "entropy", "is_top1"),
                            cast_lm_head_to_fp32: bool = False) -> bool:
    """Wrap the fused forward TRL installed (call after building the trainer); True if the head has a LoRA.

    `temperature`, `outputs` and `cast_lm_head_to_fp32` must be the ones the trainer gave `add_fused_lm_head`
    (SFT: 1.0, log_probs/entropy/is_top1, no cast; GRPO: its sampling temperature, log_probs/entropy and
    `GRPOConfig.cast_lm_head_to_fp32`, which TRL 1.15's GRPOTrainer itself refuses for a PEFT head in `__init__`).
    """
    import torch
    import trl.trainer.utils as tu

    if head_lora(model) is None:
        return False
    base = _base(model)
    trl_forward = base.forward
    if getattr(trl_forward, "_lab_lora_head", False):
        return True
    from transformers.integrations import is_deepspeed_zero3_enabled

    if is_deepspeed_zero3_enabled():
        raise LabError("lm_head LoRA under DeepSpeed ZeRO-3: lab.model.lora reads the head's weights outside its "
                       "module, where ZeRO-3 leaves them sharded, and its gather (TRL's maybe_gather_lm_head_ctx) was "
                       "never run here (no DeepSpeed, no GPU); use ddp or deepspeed_zero2, or drop lm_head "
                       "(docs/scaling.md)")
    tc = base.config.get_text_config()
    for key in ("final_logit_softcapping", "logit_scale", "output_multiplier", "lm_head_multiplier", "logits_scaling"):
        if getattr(tc, key, None) not in (None, 1.0):
            raise LabError(f"lm_head LoRA: the model's config sets {key}={getattr(tc, key)!r}, which lab.model.lora's "
                           "fused head does not apply; drop lm_head from the LoRA targets for this model")

    @functools.wraps(type(base).forward)
    def forward(self, *args, fused_lm_head=False, labels=None, shift_labels=None, num_items_in_batch=None, **kw):
        head = head_lora(self)
        if not fused_lm_head or head is None:
            return trl_forward(*args, fused_lm_head=fused_lm_head, labels=labels, shift_labels=shift_labels,
                               num_items_in_batch=num_items_in_batch, **kw)
        if kw.get("output_router_logits") or getattr(tc, "output_router_logits", False):
            raise LabError("lm_head LoRA: MoE router logits in the fused head are not supported by lab.model.lora")
        kw["use_cache"] = False
        hidden = self.base_model(*args, **kw).last_hidden_state
        if shift_labels is None:
            hidden, labels = hidden[:, :-1], labels[:, 1:]
        else:
            labels = shift_labels
        hidden, labels = hidden.to(head.base_layer.weight.device), labels.to(head.base_layer.weight.device)
        mask = labels != -100
        with torch.autocast(hidden.device.type, enabled=False) if cast_lm_head_to_fp32 else contextlib.nullcontext():
            h, w, b = head_as_linear(head, hidden[mask], fp32=cast_lm_head_to_fp32)
            per_token = tu._ChunkedLogProbFunction.apply(h, w, b, labels[mask], temperature,
                                                         tu._CHUNKED_LOGPROB_CHUNK_SIZE, None, 1.0, outputs)
        log_probs, entropy, lssp, mean_logits, is_top1 = (
            None if t is None else t.new_zeros(mask.shape).masked_scatter(mask, t) for t in per_token)
        loss = -log_probs.sum() / (mask.sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch)
        return tu.FusedCausalLMOutput(loss=loss, log_probs=log_probs, entropy=entropy, log_sum_sq_probs=lssp,
                                      mean_logits=mean_logits, is_top1=is_top1, label_mask=mask)

    forward._lab_lora_head = True
    base.forward = types.MethodType(forward, base)
    if hasattr(model, "save_pretrained"):
        # PEFT's save_embedding_layers="auto" (the Trainer's checkpoints) would add the frozen lm_head
        # (vocabulary x hidden) to every checkpoint once lm_head is a target; keep checkpoints LoRA-only.
        model.save_pretrained = functools.partial(model.save_pretrained, save_embedding_layers=False)
    return True


# ---- saving --------------------------------------------------------------------------------

def save_adapter(model, adapter_dir: Path, dtype: str | None = None) -> Path:
    """Save only the LoRA weights (never full embedding/lm_head copies), atomically (temp folder + rename).

    `dtype` (a torch dtype name, e.g. "bfloat16"): the saved tensors are cast to it before the folder is renamed
    into place (on Kaggle `kaggle.adapter_dtype`, `lab.core.paths.adapter_dtype`: half the bytes of fp32 in
    the 20 GB Kaggle keeps); None: as trained. The checkpoints the Trainer writes keep the trained dtype.

    Under several processes (`accelerate launch`, torchrun) only the main process writes, after the
    LoRA weights are gathered when DeepSpeed ZeRO-3 shards them; every process waits for the write.
    """
    import torch.distributed as dist
    from transformers.integrations import is_deepspeed_zero3_enabled

    from lab.core.io import atomic_dir

    adapter_dir = Path(adapter_dir)
    distributed = dist.is_available() and dist.is_initialized()
    gather = contextlib.nullcontext()
    if is_deepspeed_zero3_enabled():
        import deepspeed

        gather = deepspeed.zero.GatheredParameters([p for n, p in model.named_parameters() if "lora_" in n],
                                                   modifier_rank=None)
    with gather:
        if not distributed or dist.get_rank() == 0:
            with atomic_dir(adapter_dir, "adapter") as tmp:
                model.save_pretrained(str(tmp), save_embedding_layers=False)
                if dtype:
                    _cast_saved(Path(tmp), dtype)
    if distributed:
        dist.barrier()
    return adapter_dir


def _cast_saved(folder: Path, dtype: str) -> None:
    """Cast every tensor of the safetensors files PEFT wrote into `folder` (still the temporary folder) to `dtype`."""
    import torch
    from safetensors.torch import load_file, save_file

    target = getattr(torch, dtype, None)
    if not isinstance(target, torch.dtype):
        raise LabError(f"adapter dtype {dtype!r} is not a torch dtype (kaggle.adapter_dtype: bfloat16, float16, "
                       "float32 or null)")
    for f in sorted(folder.rglob("*.safetensors")):
        tensors = {k: v.to(target) if v.is_floating_point() else v for k, v in load_file(str(f)).items()}
        save_file(tensors, str(f), metadata={"format": "pt"})
