"""The real model's shapes under the configured LoRA, and an estimate of one SFT step's GPU memory, without weights.

`meta_model(config)` builds `NemotronHForCausalLM` on PyTorch's meta device (shapes only: no weights, no memory)
from a `config.json` mapping or a config object. `lora_figures(cfg, config)` attaches the configured LoRA to it
with `lab.lora.attach_lora` (so every target family must match, exactly as in training) and returns the
trainable parameters per family, the base parameters and the adapter's size. `sft_step_memory(cfg, config)`
adds up an estimate of one SFT step's peak memory on one GPU at `sft.max_seq_len` tokens, term by term:

- weights: every base parameter in `model.dtype`;
- LoRA training state: each trainable parameter in fp32 (PEFT keeps adapters in fp32 beside bf16 weights),
  its fp32 gradient and AdamW's two fp32 moments: 16 bytes per parameter;
- activations with gradient checkpointing: each decoder layer's input kept (tokens x hidden, bf16), plus the
  working set of the largest layer while it is recomputed and back-propagated: its main intermediates and their
  gradients. For an MoE layer this includes the routed experts' merged weights: PEFT's `ParamWrapper` folds
  `W + s*B*A` for the whole expert stack into one tensor on every forward (`_LoraFactorsProxy`,
  `peft/tuners/lora/layer.py`), and backward needs its gradient of the same size;
- the output head: with an lm_head LoRA, lab.lora's `[vocab, hidden + r]` head copy and TRL's fp32 weight
  gradient for it (`trl/kernels/chunked_logprob.py`), plus one logits tile (4,096 tokens x 32,768 vocabulary,
  fp32, the kernel's tiles);
- a fixed allowance for the CUDA context and allocator fragmentation (`CONTEXT_GIB`, an assumption).

It is an estimate from shapes, not a measurement; `report` says so. What it simplifies: the figures for the
30B model (README, "Real model: shapes and memory") come from the same code path as training, on any machine.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from omegaconf import DictConfig

GIB = 1024 ** 3
CONTEXT_GIB = 2.0           # CUDA context, cuBLAS workspaces, allocator fragmentation: an allowance, not measured
LOGIT_TILE = (4096, 32768)  # TRL's ChunkedLogProbFunction tile: TOKEN_CHUNK_SIZE x chunk_size (fp32)


def nemotron_config(config: Mapping[str, Any] | Any):
    """A NemotronHConfig from a config.json mapping (extra keys such as model_type and torch_dtype ignored)."""
    from transformers import NemotronHConfig

    if not isinstance(config, Mapping):
        return config
    d = {k: v for k, v in config.items() if k not in ("model_type", "torch_dtype", "architectures", "auto_map")}
    return NemotronHConfig(**d)


def load_config_values(path: str | Path) -> dict:
    return json.loads(Path(path).read_text())


def meta_model(config):
    """NemotronHForCausalLM with the given config on the meta device: every shape, no storage."""
    import torch
    from transformers import NemotronHForCausalLM

    with torch.device("meta"):
        return NemotronHForCausalLM(nemotron_config(config))


def lora_figures(cfg: DictConfig, config) -> dict:
    """The configured LoRA on the meta model: per-family table, trainable and base parameters, adapter MB."""
    from lab.lora import attach_lora

    model = meta_model(config)
    base_params = sum(p.numel() for p in model.parameters())
    pm, table = attach_lora(cfg, model)
    trainable = int(table["trainable_params"].sum())
    return {"table": table, "model": pm, "base_params": base_params, "trainable_params": trainable,
            "adapter_mb_fp32": trainable * 4 / 1e6, "adapter_mb_bf16": trainable * 2 / 1e6}


def _layer_working_set(c, tokens: int, r: int, lora_experts: bool) -> dict[str, int]:
    """Bytes of the main intermediates of one layer of each kind (forward, bf16) while it is recomputed, times 2
    for their gradients; the routed experts' merged weights and their gradients on top for an MoE layer."""
    b = 2
    d = c.hidden_size
    inner = c.mamba_num_heads * c.mamba_head_dim
    groups_state = 2 * c.n_groups * c.ssm_state_size
    mamba = tokens * ((2 * inner + groups_state + c.mamba_num_heads)  # in_proj output
                      + (inner + groups_state)                        # conv output
                      + 2 * inner) * b                                # scan output, gated norm output
    mamba += (tokens // c.chunk_size + 1) * c.mamba_num_heads * c.mamba_head_dim * c.ssm_state_size * 4  # chunk states, fp32
    attn = tokens * (2 * c.num_attention_heads * c.head_dim + 2 * c.num_key_value_heads * c.head_dim) * b
    k, inter, shared = c.num_experts_per_tok, c.moe_intermediate_size, c.moe_shared_expert_intermediate_size
    moe = tokens * (k * (2 * d + 2 * inter) + 2 * shared) * b + tokens * c.n_routed_experts * 4  # + router fp32
    out = {"mamba": 2 * mamba, "attention": 2 * attn, "moe": 2 * moe}
    if lora_experts:
        out["moe"] += 2 * (2 * c.n_routed_experts * inter * d * b)  # merged up/down stacks + their gradients
    return out


def sft_step_memory(cfg: DictConfig, config, figures: dict | None = None) -> dict:
    """Estimated peak GPU memory (GiB) of one SFT step at `sft.max_seq_len` tokens, batch `sft.batch_size`."""
    import torch

    c = nemotron_config(config)
    figures = figures or lora_figures(cfg, config)
    tokens = cfg.sft.max_seq_len * cfg.sft.batch_size
    r = cfg.sft.lora.r
    targets = {str(t) for t in cfg.sft.lora.targets}
    wbytes = torch.empty(0, dtype=getattr(torch, cfg.model.dtype)).element_size()
    checkpointing = cfg.sft.get("gradient_checkpointing", True)
    n_layers = len(c.layers_block_type)
    work = _layer_working_set(c, tokens, r, "experts" in targets)
    layer_inputs = n_layers * tokens * c.hidden_size * 2
    if checkpointing:
        activations = layer_inputs + max(work.values())
    else:  # every layer keeps its working set (without the transient merged expert weights' gradients)
        kinds = {"mamba": "mamba", "linear_attention": "mamba", "attention": "attention",
                 "full_attention": "attention", "moe": "moe"}
        activations = layer_inputs + sum(work[kinds.get(t, "moe")] // 2 for t in c.layers_block_type)
    head = LOGIT_TILE[0] * LOGIT_TILE[1] * 4 + tokens * (c.hidden_size + r) * 2 * 2
    if "lm_head" in targets:
        head += c.vocab_size * (c.hidden_size + r) * (2 + 4 + 2)  # head copy (bf16), fp32 gradient, its bf16 cast
    terms = {"weights": figures["base_params"] * wbytes,
             "lora_params_grads_adamw": figures["trainable_params"] * 16,
             "activations": activations, "output_head": head, "cuda_context_allowance": int(CONTEXT_GIB * GIB)}
    gib = {k: v / GIB for k, v in terms.items()}
    gib["total"] = sum(gib.values())
    gib["largest_layer_working_set"] = {k: v / GIB for k, v in work.items()}
    gib["tokens"] = tokens
    gib["gradient_checkpointing"] = checkpointing
    return gib


def report(cfg: DictConfig, config, gpu_gib: float | None = None) -> str:
    """The LoRA table, parameter counts, adapter size and the memory estimate as text (02_sft prints it), against
    `gpu_gib` (default: this machine's first GPU, else 80)."""
    import torch

    if gpu_gib is None:
        gpu_gib = torch.cuda.get_device_properties(0).total_memory / GIB if torch.cuda.is_available() else 80.0
    fig = lora_figures(cfg, config)
    mem = sft_step_memory(cfg, config, fig)
    lines = ["LoRA on the model's shapes (meta device, no weights):", fig["table"].to_string(index=False),
             f"base parameters {fig['base_params']:,}; trainable {fig['trainable_params']:,} "
             f"({100 * fig['trainable_params'] / fig['base_params']:.2f}%); adapter {fig['adapter_mb_fp32']:,.1f} MB "
             f"in fp32 as saved, {fig['adapter_mb_bf16']:,.1f} MB in bf16",
             f"Estimated peak GPU memory of one SFT step, {mem['tokens']:,} tokens, gradient checkpointing "
             f"{'on' if mem['gradient_checkpointing'] else 'off'} (an estimate from shapes, not a measurement):"]
    for k in ("weights", "lora_params_grads_adamw", "activations", "output_head", "cuda_context_allowance"):
        lines.append(f"  {k:<26} {mem[k]:7.2f} GiB")
    verdict = "fits" if mem["total"] <= gpu_gib else "WARNING: does NOT fit"
    lines.append(f"  {'total':<26} {mem['total']:7.2f} GiB: {verdict} one {gpu_gib:.0f} GiB GPU")
    return "\n".join(lines)
