"""The lab's process-wide state, each in one visible place: the environment variables it sets (lab.core.env) and the
stage open in this process, to which `lineage.consumed` records an input (lab.core.lineage)."""

import os
import subprocess
import types

from lab.core import env, lineage


def test_setenv_and_scoped(monkeypatch):
    monkeypatch.delenv("LAB_TEST_A", raising=False)
    monkeypatch.setenv("LAB_TEST_B", "user")
    env.setenv({"LAB_TEST_A": "1", "LAB_TEST_B": "lab"}, keep=True)
    assert os.environ["LAB_TEST_A"] == "1" and os.environ["LAB_TEST_B"] == "user"  # keep: the user's value wins
    env.setenv({"LAB_TEST_B": "lab"})
    assert os.environ["LAB_TEST_B"] == "lab"
    monkeypatch.delenv("LAB_TEST_A")
    with env.scoped({"LAB_TEST_A": "x", "LAB_TEST_B": "y"}):
        assert (os.environ["LAB_TEST_A"], os.environ["LAB_TEST_B"]) == ("x", "y")
    assert "LAB_TEST_A" not in os.environ and os.environ["LAB_TEST_B"] == "lab"  # as before the block


def test_no_module_of_lab_writes_os_environ_itself_but_env_and_the_recipes():
    """`git grep` over lab/: every mutation goes through lab.core.env; lab/recipes/common.py's are its own step."""
    pattern = r"os\.environ\[[^]]*\] *=|environ\.setdefault|environ\.pop|environ\.update|putenv"
    out = subprocess.run(["git", "grep", "-nE", pattern, "--", "lab/"], capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    found = [line for line in out.stdout.splitlines() if not line.startswith(("lab/core/env.py:", "lab/recipes/"))]
    assert out.returncode in (0, 1) and found == []


def test_consumed_records_into_the_open_stage_only(tmp_path, monkeypatch):
    monkeypatch.setattr(lineage, "_open_stage", None)  # an earlier test's Stage may still be open in this process
    run = tmp_path / "run"
    own = run / "04_vote"
    own.mkdir(parents=True)
    (own / "manifest.json").write_text("{}")
    src = tmp_path / "val.csv"
    src.write_text("id\n1\n")
    stage = types.SimpleNamespace(dir=own, final=own, run_dir=run, manifest={})
    assert lineage.open_stage() is None
    lineage.consumed(src)  # no stage open: nothing recorded anywhere
    lineage.opened(stage)
    try:
        assert lineage.open_stage() is stage
        lineage.consumed(src)
        lineage.consumed(own / "manifest.json")  # its own folder: not an input
    finally:
        lineage.closed(stage)
    assert lineage.open_stage() is None
    assert stage.manifest == {"inputs": {str(src.resolve()): lineage.content_hash(src)}}
    assert '"inputs"' in (own / "manifest.json").read_text()  # the running manifest says what was read so far
    other = types.SimpleNamespace(dir=own, final=own, run_dir=run, manifest={})
    lineage.record_input(other, src)  # explicit: no open stage needed
    assert other.manifest == stage.manifest
