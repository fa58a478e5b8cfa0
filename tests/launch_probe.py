"""Test instrumentation for tests/test_distributed.py: runs a training script unchanged and records, per rank,
what that rank trained on and which files it wrote (not a test module itself).

    [accelerate launch ...] python tests/launch_probe.py scripts/train_sft.py [overrides ...]

Environment: PROBE_DIR (where `probe_<rank>.json` goes); PROBE_KILL_RANK / PROBE_KILL_STEP: that rank kills
itself with SIGKILL when it starts that optimizer step (1-based), as a crashed or preempted process would.
Recorded: `batches`, one list per training step of a hash for each example the rank was given (SFT: the
unpadded token ids; GRPO: the prompt text); `replaced`, every path moved into place by `os.replace`
(every atomic write of the lab, lab.core.io.atomic_file / atomic_dir, ends with one).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import runpy
import signal
import sys
from pathlib import Path


def _digest(x) -> str:
    return hashlib.sha1(repr(x).encode()).hexdigest()[:12]


def _examples(inputs) -> list[str]:
    if isinstance(inputs, dict) and "input_ids" in inputs:  # SFT: a padded batch of token ids
        ids, mask = inputs["input_ids"], inputs.get("attention_mask")
        return [_digest(row[m.bool()].tolist() if mask is not None else row.tolist())
                for row, m in zip(ids, mask if mask is not None else ids)]
    return [_digest(x["prompt"]) for x in inputs]  # GRPO: the raw rows of the prompt dataset


def main() -> None:
    import transformers

    rank = int(os.environ.get("RANK", "0"))
    record = {"rank": rank, "world_size": int(os.environ.get("WORLD_SIZE", "1")), "batches": [], "replaced": []}
    kill_rank, kill_step = os.environ.get("PROBE_KILL_RANK"), int(os.environ.get("PROBE_KILL_STEP", "0"))

    step = transformers.Trainer.training_step

    def training_step(self, model, inputs, *args, **kwargs):
        if kill_rank is not None and int(kill_rank) == rank and self.state.global_step + 1 == kill_step:
            os.kill(os.getpid(), signal.SIGKILL)
        record["batches"].append(_examples(inputs))
        return step(self, model, inputs, *args, **kwargs)

    transformers.Trainer.training_step = training_step
    replace = os.replace

    def recording_replace(src, dst, *args, **kwargs):
        record["replaced"].append(str(dst))
        return replace(src, dst, *args, **kwargs)

    os.replace = recording_replace
    out = Path(os.environ["PROBE_DIR"])
    atexit.register(lambda: (out / f"probe_{rank}.json").write_text(json.dumps(record)))
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path.insert(0, str(Path(script).resolve().parent))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
