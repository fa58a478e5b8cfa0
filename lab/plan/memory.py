"""One training micro-step of the composed config traced on PyTorch fake tensors: its peak GPU memory, counted, not
estimated. `python -m lab memory` prints it; `check_fits(cfg, stage)` runs it before 02_sft and 03_grpo load the real
model and refuses a step whose peak exceeds `gpu.max_use` of the card.

The step is a real forward, backward and optimizer step of `NemotronHForCausalLM` with the configured LoRA, on tensors
that have shapes and no data; `LiveBytes` counts every live storage. Kernels with no CPU path (mamba_ssm's chunk scan,
causal_conv1d, TRL's Triton log-prob head, bitsandbytes' 8-bit AdamW) are replaced by stand-ins that allocate and save
what the real kernels do. Their sources, the [T x T] mask pitfall and what the trace simplifies: docs/internals.md,
lab.plan.memory.
"""

from __future__ import annotations

import inspect
import math
import time
import weakref
from collections import defaultdict
from contextlib import nullcontext
from dataclasses import dataclass
from unittest import mock

import torch
from omegaconf import DictConfig
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from lab import LabError
from lab.model import models  # models.missing_mamba_kernels read at call time (tests stand in for it)
from lab.model.lora import _base, head_as_linear, head_lora
from lab.model.torch_logprob import TorchLogProbFunction
from lab.plan.autocast_rules import cuda_autocast_rules
from lab.plan.grpo_policy import micro_batch
from lab.plan.shapes import GIB, gpu_gib, lora_figures, model_config_values


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
    """Allocates and saves what `mamba_ssm`'s `MambaChunkScanCombinedFn` does (docs/internals.md); no math."""

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
    """Allocates and saves what `causal_conv1d`'s `CausalConv1dFn` does (docs/internals.md); no math."""

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
    """Allocates and saves what TRL's Triton `ChunkedLogProbFunction` does (docs/internals.md); no math."""

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
    [T x T] mask pitfall, docs/internals.md, lab.plan.memory)."""
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
    (`lab.model.lora.head_as_linear`) when the head carries one: every position labelled (an upper bound:
    docs/internals.md)."""
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
    if name == "adamw_bnb_8bit":  # Optimizer2State.init_state; its update is in place
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


def step_shape(cfg: DictConfig, stage: str, tokens: int | None = None, rows: int | None = None
               ) -> tuple[int, int, bool]:
    """(rows, tokens per row, gradient checkpointing) of one training micro-step of `stage`: SFT's batch of
    `sft.max_seq_len` (with packing, of `sft.pack_tokens`), GRPO's micro-batch as the trainer gets it (`micro_batch`)
    of `model.max_model_len`; `tokens` and `rows` override them."""
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
    """Run one training micro-step of `stage` and count its live storage bytes (docs/internals.md, lab.plan.memory).

    `mamba`: kernel (the `mamba_ssm`/`causal_conv1d` stand-ins), torch (transformers' PyTorch path) or real (the
    installed kernels, CUDA); `head`: chunked (TRL's Triton head stand-in), torch (`lab.model.torch_logprob`) or triton
    (TRL's kernel, CUDA); `fake=False` runs the same step on real tensors (the test that the fake count is right);
    `device="cuda"` (with `fake=False`) runs it on the GPU and also records the allocator's peak
    (`bench/gpu_memory.py`: traced against measured); `unpacked=False` leaves transformers' packed-row detection
    alone (the [T x T] pitfall test, docs/internals.md, lab.plan.memory)."""
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
                backbone = pm.base_model.model.model
                hidden = backbone(input_ids=ids, attention_mask=None, use_cache=False).last_hidden_state
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


# ---- the report and the check before training ---------------------------------------------------------------------

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
        msg = (f"{stage}: one training micro-step peaks at {t.peak_gib:.1f} GiB by the trace (lab.plan.memory), more "
               f"than gpu.max_use={use} of gpu.memory_gib={card:.1f} (gpu={cfg.gpu.name}); Mamba "
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
