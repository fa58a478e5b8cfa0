"""The routed experts' LoRA on routed tokens only, instead of PEFT's fold (`sft.lora.experts_path`).

PEFT trains a LoRA on a stacked expert parameter by building `W + s*B@A` for every expert at every forward (1.28 GB
in bf16 per projection of the real model, kept for backward); the tokens routed to expert e need only
`x_e W_e^T + s (x_e A_e^T) B_e^T`. `enable(model)` replaces the forward of PEFT's outermost ParamWrapper on each
experts module with `_routed_forward`, which reads PEFT's own `lora_A/lora_B`: the trainable parameters, the state
dict, the saved adapter, pack, check and the vLLM lane are unchanged. Disabled or merged adapters fall through to
PEFT's forward; `disable(model)` gives PEFT's fold back. The trap to keep in mind: in PEFT's layout the expert index
varies fastest in `lora_B` (`B_e = w[:, e::E]`).
The library source each step rests on, what is refused, the cost per MoE layer: docs/internals.md,
lab.model.experts_lora.
"""

from __future__ import annotations

import types

from lab import LabError

PARAMS = ("up_proj", "down_proj")  # NemotronHExperts.__init__ (modeling_nemotron_h.py)
PATHS = ("routed", "fold")         # sft.lora.experts_path (lab/core/schema.py ExpertsPath)


def _chain(wrapper):
    """The nested ParamWrappers (PEFT nests one per targeted parameter) and the experts module under them."""
    from peft.tuners.lora.layer import ParamWrapper

    chain, m = [], wrapper
    while isinstance(m, ParamWrapper):
        chain.append(m)
        m = m.base_layer
    return chain, m


def is_nemotron_experts(m) -> bool:
    # `use_experts_implementation(has_gate=False)` sets these on NemotronHExperts (transformers/integrations/moe.py)
    return (type(m).__name__ == "NemotronHExperts" and not getattr(m, "has_gate", True)
            and not getattr(m, "has_bias", True) and not getattr(m, "is_transposed", True))


def expert_factors(w, adapter: str):
    """(A (E, r, in), B (E, out, r), s) of one ParamWrapper in the base stack's dtype; PEFT's layout (docstring)."""
    E = w.num_experts
    a, b = w.lora_A[adapter].weight, w.lora_B[adapter].weight
    A = a.reshape(E, -1, a.shape[-1])
    B = b.reshape(b.shape[0], -1, E).permute(2, 0, 1).contiguous()  # grouped_mm refuses the permuted view's strides
    dtype = w.get_param().dtype
    return A.to(dtype), B.to(dtype), w.scaling[adapter]


def _lora_terms(chain) -> dict:
    """{parameter name: (A, B, s)} for the single active adapter of each wrapper that has one."""
    import torch

    terms = {}
    for w in chain:
        active = [a for a in w.active_adapters if a in w.lora_A]
        if len(active) > 1:
            raise LabError(f"routed expert LoRA: {len(active)} active adapters {active} on experts.{w.parameter_name}; "
                           "only one is supported (sft.lora.experts_path=fold uses PEFT's fold)")
        if active:
            if not isinstance(w.lora_dropout[active[0]], torch.nn.Identity):
                raise LabError("routed expert LoRA: lora_dropout > 0 is not supported (PEFT's ParamWrapper refuses it)")
            terms[w.parameter_name] = expert_factors(w, active[0])
    return terms


def _grouped_lora(x, A, B, s, offs):
    """s * (x_e A_e^T) B_e^T on each expert's rows of the expert-sorted `x` (offs: cumulative row counts)."""
    import torch
    from transformers.integrations import moe as hf_moe

    def glinear(x, w):  # w: (E, out, in)
        if all(d * w.element_size() % 16 == 0 for d in w.shape[1:]):  # grouped_mm's stride alignment
            return hf_moe._grouped_linear(x, w, offs)
        return torch.ops.transformers.grouped_mm_fallback(x.to(w.dtype), w.transpose(-2, -1), offs)
    return glinear(glinear(x, A) * s, B)  # scale the (rows, r) tensor, not the (rows, out) one


def _grouped(experts, x, top_k_index, top_k_weights, lora):
    """transformers/integrations/moe.py `grouped_mm_experts_forward` (5.17), step by step, plus the LoRA (marked)."""
    import torch
    from transformers.integrations import moe as hf_moe

    E, k, T = experts.num_experts, top_k_index.size(-1), x.size(0)
    ids_g, perm = torch.sort(top_k_index.reshape(-1))
    x_g = x[perm // k]
    weights_g = top_k_weights.reshape(-1)[perm]
    histc_input = ids_g.float() if x.device.type in ("cpu", "mps") else ids_g.int()
    offs = torch.cumsum(torch.histc(histc_input, bins=E, min=0, max=E - 1), dim=0, dtype=torch.int32)
    sentinel = (ids_g >= E).unsqueeze(-1)  # expert-parallel sentinels, zeroed as transformers does
    x_g.masked_fill_(sentinel, 0.0)
    # in-place adds on the grouped matmul outputs (grouped_mm saves its inputs, not its output): one (rows, out)
    # temporary fewer per projection
    h = hf_moe._grouped_linear(x_g, experts.up_proj, offs)
    if "up_proj" in lora:
        h.add_(_grouped_lora(x_g, *lora["up_proj"], offs))        # LoRA, before the activation
    h = experts.act_fn(h.masked_fill(sentinel, 0.0))
    y = hf_moe._grouped_linear(h, experts.down_proj, offs)
    if "down_proj" in lora:
        y.add_(_grouped_lora(h, *lora["down_proj"], offs))        # LoRA, after the activation
    y = y.masked_fill(sentinel, 0.0) * weights_g.unsqueeze(-1)
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.size(0), device=x.device)
    return y[inv].view(T, k, -1).sum(dim=1).to(x.dtype)


def _eager(experts, x, top_k_index, top_k_weights, lora):
    """NemotronHExperts.forward (modeling_nemotron_h.py, "eager") plus the LoRA terms (marked)."""
    import torch
    import torch.nn.functional as F

    out = torch.zeros_like(x, dtype=top_k_weights.dtype)
    with torch.no_grad():
        mask = F.one_hot(top_k_index, num_classes=experts.num_experts).permute(2, 1, 0)
        hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero().squeeze(-1)
    for e in hit.tolist():
        pos, tok = torch.where(mask[e])
        xe = x[tok]
        h = F.linear(xe, experts.up_proj[e])
        if "up_proj" in lora:
            A, B, s = lora["up_proj"]
            h = h + F.linear(F.linear(xe.to(A.dtype), A[e]) * s, B[e])  # LoRA
        h = experts.act_fn(h)
        y = F.linear(h, experts.down_proj[e])
        if "down_proj" in lora:
            A, B, s = lora["down_proj"]
            y = y + F.linear(F.linear(h.to(A.dtype), A[e]) * s, B[e])   # LoRA
        out.index_add_(0, tok, (y * top_k_weights[tok, pos, None]).to(out.dtype))
    return out.to(x.dtype)


IMPLEMENTATIONS = {"grouped_mm": _grouped, "eager": _eager}


def _routed_forward(self, hidden_states, top_k_index, top_k_weights, *args, **kwargs):
    """The outermost ParamWrapper's forward on the routed path (bound to the instance by `enable`)."""
    from peft.tuners.lora.layer import ParamWrapper

    chain, experts = _chain(self)
    if kwargs.get("adapter_names") is not None:
        raise LabError("routed expert LoRA: mixed-adapter batches (adapter_names=) are not supported")
    if any(w.disable_adapters or w.merged for w in chain):  # PEFT's own path: the base layer or merged weights
        return ParamWrapper.forward(self, hidden_states, top_k_index, top_k_weights, *args, **kwargs)
    if args or kwargs:
        raise LabError(f"routed expert LoRA: unexpected experts arguments {args} {list(kwargs)}")
    impl = experts.config._experts_implementation
    if impl not in IMPLEMENTATIONS:
        raise LabError(f"routed expert LoRA: experts_implementation={impl!r} is not supported (only "
                       f"{sorted(IMPLEMENTATIONS)}); sft.lora.experts_path=fold uses PEFT's fold")
    return IMPLEMENTATIONS[impl](experts, hidden_states, top_k_index, top_k_weights, _lora_terms(chain))


def expert_wrappers(model) -> list:
    """The outermost PEFT ParamWrapper on each Nemotron-H experts module of `model`."""
    from peft.tuners.lora.layer import ParamWrapper

    wrappers = [m for m in model.modules() if isinstance(m, ParamWrapper)]
    inner = {id(w.base_layer) for w in wrappers}
    return [w for w in wrappers if id(w) not in inner and is_nemotron_experts(_chain(w)[1])]


def enable(model) -> int:
    """Put every Nemotron-H experts module carrying PEFT ParamWrappers on the routed path; returns how many."""
    outer = expert_wrappers(model)
    for w in outer:
        chain, experts = _chain(w)
        names = [c.parameter_name for c in chain]
        if len(names) != len(set(names)) or not set(names) <= set(PARAMS):
            raise LabError(f"routed expert LoRA: targeted experts parameters {names}; only {PARAMS}")
        if any(not c._did_swap_in_out_features or c.num_experts != experts.num_experts for c in chain):
            raise LabError("routed expert LoRA: expected PEFT's (E, out, in) layout of the experts' stacks")
        w.forward = types.MethodType(_routed_forward, w)  # on the instance: the class's forward stays PEFT's
    return len(outer)


def disable(model) -> int:
    """Give every switched experts module PEFT's forward (the fold) back; returns how many were switched."""
    n = 0
    for w in expert_wrappers(model):
        if "forward" in w.__dict__:
            del w.forward
            n += 1
    return n


def path_of(model) -> str:
    """"routed" or "fold" (the experts carry a LoRA), or "none" (they carry none)."""
    outer = expert_wrappers(model)
    if not outer:
        return "none"
    return "routed" if all("forward" in w.__dict__ for w in outer) else "fold"


def apply(path: str, model) -> tuple[str, int]:
    """Switch `model`'s experts LoRA to `path` (routed | fold); checks that every experts module of the model that
    carries a LoRA was switched and returns (path taken, MoE layers with an experts LoRA)."""
    path = "routed" if path == "auto" else path  # lab.train.fast_paths switched a failed calibration to fold
    if path not in PATHS:
        raise LabError(f"sft.lora.experts_path={path!r}: must be one of auto, {', '.join(PATHS)}")
    expected = sum(is_nemotron_experts(m) for m in model.modules()) if expert_wrappers(model) else 0
    if path == "routed":
        n = enable(model)
    else:
        disable(model)
        n = len(expert_wrappers(model))
    if n != expected or (expected and path_of(model) != path):
        raise LabError(f"experts LoRA: {n} of {expected} Nemotron-H MoE layers carry an experts LoRA on the {path} "
                       "path; every MoE layer's experts module should (lab.model.experts_lora)")
    return (path if n else "none"), n
