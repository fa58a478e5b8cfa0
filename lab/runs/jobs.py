"""A sweep's folder as files: `sweep.json`, and per job `job.json`, `done.json` (a seal over each stage's
`STAGE_FILES`) and `error.txt`; what `lab.runs.sweep` writes and `lab.runs.sweep_report` reads, so the report needs
no sweep machinery. The layout and the rerun rules: docs/internals.md, lab.runs.sweep.
"""

from __future__ import annotations

from pathlib import Path

from lab.core import lineage

SWEEP_FILE, JOB_FILE, DONE_FILE, ERROR_FILE = "sweep.json", "job.json", "done.json", "error.txt"
STAGE_FILES = ("metrics.json", "manifest.json")  # what done.json vouches for in each stage folder


def write_done(job_dir: Path, name: str, stages: list[str], overrides: list[str], key: str, end_time: str) -> None:
    """done.json: the job's overrides and config key, sealing each stage's `STAGE_FILES` (`lineage.seal`)."""
    lineage.seal(Path(job_dir) / DONE_FILE,
                 {"job": name, "overrides": sorted(overrides), "config_sha256": key, "end_time": end_time},
                 [Path(job_dir) / s / f for s in stages for f in STAGE_FILES])


def done_problem(job_dir: Path, stages: list[str], overrides: list[str] | None = None, key: str | None = None
                 ) -> str | None:
    """Why the job in `job_dir` is not finished for `stages` (None: it is): done.json missing, unreadable, made with
    other overrides or another resolved config (`config_key`; not compared when None), not vouching for a stage, a
    sealed file changed since (a stage rerun by hand), or a stage not current (`lineage.problems`)."""
    job_dir = Path(job_dir)
    try:
        d = lineage.check_seal(job_dir / DONE_FILE)
    except lineage.Unsealed as e:
        return str(e)
    made = d.get("key") or {}
    if overrides is not None and made.get("overrides") != sorted(overrides):
        return f"{job_dir / DONE_FILE}: made with overrides {made.get('overrides')}, not {sorted(overrides)}"
    if key is not None and made.get("config_sha256") != key:
        return f"{job_dir / DONE_FILE}: made with another resolved config (conf/ changed since)"
    if missing := [s for s in stages if f"{s}/metrics.json" not in d["sha256"]]:
        return f"{job_dir / DONE_FILE}: the job did not run {', '.join(missing)}"
    memo: dict = {}
    found = [p for s in stages for p in lineage.problems(job_dir, s, memo)]
    return "; ".join(found) or None


def is_done(job_dir: Path, stages: list[str], overrides: list[str], key: str | None = None) -> bool:
    """`done_problem` finds nothing."""
    return done_problem(job_dir, stages, overrides, key) is None


def find_jobs(sweep_dir: Path) -> list[Path]:
    """Every job folder (holding job.json) under the sweep folder, hidden folders (.submitit, .hydra) skipped."""
    return [f.parent for f in sorted(sweep_dir.rglob(JOB_FILE))
            if not any(part.startswith(".") for part in f.parent.relative_to(sweep_dir).parts)]
