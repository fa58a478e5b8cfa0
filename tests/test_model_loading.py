"""The model loads straight onto its device (issue 26, item 5): `from_pretrained(device_map=...)`, never a load into
host RAM followed by `.to(device)`. Tiny model, CPU."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")

from lab.core import config  # noqa: E402
from lab.model import models


def test_load_passes_the_device_as_device_map_and_never_moves_the_model(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    cfg = config.compose([f"run_dir={tmp_path / 'run'}", f"model.path={tmp_path / 'base_model'}", "model.device=cpu"])
    models.model_path(cfg)  # build the tiny model first (building may move tensors)
    seen = {}
    original = AutoModelForCausalLM.from_pretrained.__func__

    def spy(cls, *args, **kwargs):
        seen.update(kwargs)
        return original(cls, *args, **kwargs)

    def no_move(self, *args, **kwargs):
        raise AssertionError(f"{type(self).__name__}.to{args} after loading: the weights went through host RAM")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", classmethod(spy))
    with monkeypatch.context() as m:
        m.setattr(torch.nn.Module, "to", no_move)
        model, _ = models.load(cfg)
    assert seen["device_map"] == "cpu" and seen["dtype"] == torch.float32
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    assert not hasattr(model, "hf_device_map")  # one device: no accelerate dispatch hooks
