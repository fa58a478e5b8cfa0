"""`python -m lab gate` on a real vLLM engine: a random adapter on every family passes with every family
reaching the output; an adapter that changes nothing (B = 0) is refused; a zip `check` refuses never starts one."""

from __future__ import annotations

import pytest
from test_vllm_parity import FAMILIES, SCALE, make_adapter

from lab import LabError
from lab.__main__ import main as lab_main


def test_gate_passes_an_adapter_whose_every_family_reaches_the_output(lane, capsys):
    from lab.model import submission

    folder = make_adapter(lane, "gate_all", FAMILIES["every family"], SCALE, seed=21)
    zip_path = submission.pack(folder, lane["root"] / "gate_all.zip")
    assert lab_main(["gate", str(zip_path), "--model", lane["base"], "--n", "6"]) == 0
    out = capsys.readouterr().out
    assert "verdict: PASS" in out
    for fam in ("q_proj", "in_proj", "out_proj", "shared_experts.up_proj", "experts", "lm_head"):
        row = next(line for line in out.splitlines() if line.startswith(f"| {fam} |"))
        assert row.endswith("| yes |"), row
    print(out)


def test_gate_refuses_an_adapter_that_changes_nothing(lane, capsys):
    from lab.kaggle import gate
    from lab.model import submission

    folder = make_adapter(lane, "gate_zero", FAMILIES["every family"], None)
    zip_path = submission.pack(folder, lane["root"] / "gate_zero.zip")
    r = gate.gate(zip_path, lane["base"], n=6)
    assert r["verdict"] == "REFUSED" and r["completions_changed"] == 0
    assert not any(r["reaches_output"].values())
    assert lab_main(["gate", str(zip_path), "--model", lane["base"], "--n", "6"]) == 1


def test_gate_runs_check_first(lane, tmp_path):
    from lab.kaggle import gate

    bad = tmp_path / "bad.zip"
    bad.write_bytes(b"not a zip")
    with pytest.raises(LabError, match="not a zip file"):
        gate.gate(bad, lane["base"], n=6)
