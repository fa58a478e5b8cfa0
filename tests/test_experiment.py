"""The competition preset, `experiment=competition`, by what it does: it composes alone or beside its groups in any
order and an explicit override still wins; `model=nemotron_nano` alone trains with the real model's recipe, not the
tiny demo's; its values stay inside the competition's limits (Kaggle's scoring settings, conf/infer/kaggle.yaml);
it runs under the sweep command; and (slow) one training step of its SFT and of its GRPO fits its card by
lab.plan.memory's check. The values themselves live, with their sources, in the conf/ files the preset names."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from lab.core.config import compose

PRESET = ["model=nemotron_nano", "experiment=competition", "data=competition"]


def _plain(node):
    return OmegaConf.to_container(node, resolve=True)


def test_the_preset_alone_and_in_any_order_gives_the_same_recipe():
    want = _plain(compose(PRESET))
    assert _plain(compose(["experiment=competition"])) == want
    assert _plain(compose(["data=competition", "experiment=competition", "model=nemotron_nano"])) == want
    assert compose([*PRESET, "sft.learning_rate=1e-4"]).sft.learning_rate == 1e-4  # an explicit override wins


def test_the_real_model_alone_trains_with_the_real_recipe_not_the_tiny_demos():
    tiny = compose([])
    real = compose(["model=nemotron_nano", "run_name=r"])  # one run folder: adapter_dir derives from it
    preset = compose([*PRESET, "run_name=r"])
    assert _plain(real.sft) == _plain(preset.sft) and _plain(real.grpo) == _plain(preset.grpo)
    assert real.sft.learning_rate != tiny.sft.learning_rate and real.sft.batch_size != tiny.sft.batch_size
    assert real.grpo.max_steps != tiny.grpo.max_steps and real.grpo.learning_rate != tiny.grpo.learning_rate


def test_the_preset_stays_inside_the_competition_limits():
    from lab.model.lora import FAMILIES

    c = compose(["experiment=competition"])
    kaggle = compose(["infer=kaggle"]).infer  # Kaggle's scoring settings and limits
    assert _plain(c.infer) == _plain(kaggle)  # every evaluation scores the way Kaggle does
    assert 1 <= c.sft.lora.r <= kaggle.max_lora_rank  # an adapter Kaggle's vLLM loads
    assert c.model.max_model_len == kaggle.max_model_len  # the context the scorer serves
    assert c.sft.max_seq_len <= kaggle.max_model_len  # never trained on longer sequences than are served
    assert c.infer.max_tokens < c.model.max_model_len  # room for the prompt
    assert set(c.sft.lora.targets) <= set(FAMILIES)  # families the lab trains and packs for vLLM
    assert c.grpo.init_adapter == c.sft.adapter_dir  # GRPO starts from this run's SFT adapter


def test_the_preset_composes_under_the_sweep_command(tmp_path: Path):
    from lab.runs import sweep as sw

    p = sw.plan(["experiment=competition", "sft.learning_rate=1e-4,2e-4"], seeds=1)
    assert p["named"] == ["sft.learning_rate", "seed"] and "experiment" in p["fixed"]
    seen = sw.multirun(sw.hydra_overrides(p, tmp_path / "s", "basic"),
                       lambda cfg: (cfg.model.name, cfg.sft.learning_rate, cfg.sft.grad_accum, cfg.data.source))
    real = compose(PRESET)
    assert sorted(seen) == [(real.model.name, lr, real.sft.grad_accum, real.data.source) for lr in (1e-4, 2e-4)]


@pytest.mark.slow  # a fake-tensor trace of the 30B model: tens of seconds each
@pytest.mark.parametrize("stage", ["sft", "grpo"])
def test_one_training_step_of_the_preset_fits_its_card(stage, monkeypatch):
    """lab.plan.memory.check_fits as 02_sft and 03_grpo call it (it raises when the step does not fit the card), on a
    machine with the fused Mamba kernels real training needs; without them it refuses (tests/test_preflight.py)."""
    pytest.importorskip("torch")
    from lab.model import models
    from lab.plan import memory, shapes

    monkeypatch.setattr(models, "missing_mamba_kernels", lambda: {})  # as on a machine with the fused kernels
    cfg = compose(["experiment=competition"])
    t = memory.check_fits(cfg, stage)
    assert t is not None and "stand-in" in t.mamba_path
    assert t.peak_gib <= cfg.gpu.max_use * shapes.gpu_gib(cfg)
