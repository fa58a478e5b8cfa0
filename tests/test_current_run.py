"""Notebooks opened one after the other without run_name share one run: a stage after 01_explore joins the current
run (the newest whose earlier stage finished, `lab.core.run.current_run`), named in its first line, unless told to
start a new one; a refusal reads as one sentence."""

import json
import os
import shutil

import pytest

from lab.core.owner import RUN_MARKER
from lab.core.paths import project_root
from lab.core.run import current_run

NOTEBOOKS = project_root() / "notebooks"  # before a test points LAB_ROOT at a copy of conf/ alone


def _finished(run, stage, when):
    """A run folder the lab made (its marker) whose `stage` finished at `when`."""
    (run / stage).mkdir(parents=True, exist_ok=True)
    (run / RUN_MARKER).write_text(json.dumps({"run_id": run.name, "run_name": run.name}))
    m = run / stage / "metrics.json"
    m.write_text("{}")
    os.utime(m, (when, when))


def test_the_current_run_is_the_newest_whose_earlier_stage_finished(tmp_path):
    _finished(tmp_path / "demo", "01_explore", 100)
    _finished(tmp_path / "demo", "02_sft", 300)
    _finished(tmp_path / "2026-11-29_10-00-00", "01_explore", 200)
    (tmp_path / "2026-11-29_11-00-00" / ".01_explore.partial").mkdir(parents=True)  # a 01 that did not finish
    assert current_run(tmp_path, "02_sft").name == "2026-11-29_10-00-00"  # its 01 finished last
    assert current_run(tmp_path, "03_grpo").name == "demo"
    assert current_run(tmp_path, "04_vote").name == "demo"  # 03_grpo's adapter, else 02_sft's
    assert current_run(tmp_path, "05_errors") is None  # no run voted yet
    assert current_run(tmp_path, "01_explore") is None  # the first stage starts a run
    assert current_run(tmp_path / "missing", "02_sft") is None


@pytest.fixture
def lab_root(tmp_path, monkeypatch):
    """A copy of conf/ whose default is the smoke budget (experiment=smoke), as LAB_ROOT: runs land in its outputs/."""
    root = tmp_path / "lab"
    shutil.copytree(project_root() / "conf", root / "conf")
    top = root / "conf" / "config.yaml"
    top.write_text(top.read_text().replace("  - experiment: null", "  - experiment: smoke"))
    monkeypatch.setenv("LAB_ROOT", str(root))
    return root


def test_a_stage_opened_without_run_name_joins_the_current_run_unless_told(lab_root, capsys):
    from lab.recipes import common

    run = lab_root / "outputs" / "2026-11-29_10-00-00"
    _finished(run, "01_explore", 200)
    stage = common.open_stage("02_sft", [])
    first = capsys.readouterr().out.splitlines()[0]
    assert stage.run_dir == run and first.startswith(f"joining the current run {run}") and "new_run=True" in first
    stage.finish({})  # lets go of the run's lock
    fresh = common.open_stage("02_sft", [], new_run=True)
    assert fresh.run_dir.parent == run.parent and fresh.run_dir != run
    fresh.finish({})
    named = common.open_stage("02_sft", ["run_name=mine"])
    assert named.run_dir == lab_root / "outputs" / "mine"
    named.finish({})


def test_a_stage_composes_its_config_once_and_again_only_to_join_a_run(lab_root, monkeypatch):
    """`open_stage` composes the overrides once; the preflight, the fast paths and `Stage` take that config. Joining
    the current run composes once more, with its run_name (the run folder is part of many resolved paths)."""
    from lab.recipes import common
    from lab.core import config, run
    from lab.plan import preflight

    calls = []
    real = config.compose
    for module in (config, run, preflight):  # every name a stage opening could compose through
        monkeypatch.setattr(module, "compose", lambda overrides=(): calls.append(list(overrides)) or real(overrides))
    common.open_stage("01_explore", ["run_name=first"]).finish({})
    assert calls == [["run_name=first"]]
    calls.clear()
    stage = common.open_stage("02_sft", [])  # joins "first", whose 01_explore just finished
    assert calls == [[], ["run_name=first"]] and stage.run_dir.name == "first"
    assert stage.manifest["overrides"] == ["run_name=first"]
    stage.finish({})


@pytest.mark.slow  # two notebooks, each in its own kernel, on the smoke budget
def test_01_then_02_without_run_name_share_one_run_and_a_refusal_is_one_line(lab_root, tmp_path):
    """01_explore then 02_sft executed with their parameters cells as stored (no run_name): one run folder holds both
    stages. 02_sft again with another seed joins it too and is refused by the split: its error output is the
    LabError's one line, naming the setting, not a traceback."""
    import nbformat
    import papermill as pm

    for stage in ("01_explore", "02_sft"):
        pm.execute_notebook(str(NOTEBOOKS / f"{stage}.ipynb"), str(tmp_path / f"{stage}.ipynb"),
                            cwd=str(lab_root), kernel_name="python3", progress_bar=False)
    runs = list((lab_root / "outputs").iterdir())
    assert len(runs) == 1 and {"01_explore", "02_sft"} <= {p.name for p in runs[0].iterdir()}
    assert json.loads((runs[0] / "02_sft" / "manifest.json").read_text())["status"] == "finished"
    said = [o.get("text", "") for c in nbformat.read(tmp_path / "02_sft.ipynb", as_version=4).cells
            for o in c.get("outputs", [])]
    assert any(t.startswith(f"joining the current run {runs[0]}") for t in said)
    with pytest.raises(pm.PapermillExecutionError) as e:
        pm.execute_notebook(str(NOTEBOOKS / "02_sft.ipynb"), str(tmp_path / "again.ipynb"),
                            parameters={"overrides": ["seed=7"]}, cwd=str(lab_root), kernel_name="python3",
                            progress_bar=False)
    assert e.value.ename == "LabError" and "seed=1234, not 7" in e.value.evalue
    errors = [o for c in nbformat.read(tmp_path / "again.ipynb", as_version=4).cells for o in c.get("outputs", [])
              if o.output_type == "error"]
    assert len(errors) == 1 and len(errors[0].traceback) == 1 and errors[0].traceback[0].startswith("LabError: ")
