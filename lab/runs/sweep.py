"""Sweeps over the stage notebooks: `python -m lab sweep` (`lab.runs.cli`; the report across them:
`lab.runs.sweep_report`).

A sweep is a Hydra multirun over the lab's own config: Hydra's override grammar and BasicSweeper make the grid
(`sft.learning_rate=1e-3,3e-3`, `range(...)`, ...) and its launcher plugins run the jobs (`basic`, `joblib`,
`submitit_local`, `submitit_slurm`). Each job (`_Job`) executes the chosen notebooks with the lab's one stage runner
(`lab.runs.pipeline.execute_stage`), its overrides plus `run_dir=<sweep_dir>/<job_name>`, so every job is a complete
run folder named by its swept overrides (`seed=1,sft.learning_rate=0.01`). A job counts as finished only when its
`done.json` seal holds the same overrides and resolved config and vouches for every requested stage's outputs, each
still current; the same sweep run again skips finished jobs and reruns the others from their first unfinished
stage. A failing job writes `error.txt` and the others go on; jobs never share state. At the end the sweep runs
`python -m lab report` on its folder. The folder's layout and the rerun rules in full: docs/internals.md,
lab.runs.sweep.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import re
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Iterable

from lab import LabError
from lab.core import lineage, owner
from lab.core.config import compose, config_data, parsed_overrides, saved_config_matches
from lab.core.io import atomic_write_json, atomic_write_text, read_json
from lab.core.paths import project_root, resolve_path
from lab.core.run import _now, run_lock  # _now: the manifests' UTC time stamp, so job.json's read the same
from lab.runs.jobs import DONE_FILE, ERROR_FILE, JOB_FILE, SWEEP_FILE, done_problem, find_jobs, write_done
from lab.runs.pipeline import STAGES, execute_stage, summary, with_smoke

log = logging.getLogger(__name__)

SWEEPS_DIR = "outputs/sweeps"
LAUNCHERS = ("basic", "joblib", "submitit_local", "submitit_slurm")
RESERVED = {"run_dir": "each job's run_dir is its own folder in the sweep",
            "run_name": "jobs are named after their swept overrides"}
HYDRA_OWNED = ("hydra.sweep.dir", "hydra.sweep.subdir", "hydra.job.chdir", "hydra.job.config.override_dirname",
               "hydra/launcher")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def quote(value: str) -> str:
    """A Hydra override value as a quoted string: paths holding '=' or ',' stay one string."""
    return "'" + str(value).replace("'", "\\'") + "'"


# ---------------------------------------------------------------------------------------------
# one job
# ---------------------------------------------------------------------------------------------

def job_params(overrides: list[str], exclude_keys: Iterable[str]) -> dict[str, Any]:
    """The job's parameters: its overrides whose keys are swept (not in `exclude_keys`), values parsed."""
    exclude = set(exclude_keys)
    out = {}
    for o in parsed_overrides(overrides):
        if o.key_or_group not in exclude:
            v = o.value()
            out[o.key_or_group] = v if isinstance(v, (int, float, bool, str)) or v is None else str(v)
    return out


def job_config(nb_overrides: list[str]) -> dict:
    """The resolved config the job's notebooks compose (validated; `lab.core.config.config_data`): what a finished job
    or stage must have been made with to be kept. The overrides alone are not enough: a default changed in conf/
    since the job ran gives the same overrides another config."""
    from lab.data.dataset import check_data_settings

    cfg = compose(nb_overrides)
    check_data_settings(cfg)
    return config_data(cfg)


def config_key(config: dict) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()


def _stage_kept(job_dir: Path, stage: str, nb_overrides: list[str], config: dict) -> bool:
    """A stage that already finished in this folder with exactly these overrides, whose config.yaml holds this
    resolved config."""
    d = job_dir / stage
    if not (d / "metrics.json").is_file() or not saved_config_matches(d / "config.yaml", config):
        return False
    if lineage.problems(job_dir, stage):  # edited since, or read a stage that changed
        return False
    try:
        man = read_json(d / "manifest.json", kind=dict)
    except LabError:
        return False
    return man.get("status") == "finished" and man.get("overrides") == nb_overrides


def _error_text(stage: str, notebook: Path, err: BaseException) -> str:
    tb = "".join(traceback.format_exception(type(err), err, err.__traceback__))
    return _ANSI.sub("", f"stage: {stage}\nnotebook: {notebook}\nerror: {type(err).__name__}: "
                         f"{str(err).strip()}\n\n{tb}")


def run_job(job_dir: str | os.PathLike, overrides: list[str], stages: list[str], *, name: str | None = None,
            params: dict | None = None, cfg=None, force: bool = False, hydra_files: tuple[str, ...] = ()) -> dict:
    """Execute `stages` for one job into `job_dir` (its run_dir); never raises for a failing notebook.

    Returns {"job", "status": finished|failed|skipped, ...}. Order of writes: job.json (running),
    config.yaml, the notebooks (each stage's metrics.json atomically), summary, job.json
    (finished), done.json last; a failure writes error.txt and job.json (failed) and no done.json. `hydra_files`:
    what Hydra wrote into the job folder for this job before it ran (its .hydra/ and <job name>.log).
    """
    job_dir = Path(job_dir).resolve()
    name = name or job_dir.name
    overrides = [str(o) for o in overrides]
    nb_overrides = [*overrides, f"run_dir={quote(job_dir)}"]
    config = job_config(nb_overrides)  # validated before the job folder is touched
    key = config_key(config)
    why = done_problem(job_dir, stages, overrides, key) if not force else "--force"
    if why is None:
        log.info(f"[{name}] finished earlier: skipped")
        return {"job": name, "status": "skipped"}
    if (job_dir / DONE_FILE).exists():
        log.info(f"[{name}] done.json no longer holds ({why}): running the job again")
    # a run folder: new (but for what Hydra wrote into it for this job), or the lab's own
    owner.claim_run(job_dir, name, bool(config.get("overwrite", False)), made_for_it=hydra_files)
    with run_lock(job_dir):  # makes the folder
        (job_dir / DONE_FILE).unlink(missing_ok=True)
        (job_dir / ERROR_FILE).unlink(missing_ok=True)
        t0 = time.time()
        job = {"job": name, "status": "running", "overrides": overrides, "params": params or {},
               "stages": list(stages), "run_dir": str(job_dir), "notebook_overrides": nb_overrides,
               "host": socket.gethostname(), "pid": os.getpid(), "start_time": _now(), "end_time": None,
               "wall_seconds": None, "stages_kept": [], "stages_run": []}
        atomic_write_json(job_dir / JOB_FILE, job)
        if cfg is not None:
            from omegaconf import OmegaConf

            cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
            OmegaConf.update(cfg, "run_dir", str(job_dir))
            atomic_write_text(job_dir / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
        stage = None
        try:
            keep = not force
            for stage in stages:
                keep = keep and _stage_kept(job_dir, stage, nb_overrides, config)
                if keep:
                    log.info(f"[{name}] {stage}: finished earlier with the same overrides, kept")
                    job["stages_kept"].append(stage)
                    continue
                t = time.time()
                log.info(f"[{name}] {stage}: running")
                execute_stage(stage, job_dir, nb_overrides, log_file=job_dir / "logs" / f"{stage}.log")
                log.info(f"[{name}] {stage}: done in {time.time() - t:.0f} s")
                job["stages_run"].append(stage)
            stage = None
            summary(job_dir)
        except Exception as e:
            where = stage or "summary"
            nb = job_dir / "notebooks" / f"{where}.ipynb"
            atomic_write_text(job_dir / ERROR_FILE, _error_text(where, nb, e))
            first = _ANSI.sub("", str(e)).strip().splitlines()
            job.update(status="failed", failed_stage=where, error=f"{type(e).__name__}: {first[-1] if first else ''}",
                       end_time=_now(), wall_seconds=round(time.time() - t0, 1))
            atomic_write_json(job_dir / JOB_FILE, job)
            log.error(f"[{name}] {where}: FAILED ({job['error']}); see {job_dir / ERROR_FILE}")
            return {"job": name, "status": "failed", "stage": where, "error": job["error"]}
        job.update(status="finished", end_time=_now(), wall_seconds=round(time.time() - t0, 1))
        atomic_write_json(job_dir / JOB_FILE, job)
        write_done(job_dir, name, list(stages), overrides, key, job["end_time"])
        return {"job": name, "status": "finished", "wall_seconds": job["wall_seconds"]}


@dataclasses.dataclass
class _Job:
    """Hydra's task function for one sweep job. Plain attributes only: submitit and joblib pickle it."""

    stages: list[str]
    force: bool = False

    def __call__(self, cfg) -> dict:
        from hydra.core.hydra_config import HydraConfig

        hc = HydraConfig.get()
        job_dir = Path(hc.runtime.output_dir)
        sweep_dir = Path(str(hc.sweep.dir)).resolve()
        overrides = [str(o) for o in hc.overrides.task]
        name = str(job_dir.resolve().relative_to(sweep_dir)) if job_dir.resolve().is_relative_to(sweep_dir) \
            else job_dir.name
        try:
            params = job_params(overrides, hc.job.config.override_dirname.exclude_keys)
            hydra_files = (str(hc.output_subdir or ".hydra"), f"{hc.job.name}.log")  # what Hydra wrote there
            return run_job(job_dir, overrides, self.stages, name=name, params=params, cfg=cfg, force=self.force,
                           hydra_files=hydra_files)
        except Exception as e:  # a broken job must not stop the sweep (Hydra re-raises failed jobs)
            log.error(f"[{name}] could not run: {type(e).__name__}: {e}")
            with contextlib.suppress(OSError):
                atomic_write_text(job_dir / ERROR_FILE, _error_text("setup", job_dir, e))
            return {"job": name, "status": "failed", "stage": "setup", "error": f"{type(e).__name__}: {e}"}


# ---------------------------------------------------------------------------------------------
# the sweep
# ---------------------------------------------------------------------------------------------

def plan(overrides: list[str], seeds: int | None = None, smoke: bool = False) -> dict:
    """Split the command line's overrides into lab overrides, Hydra overrides and the swept (named) keys."""
    overrides = list(overrides)
    if smoke:
        overrides = with_smoke(overrides)
    parsed = parsed_overrides(overrides)
    if seeds is not None:
        if seeds < 1:
            raise LabError(f"--seeds {seeds}: need at least 1")
        if any(o.key_or_group == "seed" for o in parsed):
            raise LabError("give either --seeds N or seed=..., not both")
        overrides.append("seed=" + ",".join(str(s) for s in range(1, seeds + 1)))
        parsed = parsed_overrides(overrides)
    lab, hydra, named, fixed = [], [], [], []
    for line, o in zip(overrides, parsed):
        key = o.key_or_group
        if o.is_hydra_override():
            owned = [h for h in HYDRA_OWNED if key == h or key.startswith(h + ".")]
            if owned:
                raise LabError(f"{line}: set by `lab sweep` itself (use --dir for the sweep folder, --launcher for "
                               "the launcher)")
            hydra.append(line)
            continue
        if key in RESERVED:
            raise LabError(f"{line}: not allowed in a sweep: {RESERVED[key]}")
        lab.append(line)
        if o.is_sweep_override() or (key == "seed" and seeds is not None):
            if o.is_sweep_override() and (up := [v for v in o.sweep_string_iterator() if ".." in v.split("/")]):
                raise LabError(f"{line}: the swept value {up[0]!r} would put its job folder (named after the swept "
                               "values, Hydra's override_dirname) outside the sweep folder; sweep values without a "
                               "'..' path part")
            named.append(key)
        else:
            fixed.append(key)
    return {"lab": lab, "hydra": hydra, "named": named, "fixed": fixed,
            "fixed_overrides": sorted(line for line, o in zip(overrides, parsed)
                                      if not o.is_hydra_override() and o.key_or_group in fixed)}


def hydra_overrides(p: dict, sweep_dir: Path, launcher: str) -> list[str]:
    """Everything Hydra needs: the launcher, the sweep folder, job folders named after the swept keys."""
    if launcher not in LAUNCHERS:
        raise LabError(f"--launcher {launcher}: not one of {', '.join(LAUNCHERS)}")
    subdir = "${hydra.job.override_dirname}" if p["named"] else "default"
    return [*p["lab"], f"hydra/launcher={launcher}", f"hydra.sweep.dir={quote(sweep_dir)}",
            f"hydra.sweep.subdir={subdir}",
            "hydra.job.config.override_dirname.exclude_keys=[" + ",".join(quote(k) for k in p["fixed"]) + "]",
            "hydra.job.config.override_dirname.kv_sep='='", "hydra.job.config.override_dirname.item_sep=','",
            "hydra.job.chdir=false", *p["hydra"]]


def _check_sweep_file(sweep_dir: Path, p: dict) -> None:
    f = sweep_dir / SWEEP_FILE
    if not f.is_file():
        return
    old = read_json(f, kind=dict)
    if old.get("fixed_overrides") != p["fixed_overrides"]:
        raise LabError(f"{f}: this sweep folder was made with fixed overrides {old.get('fixed_overrides')}, not "
                       f"{p['fixed_overrides']}; its job names would not tell the two apart. Use another --name "
                       f"(or delete {sweep_dir})")


def multirun(overrides: list[str], task):
    """Hydra's multirun (what `@hydra.main` does for `--multirun`) over conf/config.yaml with `task`."""
    from hydra import version
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_config_search_path
    from hydra.core.global_hydra import GlobalHydra

    from lab.core.schema import register

    version.setbase("1.3")
    register()  # conf/config.yaml's first default, `schema` (lab/core/schema.py)
    GlobalHydra.instance().clear()
    try:
        hydra = Hydra.create_main_hydra2(task_name="job", config_search_path=create_config_search_path(
            str(project_root() / "conf")))
        batches = hydra.multirun(config_name="config", task_function=task, overrides=list(overrides))
    finally:
        GlobalHydra.instance().clear()
    return [r.return_value for batch in batches for r in batch]


def sweep(overrides: list[str], *, name: str = "default", sweep_dir: str | os.PathLike | None = None,
          stages: list[str] = STAGES, launcher: str = "basic", seeds: int | None = None, smoke: bool = False,
          force: bool = False) -> tuple[Path, list[dict]]:
    """Run the sweep; returns (sweep_dir, one result dict per job)."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    bad = [s for s in stages if s not in STAGES]
    if bad:
        raise LabError(f"unknown stages {bad}; stages are {', '.join(STAGES)}")
    stages = [s for s in STAGES if s in stages]
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise LabError(f"--name {name!r}: use letters, digits, '.', '_' and '-'")
    sweep_dir = resolve_path(sweep_dir) if sweep_dir else resolve_path(f"{SWEEPS_DIR}/{name}")
    p = plan(overrides, seeds=seeds, smoke=smoke)
    _check_sweep_file(sweep_dir, p)
    owner.output_dir(sweep_dir, "sweep", force=force)  # new, or a sweep folder of the lab's
    with run_lock(sweep_dir):  # one sweep per folder at a time: a second one of the same name is refused here,
        # before it writes error.txt into the first one's jobs or its own sweep.json over the first one's
        info = {"name": name, "sweep_dir": str(sweep_dir), "stages": stages, "launcher": launcher, "seeds": seeds,
                "overrides": p["lab"], "hydra_overrides": p["hydra"], "swept_keys": p["named"],
                "fixed_overrides": p["fixed_overrides"], "started": _now(), "command": sys.argv}
        atomic_write_json(sweep_dir / SWEEP_FILE, info)
        print(f"sweep {name}: {sweep_dir}\n  stages: {' '.join(stages)}\n  launcher: {launcher}\n"
              f"  swept: {', '.join(p['named']) or '(nothing: one job)'}", flush=True)
        try:
            results = multirun(hydra_overrides(p, sweep_dir, launcher), _Job(stages, force=force))
        except (HydraException, OmegaConfBaseException) as e:
            raise LabError(f"{project_root() / 'conf' / 'config.yaml'}: the sweep could not start: {e}") from None
        except Exception as e:  # submitit: a job process that died (killed, preempted, out of memory) returned nothing
            if type(e).__name__ != "UncompletedJobError":
                raise
            results = results_on_disk(sweep_dir, str(e).strip().splitlines()[0])
        info.update(finished=_now(), results=results)
        atomic_write_json(sweep_dir / SWEEP_FILE, info)
    return sweep_dir, results


def results_on_disk(sweep_dir: Path, why: str) -> list[dict]:
    """One result per job folder (`job.json`), read from disk: when a submitit job dies, the launcher returns no
    result for any job. A folder without `done.json` is reported failed; the same command reruns it."""
    results = []
    for job_dir in find_jobs(sweep_dir):
        name = job_dir.relative_to(sweep_dir).as_posix()
        if done_problem(job_dir, []) is None:
            results.append({"job": name, "status": "finished"})
        else:
            results.append({"job": name, "status": "failed", "stage": "died",
                            "error": f"the job's process ended without a result (killed, preempted or out of memory?): "
                                     f"{why}"})
    return results
