"""The SFT warm-up: a LoRA adapter on solver traces, with TRL's SFTTrainer over PEFT.

What it guarantees, because each of these silently cost teams days (each has a test in
tests/test_sft.py on the tiny model):
- the LoRA is `lab.model.lora`'s: every configured target family must match, the rank is at most Kaggle's, every family
  must own trainable LoRA parameters after wrapping; the table of what received a LoRA (family, count,
  trainable parameters) is printed and saved before training, and `lab.model.lora.GradientCheck` proves every family
  trained and the frozen weights did not move;
- the SFT data: prompt = the chat template's generation prompt for the exact Kaggle user
  message (ends with `<think>\\n`), completion = solver trace + eos; the loss mask starts where
  the tokenised prompt ends (TRL tokenises prompt and prompt+completion separately);
- examples longer than the sequence budget are counted and dropped, never cut;
- resume: with `sft.resume=true` a run continues from its newest complete checkpoint (optimizer,
  scheduler, RNG and data position restored by the Trainer) and reaches the same adapter as an
  uninterrupted run; with `sft.resume=false` old checkpoints are deleted first, so a later
  resume cannot pick up a stale run. Checkpoints live in `<run_dir>/checkpoints/02_sft` and carry the
  fingerprint of what shapes training (`fingerprint`, through `lab.train.checkpoints`, as GRPO's do): a rerun with
  other settings starts afresh naming what changed, or refuses when `sft.resume=true` was passed explicitly.
  `sft.wall_clock_budget_min` saves a checkpoint and stops
  cleanly once the budget is spent (checked after every optimiser step, `lab.train.callbacks`).

TRL 1.15's SFTTrainer refuses an `lm_head` LoRA because its fused head computes log-probabilities from
`lm_head.weight` directly; `lab.model.lora` lets the trainer accept it and makes the fused head apply it
(chunked, the full logits never built), so it trains (tests/test_lora.py).

What it simplifies:
1. One adapter; one dataset per stage (`sft.stages`: the drills stage, when on, trains the same LoRA first).
2. Packing (`sft.packing`): TRL's best-fit-decreasing packing, rows never cut (the lab drops overlong rows first), made
   exact for Nemotron-H by `lab.model.packed_rows` (each row's Mamba state and attention start at its first token;
   TRL's loss is already token-weighted over the optimizer step, packed or not). `batch_size` and `grad_accum` then
   count packs of up to `max_seq_len` tokens, not rows: conf/sft/nemotron_nano.yaml derives its `grad_accum` so a
   step still holds about 16 rows. The real model packs only with the Mamba kernels (`check_packing`).
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from lab import LabError
from lab.core.console import in_kernel
from lab.core.io import atomic_write_csv, check_replaceable
from lab.core.paths import adapter_dtype, resolve_path
from lab.data.dataset import category_weights, oversample, trace_styles
from lab.data.sft_examples import EXAMPLE_COLUMNS, chat_example, sft_examples
from lab.model import packed_rows
from lab.model.lora import (GradientCheck, attach_lora, check_targets, install_fused_lora_head, save_adapter,
                      trainer_accepts_head_lora)

# ---- resume ------------------------------------------------------------------------------------------

# sft keys that do not change the training trajectory: a resumed run may change them (max_steps and epochs do: the
# learning-rate schedule is laid out over them)
RESUME_FREE_KEYS = ("save_steps", "logging_steps", "save_total_limit", "resume", "wall_clock_budget_min",
                    "gradient_check", "adapter_dir")


def fingerprint(cfg: DictConfig, examples: pd.DataFrame) -> dict:
    """What must not change between an SFT run and its resumption (`lab.train.checkpoints.fingerprint`: every
    trajectory-changing sft key, seed, model and its content hash) plus a sha256 of the training examples
    (prompt and completion, in training order)."""
    from lab.train import checkpoints

    h = hashlib.sha256()
    for prompt, completion in examples[["prompt", "completion"]].itertuples(index=False, name=None):
        for text in (prompt, completion):
            b = str(text).encode("utf-8")
            h.update(len(b).to_bytes(8, "big") + b)
    return checkpoints.fingerprint(cfg, "sft", RESUME_FREE_KEYS, examples_sha256=h.hexdigest())


def sft_stages(cfg) -> list[str]:
    """`sft.stages`: [traces] or [drills, traces] (drills first, the traces continue its adapter)."""
    stages = [str(s) for s in (cfg.sft.get("stages", None) or ["traces"])]
    if stages not in (["traces"], ["drills", "traces"]):
        raise LabError(f"conf/sft: stages={stages} must be [traces] or [drills, traces]")
    return stages


def drill_examples(tokenizer, n: int, seed: int, max_seq_len: int) -> pd.DataFrame:
    """The drills stage's examples: `eqsearch.drills` as chat prompt / completion pairs (overlong ones dropped)."""
    from lab.puzzles.eqsearch import drills

    rows = []
    for i, (q, a) in enumerate(drills(n, seed)):
        prompt, completion, n_tok = chat_example(tokenizer, q, a)
        if n_tok <= max_seq_len:
            rows.append({"id": f"drill-{seed}-{i:05d}", "category": "drill", "prompt": prompt,
                         "completion": completion, "tokens": n_tok})
    return pd.DataFrame(rows, columns=EXAMPLE_COLUMNS)


def _train_drills(cfg, stage, pm, tokenizer) -> dict:
    """The drills stage on the same LoRA model (the traces stage then continues from it); saves drills_adapter."""
    from lab.train import checkpoints
    from lab.train.callbacks import trainer_callbacks

    examples = drill_examples(tokenizer, cfg.sft.drill_n, cfg.seed, cfg.sft.max_seq_len)
    if examples.empty:
        raise LabError(f"{stage.dir}: no drill examples (sft.drill_n={cfg.sft.drill_n}, max_seq_len)")
    # beside the stage's checkpoints, outside its folder (its outputs are hashed for lineage); the drills stage is
    # short and always trained afresh: only the traces stage resumes, from checkpoints keyed by lab.train.checkpoints
    out = stage.checkpoint_dir.with_name(stage.checkpoint_dir.name + "_drills")
    if out.exists():
        shutil.rmtree(out)
    budget = checkpoints.wall_clock_budget(cfg, "sft")
    trainer = build_trainer(cfg, out, pm, tokenizer, examples, trainer_callbacks(None, budget))
    result = trainer.train()
    save_adapter(pm, resolve_path(cfg.sft.adapter_dir).parent / "drills_adapter", dtype=adapter_dtype(cfg))
    return {"examples": len(examples), "train_loss": float(result.training_loss),
            "steps": int(trainer.state.global_step)}


# ---- trainer ------------------------------------------------------------------------------------

def training_args(cfg: DictConfig, output_dir: Path):
    """SFTConfig from `conf/sft`; every value from the config, none from library defaults that matter."""
    import torch
    from trl import SFTConfig

    from lab.core.run import tracking_args

    s = cfg.sft
    return SFTConfig(
        output_dir=str(output_dir), num_train_epochs=s.epochs, max_steps=s.max_steps,
        learning_rate=s.learning_rate, warmup_steps=s.warmup_ratio,
        lr_scheduler_type=s.lr_scheduler_type, per_device_train_batch_size=s.batch_size,
        gradient_accumulation_steps=s.grad_accum, weight_decay=s.weight_decay,
        logging_steps=s.logging_steps, save_steps=s.save_steps, save_total_limit=s.save_total_limit,
        max_length=packed_rows.pack_tokens(cfg), completion_only_loss=True, seed=cfg.seed,  # packing: one pack's tokens
        packing=bool(s.packing), packing_strategy="bfd",  # rows kept whole (bfd_split/wrapped would cut them)
        data_seed=cfg.seed, **tracking_args(cfg, "02_sft"), use_cpu=not torch.cuda.is_available(),
        bf16=cfg.model.dtype == "bfloat16" and torch.cuda.is_available(), dataloader_num_workers=0,
        disable_tqdm=False, save_only_model=False, gradient_checkpointing=s.gradient_checkpointing,
        **optim_args(cfg))


def optim_args(cfg: DictConfig) -> dict:
    """`optim` for SFTConfig/GRPOConfig from `gpu.optim` (conf/gpu/); nothing when unset (transformers' default)."""
    name = OmegaConf.select(cfg, "gpu.optim", default=None)
    return {} if name is None else {"optim": str(name)}


def build_trainer(cfg: DictConfig, output_dir: Path, peft_model, tokenizer, examples: pd.DataFrame, callbacks=()):
    """The SFTTrainer `train` uses (exposed so tests can inspect its tokenised dataset)."""
    from datasets import Dataset
    from trl import SFTTrainer

    from lab.train.callbacks import use_text_progress

    with trainer_accepts_head_lora(peft_model):  # an lm_head LoRA: see lab.model.lora
        trainer = SFTTrainer(model=peft_model, args=training_args(cfg, output_dir), processing_class=tokenizer,
                             train_dataset=Dataset.from_pandas(examples[["prompt", "completion"]],
                                                               preserve_index=False),
                             callbacks=list(callbacks))
    install_fused_lora_head(peft_model)  # SFTTrainer's fused head: temperature 1, log_probs/entropy/is_top1
    use_text_progress(trainer)
    return trainer


def check_packing(cfg: DictConfig) -> None:
    """`sft.packing=true`: refused with Unsloth; with the real model, refused before loading it unless the Mamba
    kernels import (`lab.model.models.check_mamba_kernels`, the preflight's check) and take each row's boundaries
    (`lab.model.packed_rows.require_kernels`)."""
    if cfg.sft.packing and cfg.sft.backend == "unsloth":
        raise LabError("sft.packing=true is for sft.backend=hf (lab.model.packed_rows wraps transformers' Nemotron-H "
                       "under TRL's SFTTrainer; with Unsloth it is untested): set sft.packing=false, and sft.grad_accum "
                       "to the rows a step should hold (16 in the competition recipe), since grad_accum counts packs")
    if cfg.sft.packing and not cfg.model.build_tiny:
        from lab.model import models, packed_rows

        models.check_mamba_kernels(cfg)
        packed_rows.require_kernels()


def model_with_lora(cfg: DictConfig, stage, model=None, tokenizer=None):
    """The model SFT trains: the base model (loaded by `sft.backend`'s loader unless given) with the configured LoRA
    attached; the table of what received a LoRA is printed and saved (`lora_targets.csv`). Returns (peft_model,
    tokenizer, table). `train` calls it unless given its result (`lab.recipes.sft.sft_model`: a notebook's own cell)."""
    from lab.train import trl_private
    from lab.model import models

    backend = cfg.sft.backend  # hf or unsloth: lab/core/schema.py's TrainBackend, refused at compose otherwise
    # an adapter_dir pointed outside the stage at a folder the lab did not make is refused before training, not after
    check_replaceable(resolve_path(cfg.sft.adapter_dir), "adapter (sft.adapter_dir)")
    check_targets(cfg)
    sft_stages(cfg)  # before loading the model
    load, attach = models.load, attach_lora
    if backend == "unsloth":  # Unsloth's own loader, which imports unsloth before transformers/TRL/PEFT
        from lab.train import sft_unsloth

        sft_unsloth.check_targets(cfg)  # before loading 30B weights
        load, attach = sft_unsloth.load, sft_unsloth.attach_lora
    check_packing(cfg)  # before loading the model
    if model is None:
        model, tokenizer = load(cfg)
    trl_private.install()
    pm, table = attach(cfg, model)  # the LoRA's initial weights: torch's global generator, as it stands here
    if not in_kernel():  # a notebook shows the table as its cell's result (notebooks/02_sft.ipynb)
        print("LoRA targets:\n" + table.to_string(index=False))
    atomic_write_csv(stage.path("lora_targets.csv"), table)
    return pm, tokenizer, table


def train(cfg: DictConfig, stage, train_puzzles: pd.DataFrame, model=None, tokenizer=None, lora=None):
    """Train the SFT adapter into `cfg.sft.adapter_dir`. `lora`: `model_with_lora`'s (peft_model, tokenizer, table)
    when already made; else it is made here (from `model` and `tokenizer` when given).

    Returns (metrics, peft_model, tokenizer, log_df): metrics has the example counts, loss, steps,
    the target table, the gradient check and whether the wall-clock budget stopped the run.
    """
    from lab.train import checkpoints
    from lab.train.callbacks import trainer_callbacks

    backend = cfg.sft.backend
    stages = sft_stages(cfg)
    # the LoRA is attached before the examples are made (they use no random generator, so its weights are the same)
    pm, tokenizer, table = lora if lora is not None else model_with_lora(cfg, stage, model, tokenizer)
    examples, counts = sft_examples(tokenizer, train_puzzles, cfg.sft.max_seq_len, trace_styles(cfg))
    examples = oversample(examples, category_weights(cfg), cfg.seed)  # data.weights (1 each: unchanged)
    if cfg.sft.n_train:
        examples = examples.sample(frac=1.0, random_state=cfg.seed).head(cfg.sft.n_train)
    if examples.empty:
        raise LabError(f"{stage.dir}: no SFT examples left ({counts})")
    if not in_kernel():  # a notebook shows them as a table (notebooks/02_sft.ipynb)
        print(f"SFT examples: {counts}")
    atomic_write_csv(stage.path("sft_examples.csv"), examples[["id", "category", "tokens"]])

    if cfg.sft.packing:
        from lab.model import packed_rows

        if not cfg.model.build_tiny:
            packed_rows.require_kernels(pm)  # the loaded model's own mixers
        packed_rows.install(pm, attention=str(cfg.sft.packed_attention))

    drills = _train_drills(cfg, stage, pm, tokenizer) if "drills" in stages else None
    check = GradientCheck(pm) if cfg.sft.gradient_check else None
    out = stage.checkpoint_dir  # outside the stage folder: a rerun's fresh folder (lab.core.run.Stage) still finds them
    fp = fingerprint(cfg, examples)
    last, _, notes = checkpoints.resume_point(out, fp, resume=cfg.sft.resume, what="sft",
                                              asked=checkpoints.asked_to_resume(stage.overrides, "sft.resume"))
    for n in notes:
        print(n if n.startswith("resuming from") else f"WARNING: {n}")
    if last is None:
        checkpoints.write_record(out, {"fingerprint": fp})
    callbacks = trainer_callbacks(check, checkpoints.wall_clock_budget(cfg, "sft"))
    trainer = build_trainer(cfg, out, pm, tokenizer, examples, [*callbacks, checkpoints.marker_callback()])
    need = lambda: checkpoints.checkpoint_bytes(out, pm)  # noqa: E731 - asked only when the disk is full
    with checkpoints.disk_full_guard(out, need):
        result = trainer.train(resume_from_checkpoint=str(last) if last else None)
    adapter_dir = resolve_path(cfg.sft.adapter_dir)
    with checkpoints.disk_full_guard(adapter_dir, need):
        save_adapter(pm, adapter_dir, dtype=adapter_dtype(cfg))  # on Kaggle bf16 (kaggle.adapter_dtype)
    log = pd.DataFrame([h for h in trainer.state.log_history if "loss" in h])
    atomic_write_csv(stage.path("train_log.csv"), log)
    metrics = {"examples": counts, "train_loss": float(result.training_loss), "steps": int(trainer.state.global_step),
               "max_steps": int(trainer.state.max_steps), "resumed_from": str(last) if last else None,
               "stopped_by_budget": bool(callbacks[0].stopped_by_budget), "backend": backend,
               "trainable_params": int(table["trainable_params"].sum()),
               "lora_targets": dict(zip(table["family"], table["modules"].astype(int)))}
    if drills is not None:
        metrics["drills"] = drills
    if check is not None:
        bad = metrics["gradient_check_failed"] = check.save(stage.dir)
        if bad:
            print(f"WARNING: gradient check failed for: {', '.join(bad)} (see gradient_check.csv, frozen_check.csv)")
    return metrics, pm, tokenizer, log

