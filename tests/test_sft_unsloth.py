"""sft.backend=unsloth loads and wraps through Unsloth's own FastModel (a stand-in `unsloth` module, CPU)."""

from __future__ import annotations

import sys
import types

import pytest

from lab import config, sft, sft_unsloth
from lab import LabError
from lab.run import Stage


class Called(Exception):
    """Raised by the stand-in loader once it has recorded its call: the test needs nothing after the load."""


def fake_unsloth(monkeypatch, calls):
    class FastModel:
        @staticmethod
        def from_pretrained(**kw):
            calls.append(("from_pretrained", kw))
            raise Called

        @staticmethod
        def get_peft_model(model, **kw):
            calls.append(("get_peft_model", kw))
            raise Called

    mod = types.ModuleType("unsloth")
    mod.FastModel = FastModel
    monkeypatch.setitem(sys.modules, "unsloth", mod)


def cfg_for(tmp_path, *extra):
    (tmp_path / "nemotron").mkdir(exist_ok=True)  # model.path must be a model folder (validated at compose time)
    (tmp_path / "nemotron" / "config.json").write_text("{}")  # never loaded: Unsloth is a stand-in
    return config.compose([f"run_dir={tmp_path}", "model=nemotron_nano", f"model.path={tmp_path / 'nemotron'}",
                           "sft.backend=unsloth", *extra])


def test_unsloth_is_not_imported_with_the_lab():
    import subprocess

    code = "import sys, lab.sft, lab.sft_unsloth; print('unsloth' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_sft_train_loads_through_unsloths_fastmodel(tmp_path, monkeypatch):
    """With no model handed in, SFT loads through FastModel.from_pretrained (16-bit LoRA), not transformers."""
    from lab import models
    from lab.puzzles import generate

    calls = []
    fake_unsloth(monkeypatch, calls)
    monkeypatch.setattr(models, "load", lambda *a, **k: pytest.fail("loaded with transformers, not Unsloth"))
    monkeypatch.setattr(models, "model_path", lambda cfg: "/models/nemotron")
    cfg = cfg_for(tmp_path, "sft.lora.targets=[q_proj,experts]")
    with pytest.raises(Called):
        sft.train(cfg, Stage("02_sft", cfg=cfg), generate("numeral_system", 2, 0))
    (name, kw), = calls
    assert name == "from_pretrained" and kw["model_name"] == "/models/nemotron"
    assert kw["max_seq_length"] == 8192 and str(kw["dtype"]) == "torch.bfloat16"
    assert (kw["load_in_4bit"], kw["load_in_8bit"], kw["load_in_16bit"], kw["full_finetuning"]) == (False, False, True,
                                                                                                    False)
    assert kw["trust_remote_code"] is False and kw["use_gradient_checkpointing"] == "unsloth"


def test_get_peft_model_gets_the_labs_targets_and_lm_head_is_refused(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from lab import memory

    calls = []
    fake_unsloth(monkeypatch, calls)
    from omegaconf import OmegaConf

    tiny = memory.meta_model(OmegaConf.to_container(config.compose([]).model.architecture))  # shapes only
    cfg = cfg_for(tmp_path, "sft.lora.targets=[q_proj,in_proj,experts]")
    with pytest.raises(Called):
        sft_unsloth.attach_lora(cfg, tiny)
    (name, kw), = calls
    assert name == "get_peft_model" and kw["r"] == 32 and kw["lora_alpha"] == 32
    assert kw["target_modules"] == ["in_proj", "q_proj"]
    assert kw["target_parameters"] == ["mixer.experts.up_proj", "mixer.experts.down_proj"]
    with pytest.raises(LabError, match=r"lm_head.*modules_to_save.*sft\.backend=hf"):
        sft_unsloth.attach_lora(cfg_for(tmp_path), tiny)  # the preset's targets include lm_head


def test_lm_head_with_unsloth_is_refused_before_loading(tmp_path, monkeypatch):
    calls = []
    fake_unsloth(monkeypatch, calls)
    cfg = cfg_for(tmp_path)  # the preset's targets, lm_head included
    with pytest.raises(LabError, match=r"lm_head.*sft\.backend=hf"):
        sft.train(cfg, Stage("02_sft", cfg=cfg), None)
    assert calls == []


def test_without_unsloth_the_error_says_what_to_do(monkeypatch):
    monkeypatch.setitem(sys.modules, "unsloth", None)  # import unsloth -> ImportError
    with pytest.raises(LabError, match=r"backend=unsloth needs the `unsloth` package.*sft\.backend=hf"):
        sft_unsloth.require()
