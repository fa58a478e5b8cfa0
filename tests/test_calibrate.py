"""`python -m lab calibrate` (lab.train.calibrate) on the CPU, and `python -m lab estimate` reading a calibration.

The whole command runs on the tiny model with packs smaller still (slow: it trains a few dozen steps); a calibrate
stopped mid-way (a BaseException injected after two steps, as a kill would stop it) keeps what it wrote; the
estimate switches its labels and figures to a calibration that applies, and only to one that applies."""

from __future__ import annotations

import json
import math

import pytest

from lab import LabError
from lab.core import config
from lab.train import calibrate as cal
from lab.plan import estimate as est

REAL = ["model=nemotron_nano", "experiment=competition", "data=competition", "gpu=h100_80gb"]


@pytest.fixture
def cal_dir(tmp_path, monkeypatch):
    d = tmp_path / "calibration"
    monkeypatch.setattr(est, "calibration_dir", lambda: d)
    return d


@pytest.mark.slow
def test_calibrate_on_the_cpu_writes_every_key(cal_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(cal, "CPU_PACKS", (8, 16, 32))
    monkeypatch.setitem(cal.EXACT_TOKENS, "cpu", 24)
    out = tmp_path / "cal.json"
    assert cal.main(["model.max_model_len=32", "sft.packing=true", "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got == json.loads((cal_dir / "cpu.json").read_text())
    assert set(got) == {"meta", "env", "exact", "speed", "vllm"}
    assert got["meta"]["card"] == "cpu" and "NO GPU" in got["meta"]["what"] and got["meta"]["lab_commit"]
    assert got["env"]["calls"]["varlen_attn"] == {"imports": True, "binds": True}
    assert set(got["exact"]) - {"step_seconds"} == set(cal.EXACT_PATHS)
    assert got["exact"]["routed_experts"]["ok"] is True
    for path in ("packed_rows_fused", "packed_rows_unfused", "varlen_attention"):
        entry = got["exact"][path]
        assert "CUDA" in entry["skipped"] and entry["cpu_branch"]["ok"] is True
    for entry in [got["exact"]["routed_experts"]] + [got["exact"][p]["cpu_branch"] for p in cal.EXACT_PATHS[:3]]:
        assert entry["err"] <= entry["bound"] and entry["negative"] >= 1000 * entry["bound"]
    sp = got["speed"]
    assert sorted(map(int, sp["packs"])) == [8, 16, 32] and all(len(m["seconds"]) == 3 for m in sp["packs"].values())
    assert sp["packing"] is True and sp["packs"]["32"]["rows"] > 1  # whole rows packed, as the recipe packs
    assert {"fixed_s", "us_per_token"} <= set(sp["fit"]) and math.isfinite(sp["fit"]["fixed_s"])
    assert sp["grpo_row"]["tokens"] == 32 and sp["no_grad_forward"]["tokens"] == 32
    assert {"fold", "unfused"} <= set(sp)
    assert got["vllm"] == "absent"  # the CPU venv has no vLLM


def _steps(monkeypatch, stop):
    """meta as written, env a stand-in, then `stop` raised (a kill: BaseException; a failure: Exception)."""
    def boom(ctx):
        raise stop

    monkeypatch.setattr(cal, "STEPS", {"meta": cal.step_meta, "env": lambda ctx: {"stand_in": True}, "exact": boom,
                                       "speed": lambda ctx: {"after": True}})


def test_a_calibrate_stopped_mid_way_keeps_its_finished_steps(cal_dir, tmp_path, monkeypatch):
    _steps(monkeypatch, KeyboardInterrupt())
    out = tmp_path / "cal.json"
    with pytest.raises(KeyboardInterrupt):
        cal.main(["--json", str(out)])
    got = json.loads(out.read_text())  # whole JSON: written atomically after each step
    assert set(got) == {"meta", "env"} and got["env"]["stand_in"] is True
    assert got["meta"]["made_by"] == cal.MADE_BY
    # a rerun may overwrite what calibrate made
    _steps(monkeypatch, RuntimeError("the kernel failed"))
    assert cal.main(["--json", str(out)]) == 1
    got = json.loads(out.read_text())
    assert got["exact"]["error"] == "RuntimeError: the kernel failed" and got["speed"]["after"] is True


def test_refuses_a_file_or_folder_it_did_not_make(cal_dir, tmp_path, monkeypatch):
    _steps(monkeypatch, RuntimeError("unused"))
    mine = tmp_path / "notes.json"
    mine.write_text('{"mine": 1}')
    with pytest.raises(LabError, match="already exists.*--force"):
        cal.main(["--json", str(mine)])
    assert mine.read_text() == '{"mine": 1}'
    cal_dir.mkdir()  # exists without the lab's marker
    (cal_dir / "mine.txt").write_text("mine")
    with pytest.raises(LabError, match="holding files the lab did not make"):
        cal.main([])


def test_the_fit_and_the_verdict():
    f = cal.fit([(1024, 1.0 + 1024e-4), (8192, 1.0 + 8192e-4), (16384, 1.0 + 16384e-4)])
    assert f["fixed_s"] == pytest.approx(1.0) and f["us_per_token"] == pytest.approx(100.0)
    torch = pytest.importorskip("torch")
    ref = [torch.tensor([1.0, 2.0], dtype=torch.float64)]
    base, good, bad = ([torch.tensor([1.0, 2.0 + d])] for d in (1e-6, 1e-6, 1.0))
    v = cal.verdict(ref, base, good, bad, torch.float32)
    assert v["ok"] and v["err"] <= v["bound"] and v["negative"] >= 1000 * v["bound"]
    assert not cal.verdict(ref, base, bad, bad, torch.float32)["ok"]  # the candidate beyond the bound
    assert not cal.verdict(ref, base, good, good, torch.float32)["ok"]  # a negative control that is not negative


# ---- the estimate before and after a calibration --------------------------------------------------------------------

def calibration_file(cfg, folder, card="h100_80gb", fixed_s=0.5, us=50.0, key=None, decode=None):
    """A calibration as calibrate writes it (the keys the estimate reads; the figures made up for the test)."""
    from lab.plan.shapes import model_config_values

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{card}.json"
    path.write_text(json.dumps({
        "meta": {"made_by": cal.MADE_BY, "card": card, "device": "NVIDIA H100 80GB HBM3 (test file)",
                 "date": "2026-11-29T10:00:00+00:00", "lab_commit": "0123abc",
                 "recipe_key": key or est.recipe_key(cfg, model_config_values(cfg))},
        "speed": {"packs": {"1024": {}, "8192": {}, "16384": {}}, "fit": {"fixed_s": fixed_s, "us_per_token": us}},
        **({"vllm": {"version": "0.33.0", "device": "NVIDIA H100 80GB HBM3 (test file)", "decode_step_s": decode}}
           if decode else {})}))
    return path


def run(tmp_path, capsys, *args):
    path = tmp_path / "estimate.json"
    assert est.main([*REAL, "--assume-rows", "--explain", *args, "--json", str(path), "--force"]) == 0  # again
    return json.loads(path.read_text()), capsys.readouterr().out


def test_estimate_before_and_after_reading_a_calibration(cal_dir, tmp_path, capsys):
    before, out = run(tmp_path, capsys)
    assert before["sft"]["source"] == "projected" and before["sft"]["projected"] is True
    assert "all figures PROJECTED" in out and "no calibration of h100_80gb" in out
    assert "PROJECTED hours (not measured" in out and "calibration: no calibration of" in out
    assert before["grpo"]["source"] == "projected"
    calibration_file(config.compose(REAL), cal_dir)
    after, out = run(tmp_path, capsys)
    sft = after["sft"]
    assert sft["source"] == "measured" and sft["projected"] is False
    assert sft["measured"]["card"] == "h100_80gb" and sft["measured"]["lab_commit"] == "0123abc"
    assert sft["fixed_s_per_micro_step"] == 0.5 and sft["us_per_token"] == pytest.approx(50.0)
    packed = sft["packed"]
    assert packed["seconds_per_epoch"] == pytest.approx(packed["micro_steps"] * 0.5
                                                        + packed["tokens_computed"] * 50e-6)
    assert "the micro-step MEASURED (gpu=h100_80gb, 2026-11-29" in out and "lab commit 0123abc" in out
    assert "SFT's micro-step: MEASURED by calibrate" in out
    assert after["grpo"]["source"] == "projected" and after["decode"]["source"] == "projected"  # no vLLM step timed
    assert before["sft"]["tokens_per_s"] != sft["tokens_per_s"]


def test_the_estimate_reads_the_decode_steps_a_calibration_timed(cal_dir, tmp_path, capsys):
    """A calibration whose vllm step timed decode steps (made up here): the evaluation, vote and pass-rate hours and
    the pipeline's evaluations take them, MEASURED in the arithmetic; doubling every step doubles those hours, which
    are all decoding (negative control: a figure left on the projection would not move)."""
    cfg = config.compose(REAL)
    steps = {"1": 0.010, "64": 0.020, "120": 0.025, "bad": None}
    calibration_file(cfg, cal_dir, decode={k: v for k, v in steps.items() if k != "bad"})
    got, out = run(tmp_path, capsys)
    assert got["decode"]["source"] == "measured" and got["decode"]["steps"] == {"1": 0.01, "64": 0.02, "120": 0.025}
    assert "MEASURED at n = 1: 10.0 ms, 64: 20.0 ms, 120: 25.0 ms (MEASURED by python -m lab calibrate on NVIDIA" in out
    assert "the decode step MEASURED" in got["grpo"]["source_detail"]
    calibration_file(cfg, cal_dir, decode={"1": 0.020, "64": 0.040, "120": 0.050})
    twice, _ = run(tmp_path, capsys)
    for a, b in ((twice["eval"]["hours_per_1000"], got["eval"]["hours_per_1000"]),
                 (twice["vote"]["hours"], got["vote"]["hours"]),
                 (twice["grpo"]["pass_rate_hours"], got["grpo"]["pass_rate_hours"]),
                 (twice["stages"][1]["parts"][1]["hours"], got["stages"][1]["parts"][1]["hours"])):
        assert a == pytest.approx(2 * b, abs=2e-3) and b > 0.1  # the JSON rounds to 3 decimals
    assert twice["grpo"]["step_minutes"] < 2 * got["grpo"]["step_minutes"]  # its switch and training are not decode


@pytest.mark.parametrize("card, key, why", [("h200", None, "no calibration of h100_80gb"),
                                            ("h100_80gb", "another", "another model or recipe")])
def test_a_calibration_that_does_not_apply_is_not_used(cal_dir, tmp_path, capsys, card, key, why):
    path = calibration_file(config.compose(REAL), cal_dir, card=card, key=key)
    got, out = run(tmp_path, capsys)
    assert got["sft"]["source"] == "projected" and why in out
    with pytest.raises(LabError, match="--calibration"):
        est.main([*REAL, "--assume-rows", "--calibration", str(path)])


def test_a_call_spelled_wrong_does_not_bind():
    """env.calls: the lab's spelling of torch's varlen_attn binds; torch 2.10's `is_causal` (the negative) does not."""
    name, attr, args, kwargs = cal.CALLS["varlen_attn"]
    assert cal._bind(name, attr, args, kwargs) == {"imports": True, "binds": True}
    wrong = cal._bind(name, attr, args, {**kwargs, "is_causal": True})
    assert wrong["binds"] is False and "is_causal" in wrong["why"]
    assert cal._bind("no_such_package_here", "f", (), {})["imports"] is False
