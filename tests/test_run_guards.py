"""Nothing is touched before the run is known to be sane: overrides validated at compose time (a rejected run leaves
every finished stage byte-identical), `--stages` keeps the overrides, one writer per run folder, files readable by
the user's group as a plain `open` makes them, clear errors for unwritable folders and missing models."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lab.core import io as lab_io
from lab.core import run
from lab import LabError
from lab.core.config import compose
from lab.core.io import atomic_write_text
from lab.core.run import Stage

BAD = [("sft.grad_accum=0", "sft.grad_accum=0 must be >= 1"), ("sft.batch_size=0", "sft.batch_size=0 must be >= 1"),
       ("sft.learning_rate=abc", "sft.learning_rate='abc' must be a number"),
       ("sft.learning_rate=0", "must be > 0"), ("seed=abc", "seed='abc' must be a whole number"),
       ("infer.max_tokens=0", "infer.max_tokens=0 must be >= 1"), ("sft.epochs=0", "sft.epochs=0.0 must be > 0"),
       ("sft.max_steps=-5", "sft.max_steps=-5 must be >= 1"), ("sft.lora.r=64", "sft.lora.r=64 must be <= 32"),
       ("sft.lora.r=0", "sft.lora.r=0 must be >= 1"), ("vote.k=0", "vote.k=0 must be >= 1"),
       ("grpo.learning_rate=-1", "grpo.learning_rate=-1.0 must be > 0"),
       ("grpo.rollout_backend=vlm", "grpo.rollout_backend='vlm' is not one of hf, vllm"),
       ("competition.max_lora_rank=64", "competition.max_lora_rank is fixed by the competition"),
       ("data.path=/no/such/train.csv", "data file not found")]


@pytest.mark.parametrize("override,message", BAD)
def test_bad_override_is_refused_at_compose_time(override, message):
    extra = ["data=competition"] if override.startswith("data.path") else []
    with pytest.raises(LabError) as e:
        compose([*extra, override])
    assert message in str(e.value) and "config.yaml" in str(e.value)


def test_good_overrides_still_compose():
    compose(["sft.epochs=0", "sft.max_steps=3", "sft.lora.r=32", "infer.temperature=0", "seed=7"])
    compose(["model=nemotron_nano"])  # a Hub id is checked when the model is loaded, not at compose time


def _finished_02_sft(run_dir: Path) -> dict[Path, bytes]:
    st = Stage("02_sft", [f"run_dir={run_dir}"])
    atomic_write_text(st.path("adapter", "adapter_model.safetensors"), "weights")
    atomic_write_text(st.path("adapter", "adapter_config.json"), "{}")
    st.finish({"accuracy_after": 0.5})
    return {p: p.read_bytes() for p in sorted((run_dir / "02_sft").rglob("*")) if p.is_file()}


# compose refuses every bad override before a folder is touched, by the same path: one override of each kind of
# refusal (a range, a type, a choice, a read-only key) runs in the fast lane, the others in the slow lane
FAST_REJECTED = {"sft.lora.r=64", "sft.learning_rate=abc", "grpo.rollout_backend=vlm", "competition.max_lora_rank=64"}


@pytest.mark.parametrize("override", [o if o in FAST_REJECTED else pytest.param(o, marks=pytest.mark.slow)
                                      for o, _ in BAD if not o.startswith("data.")])
def test_a_rejected_run_leaves_a_finished_stage_byte_identical(tmp_path, override):
    before = _finished_02_sft(tmp_path)
    assert {"metrics.json", "config.yaml", "adapter_model.safetensors"} <= {p.name for p in before}
    with pytest.raises(LabError):
        Stage("02_sft", [f"run_dir={tmp_path}", override])
    from lab.__main__ import main

    assert main(["demo", f"run_dir={tmp_path}", override, "--stages", "02_sft"]) == 2
    after = {p: p.read_bytes() for p in sorted((tmp_path / "02_sft").rglob("*")) if p.is_file()}
    assert after == before


def test_stages_do_not_swallow_the_overrides_after_them(monkeypatch, tmp_path):
    from lab.runs import pipeline
    from lab.__main__ import main

    seen = []
    (tmp_path / "summary.md").write_text("# summary\n")  # what the demo prints at the end
    monkeypatch.setattr(pipeline, "run_notebooks", lambda overrides, stages: seen.append((overrides, stages)) or
                        tmp_path)
    monkeypatch.setattr(pipeline, "summary", lambda run_dir: {"stages": {}})
    assert main(["demo", "run_name=r", "--stages", "02_sft", "sft.max_steps=2", "03_grpo"]) == 0
    assert seen == [(["experiment=demo", "run_name=r", "sft.max_steps=2"], ["02_sft", "03_grpo"])]  # the demo's budget
    assert main(["demo", "--stages", "03_grpo", "seed=3", "02_sft"]) == 0  # no run_name: the demo's folder
    assert seen[1] == (["experiment=demo", "run_name=demo", "seed=3"], ["03_grpo", "02_sft"])
    assert main(["demo", "--stages", "02_sf", "seed=3"]) == 2  # a typo: refused, nothing run
    assert main(["demo", "02_sft", "seed=3"]) == 0  # a stage name among the overrides is a stage
    assert seen[2] == (["experiment=demo", "run_name=demo", "seed=3"], ["02_sft"]) and len(seen) == 3


def test_unknown_stage_is_refused_before_any_stage_runs(tmp_path):
    from lab.runs.pipeline import run_notebooks

    with pytest.raises(LabError, match="no stage notebook"):
        run_notebooks([f"run_dir={tmp_path}"], ["01_explore", "06_nothing"])
    assert not (tmp_path / "01_explore").exists()


# ---- one writer per run folder -----------------------------------------------------------------

STAGE_IN_CHILD = ("import sys; from lab import LabError; from lab.core.run import Stage\n"
                  "try:\n    Stage('01_explore', [f'run_dir={sys.argv[1]}'])\n"
                  "except LabError as e:\n    print(e); sys.exit(3)\n")


@pytest.mark.slow  # several seconds: subprocesses or a full trace (the fast lane stays short)
def test_a_second_run_into_the_same_folder_refuses(tmp_path):
    first = Stage("01_explore", [f"run_dir={tmp_path}"])
    env = {k: v for k, v in os.environ.items() if k != run.LOCK_ENV}
    out = subprocess.run([sys.executable, "-c", STAGE_IN_CHILD, str(tmp_path)], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 3 and f"process {os.getpid()}" in out.stdout and ".lock" in out.stdout
    first.finish({})  # released: the next run may start
    for _ in range(2):  # the second time after a process that exited without finishing its stage: the OS let go
        out = subprocess.run([sys.executable, "-c", STAGE_IN_CHILD, str(tmp_path)], capture_output=True, text=True,
                             env=env, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr


def test_a_lock_file_left_by_a_dead_process_does_not_block(tmp_path):
    """The lock is the OS's (filelock's flock), so it died with its process: the file it left is only text."""
    import json
    import socket

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / ".lock").write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname(), "token": "x"}))
    st = Stage("01_explore", [f"run_dir={tmp_path}"])
    assert json.loads((tmp_path / ".lock").read_text())["pid"] == os.getpid()
    st.finish({})


@pytest.mark.slow  # several seconds: subprocesses or a full trace (the fast lane stays short)
def test_a_driver_lends_its_lock_to_the_stages_it_runs(tmp_path):
    with run.run_lock(tmp_path):
        env = dict(os.environ)  # what papermill's kernels inherit
        out = subprocess.run([sys.executable, "-c", STAGE_IN_CHILD, str(tmp_path)], capture_output=True, text=True,
                             env=env, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        assert run.LOCK_ENV in os.environ  # still the driver's
        env.pop(run.LOCK_ENV)  # a process that is not the driver's child still refuses
        out = subprocess.run([sys.executable, "-c", STAGE_IN_CHILD, str(tmp_path)], capture_output=True, text=True,
                             env=env, timeout=300)
        assert out.returncode == 3, out.stdout + out.stderr
    assert run.LOCK_ENV not in os.environ


# ---- files and folders -------------------------------------------------------------------------

def test_files_get_the_users_normal_permissions(tmp_path):
    from lab.core import plots

    old = os.umask(0o022)
    try:
        p = atomic_write_text(tmp_path / "a.txt", "x")
        with lab_io.atomic_dir(tmp_path / "adapter") as d:
            (d / "w").write_text("x")
        png = plots.save(plots.figure(), tmp_path / "f.png")
    finally:
        os.umask(old)
    assert oct(p.stat().st_mode & 0o777) == oct(0o644)
    assert oct(png.stat().st_mode & 0o777) == oct(0o644)
    assert oct((tmp_path / "adapter").stat().st_mode & 0o777) == oct(0o755)


def test_kaggle_source_tarball_gets_normal_permissions(tmp_path):
    from lab.kaggle import kernel as kaggle

    old = os.umask(0o022)
    try:
        p = kaggle._source_tarball(tmp_path)
    finally:
        os.umask(old)
    assert oct(p.stat().st_mode & 0o777) == oct(0o644)


def test_an_unwritable_output_folder_is_a_clear_error(tmp_path, monkeypatch):
    def refuse(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(lab_io.tempfile, "mkstemp", refuse)
    with pytest.raises(LabError, match=r"out\.csv: cannot write here \(Permission denied\)"):
        atomic_write_text(tmp_path / "ro" / "out.csv", "x")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_output_folder_is_a_clear_error(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        with pytest.raises(LabError, match="cannot write here"):
            atomic_write_text(ro / "out.csv", "x")
    finally:
        ro.chmod(0o755)


def test_a_model_path_that_does_not_exist_is_a_clear_error(tmp_path):
    from lab.model import models

    with pytest.raises(LabError) as e:
        compose(["model=nemotron_nano", f"model.path={tmp_path}/no_model"])
    assert "no_model: model folder not found" in str(e.value) and "Repo id" not in str(e.value)
    cfg = compose(["model=nemotron_nano", "model.path=nobody/no-such-model-here"])
    with pytest.raises(LabError, match="not in the local cache"):
        models.load_tokenizer(cfg)


@pytest.mark.slow  # several seconds: subprocesses or a full trace (the fast lane stays short)
def test_other_ranks_of_a_distributed_launch_follow_the_main_process(tmp_path):
    """scripts/_launch.py: the main process opens the stage (and holds the lock), then ranks 1.. open it too."""
    main = Stage("02_sft", [f"run_dir={tmp_path}"])
    env = {k: v for k, v in os.environ.items() if k != run.LOCK_ENV}
    out = subprocess.run([sys.executable, "-c", STAGE_IN_CHILD, str(tmp_path)], capture_output=True, text=True,
                         env={**env, "RANK": "1"}, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    main.finish({})


def test_kaggle_paths_are_left_for_kaggle_to_check(tmp_path):
    """`lab kaggle build` composes a kernel's overrides locally; /kaggle/ paths exist only there."""
    import pathlib

    if pathlib.Path("/kaggle").is_dir():
        pytest.skip("on Kaggle the paths are checked")
    compose(["data=competition", "data.path=/kaggle/input/x/train.csv", "model=nemotron_nano",
             "model.path=/kaggle/input/nano/model"])


# ---- a stage reads only what a finished stage wrote ------------------------------------------------------------

def _crashed_grpo_rerun(run_dir: Path) -> Path:
    """03_grpo's folder after a finished run and a crashed rerun: the old adapter is still there, but the rerun
    removed metrics.json and left manifest.json "running" (lab.core.run.Stage)."""
    from lab.core import owner

    owner.claim_run(run_dir)  # a run folder the lab made
    adapter = run_dir / "03_grpo" / "adapter"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text("{}")
    atomic_write_text(run_dir / "03_grpo" / "manifest.json", '{"stage": "03_grpo", "status": "running"}')
    return adapter


def test_vote_adapter_of_an_unfinished_stage_is_refused(tmp_path):
    from lab.core.io import atomic_write_json
    from lab.core.run import stage_input

    cfg = compose([f"run_dir={tmp_path}"])
    adapter = _crashed_grpo_rerun(tmp_path)
    with pytest.raises(LabError, match=r"03_grpo' has no finished output"):
        stage_input(cfg, cfg.grpo.adapter_dir)
    atomic_write_json(tmp_path / "03_grpo" / "metrics.json", {"steps": 1})  # by hand: its manifest still "running"
    with pytest.raises(LabError, match="manifest.json is status 'running', not finished"):
        stage_input(cfg, cfg.grpo.adapter_dir)
    from finished import mark_finished  # tests/finished.py: as Stage.finish would

    mark_finished(tmp_path / "03_grpo")
    assert stage_input(cfg, cfg.grpo.adapter_dir) == adapter
    with pytest.raises(LabError, match="expected output of stage '03_grpo' is missing"):
        stage_input(cfg, tmp_path / "03_grpo" / "no_adapter")
    elsewhere = tmp_path.parent / "an_adapter_from_elsewhere"  # not in a stage folder of this run: not checked here
    assert stage_input(cfg, elsewhere) == elsewhere


@pytest.mark.slow
def test_04_vote_refuses_to_vote_after_a_crashed_03_grpo(tmp_path):
    """The 04_vote notebook itself, through papermill: it stops with the LabError before loading any model."""
    import papermill as pm

    from lab.core.paths import project_root

    _crashed_grpo_rerun(tmp_path)
    with pytest.raises(pm.PapermillExecutionError) as e:
        pm.execute_notebook(str(project_root() / "notebooks" / "04_vote.ipynb"), str(tmp_path / "out.ipynb"),
                            parameters={"overrides": [f"run_dir={tmp_path}", "data.n_train=16", "data.n_val=4"]},
                            kernel_name="python3", progress_bar=False, cwd=str(project_root()))
    # no 02_sft either: nothing to vote with (with a finished 02_sft, 04_vote would vote with its adapter and say so)
    assert e.value.ename == "LabError" and "no finished training stage" in e.value.evalue
