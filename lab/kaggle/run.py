"""`python -m lab kaggle run --chain ...`: a chain of built kernels pushed one after the other, each waited for
(status polling with backoff, one progress line) and its output fetched into the local run folder before the next is
pushed, since a kernel attaches the latest output of the one before it (kaggle_kernel/README.md).

Built on kaggle 2.2.5's own API (`KaggleApi`: kernels_push, kernels_status, kernels_output, for the version this chain
pushed). Resumable: RUN_DIR/kaggle/chain.json records each kernel's pushed version, final status and fetched output,
written atomically after every step; a rerun verifies it (the same kernels, each built the same: a sha256 of its
folder) and continues where it stopped: a pushed kernel is waited for, not pushed again; a failed one is pushed
again; only a push interrupted before Kaggle answered is repeated. The API calls used: docs/internals.md,
lab.kaggle.run.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from lab import LabError
from lab.core.io import atomic_dir, atomic_write_json, read_json

STATE_FILE = "kaggle/chain.json"
COMPLETE = "COMPLETE"
FAILED = ("ERROR", "CANCEL_REQUESTED", "CANCEL_ACKNOWLEDGED")  # kagglesdk KernelWorkerStatus names that end a run
STATUS_RETRIES = 5  # a status call that fails (network, HTTP) this many times in a row stops the wait


def kaggle_api():
    """kaggle's KaggleApi, authenticated as the `kaggle` CLI is (KAGGLE_USERNAME/KAGGLE_KEY, ~/.kaggle/kaggle.json or
    an access token): importing `kaggle` tries that already, and `authenticate` exits when nothing is found."""
    try:
        from kaggle.api.kaggle_api_extended import KaggleApi
    except ImportError:
        raise LabError("the kaggle package is not installed: pip install kaggle==2.2.5 (`make venv` installs it)") \
            from None
    api = KaggleApi()
    try:
        api.authenticate()
    except SystemExit:
        raise LabError("no Kaggle credentials: set KAGGLE_USERNAME and KAGGLE_KEY or put kaggle.json in ~/.kaggle "
                       "(https://www.kaggle.com/docs/api)") from None
    return api


def folder_digest(folder: str | Path) -> str:
    """sha256 over a kernel folder's file names and bytes: what a resumed chain checks it is running again."""
    h = hashlib.sha256()
    for p in sorted(Path(folder).rglob("*")):
        if p.is_file():
            h.update(p.relative_to(folder).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def _kernels(folders: list[Path]) -> list[dict]:
    out = []
    for f in folders:
        meta = json.loads((Path(f) / "kernel-metadata.json").read_text(encoding="utf-8"))
        out.append({"stage": Path(f).name, "id": meta["id"], "digest": folder_digest(f)})
    return out


def load_state(run_dir: Path, kernels: list[dict]) -> dict:
    """The chain's state in `run_dir`, new or verified against `kernels`: the same ids in the same order, and every
    kernel pushed and not failed built the same (a changed one would not be what Kaggle ran). A failed kernel and
    those after it start over."""
    path = run_dir / STATE_FILE
    if not path.exists():
        if run_dir.exists() and any(run_dir.iterdir()):
            raise LabError(f"{run_dir}: exists and holds no {STATE_FILE}: not a Kaggle chain's run folder; choose "
                           "another --run-name or --run-dir")
        return {"kernels": [dict(k) for k in kernels]}
    state = read_json(path)
    old = state.get("kernels") if isinstance(state, dict) else None
    if not isinstance(old, list) or [k.get("id") for k in old] != [k["id"] for k in kernels]:
        raise LabError(f"{path}: records the chain {[k.get('id') for k in old or []]}, not "
                       f"{[k['id'] for k in kernels]}: use another --run-name, or remove {path} to start over")
    for i, (o, k) in enumerate(zip(old, kernels)):
        if o.get("status") in FAILED:
            state["kernels"][i:] = [dict(x) for x in kernels[i:]]
            break
        if o.get("version") is not None and o.get("digest") != k["digest"]:
            raise LabError(f"{path}: {k['stage']} ({k['id']}) was pushed as version {o['version']} but its kernel "
                           f"folder has changed since (a different build or overrides): rebuild it as it was, use "
                           f"another --run-name, or remove {path} to start over")
        o["digest"] = k["digest"]
    return state


def _status(api, kernel: str) -> tuple[str, str]:
    resp = api.kernels_status(kernel)
    s = resp.status
    return str(getattr(s, "name", s)).upper(), resp.failure_message or ""


def _wait(api, kernel: str, label: str, poll_s: float, max_poll_s: float, limit_s: float, sleep, clock,
          out) -> tuple[str, str]:
    """Poll `kernel`'s status until it completes or fails: the interval grows by half each poll from `poll_s` up to
    `max_poll_s`; one progress line (rewritten in place on a terminal). Returns (status, failure message)."""
    start, interval, errors = clock(), poll_s, 0
    cr, end = ("\r", "") if getattr(out, "isatty", lambda: False)() else ("", "\n")
    while True:
        try:
            status, message = _status(api, kernel)
            errors = 0
        except OSError as e:  # requests' errors are OSErrors: the network or Kaggle, worth another try
            errors += 1
            if errors >= STATUS_RETRIES:
                raise LabError(f"{label}: {STATUS_RETRIES} status checks failed in a row ({e}); rerun the same "
                               "command to keep waiting") from None
            status, message = f"status check failed ({e})", ""
        elapsed = clock() - start
        if status == COMPLETE or status in FAILED:
            print(f"{cr}{label}: {status.lower()} after {elapsed / 60:.1f} min", file=out, flush=True)
            return status, message
        if elapsed > limit_s:
            raise LabError(f"{label}: still {status.lower()} after {elapsed / 3600:.1f} h; rerun the same command to "
                           "keep waiting")
        print(f"{cr}{label}: {status.lower()}, {elapsed / 60:.1f} min, next check in {interval:.0f} s", end=end,
              file=out, flush=True)
        sleep(interval)
        interval = min(max_poll_s, interval * 1.5)


def run_chain(folders: list[str | Path], run_dir: str | Path, api=None, *, poll_s: float = 30.0,
              max_poll_s: float = 600.0, limit_h: float = 13.0, sleep=time.sleep, clock=time.monotonic,
              out=sys.stderr) -> dict:
    """Push the kernel `folders` in order, each after the one before has completed and its output has been fetched
    into RUN_DIR/kaggle/<stage>/ (the kernel's /kaggle/working and its log, as Kaggle lists them); the state is
    RUN_DIR/kaggle/chain.json (see the module docstring). `api`: kaggle's KaggleApi (default: authenticated here).
    A failed kernel is a LabError naming it and Kaggle's failure message. Returns the final state."""
    folders = [Path(f) for f in folders]
    run_dir = Path(run_dir)
    state = load_state(run_dir, _kernels(folders))
    path = run_dir / STATE_FILE
    api = api if api is not None else kaggle_api()
    atomic_write_json(path, state)
    for folder, k in zip(folders, state["kernels"]):
        label = f"{k['stage']} ({k['id']}"
        if k.get("fetched"):
            print(f"{label}): done before, output in {run_dir / 'kaggle' / k['stage']}", file=out)
            continue
        if k.get("version") is None:
            meta = json.loads((folder / "kernel-metadata.json").read_text(encoding="utf-8"))
            print(f"{label}): pushing {folder}", file=out, flush=True)
            resp = api.kernels_push(str(folder), None, meta.get("machine_shape"))
            if resp is None or resp.error:
                raise LabError(f"{label}): Kaggle refused the push: {getattr(resp, 'error', None) or 'no answer'}")
            k.update(version=int(resp.version_number), url=resp.url,
                     pushed_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))
            atomic_write_json(path, state)
        label = f"{label} v{k['version']})"
        versioned = f"{k['id']}/{k['version']}"
        if k.get("status") != COMPLETE:
            k["status"], message = _wait(api, versioned, label, poll_s, max_poll_s, limit_h * 3600, sleep, clock, out)
            atomic_write_json(path, state)
            if k["status"] != COMPLETE:
                raise LabError(f"{label}: {k['status'].lower()}{': ' + message if message else ''}; its log: "
                               f"kaggle kernels output {versioned} -p DIR. Fix it and rerun the same command: the "
                               "chain pushes it again and goes on")
        dest = run_dir / "kaggle" / k["stage"]
        with atomic_dir(dest, "kernel output folder") as tmp:
            files, _ = api.kernels_output(versioned, str(tmp), None, True, True)
        k["fetched"] = len(files)
        atomic_write_json(path, state)
        print(f"{label}: {len(files)} output files in {dest}", file=out, flush=True)
    return state
