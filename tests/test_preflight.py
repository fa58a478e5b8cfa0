"""The real-model preflight (issue 28, item 6): a real-model stage on a machine without the GPU extra, a CUDA
device or the model folder refuses when it opens, with one list of everything missing, before its folder is
touched. This machine has no CUDA and no vllm: exactly the wrong machine."""

import importlib.util

import pytest

from lab.plan import preflight
from lab import LabError
from lab.core.config import compose


@pytest.fixture(autouse=True)
def _no_trace(monkeypatch, request):
    """Test-only stand-in for lab.plan.memory.check_fits (a 30-60 s fake-tensor trace of the real model, tested in
    tests/test_memory.py): it records that the preflight asked for the trace, and says it does not fit."""
    if "real_trace" in request.keywords:
        return
    from lab.plan import memory

    def check_fits(cfg, stage="sft"):
        raise LabError(f"{stage}: traced memory does not fit (stand-in)")

    monkeypatch.setattr(memory, "check_fits", check_fits)


def _real(tmp_path, *extra):
    return ["model=nemotron_nano", f"run_dir={tmp_path / 'run'}", *extra]


def test_wrong_machine_gets_one_list_of_everything_missing(tmp_path):
    import torch

    if torch.cuda.is_available() or importlib.util.find_spec("vllm") is not None:
        pytest.skip("this machine has a GPU or the GPU extra")
    over = _real(tmp_path, "model.path=models/nemotron-3-nano")  # not a folder here: taken for a Hub id so far
    compose(over)  # compose alone accepts it (a Hub id may be fetched beforehand)
    with pytest.raises(LabError) as e:
        preflight.check("02_sft", over)  # as the notebook's first cell calls it, before it opens its Stage
    msg = str(e.value)
    assert msg.startswith("02_sft with model=nemotron_nano cannot run on this machine; missing:")
    assert "vllm not installed" in msg and "pip install -e '.[gpu]'" in msg
    assert "no CUDA device" in msg
    assert "model.path" in msg and "nemotron-3-nano" in msg
    assert "fused Mamba kernels" in msg  # lab.model.models.check_mamba_kernels: training needs mamba_ssm + causal_conv1d
    assert "sft: traced memory does not fit" in msg  # lab.plan.memory.check_fits, asked for the SFT step
    assert msg.count("\n  - ") == 5
    assert not (tmp_path / "run").exists()  # refused before anything was written


@pytest.mark.parametrize("stage", preflight.REAL_MODEL_STAGES)
def test_every_real_model_notebook_checks_before_it_opens_its_stage(stage):
    import json

    from lab.core.paths import project_root

    nb = json.loads((project_root() / "notebooks" / f"{stage}.ipynb").read_text())
    code = "".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    assert f'common.open_stage("{stage}", overrides' in code  # preflight.check, then Stage (tests/test_notebooks.py)


def test_unsloth_is_asked_for_only_where_the_stage_uses_it(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    cfg = compose(_real(tmp_path, f"model.path={tmp_path / 'm'}", "sft.backend=unsloth",
                        "model.generation_backend=hf"))
    sft = " ".join(preflight.problems("02_sft", cfg))
    vote = " ".join(preflight.problems("04_vote", cfg))
    assert ("unsloth not installed" in sft) == (importlib.util.find_spec("unsloth") is None)
    assert "unsloth" not in vote and "vllm" not in vote and "model.path" not in vote


def test_8bit_adamw_asks_for_bitsandbytes_by_its_module_name(tmp_path, monkeypatch):
    """gpu.optim=adamw_bnb_8bit needs the `bnb` extra, whose module is `bitsandbytes` (the check once looked for a
    module named `bnb`, and a missing one raised KeyError instead of the list)."""
    cfg = compose(_real(tmp_path, "gpu.optim=adamw_bnb_8bit", "model.generation_backend=hf"))
    real = importlib.util.find_spec
    for present in (False, True):
        monkeypatch.setattr(importlib.util, "find_spec",
                            lambda name, *a: (object() if present else None) if name == "bitsandbytes" else real(name, *a))
        found = " ".join(preflight.problems("02_sft", cfg))
        assert ("bnb not installed (gpu.optim=adamw_bnb_8bit)" in found) != present


def test_the_tiny_model_and_other_stages_skip_it(tmp_path):
    assert not preflight.applies("02_sft", compose([f"run_dir={tmp_path}"]))
    cfg = compose(_real(tmp_path))
    assert preflight.applies("03_grpo", cfg) and not preflight.applies("05_errors", cfg)
    assert not preflight.applies("01_explore", cfg)


def test_one_more_check_is_one_more_function_of_the_config(tmp_path, monkeypatch):
    """How the Mamba-kernel and memory checks join: a function of the config that raises LabError, one line."""
    def check_fits(cfg):
        raise LabError(f"the model does not fit ({cfg.model.name})")

    real = preflight.checks
    monkeypatch.setattr(preflight, "checks", lambda stage: [*real(stage), check_fits])
    found = preflight.problems("03_grpo", compose(_real(tmp_path)))
    assert found[-1] == "the model does not fit (nemotron_nano)" and len(found) >= 2  # the others still listed


def test_the_mamba_kernels_are_asked_for_where_the_stage_trains(tmp_path):
    if importlib.util.find_spec("mamba_ssm") is not None:
        pytest.skip("this machine has mamba_ssm")
    cfg = compose(_real(tmp_path))
    for stage in ("02_sft", "03_grpo"):
        assert any("fused Mamba kernels" in p for p in preflight.problems(stage, cfg)), stage
    assert not any("Mamba" in p for p in preflight.problems("04_vote", cfg))  # vLLM brings its own kernels


def test_grpo_refuses_vllm_rollouts_with_refine_before_the_stage(tmp_path):
    cfg = compose(_real(tmp_path, "grpo.rollout_backend=vllm"))  # the served-adapter route: no backend problem
    assert not any("rollout_backend" in p and "refine" in p for p in preflight.problems("03_grpo", cfg))
    cfg = compose(_real(tmp_path, "grpo.rollout_backend=vllm", "grpo.refine=true"))
    assert any("refine=true with rollout_backend=vllm" in p for p in preflight.problems("03_grpo", cfg))


@pytest.mark.slow
@pytest.mark.real_trace
def test_the_real_trace_refuses_the_pytorch_scan_on_the_competition_card(tmp_path):
    """The real lab.plan.memory trace inside the preflight: without mamba_ssm the SFT step takes transformers' PyTorch
    scan, which does not fit gpu=rtx_pro_6000 (the competition preset's card)."""
    if importlib.util.find_spec("mamba_ssm") is not None:
        pytest.skip("this machine has mamba_ssm")
    found = preflight.problems("02_sft", compose(_real(tmp_path, "experiment=competition")))
    assert any("one training micro-step peaks at" in p and "PyTorch" in p for p in found), found


def test_grpo_with_vllm_rollouts_checks_the_generation_phase_and_the_host(tmp_path, monkeypatch):
    """03_grpo with rollout_backend=vllm (the real model's default): the engine's phase must fit the card beside what
    the trainer keeps, and the host must hold the bf16 weights at a switch (lab.plan.grpo_policy.check_generation_fits),
    before anything loads."""
    from lab.plan import grpo_policy

    cfg = compose(_real(tmp_path, "experiment=competition", "gpu=h100_80gb"))
    assert cfg.grpo.rollout_backend == "vllm"
    monkeypatch.setattr(grpo_policy, "host_gib", lambda: 24.0)  # a small machine
    assert any("24 GiB of memory" in p and "at least once" in p for p in preflight.problems("03_grpo", cfg))
    monkeypatch.setattr(grpo_policy, "host_gib", lambda: 128.0)  # the H100 machine: level 2, no problem
    assert not any("GiB of memory" in p or "rollout_backend=vllm does not fit" in p
                   for p in preflight.problems("03_grpo", cfg))
    greedy = compose(_real(tmp_path, "experiment=competition", "gpu=h100_80gb", "grpo.vllm_gpu_memory_utilization=0.95"))
    assert any("rollout_backend=vllm does not fit gpu=h100_80gb" in p for p in preflight.problems("03_grpo", greedy))
    hf = compose(_real(tmp_path, "experiment=competition", "gpu=h100_80gb", "grpo.rollout_backend=hf"))
    monkeypatch.setattr(grpo_policy, "host_gib", lambda: 24.0)
    assert not any("GiB of memory" in p for p in preflight.problems("03_grpo", hf))  # transformers' rollouts: no engine
