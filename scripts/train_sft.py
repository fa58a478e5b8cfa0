"""02_sft as a script, for `accelerate launch` on several GPUs (docs/scaling.md).

    accelerate launch --config_file scripts/accelerate/ddp.yaml --num_processes 8 \
        scripts/train_sft.py model=nemotron_nano data=competition run_name=sft8
    python scripts/train_sft.py run_name=demo          # one process, same outputs

Mirrors notebooks/02_sft.ipynb with the same Hydra overrides and the same folder: every process trains
with lab.sft.train; then the training model is deleted and its memory released, and the main process
alone evaluates the saved adapter on the held-out split (greedy, the competition's settings; vLLM is
given the packed adapter, see lab.generate) and writes `<run_dir>/02_sft/predictions.csv` and
`metrics.json` (accuracy_after, per-category accuracy, the training metrics), which notebooks 03-05 read.

Deliberately thin: no before-training evaluation (the notebook has it; waiting ranks would hit the
collective timeout on the real model); `--no-eval` skips the evaluation too (then 03_grpo cannot
start from this run, it needs accuracy_after).
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    import _launch

    overrides, no_eval = _launch.overrides_from(argv)
    state, stage, cfg = _launch.open_stage("02_sft", overrides)
    from lab import data, generate, sft

    train, val = data.prepare(cfg)
    metrics, model, tokenizer, log = sft.train(cfg, stage, train)
    del model  # the training model leaves the GPU before an evaluation engine starts (lab.generate)
    if not _launch.leave_distributed(state):
        return 0
    if not no_eval:
        with generate.Generator(cfg, adapter=cfg.sft.adapter_dir) as gen:
            after = generate.predictions(gen, val, out_csv=stage.path("predictions.csv"))
        metrics = {"accuracy_after": float(after["correct"].mean()),
                   "per_category": {c: {"after": float(a)} for c, a in after.groupby("category")["correct"].mean().items()},
                   **metrics}
        print(f"held-out accuracy after SFT: {metrics['accuracy_after']:.3f}")
    return _launch.finish(state, stage, metrics)


if __name__ == "__main__":
    sys.exit(main())
