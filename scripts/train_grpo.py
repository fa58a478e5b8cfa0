"""03_grpo as a script, for `accelerate launch` on several GPUs (docs/scaling.md).

    accelerate launch --config_file scripts/accelerate/ddp.yaml --num_processes 8 \
        scripts/train_grpo.py model=nemotron_nano data=competition run_name=sft8
    python scripts/train_grpo.py run_name=demo         # one process, same outputs

Runs what notebooks/03_grpo.ipynb runs, `lab.recipes.grpo.grpo`, with the same Hydra overrides into the same folder:
it starts from the SFT adapter of the same run_dir (02_sft must have finished: notebook or
scripts/train_sft.py); every process trains; the main process alone evaluates the saved adapter (packed, with the
vllm back-end) on the held-out split against the SFT start, packs submission.zip and writes
`<run_dir>/03_grpo/metrics.json`, which 04_vote and 05_errors read.

`--no-eval` skips the evaluation (then the metrics hold only the training side).
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    import _launch

    overrides, no_eval = _launch.overrides_from(argv)
    state, stage = _launch.open_stage("03_grpo", overrides)
    from lab.recipes import grpo

    grpo.grpo(stage, launch=state, evaluate_adapter=not no_eval)
    return _launch.done(state, stage)


if __name__ == "__main__":
    sys.exit(main())
