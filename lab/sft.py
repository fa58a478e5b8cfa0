"""The SFT warm-up: a LoRA adapter on solver traces, with TRL's SFTTrainer over PEFT.

What it guarantees, because each of these silently cost teams days:
- every configured LoRA target family must match something in the model, or it is an error
  that lists the families that do exist; the table of what received a LoRA (family, count,
  trainable parameters) is printed and saved before training;
- after the first optimiser step every family is checked for a non-zero gradient and for
  weights that moved; the families that did not are named;
- examples longer than the sequence budget are counted and dropped, never cut;
- the rank is at most 32 (Kaggle's vLLM `max_lora_rank`).

Module families of Nemotron-H (same names in the tiny model and the real one):
attention `q_proj/k_proj/v_proj/o_proj`, Mamba `in_proj/out_proj`, shared expert
`shared_experts.up_proj/down_proj`, routed experts `experts` (fused 3-D parameters
`experts.up_proj/down_proj`, targeted with PEFT's `target_parameters`), and `lm_head` (which
TRL 1.15's SFTTrainer refuses: it computes log-probabilities from `lm_head.weight` directly).

`out_proj`: PEFT 0.21 refuses it for Nemotron-H because the fused Mamba training kernel reads
`out_proj.weight` directly, so a LoRA there would get no gradient. The lab offers it anyway
(teams reported it as their largest single gain, and vLLM applies it at scoring): it lifts
PEFT's refusal for `out_proj` only (never `conv1d`) and the gradient check proves it trains. On
CPU the PyTorch Mamba path calls `out_proj` as a module, so its LoRA is used; with the fused
CUDA kernel installed, `lab.sft` disables that kernel for mixers whose `out_proj` has a LoRA.

Deliberately simple: one adapter, one dataset, no packing.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import pandas as pd
from omegaconf import DictConfig

from lab.config import LabError, atomic_write_csv
from lab.prompts import chat_prompt

MAX_RANK = 32

# family name -> (kind, suffix) : kind "module" matches nn.Linear names ending in suffix,
# kind "param" matches fused parameters (PEFT target_parameters) ending in suffix.
FAMILIES = {
    "q_proj": [("module", "q_proj")],
    "k_proj": [("module", "k_proj")],
    "v_proj": [("module", "v_proj")],
    "o_proj": [("module", "o_proj")],
    "in_proj": [("module", "in_proj")],
    "out_proj": [("module", "out_proj")],
    "shared_experts.up_proj": [("module", "shared_experts.up_proj")],
    "shared_experts.down_proj": [("module", "shared_experts.down_proj")],
    "experts": [("param", "mixer.experts.up_proj"), ("param", "mixer.experts.down_proj")],
    "lm_head": [("module", "lm_head")],
}


def _base(model):
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def available_families(model) -> dict[str, int]:
    """Family -> number of matching modules/parameters in `model` (families with 0 are absent)."""
    import torch.nn as nn

    base = _base(model)
    linear = [n for n, m in base.named_modules() if isinstance(m, nn.Linear)]
    params = [n for n, _ in base.named_parameters()]
    counts = {}
    for fam, rules in FAMILIES.items():
        c = 0
        for kind, suffix in rules:
            names = linear if kind == "module" else params
            c += sum(1 for n in names if n == suffix or n.endswith("." + suffix))
        counts[fam] = c
    return counts


def lora_config(cfg: DictConfig, model):
    """A PEFT LoraConfig for the configured families; unknown or unmatched families are errors."""
    from peft import LoraConfig

    lc = cfg.sft.lora
    r = int(lc.r)
    if not 1 <= r <= MAX_RANK:
        raise LabError(f"conf/sft: lora.r={r} is not allowed: Kaggle's vLLM loads LoRA rank <= {MAX_RANK}")
    avail = available_families(model)
    present = sorted(f for f, c in avail.items() if c)
    modules, params = [], []
    for fam in lc.targets:
        fam = str(fam)
        if fam not in FAMILIES:
            raise LabError(f"conf/sft: LoRA target '{fam}' is no module family of this model "
                           f"({model.config.model_type}); families that exist: {', '.join(present)}")
        if avail[fam] == 0:
            raise LabError(f"conf/sft: LoRA target '{fam}' matches no module of this model; "
                           f"families that exist: {', '.join(present)}")
        for kind, suffix in FAMILIES[fam]:
            (modules if kind == "module" else params).append(suffix)
    return LoraConfig(r=r, lora_alpha=int(lc.alpha), lora_dropout=float(lc.dropout), target_modules=modules or None,
                      target_parameters=params or None, bias="none", task_type="CAUSAL_LM")


@contextlib.contextmanager
def _allow_out_proj():
    """Lift PEFT's Mamba refusal for `out_proj` only (see the module docstring); `conv1d` stays refused."""
    import peft.tuners.tuners_utils as tu

    original = tu._check_lora_target_modules_mamba

    def check(peft_config, model, target_name):
        if target_name != "out_proj":
            original(peft_config, model, target_name)

    tu._check_lora_target_modules_mamba = check
    try:
        yield
    finally:
        tu._check_lora_target_modules_mamba = original


def _use_torch_mamba_path_for_out_proj(model) -> int:
    """Mixers whose out_proj has a LoRA must not run the fused kernel that reads out_proj.weight directly."""
    n = 0
    for name, mod in _base(model).named_modules():
        if type(mod).__name__ == "NemotronHMamba2Mixer" and hasattr(mod.out_proj, "lora_A"):
            if hasattr(mod, "mamba2_split_conv1d_scan_combined"):  # kernelized instance attribute, when present
                mod.mamba2_split_conv1d_scan_combined = lambda *a, **k: None
            n += 1
    return n


def family_of(param_name: str) -> str | None:
    """The family a LoRA parameter belongs to, from its name."""
    if "lora_" not in param_name:
        return None
    if ".experts." in param_name and "shared_experts" not in param_name:
        return "experts"
    for fam in ("shared_experts.up_proj", "shared_experts.down_proj"):
        if fam in param_name:
            return fam
    for fam in ("q_proj", "k_proj", "v_proj", "o_proj", "in_proj", "out_proj", "lm_head"):
        if f".{fam}." in param_name:
            return fam
    return "other"


def attach_lora(cfg: DictConfig, model):
    """Wrap `model` with the configured LoRA; returns (peft_model, target table)."""
    from peft import get_peft_model

    config = lora_config(cfg, model)
    with _allow_out_proj():
        pm = get_peft_model(model, config)
    _use_torch_mamba_path_for_out_proj(pm)
    return pm, target_table(pm)


def target_table(model) -> pd.DataFrame:
    """Family, number of LoRA-wrapped modules/parameters, trainable parameters."""
    rows: dict[str, dict] = {}
    for name, p in model.named_parameters():
        fam = family_of(name)
        if fam is None or not p.requires_grad:
            continue
        r = rows.setdefault(fam, {"family": fam, "tensors": 0, "trainable_params": 0})
        r["tensors"] += 1
        r["trainable_params"] += p.numel()
    df = pd.DataFrame(list(rows.values()), columns=["family", "tensors", "trainable_params"])
    df["modules"] = df["tensors"] // 2  # one lora_A and one lora_B per wrapped module or parameter
    return df[["family", "modules", "trainable_params"]].sort_values("family").reset_index(drop=True)


def sft_examples(tokenizer, puzzles: pd.DataFrame, max_seq_len: int) -> tuple[pd.DataFrame, dict]:
    """Prompt/completion pairs from solver traces whose answer the competition metric accepts.

    prompt = the exact Kaggle prompt rendered by the chat template (ends with `<think>\\n`);
    completion = the solver trace (reasoning, `</think>`, `\\boxed{answer}`) + end-of-turn token.
    Returns the examples and counts of what was kept, not solved, wrong, or too long.
    """
    from lab.metric import verify
    from lab.puzzles import solve

    rows, counts = [], {"puzzles": len(puzzles), "kept": 0, "unsolved": 0, "solver_wrong": 0, "overlong": 0}
    for _, row in puzzles.iterrows():
        sol = solve(row["prompt"])
        if sol.status != "solved":
            counts["unsolved"] += 1
            continue
        if "answer" in row and not verify(str(row["answer"]), sol.answer):
            counts["solver_wrong"] += 1
            continue
        prompt = chat_prompt(tokenizer, row["prompt"])
        completion = sol.trace + tokenizer.eos_token
        n_tok = len(tokenizer(prompt + completion, add_special_tokens=False)["input_ids"])
        if n_tok > max_seq_len:
            counts["overlong"] += 1
            continue
        rows.append({"id": row["id"], "category": row.get("category", ""), "prompt": prompt,
                     "completion": completion, "tokens": n_tok})
        counts["kept"] += 1
    return pd.DataFrame(rows), counts


class GradientCheck:
    """Records, per LoRA family, the gradient norm at the first optimiser step and whether weights moved."""

    def __init__(self, model):
        self.model = model
        self.before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
        self.grad_norm: dict[str, float] = {}

    def record_grads(self):
        if self.grad_norm:
            return
        for n, p in self.model.named_parameters():
            if p.requires_grad:
                fam = family_of(n) or "other"
                g = 0.0 if p.grad is None else float(p.grad.detach().float().norm())
                self.grad_norm[fam] = self.grad_norm.get(fam, 0.0) + g

    def report(self) -> pd.DataFrame:
        moved: dict[str, float] = {}
        for n, p in self.model.named_parameters():
            if n in self.before:
                fam = family_of(n) or "other"
                moved[fam] = moved.get(fam, 0.0) + float((p.detach() - self.before[n]).abs().sum())
        fams = sorted(set(moved) | set(self.grad_norm))
        df = pd.DataFrame({"family": fams, "grad_norm_step1": [self.grad_norm.get(f, 0.0) for f in fams],
                           "weight_change": [moved.get(f, 0.0) for f in fams]})
        df["ok"] = (df["grad_norm_step1"] > 0) & (df["weight_change"] > 0)
        return df


def _callbacks(check: GradientCheck | None, budget_min: float):
    from transformers import TrainerCallback

    class LabCallback(TrainerCallback):
        def __init__(self):
            self.t0 = time.time()

        def on_pre_optimizer_step(self, args, state, control, **kw):
            if check is not None:
                check.record_grads()

        def on_step_end(self, args, state, control, **kw):
            if budget_min and (time.time() - self.t0) / 60 >= budget_min:
                print(f"wall-clock budget of {budget_min} min reached at step {state.global_step}: saving and stopping")
                control.should_save = True
                control.should_training_stop = True
            return control

    return [LabCallback()]


def training_args(cfg: DictConfig, output_dir: Path, **extra):
    """SFTConfig from `conf/sft`; every value from the config, none from library defaults that matter."""
    import torch
    from trl import SFTConfig

    s = cfg.sft
    return SFTConfig(
        output_dir=str(output_dir), num_train_epochs=float(s.epochs), max_steps=int(s.max_steps),
        learning_rate=float(s.learning_rate), warmup_steps=float(s.warmup_ratio),
        lr_scheduler_type=str(s.lr_scheduler_type), per_device_train_batch_size=int(s.batch_size),
        gradient_accumulation_steps=int(s.grad_accum), weight_decay=float(s.weight_decay),
        logging_steps=int(s.logging_steps), save_steps=int(s.save_steps), save_total_limit=int(s.save_total_limit),
        max_length=int(s.max_seq_len), completion_only_loss=True, packing=False, seed=int(cfg.seed),
        data_seed=int(cfg.seed), report_to="none", use_cpu=not torch.cuda.is_available(),
        bf16=str(cfg.model.dtype) == "bfloat16" and torch.cuda.is_available(), dataloader_num_workers=0,
        disable_tqdm=False, save_only_model=False, **extra)


def train(cfg: DictConfig, stage, train_puzzles: pd.DataFrame, model=None, tokenizer=None) -> dict:
    """Train the SFT adapter into `cfg.sft.adapter_dir`; returns metrics (counts, loss, gradient check)."""
    from datasets import Dataset
    from transformers.trainer_utils import get_last_checkpoint
    from trl import SFTTrainer

    from lab import models, trl_cpu

    trl_cpu.install()
    if str(cfg.sft.backend) == "unsloth":
        raise LabError("conf/sft: backend=unsloth runs on GPU only, through lab.sft_unsloth (not available on this machine)")
    if "lm_head" in [str(t) for t in cfg.sft.lora.targets]:
        raise LabError("conf/sft: lora.targets has lm_head, but TRL 1.15's SFTTrainer computes log-probabilities "
                       "from lm_head.weight directly, so a LoRA there would never train; remove lm_head")
    if model is None:
        model, tokenizer = models.load(cfg)
    examples, counts = sft_examples(tokenizer, train_puzzles, int(cfg.sft.max_seq_len))
    if cfg.sft.n_train:
        examples = examples.sample(frac=1.0, random_state=int(cfg.seed)).head(int(cfg.sft.n_train))
    if examples.empty:
        raise LabError(f"{stage.dir}: no SFT examples left ({counts})")
    print(f"SFT examples: {counts}")
    atomic_write_csv(stage.path("sft_examples.csv"), examples[["id", "category", "tokens"]])

    pm, table = attach_lora(cfg, model)
    print("LoRA targets:\n" + table.to_string(index=False))
    atomic_write_csv(stage.path("lora_targets.csv"), table)

    check = GradientCheck(pm) if cfg.sft.gradient_check else None
    out = stage.path("checkpoints")
    trainer = SFTTrainer(model=pm, args=training_args(cfg, out), processing_class=tokenizer,
                         train_dataset=Dataset.from_pandas(examples[["prompt", "completion"]], preserve_index=False),
                         callbacks=_callbacks(check, float(cfg.sft.wall_clock_budget_min)))
    last = get_last_checkpoint(str(out)) if cfg.sft.resume and out.is_dir() else None
    if last:
        print(f"resuming from {last}")
    result = trainer.train(resume_from_checkpoint=last)
    adapter_dir = Path(str(cfg.sft.adapter_dir))
    save_adapter(pm, adapter_dir)
    log = pd.DataFrame([h for h in trainer.state.log_history if "loss" in h])
    atomic_write_csv(stage.path("train_log.csv"), log)
    metrics = {"examples": counts, "train_loss": float(result.training_loss), "steps": int(trainer.state.global_step),
               "trainable_params": int(table["trainable_params"].sum()),
               "lora_targets": dict(zip(table["family"], table["modules"].astype(int)))}
    if check is not None:
        rep = check.report()
        atomic_write_csv(stage.path("gradient_check.csv"), rep)
        bad = rep.loc[~rep["ok"], "family"].tolist()
        if bad:
            print(f"WARNING: LoRA families with no gradient or no weight change: {', '.join(bad)}")
        metrics["gradient_check_failed"] = bad
    return metrics, pm, tokenizer, log


def save_adapter(model, adapter_dir: Path) -> Path:
    """Save only the LoRA weights (never full embedding/lm_head copies), atomically (temp folder + rename)."""
    import os
    import shutil
    import tempfile

    adapter_dir = Path(adapter_dir)
    adapter_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=adapter_dir.parent, prefix=f".{adapter_dir.name}."))
    try:
        model.save_pretrained(str(tmp), save_embedding_layers=False)
        if adapter_dir.exists():
            shutil.rmtree(adapter_dir)
        os.replace(tmp, adapter_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return adapter_dir
