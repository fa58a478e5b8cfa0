"""FSDP2 (torch `fully_shard`) on CPU/gloo, the tiny model, the lab's lm_head LoRA; for tests/test_distributed.py.

    torchrun --nproc_per_node 2 tests/fsdp2_probe.py RUN_DIR     (RUN_DIR/base_model built beforehand)

Every rank builds the same LoRA model (the head's lora_B made non-zero), keeps an unsharded copy as the reference,
then shards the other with `fully_shard` per NemotronH block and at the root; each rank runs its own batch, so
the ranks route tokens to different experts (the case that hangs FSDP1 with per-expert units, pytorch #126616).
Checked on every rank, printed as one JSON line per rank: (1) `lab.model.lora.head_as_linear` on the sharded head,
outside any forward, where every weight is a DTensor shard, equals the reference (TRL's head gathers with
`full_tensor()` there too); (2) one fused-head forward and backward (TRL's `add_fused_lm_head`, wrapped by
`lab.model.lora.install_fused_lora_head`) of the sharded model gives the reference's loss and, gathered, the ranks'
mean of the reference's lm_head LoRA gradients. Not a test module itself.
"""

from __future__ import annotations

import copy
import json
import os
import sys

import torch
import torch.distributed as dist


def main(run_dir: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor
    from trl.trainer.utils import add_fused_lm_head

    from lab.core import config
    from lab.model import lora, models
    from lab.train import trl_private

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    trl_private.install()  # CPU: TRL's Triton kernel is absent (lab.train.trl_private)
    cfg = config.compose([f"run_dir={run_dir}", f"model.path={run_dir}/base_model",
                          "sft.lora.targets=[q_proj,in_proj,experts,lm_head]"])
    torch.manual_seed(0)
    model, tok = models.load(cfg)
    pm, _ = lora.attach_lora(cfg, model)
    head = lora.head_lora(pm)
    with torch.no_grad():
        head.lora_B["default"].weight.normal_(std=0.5)  # lora_B starts at zero: make the LoRA change the logits
    add_fused_lm_head(pm.get_base_model(), outputs=("log_probs", "entropy", "is_top1"))
    lora.install_fused_lora_head(pm)
    ref = copy.deepcopy(pm)
    texts = [["12 + 30 = 42", "7 * 6 = 42"], ["XIV in roman numerals", "abc -> cba, xyz -> zyx"]][rank % 2]
    ids = tok(texts, return_tensors="pt", padding=True)  # each rank its own batch: its own experts routed
    batch = {"input_ids": ids["input_ids"], "attention_mask": ids["attention_mask"],
             "labels": ids["input_ids"].masked_fill(ids["attention_mask"] == 0, -100)}
    x = torch.randn(5, cfg.model.architecture.hidden_size)

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in pm.get_base_model().model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(pm, mesh=mesh)
    sharded = isinstance(head.base_layer.weight, DTensor) and isinstance(head.lora_B["default"].weight, DTensor)

    # (1) outside any forward: DTensor shards, gathered by lab.model.lora.full_weight
    h, w, _ = lora.head_as_linear(head, x)
    rh, rw, _ = lora.head_as_linear(lora.head_lora(ref), x)
    linear_diff = max((h - rh).abs().max().item(), (w - rw).abs().max().item())

    # (2) one fused-head training step, forward and backward
    out, rout = pm(**batch, fused_lm_head=True), ref(**batch, fused_lm_head=True)
    out.loss.backward()
    rout.loss.backward()
    grad_diff = 0.0
    for name in ("lora_A", "lora_B"):
        g = getattr(head, name)["default"].weight.grad
        g = g.full_tensor() if isinstance(g, DTensor) else g
        want = getattr(lora.head_lora(ref), name)["default"].weight.grad.clone()
        dist.all_reduce(want)  # FSDP2 averages the ranks' gradients (reduce-scatter): so does the reference
        grad_diff = max(grad_diff, (g - want / dist.get_world_size()).abs().max().item())
    # one file per rank: two ranks printing to one pipe can interleave their lines
    with open(os.path.join(run_dir, f"fsdp2_rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "sharded": sharded, "head_as_linear_max_abs": linear_diff,
                   "loss": out.loss.item(), "ref_loss": rout.loss.item(), "grad_max_abs": grad_diff}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main(sys.argv[1])
