"""`python -m lab kaggle run --chain` (lab.kaggle.run) against a stand-in for Kaggle (tests/kaggle_standin.py: kaggle
2.2.5's own KaggleApi with its network calls replaced, every call bound to the real signature): the kernels are
pushed in order, each waited for (with backoff) and fetched before the next; a chain killed anywhere resumes without
pushing again what Kaggle already runs; a failed kernel is named and pushed again on the rerun; a changed kernel
folder is refused. No network, no waiting (the clock and the sleep are made up)."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lab import LabError
from lab.kaggle import kernel as kaggle
from lab.kaggle.run import STATE_FILE, run_chain

STAGES = ["01_explore", "02_sft", "04_vote"]
IDS = [f"alice/nemotron-lab-c1-{s.replace('_', '-')}" for s in STAGES]
TESTS = Path(__file__).resolve().parent


@pytest.fixture
def standin(monkeypatch, tmp_path):
    """`make(**kw)`: a fresh StandInApi on one made-up Kaggle (state in tmp_path/kaggle.json); kaggle is imported with
    a made-up credential and an empty config folder, so nothing of the machine's own is read."""
    monkeypatch.setenv("KAGGLE_CONFIG_DIR", str(tmp_path / "kaggle_config"))
    monkeypatch.setenv("KAGGLE_USERNAME", "alice")
    monkeypatch.setenv("KAGGLE_KEY", "stand-in")
    (tmp_path / "kaggle_config").mkdir()
    pytest.importorskip("kaggle.api.kaggle_api_extended", reason="kaggle==2.2.5 is not installed")
    monkeypatch.syspath_prepend(str(TESTS))
    import kaggle_standin

    state = tmp_path / "kaggle.json"
    return lambda **kw: kaggle_standin.StandInApi(state, **kw), kaggle_standin, state


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    out = tmp_path_factory.mktemp("chain")
    return kaggle.build_chain(STAGES, ["data.n_train=8"], username="alice", run_name="c1", out=out,
                              model_source="", competition="")


class Clock:
    """A made-up clock: `sleep` records the wait and moves the time on."""

    def __init__(self):
        self.t, self.sleeps = 0.0, []

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.sleeps.append(s)
        self.t += s


def run(folders, run_dir, api, clock=None, **kw):
    clock = clock or Clock()
    out = io.StringIO()
    state = run_chain(folders, run_dir, api, poll_s=10, max_poll_s=20, sleep=clock.sleep, clock=clock, out=out, **kw)
    return state, out.getvalue()


def test_pushes_in_order_waits_and_fetches(chain, standin, tmp_path):
    make, mod, state_file = standin
    clock = Clock()
    state, log = run(chain, tmp_path / "run", make(), clock)
    expected = []
    for k in IDS:
        expected += [["push", k, 1], *[["status", k, 1, "RUNNING"]] * mod.RUNNING_POLLS, ["status", k, 1, "COMPLETE"],
                     ["output", k, 1]]
    assert mod.events(state_file) == expected
    assert mod.RUNNING_POLLS == 3 and clock.sleeps == [10, 15, 20] * len(IDS)  # backoff by half, capped at 20 s
    for stage, k in zip(STAGES, IDS):
        got = tmp_path / "run" / "kaggle" / stage
        assert json.loads((got / "outputs" / "standin.json").read_text()) == {"kernel": k, "version": 1}
        assert (got / f"{k.split('/')[1]}.log").is_file()
    saved = json.loads((tmp_path / "run" / STATE_FILE).read_text())
    assert saved == state and [(k["id"], k["version"], k["status"], k["fetched"]) for k in saved["kernels"]] == \
        [(k, 1, "COMPLETE", 2) for k in IDS]
    assert "02_sft (alice/nemotron-lab-c1-02-sft v1): running, 0.2 min, next check in 15 s" in log
    assert "04_vote (alice/nemotron-lab-c1-04-vote v1): complete after 0.8 min" in log
    machine = json.loads(state_file.read_text())["kernels"][IDS[1]][0]["machine_shape"]
    assert machine == "NvidiaRtxPro6000"  # the accelerator went with the push
    # done: a rerun changes nothing and asks Kaggle nothing
    run(chain, tmp_path / "run", make())
    assert len(mod.events(state_file)) == len(expected)


def test_standin_refuses_what_kaggle_would(chain, standin):
    """Negative controls: the stand-in can fail the way the tests above rely on."""
    make, _, _ = standin
    api = make()
    with pytest.raises(ValueError, match="has not completed"):
        api.kernels_push(str(chain[1]))  # 02_sft before 01_explore ran
    with pytest.raises(TypeError):
        api.kernels_status(IDS[0], "extra")  # not kaggle's signature
    with pytest.raises(TypeError):
        api.kernels_output(IDS[0], path="x", wait=True)


class Killed(BaseException):
    """A simulated kill: nothing in the lab catches it."""


@pytest.mark.parametrize("kill_at,pushes", [
    (["status", IDS[1], 1, "RUNNING"], 3),   # waiting for 02_sft: it is waited for again, not pushed again
    (["output", IDS[0], 1], 3),              # while 01_explore's output downloads: fetched again
    (["status", IDS[2], 1, "COMPLETE"], 3),  # 04_vote completed, not yet fetched
    (["push", IDS[1], 1], 4),                # after Kaggle took the push, before the lab wrote it down: pushed again
])
def test_resumes_after_a_kill(chain, standin, tmp_path, kill_at, pushes):
    make, mod, state_file = standin

    def interrupt(event):
        if event == kill_at:
            raise Killed

    with pytest.raises(Killed):
        run(chain, tmp_path / "run", make(interrupt=interrupt))
    assert not list((tmp_path / "run" / "kaggle").glob(".*"))  # no half-fetched folder left behind
    state, log = run(chain, tmp_path / "run", make())
    events = mod.events(state_file)
    assert [e[1] for e in events if e[0] == "push"] == (IDS if pushes == 3 else [IDS[0], IDS[1], IDS[1], IDS[2]])
    assert [k["status"] for k in state["kernels"]] == ["COMPLETE"] * 3
    assert all((tmp_path / "run" / "kaggle" / s / "outputs" / "standin.json").is_file() for s in STAGES)
    if kill_at[0] != "output":
        assert "01_explore (alice/nemotron-lab-c1-01-explore): done before" in log


def test_failed_kernel_is_named_and_pushed_again(chain, standin, tmp_path):
    make, mod, state_file = standin
    with pytest.raises(LabError, match=r"02_sft .*v1\): error: stand-in: the notebook raised"):
        run(chain, tmp_path / "run", make(fail=("nemotron-lab-c1-02-sft",)))
    state = json.loads((tmp_path / "run" / STATE_FILE).read_text())
    assert [k.get("status") for k in state["kernels"]] == ["COMPLETE", "ERROR", None]
    run(chain, tmp_path / "run", make())
    assert [e[1:3] for e in mod.events(state_file) if e[0] == "push"] == \
        [[IDS[0], 1], [IDS[1], 1], [IDS[1], 2], [IDS[2], 1]]


def test_changed_kernel_or_foreign_folder_is_refused(chain, standin, tmp_path):
    make, _, _ = standin
    run(chain, tmp_path / "run", make())
    nb = chain[0] / "01_explore.ipynb"
    text = nb.read_text()
    try:
        nb.write_text(text.replace("data.n_train=8", "data.n_train=9"))
        with pytest.raises(LabError, match="01_explore .* has changed"):
            run(chain, tmp_path / "run", make())
    finally:
        nb.write_text(text)
    with pytest.raises(LabError, match="records the chain"):
        run(chain[:2], tmp_path / "run", make())
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    with pytest.raises(LabError, match="not a Kaggle chain's run folder"):
        run(chain, tmp_path / "mine", make())


def test_rebuilding_a_chain_gives_the_same_kernels(chain, tmp_path):
    """`kaggle run` rebuilds the chain on a rerun and checks it against what it pushed: the build is deterministic."""
    from lab.kaggle.run import folder_digest

    again = kaggle.build_chain(STAGES, ["data.n_train=8"], username="alice", run_name="c1", out=tmp_path / "again",
                               model_source="", competition="")
    assert [folder_digest(f) for f in again] == [folder_digest(f) for f in chain]


@pytest.mark.slow  # two `python -m lab kaggle run` processes, each building the chain: about a minute
def test_cli_resumes_after_sigkill(tmp_path):
    """The command itself, killed with SIGKILL while it waits for 02_sft, then run again: nothing pushed twice."""
    pytest.importorskip("kaggle.api.kaggle_api_extended", reason="kaggle==2.2.5 is not installed")
    state = tmp_path / "kaggle.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS / "standin_site"), str(TESTS.parent)]),
           "KAGGLE_USERNAME": "alice", "KAGGLE_KEY": "stand-in", "KAGGLE_CONFIG_DIR": str(tmp_path),
           "LAB_KAGGLE_STANDIN": str(state)}
    cmd = [sys.executable, "-m", "lab", "kaggle", "run", "--chain", ",".join(STAGES), "--run-name", "c1",
           "--out", str(tmp_path / "build"), "--run-dir", str(tmp_path / "run"), "--poll-s", "0.2",
           "--model-source", "", "--competition", "", "data.n_train=8"]
    def events():
        return json.loads(state.read_text())["events"] if state.is_file() else []

    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while ["status", IDS[1], 1, "RUNNING"] not in events():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read().decode()
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert [e[1] for e in events() if e[0] == "push"] == IDS
    assert "done before" in done.stderr and f"done: each kernel's output is in {tmp_path / 'run' / 'kaggle'}" in \
        done.stdout



def test_chain_without_run_name_is_named_by_date(tmp_path):
    """Not `chain` (folder chain-chain, kernels nemotron-lab-chain-01-explore): the date and time, as a local run."""
    import re

    (folder,) = kaggle.build_chain(["01_explore"], [], username="alice", out=tmp_path / "c", model_source="",
                                   competition="")
    kid = json.loads((folder / "kernel-metadata.json").read_text())["id"]
    stamp = re.fullmatch(r"alice/nemotron-lab-(\d{4}-\d\d-\d\d-\d\d-\d\d-\d\d)-01-explore", kid)
    assert stamp, kid
    nb = (folder / "01_explore.ipynb").read_text()
    assert re.search(r"run_dir=/kaggle/working/outputs/\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d", nb)


def test_build_takes_overrides_as_words(tmp_path):
    """`kaggle build` takes overrides as key=value words at the end, as every command does, and several
    --kernel-sources as one comma-separated value (so no `--` is needed before the overrides)."""
    from lab.__main__ import main

    assert main(["kaggle", "build", "--notebook", "02_sft", "--username", "alice", "--out", str(tmp_path / "k"),
                 "--kernel-sources", "alice/nemotron-lab-01-explore,alice/other-kernel", "--model-source", "",
                 "data.n_train=8", "seed=3"]) == 0
    meta = json.loads((tmp_path / "k" / "kernel-metadata.json").read_text())
    assert meta["kernel_sources"] == ["alice/nemotron-lab-01-explore", "alice/other-kernel"]
    nb = (tmp_path / "k" / "02_sft.ipynb").read_text()
    assert '\\"data.n_train=8\\", \\"seed=3\\"' in nb
    with pytest.raises(SystemExit):  # the one syntax: --overrides is gone
        main(["kaggle", "build", "--notebook", "02_sft", "--username", "alice", "--overrides", "seed=3"])


def test_no_credentials_is_one_sentence(chain, standin, tmp_path, monkeypatch):
    """Without credentials kaggle's authenticate exits; `kaggle run` says what to set instead, before any push."""
    from kaggle.api.kaggle_api_extended import KaggleApi

    monkeypatch.setattr(KaggleApi, "authenticate", lambda self: exit(1))
    with pytest.raises(LabError, match="no Kaggle credentials: set KAGGLE_USERNAME and KAGGLE_KEY"):
        run_chain(chain, tmp_path / "run", poll_s=0, out=io.StringIO())
