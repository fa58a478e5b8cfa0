"""One report across a sweep's jobs: `python -m lab report SWEEP_DIR` (`lab.runs.cli`; the sweep itself:
`lab.runs.sweep`).

It collects every job folder of the sweep (`lab.runs.jobs.find_jobs`; failed and unfinished ones too, with a status
column) into `report.csv` and `report.md`: the parameters (the swept overrides, parsed), where the job ran, and
every stage's scalar metrics as `<stage>.<key>`; it plots each headline metric against each swept parameter (mean
and min-max over seeds) and, for a seeds-only sweep, a per-seed bar chart with the mean, into `<sweep_dir>/plots/`
(drawn by `lab.core.plots`). The tables are pandas' own: `to_markdown` (tabulate) and a groupby-agg for
mean ± std [min, max] (n) over seeds.

What it simplifies: the report reads only top-level scalar metrics (per-category tables stay in each job's folder).
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Iterable

import pandas as pd

from lab import LabError
from lab.core.io import atomic_write_csv, atomic_write_text, read_json
from lab.runs.pipeline import STAGES
from lab.core.plots import ordered, save, sweep_against, sweep_seeds
from lab.runs.jobs import DONE_FILE, ERROR_FILE, JOB_FILE, done_problem, find_jobs

HEADLINE = ("02_sft.accuracy_after", "03_grpo.accuracy_sft_start", "03_grpo.accuracy_after", "03_grpo.delta",
            "04_vote.maj_at_k")


def job_status(job_dir: Path, job: dict) -> str:
    """finished (done.json vouches for every stage, each current: `lab.runs.jobs.done_problem`), not current
    (done.json is there but no longer holds: a stage rerun or edited by hand since), failed (error.txt), else
    unfinished (running or killed); `collect` marks a job whose metrics.json cannot be read `unreadable`."""
    stages = job.get("stages", [])
    if done_problem(job_dir, stages, job.get("overrides")) is None:
        return "finished"
    if (job_dir / DONE_FILE).is_file():
        return "not current"
    if (job_dir / ERROR_FILE).is_file():
        return "failed"
    return "unfinished"


def collect(sweep_dir: str | os.PathLike) -> tuple[pd.DataFrame, list[str]]:
    """One row per job: job, status, parameters, `<stage>.<key>` scalar metrics, error. Returns (table, params)."""
    sweep_dir = Path(sweep_dir)
    rows, params = [], set()
    for job_dir in find_jobs(sweep_dir):
        name = str(job_dir.relative_to(sweep_dir))
        try:
            job = read_json(job_dir / JOB_FILE, kind=dict)
        except LabError as e:
            rows.append({"job": name, "status": "unreadable", "hardware": "", "error": str(e)})
            continue
        row = {"job": name, "status": job_status(job_dir, job)}
        row.update(job.get("params") or {})
        params.update(job.get("params") or {})
        for stage in STAGES:
            try:  # a stage not run adds no columns
                metrics = read_json(job_dir / stage / "metrics.json", kind=dict)
            except LabError as e:
                if (job_dir / stage / "metrics.json").exists():  # there but unreadable: the job is not averaged in
                    row.update(status="unreadable", error=str(e))  # silently as if it had finished
                    print(f"WARNING: {e}: job {name} is reported as unreadable, not finished", flush=True)
                continue
            row.update({f"{stage}.{k}": v for k, v in metrics.items()
                        if v is None or isinstance(v, (bool, int, float, str))})  # scalars only
        if row["status"] == "not current":  # figures no longer made with the job's settings: left out
            why = done_problem(job_dir, job.get("stages", []), job.get("overrides"))
            row["error"] = why
            print(f"WARNING: job {name} is reported as not current, its figures left out: {why}", flush=True)
        if row["status"] in ("unreadable", "not current"):  # what its stages hold would skew the averages: left out
            row = {k: v for k, v in row.items() if "." not in k or k in (job.get("params") or {})}
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
    model's outcome for one seed can change with either, see RESULTS.md, "The demo's headline")."""
    for stage in STAGES:
        try:
            hw = read_json(job_dir / stage / "manifest.json", kind=dict).get("hardware") or {}
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
    """pandas' `to_markdown` (tabulate) over the cells as text: floats to 4 significant digits, NaN blank, '|'
    escaped."""
    return df.astype(object).map(_fmt).to_markdown(index=False, disable_numparse=True)


def swept_params(df, params: list[str]) -> list[str]:
    """Parameters other than seed that take more than one value across jobs."""
    return [p for p in params if p != "seed" and df[p].astype(str).nunique() > 1]


def aggregate(df, params: list[str], metrics: list[str]):
    """Mean, std, min, max and n of each metric over seeds, per combination of the other parameters
    (pandas' groupby-agg; std with ddof=1)."""
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
    sweep_dir = Path(sweep_dir)
    df, params = collect(sweep_dir)
    headline = [m for m in dict.fromkeys(metrics) if m in df and pd.to_numeric(df[m], errors="coerce").notna().any()]
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
