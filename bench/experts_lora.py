"""Micro-benchmark: PEFT's fold vs the routed-token expert LoRA (lab.model.experts_lora), forward + backward of one
Nemotron-H experts module on CPU, plus the largest temporaries of each path (measured here, and analytic for the real
model).

    python bench/experts_lora.py [--experts 32 --hidden 512 --inter 256 --tokens 2048 --top-k 6 --rank 32]

Results on this CPU (torch 2.13 CPU, 1 thread, fp32; issue 42's prototype): E 32, H 512, I 256, T 2048: base 460 ms,
fold 779 ms, routed 689 ms (medians of 7); E 64, H 1344, I 928, T 1024: base 1.72 s, fold 7.77 s, routed 2.47 s, the
fold's largest op allocation 304.5 MiB against 31.5 MiB.

Analytic, per MoE layer and step (E experts, H hidden, I moe_intermediate, r rank, T tokens, k top-k, S = T*k routed
rows, b bytes per element of the base weights), beyond what the base experts path (no LoRA, frozen W) costs:
- fold (peft/tuners/lora/layer.py `_LoraFactorsProxy.forward`: `torch.baddbmm(W, lhs, rhs)`): per stack a new
  W' = W + s*B@A of E*I*H*b bytes, saved by the grouped matmul for its backward (W' requires grad); the backward then
  makes dW' (E*I*H*b, transient) and reduces it to dA, dB.
    largest temporary  E*I*H*b
    held for backward  2*E*I*H*b + S*(H+I)*b  (both W'; x_g and the relu2 output, which the grouped matmuls now save
                       for their weight gradient; with a frozen W transformers' path saves neither)
    extra FLOPs        2 * (6*E*I*H*r + 2*S*H*I)  (baddbmm forward and backward, dW')
- routed: per projection x_g A_e^T (S*r), scaled, then the LoRA output (S*out, transient, added in place).
    largest temporary  S*max(H, I)*b, which the base path allocates anyway (its down_proj output)
    held for backward  S*(H+I)*b + 2*S*r*b + E*r*(H+I)*b  (x_g and the relu2 output for dA; the scaled x_g A^T for
                       dB; the contiguous copies of B)
    extra FLOPs        12*S*r*(H+I)  (forward 2*S*r*(in+out) per projection, backward twice that; in+out = H+I)
- base experts forward+backward (dx only): 8*S*H*I FLOPs.
"""

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `lab`

import torch
from peft import LoraConfig, get_peft_model
from transformers import NemotronHConfig
from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHExperts

from lab.model import experts_lora as el  # noqa: E402

GiB, MiB = 2 ** 30, 2 ** 20


class Holder(torch.nn.Module):
    """`layers.0.mixer.experts`, so that the lab's target_parameters names match."""

    def __init__(self, experts):
        super().__init__()
        self.mixer = torch.nn.Module()
        self.mixer.experts = experts


def build(E, H, I, r, dtype):
    cfg = NemotronHConfig(hidden_size=H, moe_intermediate_size=I, n_routed_experts=E, mlp_hidden_act="relu2")
    cfg._experts_implementation = "grouped_mm"  # what PreTrainedModel sets by default (modeling_utils.py)
    experts = NemotronHExperts(cfg)
    with torch.no_grad():
        experts.up_proj.normal_(0, 0.02)
        experts.down_proj.normal_(0, 0.02)
    experts.to(dtype).requires_grad_(False)
    pm = get_peft_model(Holder(experts), LoraConfig(r=r, lora_alpha=r, target_modules=[], lora_dropout=0.0,
                                                    target_parameters=["mixer.experts.up_proj",
                                                                       "mixer.experts.down_proj"]))
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.02)
    return pm, pm.base_model.model.mixer.experts


def step(experts, x, idx, w, g):
    x = x.detach().requires_grad_()
    (experts(x, idx, w) * g).sum().backward()


def timed(paths, reps):
    """{name: (median, min) seconds}; the paths interleaved rep by rep (this CPU may be shared: compare like with like)."""
    ts = {name: [] for name in paths}
    for rep in range(reps + 1):
        for name, fn in paths.items():
            t = time.perf_counter()
            fn()
            if rep:  # rep 0: warm-up
                ts[name].append(time.perf_counter() - t)
    return {name: (sorted(v)[len(v) // 2], min(v)) for name, v in ts.items()}


def largest_alloc(fn):
    """Largest allocation one aten op made itself (bytes; profiler's self CPU memory), forward or backward."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return max((e.self_cpu_memory_usage for e in prof.events() if e.name.startswith("aten::")), default=0)


def saved_bytes(fn, params):
    """Bytes of non-parameter tensors autograd saves for backward during fn's forward (distinct storages)."""
    own = {p.untyped_storage().data_ptr() for p in params}
    seen = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in own:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


def analytic(E, H, I, r, T, k, b):
    """The module docstring's formulas: bytes and extra FLOPs (ratio to the base experts path) per MoE layer."""
    S = T * k
    base = 8 * S * H * I
    return {"fold largest": E * I * H * b, "fold held": 2 * E * I * H * b + S * (H + I) * b,
            "fold +flops": 2 * (6 * E * I * H * r + 2 * S * H * I) / base,
            "routed largest": S * max(I, H) * b, "routed held": S * (H + I) * b + 2 * S * r * b + E * r * (H + I) * b,
            "routed +flops": 12 * S * r * (H + I) / base}


def fmt(d, unit, name):
    return ", ".join(f"{k} {v:.0%}" if "flops" in k else f"{k} {v / unit:.3f} {name}" for k, v in d.items())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--inter", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--top-k", type=int, default=6)
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    dtype = getattr(torch, a.dtype)
    torch.manual_seed(0)
    pm, experts = build(a.experts, a.hidden, a.inter, a.rank, dtype)
    x = torch.randn(a.tokens, a.hidden, dtype=dtype)
    idx = torch.rand(a.tokens, a.experts).topk(a.top_k, dim=-1).indices
    w = torch.softmax(torch.randn(a.tokens, a.top_k), -1)
    g = torch.randn(a.tokens, a.hidden, dtype=dtype)
    run = lambda: step(experts, x, idx, w, g)  # noqa: E731

    def base():  # the same module, adapter disabled: transformers' experts forward alone (input grad only)
        with pm.disable_adapter():
            run()

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {a.dtype}; E={a.experts} H={a.hidden} "
          f"I={a.inter} T={a.tokens} k={a.top_k} r={a.rank}; forward+backward, {a.reps} interleaved reps")
    def routed():
        el.enable(pm)
        try:
            run()
        finally:
            el.disable(pm)

    paths = {"base (no LoRA)": base, "fold (PEFT)": run, "routed": routed}
    times = timed(paths, a.reps)
    params = list(pm.parameters())
    for name, fn in paths.items():
        t, big, saved = times[name], largest_alloc(fn), saved_bytes(fn, params)
        print(f"  {name:16s} median {t[0] * 1e3:8.1f} ms  min {t[1] * 1e3:8.1f} ms   largest op allocation "
              f"{big / MiB:7.2f} MiB   saved for backward (non-parameter) {saved / MiB:7.2f} MiB")
    b = torch.tensor([], dtype=dtype).element_size()
    print("analytic, these shapes:", fmt(analytic(a.experts, a.hidden, a.inter, a.rank, a.tokens, a.top_k, b), MiB, "MiB"))
    # the real model: lab/plan/nemotron_3_nano_config.json (128 experts, top-6, H 2688, I 1856, bf16,
    # 23 MoE layers in hybrid_override_pattern); T = one 8,192-token sequence (conf/sft/nemotron_nano.yaml)
    for r in (32, 16):
        real = analytic(128, 2688, 1856, r, 8192, 6, 2)
        print(f"analytic, real model (E 128, H 2688, I 1856, k 6), r={r}, T=8192, bf16, per MoE layer:",
              fmt(real, GiB, "GiB"))
    print(f"  fold W' stacks held over 23 MoE layers without gradient checkpointing: "
          f"{23 * 2 * 128 * 1856 * 2688 * 2 / GiB:.1f} GiB")

if __name__ == "__main__":
    main()
