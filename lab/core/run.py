"""A run and its stages: `Stage` (what a notebook or script opens first), the stage folders earlier stages'
outputs are read from, the manifest (git commit, packages, hardware), the run folder's lock, seeding and
`report_to`.

`Stage` takes the run folder's lock (one writer per run folder), makes the stage folder, seeds everything, writes
the resolved config, and on `finish(metrics)` writes `metrics.json` and the manifest atomically.

Deliberately simple: no database; a run is a folder of files.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import importlib.util
import json
import os
import platform
import shutil
import socket
import subprocess
import time
import uuid
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable

from omegaconf import DictConfig, OmegaConf

from lab import LabError
from lab.core import env, lineage, owner
from lab.core.config import compose, library_problems, names_run, parse_overrides, validate
from lab.core.console import quiet_known_warnings
from lab.core.io import atomic_write_json, atomic_write_text, is_main_process, read_json
from lab.core.paths import checkpoint_root, project_root, resolve_path

PACKAGES = ("lab", "torch", "transformers", "trl", "peft", "datasets", "accelerate", "hydra-core",
            "papermill", "pandas", "numpy", "vllm", "unsloth")


def tracker(cfg: DictConfig) -> str:
    """`cfg.report_to` (one of lab/core/schema.py's `Tracker`, refused at compose otherwise) with its package installed
    (else a LabError naming the key)."""
    name = str(cfg.get("report_to", "none") or "none")
    if name != "none" and importlib.util.find_spec(name) is None:
        raise LabError(f"{project_root() / 'conf' / 'config.yaml'}: report_to={name} but {name} is not installed "
                       f"(pip install {name})")
    return name


def tracking_args(cfg: DictConfig, stage: str) -> dict[str, Any]:
    """`report_to` (and where its logs go) for a stage's TrainingArguments, from `cfg.report_to` (`tracker`).

    The trackers are transformers' own integrations (transformers/integrations/integration_utils.py),
    imported by the Trainer only when chosen. TensorBoard writes under `<run_dir>/tensorboard/<stage>`
    (`tensorboard --logdir <run_dir>/tensorboard` shows every stage of the run); W&B and MLflow runs are
    named `<run_name>/<stage>`. Everything the Trainer logs goes there, TRL's per-step GRPO metrics too:
    the mean of every reward function (`rewards/<name>/mean`), the zero-variance share
    (`frac_reward_zero_std`), the truncation share (`completions/clipped_ratio`), `grad_norm`.
    """
    name = tracker(cfg)
    if name == "none":
        return {"report_to": "none"}
    if name == "tensorboard":
        # transformers' TensorBoardCallback reads its folder from this variable (TrainingArguments has no
        # logging_dir in transformers 5)
        env.setenv({"TENSORBOARD_LOGGING_DIR": str(resolve_path(cfg.run_dir) / "tensorboard" / stage)})
    return {"report_to": name, "run_name": f"{cfg.run_name}/{stage}"}


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and CUDA): `transformers.set_seed` (transformers/trainer_utils.py).

    On CPU it also switches on torch's deterministic algorithms (`torch.use_deterministic_algorithms`):
    the tiny model's SFT gives the same losses and gradient norms with it as without, and GRPO and
    generation run under it (checked by hand; the tests run under it), so it only guards against an op
    without a deterministic kernel. On CUDA it stays off: the Mamba-2 PyTorch path
    (transformers/models/nemotron_h/modeling_nemotron_h.py) takes torch.cumsum of floats, which torch's
    deterministic mode refuses on CUDA (its docstring), so GPU reruns can differ in the last bits.
    A CPU rerun is identical only with the same torch thread count (the order of float sums follows it).
    """
    import torch
    from transformers import set_seed

    set_seed(int(seed), deterministic=not torch.cuda.is_available())
    env.setenv({"PYTHONHASHSEED": str(seed)}, keep=True)


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=project_root(), capture_output=True,
                             text=True, timeout=10)
        if out.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=project_root(),
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def package_versions() -> dict[str, str | None]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version("nemotron-reasoning-lab" if name == "lab" else name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def hardware() -> dict[str, Any]:
    import torch

    hw = {"platform": platform.platform(), "python": platform.python_version(),
          "cpu_count": os.cpu_count(), "cuda": torch.cuda.is_available(),
          # the order of float sums follows the thread count: the tiny demo's outcome can change with it
          "torch_threads": torch.get_num_threads()}
    if torch.cuda.is_available():
        hw["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return hw


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


# ---- one writer per run folder ------------------------------------------------------------------

LOCK_FILE = owner.LOCK_FILE
LOCK_ENV = "LAB_RUN_LOCK"  # a driver's lock token, inherited by the notebook kernels it starts
_HELD: dict[Path, tuple] = {}  # lock file -> (its FileLock, token) while this process holds it (a FileLock that is
#                                  garbage-collected lets go of its lock)


def _lock(run_dir: str | os.PathLike):
    """The run folder's OS lock (`filelock.FileLock`: an flock on `<run_dir>/.lock`, released by the OS when its
    process dies, so a killed run never leaves a stale lock). One instance per file in a process (`is_singleton`),
    so a process that opens several stages of one run nests its holds."""
    from filelock import FileLock

    lock = Path(run_dir).resolve() / LOCK_FILE
    lock.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(lock, is_singleton=True, thread_local=False)


def acquire_lock(run_dir: str | os.PathLike) -> bool:
    """Take the run folder's lock, so a second run into the same folder refuses: True when this call took it (the
    caller releases it), False when it is held by this process's driver (the token in $LAB_RUN_LOCK: `python -m lab
    demo` and sweep jobs hold the lock while papermill runs each stage's notebook in a kernel of its own). A holder
    elsewhere is a LabError naming its process, host and start, which the holder writes into the lock file."""
    from filelock import Timeout

    try:
        fl = _lock(run_dir)
        lock = Path(fl.lock_file)
        fl.acquire(blocking=False)
    except Timeout:
        try:
            # what the holder wrote (nothing yet when it has only just taken the lock)
            holder = read_json(lock, kind=dict)
        except (LabError, OSError):
            holder = {}
        if holder.get("token") and holder.get("token") == os.environ.get(LOCK_ENV):
            return False
        raise LabError(f"{lock}: run folder in use by process {holder.get('pid')} on {holder.get('host')} since "
                       f"{holder.get('since')}; one run writes into one folder at a time: wait for it or use another "
                       "run_name") from None
    except OSError as e:  # a read-only folder, a name too long (Timeout is one too: caught first)
        raise owner.os_error(e, Path(run_dir) / LOCK_FILE) from None
    if fl.lock_counter == 1:  # first hold in this process: say who holds it
        _HELD[lock] = (fl, uuid.uuid4().hex)
        try:
            lock.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "token": _HELD[lock][1],
                                        "since": _now()}), encoding="utf-8")
        except OSError as e:
            release_lock(run_dir)
            raise owner.os_error(e, lock) from None
    return True


def release_lock(run_dir: str | os.PathLike) -> None:
    """Let go of one hold of the run folder's lock taken by `acquire_lock` in this process."""
    fl = _lock(run_dir)
    if fl.is_locked:
        fl.release()
        if not fl.is_locked:
            _HELD.pop(Path(fl.lock_file), None)


@contextlib.contextmanager
def run_lock(run_dir: str | os.PathLike):
    """Hold the run folder's lock for a driver; the notebooks it runs inherit it through $LAB_RUN_LOCK."""
    took = acquire_lock(run_dir)
    try:
        with env.scoped({LOCK_ENV: _HELD[Path(_lock(run_dir).lock_file)][1]} if took else {}):
            yield
    finally:
        if took:
            release_lock(run_dir)


# Files a stage writes in its folder that are keyed by what made them (a changed input starts them afresh), so a
# rerun after a failure may carry them over: 04_vote's samples (lab.eval.sampling.sample_table's cache).
KEYED_CACHES = ("samples.jsonl",)


class Stage:
    """One notebook's output folder: `<run_dir>/<name>/` with config.yaml, manifest.json, metrics.json.

    Opening a stage seeds everything and records the resolved config; `finish` writes the metrics and the
    completed manifest. A stage works in a fresh folder, `<run_dir>/.<name>.partial/` (`dir`), and `finish`
    swaps it in for `<run_dir>/<name>/` (`final`) only once it is complete, so a stage that dies at any point
    leaves the previous finished result byte for byte as it was (and a first run leaves no stage folder at all).
    While the stage runs, every path of its config that points into `final` (`sft.adapter_dir` in 02_sft, say)
    points into `dir` instead; `finish` points them back; config.yaml always records the final paths.
    Training checkpoints live outside the folder, in `checkpoint_dir` (`<run_dir>/checkpoints/<name>`), so a
    rerun still finds them. The manifest records the content hashes of what the stage read from earlier stages
    and of what it wrote (`lab.core.lineage`).
    """

    def __init__(self, name: str, overrides: str | Iterable[str] = (), cfg: DictConfig | None = None):
        """`name`: the stage's name ("02_sft"); `overrides`: what the config was composed from (recorded in the
        manifest); `cfg`: the config already composed from them (`lab.recipes.common.open_stage` composes once),
        else composed here."""
        self.name = name
        self.overrides = parse_overrides(overrides)
        several = int(os.environ.get("WORLD_SIZE", "1")) > 1
        if several and (cfg is None or self.overrides) and not names_run(self.overrides):
            raise LabError(f"{name}: several processes (WORLD_SIZE={os.environ['WORLD_SIZE']}) would each make their "
                           "own time-stamped run folder; pass run_name=... so they share one")
        self.cfg = cfg if cfg is not None else compose(self.overrides)
        if cfg is not None:
            validate(cfg, where=f"stage {name}")
        tracker(self.cfg)  # a typo in report_to fails here, not after the stage's first hour
        if problems := library_problems(self.cfg):
            raise LabError(f"stage {name}: " + "; ".join(problems) + " (nothing was run or changed)")
        quiet_known_warnings()  # expected library messages become one note each (lab.core.console)
        self.run_dir = resolve_path(self.cfg.run_dir)
        self.final = self.run_dir / name
        self.dir = self.run_dir / f".{name}.partial"
        # <run_dir>/checkpoints, on Kaggle a scratch folder outside /kaggle/working (lab.core.paths.checkpoint_root)
        self.checkpoint_dir = checkpoint_root(self.run_dir, OmegaConf.select(self.cfg, "kaggle.scratch_dir")) / name
        # before anything in the folder is touched; under `accelerate launch` (torchrun sets RANK) the main
        # process's lock covers the other ranks, which open the same stage after it (scripts/_launch.py)
        main = is_main_process()
        if main:  # a run folder the lab made (or a new one), never one inside another run, and the config's paths
            # the stage writes outside its folder: all checked before anything is written (lab.core.owner)
            claim = dict(run_name=self.cfg.run_name, overwrite=bool(self.cfg.get("overwrite", False)))
            owner.claim_run(self.run_dir, **claim, write=False)
            owner.check_stage_outputs(self.cfg, name)
            owner.claim_run(self.run_dir, **claim)
        self._own_lock = acquire_lock(self.run_dir) if main else False
        if main:
            self._recover_swap()
            if self.dir.exists():  # what a stage that died left: never resumed (checkpoints live elsewhere) ...
                self._fresh_keeping_caches()  # ... but for its keyed caches (KEYED_CACHES)
        self.dir.mkdir(parents=True, exist_ok=True)
        seed_everything(self.cfg.seed)
        self._t0 = time.time()
        self.manifest = {
            "stage": name, "status": "running", "seed": self.cfg.seed, "overrides": self.overrides,
            "git_commit": git_commit(), "packages": package_versions(), "hardware": hardware(),
            "start_time": _now(), "end_time": None, "wall_seconds": None, "inputs": {},
        }
        atomic_write_text(self.dir / "config.yaml", OmegaConf.to_yaml(self.cfg))
        atomic_write_json(self.dir / "manifest.json", self.manifest)
        self._moved = self._point_into(self.final, self.dir)
        lineage.opened(self)

    def _fresh_keeping_caches(self) -> None:
        """Replace the folder a stage that died left (`dir`) by an empty one holding only its `KEYED_CACHES`: the
        expensive work it finished (04_vote's samples) is not drawn again by the rerun, which reuses a cache only
        under the same key (`lab.eval.sampling.sample_table`: another key starts afresh)."""
        kept = [self.dir / n for n in KEYED_CACHES if (self.dir / n).is_file()]
        if kept and (why := self._inputs_changed()):
            print(f"note: {self.dir}: not keeping {', '.join(f.name for f in kept)} from the attempt that did not "
                  f"finish: {why}", flush=True)
            kept = []
        if not kept:
            shutil.rmtree(self.dir)
            return
        fresh = self.run_dir / f".{self.name}.partial.new"
        shutil.rmtree(fresh, ignore_errors=True)
        fresh.mkdir(parents=True)
        for f in kept:
            os.replace(f, fresh / f.name)
        shutil.rmtree(self.dir)
        os.replace(fresh, self.dir)
        print(f"note: {self.dir}: kept {', '.join(f.name for f in kept)} from the attempt that did not finish "
              "(reused where its key matches)", flush=True)

    def _inputs_changed(self) -> str | None:
        """Why the dead attempt in `dir` read other inputs than the run now holds (its manifest records each input's
        content hash as it is read: `lab.core.lineage.consumed`), or None when every one is unchanged."""
        try:
            inputs = read_json(self.dir / "manifest.json", kind=dict).get("inputs") or {}
        except (LabError, AttributeError):
            return "its manifest is unreadable"
        if not inputs:
            return "it recorded no input"
        for k, h in sorted(inputs.items()):
            p = Path(k) if Path(k).is_absolute() else self.run_dir / k
            if not p.exists() or lineage.content_hash(p) != h:
                return f"its input {k} changed since"
        return None

    def _point_into(self, old: Path, new: Path) -> dict[str, str]:
        """Point every string of `cfg` that is a path inside `old` into `new` instead; {key: previous value}."""
        moved = {}

        def walk(node, prefix):
            for k, v in node.items() if isinstance(node, dict) else ():
                if isinstance(v, dict):
                    walk(v, f"{prefix}{k}.")
                elif isinstance(v, str) and v:
                    p = resolve_path(v)
                    if p.is_relative_to(old):
                        moved[f"{prefix}{k}"] = v
                        OmegaConf.update(self.cfg, f"{prefix}{k}", str(new / p.relative_to(old)), merge=False)
                    elif p.is_relative_to(new):  # left so by an earlier stage on this cfg that did not finish
                        moved[f"{prefix}{k}"] = str(old / p.relative_to(new))

        walk(OmegaConf.to_container(self.cfg, resolve=True), "")
        return moved

    def _recover_swap(self) -> None:
        """Finish undoing what a `finish` killed between its two renames left: the previous result is put back."""
        old = self.run_dir / f".{self.name}.old"
        if old.exists() and not self.final.exists():
            os.replace(old, self.final)
            print(f"note: {self.final}: restored the previous result from {old.name} (a swap was interrupted)")
        elif old.exists():
            shutil.rmtree(old)

    def path(self, *parts: str) -> Path:
        return self.dir.joinpath(*parts)

    def finish(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """Write metrics.json and the finished manifest (with its output hashes) into the stage's fresh folder, then
        swap that folder in for the previous result (rename the old one aside, rename the new one in, delete the
        old one)."""
        wall = round(time.time() - self._t0, 2)
        metrics = {**metrics, "wall_seconds": wall}
        atomic_write_json(self.dir / "metrics.json", metrics)
        self.manifest.update(status="finished", end_time=_now(), wall_seconds=wall, outputs=lineage.outputs(self.dir))
        atomic_write_json(self.dir / "manifest.json", self.manifest)
        if self.dir != self.final:
            old = self.run_dir / f".{self.name}.old"
            if self.final.exists():
                shutil.rmtree(old, ignore_errors=True)
                os.replace(self.final, old)
            os.replace(self.dir, self.final)
            shutil.rmtree(old, ignore_errors=True)
            self.dir = self.final
            for k, v in self._moved.items():
                OmegaConf.update(self.cfg, k, v, merge=False)
        lineage.closed(self)
        if self._own_lock:
            release_lock(self.run_dir)
        return metrics


def stage_output(cfg: DictConfig, stage: str, *parts: str) -> Path:
    """Path to an earlier stage's output; a clear error if that stage has not finished, or is not current
    (`lab.core.lineage.problems`: an output edited since, or an input of it changed by a later rerun upstream). The
    path is recorded as an input of the stage open in this process (`lab.core.lineage.consumed`)."""
    d = resolve_path(cfg.run_dir) / stage
    if not (d / "metrics.json").is_file():
        raise LabError(f"{d}: stage '{stage}' has no finished output (no metrics.json); run notebooks/{stage}.ipynb "
                       f"with the same run_name (or run_dir) first; a run without run_name gets a new time-stamped "
                       f"folder, so pass e.g. overrides=[\"run_name=demo\"] to continue `make demo`'s run")
    p = d.joinpath(*parts)
    if parts and not p.exists():
        raise LabError(f"{p}: expected output of stage '{stage}' is missing")
    if found := lineage.problems(d.parent, stage):  # still what its manifest recorded, and so are the stages it read
        raise LabError(f"{d}: stage '{stage}' is not current: {'; '.join(found)}")
    lineage.consumed(p)  # an input of the stage open in this process, if any
    return p


def stage_input(cfg: DictConfig, path: str | os.PathLike) -> Path:
    """`path` from the config (an adapter or file a stage reads), resolved. When it lies in a stage folder of this run
    (`<run_dir>/NN_name/...`), that stage must have finished, checked by `stage_output`: after a crashed rerun of
    the stage its older output is not read. A path elsewhere (an adapter from another run) is returned as it is."""
    p = resolve_path(path)
    try:
        rel = p.relative_to(resolve_path(cfg.run_dir))
    except ValueError:
        lineage.consumed(p)  # its content hash, an input of the open stage
        return p
    if lineage.stage_of(rel.as_posix()):
        return stage_output(cfg, rel.parts[0], *rel.parts[1:])
    return p


# A stage opened without run_name joins the newest run where one of these stages finished (what it reads first:
# 04_vote votes with 03_grpo's adapter, else 02_sft's); 01_explore starts a new run.
JOINS_AFTER = {"02_sft": ("01_explore",), "03_grpo": ("02_sft",), "04_vote": ("03_grpo", "02_sft"),
               "05_errors": ("04_vote",)}


def current_run(root: str | os.PathLike, stage: str) -> Path | None:
    """The run folder under `root` (the folder of time-stamped runs, `outputs/`) that `stage` joins when opened
    without run_name: of the runs where a stage of `JOINS_AFTER[stage]` finished (its metrics.json), the one where
    that happened last. None for a stage that starts runs (01_explore) or when no run qualifies."""
    after, root = JOINS_AFTER.get(stage), Path(root)
    if not after or not root.is_dir():
        return None
    finished = {}
    for d in root.iterdir():
        times = [(d / s / "metrics.json").stat().st_mtime for s in after if (d / s / "metrics.json").is_file()]
        if times:
            finished[d] = max(times)
    return max(finished, key=finished.get) if finished else None
