"""`python -m lab estimate`'s answer to "what will this cost": one record per stage of the pipeline (hours, their
parts, cost, the card fit, Kaggle's kernels and kept bytes), the total, the table printed first and the derivation
only behind --explain. Nothing here needs a GPU, the data or a tokenizer (the stated assumed rows)."""

from __future__ import annotations

import json

import pytest

from lab.core import config
from lab.runs.pipeline import STAGES
from lab.plan import estimate as est

REAL = ["model=nemotron_nano", "experiment=competition", "data=competition", "gpu=h100_80gb"]


def records(overrides, price=None):
    cfg = config.compose([*REAL, *overrides])
    out, _ = est.estimate(cfg, assume=True)
    return est.pipeline(cfg, out, est.card_of(cfg), price=price)["stages"], out


@pytest.fixture(scope="module")
def command(tmp_path_factory):
    """The command as a user runs it, with a price: its printed text and its JSON."""
    tmp = tmp_path_factory.mktemp("estimate")
    est.CACHE, old = tmp / "cache", est.CACHE
    try:
        import contextlib
        import io

        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            assert est.main([*REAL, "--assume-rows", "--price-per-hour", "3", "--json", str(tmp / "e.json")]) == 0
        return buf.getvalue(), json.loads((tmp / "e.json").read_text())
    finally:
        est.CACHE = old


def test_one_record_per_stage_and_a_total_that_adds_up(command):
    text, out = command
    assert [r["stage"] for r in out["stages"]] == STAGES == list(est.STAGE_WORK)
    for r in out["stages"]:
        if r["parts"]:
            assert r["hours"] == pytest.approx(sum(p["hours"] for p in r["parts"])) and r["hours"] > 0
            assert r["cost"] == pytest.approx(3 * r["hours"])
        else:
            assert r["hours"] is None and r["cost"] is None and r["card"] == "no GPU work"
    assert [r["stage"] for r in out["stages"] if r["hours"] is None] == ["01_explore", "05_errors"]
    assert out["total"]["hours"] == pytest.approx(sum(r["hours"] or 0 for r in out["stages"]))
    assert out["total"]["cost"] == pytest.approx(3 * out["total"]["hours"])
    # the sections' figures and keys are still there, and the stages' parts are made of them
    sft, grpo = out["stages"][1], out["stages"][2]
    assert sft["parts"][0]["hours"] == pytest.approx(out["sft"]["hours_per_epoch"])  # sft.epochs 1
    assert grpo["parts"][1]["hours"] == pytest.approx(100 * out["grpo"]["step_minutes"] / 60)  # grpo.max_steps 100
    assert grpo["parts"][0]["hours"] == pytest.approx(out["grpo"]["pass_rate_hours"])


def test_the_table_comes_first_and_the_derivation_only_with_explain(command, capsys):
    text, _ = command
    lines = text.splitlines()
    assert lines[0].startswith("The pipeline on h100_80gb: PROJECTED") and "cost at 3 per hour" in lines[0]
    assert lines[1].split()[:3] == ["stage", "hours", "cost"]
    assert [ln.split()[0] for ln in lines[2:8]] == [*STAGES, "total"]
    assert "derived lines" not in text and "before issue" not in text
    assert est.main([*REAL, "--assume-rows", "--explain"]) == 0
    explained = capsys.readouterr().out
    assert "derived lines (fixed ms + us/token)" in explained and "GRPO minutes per optimizer step" in explained
    assert "cost" not in explained.splitlines()[1]  # no price, no cost column


def test_no_price_no_cost(tmp_path):
    est.CACHE, old = tmp_path / "cache", est.CACHE
    try:
        assert est.main([*REAL, "--assume-rows", "--json", str(tmp_path / "e.json")]) == 0
    finally:
        est.CACHE = old
    out = json.loads((tmp_path / "e.json").read_text())
    assert "cost" not in out["total"] and out["total"]["hours"] > 0
    assert all(r["cost"] is None for r in out["stages"])


def test_the_hours_follow_the_config_and_kaggle_limits_are_judged(tmp_path, monkeypatch):
    """Twice the SFT epochs doubles SFT's training part (not its evaluations); a GRPO run longer than one Kaggle
    kernel needs more kernels and resumes; a vote longer than one kernel cannot resume; a kept-output limit below
    the plan is flagged (negative controls of the verdicts the default config passes)."""
    monkeypatch.setattr(est, "CACHE", tmp_path / "cache")
    base, _ = records([])
    two, _ = records(["sft.epochs=2"])
    assert two[1]["parts"][0]["hours"] == pytest.approx(2 * base[1]["parts"][0]["hours"])
    assert two[1]["parts"][1:] == base[1]["parts"][1:]
    assert all(r["kaggle"]["fits_one_kernel"] and r["kaggle"]["kept_fits"] for r in base)
    usable = base[0]["kaggle"]["kernel_hours"]
    assert usable == pytest.approx(12 - 60 / 60)  # kaggle.run_limit_h 12, budget_margin_min 60
    long, _ = records(["grpo.max_steps=600"])
    assert long[2]["hours"] > usable and long[2]["kaggle"]["kernels"] == -(-long[2]["hours"] // usable) >= 2
    assert long[2]["kaggle"]["resumable"] is True
    vote, _ = records(["vote.k=64"])
    assert vote[3]["hours"] > usable and vote[3]["kaggle"]["kernels"] >= 2 and vote[3]["kaggle"]["resumable"] is False
    table = "\n".join(est.table_lines({"stages": vote, "total": {"hours": 1.0, "kernels": 9},
                                        "held_out": {"puzzles": 1, "source": "test"},
                                        "kaggle": {"machine_shape": "x", "kernel_hours": 11, "kept_limit_gb": 20}},
                                       "h100_80gb"))
    assert "NO RESUME" in table
    small, _ = records(["kaggle.output_limit_gb=5"])
    assert [r["stage"] for r in small if not r["kaggle"]["kept_fits"]] == ["02_sft", "03_grpo", "04_vote", "05_errors"]


def test_the_card_fit_uses_the_rollout_bound_and_says_what_it_did_not_trace(tmp_path, monkeypatch):
    monkeypatch.setattr(est, "CACHE", tmp_path / "cache")
    recs, _ = records([])
    assert recs[1]["card"].startswith("not traced here") and "python -m lab memory --stage sft" in recs[1]["card"]
    assert recs[2]["card"].startswith("rollouts fit")
    tight, _ = records(["grpo.vllm_gpu_memory_utilization=0.3"])
    assert tight[2]["card"].startswith("rollouts do NOT fit")


def test_lora_counts_are_kept_keyed_and_checked(tmp_path, monkeypatch):
    """The meta model is built once per shape, LoRA config and code (a sealed file, `lab.core.cache`); a cached file
    whose bytes are not the ones sealed, or without its seal, is not used."""
    from lab.plan import shapes

    monkeypatch.setattr(est, "CACHE", tmp_path / "cache")
    cfg = config.compose(REAL)
    values = shapes.model_config_values(cfg)
    first = est.lora_counts(cfg, values)
    files = [p for p in (tmp_path / "cache").glob("params_*.json") if not p.name.endswith(".seal.json")]
    assert len(files) == 1 and first[1] > 0 and files[0].with_suffix(".seal.json").is_file()

    def refuse(*a, **k):
        raise AssertionError("counted again")

    monkeypatch.setattr(shapes, "param_counts", refuse)
    assert est.lora_counts(cfg, values) == first  # from the file
    doc = json.loads(files[0].read_text())
    doc["key"]["lora"]["r"] = 999  # a file that was not written for this key
    files[0].write_text(json.dumps(doc))
    with pytest.raises(AssertionError, match="counted again"):
        est.lora_counts(cfg, values)
    monkeypatch.undo()
    monkeypatch.setattr(est, "CACHE", tmp_path / "cache")
    assert est.lora_counts(cfg, values) == first  # counted again, sealed again
    files[0].with_suffix(".seal.json").unlink()  # the seal gone: the file is not trusted
    monkeypatch.setattr(shapes, "param_counts", refuse)
    with pytest.raises(AssertionError, match="counted again"):
        est.lora_counts(cfg, values)
