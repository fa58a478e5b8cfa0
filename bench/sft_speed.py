"""SFT speed, packed vs unpacked, on this CPU: `python bench/sft_speed.py [--json PATH]`.

What it measures: the tiny model (conf/model/tiny.yaml, built as the demo builds it) with the lab's LoRA
(conf/sft/default.yaml's families, `lab.model.lora.attach_lora`, lora_B at PEFT's zeros), gradient checkpointing on,
fp32, trained on the same `--rows` SFT rows per optimizer step (the recipe's 16): the demo's puzzles turned into SFT
rows by `lab.data.sft_examples` and tokenised by TRL's SFTTrainer exactly as 02_sft tokenises them
(`sft.build_trainer`, completion-only labels).
- unpacked: one row per micro-step (batch 1, grad_accum = rows);
- packed: the rows packed by TRL's best-fit decreasing (`trl.pack_dataset(..., strategy="bfd")`) into packs of up
  to `sft.max_seq_len` tokens (384 for the tiny model), one pack per micro-step (TRL's padding-free collator:
  position_ids restart per row), `lab.model.packed_rows` installed with `sft.packed_attention` (varlen by default; on
  CPU its reference path: each Mamba mixer and each row's attention run once per row).
Loss: the summed NLL of the step's completion tokens over their count (transformers' num_items_in_batch, as
SFTTrainer normalises), AdamW (lr 1e-3). Both runs start from the same weights; after one optimizer step each, the
LoRA gradients of the second step are compared tensor by tensor, ||g_packed - g_unpacked|| / ||g_unpacked||:
`max_grad_rel_diff` is the largest (at the first step the lora_A gradients are zero, since lora_B starts at zero).
Tokens/s: the step's real tokens over the median step time, in process CPU time with one torch thread (this machine is
shared; wall-time figures are reported beside).

Packing is not meant to be faster on a CPU, and is not much faster or slower here (runs on this shared machine
moved both ways by 10-20%): a CPU step costs about the same per token whatever the sequence length, so there is little
fixed per-micro-step cost to amortise (what packing saves on a GPU: RESULTS.md "First contact with a GPU", about 1 s
per micro-step of the real model), while the packed step does some work twice over: on the CPU path every Mamba mixer
still runs once per row, and so does each row's attention (sft.packed_attention=varlen; with `mask`, sdpa computes
the whole pack under a block-diagonal mask, quadratic in the pack's length instead of each row's). What this bench shows on a CPU is that packing is exact.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def sft_rows(cfg, model, tokenizer, n: int) -> list[dict]:
    """`n` SFT rows ({input_ids, labels}) as 02_sft's SFTTrainer tokenises them."""
    from lab.data.dataset import trace_styles
    from lab.model.lora import attach_lora
    from lab.puzzles import generate
    from lab.train import sft, trl_private

    trl_private.install()
    cats = list(cfg.data.categories or ["numeral_system"])
    puzzles = __import__("pandas").concat([generate(c, n, cfg.seed) for c in cats]).head(n)
    examples, _ = sft.sft_examples(tokenizer, puzzles, cfg.sft.max_seq_len, trace_styles(cfg))
    pm, _ = attach_lora(cfg, model)
    ds = sft.build_trainer(cfg, Path(tempfile.mkdtemp()), pm, tokenizer, examples).train_dataset
    return [{"input_ids": r["input_ids"], "labels": r["labels"]} for r in ds][:n]


def micro_batches(rows, packed: bool, max_len: int, pad_id: int):
    import torch
    from datasets import Dataset
    from trl import pack_dataset
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    if not packed:
        collate = DataCollatorForLanguageModeling(pad_token_id=pad_id)
        batches = [collate([r]) for r in rows]
    else:
        packs = pack_dataset(Dataset.from_list(rows), max_len, strategy="bfd")
        collate = DataCollatorForLanguageModeling(pad_token_id=pad_id, padding_free=True)
        batches = [collate([p]) for p in packs]
    return [{k: v for k, v in b.items() if isinstance(v, torch.Tensor)} for b in batches]


def step(model, opt, batches) -> dict:
    """One optimizer step over `batches`: the token-weighted loss of the step; returns the LoRA gradients."""
    import torch

    n = sum(int((b["labels"][..., 1:] != -100).sum()) for b in batches)
    for b in batches:
        kw = {"position_ids": b["position_ids"]} if "position_ids" in b else {"attention_mask": b["attention_mask"]}
        logits = model(input_ids=b["input_ids"], use_cache=False, **kw).logits[:, :-1].float()
        labels = b["labels"][:, 1:]
        logp = torch.log_softmax(logits, -1).gather(-1, labels.clamp(min=0)[..., None])[..., 0]
        (-(logp * (labels != -100)).sum() / n).backward()
    grads = {k: p.grad.detach().clone() for k, p in model.named_parameters() if p.requires_grad}
    opt.step()
    opt.zero_grad(set_to_none=True)
    return grads


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="also write the figures here (atomically)")
    ap.add_argument("--rows", type=int, default=16, help="rows per optimizer step (the recipe's 16)")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per mode (after one warm-up step)")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)

    import torch

    from lab.core import config
    from lab.model import models, packed_rows
    from lab.model.lora import attach_lora

    torch.set_num_threads(a.threads)
    tmp = Path(tempfile.mkdtemp(prefix="sft_speed_"))
    cfg = config.compose([f"run_dir={tmp}", "sft.gradient_checkpointing=true"])
    base, tok = models.load(cfg)
    rows = sft_rows(cfg, base, tok, a.rows)
    tokens = sum(len(r["input_ids"]) for r in rows)
    batches = {m: micro_batches(rows, m == "packed", cfg.sft.max_seq_len, tok.pad_token_id)
               for m in ("unpacked", "packed")}

    def fresh(mode):
        model, _ = models.load(cfg)
        torch.manual_seed(cfg.seed)  # PEFT draws lora_A from the global generator: the same start for both modes
        pm, _ = attach_lora(cfg, model)
        pm.base_model.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        pm.base_model.model.enable_input_require_grads()
        pm.train()
        if mode == "packed":
            packed_rows.install(pm, attention=str(cfg.sft.packed_attention))
        return pm, torch.optim.AdamW([p for p in pm.parameters() if p.requires_grad], lr=1e-3)

    runs = {m: fresh(m) for m in batches}
    def lora_weights(m):
        return {k: p.detach().clone() for k, p in runs[m][0].named_parameters() if p.requires_grad}

    grads = {m: [step(*runs[m], batches[m])] for m in runs}
    w_u, w_p = lora_weights("unpacked"), lora_weights("packed")
    for m in runs:  # the second step: from the weights after one optimizer step (also the timing's warm-up)
        grads[m].append(step(*runs[m], batches[m]))
    g_u, g_p = grads["unpacked"][1], grads["packed"][1]
    rel = {k: ((g_p[k] - g).norm() / g.norm()).item() for k, g in g_u.items()}
    g1u, g1p = grads["unpacked"][0], grads["packed"][0]
    rel1 = {k: ((g1p[k] - g).norm() / g.norm()).item() for k, g in g1u.items() if g.norm() > 0}
    cpu, wall = {m: [] for m in runs}, {m: [] for m in runs}
    for _ in range(a.steps):  # the modes interleaved, so a change of load on this shared machine hits both
        for m in runs:
            c0, w0 = time.process_time(), time.perf_counter()
            step(*runs[m], batches[m])
            cpu[m].append(time.process_time() - c0)
            wall[m].append(time.perf_counter() - w0)
    speed = {m: tokens / statistics.median(cpu[m]) for m in runs}
    out = {
        "packed_tokens_per_s": round(speed["packed"], 1),
        "unpacked_tokens_per_s": round(speed["unpacked"], 1),
        "max_grad_rel_diff": max(rel.values()),
        "max_grad_rel_diff_step1": max(rel1.values()),
        "worst_tensor_step2": max(rel, key=rel.get),
        "max_weight_rel_diff_after_step1": max(((w_p[k] - w).norm() / w.norm()).item() for k, w in w_u.items()
                                               if w.norm() > 0),
        "zero_grad_tensors_step2": sum(1 for g in g_u.values() if g.norm() == 0),
        "lora_tensors": len(rel),
        "wall_tokens_per_s": {m: round(tokens / statistics.median(wall[m]), 1) for m in runs},
        "rows_per_step": len(rows), "tokens_per_step": tokens,
        "micro_steps_per_step": {m: len(b) for m, b in batches.items()},
        "pack_lengths": [int(b["input_ids"].shape[1]) for b in batches["packed"]],
        "max_seq_len": int(cfg.sft.max_seq_len), "packed_attention": str(cfg.sft.packed_attention), "timed_steps": a.steps, "torch_threads": torch.get_num_threads(),
        "clock": "process CPU time", "load_average_1min": round(os.getloadavg()[0], 2), "device": "cpu",
        "dtype": "float32", "gradient_checkpointing": True,
    }
    print(json.dumps(out, indent=1))
    ratio = speed["packed"] / speed["unpacked"]
    print(f"\nOn this CPU: packed {speed['packed']:.0f} vs unpacked {speed['unpacked']:.0f} tokens/s "
          f"(x{ratio:.2f}). Packing does not make a CPU faster: a CPU step costs about the same per token at any "
          "length, and on the CPU path every Mamba mixer and every row's attention still run once per row "
          f"(sft.packed_attention={out['packed_attention']}). It pays on a GPU, where each micro-step has a fixed cost (about 1 s for "
          "the real model, RESULTS.md). What it shows here is exactness: the LoRA gradients after one optimizer step "
          f"differ by at most {out['max_grad_rel_diff']:.1e} relative ({out['max_grad_rel_diff_step1']:.1e} at the "
          "first step; AdamW's first update, g/sqrt(g^2), magnifies rounding where a gradient is near zero).")
    if a.json:
        from lab.core.io import atomic_write_json

        atomic_write_json(a.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
