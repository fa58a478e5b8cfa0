"""`python -m lab memory`: the command line of `lab.plan.memory`, apart from it so that `--help` answers without
importing torch (the trace module subclasses torch's dispatch mode at import)."""

from __future__ import annotations

import argparse
import json


def main(argv: list[str] | None = None) -> int:
    """`python -m lab memory [OVERRIDES...] [--stage sft|grpo] [--tokens N] [--mamba kernel|torch] [--json PATH]`"""
    ap = argparse.ArgumentParser(prog="python -m lab memory", description="trace one training micro-step of the "
                                 "composed config on fake tensors and print its peak memory against the gpu= card")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model=nemotron_nano experiment=competition")
    ap.add_argument("--stage", choices=("sft", "grpo"), default="sft", help="which training step (default: sft)")
    ap.add_argument("--tokens", type=int, default=None, help="tokens per row (default: the config's)")
    ap.add_argument("--rows", type=int, default=None, help="rows per micro-step (default: sft.batch_size; GRPO: "
                    "one pack of grpo.pack_tokens with grpo.packing, else grpo.per_device_train_batch_size, else "
                    "prompts_per_step x num_generations)")
    ap.add_argument("--mamba", choices=("kernel", "torch"), default="kernel",
                    help="kernel: mamba_ssm + causal_conv1d (what real training requires); torch: transformers' "
                         "PyTorch scan (what runs when they are absent)")
    ap.add_argument("--json", default=None, help="write the result as JSON here (a new file)")
    ap.add_argument("--force", action="store_true", help="replace --json PATH when it exists")
    a = ap.parse_intermixed_args(argv)
    from lab.core import owner
    from lab.core.config import compose
    from lab.core.io import atomic_write_text
    from lab.plan.grpo_policy import generation_phase, generation_report, separate_pass_engine
    from lab.plan.memory import as_json, report, trace
    from lab.plan.shapes import gpu_gib

    cfg = compose(a.overrides)
    out_json = owner.output_file(a.json, "memory --json", a.force) if a.json else None
    t = trace(cfg, a.stage, a.tokens, mamba=a.mamba, rows=a.rows)
    card, use = gpu_gib(cfg), float(cfg.gpu.max_use)
    print(report(t, card, use))
    out, ok = as_json(t, card, use), card is None or t.peak_gib <= use * card
    if a.stage == "grpo" and cfg.grpo.rollout_backend == "vllm":  # the other phase: the engine samples
        ph = generation_phase(cfg)
        print(generation_report(ph, use))
        out["generation"], ok = ph, ok and ph.get("fits", True)
        if separate_pass_engine(cfg):  # the pass rates' own engine, before the optimizer exists
            first = generation_phase(cfg, phase="pass_rates")
            print(generation_report(first, use))
            out["generation_pass_rates"], ok = first, ok and first.get("fits", True)
    if a.json:
        atomic_write_text(out_json, json.dumps(out, indent=1))
    return 0 if ok else 1
