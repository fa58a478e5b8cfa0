"""Fast paths that fall back with a reason (lab.train.fast_paths), on the CPU: a kernel reported missing gives one
named line when a training stage opens, and the stage runs on the exact path; a forced fast path that cannot run is
refused; a failed calibration switches its path off; stages that train nothing decide nothing."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")

import real_signatures as rs  # noqa: E402

from lab import LabError  # noqa: E402
from lab.core import config  # noqa: E402
from lab.model import experts_lora, lora, models  # noqa: E402
from lab.train import fast_paths  # noqa: E402

FAILED = {"exact": {"routed_experts": {"err": 3e-2, "bound": 2e-5, "negative": 4.0, "ok": False},
                    "varlen_attention": {"err": 1e-6, "bound": 2e-5, "negative": 4.0, "ok": True}}}


def _gpu_without_mamba_ssm(monkeypatch):
    """A CUDA machine where mamba_ssm does not import: what the line must name."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(models, "missing_mamba_kernels",
                        lambda: {"mamba_ssm": "ModuleNotFoundError: No module named 'mamba_ssm'"})


def test_a_missing_kernel_gives_the_named_line_and_the_stage_runs_the_exact_path(monkeypatch, tmp_path, capsys):
    import transformers.models.nemotron_h.modeling_nemotron_h as mh
    from transformers import NemotronHConfig, NemotronHForCausalLM

    from lab.recipes.common import open_stage

    _gpu_without_mamba_ssm(monkeypatch)
    stage = open_stage("02_sft", [f"run_dir={tmp_path / 'run'}"])
    out = capsys.readouterr().out
    (line,) = [x for x in out.splitlines() if x.startswith("fast path")]
    assert line.startswith("fast path packed_rows_fused off (sft.fused_mamba=off): mamba_ssm does not import "
                           "(ModuleNotFoundError: No module named 'mamba_ssm')")
    assert "the unfused mixer" in line and "cost: " in line
    assert stage.cfg.sft.fused_mamba == "off" and stage.overrides[-1] == "sft.fused_mamba=off"
    assert config.OmegaConf.load(stage.dir / "config.yaml").sft.fused_mamba == "off"  # the record says what ran

    # the stage's config on the model: the fused kernel (here a stand-in bound to mamba-ssm's signature) is never
    # called, and the result is the exact path's, bit for bit
    arch = config.OmegaConf.to_container(stage.cfg.model.architecture, resolve=True)
    torch.manual_seed(0)
    pm, _ = lora.attach_lora(stage.cfg, NemotronHForCausalLM(NemotronHConfig(**arch)).float())
    pm.train()
    ids = torch.randint(5, 300, (1, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        exact = pm(input_ids=ids, use_cache=False).logits
    calls = []
    guard = mh.__dict__[lora.FUSED_FN]
    monkeypatch.setattr(guard, "inner", rs.hub_kernel(monkeypatch, "mamba_split_conv1d_scan_combined", guard.inner,
                                                      lambda *a, **k: torch.zeros(()), calls))
    with torch.no_grad():
        got = pm(input_ids=ids, use_cache=False).logits
    assert calls == [] and torch.equal(got, exact)
    lora.guard_fused_mamba_out_proj(pm, fused=True)  # the negative control: switched on, the kernel is called
    with pytest.raises(Exception):
        pm(input_ids=ids, use_cache=False)  # (the stand-in's zeros are no mixer output)
    assert calls


def test_a_forced_fast_path_that_cannot_run_is_refused(monkeypatch):
    _gpu_without_mamba_ssm(monkeypatch)
    with pytest.raises(LabError, match="sft.fused_mamba=on forces packed_rows_fused, but mamba_ssm does not import"):
        fast_paths.resolve("02_sft", config.compose(["sft.fused_mamba=on"]))
    assert fast_paths.resolve("02_sft", config.compose(["sft.fused_mamba=off"])) == ([], [])  # the exact path: asked


def test_a_failed_calibration_switches_its_path_off(monkeypatch):
    _gpu_without_mamba_ssm(monkeypatch)
    monkeypatch.setattr(models, "missing_mamba_kernels", lambda: {})  # every kernel here
    cfg = config.compose(["sft.packing=true"])
    assert fast_paths.resolve("02_sft", cfg) == ([], [])  # all there, nothing measured: the fast paths stay
    overrides, lines = fast_paths.resolve("02_sft", cfg, FAILED)
    assert overrides == ["sft.lora.experts_path=fold"]
    assert lines == ["fast path routed_experts off (sft.lora.experts_path=fold): it failed its calibrated exactness "
                     "check on this card (err 0.03 > bound 2e-05); the run takes PEFT's fold of the experts' LoRA "
                     "(W + B@A stacks at every forward); cost: no projection (gpu=none: lab.plan.estimate projects a "
                     "configured card only)"]
    _, lines = fast_paths.resolve("02_sft", config.compose(["experiment=competition"]), FAILED)
    assert "cost: projected on rtx_pro_6000: +0.361 s per micro-step" in lines[-1]  # lab.plan.estimate's figures
    _, forced = fast_paths.resolve("02_sft", config.compose(["sft.lora.experts_path=routed"]), FAILED)
    assert forced == ["fast path routed_experts forced on (sft.lora.experts_path=routed) although it failed its "
                      "calibrated exactness check on this card (err 0.03 > bound 2e-05)"]
    unfused = {"exact": {"packed_rows_unfused": {"err": 1.0, "bound": 1e-5, "negative": 2.0, "ok": False}}}
    with pytest.raises(LabError, match="no packed path is exact here"):
        fast_paths.resolve("02_sft", cfg, unfused)


def test_auto_is_the_fast_path_in_the_code_and_stages_that_train_nothing_decide_nothing():
    from lab.model import packed_rows

    cfg = config.compose([])
    assert cfg.sft.fused_mamba == "auto" and cfg.sft.lora.experts_path == "auto" and lora.fused_mamba(cfg)
    assert fast_paths.resolve("01_explore", cfg) == ([], []) and fast_paths.resolve("04_vote", cfg) == ([], [])
    with pytest.raises(LabError, match="one of auto, routed, fold"):
        experts_lora.apply("merged", None)
    with pytest.raises(LabError, match="one of auto, varlen, mask"):
        packed_rows.install(None, attention="flash")
