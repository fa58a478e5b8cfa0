"""Sweeps over the stage notebooks and one report across them: `python -m lab sweep` / `python -m lab report`.

A sweep is a Hydra multirun over the lab's own config (`conf/config.yaml`), driven by Hydra's
machinery: its override grammar and BasicSweeper make the grid (`sft.learning_rate=1e-3,3e-3`,
`range(...)`, ...), and its launcher plugins run the jobs: `basic` (one after another in this
process), `joblib` (local processes in parallel), `submitit_local` and `submitit_slurm` (submitit;
SLURM settings are ordinary Hydra overrides such as `hydra.launcher.partition=gpu`). Each job is
Hydra's task function `_Job`, which executes the chosen notebooks with the lab's one stage runner
(`lab.pipeline.execute_stage`, papermill) with the job's overrides plus `run_dir=<sweep_dir>/<job_name>`, so every job is a complete run folder:

    <sweep_dir>/sweep.json                 what was asked (fixed overrides, stages, launcher)
    <sweep_dir>/<job_name>/                the job's run_dir; job_name is Hydra's override_dirname
                                           of the swept keys, e.g. `seed=1,sft.learning_rate=0.01`
        job.json                           the job manifest: overrides, params, status, times
        config.yaml                        the job's resolved config
        notebooks/<stage>.ipynb            executed notebooks (kept, partly executed, on failure)
        logs/<stage>.log                   the kernels' stdout/stderr
        <stage>/metrics.json ...           what each notebook writes (lab.run.Stage)
        summary.md, summary.json           lab.pipeline.summary of the job
        error.txt                          only for a failed job: stage, error, traceback
        done.json                          written atomically LAST: the job finished
        .hydra/, job.log                   Hydra's own record of the job

A job counts as finished only when `done.json` exists, lists every requested stage with the same
overrides and the same resolved config (its sha256: a default changed in `conf/` since is another
job), and each of those stages has its `metrics.json` (which `Stage.finish` writes atomically).
Running the same sweep again skips finished jobs and reruns failed or unfinished ones; inside a
rerun, the leading stages that already finished with identical overrides and an identical resolved
config are kept, and everything from the first unfinished stage on is executed again. A job holds
its folder's lock (`lab.run.run_lock`) while it runs. A failing job writes `error.txt` and
returns; the other jobs go on. `--seeds N` is shorthand for `seed=1,2,...,N` (seeds 1..N, not the
config's seed plus offsets, so job names read `seed=1`, `seed=2`, ...).

`python -m lab report SWEEP_DIR` collects every job (failed ones too, with a status column) into
`report.csv` and `report.md`: parameters (the swept overrides, parsed) and every stage's scalar
metrics as `<stage>.<key>`; it plots each headline metric against each swept parameter (mean and
min-max over seeds) and, for a seeds-only sweep, a per-seed bar chart with the mean, into
`<sweep_dir>/plots/` (drawn by `lab.plots`). The tables are pandas' own: `to_markdown` (tabulate) and a
groupby-agg for mean ± std [min, max] (n) over seeds.

What it simplifies:
1. Jobs never share state (each builds or reads its own base model and split under its run_dir): no
   cross-job caching.
2. A job's name comes from its swept overrides, so a sweep folder's fixed overrides cannot change between
   reruns (refused: use a new --name); values holding '/' make nested job folders.
3. The report reads only top-level scalar metrics (per-category tables stay in each job's folder).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import logging
import math
import os
import re
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Iterable

from lab import LabError
from lab.config import saved_config_matches, split_at_dashes
from lab.io import atomic_write_csv, atomic_write_json, atomic_write_text, read_json
from lab.paths import project_root, resolve_path
from lab.run import run_lock
from lab.pipeline import STAGES, execute_stage, with_smoke
from lab.plots import ordered

log = logging.getLogger(__name__)

SWEEPS_DIR = "outputs/sweeps"
LAUNCHERS = ("basic", "joblib", "submitit_local", "submitit_slurm")
HEADLINE = ("02_sft.accuracy_after", "03_grpo.accuracy_sft_start", "03_grpo.accuracy_after", "03_grpo.delta",
            "04_vote.maj_at_k")
SWEEP_FILE, JOB_FILE, DONE_FILE, ERROR_FILE = "sweep.json", "job.json", "done.json", "error.txt"
RESERVED = {"run_dir": "each job's run_dir is its own folder in the sweep",
            "run_name": "jobs are named after their swept overrides"}
HYDRA_OWNED = ("hydra.sweep.dir", "hydra.sweep.subdir", "hydra.job.chdir", "hydra.job.config.override_dirname",
               "hydra/launcher")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def quote(value: str) -> str:
    """A Hydra override value as a quoted string: paths holding '=' or ',' stay one string."""
    return "'" + str(value).replace("'", "\\'") + "'"


def parse_overrides(overrides: Iterable[str]):
    """Hydra's own parser; a syntax error becomes a LabError naming the overrides."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    overrides = list(overrides)
    try:
        return OverridesParser.create().parse_overrides(overrides)
    except Exception as e:  # OverrideParseException and friends
        raise LabError(f"cannot parse overrides {overrides}: {e}") from None


# ---------------------------------------------------------------------------------------------
# one job
# ---------------------------------------------------------------------------------------------

def job_params(overrides: list[str], exclude_keys: Iterable[str]) -> dict[str, Any]:
    """The job's parameters: its overrides whose keys are swept (not in `exclude_keys`), values parsed."""
    exclude = set(exclude_keys)
    out = {}
    for o in parse_overrides(overrides):
        if o.key_or_group not in exclude:
            v = o.value()
            out[o.key_or_group] = v if isinstance(v, (int, float, bool, str)) or v is None else str(v)
    return out


def job_config(nb_overrides: list[str]) -> dict:
    """The resolved config the job's notebooks compose (validated), as plain data: what a finished job or stage
    must have been made with to be kept. The overrides alone are not enough: a default changed in conf/ since
    the job ran gives the same overrides another config. `run_name` is left out: the job's folder is fixed by
    `run_dir`, and a run_name left unset is a time stamp that differs at every compose."""
    from lab.config import compose, config_data

    return config_data(compose(nb_overrides))


def config_key(config: dict) -> str:
    import hashlib
    import json

    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()


def is_done(job_dir: Path, stages: list[str], overrides: list[str], key: str | None = None) -> bool:
    """done.json lists these stages with the same overrides (and, when `key` is given, the same resolved config:
    `config_key`), and every stage has its metrics.json."""
    done = Path(job_dir) / DONE_FILE
    if not done.is_file():
        return False
    try:
        d = read_json(done)
    except LabError:
        return False
    return (sorted(d.get("overrides", [])) == sorted(overrides) and set(stages) <= set(d.get("stages", []))
            and (key is None or d.get("config_sha256") == key)
            and all((Path(job_dir) / s / "metrics.json").is_file() for s in stages))


def _stage_kept(job_dir: Path, stage: str, nb_overrides: list[str], config: dict | None = None) -> bool:
    """A stage that already finished in this folder with exactly these overrides (and, when `config` is given,
    whose config.yaml holds that resolved config)."""
    d = job_dir / stage
    if not (d / "metrics.json").is_file():
        return False
    try:
        man = read_json(d / "manifest.json")
    except LabError:
        return False
    if config is not None and not saved_config_matches(d / "config.yaml", config):
        return False
    return man.get("status") == "finished" and man.get("overrides") == nb_overrides


def _error_text(stage: str, notebook: Path, err: BaseException) -> str:
    tb = "".join(traceback.format_exception(type(err), err, err.__traceback__))
    return _ANSI.sub("", f"stage: {stage}\nnotebook: {notebook}\nerror: {type(err).__name__}: "
                         f"{str(err).strip()}\n\n{tb}")


def run_job(job_dir: str | os.PathLike, overrides: list[str], stages: list[str], *, name: str | None = None,
            params: dict | None = None, cfg=None, force: bool = False) -> dict:
    """Execute `stages` for one job into `job_dir` (its run_dir); never raises for a failing notebook.

    Returns {"job", "status": finished|failed|skipped, ...}. Order of writes: job.json (running),
    config.yaml, the notebooks (each stage's metrics.json atomically), summary, job.json
    (finished), done.json last; a failure writes error.txt and job.json (failed) and no done.json.
    """
    job_dir = Path(job_dir).resolve()
    name = name or job_dir.name
    overrides = [str(o) for o in overrides]
    nb_overrides = [*overrides, f"run_dir={quote(job_dir)}"]
    config = job_config(nb_overrides)  # validated before the job folder is touched
    key = config_key(config)
    if not force and is_done(job_dir, stages, overrides, key):
        log.info(f"[{name}] finished earlier: skipped")
        return {"job": name, "status": "skipped"}
    with run_lock(job_dir):
        return _run_job(job_dir, name, overrides, nb_overrides, stages, params, cfg, force, config, key)


def _run_job(job_dir: Path, name: str, overrides: list[str], nb_overrides: list[str], stages: list[str],
             params: dict | None, cfg, force: bool, config: dict, key: str) -> dict:
    job_dir.mkdir(parents=True, exist_ok=True)
    (job_dir / DONE_FILE).unlink(missing_ok=True)
    (job_dir / ERROR_FILE).unlink(missing_ok=True)
    t0 = time.time()
    job = {"job": name, "status": "running", "overrides": overrides, "params": params or {}, "stages": list(stages),
           "run_dir": str(job_dir), "notebook_overrides": nb_overrides, "host": socket.gethostname(),
           "pid": os.getpid(), "start_time": _now(), "end_time": None, "wall_seconds": None,
           "stages_kept": [], "stages_run": []}
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
        from lab.pipeline import summary

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
    atomic_write_json(job_dir / DONE_FILE, {"job": name, "status": "finished", "stages": list(stages),
                                            "overrides": overrides, "config_sha256": key, "end_time": job["end_time"]})
    return {"job": name, "status": "finished", "wall_seconds": job["wall_seconds"]}


class _Job:
    """Hydra's task function for one sweep job. Plain attributes only: submitit and joblib pickle it."""

    def __init__(self, stages: list[str], force: bool = False):
        self.stages = list(stages)
        self.force = force

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
            return run_job(job_dir, overrides, self.stages, name=name, params=params, cfg=cfg, force=self.force)
        except Exception as e:  # a broken job must not stop the sweep (Hydra re-raises failed jobs)
            log.error(f"[{name}] could not run: {type(e).__name__}: {e}")
            try:
                atomic_write_text(job_dir / ERROR_FILE, _error_text("setup", job_dir, e))
            except OSError:
                pass
            return {"job": name, "status": "failed", "stage": "setup", "error": f"{type(e).__name__}: {e}"}


# ---------------------------------------------------------------------------------------------
# the sweep
# ---------------------------------------------------------------------------------------------

def plan(overrides: list[str], seeds: int | None = None, smoke: bool = False) -> dict:
    """Split the command line's overrides into lab overrides, Hydra overrides and the swept (named) keys."""
    overrides = list(overrides)
    if smoke:
        overrides = with_smoke(overrides)
    parsed = parse_overrides(overrides)
    if seeds is not None:
        if seeds < 1:
            raise LabError(f"--seeds {seeds}: need at least 1")
        if any(o.key_or_group == "seed" for o in parsed):
            raise LabError("give either --seeds N or seed=..., not both")
        overrides.append("seed=" + ",".join(str(s) for s in range(1, seeds + 1)))
        parsed = parse_overrides(overrides)
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
    old = read_json(f)
    if old.get("fixed_overrides") != p["fixed_overrides"]:
        raise LabError(f"{f}: this sweep folder was made with fixed overrides {old.get('fixed_overrides')}, not "
                       f"{p['fixed_overrides']}; its job names would not tell the two apart. Use another --name "
                       f"(or delete {sweep_dir})")


def multirun(overrides: list[str], task, config_dir: Path | None = None):
    """Hydra's multirun (what `@hydra.main` does for `--multirun`) over conf/config.yaml with `task`."""
    from hydra import version
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_config_search_path
    from hydra.core.global_hydra import GlobalHydra

    from lab.schema import register

    version.setbase("1.3")
    register()  # conf/config.yaml's first default, `schema` (lab/schema.py)
    GlobalHydra.instance().clear()
    try:
        hydra = Hydra.create_main_hydra2(task_name="job", config_search_path=create_config_search_path(
            str(config_dir or project_root() / "conf")))
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
    sweep_dir.mkdir(parents=True, exist_ok=True)
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
    for f in sorted(sweep_dir.rglob(JOB_FILE)):
        name = f.parent.relative_to(sweep_dir).as_posix()
        if (f.parent / DONE_FILE).is_file():
            results.append({"job": name, "status": "finished"})
        else:
            results.append({"job": name, "status": "failed", "stage": "died",
                            "error": f"the job's process ended without a result (killed, preempted or out of memory?): "
                                     f"{why}"})
    return results


def sweep_main(argv: list[str] | None = None) -> int:
    argv, extra = split_at_dashes(argv)
    ap = argparse.ArgumentParser(
        prog="python -m lab sweep",
        description="Hydra multirun over the stage notebooks: one folder per job, a report at the end.",
        epilog="example: python -m lab sweep --name lr --seeds 3 --stages 01_explore 02_sft -- "
               "sft.learning_rate=1e-3,3e-3   (Hydra sweep syntax after --; hydra.launcher.* settings too)")
    ap.add_argument("--name", default="default", help="sweep name; folder outputs/sweeps/NAME (default: default)")
    ap.add_argument("--dir", default=None, help="sweep folder instead of outputs/sweeps/NAME")
    ap.add_argument("--stages", nargs="+", default=STAGES, choices=STAGES, metavar="STAGE",
                    help=f"stages to run, in order (default: all: {' '.join(STAGES)})")
    ap.add_argument("--launcher", default="basic", choices=LAUNCHERS,
                    help="Hydra launcher: basic (sequential), joblib (local parallel), submitit_local, submitit_slurm")
    ap.add_argument("--seeds", type=int, default=None, help="shorthand for seed=1,2,...,N")
    ap.add_argument("--smoke", action="store_true", help="add lab.pipeline.SMOKE_OVERRIDES (the smallest budget)")
    ap.add_argument("--force", action="store_true", help="rerun jobs and stages that already finished")
    ap.add_argument("--no-report", action="store_true", help="skip `lab report` at the end")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides (also accepted after --)")
    args = ap.parse_args(argv)
    t0 = time.time()
    sweep_dir, results = sweep([*args.overrides, *extra], name=args.name, sweep_dir=args.dir, stages=args.stages,
                               launcher=args.launcher, seeds=args.seeds, smoke=args.smoke, force=args.force)
    print(f"\nsweep finished in {time.time() - t0:.0f} s: {sweep_dir}")
    for r in results:
        print(f"  {r.get('status', '?'):<9} {r.get('job')}" + (f"   ({r.get('stage')}: {r.get('error')})"
                                                               if r.get("status") == "failed" else ""))
    if not args.no_report:
        print()
        report_main([str(sweep_dir)])
    failed = [r for r in results if r.get("status") == "failed"]
    if failed:
        print(f"\n{len(failed)} job(s) failed; see error.txt in their folders. Run the same command again to "
              "rerun them (finished jobs are skipped).")
    return 1 if failed else 0


# ---------------------------------------------------------------------------------------------
# the report
# ---------------------------------------------------------------------------------------------

def _scalar(v) -> bool:
    return v is None or isinstance(v, (bool, int, float, str))


def job_status(job_dir: Path, job: dict) -> str:
    """finished (done.json and every stage's metrics), failed (error.txt), else unfinished (running or killed)."""
    stages = job.get("stages", [])
    if (job_dir / DONE_FILE).is_file() and all((job_dir / s / "metrics.json").is_file() for s in stages):
        return "finished"
    if (job_dir / ERROR_FILE).is_file():
        return "failed"
    return "unfinished"


def find_jobs(sweep_dir: Path) -> list[Path]:
    """Every job folder (holding job.json) under the sweep folder, hidden folders (.submitit, .hydra) skipped."""
    out = []
    for f in sorted(sweep_dir.rglob(JOB_FILE)):
        rel = f.parent.relative_to(sweep_dir)
        if not any(part.startswith(".") for part in rel.parts):
            out.append(f.parent)
    return out


def collect(sweep_dir: str | os.PathLike) -> tuple["pd.DataFrame", list[str]]:  # noqa: F821
    """One row per job: job, status, parameters, `<stage>.<key>` scalar metrics, error. Returns (table, params)."""
    import pandas as pd

    sweep_dir = Path(sweep_dir)
    rows, params = [], []
    for job_dir in find_jobs(sweep_dir):
        try:
            job = read_json(job_dir / JOB_FILE)
        except LabError as e:
            rows.append({"job": str(job_dir.relative_to(sweep_dir)), "status": "unreadable", "error": str(e)})
            continue
        row = {"job": str(job_dir.relative_to(sweep_dir)), "status": job_status(job_dir, job)}
        for k, v in (job.get("params") or {}).items():
            if k not in params:
                params.append(k)
            row[k] = v
        for stage in STAGES:
            m = job_dir / stage / "metrics.json"
            if m.is_file():
                try:
                    metrics = read_json(m)
                except LabError:
                    continue
                row.update({f"{stage}.{k}": v for k, v in metrics.items() if _scalar(v)})
        row["hardware"] = _hardware_label(job_dir)
        if row["status"] == "failed":
            err = (job_dir / ERROR_FILE).read_text(encoding="utf-8").splitlines()
            row["error"] = job.get("error") or next((x for x in err if x.startswith("error:")), "")
            row["failed_stage"] = job.get("failed_stage", "")
        rows.append(row)
    if not rows:
        raise LabError(f"{sweep_dir}: no jobs found (no */{JOB_FILE}); run `python -m lab sweep` first")
    df = pd.DataFrame(rows)
    params = sorted(params, key=lambda k: (k == "seed", k))  # seed last among the parameters
    metric_cols = [c for s in STAGES for c in df.columns if c.startswith(s + ".")]
    tail = [c for c in ("failed_stage", "error") if c in df]
    df = df[["job", "status", *params, "hardware", *metric_cols, *tail]]
    sort = [p for p in params if df[p].notna().all()]
    try:
        df = df.sort_values(sort + ["job"] if sort else ["job"], kind="stable").reset_index(drop=True)
    except TypeError:  # mixed types in a parameter column
        df = df.sort_values(["job"]).reset_index(drop=True)
    return df, params


def _hardware_label(job_dir: Path) -> str:
    """Where a job ran, from its first stage manifest: GPU name or "cpu", and torch's thread count (the tiny
    model's outcome for one seed can change with either, see README)."""
    for stage in STAGES:
        try:
            hw = read_json(job_dir / stage / "manifest.json").get("hardware") or {}
        except LabError:
            continue
        where = (hw.get("gpus") or ["cuda"])[0] if hw.get("cuda") else "cpu"
        return f"{where}, torch threads {hw['torch_threads']}" if "torch_threads" in hw else where
    return ""


def _fmt(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v).replace("|", "\\|").replace("\n", " ")


def markdown_table(df) -> str:
    """pandas' `to_markdown` (tabulate) over the cells as text: floats to 4 significant digits, NaN blank, '|' escaped."""
    return df.astype(object).map(_fmt).to_markdown(index=False, disable_numparse=True)


def swept_params(df, params: list[str]) -> list[str]:
    """Parameters other than seed that take more than one value across jobs."""
    return [p for p in params if p != "seed" and df[p].astype(str).nunique() > 1]


def _numeric(df, col: str):
    import pandas as pd

    return pd.to_numeric(df[col], errors="coerce")


def aggregate(df, params: list[str], metrics: list[str]):
    """Mean, std, min, max and n of each metric over seeds, per combination of the other parameters
    (pandas' groupby-agg; std with ddof=1)."""
    import pandas as pd

    keys = swept_params(df, params)
    by = [df[k].astype(str) for k in keys] if keys else [pd.Series("", index=df.index)]
    num = df[metrics].apply(pd.to_numeric, errors="coerce")
    stats = num.groupby(by, sort=False).agg(["mean", "std", "min", "max", "count"])
    counts = df.assign(finished=df["status"] == "finished").groupby(by, sort=False).agg(
        jobs=("status", "size"), finished=("finished", "sum"))

    def cell(st) -> str:
        mean, std, lo, hi, n = st
        if n > 1:
            return f"{mean:.4g} ± {std:.2g} [{lo:.4g}, {hi:.4g}] (n={int(n)})"
        return f"{mean:.4g} (n=1)" if n == 1 else ""

    out = pd.DataFrame({m: [cell(r) for r in stats[m].itertuples(index=False)] for m in metrics}, index=stats.index)
    out = counts.astype(int).join(out).reset_index(drop=not keys)
    out = out[[*keys, "jobs", "finished", *metrics]]
    if keys:
        out = out.iloc[sorted(range(len(out)), key=lambda i: [ordered(out[k]).index(out[k].iloc[i]) for k in keys])]
    return out


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def report(sweep_dir: str | os.PathLike, metrics: Iterable[str] = HEADLINE) -> dict:
    """Write report.csv, report.md and plots/*.png for a sweep folder; returns what was written."""
    from lab.plots import save, sweep_against, sweep_seeds

    sweep_dir = Path(sweep_dir)
    df, params = collect(sweep_dir)
    headline = [m for m in dict.fromkeys(metrics) if m in df and _numeric(df, m).notna().any()]
    swept = swept_params(df, params)
    atomic_write_csv(sweep_dir / "report.csv", df)
    plots = []
    plot_dir = sweep_dir / "plots"
    for m in headline:
        for p in swept:
            fig = sweep_against(df, m, p, [o for o in swept if o != p])
            plots.append(save(fig, plot_dir / f"{_safe(m)}__vs__{_safe(p)}.png"))
    if not swept and headline and "seed" in df and df["seed"].nunique() > 1:
        plots.append(save(sweep_seeds(df, headline), plot_dir / "seeds.png"))
    counts = df["status"].value_counts().to_dict()
    short = df[["job", "status", *params, "hardware", *headline, *[c for c in ("failed_stage", "error") if c in df]]]
    lines = [f"# Sweep report: {sweep_dir.name}", "",
             f"{len(df)} jobs: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + ".",
             f"Swept parameters: {', '.join(swept) or '(none)'}" + ("; seeds: " + ", ".join(
                 map(str, ordered(df['seed']))) if "seed" in df else "") + ".", "",
             "## Headline metrics per job", "", markdown_table(short), ""]
    if headline:
        lines += ["## Over seeds (mean ± std [min, max] (n))", "", markdown_table(aggregate(df, params, headline)), ""]
    if plots:
        lines += ["## Plots", ""] + [f"![{p.stem}](plots/{p.name})" for p in plots] + [""]
    lines += ["## Every job, every scalar metric", "", markdown_table(df), ""]
    md = "\n".join(lines)
    atomic_write_text(sweep_dir / "report.md", md)
    return {"table": df, "markdown": md, "csv": sweep_dir / "report.csv", "md": sweep_dir / "report.md",
            "plots": plots, "headline": headline, "swept": swept}


def report_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab report",
                                 description="one table (CSV + Markdown) and plots across a sweep's jobs")
    ap.add_argument("sweep_dir", help="a sweep folder, e.g. outputs/sweeps/default")
    ap.add_argument("--metrics", nargs="+", default=list(HEADLINE),
                    help="headline metrics to plot, as <stage>.<key> (default: %(default)s)")
    args = ap.parse_args(argv)
    sweep_dir = resolve_path(args.sweep_dir)
    if not sweep_dir.is_dir():
        raise LabError(f"{sweep_dir}: sweep folder not found")
    r = report(sweep_dir, args.metrics)
    print(r["markdown"])
    print(f"wrote {r['csv']}, {r['md']}" + (f" and {len(r['plots'])} plot(s) in {sweep_dir / 'plots'}"
                                            if r["plots"] else ""))
    return 0
