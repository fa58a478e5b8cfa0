"""The five notebooks: stored clean with a `parameters` cell, and executed end to end by papermill on the smoke budget."""

import json

import nbformat
import pytest

from lab.core.paths import project_root
from lab.runs.pipeline import SMOKE_OVERRIDES, STAGES, run_notebooks, summary

NOTEBOOKS = [project_root() / "notebooks" / f"{s}.ipynb" for s in STAGES]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=STAGES)
def test_notebook_is_clean_and_parameterised(path):
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert not any(c.get("outputs") or c.get("execution_count") for c in code), "stored with outputs"
    params = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1 and "overrides: list[str] = []" in params[0].source
    assert nb.cells[0].cell_type == "markdown" and "What this notebook does" in nb.cells[0].source
    assert any(f'stages.open_stage("{path.stem}", overrides)' in c.source for c in code)


@pytest.mark.slow
def test_all_notebooks_run_on_the_smoke_budget(smoke_run):
    run_dir = smoke_run  # the shared run of the five notebooks (tests/conftest.py)
    s = summary(run_dir)
    for stage in STAGES:
        assert "missing" not in s["stages"][stage], stage
        assert (run_dir / "notebooks" / f"{stage}.ipynb").is_file()
        assert json.loads((run_dir / stage / "manifest.json").read_text())["status"] == "finished"
    st = s["stages"]
    assert {"accuracy_before", "accuracy_after", "wall_seconds"} <= set(st["02_sft"])
    assert {"reward_per_step", "accuracy_after", "accuracy_sft_start"} <= set(st["03_grpo"])
    assert {"greedy_accuracy", "maj_at_k"} <= set(st["04_vote"])
    assert {"accuracy_by_category", "taxonomy"} <= set(st["05_errors"])
    m3, m5 = (json.loads((run_dir / stage / "metrics.json").read_text()) for stage in ("03_grpo", "05_errors"))
    # fixed - broken is the net change from the SFT start, counted once (not once per category and again in "all")
    assert m5["fixed_since_sft"] - m5["broken_since_sft"] == round(m5["n"] * (m5["accuracy"] - m3["accuracy_sft_start"]))
    assert (run_dir / "summary.md").is_file() and (run_dir / "02_sft" / "adapter" / "adapter_config.json").is_file()
    # 04_vote's greedy pass of the GRPO adapter is 03_grpo's evaluation of it, reused (lab.stages.evaluate)
    assert (run_dir / "04_vote" / "predictions.csv").read_bytes() == (run_dir / "03_grpo" / "predictions.csv").read_bytes()
    said = [o.get("text", "") for c in nbformat.read(run_dir / "notebooks" / "04_vote.ipynb", as_version=4).cells
            for o in c.get("outputs", [])]
    assert any("reused, not generated" in t for t in said)
    assert len(list((run_dir / "evaluations").glob("*.csv"))) == 2  # the SFT and the GRPO adapter


@pytest.mark.slow
def test_same_seed_gives_identical_metrics(smoke_run, tmp_path):
    """Two runs with the same seed agree on every metric (timings aside) on CPU: the shared smoke run of all five
    notebooks, and 02_sft and 03_grpo run again on their own."""

    def metrics(run_dir):
        out = {}
        for stage in ["02_sft", "03_grpo"]:
            m = json.loads((run_dir / stage / "metrics.json").read_text())
            out[stage] = {k: v for k, v in m.items() if "seconds" not in k and k not in ("resumed_from",)}
        return out

    b = run_notebooks(SMOKE_OVERRIDES + [f"run_dir={tmp_path}/b"], stages=["02_sft", "03_grpo"], log_output=False)
    assert metrics(smoke_run) == metrics(b)


def test_the_smoke_preset_yields_to_the_users_keys_and_joins_another_experiment():
    """`experiment=smoke` (conf/experiment/smoke.yaml): a key the user gives wins; `with_smoke` (sweep --smoke) joins
    an experiment the user chose instead of replacing it."""
    from lab.core.config import compose
    from lab.runs.pipeline import with_smoke

    assert SMOKE_OVERRIDES == ["experiment=smoke"]
    cfg = compose(with_smoke(["sft.max_steps=5", "run_name=x"]))
    assert cfg.sft.max_steps == 5 and cfg.data.n_train == 16 and cfg.vote.k == 2 and cfg.model.name == "tiny"
    cfg = compose(with_smoke(["experiment=competition", "data.n_val=8"]))
    assert (cfg.model.name, cfg.data.source, cfg.data.trace_style) == ("nemotron_nano", "competition", "derivation")
    assert cfg.sft.max_steps == 2 and cfg.grpo.max_steps == 1 and cfg.data.n_val == 8


@pytest.mark.slow  # a real-model config composed and checked end to end: seconds (the fast lane stays short)
def test_a_notebooks_first_call_checks_the_machine_before_it_opens_the_stage(tmp_path):
    """`lab.stages.open_stage`: the real model on a machine without CUDA is refused before any folder is made."""
    import torch

    from lab import LabError
    from lab.stages import open_stage

    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    with pytest.raises(LabError, match="02_sft with model=nemotron_nano cannot run on this machine"):
        open_stage("02_sft", ["model=nemotron_nano", f"run_dir={tmp_path / 'run'}"])
    assert not (tmp_path / "run").exists()


SMALL_DATA = ["data.n_train=16", "data.n_val=4", "data.explore_max=16"]


def _readme_papermill_call() -> list[str]:
    """The headless papermill call README.md documents, split as a shell would."""
    import shlex

    lines = [ln.strip() for ln in (project_root() / "README.md").read_text(encoding="utf-8").splitlines()
             if ln.strip().startswith(".venv/bin/papermill ")]
    assert lines, "README.md documents no `.venv/bin/papermill ...` call"
    return shlex.split(lines[0].split("  #")[0])


@pytest.mark.slow
def test_the_readme_papermill_call_runs(tmp_path):
    """README's `papermill NB OUT -p overrides '[...]'` through papermill's own command line: the notebook receives
    the JSON string and reads it as the list (only the data size and the run folder are added here)."""
    import subprocess
    import sys

    args = _readme_papermill_call()
    assert args[:2] == [".venv/bin/papermill", "notebooks/01_explore.ipynb"] and args[3:5] == ["-p", "overrides"]
    overrides = json.loads(args[5])
    assert overrides == ["seed=7", "run_name=seed7"]
    args[5] = json.dumps([*overrides, *SMALL_DATA, f"run_dir={tmp_path / 'run'}"])
    out = subprocess.run([sys.executable, "-m", "papermill", args[1], str(tmp_path / "out.ipynb"), *args[3:],
                          "-k", "python3"], cwd=project_root(), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    m = json.loads((tmp_path / "run" / "01_explore" / "manifest.json").read_text())
    assert m["status"] == "finished" and m["seed"] == 7 and m["overrides"][:2] == overrides


@pytest.mark.slow
def test_two_interactive_runs_with_defaults_get_two_folders_and_leave_the_demo_alone(tmp_path, monkeypatch):
    """01_explore executed twice with its parameters cell as stored (no run_name), against a copy of conf/ whose
    data defaults are small: two time-stamped run folders, and outputs/demo (the demo's) untouched."""
    import shutil
    import time

    import papermill as pm

    notebook = project_root() / "notebooks" / "01_explore.ipynb"
    root = tmp_path / "lab"
    shutil.copytree(project_root() / "conf", root / "conf")
    syn = root / "conf" / "data" / "synthetic.yaml"
    text = syn.read_text()
    for key, small in (("n_train", 16), ("n_val", 4), ("explore_max", 16)):
        text = text.replace(f"\n{key}: ", f"\n{key}: {small}  # ", 1)
    syn.write_text(text)
    demo = root / "outputs" / "demo"
    demo.mkdir(parents=True)
    (demo / "summary.md").write_text("the demo's own summary")
    monkeypatch.setenv("LAB_ROOT", str(root))
    for i in range(2):
        pm.execute_notebook(str(notebook), str(tmp_path / f"run{i}.ipynb"),
                            cwd=str(root), kernel_name="python3", progress_bar=False)
        time.sleep(1.1)  # the folder name has whole seconds
    runs = sorted(p.name for p in (root / "outputs").iterdir() if p.name != "demo")
    assert len(runs) == 2, runs
    for r in runs:
        assert json.loads((root / "outputs" / r / "01_explore" / "metrics.json").read_text())["n_train"] == 16
    assert sorted(p.name for p in demo.iterdir()) == ["summary.md"] and (demo / "summary.md").read_text() == \
        "the demo's own summary"
