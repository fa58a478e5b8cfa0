"""02_sft as a script, for `accelerate launch` on several GPUs (docs/scaling.md).

    accelerate launch --config_file scripts/accelerate/ddp.yaml --num_processes 8 \
        scripts/train_sft.py model=nemotron_nano data=competition run_name=sft8
    python scripts/train_sft.py run_name=demo          # one process, same outputs

Runs what notebooks/02_sft.ipynb runs, `lab.recipes.sft.sft`, with the same Hydra overrides into the same folder, so
both write the same files and metrics: every process trains; the main process alone evaluates the base model and
the saved adapter on the held-out split (greedy, the competition's settings; with several processes the base
model is evaluated after training, so no process waits on a long evaluation), packs submission.zip and writes
`<run_dir>/02_sft/metrics.json`, which notebooks 03-05 read.

`--no-eval` skips both evaluations (then 03_grpo can only start from this run with `--no-eval` too: its
evaluation compares against accuracy_after).
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    import _launch

    overrides, no_eval = _launch.overrides_from(argv)
    state, stage = _launch.open_stage("02_sft", overrides)
    from lab.recipes import sft

    sft.sft(stage, launch=state, evaluate_adapter=not no_eval)
    return _launch.done(state, stage)


if __name__ == "__main__":
    sys.exit(main())
