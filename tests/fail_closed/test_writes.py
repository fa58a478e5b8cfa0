"""Fail closed, the write-ownership class: the lab writes only into a run folder it made, or to a path the user named
that is new (or the lab's own from the same command); never over a tracked file, into another run's folder or into a
folder of the user's, unless `--force` / `overwrite=true`, which each refusal names (lab.core.owner).

Each test is one case of the hostile probe: the command, then the files it must have left byte for byte. A test that
points a command at a tracked file puts the file back if the command changed it, so a failing run leaves the
checkout as it was."""

import os
import shlex
from pathlib import Path

import pytest

from lab import LabError
from lab.__main__ import main
from lab.core.io import atomic_dir
from lab.core.paths import project_root
from lab.core.run import Stage

SMOKE = "experiment=smoke"


@pytest.fixture
def keep(request):
    """`keep(path)`: snapshot a file or a folder's files now; after the test, restore them and remove new files."""
    saved: dict[Path, dict[Path, bytes]] = {}

    def snap(path: Path) -> dict[Path, bytes]:
        path = Path(path)
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else []
        saved[path] = {f: f.read_bytes() for f in files}
        return saved[path]

    yield snap
    for path, files in saved.items():
        for f, data in files.items():
            if not f.is_file() or f.read_bytes() != data:
                f.write_bytes(data)
        if path.is_dir():
            for f in path.rglob("*"):
                if f.is_file() and f not in files:
                    f.unlink()


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _finished_run(run_dir: Path, adapter: bool = False) -> Path:
    """A run folder with a finished 02_sft (and its adapter, written as 02_sft writes it: `atomic_dir`)."""
    st = Stage("02_sft", [f"run_dir={run_dir}", SMOKE])
    if adapter:
        with atomic_dir(st.path("adapter")) as tmp:
            (tmp / "adapter_model.safetensors").write_bytes(b"weights")
            (tmp / "adapter_config.json").write_text("{}")
    st.finish({"accuracy_after": 0.5})
    return run_dir


def _refused(argv: list[str], capsys, *words: str) -> str:
    """Run `python -m lab ARGV`; it must exit 2 with one `error:` line naming each of `words`."""
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("error: ") and all(w in err for w in words), err
    return err


# ---- the probe's cases ------------------------------------------------------------------------------------------

def test_case1_demo_into_a_users_project_folder_is_refused(tmp_path, capsys):
    """`demo --stages 01_explore run_dir=PROJECT experiment=smoke`, PROJECT holding the user's data/train.csv and
    notebooks/01_explore.ipynb: refused before any notebook runs, both files as they were."""
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    (project / "notebooks").mkdir()
    (project / "data" / "train.csv").write_text("id,prompt,answer\n" + "".join(f"{i},p,a\n" for i in range(500)))
    (project / "notebooks" / "01_explore.ipynb").write_text('{"the user": "notebook"}')
    before = _files(project)
    _refused(["demo", "--stages", "01_explore", f"run_dir={project}", SMOKE], capsys,
             str(project), "did not make", "overwrite=true")
    assert _files(project) == before


def test_case2_adapter_dir_into_another_runs_adapter_is_refused(tmp_path):
    """`... sft.adapter_dir=<another run>/02_sft/adapter`: 02_sft refuses at open, the other run's adapter and its
    lock untouched (before, the `.lab-made` marker let any lab-made folder anywhere be replaced)."""
    other = _finished_run(tmp_path / "vt", adapter=True)
    before = _files(other)
    with pytest.raises(LabError, match="another run's folder") as e:
        Stage("02_sft", [f"run_dir={tmp_path / 'adx'}", f"sft.adapter_dir={other}/02_sft/adapter", SMOKE])
    assert "overwrite=true" in str(e.value)
    assert _files(other) == before


def test_case4_kaggle_build_out_notebooks_is_refused(keep, capsys):
    """`kaggle build --notebook 02_sft --username me --out notebooks`: the tracked notebook is not replaced and no
    kernel-metadata.json is dropped beside it."""
    folder = project_root() / "notebooks"
    before = dict(keep(folder))
    _refused(["kaggle", "build", "--notebook", "02_sft", "--username", "me", "--out", "notebooks"], capsys,
             "git tracks", "--force")
    assert {f: f.read_bytes() for f in folder.rglob("*") if f.is_file()} == before


def test_case5_kaggle_dataset_out_kaggle_kernel_is_refused(keep, capsys):
    """`kaggle dataset --out kaggle_kernel`: the tracked dataset-metadata.json is not replaced."""
    folder = project_root() / "kaggle_kernel"
    before = {f: d for f, d in keep(folder).items() if "build" not in f.relative_to(folder).parts}
    _refused(["kaggle", "dataset", "--username", "me", "--no-wheel", "--out", "kaggle_kernel"], capsys,
             "git tracks", "--force")
    after = {f: f.read_bytes() for f in folder.rglob("*") if f.is_file() and "build" not in f.relative_to(folder).parts}
    assert after == before


def test_case6_estimate_json_over_the_config_is_refused(keep, capsys):
    """`estimate --json conf/config.yaml`: the config it just read is not replaced."""
    config = project_root() / "conf" / "config.yaml"
    before = keep(config)[config]
    _refused(["estimate", "--assume-rows", "--json", str(config)], capsys, "git tracks", "--force")
    assert config.read_bytes() == before


@pytest.mark.parametrize("target", ["users_train_csv", "README.md"])
def test_case7_puzzles_generate_over_an_existing_file_is_refused(tmp_path, keep, capsys, target):
    """`puzzles generate --category bit_manipulation --n 2 OUT` with OUT the user's data/train.csv, or README.md."""
    if target == "README.md":
        out = project_root() / "README.md"
    else:
        out = tmp_path / "data" / "train.csv"
        out.parent.mkdir()
        out.write_text("id,prompt,answer\n1,the user's,row\n")
    before = keep(out)[out]
    _refused(["puzzles", "generate", "--category", "bit_manipulation", "--n", "2", str(out)], capsys,
             str(out), "--force")
    assert out.read_bytes() == before


def test_case8_a_run_nested_in_another_runs_stage_folder_is_refused(tmp_path):
    """`run_name=nest/02_sft` where outputs/nest is a run: refused (run folders do not nest), even with
    overwrite=true; the outer run's 02_sft is as it was."""
    outer = _finished_run(tmp_path / "nest", adapter=True)
    before = _files(outer)
    for extra in ([], ["overwrite=true"]):
        with pytest.raises(LabError, match="do not nest"):
            Stage("01_explore", [f"run_dir={outer / '02_sft'}", SMOKE, *extra])
    assert _files(outer) == before


# ---- the low items of this class ------------------------------------------------------------------------------------

def test_printed_push_commands_are_shell_quoted(tmp_path):
    """A `--out` holding `;touch X` stays one word of the printed `kaggle kernels push` (pasting it runs nothing)."""
    from lab.kaggle.kernel import push_commands

    folder = tmp_path / "k;touch X"
    folder.mkdir()
    (folder / "kernel-metadata.json").write_text('{"machine_shape": "NvidiaRtxPro6000"}')
    [cmd] = push_commands([folder])
    assert shlex.split(cmd) == ["kaggle", "kernels", "push", "-p", str(folder), "--accelerator", "NvidiaRtxPro6000"]


def test_safetensors_get_the_mode_of_their_siblings(tmp_path):
    """safetensors 0.8 writes its file 0600; in a folder the lab writes (`atomic_dir`) it reads like its siblings."""
    import torch
    from safetensors.torch import save_file

    with atomic_dir(tmp_path / "adapter") as tmp:
        save_file({"w": torch.zeros(2)}, str(tmp / "adapter_model.safetensors"))
        (tmp / "adapter_config.json").write_text("{}")
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "adapter").iterdir()}
    assert modes["adapter_model.safetensors"] == modes["adapter_config.json"], modes


def test_a_300_character_run_name_is_a_sentence(tmp_path):
    with pytest.raises(LabError, match="bytes long"):
        Stage("01_explore", [f"run_dir={tmp_path / ('x' * 300)}", SMOKE])


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_run_folder_is_a_sentence(tmp_path):
    run = _finished_run(tmp_path / "ro")
    run.chmod(0o555)
    try:
        with pytest.raises(LabError, match="read-only"):
            Stage("01_explore", [f"run_dir={run}", SMOKE])
    finally:
        run.chmod(0o755)


def test_a_lock_that_cannot_be_written_is_a_sentence(tmp_path, monkeypatch):
    """The same refusal where the permissions do not stop this user (root): the OS's error at the lock, as one
    sentence naming the file."""
    import filelock

    def denied(self, *a, **k):
        raise PermissionError(13, "Permission denied", self.lock_file)

    monkeypatch.setattr(filelock.FileLock, "acquire", denied)
    with pytest.raises(LabError, match=r"\.lock: not writable \(Permission denied\)"):
        Stage("01_explore", [f"run_dir={tmp_path / 'run'}", SMOKE])
