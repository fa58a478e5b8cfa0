"""Every use of TRL's private (`_`-prefixed) API in the lab, in one place, read in TRL 1.15.0's source.

1. The CPU log-prob head (trl/trainer/utils.py: `_ChunkedLogProbFunction`), so TRL's trainers run where Triton is
   absent (the CPU demo, CI); `install()`, below.
2. The GRPO rollout internals iterative refinement (`lab.train.grpo_refine`) calls from its `rollout_func`
   (trl/trainer/grpo_trainer.py: `GRPOTrainer._tokenize_prompts`, `_generate_single_turn`, `_log_metric`):
   `prompt_ids`, `generate`, `log_metric`. TRL calls a `rollout_func(prompts, trainer)` from
   `_generate_and_score_completions` and offers no public way to draw with the trainer's own generation.
   vLLM rollouts (`lab.train.rollouts`) use `prompt_ids` and `log_metric` too, and `watch_sampling_gap`
   (`GRPOTrainer._generate_and_score_completions`' output, `_metrics`).
3. Packed GRPO training (`install_packing`, the maths in `lab.train.grpo_packed`): the trainer's `compute_loss`,
   `_get_per_token_logps_and_entropies` and `_generate_and_score_completions` replaced on the instance, its
   attributes read (`loss_type`, `epsilon_low`/`_high`, `beta`, `_step`, `_metrics`), and transformers' Trainer's
   loss scaling before backward (`backward_scale`).
A TRL upgrade re-reads those files (and transformers' trainer.py for `backward_scale`) and this module.

The log-prob head: TRL 1.15 computes the per-token log-probabilities of SFT and GRPO through a "fused LM head"
whose inner function, `ChunkedLogProbFunction`, is a Triton kernel. Where Triton cannot be
imported (PyTorch's CPU build), TRL leaves `trl.trainer.utils._ChunkedLogProbFunction = None` and
every training step fails with `'NoneType' object has no attribute 'apply'`.

`install()` fills that slot, when it is empty or no CUDA device is present (Triton without a CPU backend, as in the
vLLM lane's venv), with the same computation in plain PyTorch (`lab.model.torch_logprob`), which returns the same five
outputs. On a GPU with Triton, nothing changes.
"""

from __future__ import annotations

import torch

from lab.model.torch_logprob import TorchLogProbFunction


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


# ---- packed GRPO training (lab.train.grpo_packed) ---------------------------------------------------------------

def packed_settings(trainer, pack_tokens: int):
    """`lab.train.grpo_packed.Settings` from the trainer's own attributes (GRPOTrainer.__init__ and `_compute_loss`)."""
    from lab.train.grpo_packed import Settings

    train = bool(trainer.model.training)
    return Settings(loss_type=trainer.loss_type, epsilon_low=float(trainer.epsilon_low),
                    epsilon_high=float(trainer.epsilon_high), delta=trainer.args.delta, beta=float(trainer.beta),
                    bias_correction_kl=bool(trainer.args.use_bias_correction_kl),
                    accumulation_steps=int(trainer.current_gradient_accumulation_steps) if train else 1,
                    steps_per_generation=int(trainer.args.steps_per_generation) if train else 1,
                    num_processes=int(trainer.accelerator.num_processes),
                    max_completion_length=int(trainer.max_completion_length), pack_tokens=int(pack_tokens),
                    train=train)


def backward_scale(trainer, num_items_in_batch) -> float:
    """The factor transformers 5.17's `Trainer.training_step` applies to `compute_loss`'s value before
    `accelerator.backward` (transformers/trainer.py: divided by the accumulation steps when the model takes no loss
    kwargs or `num_items_in_batch` is None, and no `compute_loss_func` is set): an earlier pack's backward must be
    scaled the same way as the returned loss."""
    if (not trainer.model_accepts_loss_kwargs or num_items_in_batch is None) and trainer.compute_loss_func is None:
        return 1.0 / trainer.current_gradient_accumulation_steps
    return 1.0


def install_packing(trainer, pack_tokens: int, old_logprobs: str = "trainer") -> None:
    """Train `trainer` (a GRPOTrainer) in packs (lab.train.grpo_packed): its `compute_loss` becomes
    `micro_batch_loss` with each pack's backward done as the pack is formed, its `_get_per_token_logps_and_entropies`
    (the no-grad old and reference log-probs of `_generate_and_score_completions`) the packed one. With
    `old_logprobs="sampler"` the old log-probs TRL would compute (policy lag, `steps_per_generation` > accumulation
    steps) are the rollout's `sampling_per_token_logps` instead, and that forward is skipped. The sampler/trainer gap
    (|trainer's - sampler's| log-prob of the completion tokens, with grad's forward on the first step of each round,
    where trainer and sampler are the same policy) is logged as `rollout/logp_diff_mean` / `_max`."""
    from lab import LabError
    from lab.train import grpo_packed

    grpo_packed.check_supported(trainer.args, trainer.loss_type)
    if trainer.aux_loss_enabled:
        raise LabError("grpo.packing: the model's router aux loss is on (router_aux_loss_coef); packing does not "
                       "add it")
    if old_logprobs not in grpo_packed.OLD_LOGPROBS:
        raise LabError(f"grpo.old_logprobs={old_logprobs!r}: one of {', '.join(grpo_packed.OLD_LOGPROBS)}")

    def logps(model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False,
              compute_aux_loss=False, **kw):
        if trainer._lab_skip_old:  # old log-probs from the sampler: the forward TRL asks for is not run
            trainer._lab_skip_old = False
            return input_ids.new_zeros(input_ids.shape[0], logits_to_keep, dtype=torch.float32), None, None
        with trainer.accelerator.autocast():
            lp, ent = grpo_packed.per_token_logps(model, input_ids, attention_mask, logits_to_keep, pack_tokens,
                                                  compute_entropy)
        return lp, ent, None

    inner = trainer._generate_and_score_completions

    def generate_and_score(*args, **kwargs):
        a = trainer.args
        lagged = a.gradient_accumulation_steps % (a.steps_per_generation * trainer.num_iterations) != 0
        want = old_logprobs == "sampler" and lagged and trainer.model.training
        trainer._lab_skip_old = want
        try:
            out = inner(*args, **kwargs)
        finally:
            skipped = want and not trainer._lab_skip_old  # `logps` took the flag: TRL asked for old log-probs
            trainer._lab_skip_old = False
        if skipped:
            if out.get("sampling_per_token_logps") is None:
                raise LabError("grpo.old_logprobs=sampler: the rollouts returned no log-probabilities "
                               "(grpo.rollout_backend=vllm returns them)")
            out["old_per_token_logps"] = out["sampling_per_token_logps"]
        return out

    def compute_loss(model, inputs, return_outputs=False, num_items_in_batch=None):
        s = packed_settings(trainer, pack_tokens)
        scale = backward_scale(trainer, num_items_in_batch)
        loss, st = grpo_packed.micro_batch_loss(model, inputs, s,
                                                backward=lambda part: trainer.accelerator.backward(part * scale))
        mode = "train" if s.train else "eval"
        red = trainer.accelerator.reduce(torch.tensor([st["entropy"], st["low"], st["high"], st["tokens"],
                                                       st["logp_gap_sum"], st["gap_tokens"]], dtype=torch.float64,
                                                      device=loss.device), reduction="sum").tolist()
        tokens = max(red[3], 1.0)
        trainer._metrics[mode]["entropy"].append(red[0] / tokens)
        if s.loss_type != "cispo":
            trainer._metrics[mode]["clip_ratio/low_mean"].append(red[1] / tokens)
            trainer._metrics[mode]["clip_ratio/high_mean"].append(red[2] / tokens)
            trainer._metrics[mode]["clip_ratio/region_mean"].append((red[1] + red[2]) / tokens)
        first_of_round = trainer._step % int(trainer.args.steps_per_generation) == 0
        if s.train and first_of_round and red[5] > 0:
            trainer._metrics[mode]["rollout/logp_diff_mean"].append(red[4] / red[5])
            trainer._metrics[mode]["rollout/logp_diff_max"].append(st["logp_gap_max"])
        return loss

    trainer._lab_skip_old = False
    trainer._get_per_token_logps_and_entropies = logps
    trainer._generate_and_score_completions = generate_and_score
    trainer.compute_loss = compute_loss
    trainer._lab_gap_watched = True  # the gap is logged by the packed loss (watch_sampling_gap adds nothing)
