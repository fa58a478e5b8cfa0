"""One projection of a training checkpoint's bytes (`lab.plan.shapes.checkpoint_bytes`: the fp32 adapter and the
optimizer's states), held to a checkpoint the Trainer really saves: one SFT step of the tiny model with AdamW. The
Kaggle output plan and a training stage's disk-full message both use it (`lab.train.checkpoints.checkpoint_need`)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from lab.core import config  # noqa: E402
from lab.plan import shapes  # noqa: E402
from lab.train import checkpoints, sft, trl_private  # noqa: E402

pytestmark = pytest.mark.slow  # trains the tiny model one step and saves it: tens of seconds on two cores

TENSOR_FILES = ("adapter_model.safetensors", "optimizer.pt")  # what the projection counts
PER_TENSOR = 1024  # serialisation overhead allowed per saved tensor (safetensors header, torch.save's zip entry)
SMALL_FILES = 256 * 1024  # scheduler, RNG and trainer state, training arguments, adapter config and README, tokenizer


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(config, trainable parameters, trainable tensors, checkpoint folder) after one saved AdamW step."""
    from lab.model import lora, models
    from lab.puzzles import generate

    root = tmp_path_factory.mktemp("ckpt_bytes")
    cfg = config.compose([f"run_dir={root / 'run'}", f"model.path={root / 'base_model'}", "sft.batch_size=2",
                          "sft.max_steps=1", "sft.save_steps=1", "sft.warmup_ratio=0", "gpu.optim=adamw_torch"])
    model, tok = models.load(cfg)
    pm, _ = lora.attach_lora(cfg, model)
    trainable = [p for p in pm.parameters() if p.requires_grad]
    examples, _ = sft.sft_examples(tok, generate("numeral_system", 4, 0), 10_000)
    out = root / "ck"
    trl_private.install()  # CPU: TRL's Triton log-prob kernel is absent, its PyTorch twin goes in its slot
    trainer = sft.build_trainer(cfg, out, pm, tok, examples, [checkpoints.marker_callback()])
    trainer.train()
    return cfg, sum(p.numel() for p in trainable), len(trainable), out


def test_the_projection_matches_a_saved_adamw_checkpoint(saved):
    cfg, params, tensors, out = saved
    ck = out / "checkpoint-1"
    tensor_bytes = sum((ck / f).stat().st_size for f in TENSOR_FILES)
    projected, how = shapes.checkpoint_bytes(cfg, params)
    assert projected == 12 * params and "two fp32 moments" in how
    # AdamW saves two moments per tensor and the adapter one copy: at most PER_TENSOR bytes of framing each
    assert projected <= tensor_bytes <= projected + 3 * tensors * PER_TENSOR, (tensor_bytes, projected, tensors)
    whole = checkpoints.measured_checkpoint_bytes(out)
    print(f"P = {params:,} trainable in {tensors} tensors; projected {projected:,} B; adapter + optimizer.pt "
          f"{tensor_bytes:,} B ({tensor_bytes / projected - 1:+.2%}); the whole checkpoint {whole:,} B")
    assert tensor_bytes < whole <= tensor_bytes + SMALL_FILES, sorted(
        (p.name, p.stat().st_size) for p in ck.iterdir() if p.name not in TENSOR_FILES)
    # the disk-full message takes the measured checkpoint once one exists, the projection before
    assert checkpoints.checkpoint_need(out, cfg, torch.nn.Linear(1, 1)) == whole
    assert checkpoints.checkpoint_need(out / "none", cfg, torch.nn.Linear(3, 2)) == 12 * 8


def test_8bit_adamw_projects_a_quarter_of_adamws_states(saved):
    """Negative control: the projection tells the optimizers apart, so the measured AdamW checkpoint lies far outside
    the 8-bit projection's tolerance (bitsandbytes is GPU-only here: its checkpoint is not measured on the CPU)."""
    cfg, params, tensors, out = saved
    eight = config.compose(["gpu.optim=adamw_bnb_8bit"])
    projected, how = shapes.checkpoint_bytes(eight, params)
    assert projected == int(params * (4 + 2 + 8 / 256)) and "uint8" in how
    tensor_bytes = sum((out / "checkpoint-1" / f).stat().st_size for f in TENSOR_FILES)
    assert tensor_bytes > projected + 3 * tensors * PER_TENSOR
