"""The sweep commands (`python -m lab sweep|report`, registered in `lab/__main__.py`): arguments in, one call, printing.

  sweep [OPTIONS] -- OVERRIDES   a Hydra multirun over the stage notebooks (`lab.runs.sweep.sweep`), then the report
  report SWEEP_DIR               one table and plots across a sweep's jobs (`lab.runs.sweep_report.report`)

The sweep modules are imported inside their commands (they bring Hydra and papermill), so `python -m lab` starts
without them.
"""

from __future__ import annotations

import argparse
import time

from lab import LabError
from lab.core.paths import resolve_path


def sweep_main(argv: list[str] | None = None) -> int:
    from lab.core.config import split_at_dashes
    from lab.runs.pipeline import STAGES
    from lab.runs.sweep import LAUNCHERS, sweep

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
    ap.add_argument("--smoke", action="store_true", help="add lab.runs.pipeline.SMOKE_OVERRIDES (the smallest budget)")
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


def report_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab report",
                                 description="one table (CSV + Markdown) and plots across a sweep's jobs")
    ap.add_argument("sweep_dir", help="a sweep folder, e.g. outputs/sweeps/default")
    ap.add_argument("--metrics", nargs="+", default=None,
                    help="headline metrics to plot, as <stage>.<key> (default: lab.runs.sweep_report.HEADLINE)")
    args = ap.parse_args(argv)
    from lab.runs.sweep_report import HEADLINE, report  # pandas and matplotlib: after --help

    args.metrics = args.metrics or list(HEADLINE)
    sweep_dir = resolve_path(args.sweep_dir)
    if not sweep_dir.is_dir():
        raise LabError(f"{sweep_dir}: sweep folder not found")
    r = report(sweep_dir, args.metrics)
    print(r["markdown"])
    print(f"wrote {r['csv']}, {r['md']}" + (f" and {len(r['plots'])} plot(s) in {sweep_dir / 'plots'}"
                                            if r["plots"] else ""))
    return 0
