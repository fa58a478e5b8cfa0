"""`sft.backend=unsloth`: the model is loaded and wrapped by Unsloth's own loader, GPU only.

Unsloth 2026.10.9 (read from its wheel, `unsloth/models/loader.py`): `FastLanguageModel.from_pretrained` has
dedicated paths only for Llama-family model types and hands every other type, `nemotron_h` included, to
`FastModel.from_pretrained`, which is where Nemotron-H's setup lives (it registers float32 Triton precision for
the Mamba-2 kernels). So the lab calls `FastModel` directly: `FastModel.from_pretrained` (16-bit LoRA: no 4-bit,
no 8-bit, no full fine-tuning) and `FastModel.get_peft_model`. Everything else (the data, TRL's SFTTrainer, the
gradient check, resume, saving) is `lab.train.sft`'s, unchanged.

`unsloth` is imported only when this backend is used (`fast_model()`), never at import time of the lab. Unsloth
patches transformers, TRL and PEFT when it is imported and warns when they were imported before it;
`lab.train.sft.train` loads through here (in 02_sft, `lab.recipes.sft.sft`, after the base
model's evaluation, which has imported transformers already).

Checked here instead of trusted:
- Unsloth's default targets are Llama's (`gate_proj`, ...): Nemotron-H has no `gate_proj`, and its routed experts
  are fused 3-D parameters (`mixer.experts.up_proj/down_proj`) reachable only through PEFT's `target_parameters`,
  which `FastModel.get_peft_model` accepts (`unsloth/models/vision.py`). The lab passes its own
  `target_modules` / `target_parameters` (from `lab.model.lora.lora_config`), and after wrapping the target table must
  show trainable LoRA parameters for every configured family, else a LabError lists what did get a LoRA.
- `lm_head`: `FastModel.get_peft_model` moves `lm_head` from `target_modules` to `modules_to_save`
  (`_redirect_embedding_targets` in `unsloth/models/vision.py`): a full trained copy of the head, which vLLM 0.33
  does not load for Nemotron-H. So an `lm_head` target with this backend is refused; use `sft.backend=hf`
  (lab.model.lora trains the head's LoRA) or drop `lm_head`.
- Unsloth may write its own fields into adapter_config.json; `lab.model.submission.pack` keeps only standard PEFT
  LoraConfig fields.
- `out_proj` of the Mamba mixers: `lab.model.lora`'s fused-kernel guard is applied after wrapping, and the gradient check
  shows whether out_proj trained.

What it simplifies:
1. 16-bit LoRA only (no 4-bit, no 8-bit, no full fine-tuning), through `FastModel` directly.
2. Only loading and wrapping are Unsloth's; training, checks and saving stay `lab.train.sft`'s.

Not verified here (no GPU, no Unsloth in the CPU environment): a real Unsloth run. tests/test_sft_unsloth.py drives
this module with a stand-in `unsloth` module that records what it is given.
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
                       "use sft.backend=hf (lab.model.lora trains an lm_head LoRA) or drop lm_head from sft.lora.targets")


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
