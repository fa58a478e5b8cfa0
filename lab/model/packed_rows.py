"""Packed SFT rows made exact for Nemotron-H: each packed row's Mamba state and attention start at its own first token
(`sft.packing`, `sft.packed_attention`).

TRL's padding-free packing restarts `position_ids` at 0 for every row. transformers' attention follows them, but its
Mamba-2 mixers carry conv and scan state from one row into the next. `install(model)` derives `seq_idx` from
`position_ids` in a pre-hook on the backbone and gives every mixer a forward that honours it: the fused kernels take
`seq_idx` on CUDA; elsewhere (the reference) the mixer runs once per row. `require_kernels(model)` refuses a model
that would take the per-row path on the GPU. `install(..., attention="varlen")` registers `ATTENTION`, which runs a
pack row by row (torch's `varlen_attn` on CUDA, one SDPA call per row on CPU) instead of one T x T masked call;
every other call is transformers' own sdpa. `remove()` on what `install` returns undoes both. The loss needs nothing.
The varlen kernel is CUDA only and has not run here. The pinned sources each claim was read in:
docs/internals.md, lab.model.packed_rows.
"""

from __future__ import annotations

import contextvars
import inspect
import sys
import types

import torch

from lab import LabError

ATTENTION = "lab_packed_varlen"  # the attention implementation install(attention="varlen") registers and sets
# sft.packed_attention: varlen (ATTENTION), mask (transformers' sdpa + block mask), auto: varlen here
# (lab.train.fast_paths has switched it to mask when the stage opened, where varlen_attn cannot run)
ATTENTIONS = ("auto", "varlen", "mask")
VARLEN_ATTN = None  # tests: a stand-in for torch's varlen_attn on CPU; None: torch.nn.attention.varlen.varlen_attn
_PACKED_CALL = contextvars.ContextVar("lab_packed_call", default=False)  # a packed backbone call is running
MIXER_CLASS = "NemotronHMamba2Mixer"
BACKBONE_CLASS = "NemotronHModel"
# the module-level functions NemotronHMamba2Mixer.forward calls in training, each with the mixer's **kwargs
KERNEL_FUNCTIONS = ("mamba2_split_conv1d_scan_combined", "causal_conv1d_fn", "mamba2_chunk_scan")


def seq_idx_from_position_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """(batch, seq) int32: the packed row of each token, from 0 in each batch row; a new row wherever the position
    does not grow by exactly 1 (`transformers.masking_utils.find_packed_sequence_indices`' rule, so the Mamba
    segments and the attention blocks agree)."""
    if position_ids.dim() == 1:
        position_ids = position_ids.unsqueeze(0)
    starts = torch.diff(position_ids, prepend=position_ids[:, :1] - 1, dim=-1) != 1
    return starts.cumsum(-1).to(torch.int32).contiguous()


def segments(seq_idx_row: torch.Tensor) -> list[tuple[int, int]]:
    """[(start, end)] of the runs of equal values in one row of `seq_idx`."""
    change = (torch.nonzero(seq_idx_row[1:] != seq_idx_row[:-1]).flatten() + 1).tolist()
    bounds = [0, *change, int(seq_idx_row.numel())]
    return list(zip(bounds[:-1], bounds[1:]))


def _takes_seq_idx(fn) -> bool:
    """Whether `fn(..., seq_idx=...)` hands seq_idx to the code that runs: for transformers' hub-kernel wrapper,
    whether the resolved implementation's signature names it (the wrapper drops the other keywords)."""
    while hasattr(fn, "inner"):  # lab.model.lora's _FusedScanGuard keeps the function it wraps in .inner
        fn = fn.inner
    try:
        nonlocals = inspect.getclosurevars(fn).nonlocals
    except TypeError:
        nonlocals = {}
    if "applicable_params" in nonlocals:
        return "seq_idx" in nonlocals["applicable_params"]
    try:
        return "seq_idx" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def kernel_functions_without_seq_idx(mixer) -> list[str]:
    """The kernel functions `mixer`'s forward calls that would drop `seq_idx` (empty: the kernel path is exact)."""
    module = sys.modules[type(mixer).__module__]
    return [n for n in KERNEL_FUNCTIONS if not _takes_seq_idx(getattr(module, n, None))]


def _packed_mixer_forward(self, hidden_states, cache_params=None, attention_mask=None, **kwargs):
    orig = type(self).forward
    seq_idx = kwargs.pop("seq_idx", None)
    if seq_idx is None or cache_params is not None:
        return orig(self, hidden_states, cache_params=cache_params, attention_mask=attention_mask, **kwargs)
    if getattr(self, "_packed_kernel_path", None) is None:  # resolved once: the kernel functions are module-level
        self._packed_kernel_path = not kernel_functions_without_seq_idx(self)
    if (hidden_states.is_cuda and self._packed_kernel_path) or getattr(self, "_packed_force_kernel_path", False):
        return orig(self, hidden_states, cache_params=None, attention_mask=attention_mask, seq_idx=seq_idx, **kwargs)
    rows = []  # CPU path: one mixer call per packed row, zero initial state each
    for b in range(hidden_states.shape[0]):
        parts = [orig(self, hidden_states[b:b + 1, s:e], cache_params=None,
                      attention_mask=None if attention_mask is None else attention_mask[b:b + 1, s:e], **kwargs)
                 for s, e in segments(seq_idx[b])]
        rows.append(torch.cat(parts, dim=1))
    return torch.cat(rows, dim=0)


def packed_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                             scaling: float | None = None, **kwargs):
    """`ATTENTION`'s forward (module docstring): with `seq_idx` (a packed call) each row attends to itself only, by
    torch's varlen flash kernel on CUDA (or `module._packed_force_varlen`, tests) and one causal SDPA per row
    otherwise; without it transformers' `sdpa_attention_forward`. query (B, Hq, T, D), key/value (B, Hkv, T, D);
    returns ((B, T, Hq, D), None) as transformers' attention functions do."""
    seq_idx = kwargs.get("seq_idx")
    if seq_idx is None or attention_mask is not None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    if dropout:
        raise LabError("packed attention (sft.packed_attention=varlen) has no attention dropout")
    gqa = query.shape[1] != key.shape[1]
    varlen = query.is_cuda or getattr(module, "_packed_force_varlen", False)
    rows = []
    for b in range(query.shape[0]):
        bounds = segments(seq_idx[b])
        q, k, v = (x[b].transpose(0, 1) for x in (query, key, value))  # (T, H, D), as varlen_attn takes them
        if varlen:
            fn = VARLEN_ATTN
            if fn is None:
                from torch.nn.attention.varlen import varlen_attn as fn
            cu = torch.tensor([0, *(e for _, e in bounds)], dtype=torch.int32, device=query.device)
            longest = max(e - s for s, e in bounds)
            rows.append(fn(q, k, v, cu, cu, longest, longest, scale=scaling, window_size=(-1, 0), enable_gqa=gqa))
        else:
            sdpa = torch.nn.functional.scaled_dot_product_attention
            rows.append(torch.cat([sdpa(q[s:e].transpose(0, 1), k[s:e].transpose(0, 1), v[s:e].transpose(0, 1),
                                        is_causal=True, scale=scaling, enable_gqa=gqa).transpose(0, 1)
                                   for s, e in bounds]))
    return torch.stack(rows).contiguous(), None


def _mask(*args, **kwargs):
    """`ATTENTION`'s mask: none for a packed call (the rows' bounds travel as seq_idx), else transformers' sdpa_mask."""
    if _PACKED_CALL.get():
        return None
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(*args, **kwargs)


def register_attention() -> None:
    """Register `ATTENTION` with transformers (idempotent)."""
    from transformers.masking_utils import AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface

    AttentionInterface.register(ATTENTION, packed_attention_forward)
    AttentionMaskInterface.register(ATTENTION, _mask)


def _backbone_post_hook(module, args, kwargs, output):
    token = module.__dict__.pop("_lab_packed_token", None)
    if token is not None:
        _PACKED_CALL.reset(token)
    return None


def _backbone_pre_hook(module, args, kwargs):
    if kwargs.get("past_key_values") is not None or kwargs.get("seq_idx") is not None:
        return None
    position_ids = kwargs.get("position_ids")
    if position_ids is None and len(args) > 2:  # NemotronHModel.forward(input_ids, inputs_embeds, position_ids, ...)
        position_ids = args[2]
    if position_ids is None:
        return None
    seq_idx = seq_idx_from_position_ids(position_ids)
    if not bool((seq_idx[:, -1] > 0).any()):
        return None  # one row per batch row: nothing packed
    mask = kwargs.get("attention_mask")
    if isinstance(mask, torch.Tensor):
        if mask.dim() != 2 or not bool(mask.all()):
            return None  # padding or a custom mask: not the padding-free format (transformers does not unpack it)
        kwargs["attention_mask"] = None  # all ones: dropped, else transformers skips its block-diagonal mask
    ids = kwargs.get("input_ids", args[0] if args else None)
    if seq_idx.shape[0] == 1 and ids is not None and ids.shape[0] > 1:
        seq_idx = seq_idx.expand(ids.shape[0], -1).contiguous()
    kwargs["seq_idx"] = seq_idx.to(position_ids.device)
    kwargs["use_cache"] = False
    if getattr(module.config, "_attn_implementation", None) == ATTENTION:
        module._lab_packed_token = _PACKED_CALL.set(True)  # no [T x T] mask for this call (reset by the post-hook)
    return args, kwargs


class Installed:
    """What `install` changed; `remove()` restores the model."""

    def __init__(self):
        self.hooks, self.mixers, self.backbones = [], [], []
        self.attention: list = []  # (config, the attention implementation it had)

    def remove(self) -> None:
        for h in self.hooks:
            h.remove()
        for config, impl in self.attention:
            config._attn_implementation = impl
        self.attention = []
        for m in self.mixers:
            for k in ("forward", "_packed_force_kernel_path", "_packed_kernel_path"):
                m.__dict__.pop(k, None)
        for m in self.backbones:
            m.__dict__.pop("_lab_packed_rows", None)
        self.hooks, self.mixers, self.backbones = [], [], []


def install(model, force_kernel_path: bool = False, attention: str = "mask") -> Installed:
    """Make packed rows exact for every Nemotron-H backbone in `model` (a PeftModel, the CausalLM or the backbone);
    installing twice changes nothing more. `force_kernel_path` (tests): take the kernel path on CPU too, to check
    the plumbing with stand-in kernels. `attention` (`sft.packed_attention`): "mask", transformers' sdpa with its
    block-diagonal mask; "varlen", `ATTENTION` (module docstring)."""
    if attention not in ATTENTIONS:
        raise LabError(f"sft.packed_attention={attention!r}: one of {', '.join(ATTENTIONS)}")
    attention = "varlen" if attention == "auto" else attention
    handle = Installed()
    backbones = [m for m in model.modules() if type(m).__name__ == BACKBONE_CLASS]
    if not backbones:
        raise LabError(f"sft.packing: no {BACKBONE_CLASS} in this {type(model).__name__} (lab/model/packed_rows.py "
                       "knows transformers' Nemotron-H only); packed rows would leak Mamba state: set "
                       "sft.packing=false")
    for mod in backbones:
        if not getattr(mod, "_lab_packed_rows", False):
            handle.hooks.append(mod.register_forward_pre_hook(_backbone_pre_hook, with_kwargs=True))
            handle.hooks.append(mod.register_forward_hook(_backbone_post_hook, with_kwargs=True, always_call=True))
            mod._lab_packed_rows = True
            handle.backbones.append(mod)
        if attention == "varlen" and mod.config._attn_implementation != ATTENTION:
            register_attention()
            handle.attention.append((mod.config, mod.config._attn_implementation))
            mod.config._attn_implementation = ATTENTION
    for mod in model.modules():
        if type(mod).__name__ == MIXER_CLASS and "forward" not in mod.__dict__:
            mod.forward = types.MethodType(_packed_mixer_forward, mod)
            if force_kernel_path:
                mod._packed_force_kernel_path = True
            handle.mixers.append(mod)
    return handle


def pack_tokens(cfg) -> int:
    """TRL's `max_length`: with packing the tokens of one pack (`sft.pack_tokens`, else `sft.max_seq_len`); without,
    `sft.max_seq_len` (the lab drops longer rows first, so nothing is cut either way)."""
    s = cfg.sft
    if s.packing and s.get("pack_tokens"):
        if int(s.pack_tokens) < int(s.max_seq_len):
            raise LabError(f"conf/sft: pack_tokens={s.pack_tokens} is below max_seq_len={s.max_seq_len}: a row of "
                           "max_seq_len tokens would not fit a pack (TRL's bfd packing cuts it)")
        return int(s.pack_tokens)
    return int(s.max_seq_len)


def require_kernels(model=None) -> None:
    """LabError unless packed training would take the kernel path: a CUDA device, and every kernel function the Mamba
    mixers call (those of `model`'s mixers; without a model, transformers' own modeling_nemotron_h, where the hub
    wrapper resolves them at import) takes `seq_idx`. The real model is never trained on the per-row CPU path."""
    if model is None:
        import transformers.models.nemotron_h.modeling_nemotron_h as module
        missing = [n for n in KERNEL_FUNCTIONS if not _takes_seq_idx(getattr(module, n, None))]
    else:
        mixers = [m for m in model.modules() if type(m).__name__ == MIXER_CLASS]
        dropped = {n for m in mixers for n in kernel_functions_without_seq_idx(m)}
        missing = [n for n in KERNEL_FUNCTIONS if n in dropped]
    if missing or not torch.cuda.is_available():
        why = f"{', '.join(missing)} would drop seq_idx" if missing else "there is no CUDA device"
        raise LabError("sft.packing=true with the real model needs the mamba_ssm and causal_conv1d kernels on a GPU, "
                       f"which take each packed row's boundaries (seq_idx); here {why} (transformers resolves "
                       "them when both packages import: lab/model/models.py MAMBA_KERNELS). Install the kernels, or "
                       "set sft.packing=false")
