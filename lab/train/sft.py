"""The SFT warm-up: a LoRA adapter trained on solver traces with TRL's SFTTrainer over PEFT.

The steps 02_sft runs (`lab.recipes.sft`): `model_with_lora` (every configured family must match, rank at most
Kaggle's), `training_examples` (prompt = the Kaggle chat prompt ending in `<think>\\n`, completion = trace + eos;
overlong rows counted and dropped, never cut), `train` (checkpoints keyed by `fingerprint`, resume, the wall-clock
budget, the gradient check, the adapter saved to `sft.adapter_dir`). Nothing here writes a stage's files: each step
returns its tables and the recipe writes them. Why each guarantee holds, and TRL/PEFT source: docs/internals.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
from pathlib import Path

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from lab import LabError
from lab.core.console import in_kernel
from lab.core.io import check_replaceable
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


def phases(cfg) -> list[str]:
    """SFT's phases, `sft.phases`: [traces] or [drills, traces] (drills first, the traces continue its adapter)."""
    found = [str(s) for s in (cfg.sft.get("phases", None) or ["traces"])]
    if found not in (["traces"], ["drills", "traces"]):
        raise LabError(f"conf/sft: phases={found} must be [traces] or [drills, traces]")
    return found


def drill_examples(tokenizer, n: int, seed: int, max_seq_len: int) -> pd.DataFrame:
    """The drills phase's examples: `eqsearch.drills` as chat prompt / completion pairs (overlong ones dropped)."""
    from lab.puzzles.eqsearch import drills

    rows = []
    for i, (q, a) in enumerate(drills(n, seed)):
        prompt, completion, n_tok = chat_example(tokenizer, q, a)
        if n_tok <= max_seq_len:
            rows.append({"id": f"drill-{seed}-{i:05d}", "category": "drill", "prompt": prompt,
                         "completion": completion, "tokens": n_tok})
    return pd.DataFrame(rows, columns=EXAMPLE_COLUMNS)


def _train_drills(cfg, checkpoint_dir: Path, pm, tokenizer) -> dict:
    """The drills phase on the same LoRA model (the traces phase then continues from it); saves drills_adapter beside
    `sft.adapter_dir`."""
    from lab.train import checkpoints
    from lab.train.callbacks import trainer_callbacks

    examples = drill_examples(tokenizer, cfg.sft.drill_n, cfg.seed, cfg.sft.max_seq_len)
    if examples.empty:
        raise LabError(f"no drill examples (sft.drill_n={cfg.sft.drill_n}, max_seq_len={cfg.sft.max_seq_len})")
    # beside the stage's checkpoints; the drills phase is short and always trained afresh: only the traces phase
    # resumes, from checkpoints keyed by lab.train.checkpoints
    out = checkpoint_dir.with_name(checkpoint_dir.name + "_drills")
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
                       "under TRL's SFTTrainer; with Unsloth it is untested): set sft.packing=false, and "
                       "sft.grad_accum "
                       "to the rows a step should hold (16 in the competition recipe), since grad_accum counts packs")
    if cfg.sft.packing and not cfg.model.build_tiny:
        from lab.model import models, packed_rows

        models.check_mamba_kernels(cfg)
        packed_rows.require_kernels()


def model_with_lora(cfg: DictConfig, model=None, tokenizer=None):
    """The model SFT trains: the base model (loaded by `sft.backend`'s loader unless given) with the configured LoRA
    attached. Returns (peft_model, tokenizer, table of what received a LoRA: family, modules, trainable params)."""
    from lab.train import trl_private
    from lab.model import models

    backend = cfg.sft.backend  # hf or unsloth: lab/core/schema.py's TrainBackend, refused at compose otherwise
    # an adapter_dir pointed outside the stage at a folder the lab did not make is refused before training, not after
    check_replaceable(resolve_path(cfg.sft.adapter_dir), "adapter (sft.adapter_dir)")
    check_targets(cfg)
    phases(cfg)  # before loading the model
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
    return pm, tokenizer, table


@dataclasses.dataclass
class Examples:
    """SFT's training examples in training order (`EXAMPLE_COLUMNS`) and the counts of what was kept or dropped."""
    table: pd.DataFrame
    counts: dict


def training_examples(cfg: DictConfig, tokenizer, puzzles: pd.DataFrame) -> Examples:
    """The examples SFT trains on: `sft_examples` in `data.trace_styles`, oversampled by `data.weights`, the first
    `sft.n_train` of a seeded shuffle when set. Made after the LoRA is attached (they draw on no random generator,
    so the LoRA's initial weights are the same either way)."""
    examples, counts = sft_examples(tokenizer, puzzles, cfg.sft.max_seq_len, trace_styles(cfg))
    examples = oversample(examples, category_weights(cfg), cfg.seed)  # data.weights (1 each: unchanged)
    if cfg.sft.n_train:
        examples = examples.sample(frac=1.0, random_state=cfg.seed).head(cfg.sft.n_train)
    if examples.empty:
        raise LabError(f"no SFT examples left ({counts})")
    if not in_kernel():  # a notebook shows them as a table (notebooks/02_sft.ipynb)
        print(f"SFT examples: {counts}")
    return Examples(examples, counts)


@dataclasses.dataclass
class Trained:
    """What `train` returns: the metrics (example counts, loss, steps, resume, budget stop, LoRA targets), the trained
    model and its tokenizer, the step log, and the gradient check (None when `sft.gradient_check=false`)."""
    metrics: dict
    model: object
    tokenizer: object
    log: pd.DataFrame
    check: GradientCheck | None


def train(cfg: DictConfig, lora: tuple, examples: Examples, checkpoint_dir: Path, resume_asked: bool = False
          ) -> Trained:
    """Train `lora` (`model_with_lora`'s (peft_model, tokenizer, table)) on `examples` and save the adapter to
    `sft.adapter_dir`. Checkpoints go to `checkpoint_dir`; `resume_asked`: `sft.resume=true` was passed explicitly
    (a changed configuration is then refused instead of started afresh)."""
    from lab.train import checkpoints
    from lab.train.callbacks import trainer_callbacks

    pm, tokenizer, table = lora
    if cfg.sft.packing:
        from lab.model import packed_rows

        if not cfg.model.build_tiny:
            packed_rows.require_kernels(pm)  # the loaded model's own mixers
        packed_rows.install(pm, attention=str(cfg.sft.packed_attention))

    out = Path(checkpoint_dir)
    drills = _train_drills(cfg, out, pm, tokenizer) if "drills" in phases(cfg) else None
    check = GradientCheck(pm) if cfg.sft.gradient_check else None
    fp = fingerprint(cfg, examples.table)
    last, _, notes = checkpoints.resume_point(out, fp, resume=cfg.sft.resume, what="sft", asked=resume_asked)
    for n in notes:
        print(n if n.startswith("resuming from") else f"WARNING: {n}")
    if last is None:
        checkpoints.write_record(out, {"fingerprint": fp})
    callbacks = trainer_callbacks(check, checkpoints.wall_clock_budget(cfg, "sft"))
    trainer = build_trainer(cfg, out, pm, tokenizer, examples.table, [*callbacks, checkpoints.marker_callback()])
    need = lambda: checkpoints.checkpoint_need(out, cfg, pm)  # noqa: E731 - asked only when the disk is full
    with checkpoints.disk_full_guard(out, need):
        result = trainer.train(resume_from_checkpoint=str(last) if last else None)
    adapter_dir = resolve_path(cfg.sft.adapter_dir)
    with checkpoints.disk_full_guard(adapter_dir, need):
        save_adapter(pm, adapter_dir, dtype=adapter_dtype(cfg))  # on Kaggle bf16 (kaggle.adapter_dtype)
    log = pd.DataFrame([h for h in trainer.state.log_history if "loss" in h])
    metrics = {"examples": examples.counts, "train_loss": float(result.training_loss),
               "steps": int(trainer.state.global_step), "max_steps": int(trainer.state.max_steps),
               "resumed_from": str(last) if last else None, "stopped_by_budget": bool(callbacks[0].stopped_by_budget),
               "backend": cfg.sft.backend, "trainable_params": int(table["trainable_params"].sum()),
               "lora_targets": dict(zip(table["family"], table["modules"].astype(int)))}
    if drills is not None:
        metrics["drills"] = drills
    return Trained(metrics, pm, tokenizer, log, check)
