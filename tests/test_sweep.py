"""Sweeps and reports: a real two-job sweep through Hydra + papermill (one job fails on purpose), its
rerun, the submitit local launcher, and the report on hand-made job folders (plots, seeds, statuses).

The sweeps run `python -m lab sweep` in a subprocess on the smoke budget (lab.runs.pipeline.SMOKE_OVERRIDES)
with only the stages they need; everything is CPU-only and offline.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lab.core import config
from lab.runs import jobs
from lab.runs import sweep as sw
from finished import mark_finished  # tests/finished.py
from lab.runs import sweep_report as rp
from lab import LabError
from lab.core.io import atomic_write_json, atomic_write_text
from lab.core.paths import project_root
from lab.runs.pipeline import SMOKE_OVERRIDES

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
       "TOKENIZERS_PARALLELISM": "false", "MPLBACKEND": "Agg", "HYDRA_FULL_ERROR": "1"}


def lab_cli(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lab", *args], cwd=project_root(), env=ENV, capture_output=True,
                          text=True, timeout=timeout)


# ---------------------------------------------------------------------------------------------
# a real sweep: one job finishes, one fails (LoRA dropout on the fused experts is refused by lab.train.sft
# inside 02_sft; a value the config validation refuses, such as rank 64, would stop the job before any stage)
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def failed_sweep(tmp_path_factory):
    d = tmp_path_factory.mktemp("sweep") / "rank"
    r = lab_cli("sweep", "--name", "rank", "--dir", str(d), "--smoke", "--stages", "01_explore", "02_sft",
                "--", "sft.lora.dropout=0,0.1")
    return d, r


@pytest.mark.slow
def test_sweep_one_job_fails_the_other_finishes(failed_sweep):
    d, r = failed_sweep
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]  # a failed job makes the command fail
    ok, bad = d / "sft.lora.dropout=0", d / "sft.lora.dropout=0.1"
    # the finished job: its own run_dir, every stage's metrics, executed notebooks, resolved config, done.json
    for stage in ("01_explore", "02_sft"):
        assert (ok / stage / "metrics.json").is_file()
        assert (ok / "notebooks" / f"{stage}.ipynb").is_file()
    assert (ok / "done.json").is_file() and not (ok / "error.txt").exists()
    job = json.loads((ok / "job.json").read_text())
    assert job["status"] == "finished" and job["params"] == {"sft.lora.dropout": 0}
    keys = {o.split("=", 1)[0] for o in job["overrides"]}  # Hydra writes values back its own way (false: False)
    assert "sft.lora.dropout=0" in job["overrides"] and {o.split("=", 1)[0] for o in SMOKE_OVERRIDES} <= keys
    assert f"run_dir='{ok}'" in job["notebook_overrides"]
    assert "run_dir: " + str(ok) in (ok / "config.yaml").read_text()
    manifest = json.loads((ok / "02_sft" / "manifest.json").read_text())
    assert manifest["status"] == "finished" and f"run_dir='{ok}'" in manifest["overrides"]
    # the failed job: error.txt names the stage and the reason, the partly executed notebook is kept, no done.json
    assert not (bad / "done.json").exists()
    err = (bad / "error.txt").read_text()
    assert "stage: 02_sft" in err and "lora.dropout=0.1" in err
    nb = json.loads((bad / "notebooks" / "02_sft.ipynb").read_text())
    errors = [o for c in nb["cells"] for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert errors and errors[0]["ename"] == "LabError"
    assert (bad / "01_explore" / "metrics.json").is_file() and not (bad / "02_sft" / "metrics.json").exists()
    assert json.loads((bad / "job.json").read_text())["status"] == "failed"
    assert "failed    sft.lora.dropout=0.1" in r.stdout and "finished  sft.lora.dropout=0" in r.stdout


@pytest.mark.slow
def test_sweep_report_holds_both_jobs(failed_sweep):
    d, r = failed_sweep
    import pandas as pd

    rep = pd.read_csv(d / "report.csv")
    ok, bad = "sft.lora.dropout=0", "sft.lora.dropout=0.1"
    assert sorted(rep["job"]) == [ok, bad]
    by = rep.set_index("job")
    assert by.loc[ok, "status"] == "finished" and by.loc[bad, "status"] == "failed"
    assert by.loc[ok, "sft.lora.dropout"] == 0 and by.loc[bad, "sft.lora.dropout"] == 0.1
    assert 0 <= by.loc[ok, "02_sft.accuracy_after"] <= 1
    assert pd.isna(by.loc[bad, "02_sft.accuracy_after"])
    assert by.loc[bad, "01_explore.n_train"] == 16  # the stage that ran is reported
    assert "lora.dropout=0.1" in by.loc[bad, "error"] and by.loc[bad, "failed_stage"] == "02_sft"
    assert "per_category" not in " ".join(rep.columns)  # only scalars are flattened
    md = re.sub(r" +", " ", (d / "report.md").read_text())  # pandas' to_markdown pads cells
    assert "| sft.lora.dropout=0.1 | failed |" in md and "02_sft.accuracy_after" in md
    assert (d / "plots" / "02_sft.accuracy_after__vs__sft.lora.dropout.png").stat().st_size > 1000
    assert "| job | status |" in re.sub(r" +", " ", r.stdout)  # the table is printed


@pytest.mark.slow
def test_sweep_rerun_skips_finished_and_reruns_failed(failed_sweep):
    d, _ = failed_sweep
    ok, bad = d / "sft.lora.dropout=0", d / "sft.lora.dropout=0.1"
    done_before = (ok / "done.json").stat().st_mtime_ns
    nb_before = (ok / "notebooks" / "02_sft.ipynb").stat().st_mtime_ns
    explore_before = (bad / "01_explore" / "metrics.json").stat().st_mtime_ns
    (bad / "error.txt").write_text("stale")
    r = lab_cli("sweep", "--name", "rank", "--dir", str(d), "--smoke", "--stages", "01_explore", "02_sft",
                "--no-report", "--", "sft.lora.dropout=0,0.1")
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    assert "skipped   sft.lora.dropout=0" in r.stdout and "failed    sft.lora.dropout=0.1" in r.stdout
    assert (ok / "done.json").stat().st_mtime_ns == done_before
    assert (ok / "notebooks" / "02_sft.ipynb").stat().st_mtime_ns == nb_before
    job = json.loads((bad / "job.json").read_text())
    assert job["stages_kept"] == ["01_explore"] and job["status"] == "failed"  # finished stage kept, 02_sft rerun
    assert (bad / "01_explore" / "metrics.json").stat().st_mtime_ns == explore_before
    assert "lora.dropout=0.1" in (bad / "error.txt").read_text()
    # the fixed overrides of a sweep folder cannot change (job names would collide)
    r = lab_cli("sweep", "--name", "rank", "--dir", str(d), "--stages", "01_explore", "--", "sft.lora.dropout=0,0.1")
    assert r.returncode == 2 and "fixed overrides" in r.stderr


# ---------------------------------------------------------------------------------------------
# planning the sweep (no jobs run)
# ---------------------------------------------------------------------------------------------

def test_plan_names_swept_keys_and_seeds():
    p = sw.plan(["sft.learning_rate=1e-3,1e-2", "data.n_train=8", "hydra.launcher.n_jobs=2"], seeds=3)
    assert p["lab"] == ["sft.learning_rate=1e-3,1e-2", "data.n_train=8", "seed=1,2,3"]
    assert p["named"] == ["sft.learning_rate", "seed"] and p["fixed"] == ["data.n_train"]
    assert p["hydra"] == ["hydra.launcher.n_jobs=2"]
    assert sw.plan([], seeds=1)["named"] == ["seed"]
    h = sw.hydra_overrides(p, Path("/x/sweep dir"), "joblib")
    assert "hydra/launcher=joblib" in h and "hydra.sweep.dir='/x/sweep dir'" in h
    assert "hydra.sweep.subdir=${hydra.job.override_dirname}" in h
    assert "hydra.job.config.override_dirname.exclude_keys=['data.n_train']" in h
    assert "hydra.sweep.subdir=default" in sw.hydra_overrides(sw.plan(["data.n_train=8"]), Path("/x"), "basic")
    smoke = config.compose(sw.plan(["data.n_train=32"], smoke=True)["lab"])  # experiment=smoke, the user's key wins
    assert smoke.data.n_train == 32 and smoke.vote.k == 2


@pytest.mark.parametrize("overrides,seeds,message", [
    (["run_dir=/tmp/x"], None, "run_dir"),
    (["run_name=a,b"], None, "run_name"),
    (["seed=1,2"], 2, "--seeds"),
    (["hydra.sweep.dir=/tmp"], None, "--dir"),
    (["hydra/launcher=joblib"], None, "--launcher"),
    (["sft.learning_rate=[1,"], None, "cannot parse"),
])
def test_plan_refuses(overrides, seeds, message):
    with pytest.raises(LabError, match=message):
        sw.plan(overrides, seeds=seeds)


def test_cli_errors_before_anything_runs(tmp_path):
    from lab.__main__ import main

    assert main(["sweep", "--dir", str(tmp_path / "s"), "--", "run_dir=x"]) == 2
    assert not (tmp_path / "s").exists()
    assert main(["report", str(tmp_path / "nothing")]) == 2


# ---------------------------------------------------------------------------------------------
# the report on hand-made job folders
# ---------------------------------------------------------------------------------------------

def fake_job(sweep_dir: Path, params: dict, metrics: dict[str, dict] | None, status: str = "finished") -> Path:
    name = ",".join(f"{k}={v}" for k, v in sorted(params.items()))
    d = sweep_dir / name
    stages = sorted(metrics or {"01_explore": {}})
    overrides = [f"{k}={v}" for k, v in params.items()]
    for stage, m in (metrics or {}).items():
        atomic_write_json(d / stage / "metrics.json", m)
        mark_finished(d / stage)
    atomic_write_json(d / "job.json", {"job": name, "status": status, "params": params, "stages": stages,
                                       "overrides": overrides, "error": "LabError: boom" if status == "failed" else None,
                                       "failed_stage": "02_sft" if status == "failed" else None})
    if status == "failed":
        atomic_write_text(d / "error.txt", "stage: 02_sft\nerror: LabError: boom\n")
    if status == "finished":
        jobs.write_done(d, name, stages, overrides, "key", "now")
    return d


def full_metrics(seed: int, lr: float) -> dict:
    acc = 0.3 + lr * 10 + seed * 0.01
    return {"01_explore": {"n_train": 16, "per_category": {"a": {"train": 8}}},
            "02_sft": {"accuracy_after": acc, "accuracy_before": 0.1, "backend": "hf", "lora_targets": {"q": 2}},
            "03_grpo": {"accuracy_sft_start": acc, "accuracy_after": acc + 0.02, "delta": 0.02,
                        "reward_per_step": [0.1, None]},
            "04_vote": {"maj_at_k": acc + 0.05, "methods": {"majority": {"accuracy": 0.5}}}}


def test_report_plots_against_swept_parameters_with_seed_spread(tmp_path):
    d = tmp_path / "grid"
    for seed in (1, 2, 3):
        for lr in (0.001, 0.01):
            for r in (8, 16):
                fake_job(d, {"seed": seed, "sft.learning_rate": lr, "sft.lora.r": r}, full_metrics(seed, lr))
    fake_job(d, {"seed": 4, "sft.learning_rate": 0.01, "sft.lora.r": 8}, {"01_explore": {"n_train": 16}}, "failed")
    fake_job(d, {"seed": 5, "sft.learning_rate": 0.01, "sft.lora.r": 8}, {"01_explore": {"n_train": 16}}, "running")
    (d / ".submitit" / "x").mkdir(parents=True)
    atomic_write_json(d / ".submitit" / "x" / "job.json", {})  # hidden folders are not jobs
    out = rp.report(d)
    df = out["table"]
    assert len(df) == 14 and df["status"].value_counts().to_dict() == {"finished": 12, "failed": 1, "unfinished": 1}
    assert list(df.columns[:5]) == ["job", "status", "sft.learning_rate", "sft.lora.r", "seed"]
    assert {"02_sft.accuracy_after", "02_sft.backend", "04_vote.maj_at_k"} <= set(df.columns)
    assert not any(c.endswith(("per_category", "lora_targets", "reward_per_step", "methods")) for c in df.columns)
    assert out["swept"] == ["sft.learning_rate", "sft.lora.r"] and out["headline"] == list(rp.HEADLINE)
    names = sorted(p.name for p in out["plots"])
    assert len(names) == 10 and "03_grpo.delta__vs__sft.learning_rate.png" in names
    assert all(p.stat().st_size > 1000 for p in out["plots"])
    md = re.sub(r" +", " ", (d / "report.md").read_text())  # pandas' to_markdown pads cells
    assert "mean ± std" in md and "(n=3)" in md and "| failed |" in md and "LabError: boom" in md
    assert not list(d.glob("plots/.*"))  # atomic writes leave no temporary files


def test_report_seeds_only_sweep_draws_per_seed_bars(tmp_path):
    d = tmp_path / "seeds"
    for seed in (1, 2, 3):
        fake_job(d, {"seed": seed}, full_metrics(seed, 0.001))
    out = rp.report(d)
    assert out["swept"] == [] and [p.name for p in out["plots"]] == ["seeds.png"]
    assert out["plots"][0].stat().st_size > 1000
    assert "## Over seeds" in out["markdown"] and "(n=3)" in out["markdown"]


def test_job_status_and_done_marker(tmp_path):
    d = fake_job(tmp_path, {"seed": 1}, {"01_explore": {"n_train": 1}, "02_sft": {"accuracy_after": 0.5}})
    job = json.loads((d / "job.json").read_text())
    assert rp.job_status(d, job) == "finished"
    assert jobs.is_done(d, ["01_explore", "02_sft"], ["seed=1"])
    assert not jobs.is_done(d, ["01_explore", "02_sft"], ["seed=1", "data.n_train=8"])  # other overrides
    assert not jobs.is_done(d, ["01_explore", "02_sft", "03_grpo"], ["seed=1"])  # a stage not run
    (d / "02_sft" / "metrics.json").unlink()  # a done.json without the stage's metrics is not finished
    assert "02_sft/metrics.json: missing, though done.json vouches for it" in jobs.done_problem(d, ["01_explore"])
    assert not jobs.is_done(d, ["01_explore", "02_sft"], ["seed=1"]) and rp.job_status(d, job) == "not current"
    (d / "done.json").write_text("{ half written")
    assert not jobs.is_done(d, ["01_explore"], ["seed=1"])


def test_report_says_where_each_job_ran(tmp_path):
    """The tiny model's outcome for a seed depends on the device and thread count, so the report shows both."""
    d = tmp_path / "hw"
    gpu = fake_job(d, {"seed": 1}, full_metrics(1, 0.001))
    cpu = fake_job(d, {"seed": 2}, full_metrics(2, 0.001))
    old = fake_job(d, {"seed": 3}, full_metrics(3, 0.001))
    for job, hw in ((gpu, {"cuda": True, "gpus": ["NVIDIA H100 80GB HBM3"], "torch_threads": 1}),
                    (cpu, {"cuda": False, "torch_threads": 2}),
                    (old, {"cuda": False})):  # old: before threads were recorded
        mark_finished(job / "01_explore", hardware=hw)
        jobs.write_done(job, job.name, sorted(full_metrics(1, 0.001)), [f"seed={job.name[-1]}"], "key", "now")
    out = rp.report(d)
    assert out["table"]["hardware"].tolist() == ["NVIDIA H100 80GB HBM3, torch threads 1", "cpu, torch threads 2", "cpu"]
    assert "| seed=2 | finished | 2 | cpu, torch threads 2 |" in re.sub(r" +", " ", out["markdown"])


def test_report_lists_a_job_whose_job_json_is_unreadable(tmp_path):
    d = tmp_path / "broken"
    (d / "seed=1").mkdir(parents=True)
    (d / "seed=1" / "job.json").write_text("{ half written")
    out = rp.report(d)
    assert out["table"][["job", "status"]].values.tolist() == [["seed=1", "unreadable"]]
    assert "not valid JSON" in out["table"]["error"].iloc[0]
