"""The lm_head LoRA trains under TRL 1.15's fused head (lab.model.lora), on the tiny model, CPU."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")

import exactness  # noqa: E402

from lab.core import config  # noqa: E402
from lab.model import lora, models
from lab.train import sft
from lab.core import paths
from lab.core.run import Stage  # noqa: E402
from lab.puzzles import generate  # noqa: E402
from train_steps import sft_train  # noqa: E402


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("lora")


def compose(root, name, *extra):
    return config.compose([f"run_dir={root / name}", f"model.path={root / 'base_model'}", "sft.batch_size=2",
                           "sft.logging_steps=1", "sft.save_steps=100", "sft.max_steps=3",
                           "sft.lora.targets=[q_proj,in_proj,experts,lm_head]", *extra])


@pytest.fixture(scope="module")
def puzzles():
    return generate("numeral_system", 6, 0)


def test_trl_refuses_an_lm_head_lora_without_lab_lora(root, puzzles):
    """The reason lab.model.lora exists: TRL's own check, unchanged."""
    from datasets import Dataset
    from trl import SFTTrainer

    cfg = compose(root, "refused")
    model, tok = models.load(cfg)
    pm, _ = lora.attach_lora(cfg, model)
    ex, _ = sft.sft_examples(tok, puzzles, 384)
    with pytest.raises(ValueError, match="lm_head"):
        SFTTrainer(model=pm, args=sft.training_args(cfg, root / "refused" / "ck"), processing_class=tok,
                   train_dataset=Dataset.from_pandas(ex[["prompt", "completion"]], preserve_index=False))


def test_fused_lora_head_equals_the_models_own_logits_and_reaches_the_adapter(root, puzzles):
    """The fused log-probabilities equal log_softmax of the ordinary forward (which applies the LoRA head through
    PEFT's module), with a non-zero lm_head LoRA; and the loss's gradient reaches lm_head's lora_A and lora_B."""
    from lab.train import trl_private

    trl_private.install()  # CPU: TRL's Triton kernel is absent; lab.train.trl_private puts the same computation in its slot
    cfg = compose(root, "equal")
    model, tok = models.load(cfg)
    pm, table = lora.attach_lora(cfg, model)
    assert "lm_head" in set(table["family"])
    head = lora.head_lora(pm)
    with torch.no_grad():
        head.lora_B["default"].weight.normal_(std=0.5)  # lora_B starts at zero: make the LoRA change the logits
    ex, _ = sft.sft_examples(tok, puzzles, 384)
    trainer = sft.build_trainer(cfg, root / "equal" / "ck", pm, tok, ex.head(2))
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    pm.train()
    out = pm(**batch, fused_lm_head=True)
    logits = pm(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
    labels = batch["labels"][:, 1:]
    mask = labels != -100
    want = torch.log_softmax(logits[:, :-1], -1).gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    # the same call with the head's LoRA switched off differs: the fused head really applied it
    with pm.disable_adapter():
        off = pm(**batch, fused_lm_head=True).log_probs
    out.loss.backward()
    for name in ("lora_A", "lora_B"):
        g = getattr(head, name)["default"].weight.grad
        assert g is not None and g.abs().sum() > 0, name
    assert head.base_layer.weight.grad is None  # frozen
    # exact (tests/exactness.py): both against the model's own forward in fp64 ("eager" experts: grouped_mm has no
    # fp64 kernel), the adapter switched off as the negative control
    pm.double()
    pm.base_model.model.set_experts_implementation("eager")
    with torch.no_grad():
        logits64 = pm(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    want64 = torch.log_softmax(logits64[:, :-1], -1).gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    exactness.check_abs("fused LoRA head: log-probs", out.log_probs[mask].detach(), want[mask], want64[mask],
                 negative=off[mask].detach())


@pytest.mark.slow  # a real SFT run of three steps: seconds (the fast lane stays short)
def test_sft_trains_the_lm_head_lora_and_leaves_frozen_weights(root, puzzles):
    """The TRL way: after SFT, lm_head's LoRA weights changed; the frozen lm_head, embeddings and others did not."""
    cfg = compose(root, "train")
    model, tok = models.load(cfg)
    frozen = {"lm_head": model.lm_head.weight, "embeddings": model.model.embeddings.weight}
    frozen_before = {k: v.detach().clone() for k, v in frozen.items()}
    original = sft.attach_lora
    seen = {}

    def attach(cfg, model):
        pm, table = original(cfg, model)
        seen.update({n: p.detach().clone() for n, p in pm.named_parameters() if "lm_head.lora_" in n})
        return pm, table

    sft.attach_lora = attach
    try:
        m, pm, _, _ = sft_train(cfg, Stage("02_sft", cfg=cfg), puzzles, model, tok)
    finally:
        sft.attach_lora = original
    assert m["steps"] == 3 and m["gradient_check_failed"] == []
    assert m["lora_targets"]["lm_head"] == 1
    assert len(seen) == 2  # lora_A and lora_B
    params = dict(pm.named_parameters())
    for n, before in seen.items():
        assert not torch.equal(params[n].detach(), before), f"{n} did not move"
    for k, before in frozen_before.items():
        assert torch.equal(frozen[k].detach(), before), k
    from safetensors.torch import load_file

    saved = load_file(str(paths.resolve_path(cfg.sft.adapter_dir) / "adapter_model.safetensors"))
    assert {"base_model.model.lm_head.lora_A.weight", "base_model.model.lm_head.lora_B.weight"} <= set(saved)
    assert "base_model.model.lm_head.weight" not in saved  # never a full copy of the head
    ck = load_file(str(paths.resolve_path(cfg.run_dir) / "checkpoints" / "02_sft" / "checkpoint-3"
                       / "adapter_model.safetensors"))
    assert set(ck) == set(saved)  # the Trainer's checkpoints neither
    # the submission zip carries the head's LoRA and passes the lab's own check
    import zipfile

    from lab.model import submission

    zp = submission.pack(cfg.sft.adapter_dir, root / "train" / "submission.zip")
    assert submission.check(zp) == []
    with zipfile.ZipFile(zp) as z:
        packed = load_file_bytes(z.read("adapter_model.safetensors"))
    assert {"base_model.model.lm_head.lora_A.weight", "base_model.model.lm_head.lora_B.weight"} <= set(packed)
    torch.testing.assert_close(packed["base_model.model.lm_head.lora_B.weight"].float(),
                               saved["base_model.model.lm_head.lora_B.weight"].float(), rtol=1e-2, atol=1e-3)


def load_file_bytes(data: bytes) -> dict:
    from safetensors.torch import load

    return load(data)
