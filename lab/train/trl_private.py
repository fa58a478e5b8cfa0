"""Every use of TRL's private (`_`-prefixed) API in the lab, in one place, read in TRL 1.15.0's source.

1. The CPU log-prob head (trl/trainer/utils.py: `_ChunkedLogProbFunction`), so TRL's trainers run where Triton is
   absent (the CPU demo, CI); `install()`, below.
2. The GRPO rollout internals iterative refinement (`lab.train.grpo_refine`) calls from its `rollout_func`
   (trl/trainer/grpo_trainer.py: `GRPOTrainer._tokenize_prompts`, `_generate_single_turn`, `_log_metric`):
   `prompt_ids`, `generate`, `log_metric`. TRL calls a `rollout_func(prompts, trainer)` from
   `_generate_and_score_completions` and offers no public way to draw with the trainer's own generation.
   vLLM rollouts (`lab.train.rollouts`) use `prompt_ids` and `log_metric` too, and `watch_sampling_gap`
   (`GRPOTrainer._generate_and_score_completions`' output, `_metrics`).
A TRL upgrade re-reads those two files and this module, nothing else.

The log-prob head: TRL 1.15 computes the per-token log-probabilities of SFT and GRPO through a "fused LM head"
whose inner function, `ChunkedLogProbFunction`, is a Triton kernel. Where Triton cannot be
imported (PyTorch's CPU build), TRL leaves `trl.trainer.utils._ChunkedLogProbFunction = None` and
every training step fails with `'NoneType' object has no attribute 'apply'`.

`install()` fills that slot, when it is empty or no CUDA device is present (Triton without a CPU backend, as in the
vLLM lane's venv), with the same computation in plain PyTorch and returns the same five outputs. On a GPU with
Triton, nothing changes.

What it simplifies:
1. It materialises the logits instead of chunking them: fine for small vocabularies and short sequences,
   which is the only place it is used.
"""

from __future__ import annotations

import torch

OPTIONAL_OUTPUTS = ("entropy", "log_sum_sq_probs", "mean_logits", "is_top1")


class TorchLogProbFunction:
    """Same call signature and outputs as `trl.kernels.ChunkedLogProbFunction.apply`, in plain PyTorch."""

    @staticmethod
    def apply(hidden, weight, bias, targets, temperature, chunk_size, final_logit_softcapping=None,
              logit_scale=1.0, outputs=OPTIONAL_OUTPUTS):
        y = (hidden.float() @ weight.float().t()) * logit_scale
        if bias is not None:
            y = y + bias.float()
        if final_logit_softcapping is not None:
            y = final_logit_softcapping * torch.tanh(y / final_logit_softcapping)
        z = y / temperature
        logp = torch.log_softmax(z, dim=-1)
        target_logp = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        entropy = -(logp.exp() * logp).sum(-1) if "entropy" in outputs else None
        lssp = torch.logsumexp(2 * logp, dim=-1).detach() if "log_sum_sq_probs" in outputs else None
        mean_logits = z.mean(-1).detach() if "mean_logits" in outputs else None
        is_top1 = (z.argmax(-1) == targets).detach() if "is_top1" in outputs else None
        return target_logp, entropy, lssp, mean_logits, is_top1


def install() -> None:
    """Fill TRL's empty log-prob slot with the PyTorch version (a slot TRL filled is left as it is)."""
    import trl.trainer.utils as tu

    # also without CUDA: the vLLM lane's venv has Triton (vLLM's CPU build brings it) but no CPU backend for it, so
    # TRL imports its kernel and the first step fails ("0 active drivers", triton/runtime/driver.py)
    if getattr(tu, "_ChunkedLogProbFunction", None) is None or not torch.cuda.is_available():
        tu._ChunkedLogProbFunction = TorchLogProbFunction


def prompt_ids(trainer, prompts: list) -> list[list[int]]:
    """The prompts tokenised as GRPOTrainer tokenises them (`_tokenize_prompts`, which returns ids, images and
    multimodal fields; text prompts have neither)."""
    return trainer._tokenize_prompts(prompts)[0]


def generate(trainer, prompt_ids: list, num_generations: int) -> tuple[list, list | None]:
    """(completion ids, sampling log-probabilities) from the trainer's own generation (`_generate_single_turn` with
    no images): its back-end, sampling settings and `max_completion_length`, for prompts already repeated per
    generation as TRL passes them."""
    return trainer._generate_single_turn(prompt_ids, None, {}, num_generations)


def log_metric(trainer, name: str, value: float) -> None:
    """A scalar averaged over the logging step and logged with TRL's own metrics (`_log_metric`)."""
    trainer._log_metric(name, value)


def watch_sampling_gap(trainer) -> None:
    """Log |sampler's - trainer's| log-probability of the completion tokens as `rollout/logp_diff_mean` and `_max`,
    where TRL computes the trainer's (`old_per_token_logps`: only when a round feeds several optimiser steps) and
    the rollout returned the sampler's (`sampling_per_token_logps`); both are keys of the dict
    `_generate_and_score_completions` returns (trl/trainer/grpo_trainer.py), over its `completion_mask`. Wraps that
    method on this trainer instance, once; costs no forward pass."""
    if getattr(trainer, "_lab_gap_watched", False):
        return
    inner = trainer._generate_and_score_completions

    def wrapped(*args, **kwargs):
        out = inner(*args, **kwargs)
        old, samp = out.get("old_per_token_logps"), out.get("sampling_per_token_logps")
        if old is not None and samp is not None:
            mask = out["completion_mask"].bool()
            d = (old - samp).abs()[mask]
            d = d[torch.isfinite(d)]
            if d.numel():
                mode = "train" if trainer.model.training else "eval"
                trainer._metrics[mode]["rollout/logp_diff_mean"].append(float(d.mean()))
                trainer._metrics[mode]["rollout/logp_diff_max"].append(float(d.max()))
        return out

    trainer._generate_and_score_completions = wrapped
    trainer._lab_gap_watched = True
