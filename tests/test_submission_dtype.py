"""submission.zip is bf16 (issue 26, item 6): the stage notebooks and the CLI pack the LoRA tensors in
`lab.model.submission.SUBMISSION_DTYPE`, half the bytes of PEFT's fp32 adapter; `pack`'s own default keeps the saved dtype."""

from __future__ import annotations

import os
import zipfile

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")

from lab.core import config  # noqa: E402
from lab.__main__ import main as lab_main
from lab.model import lora, models, submission


def _dtypes(zip_path) -> set:
    from safetensors.torch import load

    with zipfile.ZipFile(zip_path) as z:
        return {t.dtype for t in load(z.read(submission.WEIGHTS_NAME)).values()}


def _weights_size(zip_path) -> int:
    with zipfile.ZipFile(zip_path) as z:
        return z.getinfo(submission.WEIGHTS_NAME).file_size


def test_cli_packs_bf16_by_default_and_keep_keeps_fp32(tmp_path):
    cfg = config.compose([f"run_dir={tmp_path}", "sft.lora.targets=[q_proj,experts]"])
    model, _ = models.load(cfg)
    pm, _ = lora.attach_lora(cfg, model)
    adapter = lora.save_adapter(pm, tmp_path / "adapter")
    assert submission.SUBMISSION_DTYPE == "bfloat16"
    assert lab_main(["pack", str(adapter), str(tmp_path / "bf16.zip")]) == 0
    assert lab_main(["pack", str(adapter), str(tmp_path / "fp32.zip"), "--dtype", "keep"]) == 0
    assert _dtypes(tmp_path / "bf16.zip") == {torch.bfloat16} and _dtypes(tmp_path / "fp32.zip") == {torch.float32}
    assert submission.check(tmp_path / "bf16.zip") == []
    assert _weights_size(tmp_path / "bf16.zip") < 0.51 * _weights_size(tmp_path / "fp32.zip")
    assert _dtypes(submission.pack(adapter, tmp_path / "api.zip")) == {torch.float32}  # pack() alone: as saved


@pytest.mark.parametrize("notebook, adapter_key", [("02_sft", "sft"), ("03_grpo", "grpo")])
def test_stage_notebooks_pack_the_submission_in_the_submission_dtype(notebook, adapter_key):
    import importlib
    import inspect

    from lab.recipes import common  # the stage functions (lab.recipes.sft.sft / grpo) pack through it

    recipe = importlib.import_module(f"lab.recipes.{adapter_key}")
    assert f"pack_adapter(stage, cfg.{adapter_key}.adapter_dir)" in inspect.getsource(getattr(recipe, adapter_key))
    calls = [line.strip() for m in (recipe, common) for line in inspect.getsource(m).splitlines()
             if "submission.pack(" in line]
    assert calls == ['zip_path = submission.pack(adapter_dir, stage.path("submission.zip"), '
                     "dtype=submission.SUBMISSION_DTYPE)"]
