"""A stand-in for the network half of kaggle 2.2.5's KaggleApi (kaggle/api/kaggle_api_extended.py), for tests: no
network, the rest is kaggle's own code.

Every faked method first binds its arguments to the real method's signature (`inspect.signature(...).bind`), so a
call the real API would refuse fails here too, and answers with kagglesdk's real response types:
- `kernels_push` runs kaggle's own `kernels_push` (every metadata check) with the request recorded instead of sent,
  and refuses a kernel whose `kernel_sources` have not completed (a kernel attaches the latest output of its sources);
- `kernels_status` steps each pushed version through QUEUED, RUNNING ... COMPLETE, one step per call (ERROR for a
  slug in `fail`);
- `kernels_output` writes the kernel's output files and log into `path`, only once that version has completed;
- `dataset_create_new` checks the folder's dataset-metadata.json.
What happened is kept in a JSON file (`state_file`), so several processes (a CLI call per command, a killed and
restarted chain) share one made-up Kaggle. `install(state_file)` puts the stand-in into the KaggleApi class itself,
for subprocesses (tests/standin_site/sitecustomize.py does that when $LAB_KAGGLE_STANDIN is set).
"""

from __future__ import annotations

import inspect
import json
import os
import types
from pathlib import Path

from kaggle.api.kaggle_api_extended import KaggleApi
from kagglesdk.datasets.types.dataset_api_service import ApiCreateDatasetResponse
from kagglesdk.kernels.types.kernels_api_service import ApiGetKernelSessionStatusResponse, ApiSaveKernelResponse
from kagglesdk.kernels.types.kernels_enums import KernelWorkerStatus

FAKED = ("kernels_push", "kernels_status", "kernels_output", "dataset_create_new")
REAL = {name: getattr(KaggleApi, name) for name in FAKED}
RUNNING_POLLS = 3  # status calls that answer RUNNING before COMPLETE ($LAB_KAGGLE_STANDIN_POLLS in subprocesses)


def _bind(name: str, api, *args, **kwargs) -> dict:
    """The call's arguments by name, bound to the real method's signature (a TypeError as the real call would)."""
    bound = inspect.signature(REAL[name]).bind(api, *args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


class StandIn:
    """The faked methods; `state_file` holds the made-up Kaggle. `interrupt(event)` may raise (a simulated kill)."""

    state_file: str
    fail: tuple[str, ...] = ()
    interrupt = None

    def _load(self) -> dict:
        p = Path(self.state_file)
        return json.loads(p.read_text()) if p.is_file() else {"kernels": {}, "events": [], "datasets": []}

    def _save(self, state: dict) -> None:
        tmp = Path(f"{self.state_file}.tmp")
        tmp.write_text(json.dumps(state, indent=1))
        os.replace(tmp, self.state_file)

    def _event(self, state: dict, *event) -> None:
        state["events"].append(list(event))
        self._save(state)
        if self.interrupt is not None:
            self.interrupt(list(event))

    def kernels_push(self, *args, **kwargs):
        a = _bind("kernels_push", self, *args, **kwargs)
        meta = json.loads((Path(a["folder"]) / "kernel-metadata.json").read_text())
        state = self._load()
        for src in meta.get("kernel_sources", []):
            versions = state["kernels"].get(src, [])
            if not versions or versions[-1]["status"] != "COMPLETE":
                raise ValueError(f"stand-in: {meta['id']} pushed while its source {src} has not completed")
        sent = []

        class Client:  # kaggle's build_kaggle_client(): the request is recorded, not sent
            kernels = types.SimpleNamespace(kernels_api_client=types.SimpleNamespace(save_kernel=sent.append))

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

        real_client, self.build_kaggle_client = self.build_kaggle_client, lambda: Client()
        try:
            REAL["kernels_push"](self, **{k: v for k, v in a.items() if k != "self"})
        finally:
            self.build_kaggle_client = real_client
        (request,) = sent
        versions = state["kernels"].setdefault(request.slug, [])
        versions.append({"status": "QUEUED", "polls": 0, "machine_shape": request.machine_shape})
        resp = ApiSaveKernelResponse()
        resp.version_number = len(versions)
        resp.url = f"https://www.kaggle.com/code/{request.slug}"
        self._event(state, "push", request.slug, len(versions))
        return resp

    def _version(self, state: dict, kernel: str) -> tuple[str, int, dict]:
        owner, slug, version = self.parse_kernel_string(kernel)
        versions = state["kernels"].get(f"{owner}/{slug}") or []
        n = int(version) if version else len(versions)
        if not 1 <= n <= len(versions):
            raise ValueError(f"stand-in: no version {n} of {owner}/{slug}")
        return f"{owner}/{slug}", n, versions[n - 1]

    def kernels_status(self, *args, **kwargs):
        a = _bind("kernels_status", self, *args, **kwargs)
        state = self._load()
        ref, n, v = self._version(state, a["kernel"])
        if v["status"] in ("QUEUED", "RUNNING"):
            v["polls"] += 1
            polls = int(os.environ.get("LAB_KAGGLE_STANDIN_POLLS", RUNNING_POLLS))
            v["status"] = ("RUNNING" if v["polls"] <= polls else
                           "ERROR" if ref.split("/")[1] in self.fail else "COMPLETE")
        resp = ApiGetKernelSessionStatusResponse()
        resp.status = KernelWorkerStatus[v["status"]]
        if v["status"] == "ERROR":
            resp.failure_message = "stand-in: the notebook raised"
        self._event(state, "status", ref, n, v["status"])
        return resp

    def kernels_output(self, *args, **kwargs):
        a = _bind("kernels_output", self, *args, **kwargs)
        state = self._load()
        ref, n, v = self._version(state, a["kernel"])
        if v["status"] != "COMPLETE":
            raise ValueError(f"stand-in: {ref} v{n} is {v['status']}, it has no output yet")
        out = Path(a["path"])
        files = [out / "outputs" / "standin.json", out / f"{ref.split('/')[1]}.log"]
        files[0].parent.mkdir(parents=True, exist_ok=True)
        files[0].write_text(json.dumps({"kernel": ref, "version": n}))
        files[1].write_text(f"the log of {ref} v{n}\n")
        self._event(state, "output", ref, n)
        return [str(f) for f in files], None

    def dataset_create_new(self, *args, **kwargs):
        a = _bind("dataset_create_new", self, *args, **kwargs)
        meta = json.loads((Path(a["folder"]) / "dataset-metadata.json").read_text())
        self.validate_dataset_string(meta["id"])
        state = self._load()
        state["datasets"].append(meta["id"])
        resp = ApiCreateDatasetResponse()
        resp.status, resp.url, resp.ref = "ok", f"https://www.kaggle.com/datasets/{meta['id']}", meta["id"]
        self._event(state, "dataset", meta["id"])
        return resp


class StandInApi(StandIn, KaggleApi):
    """kaggle's KaggleApi with the network calls stood in for (module docstring); no credentials needed."""

    def __init__(self, state_file: str | os.PathLike, fail: tuple[str, ...] = (), interrupt=None):
        super().__init__()
        self.state_file, self.fail, self.interrupt = str(state_file), tuple(fail), interrupt

    def authenticate(self) -> None:
        pass


def install(state_file: str | os.PathLike) -> None:
    """Put the stand-in into KaggleApi itself (every instance: the `kaggle` CLI's and the lab's)."""
    KaggleApi.state_file = str(state_file)
    for name in ("_load", "_save", "_event", "_version", *FAKED):
        setattr(KaggleApi, name, getattr(StandIn, name))
    KaggleApi.fail, KaggleApi.interrupt = (), None


def events(state_file: str | os.PathLike) -> list[list]:
    p = Path(state_file)
    return json.loads(p.read_text())["events"] if p.is_file() else []
