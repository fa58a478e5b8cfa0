"""Resuming GRPO: what must not change between a run and its resumption (`fingerprint`), and where to resume.

A run record (`lab.checkpoints`) holds the pass rates and prompt order of a run; they are reused only under the same
fingerprint: every trajectory-changing `grpo` key (all but `RESUME_FREE_KEYS`), the seed, the model and its content
hash, the completion budget, the prompt pool and the start adapter's checksum.

What it simplifies: the checkpoint rules themselves (fresh start or refusal, `max_steps` reached) are
`lab.checkpoints.resume_point`'s, shared with SFT; this module only says what GRPO's fingerprint holds.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Sequence

from omegaconf import DictConfig

from lab import checkpoints
from lab.generate import lora_checksum

# grpo keys that do not change the training trajectory: a resumed run may change them
RESUME_FREE_KEYS = ("max_steps", "save_steps", "logging_steps", "resume", "wall_clock_budget_min",
                    "truncation_warn_share", "zero_variance_warn_share", "gradient_check", "adapter_dir",
                    "vllm_gpu_memory_utilization", "vllm_sleep_mode")


def fingerprint(cfg: DictConfig, pool_ids: Sequence[str], model, budget: int) -> dict:
    """What must not change between a run and its resumption (`lab.checkpoints.fingerprint`: every trajectory-changing
    grpo key, seed, model and its content hash); the pass rates and prompt order of a run record are reused only
    under the same fingerprint, which adds the budget, the pool and the start adapter's checksum."""
    return checkpoints.fingerprint(
        cfg, "grpo", RESUME_FREE_KEYS, max_completion_length=int(budget),
        pool_sha256=hashlib.sha256("\n".join(map(str, pool_ids)).encode()).hexdigest(),
        start_adapter=lora_checksum(model, trainable=True))


def resume_point(cfg: DictConfig, out: Path, fp: dict, asked: bool = True
                 ) -> tuple[Path | None, dict | None, list[str]]:
    """(checkpoint to resume or None, the run record to reuse or None, notes): `lab.checkpoints.resume_point` with
    `grpo.resume` and `grpo.max_steps`; `asked=False` (resume not asked for explicitly) starts afresh with a note
    where the fingerprint changed, instead of refusing."""
    return checkpoints.resume_point(out, fp, resume=cfg.grpo.resume, asked=asked, what="grpo",
                                    max_steps=cfg.grpo.max_steps)
