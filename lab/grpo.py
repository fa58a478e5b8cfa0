"""GRPO from the SFT adapter, with TRL 1.15's GRPOTrainer: rewards, pass-rate selection, curriculum.

Steps, each visible in the 03_grpo notebook:
1. estimate each training prompt's pass rate with k samples from the SFT model
   (`grpo.pass_rate_k`), drop prompts at or above `grpo.drop_threshold` (they teach nothing),
   and order the rest easy -> hard when `grpo.curriculum` is on (TRL's shuffling is then off);
2. train with the rewards named in `grpo.rewards` (weights from config, functions from
   `lab.rewards.REWARDS`); `max_completion_length` comes from the competition budget
   (`model.max_model_len` minus the longest prompt, capped by `infer.max_tokens`), never from
   TRL's default of 512;
3. every logged step is checked: the share of truncated completions and of groups with zero
   reward variance are compared with `grpo.truncation_warn_share` / `zero_variance_warn_share`
   and a warning is printed and recorded when exceeded.

Rollouts: `hf` (transformers generate inside GRPOTrainer, CPU or GPU); on GPU, `vllm` uses
TRL's colocate mode (`use_vllm=True, vllm_mode="colocate"`), settings in conf/grpo.

Deliberately simple: one adapter trained in place (no reference model unless beta > 0),
no iterative refinement loop yet.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pandas as pd
from omegaconf import DictConfig

from lab.config import LabError, atomic_write_csv
from lab.prompts import chat_prompt


def pass_rate_table(cfg: DictConfig, model, tokenizer, puzzles: pd.DataFrame) -> pd.DataFrame:
    """k samples per training prompt from the current model -> [id, n, correct, pass_rate]."""
    from lab.curriculum import estimate_pass_rates
    from lab.generate import Generator, sample_table

    gen = Generator(cfg, model=model, tokenizer=tokenizer)
    samples = sample_table(gen, puzzles, n=int(cfg.grpo.pass_rate_k), temperature=float(cfg.grpo.temperature),
                           progress=True)
    return estimate_pass_rates(samples)


def build_dataset(tokenizer, puzzles: pd.DataFrame):
    """Rendered Kaggle prompts plus the columns rewards read: answer, category, solver_trace."""
    from datasets import Dataset

    from lab.puzzles import solve

    rows = []
    for _, r in puzzles.iterrows():
        sol = solve(r["prompt"])
        rows.append({"prompt": chat_prompt(tokenizer, r["prompt"]), "answer": str(r["answer"]),
                     "category": str(r.get("category", "")),
                     "solver_trace": sol.trace if sol.status == "solved" else ""})
    return Dataset.from_list(rows)


def grpo_args(cfg: DictConfig, output_dir: Path, max_completion_length: int, reward_weights: list[float]):
    import torch
    from trl import GRPOConfig

    g = cfg.grpo
    use_vllm = str(g.rollout_backend) == "vllm"
    extra = {}
    if use_vllm:
        extra = dict(use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=float(g.vllm_gpu_memory_utilization),
                     vllm_max_model_length=int(cfg.model.max_model_len), vllm_enable_sleep_mode=bool(g.vllm_sleep_mode))
    return GRPOConfig(
        output_dir=str(output_dir), max_steps=int(g.max_steps), learning_rate=float(g.learning_rate),
        per_device_train_batch_size=int(g.prompts_per_step) * int(g.num_generations), gradient_accumulation_steps=1,
        num_generations=int(g.num_generations), max_completion_length=int(max_completion_length),
        temperature=float(g.temperature), top_p=float(g.top_p), top_k=0, beta=float(g.beta), reward_weights=reward_weights,
        mask_truncated_completions=bool(g.mask_truncated_completions), shuffle_dataset=not bool(g.curriculum),
        logging_steps=int(g.logging_steps), save_steps=int(g.save_steps), save_total_limit=2, seed=int(cfg.seed),
        data_seed=int(cfg.seed), report_to="none", use_cpu=not torch.cuda.is_available(),
        bf16=str(cfg.model.dtype) == "bfloat16" and torch.cuda.is_available(), dataloader_num_workers=0,
        lr_scheduler_type="constant", warmup_steps=0, **extra)


class _GuardRails:
    """A TrainerCallback that warns (and records) when truncation or zero-variance groups dominate."""

    def __new__(cls, cfg):
        from transformers import TrainerCallback

        class GuardRails(TrainerCallback):
            def __init__(self):
                self.warnings: list[str] = []

            def on_log(self, args, state, control, logs=None, **kw):
                logs = logs or {}
                clipped = logs.get("completions/clipped_ratio")
                zero = logs.get("frac_reward_zero_std")
                if clipped is not None and clipped > float(cfg.grpo.truncation_warn_share):
                    self._warn(f"step {state.global_step}: {clipped:.0%} of completions hit max_completion_length")
                if zero is not None and zero > float(cfg.grpo.zero_variance_warn_share):
                    self._warn(f"step {state.global_step}: {zero:.0%} of groups have zero reward variance "
                               "(no learning signal)")

            def _warn(self, msg):
                self.warnings.append(msg)
                warnings.warn(msg, stacklevel=2)

        return GuardRails()


def _floats(log: pd.DataFrame, col: str) -> list[float | None]:
    """A logged column as JSON-safe floats; None where TRL logged nothing (e.g. every reward masked)."""
    if col not in log:
        return []
    return [None if x is None or pd.isna(x) else round(float(x), 4) for x in log[col]]


def train(cfg: DictConfig, stage, train_puzzles: pd.DataFrame, model, tokenizer):
    """Select prompts by pass rate, run GRPO, save the adapter; returns (metrics, model, step log)."""
    from transformers.trainer_utils import get_last_checkpoint
    from trl import GRPOTrainer

    from lab import curriculum, trl_cpu
    from lab.generate import completion_budget
    from lab.rewards import build
    from lab.sft import _callbacks, save_adapter

    trl_cpu.install()
    g = cfg.grpo
    pool = train_puzzles.sample(n=min(int(g.n_prompts), len(train_puzzles)), random_state=int(cfg.seed))
    rates = pass_rate_table(cfg, model, tokenizer, pool)
    atomic_write_csv(stage.path("pass_rates.csv"), rates)
    kept, dropped = curriculum.select(rates, threshold=float(g.drop_threshold))
    if not len(kept):
        raise LabError(f"{stage.dir}: every training prompt has pass rate >= {g.drop_threshold}; nothing to learn")
    chosen = curriculum.order(pool[pool["id"].isin(set(kept))], rates, curriculum=bool(g.curriculum),
                              shape=str(g.curriculum_shape), seed=int(cfg.seed))
    ds = build_dataset(tokenizer, chosen)
    prompts = list(ds["prompt"])
    budget = int(g.max_completion_length) if g.max_completion_length else completion_budget(
        tokenizer, prompts, int(cfg.infer.max_tokens), int(cfg.model.max_model_len))
    funcs, weights = build(dict(g.rewards), max_completion_length=budget, eos_token_ids=[tokenizer.eos_token_id],
                           truncation="mask" if g.mask_truncated_completions else "penalise")
    guard = _GuardRails(cfg)
    out = stage.path("checkpoints")
    trainer = GRPOTrainer(model=model, reward_funcs=funcs, args=grpo_args(cfg, out, budget, weights), train_dataset=ds,
                          processing_class=tokenizer,
                          callbacks=[guard, *_callbacks(None, float(g.wall_clock_budget_min))])
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    last = get_last_checkpoint(str(out)) if g.resume and out.is_dir() else None
    if last:
        print(f"resuming from {last}")
    trainer.train(resume_from_checkpoint=last)
    save_adapter(model, Path(str(g.adapter_dir)))
    log = pd.DataFrame([h for h in trainer.state.log_history if "completions/mean_length" in h])  # per-step logs
    atomic_write_csv(stage.path("train_log.csv"), log)
    changed = sum(float((p.detach() - before[n]).abs().sum()) for n, p in model.named_parameters() if n in before)
    metrics = {
        "prompts_pool": len(pool), "prompts_dropped": int(len(dropped)), "prompts_trained": len(chosen),
        "max_completion_length": budget, "steps": int(trainer.state.global_step),
        "reward_per_step": _floats(log, "reward"), "reward_std_per_step": _floats(log, "reward_std"),
        "truncated_share_per_step": _floats(log, "completions/clipped_ratio"),
        "lora_weight_change": changed, "warnings": guard.warnings,
    }
    return metrics, model, log
