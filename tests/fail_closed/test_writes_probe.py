"""Fail closed, the write-ownership class, a second probe: variations the first probe did not try (other commands,
other config paths, nesting the other way round, outputs into a finished run), each refused with the way around it
named; and the controls: what the lab may write (its own folder again, `--force`, `overwrite=true`) still works."""

import pytest

from lab import LabError
from lab.__main__ import main
from lab.core import owner
from lab.core.paths import project_root
from lab.core.run import Stage

from test_writes import SMOKE, _files, _finished_run, _refused, keep  # noqa: F401 - keep: the fixture


def _puzzles(path, n=2):
    return main(["puzzles", "generate", "--category", "bit_manipulation", "--n", str(n), str(path)])


def test_pack_over_a_tracked_file_is_refused(tmp_path, keep, capsys):
    """`pack ADAPTER README.md`: not an input of pack, but a file git tracks."""
    from lab.core.config import compose
    from lab.model import lora, models

    cfg = compose([f"run_dir={tmp_path / 'run'}", SMOKE])
    adapter = lora.save_adapter(lora.attach_lora(cfg, models.load(cfg)[0])[0], tmp_path / "adapter")  # a real one
    readme = project_root() / "README.md"
    before = keep(readme)[readme]
    capsys.readouterr()
    _refused(["pack", str(adapter), str(readme)], capsys, "git tracks", "--force")
    assert readme.read_bytes() == before


def test_score_details_over_a_users_file_is_refused(tmp_path, capsys):
    gold, pred, notes = tmp_path / "gold.csv", tmp_path / "pred.csv", tmp_path / "notes.csv"
    gold.write_text("id,answer\na,1\n")
    pred.write_text("id,answer\na,1\n")
    notes.write_text("my,notes\n")
    _refused(["score", str(pred), "--gold", str(gold), "--details", str(notes)], capsys, "already exists", "--force")
    assert notes.read_text() == "my,notes\n"


def test_puzzles_solve_over_a_users_file_is_refused(tmp_path, capsys):
    assert _puzzles(tmp_path / "in.csv") == 0
    out = tmp_path / "mine.csv"
    out.write_text("the user's\n")
    _refused(["puzzles", "solve", str(tmp_path / "in.csv"), str(out)], capsys, "already exists", "--force")
    assert out.read_text() == "the user's\n"


def test_a_command_output_into_a_finished_run_is_refused(tmp_path, capsys):
    """`puzzles generate ... RUN/02_sft/extra.csv`: a new file, but inside a run folder (its stage would read as
    hand-edited)."""
    run = _finished_run(tmp_path / "run")
    before = _files(run)
    _refused(["puzzles", "generate", "--category", "bit_manipulation", "--n", "2", str(run / "02_sft" / "extra.csv")],
             capsys, "inside the run folder", "--force")
    assert _files(run) == before


def test_kaggle_build_into_a_run_folder_is_refused(tmp_path, capsys):
    run = _finished_run(tmp_path / "run")
    before = _files(run)
    _refused(["kaggle", "build", "--notebook", "01_explore", "--username", "me", "--out", str(run / "kernel")],
             capsys, "inside the run folder", "--force")
    assert _files(run) == before


def test_grpo_adapter_dir_into_another_run_is_refused(tmp_path):
    other = _finished_run(tmp_path / "other", adapter=True)
    before = _files(other)
    with pytest.raises(LabError, match="another run's folder"):
        Stage("03_grpo", [f"run_dir={tmp_path / 'mine'}", f"grpo.adapter_dir={other}/02_sft/adapter", SMOKE])
    assert _files(other) == before and not (tmp_path / "mine").exists()


def test_split_dir_into_a_users_folder_is_refused(tmp_path):
    """`data.split_dir=FOLDER` holding the user's files (not the data file: that case was refused already)."""
    folder = tmp_path / "my_data"
    folder.mkdir()
    (folder / "val.csv").write_text("the user's held-out set\n")
    with pytest.raises(LabError, match="already exists"):
        Stage("01_explore", [f"run_dir={tmp_path / 'run'}", f"data.split_dir={folder}", SMOKE])
    assert (folder / "val.csv").read_text() == "the user's held-out set\n"


def test_tiny_model_built_into_another_run_is_refused(tmp_path):
    other = _finished_run(tmp_path / "other")
    with pytest.raises(LabError, match="another run's folder"):
        Stage("01_explore", [f"run_dir={tmp_path / 'mine'}", f"model.path={other}/02_sft/base", SMOKE])
    assert not (other / "02_sft" / "base").exists()


def test_a_run_folder_holding_another_run_is_refused(tmp_path):
    """Nesting the other way round: `run_dir=outputs` while outputs/demo is a run; overwrite=true does not help."""
    _finished_run(tmp_path / "outputs" / "demo")
    for extra in ([], ["overwrite=true"]):
        with pytest.raises(LabError, match="do not nest"):
            Stage("01_explore", [f"run_dir={tmp_path / 'outputs'}", SMOKE, *extra])
    assert not (tmp_path / "outputs" / owner.RUN_MARKER).exists()


def test_summary_into_a_folder_the_lab_did_not_mark_is_refused(tmp_path, capsys):
    """A folder that looks like a run (a stage folder with a manifest) but is not one the lab made."""
    (tmp_path / "01_explore").mkdir()
    (tmp_path / "01_explore" / "manifest.json").write_text("{}")
    (tmp_path / "summary.md").write_text("my notes")
    _refused(["summary", str(tmp_path)], capsys, owner.RUN_MARKER, "--force")
    assert (tmp_path / "summary.md").read_text() == "my notes"


def test_sweep_into_a_users_folder_is_refused(tmp_path, monkeypatch):
    from lab.runs import sweep as sweep_mod

    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    monkeypatch.setattr(sweep_mod, "multirun", lambda *a, **k: pytest.fail("the sweep ran its jobs"))
    with pytest.raises(LabError, match="did not make"):
        sweep_mod.sweep([], sweep_dir=str(folder))
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]


# ---- the controls: what the lab may write ------------------------------------------------------------------------

def test_a_command_refills_its_own_folder_and_force_writes_over(tmp_path, capsys):
    out = tmp_path / "kernel"
    for _ in range(2):  # the second build finds the folder it made for `kaggle build`
        assert main(["kaggle", "build", "--notebook", "01_explore", "--username", "me", "--out", str(out)]) == 0
    assert (out / "01_explore.ipynb").is_file()
    mine = tmp_path / "mine.csv"
    mine.write_text("old\n")
    assert _puzzles(mine) == 2
    assert main(["puzzles", "generate", "--category", "bit_manipulation", "--n", "2", "--force", str(mine)]) == 0
    assert mine.read_text() != "old\n"
    capsys.readouterr()


def test_overwrite_true_takes_over_a_folder_and_another_runs_path(tmp_path):
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    st = Stage("01_explore", [f"run_dir={folder}", SMOKE, "overwrite=true"])
    st.finish({})
    assert (folder / owner.RUN_MARKER).is_file() and (folder / "notes.txt").read_text() == "mine"
    other = _finished_run(tmp_path / "other", adapter=True)
    st = Stage("02_sft", [f"run_dir={tmp_path / 'adx'}", f"sft.adapter_dir={other}/02_sft/adapter", SMOKE,
                          "overwrite=true"])
    st.finish({})
