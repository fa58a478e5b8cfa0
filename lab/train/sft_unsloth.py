"""`sft.backend=unsloth`: the model loaded and wrapped by Unsloth's own loader (`FastModel`, 16-bit LoRA), GPU only;
everything else (data, TRL's SFTTrainer, the gradient check, resume, saving) is `lab.train.sft`'s. `unsloth` is
imported only when this backend is used (`fast_model`). What is checked here instead of trusted (the targets, an
`lm_head` target refused) and the Unsloth source it rests on: docs/internals.md. Not run here: a real Unsloth run
(its tests drive it with a stand-in module).
"""

from __future__ import annotations

import sys

from omegaconf import DictConfig

from lab import LabError


def fast_model():
    """`unsloth.FastModel`, imported now; a LabError that says what to do when Unsloth cannot be used here."""
    if "unsloth" not in sys.modules and any(m in sys.modules for m in ("transformers", "trl", "peft")):
        print("WARNING: transformers/TRL/PEFT were imported before unsloth, so Unsloth patches them only in part; "
              "load the model with lab.train.sft_unsloth.load(cfg) before anything else touches them")
    try:
        import unsloth
    except Exception as e:  # ImportError, or Unsloth's own error on a machine without a GPU
        raise LabError("conf/sft: backend=unsloth needs the `unsloth` package and a CUDA GPU, and it cannot be "
                       f"imported here ({type(e).__name__}: {e}); install the GPU extra (pip install -e '.[gpu]') "
                       "on a GPU machine, or use sft.backend=hf") from None
    return unsloth.FastModel


def load(cfg: DictConfig):
    """(model, tokenizer) through `unsloth.FastModel.from_pretrained`, 16-bit LoRA."""
    import torch

    from lab.model import models

    fm = fast_model()
    model, tokenizer = fm.from_pretrained(
        model_name=models.model_path(cfg), max_seq_length=cfg.sft.max_seq_len,
        dtype=getattr(torch, cfg.model.dtype), load_in_4bit=False, load_in_8bit=False, load_in_16bit=True,
        full_finetuning=False, trust_remote_code=cfg.model.trust_remote_code,
        use_gradient_checkpointing="unsloth" if cfg.sft.get("gradient_checkpointing", True) else False,
        random_state=cfg.seed)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def check_targets(cfg: DictConfig) -> None:
    """Refuse what this backend cannot train as configured (lm_head, see the module docstring)."""
    if "lm_head" in {str(t) for t in cfg.sft.lora.targets}:
        raise LabError("conf/sft: lora.targets has lm_head with sft.backend=unsloth: Unsloth 2026.10.9 moves lm_head "
                       "to modules_to_save (a full trained copy of the head, which vLLM does not load for Nemotron-H); "
                       "use sft.backend=hf (lab.model.lora trains an lm_head LoRA) or drop lm_head from "
                       "sft.lora.targets")


def attach_lora(cfg: DictConfig, model):
    """`FastModel.get_peft_model` with the lab's targets; (peft_model, target table) or a LabError."""
    from lab.model import lora

    check_targets(cfg)
    fm = fast_model()
    config = lora.lora_config(cfg, model)  # validates rank, unknown families
    kwargs = {}
    if config.target_parameters:
        kwargs["target_parameters"] = list(config.target_parameters)
    with lora.allow_out_proj():
        pm = fm.get_peft_model(
            model, r=config.r, target_modules=sorted(config.target_modules or []), lora_alpha=config.lora_alpha,
            lora_dropout=config.lora_dropout, bias="none",
            use_gradient_checkpointing="unsloth" if cfg.sft.get("gradient_checkpointing", True) else False,
            random_state=cfg.seed, use_rslora=False, **kwargs)
    lora.guard_fused_mamba_out_proj(pm, fused=lora.fused_mamba(cfg))
    table = lora.target_table(pm)
    lora.check_table(cfg, table, backend="unsloth")
    return pm, table
