"""bench/gpu_memory.py off the GPU: the slice it builds from the real config, its projection arithmetic, and a run
without CUDA (traced figures only, nothing claimed as measured)."""

from __future__ import annotations

import json

import pytest
import torch


def test_the_slice_is_the_real_widths_with_one_block_of_each_kind(bench):
    cfg, real = bench("gpu_memory").slice_config(["experiment=competition", "gpu=rtx_pro_6000"])
    arch = cfg.model.architecture
    assert arch["hybrid_override_pattern"] == "M*E" and arch["num_hidden_layers"] == 3
    for key in ("hidden_size", "vocab_size", "n_routed_experts", "moe_intermediate_size", "mamba_num_heads"):
        assert arch[key] == real[key]
    assert real["hybrid_override_pattern"].count("E") == 23  # the 52-block model the projection scales to


def test_projection_adds_the_other_blocks_forward_and_backward(bench):
    per_block = {"linear_attention": {"forward_backward_s": 0.02}, "full_attention": {"forward_backward_s": 0.01},
                 "moe": {"forward_backward_s": 0.05}}
    p = bench("gpu_memory").project(per_block, 0.1, "MEM*E")  # one Mamba and one MoE more than the slice
    assert p["counts"] == {"linear_attention": 2, "full_attention": 1, "moe": 2}
    assert p["step_s"] == pytest.approx(0.1 + 0.02 + 0.05)


@pytest.mark.slow  # builds the real-width slice twice on fake tensors: seconds
@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU run is scripts/gpu_smoke.sh's")
def test_without_a_gpu_it_writes_traced_figures_only(tmp_path, bench):
    assert bench("gpu_memory").main(["--tokens", "64", "--cases", "kernel", "torch", "--torch-scan-tokens", "64",
                          "--out", str(tmp_path)]) == 0
    d = json.loads((tmp_path / "gpu_memory.json").read_text())
    assert d["env"]["gpu"] is None and "timing" not in d
    assert [(r["mamba"], r["head"]) for r in d["steps"]] == [("kernel", "chunked"), ("torch", "torch")]
    for r in d["steps"]:
        assert r["traced_gib"] > 3.8 and "allocator_gib" not in r  # more than the slice's bf16 weights; not measured
    assert "(no GPU)" in (tmp_path / "gpu_memory.md").read_text()


# Bytes an H100 counted for one SFT step of the slice (bench/gpu_memory.py on 2026-11-27, RESULTS.md "First contact
# with a GPU": the same dispatch mode, on the card, with mamba_ssm's Triton scan or the stand-ins, which agreed).
CARD = {(8192, "kernel"): 9_979_332_744, (2048, "kernel"): 8_664_774_792, (2048, "torch"): 22_364_874_632}
# the card ran PEFT's fold of the experts' LoRA (before lab.model.experts_lora): sft.lora.experts_path=fold
RECIPE_LORA = ["sft.lora.r=32", "sft.lora.alpha=32", "sft.lora.experts_path=fold", "gpu.optim=null",
               "gpu.experts_rank=null",
               "sft.lora.targets=[q_proj,k_proj,v_proj,o_proj,in_proj,out_proj,shared_experts.up_proj,"
               "shared_experts.down_proj,experts,lm_head]"]


@pytest.mark.slow  # three real-width traces: seconds
@pytest.mark.parametrize("tokens, mamba", sorted(CARD))
def test_the_trace_equals_what_an_h100_counted(bench, tokens, mamba):
    """The fake-tensor trace of the slice, under CUDA's autocast rules (lab.plan.autocast_rules), equals to
    the byte what the card counted for the same step. Pinned to the LoRA measured then, not to the preset."""
    from lab.plan import memory

    cfg, _ = bench("gpu_memory").slice_config(["experiment=competition", "gpu=rtx_pro_6000", *RECIPE_LORA])
    t = memory.trace(cfg, "sft", tokens=tokens, rows=1, mamba=mamba, head="chunked" if mamba == "kernel" else "torch")
    assert t.peak_bytes == CARD[tokens, mamba]


def test_gpu_smoke_is_valid_bash_and_fetches_what_the_lab_pins():
    """scripts/gpu_smoke.sh --fetch pins each wheel; every one the lab depends on satisfies pyproject.toml's range."""
    import re
    import subprocess
    import tomllib

    from packaging.requirements import Requirement

    from lab.core.paths import project_root

    script = project_root() / "scripts" / "gpu_smoke.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    fetched = dict(re.findall(r"\b([A-Za-z][\w.-]*)==([\w.]+)", script.read_text()))
    deps = tomllib.loads((project_root() / "pyproject.toml").read_text())["project"]["dependencies"]
    pinned = {Requirement(d).name.lower(): Requirement(d).specifier for d in deps}
    checked = [n for n in fetched if n.lower() in pinned]
    assert {"trl", "peft", "datasets", "hydra-core", "papermill", "filelock"} <= set(checked)
    for name in checked:
        assert fetched[name] in pinned[name.lower()], (name, fetched[name], str(pinned[name.lower()]))
