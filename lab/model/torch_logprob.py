"""TRL's fused log-prob head (`trl.kernels.ChunkedLogProbFunction`, a Triton kernel) in plain PyTorch.

Used where Triton cannot run: `lab.train.trl_private.install` puts it in TRL's empty slot for CPU training, and
`lab.plan.memory` traces it as the real CPU head. It materialises the logits instead of chunking them, which is fine
for the tiny model's small vocabulary and short rows, the only place it trains.
"""

from __future__ import annotations

import torch

OPTIONAL_OUTPUTS = ("entropy", "log_sum_sq_probs", "mean_logits", "is_top1")


class TorchLogProbFunction:
    """Same call signature and outputs as `trl.kernels.ChunkedLogProbFunction.apply`, in plain PyTorch."""

    @staticmethod
    def apply(hidden, weight, bias, targets, temperature, chunk_size, final_logit_softcapping=None,
              logit_scale=1.0, outputs=OPTIONAL_OUTPUTS):
        dt = torch.promote_types(hidden.dtype, torch.float32)  # fp32, or fp64 for an fp64 reference
        y = (hidden.to(dt) @ weight.to(dt).t()) * logit_scale
        if bias is not None:
            y = y + bias.to(dt)
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
