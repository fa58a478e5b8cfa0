"""One training step of the composed config traced on PyTorch fake tensors: its peak memory, measured, not estimated.

`trace(cfg, stage)` runs one real training step (forward, backward, optimizer step) of `NemotronHForCausalLM` with the
configured LoRA attached by `lab.model.lora.attach_lora`, gradient checkpointing as configured (non-reentrant, as TRL sets
it) and the configured optimizer, on tensors that have shapes and dtypes but no data
(`torch._subclasses.fake_tensor.FakeTensorMode`), on the CPU device. `LiveBytes`, a `TorchDispatchMode`, counts the
bytes of every live tensor storage (created by an op, freed when its last tensor dies) and keeps the peak and what was
live at it, grouped by phase, layer kind and the op that made it. The shapes come from the real `config.json`
(`model.architecture` for the tiny model). `python -m lab memory [OVERRIDES...]` prints it; `check_fits(cfg)` is the
same trace before training, refusing to start when the peak exceeds `gpu.max_use` of `gpu.memory_gib`.

Kernels with no CPU path are replaced, for the trace only, by stand-ins that allocate and save for backward what the
real kernel allocates and saves, read from their sources (downloaded with `pip download --no-deps`):
- `mamba_ssm`'s chunk scan (`mamba_ssm-2.3.2.post1.tar.gz`, `mamba_ssm/ops/triton/ssd_combined.py`,
  `MambaChunkScanCombinedFn` and `_mamba_chunk_scan_combined_fwd/_bwd`): forward keeps `dA_cumsum` and the
  discretised `dt` (fp32, batch x heads x chunks x chunk), the chunk states (fp32, batch x chunks x heads x headdim x
  state), the passed states, the final state (fp32), `CB` (fp32, batch x chunks x groups x chunk x chunk) until it
  returns, and saves `out, x, dt, dA_cumsum, A, B, C, D, dt_bias`; backward allocates `dB, dC, ddt`, recomputes
  `dA_cumsum, dt, CB, states`, builds `dstates` and the gradients `dx, dCB, ddA` (kept until it returns: an upper
  bound on the kernel's transient peak);
- `causal_conv1d`'s `causal_conv1d_fn` (`causal_conv1d-1.7.0.tar.gz`, `causal_conv1d/causal_conv1d_interface.py`,
  `CausalConv1dFn`): output like `x`, saves `x, weight, bias`; backward allocates `dx`, an fp32 `dweight` and
  `dbias`;
- TRL's Triton `ChunkedLogProbFunction` (`trl/kernels/chunked_logprob.py`, TRL 1.15): seven fp32 `[tokens]`
  statistics and one `[min(tokens, 4096), 32768]` tile buffer in the compute dtype; saves `hidden, weight, bias,
  targets, log_z, entropy`; backward allocates fp32 `grad_hidden`, fp32 `grad_weight` (when the head's weight needs
  a gradient: the lab's `lm_head` LoRA, `lab.model.lora.head_as_linear`), a tile buffer, and returns them cast back.
  `head="torch"` uses `lab.model.torch_logprob`'s real PyTorch head instead (what a CPU step runs; the tiny-model test).
- `bitsandbytes`' 8-bit AdamW (`bitsandbytes-0.50.2` wheel, `bitsandbytes/optim/optimizer.py`,
  `Optimizer2State.init_state`): uint8 `state1/state2` and fp32 `absmax1/absmax2` per 256 values for tensors of at
  least 4,096 values (`min_8bit_size`), fp32 states otherwise; its update is in place.
Which Mamba path ran (the stand-ins above, or transformers' PyTorch reference `mamba2_chunk_scan`) and which experts
path ran (transformers' `grouped_mm` or its eager loop, and PEFT's fold of the expert LoRA into the weight stack,
`_LoraFactorsProxy` -> `baddbmm`, or the routed path of `lab.model.experts_lora`, `sft.lora.experts_path`) are read
from the ops the step ran and the model.

Pitfall handled: under fake tensors transformers cannot look at the data, so it builds an explicit [T x T] causal mask
that the real run skips. With `attention_mask=None` its mask code still checks `position_ids` for packed sequences
(`find_packed_sequence_indices`, transformers/masking_utils.py), answers "maybe packed" for a fake tensor, and so
never lets SDPA run with `is_causal`; a real unpacked row gets None there and no mask. The trace feeds single
unpadded rows, passes `attention_mask=None` and gives `find_packed_sequence_indices` the real run's answer (None)
(tests/test_memory.py: with it the fake and real peaks agree; without it the fake run holds a [T x T] mask more).

The step runs under CUDA's autocast rules though its tensors are on the CPU (`cuda_autocast_rules`: CUDA autocast
runs some ops in fp32 that the CPU's leaves in bf16); so run, the fake step counts the same bytes as the same step
on an H100 (bench/gpu_memory.py, tests/test_gpu_bench.py).

What it simplifies:
1. Only tensors are counted: no CUDA context, cuBLAS workspaces, allocator rounding or fragmentation; the refusal
   margin (`gpu.max_use`, 0.95 of the card) stands for them.
2. The fused head receives every position of every row as labelled (an upper bound: SFT masks the prompt, GRPO
   scores only completions); TRL's boolean `hidden[mask]` is traced as the same-sized gather (fake tensors cannot
   run data-dependent shapes). GRPO rows are traced at `model.max_model_len` tokens (prompt + completion bound),
   unpadded.
3. The fused `mamba_split_conv1d_scan_combined` (used only when `out_proj` has no LoRA) is traced as its two parts,
   the conv and the chunk scan stand-ins.
4. One step: the optimizer's states are created in it, as in the first real step (later steps hold the same).
"""

from __future__ import annotations

import inspect
import json
import math
import time
import weakref
from collections import defaultdict
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping
from unittest import mock

import torch
from omegaconf import DictConfig, OmegaConf
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from lab import LabError  # models.missing_mamba_kernels read at call time (tests stand in for it)
from lab.model import models
from lab.plan.autocast_rules import cuda_autocast_rules
from lab.model.lora import _base, attach_lora, head_as_linear, head_lora
from lab.model.torch_logprob import TorchLogProbFunction

GIB = 1024 ** 3
REAL_CONFIG = Path(__file__).resolve().parents[2].parent / "shared" / "tokenizer" / "nemotron-3-nano" / "config.json"
FIXTURE_CONFIG = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "nemotron_3_nano_config_values.json"


# ---- the model's shapes --------------------------------------------------------------------------------------------

def model_config_values(cfg: DictConfig) -> dict:
    """The NemotronHConfig fields of the configured model: `model.architecture` (tiny), else the checkpoint's
    config.json (the model folder, else ../shared's copy of the real one, else the test fixture of its values)."""
    if cfg.model.architecture is not None:
        return OmegaConf.to_container(cfg.model.architecture, resolve=True)
    candidates = [Path(str(cfg.model.path)) / "config.json", REAL_CONFIG, FIXTURE_CONFIG]
    for p in candidates:
        if p.is_file():
            return json.loads(p.read_text())
    raise LabError(f"model.path={cfg.model.path}: no config.json found (looked at {', '.join(map(str, candidates))})")


def meta_model(values: Mapping[str, Any], dtype=None):
    """NemotronHForCausalLM on the meta device (every shape, no storage) from config.json values (keys that are not
    NemotronHConfig fields, such as model_type and torch_dtype, ignored)."""
    from transformers import NemotronHConfig, NemotronHForCausalLM

    skip = ("model_type", "torch_dtype", "architectures", "auto_map")
    with torch.device("meta"):
        model = NemotronHForCausalLM(NemotronHConfig(**{k: v for k, v in values.items() if k not in skip}))
    return model.to(dtype) if dtype is not None else model


def lora_figures(cfg: DictConfig, values: Mapping[str, Any], dtype=None) -> dict:
    """The configured LoRA on the meta model: per-family table (`lab.model.lora.attach_lora`), trainable and base
    parameters."""
    model = meta_model(values, dtype)
    base_params = sum(p.numel() for p in model.parameters())
    pm, table = attach_lora(cfg, model)
    return {"table": table, "model": pm, "base_params": base_params,
            "trainable_params": int(table["trainable_params"].sum())}


_COUNTS: dict[str, tuple[int, int]] = {}


def param_counts(cfg: DictConfig, values: Mapping[str, Any] | None = None) -> tuple[int, int]:
    """(base parameters, trainable LoRA parameters) of the configured model and LoRA (`lora_figures`), kept per
    model shape and LoRA config in this process: building the 30B meta model and attaching the LoRA takes seconds."""
    values = dict(values or model_config_values(cfg))
    key = json.dumps([values, OmegaConf.to_container(cfg.sft.lora, resolve=True),
                      OmegaConf.select(cfg, "gpu.experts_rank", default=None)], sort_keys=True, default=str)
    if key not in _COUNTS:
        fig = lora_figures(cfg, values)
        _COUNTS[key] = (int(fig["base_params"]), int(fig["trainable_params"]))
    return _COUNTS[key]


# ---- counting live storage bytes -----------------------------------------------------------------------------------

class LiveBytes(TorchDispatchMode):
    """A TorchDispatchMode that counts the bytes of live tensor storages.

    Every tensor an op returns is looked up by its storage; a storage seen for the first time adds its bytes under a
    label (`phase/where/op`), and a `weakref.finalize` subtracts them when the storage is freed. `peak` is the largest
    total; `at_peak` maps each label to its bytes live at that moment.
    """

    def __init__(self):
        super().__init__()
        self.live = 0
        self.peak = 0
        self.by_label: dict[str, int] = defaultdict(int)
        self.at_peak: dict[str, int] = {}
        self.phase = "setup"
        self.where = ""
        self.ops: dict[str, int] = defaultdict(int)
        self.phase_peak: dict[str, int] = {}
        self._seen = weakref.WeakSet()  # the live storages counted

    def track(self, t, label: str) -> None:
        if not isinstance(t, torch.Tensor) or t.layout != torch.strided:
            return
        st = t.untyped_storage()
        if st in self._seen:
            return
        self._seen.add(st)
        n = st.nbytes()
        weakref.finalize(st, self._free, n, label)
        self.live += n
        self.by_label[label] += n
        self.phase_peak[self.phase] = max(self.phase_peak.get(self.phase, 0), self.live)
        if self.live > self.peak:
            self.peak = self.live
            self.at_peak = dict(self.by_label)

    def _free(self, n, label):
        self.live -= n
        self.by_label[label] -= n

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        self.ops[name] += 1
        label = "/".join(x for x in (self.phase, self.where, name) if x)
        for t in tree_leaves(out):
            self.track(t, label)
        return out


# ---- stand-ins for kernels with no CPU path ------------------------------------------------------------------------

_PATHS: dict[str, int] = defaultdict(int)  # which Mamba implementation each call took (read after the step)
F32 = torch.float32


class MambaChunkScanStandIn(torch.autograd.Function):
    """Allocates and saves what `mamba_ssm`'s `MambaChunkScanCombinedFn` does (module docstring); no math."""

    @staticmethod
    def forward(ctx, x, dt, A, B, C, D, dt_bias, chunk_size):
        b, seqlen, h, p = x.shape
        g, n = B.shape[2], B.shape[3]
        c = math.ceil(seqlen / chunk_size)
        on = {"device": x.device}
        dA_cumsum = torch.empty(b, h, c, chunk_size, dtype=F32, **on)
        dt_out = torch.empty(b, h, c, chunk_size, dtype=F32, **on)
        states = torch.empty(b, c, h, p, n, dtype=F32, **on)
        passed = torch.empty(b, c, h, p * n, dtype=C.dtype, **on)
        final = torch.empty(b, h, p * n, dtype=F32, **on)
        cb = torch.empty(b, c, g, chunk_size, chunk_size, dtype=F32, **on)
        out = torch.empty_like(x)
        del dt_out, states, passed, final, cb
        ctx.save_for_backward(out, x, dt, dA_cumsum, A, B, C, D, dt_bias)
        ctx.chunk_size = chunk_size
        return out

    @staticmethod
    def backward(ctx, dout):
        out, x, dt, dA_cumsum, A, B, C, D, dt_bias = ctx.saved_tensors
        b, seqlen, h, p = x.shape
        g, n = B.shape[2], B.shape[3]
        cs = ctx.chunk_size
        c = math.ceil(seqlen / cs)
        on = {"device": x.device}
        dB, dC, ddt = torch.empty_like(B), torch.empty_like(C), torch.empty_like(dt)
        keep = [dt.clone(), torch.empty(b, h, c, cs, dtype=F32, **on), torch.empty(b, h, c, cs, dtype=F32, **on),
                torch.empty(b, c, g, cs, cs, dtype=F32, **on), torch.empty(b, c, h, p, n, dtype=F32, **on),
                torch.empty(b, c, h, p, n, dtype=F32, **on), torch.empty(b, c, h, p, n, dtype=x.dtype, **on),
                torch.empty(b, c, g, cs, cs, dtype=F32, **on), torch.empty(b, h, c, cs, dtype=F32, **on)]
        dx = torch.empty_like(x)
        dA = torch.empty_like(A, dtype=F32)
        dD = None if D is None else torch.empty_like(D, dtype=F32)
        ddt_bias = None if dt_bias is None else torch.empty_like(dt_bias, dtype=F32)
        del keep
        return dx, ddt, dA, dB, dC, dD, ddt_bias, None


class CausalConv1dStandIn(torch.autograd.Function):
    """Allocates and saves what `causal_conv1d`'s `CausalConv1dFn` does (module docstring); no math."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        if x.stride(2) != 1 and x.stride(1) != 1:
            x = x.contiguous()
        ctx.save_for_backward(x, weight, bias)
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx, dout):
        x, weight, bias = ctx.saved_tensors
        dx = torch.empty_like(x)
        dweight = torch.empty_like(weight, dtype=F32).to(weight.dtype)
        dbias = None if bias is None else torch.empty_like(bias, dtype=F32).to(bias.dtype)
        return dx, dweight, dbias


class ChunkedLogProbStandIn(torch.autograd.Function):
    """Allocates and saves what TRL's Triton `ChunkedLogProbFunction` does (module docstring); no math."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, chunk_size, outputs):
        n = hidden.shape[0]
        stats = [torch.empty(n, dtype=F32, device=hidden.device) for _ in range(7)]  # running_max ... target_logit
        torch.empty(min(n, 4096), chunk_size, dtype=hidden.dtype,
                    device=hidden.device)  # the logits tile, freed at once
        log_z = stats[0] + torch.log(stats[1])
        logprobs = stats[6] - log_z
        entropy = log_z - stats[2] / stats[1] if "entropy" in outputs else None
        is_top1 = (stats[6] >= stats[0]) if "is_top1" in outputs else None
        ctx.save_for_backward(hidden, weight, bias, targets, log_z, log_z if entropy is None else entropy)
        ctx.chunk_size = chunk_size
        ctx.mark_non_differentiable(*(x for x in (is_top1,) if x is not None))
        return logprobs, entropy, None, None, is_top1

    @staticmethod
    def backward(ctx, grad_logprobs, grad_entropy, *_):
        hidden, weight, bias = ctx.saved_tensors[:3]
        grads = [torch.zeros(t.shape, dtype=F32, device=t.device) if need else None
                 for t, need in zip((hidden, weight, bias), ctx.needs_input_grad)]
        torch.empty(min(hidden.shape[0], 4096), ctx.chunk_size, dtype=hidden.dtype,
                    device=hidden.device)  # the logits tile, freed at once
        return (*(None if g is None else g.to(t.dtype) for g, t in zip(grads, (hidden, weight, bias))),
                None, None, None, None)


def _fake_chunk_scan(hidden_states, dt, A, B, C, chunk_size, D=None, dt_bias=None, initial_states=None,
                     return_final_states=False, **kwargs):
    """transformers' `mamba2_chunk_scan` signature, routed to the `mamba_ssm` stand-in (training: no cache)."""
    if initial_states is not None or return_final_states:
        raise LabError("lab.plan.memory traces training steps only (no Mamba cache)")
    return MambaChunkScanStandIn.apply(hidden_states, dt, A, B, C, D, dt_bias, chunk_size)


def _fake_conv1d(hidden_states, weight, bias=None, activation=None, **kwargs):
    """transformers' `causal_conv1d_fn` signature, routed to the `causal_conv1d` stand-in."""
    return CausalConv1dStandIn.apply(hidden_states, weight, bias)


def _unpacked_rows():
    """transformers' packed-sequence detection answers None, as it does for the real run's unpacked rows (the
    [T x T] mask pitfall, module docstring)."""
    import transformers.masking_utils as mu

    return mock.patch.object(mu, "find_packed_sequence_indices", lambda position_ids: None)


def _real_kernels():
    """(scan, conv) of the installed kernel packages, each with its label: `mamba_ssm`'s Triton chunk scan
    (`mamba_ssm.ops.triton.ssd_combined.mamba_chunk_scan_combined`, the function transformers' decorator resolves
    when the package imports) and `causal_conv1d_fn` when `causal_conv1d` imports, else transformers' PyTorch conv.
    CUDA only; a LabError when `mamba_ssm`'s scan does not import."""
    import importlib

    import transformers.models.nemotron_h.modeling_nemotron_h as mh

    try:
        scan = importlib.import_module(models.MAMBA_KERNELS["mamba_ssm"][0]).mamba_chunk_scan_combined
    except Exception as e:
        raise LabError(f"mamba=real needs mamba_ssm's Triton chunk scan, which does not import here "
                       f"({type(e).__name__}: {e})") from e
    try:
        conv = importlib.import_module(models.MAMBA_KERNELS["causal_conv1d"][0]).causal_conv1d_fn
        conv_label = "causal_conv1d (real kernel)"
    except Exception:
        conv, conv_label = mh.causal_conv1d_fn, "transformers causal_conv1d_fn (causal_conv1d absent)"
    return (_named_keywords_only(scan), "mamba_ssm chunk scan (real kernel)"), (_named_keywords_only(conv), conv_label)


def _named_keywords_only(fn):
    """`fn` called as transformers' hub-kernel wrapper calls a kernel (integrations/hub_kernels.py,
    `use_kernel_func_from_hub_with_fallback`): with only the keywords `fn`'s signature names. The mixer hands every
    kernel function all of its **kwargs; `seq_idx` among them reaches the kernels that take it."""
    names = inspect.signature(fn).parameters

    def call(*args, **kwargs):
        return fn(*args, **{k: v for k, v in kwargs.items() if k in names})
    return call


def random_weights(pm) -> None:
    """Weights for a step on real tensors after `to_empty`, which leaves everything unset: parameters drawn N(0,
    0.02), buffers (the router's score-correction bias) zero."""
    with torch.no_grad():
        for p in pm.parameters():
            p.normal_(0, 0.02)
        for b in pm.buffers():
            b.zero_()


def _mamba_kernels(path: str):
    """`kernel`: the module-level scan and conv of transformers' Nemotron-H become the stand-ins above; `torch`:
    transformers' own functions run (the PyTorch reference scan when `mamba_ssm` is absent), counted; `real`: the
    installed kernels themselves (`_real_kernels`, CUDA only: what the stand-ins are checked against on a GPU)."""
    import transformers.models.nemotron_h.modeling_nemotron_h as mh

    def counted(fn, what):
        def run(*a, **k):
            _PATHS[what] += 1
            return fn(*a, **k)
        return run

    if path == "kernel":
        scan, conv = (_fake_chunk_scan, "mamba_ssm chunk scan (stand-in)"), (_fake_conv1d, "causal_conv1d (stand-in)")
    elif path == "torch":
        scan = (mh.mamba2_chunk_scan, "transformers PyTorch chunk scan")
        conv = (mh.causal_conv1d_fn, "transformers causal_conv1d_fn")
    elif path == "real":
        scan, conv = _real_kernels()
    else:
        raise LabError(f"mamba path {path!r}: use kernel, torch or real")
    return mock.patch.multiple(mh, mamba2_chunk_scan=counted(*scan), causal_conv1d_fn=counted(*conv))


def _head_loss(pm, hidden, temperature: float, outputs: tuple[str, ...], head: str):
    """The loss of TRL 1.15's fused head (`add_fused_lm_head`, `trl/trainer/utils.py`), with lab.model.lora's LoRA head
    (`lab.model.lora.head_as_linear`) when the head carries one: every position labelled (module docstring, 2)."""
    hidden = hidden[:, :-1]
    rows, n_tok = hidden.shape[0], hidden.shape[1]
    flat = hidden.reshape(rows * n_tok, hidden.shape[-1])
    picked = flat.index_select(0, torch.arange(rows * n_tok, device=flat.device))  # = hidden[mask], all labelled
    targets = torch.zeros(rows * n_tok, dtype=torch.long, device=flat.device)
    lora = head_lora(pm)
    if lora is not None:
        h, w, b = head_as_linear(lora, picked)
    else:
        lm = _base(pm).get_output_embeddings()
        h, w, b = picked, lm.weight, lm.bias
    if head == "torch":
        per_token = TorchLogProbFunction.apply(h, w, b, targets, temperature, 32768, None, 1.0, outputs)
    elif head == "triton":  # TRL's own kernel (CUDA): what the stand-in is checked against on a GPU
        from trl.kernels import ChunkedLogProbFunction

        per_token = ChunkedLogProbFunction.apply(h, w, b, targets, temperature, 32768, None, 1.0, outputs)
    else:
        per_token = ChunkedLogProbStandIn.apply(h, w, b, targets, temperature, 32768, outputs)
    mask = torch.ones(rows, n_tok, dtype=torch.bool, device=flat.device)
    log_probs = per_token[0].new_zeros(mask.shape).masked_scatter(mask, per_token[0])
    return -log_probs.sum() / mask.sum().clamp(min=1)


# ---- the optimizer -------------------------------------------------------------------------------------------------

def _optimizer_step(params, name: str, lr: float, weight_decay: float):
    """One step of the named optimizer (transformers' `optim` names) on `params` (their `.grad` set); returns what
    holds its state."""
    if name in ("adamw_torch_fused", "adamw_torch"):
        opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=name == "adamw_torch_fused")
        opt.step()
        return opt
    if name == "adamw_bnb_8bit":  # Optimizer2State.init_state (module docstring); the update itself is in place
        state = []
        for p in params:
            if p.numel() < 4096:
                state += [torch.zeros_like(p, dtype=torch.float32) for _ in range(2)]
            else:
                blocks = -(-p.numel() // 256)
                state += [torch.zeros_like(p, dtype=torch.uint8) for _ in range(2)]
                state += [torch.zeros(blocks, dtype=torch.float32, device=p.device) for _ in range(2)]
        return state
    raise LabError(f"optimizer {name!r}: lab.plan.memory traces adamw_torch_fused, adamw_torch or adamw_bnb_8bit")


# ---- the trace -----------------------------------------------------------------------------------------------------

@dataclass
class Trace:
    stage: str
    rows: int
    seq_len: int
    peak_bytes: int
    top: list[tuple[str, int]]
    mamba_path: str
    experts_path: str
    optim: str
    seconds: float
    trainable_params: int
    base_params: int
    phase_peaks: dict
    device_peak_bytes: int | None = None  # a CUDA step: torch.cuda.max_memory_allocated over the step

    @property
    def peak_gib(self) -> float:
        return self.peak_bytes / GIB


def micro_batch(cfg: DictConfig) -> tuple[int, int]:
    """(completions per training micro-step, micro-steps per optimiser step) for one process.

    One optimiser step covers `prompts_per_step x num_generations` completions per process (the whole group of
    every prompt); `grpo.per_device_train_batch_size` of them go through one forward/backward (null: all at once).
    TRL 1.15 (`GRPOConfig.__post_init__`, trl/trainer/grpo_config.py) derives `generation_batch_size =
    per_device_train_batch_size x processes x steps_per_generation`; with `steps_per_generation =
    gradient_accumulation_steps` = the second value here, one generation round is one optimiser step, the
    advantages are normalised over whole groups (`_generate_and_score_completions` sees the full generation batch),
    and the default `dapo` loss divides by the generation batch's token count rescaled to one accumulation window
    (`_compute_loss`, trl/trainer/grpo_trainer.py), so the summed micro-steps give the loss of the one big step.

    `grpo.steps_per_generation` = S > 1 (`grpo_args`): TRL's steps_per_generation = S x the second value, so one
    round samples S optimiser steps' prompts at once; TRL then computes `old_per_token_logps` (its condition
    `gradient_accumulation_steps % (steps_per_generation x num_iterations) != 0`, `_generate_and_score_completions`)
    and the clipped ratio (`epsilon`) corrects the policy lag of the later S - 1 steps."""
    g = cfg.grpo
    group = g.prompts_per_step * g.num_generations
    m = group if g.per_device_train_batch_size is None else int(g.per_device_train_batch_size)
    if not 1 <= m <= group or group % m:
        raise LabError(f"conf/grpo: per_device_train_batch_size={m} must divide prompts_per_step x num_generations "
                       f"= {g.prompts_per_step} x {g.num_generations} = {group} (the completions of one optimiser "
                       "step), or be null (all of them in one micro-step)")
    return m, group // m


def step_shape(cfg: DictConfig, stage: str, tokens: int | None = None, rows: int | None = None
               ) -> tuple[int, int, bool]:
    """(rows, tokens per row, gradient checkpointing) of one training micro-step of `stage`: SFT's batch of
    `sft.max_seq_len` (with packing, of `sft.pack_tokens`), GRPO's micro-batch as the trainer gets it (`micro_batch`) of `model.max_model_len`;
    `tokens` and `rows` override them."""
    if stage == "sft":  # with packing a row is one pack (lab.train.sft.pack_tokens)
        from lab.model.packed_rows import pack_tokens

        return int(rows or cfg.sft.batch_size), int(tokens or pack_tokens(cfg)), bool(cfg.sft.gradient_checkpointing)
    if stage == "grpo":  # with packing one pack of grpo.pack_tokens per forward/backward (lab.train.grpo_packed)
        if cfg.grpo.get("packing", False):
            return int(rows or 1), int(tokens or cfg.grpo.pack_tokens), bool(cfg.grpo.gradient_checkpointing)
        return (int(rows or micro_batch(cfg)[0]), int(tokens or cfg.model.max_model_len),
                bool(cfg.grpo.gradient_checkpointing))
    raise LabError(f"lab.plan.memory: stage {stage!r} is not sft or grpo")


def trace(cfg: DictConfig, stage: str = "sft", tokens: int | None = None, mamba: str = "kernel",
          head: str = "chunked", fake: bool = True, rows: int | None = None, unpacked: bool = True,
          device: str = "cpu") -> Trace:
    """Run one training micro-step of `stage` and count its live storage bytes (module docstring).

    `mamba`: kernel (the `mamba_ssm`/`causal_conv1d` stand-ins), torch (transformers' PyTorch path) or real (the
    installed kernels, CUDA); `head`: chunked (TRL's Triton head stand-in), torch (`lab.model.torch_logprob`) or triton
    (TRL's kernel, CUDA); `fake=False` runs the same step on real tensors (the test that the fake count is right);
    `device="cuda"` (with `fake=False`) runs it on the GPU and also records the allocator's peak
    (`bench/gpu_memory.py`: traced against measured); `unpacked=False` leaves transformers' packed-row detection
    alone (the [T x T] pitfall test, module docstring)."""
    if fake and device != "cpu":
        raise LabError(f"lab.plan.memory: a fake-tensor trace runs on the CPU (autograd cannot run fake CUDA tensors "
                       f"without CUDA); device={device!r} needs fake=False")
    measure = torch.device(device).type == "cuda"  # a real step on the card: the allocator's peak too
    t0 = time.perf_counter()
    optim = cfg.gpu.optim or "adamw_torch_fused"  # transformers' default
    rows, seq_len, checkpointing = step_shape(cfg, stage, tokens, rows)
    values = dict(model_config_values(cfg), use_mamba_kernels=False)  # the trace swaps the module-level functions
    dtype = getattr(torch, cfg.model.dtype)
    fig = lora_figures(cfg, values, dtype)
    pm = fig["model"]
    if checkpointing:
        pm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    pm.train()
    temperature = float(cfg.grpo.temperature) if stage == "grpo" else 1.0
    outputs = ("log_probs", "entropy") if stage == "grpo" else ("log_probs", "entropy", "is_top1")
    _PATHS.clear()
    counter = LiveBytes()
    _where_hooks(pm, counter)
    # bf16 weights: the Trainer's mixed precision (bf16=True on a GPU) runs the forward under autocast
    # under CUDA's autocast rules: the step stands for one on a GPU (a step on the card has them already)
    autocast = torch.autocast(torch.device(device).type, dtype=dtype) if dtype == torch.bfloat16 else nullcontext()
    rules = cuda_autocast_rules() if dtype == torch.bfloat16 and not measure else nullcontext()
    with (FakeTensorMode(allow_non_fake_inputs=True) if fake else nullcontext()), _mamba_kernels(mamba), \
            (_unpacked_rows() if unpacked else nullcontext()), rules:
        pm.to_empty(device=device)
        if not fake:
            random_weights(pm)
        trainable = [p for p in pm.parameters() if p.requires_grad]
        if measure:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        with counter:
            for p in pm.parameters():
                counter.track(p, "weights/" + ("lora" if p.requires_grad else "base"))
            for b in pm.buffers():
                counter.track(b, "weights/buffers")
            counter.phase = "forward"
            ids = torch.zeros(rows, seq_len, dtype=torch.long, device=device)
            with autocast:
                hidden = pm.base_model.model.model(input_ids=ids, attention_mask=None, use_cache=False).last_hidden_state
                loss = _head_loss(pm, hidden, temperature, outputs, head)
            del hidden
            counter.phase, counter.where = "backward", ""
            loss.backward()
            del loss
            counter.phase, counter.where = "optimizer", ""
            state = _optimizer_step(trainable, optim, float(cfg.sft.learning_rate), float(cfg.sft.weight_decay))
            del state
        device_peak = None
        if measure:
            torch.cuda.synchronize(device)
            device_peak = torch.cuda.max_memory_allocated(device)
    top = sorted(((k, v) for k, v in counter.at_peak.items() if v > 0), key=lambda kv: -kv[1])
    return Trace(stage=stage, rows=rows, seq_len=seq_len, peak_bytes=counter.peak, top=top,
                 mamba_path=", ".join(_PATHS) or "none", experts_path=_experts_path(counter.ops, pm), optim=optim,
                 seconds=time.perf_counter() - t0, trainable_params=fig["trainable_params"],
                 base_params=fig["base_params"],
                 phase_peaks={k: v for k, v in counter.phase_peak.items() if k != "setup"},
                 device_peak_bytes=device_peak)


def _experts_path(ops: dict, model=None) -> str:
    from lab.model import experts_lora

    how = "grouped_mm" if ops.get("_grouped_mm") or ops.get("grouped_mm") else "eager loop" if ops.get("index_add_") \
        else "none"
    if ops.get("baddbmm"):
        how += ", LoRA folded into the expert stack (PEFT _LoraFactorsProxy: baddbmm)"
    elif model is not None and experts_lora.path_of(model) == "routed":
        how += ", LoRA on routed tokens only (lab.model.experts_lora)"
    return how


def _where_hooks(pm, counter) -> None:
    """Forward hooks that label what each decoder block allocates with its kind (mamba, attention, moe); they go
    with the traced model."""
    for m in pm.modules():
        kind = getattr(m, "block_type", None)
        if kind is not None:
            m.register_forward_pre_hook(lambda mod, a, k=kind: setattr(counter, "where", k))
            m.register_forward_hook(lambda mod, a, o: setattr(counter, "where", ""), always_call=True)


# ---- the gpu check, the report, the command ------------------------------------------------------------------------

def gpu_gib(cfg: DictConfig) -> float | None:
    """The card's memory: `gpu.memory_gib`, else this machine's first CUDA device, else None."""
    if cfg.gpu.memory_gib is not None:
        return float(cfg.gpu.memory_gib)
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory / GIB
    return None


def report(t: Trace, card_gib: float | None, use: float, n_top: int = 10) -> str:
    lines = [f"Traced peak of one {t.stage.upper()} training micro-step: {t.peak_gib:.1f} GiB "
             f"({t.rows} x {t.seq_len:,} tokens, optimizer {t.optim}; fake tensors, {t.seconds:.0f} s)",
             f"  Mamba path: {t.mamba_path}", f"  experts path: {t.experts_path}",
             f"  parameters: base {t.base_params:,}, trainable (LoRA) {t.trainable_params:,}",
             "  peak by phase: " + ", ".join(f"{k} {v / GIB:.1f} GiB" for k, v in t.phase_peaks.items()),
             "  live at the peak, by phase/layer kind/op:"]
    for k, v in t.top[:n_top]:
        lines.append(f"    {v / GIB:8.2f} GiB  {k}")
    if card_gib is not None:
        verdict = "fits" if t.peak_gib <= use * card_gib else "does NOT fit"
        lines.append(f"  {verdict}: {t.peak_gib:.1f} GiB against {use:.0%} of {card_gib:.1f} GiB = "
                     f"{use * card_gib:.1f} GiB")
    return "\n".join(lines)


def as_json(t: Trace, card_gib: float | None, use: float) -> dict:
    return {"peak_gib": round(t.peak_gib, 3), "gpu_gib": card_gib,
            "fits": None if card_gib is None else bool(t.peak_gib <= use * card_gib),
            "mamba_path": t.mamba_path, "experts_path": t.experts_path, "tokens": t.rows * t.seq_len, "rows": t.rows,
            "seq_len": t.seq_len, "stage": t.stage, "optim": t.optim, "seconds": round(t.seconds, 1),
            "trainable_params": t.trainable_params,
            "phase_peaks_gib": {k: round(v / GIB, 3) for k, v in t.phase_peaks.items()},
            "top": [{"what": k, "gib": round(v / GIB, 3)} for k, v in t.top[:20]]}


def optimizer_bytes_per_param(cfg: DictConfig) -> tuple[float, str]:
    """(bytes of optimizer state per trainable parameter, how): `gpu.optim`."""
    name = str(OmegaConf.select(cfg, "gpu.optim", default=None) or "adamw_torch_fused")
    if "8bit" in name:
        return 2 + 8 / 256, f"{name}: two uint8 states + fp32 absmax per 256 values = 2.03 B"
    if "adamw" in name or "adam" in name:
        return 8.0, f"{name}: two fp32 moments = 8 B"
    if "sgd" in name or "adafactor" in name:
        return 4.0, f"{name}: one fp32 state (upper bound) = 4 B"
    raise LabError(f"gpu.optim={name!r}: no output plan for this optimizer (lab/plan/output_plan.py)")


# ---- GRPO's generation phase (rollout_backend=vllm): a bound from shapes, not a trace --------------------------------

def generation_phase(cfg: DictConfig, values: Mapping[str, Any] | None = None,
                     counts: tuple[int, int] | None = None) -> dict:
    """GPU memory while GRPO samples through vLLM on the same card (`grpo.rollout_backend=vllm`): the engine holds the
    bf16 base weights, one adapter slot and the cache of the round's sequences, inside its share
    (`grpo.vllm_gpu_memory_utilization` of the card, which vLLM claims whole; null: `gpu.max_use` of the card less the
    trainer's part, rounded down to a hundredth, `engine_share`); the trainer keeps what it does not
    move to the CPU while the engine is awake: its fp32 LoRA weights and the optimizer's states (an upper bound: the
    frozen base is moved out, lab.train.rollouts). Both must fit `gpu.max_use` of the card together.

    The engine's figures are lower bounds of what vLLM needs (its activation and CUDA-graph memory, profiled inside the
    share, are not modelled): bf16 weights 2 B per base parameter; the adapter slot at rank r in bf16 (2 P);
    the attention KV cache, 2 (K, V) x key-value heads x head_dim x 2 B per attention layer and token, for every
    sequence in flight (the rollout engine's own `grpo.max_num_seqs`; null: as many as the share holds beside the
    weights and the adapter, in eights, at most one round's sequences) at model.max_model_len tokens;
    each Mamba layer's state per sequence, SSM heads x head_dim x state in `mamba_ssm_cache_dtype` (config.json) plus
    the conv state (conv_kernel - 1) x (heads x head_dim + 2 x n_groups x state) in bf16. `counts`: (base, LoRA
    parameters) when the caller has them (`param_counts` otherwise)."""
    values = dict(values or model_config_values(cfg))
    base, P = counts or param_counts(cfg, values)
    pattern = str(values.get("hybrid_override_pattern", ""))
    attn, mamba = pattern.count("*"), pattern.count("M")
    g = cfg.grpo
    tokens = int(cfg.model.max_model_len)
    kv_per_token = attn * 2 * int(values.get("num_key_value_heads", 0)) * int(values.get("head_dim", 0)) * 2
    ssm_item = 4 if str(values.get("mamba_ssm_cache_dtype", "float32")) == "float32" else 2
    heads, hdim, state = (int(values.get(k, 0)) for k in ("mamba_num_heads", "mamba_head_dim", "ssm_state_size"))
    conv = (int(values.get("conv_kernel", 4)) - 1) * (heads * hdim + 2 * int(values.get("n_groups", 1)) * state) * 2
    mamba_per_seq = mamba * (heads * hdim * state * ssm_item + conv)
    per, how = optimizer_bytes_per_param(cfg)
    trainer = {"LoRA weights (fp32)": 4 * P, f"optimizer states ({how})": int(per * P)}
    card = gpu_gib(cfg)
    keep = sum(trainer.values()) / GIB
    share = float(OmegaConf.select(cfg, "grpo.vllm_gpu_memory_utilization", default=None) or 0.0)
    if not share and card is not None:  # null: the rest of the card once the trainer's part is set aside
        share = math.floor(100 * (float(cfg.gpu.max_use) * card - keep) / card) / 100
    round_seqs = rollout_round(cfg)
    asked = OmegaConf.select(cfg, "grpo.max_num_seqs", default=None)
    per_seq = kv_per_token * tokens + mamba_per_seq
    if asked is not None:
        seqs, why = int(asked), f"grpo.max_num_seqs={int(asked)}"
    elif card is not None and share > 0:  # null: as many as the share holds beside the weights, in eights
        free = share * card * GIB - 2 * base - 2 * P
        most = max(8, int(free // per_seq) // 8 * 8)
        seqs = min(most, round_seqs)
        why = (f"grpo.max_num_seqs=null: ({share:.2f} x {card:.1f} GiB - weights - adapter) / "
               f"{per_seq / GIB:.4f} GiB a sequence = {free / per_seq:.0f}, in eights {most}, at most a round's "
               f"{round_seqs}")
    else:
        seqs, why = int(cfg.infer.max_num_seqs), "grpo.max_num_seqs=null and no card size: infer.max_num_seqs"
    engine = {"bf16 base weights": 2 * base, "adapter slot (bf16, rank r)": 2 * P,
              f"KV cache ({attn} attention layers x {seqs} sequences x {tokens:,} tokens)":
                  kv_per_token * seqs * tokens,
              f"Mamba state ({mamba} layers x {seqs} sequences)": mamba_per_seq * seqs}
    need = sum(engine.values()) / GIB
    out = {"engine_gib": {k: v / GIB for k, v in engine.items()}, "trainer_gib": {k: v / GIB for k, v in trainer.items()},
           "engine_need_gib": need, "trainer_gib_total": keep, "share": share, "card_gib": card,
           "sequences": seqs, "sequences_why": why, "tokens": tokens,
           "bytes_per_sequence": {"mamba_state": mamba_per_seq, "kv_per_token": kv_per_token}}
    if card is not None:
        use = float(cfg.gpu.max_use)
        out["engine_share_gib"] = share * card
        out["fits"] = bool(need <= share * card and share * card + keep <= use * card)
    weights = engine["bf16 base weights"] / GIB
    host = host_gib()
    out["host"] = {"weights_gib": weights, "level_1_gib": 2 * weights + HOST_MARGIN_GIB,
                   "level_2_gib": weights + HOST_MARGIN_GIB, "this_machine_gib": host}
    return out


def rollout_round(cfg: DictConfig) -> int:
    """Sequences of one rollout round: grpo.steps_per_generation x prompts_per_step x num_generations."""
    g = cfg.grpo
    return int(g.get("steps_per_generation") or 1) * int(g.prompts_per_step) * int(g.num_generations)


def rollout_seqs(cfg: DictConfig) -> int:
    """The rollout engine's `max_num_seqs` (`generation_phase`: grpo.max_num_seqs, or null: what its share holds)."""
    return int(generation_phase(cfg)["sequences"])


HOST_MARGIN_GIB = 16.0  # host memory kept free beside the weights a switch holds (the process, pinned buffers, the OS)


def host_gib() -> float | None:
    """This machine's physical memory in GiB (None where the OS does not say)."""
    import os

    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    except (ValueError, OSError, AttributeError):
        return None


def sleep_level(cfg: DictConfig, host: float | None = None, weights_gib: float | None = None) -> tuple[int, str]:
    """(the level the rollout engine sleeps at between rounds, why). Level 1 (vLLM keeps its weights in CPU memory
    while it sleeps) makes the host hold the weights twice at a switch: the engine's copy and the trainer's frozen
    base, which moves to the CPU while the engine is awake. Level 2 discards the engine's weights and reloads them
    from the model folder at each wake-up (`LLM.collective_rpc("reload_weights")`), so the host holds them once, at
    the price of reading them from disk each round. `grpo.vllm_sleep_level` chooses; null: 1 when the host holds
    twice the bf16 weights plus `HOST_MARGIN_GIB`, else 2. A LabError when it cannot hold them once."""
    level = OmegaConf.select(cfg, "grpo.vllm_sleep_level", default=None)
    if weights_gib is None:
        weights_gib = 2 * param_counts(cfg)[0] / GIB
    host = host_gib() if host is None else host
    if host is not None and host < weights_gib + HOST_MARGIN_GIB:
        raise LabError(f"grpo.rollout_backend=vllm: this machine has {host:.0f} GiB of memory; a switch between the "
                       f"trainer and the rollout engine holds the {weights_gib:.1f} GiB of bf16 weights in it at "
                       f"least once (+{HOST_MARGIN_GIB:.0f} GiB margin). Use a machine with more memory, or "
                       "grpo.rollout_backend=hf")
    if level is not None:
        return int(level), f"grpo.vllm_sleep_level={int(level)}"
    if host is None:
        return 2, "the host's memory is unknown: level 2 (the weights once on the host)"
    if host >= 2 * weights_gib + HOST_MARGIN_GIB:
        return 1, (f"the host's {host:.0f} GiB hold the {weights_gib:.1f} GiB of weights twice: level 1 (the engine "
                   "keeps its weights in CPU memory while it sleeps)")
    return 2, (f"the host's {host:.0f} GiB cannot hold the {weights_gib:.1f} GiB of weights twice: level 2 (the "
               "engine reloads its weights from the model folder at each wake-up)")


def engine_share(cfg: DictConfig) -> float:
    """The `gpu_memory_utilization` GRPO's vLLM engine is built with: `grpo.vllm_gpu_memory_utilization`, or when
    null the share `generation_phase` leaves it (needs the card's size: `gpu.memory_gib` or a CUDA device)."""
    ph = generation_phase(cfg)
    if not ph["share"]:
        raise LabError("grpo.vllm_gpu_memory_utilization=null needs the card's size (gpu.memory_gib, or a CUDA device "
                       "here): set gpu=<card> or the share itself")
    if ph["share"] <= 0:
        raise LabError(f"grpo.vllm_gpu_memory_utilization: the trainer keeps {ph['trainer_gib_total']:.1f} GiB during "
                       f"generation, more than gpu.max_use of the card leaves; use gpu.optim=adamw_bnb_8bit")
    return ph["share"]


def check_generation_fits(cfg: DictConfig) -> dict | None:
    """Before 03_grpo loads anything (`lab.plan.preflight`), with rollout_backend=vllm: the generation phase's bound
    fits the card (`generation_phase`) and the host can hold the weights at a switch (`sleep_level`); a LabError
    naming the figures otherwise. None for the hf back-end."""
    if cfg.grpo.rollout_backend != "vllm":
        return None
    ph = generation_phase(cfg)
    if ph.get("fits") is False:
        raise LabError(f"03_grpo with rollout_backend=vllm does not fit gpu={cfg.gpu.name}:\n"
                       + generation_report(ph, float(cfg.gpu.max_use))
                       + "\nlower grpo.vllm_gpu_memory_utilization (null: the rest of the card), or the trainer's "
                         "part (gpu.optim=adamw_bnb_8bit)")
    if cfg.grpo.vllm_sleep_mode:
        ph["sleep_level"] = sleep_level(cfg, weights_gib=ph["host"]["weights_gib"])
    return ph


def generation_report(ph: dict, use: float) -> str:
    lines = ["GRPO generation phase (grpo.rollout_backend=vllm), bounded from shapes (lab.plan.memory.generation_phase):",
             f"  the rollout engine decodes {ph['sequences']} sequences at once ({ph['sequences_why']})",
             f"  the engine needs at least {ph['engine_need_gib']:.1f} GiB:"]
    lines += [f"    {v:8.2f} GiB  {k}" for k, v in ph["engine_gib"].items()]
    lines.append(f"  the trainer keeps at most {ph['trainer_gib_total']:.1f} GiB on the card meanwhile:")
    lines += [f"    {v:8.2f} GiB  {k}" for k, v in ph["trainer_gib"].items()]
    h = ph["host"]
    lines.append(f"  host memory at a switch (lab.plan.memory.sleep_level): sleep level 1 holds the weights twice, "
                 f"{h['level_1_gib']:.0f} GiB with the margin; level 2 once, {h['level_2_gib']:.0f} GiB"
                 + (f"; this machine has {h['this_machine_gib']:.0f} GiB" if h["this_machine_gib"] else ""))
    if ph.get("card_gib") is not None:
        card, share = ph["card_gib"], ph["share"]
        verdict = "fits" if ph["fits"] else "does NOT fit"
        lines.append(f"  {verdict}: engine {ph['engine_need_gib']:.1f} GiB within its share grpo.vllm_gpu_memory_"
                     f"utilization {share:.2f} x {card:.1f} = {share * card:.1f} GiB, and share + trainer "
                     f"{share * card + ph['trainer_gib_total']:.1f} GiB within {use:.0%} of the card = "
                     f"{use * card:.1f} GiB")
    return "\n".join(lines)


def check_fits(cfg: DictConfig, stage: str = "sft") -> Trace | None:
    """Before loading the real model: trace one `stage` micro-step, print it, and raise `LabError` when the peak
    exceeds `gpu.max_use` of the card's memory (`gpu.check=false` prints and goes on). Does nothing for the tiny
    model (`model.build_tiny`: the CPU demo never pays for a trace). The Mamba path is the one this machine will
    take: the kernels when `mamba_ssm` and `causal_conv1d` import (`lab.model.models.missing_mamba_kernels`), else
    transformers' PyTorch scan."""
    if cfg.model.build_tiny:
        return None
    card, use = gpu_gib(cfg), float(cfg.gpu.max_use)
    if not 0 < use <= 1:
        raise LabError(f"conf/gpu: max_use={use} must be in (0, 1]")
    t = trace(cfg, stage, mamba="torch" if models.missing_mamba_kernels() else "kernel")
    print(report(t, card, use))
    if card is None:
        print("  (no gpu.memory_gib and no CUDA device: nothing to check against)")
        return t
    if t.peak_gib > use * card:
        msg = (f"{stage}: one training micro-step peaks at {t.peak_gib:.1f} GiB by the trace (lab.plan.memory), more than "
               f"gpu.max_use={use} of gpu.memory_gib={card:.1f} (gpu={cfg.gpu.name}); Mamba "
               f"path: {t.mamba_path}. "
               + ("The fused Mamba kernels (mamba_ssm, causal_conv1d) do not import here, so transformers' PyTorch "
                  "scan would run: install them (docs/real_model.md, step 2). " if "stand-in" not in t.mamba_path
                  else "")
               + "Pick the preset for your card (gpu=h100_80gb, rtx_pro_6000, h200), lower the token count, or set "
               "gpu.check=false to start anyway")
        if cfg.gpu.check:
            raise LabError(msg)
        print("WARNING: " + msg)
    return t
