"""03_grpo as a script, for `accelerate launch` on several GPUs (docs/scaling.md).

    accelerate launch --config_file scripts/accelerate/ddp.yaml --num_processes 8 \
        scripts/train_grpo.py model=nemotron_nano data=competition run_name=sft8
    python scripts/train_grpo.py run_name=demo         # one process, same outputs

Mirrors notebooks/03_grpo.ipynb with the same Hydra overrides and folder: starts from the SFT adapter
of the same run_dir (02_sft must have finished: notebook or scripts/train_sft.py), trains with
lab.grpo.train on every process, then the training model is deleted and its memory released, and
the main process alone evaluates the saved adapter (packed, with the vllm back-end) on the held-out split and writes `<run_dir>/03_grpo/predictions.csv` and `metrics.json` (accuracy_sft_start,
accuracy_after, delta, per-category SFT vs GRPO, the training metrics), which 04_vote and 05_errors read.

Deliberately thin: `--no-eval` skips the evaluation (then the metrics hold only the training side).
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    import _launch

    overrides, no_eval = _launch.overrides_from(argv)
    state, stage, cfg = _launch.open_stage("03_grpo", overrides)
    import pandas as pd

    from lab import data, generate, grpo, models
    from lab.io import read_json
    from lab.run import stage_output

    train, val = data.prepare(cfg)
    sft_dir = stage_output(cfg, "02_sft")
    sft_metrics = read_json(sft_dir / "metrics.json")
    grpo.check_backend(cfg)  # a refused rollout back-end fails before the model loads
    model, tokenizer = models.load(cfg, adapter=cfg.grpo.init_adapter, trainable=True)
    metrics, model, log = grpo.train(cfg, stage, train, model, tokenizer)
    del model  # the training model leaves the GPU before an evaluation engine starts (lab.generate)
    if not _launch.leave_distributed(state):
        return 0
    if not no_eval:
        with generate.Generator(cfg, adapter=cfg.grpo.adapter_dir) as gen:
            after = generate.predictions(gen, val, out_csv=stage.path("predictions.csv"))
        start = pd.read_csv(sft_dir / "predictions.csv", dtype=str, keep_default_na=False)
        table = pd.DataFrame({"sft": start.groupby("category")["correct"].apply(lambda s: (s == "True").mean()),
                              "grpo": after.groupby("category")["correct"].mean()})
        acc = float(after["correct"].mean())
        metrics = {"accuracy_sft_start": float(sft_metrics["accuracy_after"]), "accuracy_after": acc,
                   "delta": acc - float(sft_metrics["accuracy_after"]), "per_category": table.to_dict("index"),
                   **metrics}
        print(f"held-out accuracy: SFT start {metrics['accuracy_sft_start']:.3f} -> after GRPO {acc:.3f}")
    return _launch.finish(state, stage, metrics)


if __name__ == "__main__":
    sys.exit(main())
