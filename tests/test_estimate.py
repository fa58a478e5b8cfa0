"""`python -m lab estimate` (lab.plan.estimate): the projection's arithmetic against the measured run it starts from,
its JSON, and the directions it must get right (packing and the routed experts' LoRA are faster), with negative
controls. Nothing here needs a GPU or a model; the counted-token case needs ../shared and skips without it."""

from __future__ import annotations

import json

import pytest

from lab import LabError
from lab.core import config
from lab.core.paths import project_root
from lab.plan import cost_model as cm
from lab.plan import estimate as est

REAL = ["model=nemotron_nano", "experiment=competition", "data=competition", "gpu=h100_80gb"]
SHARED = project_root().parent / "shared"  # the development sample and the real tokenizer, where this checkout has them
SHARED_DATA, SHARED_TOKENIZER = SHARED / "data" / "train_dev.csv", SHARED / "tokenizer" / "nemotron-3-nano"
KEYS = {"tokens_per_s", "hours_per_epoch", "step_seconds", "packing", "experts_lora", "mamba_path"}


def run(tmp_path, *args):
    path = tmp_path / "estimate.json"
    assert est.main([*args, "--json", str(path), "--force"]) == 0  # a test may estimate twice into its file
    return json.loads(path.read_text())["sft"]


def test_tiny_default_runs(tmp_path, capsys):
    sft = run(tmp_path)
    assert KEYS <= set(sft) and sft["experts_lora"] == "routed" and sft["mamba_path"] == "torch"
    out = capsys.readouterr().out
    assert "PROJECTED" in out and "ASSUMED" in out and "gpu=none: no card configured; projected for h100_80gb" in out


def test_real_model_on_h100(tmp_path):
    sft = run(tmp_path, *REAL, "--assume-rows")
    assert KEYS <= set(sft) and sft["card"] == "h100_80gb" and sft["projected"] is True
    assert sft["experts_lora"] == "routed" and sft["mamba_path"] == "fused"
    # the recipe packs (conf/sft/nemotron_nano.yaml: sft.packing=true), so the headline is the packed figure
    assert sft["packing"]["enabled"] is True and sft["tokens_per_s"] == sft["packed"]["tokens_per_s"]
    # packing shares the fixed per-micro-step cost over many rows
    assert sft["packed"]["tokens_per_s"] > 3 * sft["unpacked"]["tokens_per_s"]
    assert 0.9 < sft["packing"]["efficiency"] <= 1.0 and sft["packing"]["unpacked_fill"] < 0.3
    fold = run(tmp_path, *REAL, "--assume-rows", "sft.lora.experts_path=fold")
    assert fold["experts_lora"] == "fold"
    assert sft["packed"]["tokens_per_s"] > fold["packed"]["tokens_per_s"]
    assert sft["fixed_s_per_micro_step"] < fold["fixed_s_per_micro_step"]
    assert sft["us_per_token"] < fold["us_per_token"]


def test_the_measured_configuration_reproduces_the_measured_projection():
    """fold, the real model, the H100: the cost model gives back the bench's own 52-block projection (RESULTS.md:
    1.12 s at 1,024 tokens, 1.65 s at 8,192), i.e. the derivations only move what they claim to."""
    m = cm.cost_model(cm.measured_values(), "h100_80gb", "fold", 32)
    assert m.fixed_s + 1024 * m.per_token_s == pytest.approx(1.122, abs=1e-3)
    assert m.fixed_s + 8192 * m.per_token_s == pytest.approx(1.649, abs=1e-3)
    routed = cm.cost_model(cm.measured_values(), "h100_80gb", "routed", 32)
    assert m.fixed_s - routed.fixed_s == pytest.approx(23 * 28.1e9 / 3.35e12, rel=1e-2)  # the fold's traffic, derived


def test_an_unmeasured_card_is_scaled_by_its_published_figures():
    vals = cm.measured_values()
    h100, h200, rtx = (cm.cost_model(vals, c, "routed", 32) for c in ("h100_80gb", "h200", "rtx_pro_6000"))
    assert h200.per_token_s == pytest.approx(h100.per_token_s) and h200.fixed_s <= h100.fixed_s
    assert rtx.per_token_s == pytest.approx(h100.per_token_s * 989 / 500)
    assert rtx.fixed_s == pytest.approx(h100.fixed_s * 3.35 / 1.792)


def test_packing_gains_nothing_when_every_row_fills_a_micro_step(monkeypatch, tmp_path):
    """Negative control of the packing direction: rows of sft.max_seq_len tokens pack one per micro-step (packs of
    max_seq_len tokens: sft.pack_tokens=null)."""
    monkeypatch.setattr(est, "assumed_tokens", lambda cap: [cap] * 40)
    sft = run(tmp_path, *REAL, "--assume-rows", "sft.pack_tokens=null")
    assert sft["packed"]["tokens_per_s"] == pytest.approx(sft["unpacked"]["tokens_per_s"])
    assert sft["packing"]["efficiency"] == 1.0


def test_best_fit_decreasing():
    rows = [5000, 4000, 3000, 2000, 1500, 800, 800, 100]
    bins = est.pack_bfd(rows, 8192)
    assert sum(bins) == sum(rows) and max(bins) <= 8192 and len(bins) == 3
    assert est.pack_bfd([8192, 1], 8192) == [8192, 1]
    with pytest.raises(LabError, match="exceeds"):
        est.pack_bfd([9000], 8192)


def test_refusals():
    with pytest.raises(LabError, match="knows the cards"):
        cm.card_of(config.compose(["gpu.name=a100"]))
    with pytest.raises(LabError, match="block types"):
        cm.block_kinds({"hybrid_override_pattern": "M-E"})


@pytest.mark.skipif(not (SHARED_DATA.is_file() and (SHARED_TOKENIZER / "tokenizer.json").is_file()),
                    reason="../shared (development data and the real tokenizer) is absent")
def test_counted_tokens_from_shared(tmp_path, monkeypatch):
    """data=competition with ../shared's files named in the config (the package looks nowhere else): the rows'
    tokens are counted with the real tokenizer (a 30-puzzle sample), cached by what produced them, and read back from
    the cache."""
    monkeypatch.setattr(est, "CACHE", tmp_path / "cache")
    cfg = config.compose([*REAL, f"data.path={SHARED_DATA}", f"data.tokenizer_path={SHARED_TOKENIZER}"])
    tokens, source = est.row_tokens(cfg, sample=30)
    assert source.startswith("counted") and len(tokens) > 30 and 100 < sorted(tokens)[len(tokens) // 2] < 8192
    again, source2 = est.row_tokens(cfg, sample=30)
    names = sorted(p.name for p in (tmp_path / "cache").iterdir())  # the cache and its seal (lab.core.lineage.seal)
    assert again == tokens and "cached" in source2 and len(names) == 2 and names[1] == names[0][:-5] + ".seal.json"


def test_the_command_joins_the_grpo_eval_and_vote_sections(tmp_path, capsys):
    """One command, every section the issues ask for (lab.plan.estimate_infer's, joined through SECTIONS); with
    packing, an optimizer step is grad_accum packs, not grad_accum rows."""
    path = tmp_path / "estimate.json"
    assert est.main([*REAL, "--assume-rows", "--explain", "--json", str(path)]) == 0
    out = json.loads(path.read_text())
    assert out["grpo"]["step_minutes"] > 0 and out["grpo"]["pass_rate_hours"] > 0
    assert out["eval"]["hours_per_1000"] > 0 and out["vote"]["hours"] > 0
    packed = out["sft"]["packed"]
    ga = int(config.compose(REAL).sft.grad_accum)
    assert packed["optimizer_steps"] == -(-packed["micro_steps"] // ga)  # batch_size 1 x grad_accum packs
    text = capsys.readouterr().out
    assert "GRPO minutes per optimizer step" in text and "04_vote, hours" in text


def test_a_real_model_stage_prints_its_projection_when_it_opens(tmp_path, monkeypatch, capsys):
    """02_sft prints its SFT projection, 03_grpo and 04_vote the GRPO / evaluation / vote hours, before any model
    loads (lab.recipes.common.open_stage, after the preflight); the tiny model on gpu=none prints none."""
    from lab.recipes import common
    from lab.plan import preflight

    monkeypatch.setattr(est, "row_tokens", lambda cfg, sample=None, assume=False: (est.assumed_tokens(
        int(cfg.sft.max_seq_len)), "assumed"))
    cfg = config.compose(REAL)
    sft = "\n".join(est.stage_projection("02_sft", cfg))
    assert "SFT on h100_80gb, all figures PROJECTED" in sft and "tokens/s" in sft
    grpo = "\n".join(est.stage_projection("03_grpo", cfg))
    assert "PROJECTED on gpu=" in grpo and "GRPO minutes per optimizer step" in grpo
    assert est.stage_projection("01_explore", cfg) == [] and est.stage_projection("02_sft", config.compose([])) == []
    monkeypatch.setattr(preflight, "check", lambda stage, overrides: None)  # a GPU machine with everything installed
    common.open_stage("02_sft", [*REAL, f"run_dir={tmp_path / 'run'}"])
    out = capsys.readouterr().out
    assert out.index("SFT on h100_80gb") < out.index("run_dir = ")  # printed before the stage folder opens


def test_longer_packs_spread_the_fixed_part(tmp_path):
    """sft.pack_tokens: packs of 16,384 tokens take about half the micro-steps of 8,192-token packs for the same
    tokens, so the projection rises; the extrapolation past the measured 8,192 tokens is said. A pack shorter than a
    row is refused."""
    long = run(tmp_path, *REAL, "--assume-rows", "sft.pack_tokens=16384")
    short = run(tmp_path, *REAL, "--assume-rows", "sft.pack_tokens=8192")
    assert long["packed"]["micro_steps"] < 0.6 * short["packed"]["micro_steps"]
    assert long["tokens_per_s"] > short["tokens_per_s"] and long["tokens"] == short["tokens"]
    with pytest.raises(LabError, match="pack_tokens=4096 is below max_seq_len"):
        est.estimate(config.compose([*REAL, "sft.pack_tokens=4096"]), assume=True)
