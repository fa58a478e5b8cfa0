"""The configured model's sizes, from config alone: its config.json values, base and LoRA parameter counts (the model
built on the meta device, no weights read), the card's memory, and the bytes a trainable parameter takes in the
optimizer and in a checkpoint. The memory trace, the GRPO policies, the estimates and the output plan all start here.

The real model's shapes come from the model folder's config.json, else from the published config's values shipped with
this package (`MEASURED_MODEL`, the model the estimates were measured on), so planning needs no download.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from omegaconf import DictConfig, OmegaConf

from lab import LabError
from lab.plan.estimate_infer import MEASURED_MODEL

GIB = 1024 ** 3


def model_config_values(cfg: DictConfig) -> dict:
    """The NemotronHConfig fields of the configured model: `model.architecture` (tiny), else the model folder's
    config.json, else the published values of the measured model (`MEASURED_MODEL`)."""
    if cfg.model.architecture is not None:
        return OmegaConf.to_container(cfg.model.architecture, resolve=True)
    candidates = [Path(str(cfg.model.path)) / "config.json", MEASURED_MODEL]
    for p in candidates:
        if p.is_file():
            return json.loads(p.read_text())
    raise LabError(f"model.path={cfg.model.path}: no config.json found (looked at {', '.join(map(str, candidates))})")


def meta_model(values: Mapping[str, Any], dtype=None):
    """NemotronHForCausalLM on the meta device (every shape, no storage) from config.json values (keys that are not
    NemotronHConfig fields, such as model_type and torch_dtype, ignored)."""
    import torch
    from transformers import NemotronHConfig, NemotronHForCausalLM

    skip = ("model_type", "torch_dtype", "architectures", "auto_map")
    with torch.device("meta"):
        model = NemotronHForCausalLM(NemotronHConfig(**{k: v for k, v in values.items() if k not in skip}))
    return model.to(dtype) if dtype is not None else model


def lora_figures(cfg: DictConfig, values: Mapping[str, Any], dtype=None) -> dict:
    """The configured LoRA on the meta model: per-family table (`lab.model.lora.attach_lora`), trainable and base
    parameters."""
    from lab.model.lora import attach_lora

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


def gpu_gib(cfg: DictConfig) -> float | None:
    """The card's memory: `gpu.memory_gib`, else this machine's first CUDA device, else None."""
    if cfg.gpu.memory_gib is not None:
        return float(cfg.gpu.memory_gib)
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory / GIB
    return None


def optimizer_bytes_per_param(cfg: DictConfig) -> tuple[float, str]:
    """(bytes of optimizer state per trainable parameter, how): `gpu.optim`. 8-bit AdamW keeps two uint8 states and
    an fp32 absmax per 256 values (bitsandbytes' `Optimizer2State`; docs/internals.md, lab.plan.shapes)."""
    name = str(OmegaConf.select(cfg, "gpu.optim", default=None) or "adamw_torch_fused")
    if "8bit" in name:
        return 2 + 8 / 256, f"{name}: two uint8 states + fp32 absmax per 256 values = 2.03 B"
    if "adamw" in name or "adam" in name:
        return 8.0, f"{name}: two fp32 moments = 8 B"
    if "sgd" in name or "adafactor" in name:
        return 4.0, f"{name}: one fp32 state (upper bound) = 4 B"
    raise LabError(f"gpu.optim={name!r}: no output plan for this optimizer (lab/plan/shapes.py)")


def checkpoint_bytes(cfg: DictConfig, params: int) -> tuple[int, str]:
    """(bytes of one training checkpoint of `params` trainable parameters, how): the fp32 adapter and the optimizer's
    states (`optimizer_bytes_per_param`); the Trainer's small files (scheduler, RNG, trainer state) not counted."""
    per, how = optimizer_bytes_per_param(cfg)
    return int(params * (4 + per)), f"P x (4 B fp32 adapter + {how})"
