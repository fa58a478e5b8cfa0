"""Lets TRL 1.15's trainers run where Triton is absent (the CPU demo, CI).

TRL 1.15 computes the per-token log-probabilities of SFT and GRPO through a "fused LM head"
whose inner function, `ChunkedLogProbFunction`, is a Triton kernel. Where Triton cannot be
imported (PyTorch's CPU build), TRL leaves `trl.trainer.utils._ChunkedLogProbFunction = None` and
every training step fails with `'NoneType' object has no attribute 'apply'`.

`install()` fills that slot, only when it is empty, with the same computation in plain PyTorch and
returns the same five outputs. On a GPU with Triton, nothing changes.

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


def install() -> bool:
    """Fill TRL's empty log-prob slot with the PyTorch version; True if it was needed."""
    import trl.trainer.utils as tu

    if getattr(tu, "_ChunkedLogProbFunction", None) is None:
        tu._ChunkedLogProbFunction = TorchLogProbFunction
        return True
    return False


def use_text_progress(trainer) -> None:
    """Take transformers' progress bar off the trainer: the lab's `TrainProgress` (lab.callbacks) prints plain lines.

    Inside a Jupyter kernel the Trainer draws an HTML widget, which a headless papermill run shows as
    `<IPython.core.display.HTML object>` and never updates; its text bar (tqdm, redrawn with '\\r') shows only its
    first frame in papermill's log. A line every few seconds shows in both places (lab.console).
    """
    from transformers.trainer_callback import ProgressCallback
    from transformers.utils.notebook import NotebookProgressCallback

    for bar in (NotebookProgressCallback, ProgressCallback):
        trainer.remove_callback(bar)
