"""Packed rows, exact, for transformers 5.17's Nemotron-H: each packed row's Mamba state starts at its own first token.

`sft.packing=true` lets TRL 1.15 pack several rows into one micro-batch (`packing_strategy="bfd"`: best-fit
decreasing, rows kept whole; its padding-free collator concatenates them and restarts `position_ids` at 0 for every
row, with no `attention_mask`). For attention that is already exact; for the Mamba-2 mixers it is not, and this
module makes it so. Every claim below was read in the pinned sources (site-packages/...):

- Attention (transformers/masking_utils.py): with `attention_mask=None` and no cache, `_preprocess_mask_arguments`
  calls `find_packed_sequence_indices(position_ids)` (a new row wherever the position does not grow by 1) and
  `create_causal_mask` adds `packed_sequence_mask_function`: block-diagonal causal for sdpa/eager; flash attention
  switches to its varlen kernel on the same position_ids (modeling_flash_attention_utils.py `_is_packed_sequence`).
  A 2-D attention_mask, even all ones, or a cache switches that detection off.
- Mamba-2 (transformers/models/nemotron_h/modeling_nemotron_h.py): nothing derives a `seq_idx`. But
  `NemotronHModel.forward` hands its extra keyword arguments (`**kwargs`) to every `NemotronHBlock`, which hands them
  to its mixer, and `NemotronHMamba2Mixer.forward` passes them on to `mamba2_split_conv1d_scan_combined`,
  `causal_conv1d_fn` and `mamba2_chunk_scan`. Those are decorated with `use_kernel_func_from_hub_with_fallback`
  (transformers/integrations/hub_kernels.py), whose wrapper keeps only the keywords the resolved implementation
  names (`applicable_params`): mamba_ssm 2.3.2.post1's `mamba_chunk_scan_combined` / `mamba_split_conv1d_scan_combined`
  (mamba_ssm/ops/triton/ssd_combined.py) and causal-conv1d 1.7.0's `causal_conv1d_fn`
  (causal_conv1d/causal_conv1d_interface.py) take `seq_idx` (int32, (batch, seq), contiguous: csrc/causal_conv1d.cpp);
  the PyTorch fallbacks do not, and silently drop it, carrying conv and scan state from one row into the next.
- Gradient checkpointing (transformers/modeling_layers.py `GradientCheckpointingLayer.__call__`) binds the block's
  keyword arguments into the function it checkpoints, so the recomputation in backward sees the same `seq_idx`.
- The loss needs nothing: transformers' Trainer counts `labels[..., 1:] != -100` over the whole optimizer step
  (`_get_num_items_in_batch`) and TRL's `SFTTrainer.compute_loss` divides the summed NLL by that count, so a step's
  gradient is the token-weighted mean over its rows, packed or not (the collator masks each row's first label).

`install(model)`:
1. a forward pre-hook on every `NemotronHModel` (the backbone; TRL's fused LM head calls it directly) derives
   `seq_idx` from `position_ids` with `find_packed_sequence_indices`' rule, adds it to the forward's kwargs, sets
   `use_cache=False` (else `config.use_cache` builds a DynamicCache, which turns the packed mask off) and drops an
   all-ones 2-D `attention_mask`. A call with padding in its mask, a 4-D mask, a cache, or one row per batch row is
   left alone;
2. every `NemotronHMamba2Mixer` gets a forward that, given `seq_idx`:
   - kernel path: on CUDA, when the three kernel functions resolve to implementations that take `seq_idx`, runs the
     mixer unchanged and `seq_idx` reaches mamba_ssm and causal_conv1d through transformers' own kwargs;
   - CPU path (the reference, everything else): runs the mixer once per row (zero initial state) and concatenates:
     exactly what the mixer computes for each row alone. Correct anywhere, slow (one mixer call per row).
`require_kernels(model)` refuses (LabError) a model whose mixers would not take the kernel path on the GPU: the real
model is never trained on the per-row CPU path. `remove()` on what `install` returns undoes both.
"""

from __future__ import annotations

import inspect
import sys
import types

import torch

from lab import LabError

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
    return args, kwargs


class Installed:
    """What `install` changed; `remove()` restores the model."""

    def __init__(self):
        self.hooks, self.mixers, self.backbones = [], [], []

    def remove(self) -> None:
        for h in self.hooks:
            h.remove()
        for m in self.mixers:
            for k in ("forward", "_packed_force_kernel_path", "_packed_kernel_path"):
                m.__dict__.pop(k, None)
        for m in self.backbones:
            m.__dict__.pop("_lab_packed_rows", None)
        self.hooks, self.mixers, self.backbones = [], [], []


def install(model, force_kernel_path: bool = False) -> Installed:
    """Make packed rows exact for every Nemotron-H backbone in `model` (a PeftModel, the CausalLM or the backbone);
    installing twice changes nothing more. `force_kernel_path` (tests): take the kernel path on CPU too, to check
    the plumbing with stand-in kernels."""
    handle = Installed()
    backbones = [m for m in model.modules() if type(m).__name__ == BACKBONE_CLASS]
    if not backbones:
        raise LabError(f"sft.packing: no {BACKBONE_CLASS} in this {type(model).__name__} (lab/model/packed_rows.py "
                       "knows transformers' Nemotron-H only); packed rows would leak Mamba state: set "
                       "sft.packing=false")
    for mod in backbones:
        if not getattr(mod, "_lab_packed_rows", False):
            handle.hooks.append(mod.register_forward_pre_hook(_backbone_pre_hook, with_kwargs=True))
            mod._lab_packed_rows = True
            handle.backbones.append(mod)
    for mod in model.modules():
        if type(mod).__name__ == MIXER_CLASS and "forward" not in mod.__dict__:
            mod.forward = types.MethodType(_packed_mixer_forward, mod)
            if force_kernel_path:
                mod._packed_force_kernel_path = True
            handle.mixers.append(mod)
    return handle


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
