"""Sweeps on a cluster: Hydra's submitit launchers (lab.runs.sweep, docs/scaling.md).

`submitit_slurm` and `submitit_local` are the same Hydra plugin class (`BaseSubmititLauncher`) over submitit's
SLURM and local executors, so the local one runs here what a cluster runs: two jobs with different seeds, one of
them killed mid-stage (SIGKILL, as a preempted or out-of-memory job), resumed by running the same command again,
and `lab report` collecting both. docs/scaling.md's SLURM command (7.1) composes (its `hydra.launcher.*` keys exist).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

from lab.runs import sweep as sw
from lab.core.paths import project_root

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(project_root())}
# the example of docs/scaling.md, "7.1 Sweeps on a SLURM cluster", launcher keys only
SLURM = ["hydra.launcher.partition=gpu", "hydra.launcher.gpus_per_node=1", "hydra.launcher.cpus_per_task=16",
         "hydra.launcher.mem_gb=200", "hydra.launcher.timeout_min=1440", "hydra.launcher.max_num_timeout=3",
         "hydra.launcher.constraint=h100", "+hydra.launcher.additional_parameters.exclusive=true"]


def test_the_readme_slurm_sweep_composes():
    """Hydra composes docs/scaling.md's SLURM settings onto the submitit_slurm launcher (a misspelt key is refused)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from lab.core.schema import register

    p = sw.plan(["model=nemotron_nano", "data=competition", "sft.learning_rate=1e-4,2e-4", *SLURM], seeds=2)
    overrides = [o for o in sw.hydra_overrides(p, project_root() / "outputs" / "sweeps" / "x", "submitit_slurm")
                 if "," not in o.split("=", 1)[1] or o.startswith("hydra.")]  # one point of the grid
    register()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(str(project_root() / "conf"), version_base="1.3"):
            cfg = compose("config", overrides=overrides, return_hydra_config=True)
            launcher = cfg.hydra.launcher
            assert launcher._target_.endswith("SlurmLauncher")
            assert (launcher.partition, launcher.gpus_per_node, launcher.max_num_timeout) == ("gpu", 1, 3)
            assert launcher.constraint == "h100" and launcher.additional_parameters == {"exclusive": True}
            with pytest.raises(Exception, match="gpus_per_nod"):
                compose("config", overrides=[*overrides, "hydra.launcher.gpus_per_nod=1"], return_hydra_config=True)
    finally:
        GlobalHydra.instance().clear()


def _sweep(d, *extra) -> list[str]:
    return [sys.executable, "-m", "lab", "sweep", "--name", "cluster", "--dir", str(d), "--smoke", "--stages",
            "01_explore", "--launcher", "submitit_local", *extra, "--", "seed=1,2"]


@pytest.mark.slow
def test_submitit_sweep_two_seeds_a_killed_job_resumes_and_the_report_collects_both(tmp_path):
    d = tmp_path / "cluster"
    proc = subprocess.Popen(_sweep(d, "--no-report"), cwd=project_root(), env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    job = d / "seed=2" / "job.json"
    t0 = time.time()
    while not job.is_file() and proc.poll() is None and time.time() - t0 < 300:
        time.sleep(0.2)
    assert job.is_file(), "the seed=2 job never started"
    pid = json.loads(job.read_text())["pid"]
    assert pid != proc.pid  # the job runs in submitit's own process
    os.kill(pid, signal.SIGKILL)  # as SLURM preemption, a node failure or the OOM killer would
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 1, out[-3000:]
    assert "finished  seed=1" in out and "failed    seed=2" in out and "died" in out, out[-3000:]
    assert (d / "seed=1" / "done.json").is_file() and not (d / "seed=2" / "done.json").exists()

    again = subprocess.run(_sweep(d), cwd=project_root(), env=ENV, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "skipped   seed=1" in again.stdout and "finished  seed=2" in again.stdout
    assert any((d / ".submitit").rglob("*_result.pkl"))  # it really went through submitit
    report = pd.read_csv(d / "report.csv")
    assert sorted(report["seed"].tolist()) == [1, 2] and set(report["status"]) == {"finished"}
    assert report["01_explore.n_train"].notna().all()
