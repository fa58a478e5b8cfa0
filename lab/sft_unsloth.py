"""`sft.backend=unsloth`: a thin adapter over Unsloth's documented API, GPU only.

Loading and LoRA wrapping go through `FastLanguageModel.from_pretrained` and
`FastLanguageModel.get_peft_model`; everything else (the data, TRL's SFTTrainer, the gradient
check, resume, saving) is `lab.sft`'s, unchanged. This module is imported only when that backend
is chosen, and it imports `unsloth` first thing, because Unsloth patches transformers, TRL and
PEFT at import time and warns (or patches only partly) when they were imported before it. In a
notebook that uses this backend, `import lab.sft_unsloth` in the first cell.

Known pitfalls with MoE models such as Nemotron-H, checked here instead of trusted:
- Unsloth's default target list is Llama's (`gate_proj`, `up_proj`, ...): Nemotron-H has no
  `gate_proj`, and `up_proj/down_proj` as module names only reach the SHARED expert. The routed
  experts are fused 3-D parameters (`mixer.experts.up_proj/down_proj`) reachable only through
  PEFT's `target_parameters`; Unsloth's automatic MoE detection looks for `mlp.experts.gate_up_proj`,
  which Nemotron-H does not have (Nemotron-H puts everything under `mixer`). We pass the lab's
  own `target_modules` / `target_parameters` (from `lab.sft.lora_config`) explicitly, and after
  `get_peft_model` the target table must show trainable LoRA parameters for every configured
  family, else a LabError lists what did get a LoRA.
- An `lm_head` LoRA is dropped (Unsloth trains lm_head only through `modules_to_save`) and TRL
  refuses it anyway: `lab.sft.check_targets` rejects it before we get here.
- Unsloth may write its own fields into adapter_config.json; `lab.submission.pack` keeps only
  standard PEFT LoraConfig fields.
- `out_proj` of the Mamba mixers: Unsloth may install its own fused kernels; `lab.sft`'s guard
  is applied after wrapping, and the gradient check shows whether out_proj trained.

Not verified here (no GPU, no Unsloth in the CPU environment): whether the pinned Unsloth
version forwards `target_parameters` to PEFT (it accepts `**kwargs`); the trainable-parameter
check above is what catches it if not.
"""

from __future__ import annotations

from omegaconf import DictConfig

from lab.config import LabError

try:  # must run before transformers / trl / peft are imported, so Unsloth's patches apply
    import unsloth  # noqa: F401
    from unsloth import FastLanguageModel

    _IMPORT_ERROR: BaseException | None = None
except Exception as e:  # ImportError, or Unsloth's own error on a machine without a GPU
    FastLanguageModel = None
    _IMPORT_ERROR = e


def require() -> None:
    """A clear error when Unsloth cannot be used on this machine."""
    if _IMPORT_ERROR is not None:
        raise LabError("conf/sft: backend=unsloth needs the `unsloth` package and a CUDA GPU, and it cannot be "
                       f"imported here ({type(_IMPORT_ERROR).__name__}: {_IMPORT_ERROR}); install the GPU extra "
                       "(pip install -e '.[gpu]') on a GPU machine, or use sft.backend=hf")


def load(cfg: DictConfig):
    """(model, tokenizer) through `FastLanguageModel.from_pretrained`, 16-bit LoRA (no 4-bit)."""
    import torch

    from lab import models

    require()
    model, tokenizer = FastLanguageModel.from_pretrained(
        model_name=models.model_path(cfg), max_seq_length=int(cfg.sft.max_seq_len),
        dtype=getattr(torch, str(cfg.model.dtype)), load_in_4bit=False,
        trust_remote_code=bool(cfg.model.trust_remote_code))
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def attach_lora(cfg: DictConfig, model):
    """`FastLanguageModel.get_peft_model` with the lab's targets; (peft_model, target table) or a LabError."""
    from lab import sft

    require()
    config = sft.lora_config(cfg, model)  # validates rank, lm_head, unknown families
    kwargs = {}
    if config.target_parameters:
        kwargs["target_parameters"] = list(config.target_parameters)
    with sft._allow_out_proj():
        pm = FastLanguageModel.get_peft_model(
            model, r=config.r, target_modules=sorted(config.target_modules or []), lora_alpha=config.lora_alpha,
            lora_dropout=config.lora_dropout, bias="none", use_gradient_checkpointing="unsloth",
            random_state=int(cfg.seed), use_rslora=False, loftq_config=None, **kwargs)
    sft.guard_fused_mamba_out_proj(pm)
    table = sft.target_table(pm)
    sft.check_table(cfg, table, backend="unsloth")
    return pm, table
