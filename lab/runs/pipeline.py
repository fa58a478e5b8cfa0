"""Running the five notebooks headless and summarising a run: `python -m lab demo` / `summary`.

`execute_stage`, the lab's one stage runner, executes one stage notebook with papermill into
`<run_dir>/notebooks/` and checks the stage finished (the sweep and the Kaggle pipeline kernel use it too);
`run_notebooks` runs 01_explore ... 05_errors in order into one run folder with the same Hydra overrides;
`summary` collects every stage's metrics.json into summary.json and a headline table, summary.md.
What it simplifies and where its time constants come from: docs/internals.md, lab.runs.pipeline.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import time
from pathlib import Path

from lab import LabError
from lab.core.config import compose, names_run
from lab.core.console import ECHO_ENV, debugging
from lab.core.io import atomic_write_json, atomic_write_text, read_json
from lab.core.paths import project_root
from lab.core import env, lineage, owner
from lab.core.run import run_lock

STAGES = ["01_explore", "02_sft", "03_grpo", "04_vote", "05_errors"]

# The smallest budget on which every stage still runs end to end (tests, sweeps' --smoke): conf/experiment/smoke.yaml.
SMOKE_OVERRIDES = ["experiment=smoke"]


# `python -m lab demo`'s budget unless the user chose an experiment: the default, GRPO and voting shortened.
DEMO_OVERRIDE = "experiment=demo"


def with_smoke(overrides: list[str]) -> list[str]:
    """`overrides` on the smoke budget: the preset first, joined to an `experiment=X` the user chose
    (`experiment=[X,smoke]`: Hydra merges both, in that order); the user's own keys still win over it (Hydra applies
    command-line keys after the presets)."""
    out = list(overrides)
    for i, line in enumerate(out):
        if line.startswith("experiment="):
            value = line.split("=", 1)[1].strip()
            if value.startswith("[") and value.endswith("]"):
                value = value[1:-1]
            elif "," in value:
                raise LabError(f"{line}: the smoke budget joins one experiment or a list of them, not a sweep")
            out[i] = f"experiment=[{','.join([*filter(None, value.split(',')), 'smoke'])}]"
            return out
    return [*SMOKE_OVERRIDES, *out]


# The notebook kernel's own log: only errors (its one warning is about papermill's localhost sockets).
KERNEL_ARGS = ["--IPKernelApp.log_level=ERROR"]


# errors raised inside a stage's kernel that are the world's, not a bug: reported as one line naming the notebook
KNOWN_ERRORS = ("LabError", "PermissionError", "FileNotFoundError", "IsADirectoryError", "NotADirectoryError",
                "OSError", "SafetensorError", "ModuleNotFoundError", "KeyboardInterrupt")


def execute_stage(stage: str, run_dir: Path, overrides: list[str], *, log_file: Path | None = None,
                  log_output: bool = True) -> Path:
    """Run notebooks/<stage>.ipynb with papermill into <run_dir>/notebooks/; returns the executed copy.

    The one stage runner: `run_notebooks` (demo, the Kaggle pipeline kernel) and `lab.runs.sweep` call it. The
    kernel's output goes to `log_file` when given, else to stdout when `log_output` (and then its progress lines
    too, which the saved notebook holds as one line: `lab.core.console.Progress`). A notebook that runs to
    the end without writing <run_dir>/<stage>/metrics.json is an error. A `LabError` or another of `KNOWN_ERRORS`
    raised inside the stage, or a kernel that died (`DeadKernelError`: killed for lack of memory, most often), comes
    back as one LabError (what happened and the executed notebook's path); any other error, and every error under
    --debug / LAB_DEBUG=1, as papermill raises it.
    """
    import papermill as pm
    from nbclient.exceptions import DeadKernelError

    src = project_root() / "notebooks" / f"{stage}.ipynb"
    if not src.is_file():
        raise LabError(f"{src}: notebook not found (stages are {', '.join(STAGES)})")
    out = run_dir / "notebooks" / src.name
    out.parent.mkdir(parents=True, exist_ok=True)
    kw = dict(parameters={"overrides": list(overrides)}, cwd=str(project_root()), kernel_name="python3",
              progress_bar=False, extra_arguments=KERNEL_ARGS)
    echo = {ECHO_ENV: "1"} if log_file is None and log_output else {}  # progress lines to this console too
    try:
        with plain_progress(), env.scoped(echo):
            if log_file is None:
                pm.execute_notebook(str(src), str(out), log_output=log_output, **kw)
            else:
                log_file.parent.mkdir(parents=True, exist_ok=True)
                with open(log_file, "w", encoding="utf-8") as f:
                    pm.execute_notebook(str(src), str(out), log_output=False, stdout_file=f, stderr_file=f, **kw)
    except pm.PapermillExecutionError as e:
        where = f"; log: {log_file}" if log_file is not None else ""
        if e.ename not in KNOWN_ERRORS or debugging():  # a bug: papermill's traceback is what helps
            raise
        # the lab's own refusal or an error of the world (a file, the disk): its message, once, and where the whole
        # output is (not a 60-line traceback)
        what = e.evalue if e.ename == "LabError" else f"{e.ename}: {e.evalue}"
        raise LabError(f"stage {stage} stopped: {what}\n(the executed notebook, with all the stage printed and the "
                       f"traceback: {out}{where})") from None
    except DeadKernelError:
        if debugging():
            raise
        where = f"; its log: {log_file}" if log_file is not None else ""
        raise LabError(f"stage {stage}: the kernel running {src} died (most often killed by the system for lack of "
                       f"memory: see `dmesg`); lower the batch sizes or use a machine with more memory, then run the "
                       f"stage again (its previous result is kept); the notebook so far: {out}{where}") from None
    if not (run_dir / stage / "metrics.json").is_file():
        raise LabError(f"{out}: the notebook ran to the end but {run_dir / stage / 'metrics.json'} was not written")
    if (run_dir / f".{stage}.partial").exists():  # lab.core.run.Stage: the fresh folder is swapped in by finish
        raise LabError(f"{out}: the notebook ran to the end without finishing its stage (stage.finish): "
                       f"{run_dir / stage} still holds the previous result")
    return out


def plain_progress():
    """The stage kernels print plain progress lines (`lab.core.console.live_progress`): `LAB_PROGRESS=plain` while
    papermill starts them, unless the caller set it. Needed where this runs inside a Jupyter kernel (a Kaggle
    notebook running the pipeline), whose `JPY_SESSION_NAME` the stage kernels would otherwise inherit."""
    return env.scoped({"LAB_PROGRESS": "plain"}, keep=True)


# `make demo`'s expected time: a stage takes FIXED_S + PER_UNIT_S x its work units (`work_units`) in wall seconds on
# the idle 2-core development machine, whose probe (`probe`) took PROBE_REF_S; another machine's probe scales them.
# Where each constant comes from: docs/internals.md, lab.runs.pipeline.
PROBE_REF_S = 0.0016
FIXED_S = {"01_explore": 11.5, "02_sft": 10.0, "03_grpo": 10.0, "04_vote": 16.0, "05_errors": 10.0}
PER_UNIT_S = {"01_explore": 0.0, "02_sft": 0.0795, "03_grpo": 0.1131, "04_vote": 0.080, "05_errors": 0.0}
# what one part of a stage costs in the stage's unit: a held-out puzzle evaluated before and after SFT, in training
# examples; a GRPO screening sample and an evaluated puzzle, in training completions; a training step without
# gradient checkpointing against one with it (the units' cost)
SFT_EVAL_WEIGHT, SCREEN_WEIGHT, GRPO_EVAL_WEIGHT, NO_CHECKPOINTING = 4.13, 1.35, 0.07, 0.75


def work_units(stage: str, cfg) -> float:
    """A stage's budget in one count, each part weighted by its cost against the stage's main part: 02_sft's
    training examples plus its two greedy evaluations; 03_grpo's training completions plus its screening samples and
    evaluation; 04_vote's samples drawn (its greedy pass and live early stop scale with them); nothing for 01_explore
    and 05_errors (their time is the kernel's start)."""
    d, s, g = cfg.data, cfg.sft, cfg.grpo
    if stage == "02_sft":
        per_step = s.batch_size * s.grad_accum
        steps = s.max_steps if s.max_steps > 0 else -(-d.n_train * s.epochs // per_step)
        train = steps * per_step * (1.0 if s.gradient_checkpointing else NO_CHECKPOINTING)
        return float(train + SFT_EVAL_WEIGHT * d.n_val)
    if stage == "03_grpo":
        train = g.max_steps * g.prompts_per_step * g.num_generations
        train *= 1.0 if g.gradient_checkpointing else NO_CHECKPOINTING
        return float(train + SCREEN_WEIGHT * g.n_prompts * g.pass_rate_k + GRPO_EVAL_WEIGHT * d.n_val)
    if stage == "04_vote":
        return float(d.n_val * cfg.vote.k)
    return 0.0


def probe(reps: int = 100) -> float:
    """This machine's speed: the fastest of `reps` timings (after one warm-up) of a fixed piece of one-thread work
    like the stages' (20 products of a 256 x 64 by a 64 x 64 float32 matrix, each through tanh), in seconds. The
    fastest of many short repeats, not one longer sample: a single sample's wall time varied 1-3x with the
    scheduler, the fastest repeat is the machine's speed (what load the stages then meet, their ETA shows)."""
    import torch

    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(256, 64, generator=g), torch.randn(64, 64, generator=g) / 8
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        best = float("inf")
        for _ in range(reps + 1):
            t0 = time.perf_counter()
            y = x
            for _ in range(20):
                y = torch.tanh(y @ w)
            best = min(best, time.perf_counter() - t0)
        return best
    finally:
        torch.set_num_threads(threads)


def cpu_seconds() -> float:
    """CPU seconds used so far by this process and its finished children (the stages' kernels)."""
    import resource

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def expected_seconds(cfg, stages: list[str], probe_s: float) -> dict[str, float]:
    """{stage: projected wall seconds on this machine, idle} from the stage budgets (`work_units`) and the probe
    (against `PROBE_REF_S`); a projection for the tiny model on a CPU, not for the real model (`python -m lab
    estimate`)."""
    scale = probe_s / PROBE_REF_S
    return {s: scale * (FIXED_S[s] + PER_UNIT_S[s] * work_units(s, cfg)) for s in stages}


def _load_note() -> str:
    """A note when other work is running here (the 1-minute load average near the cores or above): the stages then
    take longer than expected, and their ETA follows the pace they actually keep."""
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if load < cores / 2:
        return ""
    return (f"\nThis machine is busy (load average {load:.1f} on {cores} cores): expect longer; "
            "the ETA after each stage follows the pace the stages keep.")


def _clock(seconds: float) -> str:
    s = int(max(seconds, 0))
    return f"{s // 60}:{s % 60:02d}"


def run_notebooks(overrides: list[str], stages: list[str] = STAGES, log_output: bool = True) -> Path:
    """Execute the stage notebooks in order (`execute_stage`) under one run lock; returns the run directory. Prints the
    time it expects (the tiny model on a CPU: `expected_seconds`), then per stage its expectation, the ETA of the run
    (the expected rest, scaled by how the stages so far compared with theirs) and its real time."""
    overrides = list(overrides)
    cfg = compose(overrides)  # validated: a bad value stops here, before any stage folder is touched
    from lab.data.dataset import check_data_settings

    check_data_settings(cfg)  # and a category or generator knob that does not exist
    unknown = [s for s in stages if s not in STAGES or not (project_root() / "notebooks" / f"{s}.ipynb").is_file()]
    if unknown:
        raise LabError(f"{project_root() / 'notebooks'}: no stage notebook {unknown} (stages are {', '.join(STAGES)})")
    if not names_run(overrides):  # one time stamp for all stages, not one per notebook
        overrides.append(f"run_name={cfg.run_name}")
    run_dir = owner.claim_run(cfg.run_dir, cfg.run_name, bool(cfg.overwrite))  # a run folder of the lab's, or new
    expected = None
    if cfg.model.name == "tiny" and str(cfg.model.device) in ("auto", "cpu"):
        speed = probe()
        expected = expected_seconds(cfg, stages, speed)
        print(f"Expected time: about {_clock(sum(expected.values()))} (min:s) for {len(stages)} stage(s) on this "
              "machine idle: " + ", ".join(f"{k} {v:.0f} s" for k, v in expected.items())
              + f"; projected from the stage budgets and a probe of this machine ({1e3 * speed:.2f} ms, "
              f"{1e3 * PROBE_REF_S:.2f} ms where the stage times were measured: lab.runs.pipeline.FIXED_S)"
              + _load_note(), flush=True)
    with run_lock(run_dir):  # one writer per run folder; the notebooks' kernels inherit the lock
        logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout, force=True)
        took: dict[str, float] = {}
        for i, name in enumerate(stages, 1):
            t0, c0 = time.time(), cpu_seconds()
            out = run_dir / "notebooks" / f"{name}.ipynb"
            head = f"\n=== {name} ({i}/{len(stages)}): running {name}.ipynb -> {out}"
            if expected:
                pace = sum(took.values()) / sum(expected[k] for k in took) if took else 1.0
                rest = pace * sum(expected[k] for k in stages[i - 1:])
                head += f"\n=== expected {expected[name]:.0f} s; the run's ETA {_clock(rest)} (min:s)"
            print(head, flush=True)
            execute_stage(name, run_dir, overrides, log_output=log_output)
            took[name] = time.time() - t0
            said = f" (expected {expected[name]:.0f} s)" if expected else ""
            print(f"=== {name}: done in {took[name]:.0f} s{said}, {cpu_seconds() - c0:.0f} s of CPU", flush=True)
    return run_dir


def stages_and_overrides(words: list[str]) -> tuple[list[str], list[str]]:
    """Sort a command line's words into stage names and Hydra overrides, each in the order given (later overrides
    win, as in Hydra), wherever they stand: `--stages 02_sft sft.max_steps=2` and `sft.max_steps=2 02_sft` mean
    the same. A word that is neither a stage nor an override (`key=value`, `+key=value`, `~key`) is refused, so
    nothing runs with settings the user did not mean."""
    out_stages, out_over = [], []
    for word in words:
        if word in STAGES:
            out_stages.append(word)
        elif "=" in word or word.startswith("~"):
            out_over.append(word)
        else:
            raise LabError(f"{word!r} is neither a stage ({', '.join(STAGES)}) nor a Hydra override (key=value)")
    return out_stages, out_over


def headline(run_dir: Path, stale: dict | None = None) -> dict:
    """Each finished, current stage's metrics.json, keyed by stage; stages that did not finish are listed as missing,
    finished stages that are not current (`lineage_problems`) as not current, their figures not read."""
    stale = lineage_problems(run_dir) if stale is None else stale
    out = {}
    for name in STAGES:
        p = run_dir / name / "metrics.json"
        out[name] = ({"missing": True} if not p.is_file() else {"not_current": stale[name]} if stale.get(name)
                     else read_json(p, kind=dict))
    return out


def _read_predictions(path: Path):
    from lab.eval.analysis import load_predictions

    try:
        return load_predictions(path) if path.is_file() else None
    except LabError:
        return None


def _row(stage: str, metric: str, value, n=None, pred=None, before=None) -> dict:
    """One headline row; with predictions: the Wilson interval of their accuracy and fixed/broken against `before`."""
    from lab.eval.analysis import compare, wilson_interval

    row = {"stage": stage, "metric": metric, "value": value, "ci95": "", "n": n, "fixed / broken": ""}
    if isinstance(value, float) and n:
        lo, hi = wilson_interval(int(round(value * n)), int(n))
        row["ci95"] = f"[{lo:.2f}, {hi:.2f}]"
    if pred is not None and before is not None:
        with contextlib.suppress(LabError):
            net = compare(before, pred)[0].set_index("category").loc["all"]
            row["fixed / broken"] = f"{int(net['fixed'])} / {int(net['broken'])}"
    return row


def headline_table(run_dir: Path, stages: dict | None = None, stale: dict | None = None) -> list[dict]:
    """The run's headline numbers, one row each: stage, metric, value, ci95, n, fixed / broken.

    Accuracies carry a Wilson 95% interval over the held-out puzzles; `fixed / broken` counts puzzles
    right now and wrong in the previous stage's greedy predictions (and the reverse): SFT after vs
    before, GRPO vs SFT, 04_vote's greedy vs GRPO. maj@k is an average over sample windows
    (lab.eval.vote.curves), so its interval treats round(maj@k * n) as the count. A stage that is not finished and
    current (`lineage_problems`) has one row saying so and none of its figures.
    """
    run_dir = Path(run_dir)
    stale = lineage_problems(run_dir) if stale is None else stale  # `summary` passes the one it also writes
    stages = stages or headline(run_dir, stale)
    rows: list[dict] = []

    def _predictions(path: Path):  # a current stage's predictions only
        return None if stale.get(path.parent.name) else _read_predictions(path)

    m = stages.get("01_explore", {})
    if "n_train" in m:
        rows += [_row("01_explore", "training puzzles", m["n_train"]),
                 _row("01_explore", "held-out puzzles", m.get("n_val"))]
        if "solver_solved_share" in m:
            rows.append(_row("01_explore", "solver: share solved", float(m["solver_solved_share"])))

    sft_before = _predictions(run_dir / "02_sft" / "predictions_before.csv")
    sft = _predictions(run_dir / "02_sft" / "predictions.csv")
    m = stages.get("02_sft", {})
    if "accuracy_after" in m:
        n = len(sft) if sft is not None else m.get("n_val") or stages.get("01_explore", {}).get("n_val")
        if "accuracy_before" in m:
            rows.append(_row("02_sft", "accuracy before SFT", float(m["accuracy_before"]), n))
        rows.append(_row("02_sft", "accuracy after SFT", float(m["accuracy_after"]), n, sft, sft_before))
    grpo = _predictions(run_dir / "03_grpo" / "predictions.csv")
    m = stages.get("03_grpo", {})
    if "accuracy_after" in m:
        n = len(grpo) if grpo is not None else None
        rows.append(_row("03_grpo", "accuracy after GRPO", float(m["accuracy_after"]), n, grpo, sft))
    vote = _predictions(run_dir / "04_vote" / "predictions.csv")
    m = stages.get("04_vote", {})
    if "greedy_accuracy" in m:
        n = len(vote) if vote is not None else None
        k = m.get("k", "k")
        rows.append(_row("04_vote", "greedy accuracy (Kaggle's setting)", float(m["greedy_accuracy"]), n, vote, grpo))
        for key, name in (("maj_at_k", f"maj@{k}"), ("pass_at_k", f"pass@{k}")):
            if key in m:
                rows.append(_row("04_vote", name, float(m[key]), n))
    m = stages.get("05_errors", {})
    if "accuracy" in m:
        rows.append(_row("05_errors", "accuracy of the final predictions", float(m["accuracy"]), m.get("n")))
        if "fixed_since_sft" in m:
            rows[-1]["fixed / broken"] = f"{m['fixed_since_sft']} / {m['broken_since_sft']} since SFT"
        if "truncated" in m:
            rows.append(_row("05_errors", "truncated completions", m["truncated"], m.get("n")))
    for name in STAGES:  # a stage that is not current: one row saying so, none of its figures
        if stale.get(name):
            rows.append({"stage": f"{name} (not current)", "metric": "not read: see Not current below", "value": None,
                         "ci95": "", "n": None, "fixed / broken": ""})
    return rows


def read_files(run_dir: Path, stale: dict) -> list[str]:
    """The files `headline_table` reads, relative to the run folder: each finished, current stage's metrics.json and
    predictions (what `summary` says it read)."""
    names = ("metrics.json", "predictions_before.csv", "predictions.csv")
    return [f"{s}/{n}" for s in STAGES if not stale.get(s) and (run_dir / s / "metrics.json").is_file()
            for n in names if (run_dir / s / n).is_file()]


def lineage_problems(run_dir: Path) -> dict[str, list[str]]:
    """{stage: why it is not current} for the run's finished stages (`lab.core.lineage.problems`; empty lists
    omitted)."""
    memo: dict = {}
    found = {name: lineage.problems(Path(run_dir), name, memo) for name in STAGES
             if (Path(run_dir) / name / "metrics.json").is_file()}
    return {k: v for k, v in found.items() if v}


def summary(run_dir: Path) -> dict:
    """Write summary.json (every stage's metrics) and summary.md (the headline table); returns the summary."""
    import pandas as pd

    run_dir = Path(run_dir)
    stale = lineage_problems(run_dir)
    stages = headline(run_dir, stale)
    rows = headline_table(run_dir, stages, stale)
    read = read_files(run_dir, stale)
    summ = {"run_dir": str(run_dir), "stages": stages,
            "total_wall_seconds": round(sum(s.get("wall_seconds", 0) for s in stages.values()), 1),
            "headline": rows, "not_current": stale, "read": read}
    atomic_write_json(run_dir / "summary.json", summ)
    def value(v) -> str:
        return f"{v:.3f}" if isinstance(v, float) else "" if v is None else str(v)

    # as text before pandas turns ints into floats
    text = [{**r, "value": value(r["value"]), "n": "" if r["n"] is None else str(int(r["n"]))} for r in rows]
    table = pd.DataFrame(text, columns=["stage", "metric", "value", "ci95", "n", "fixed / broken"])
    table = table.rename(columns={"ci95": "95% interval", "fixed / broken": "fixed / broken vs previous stage"})
    walls = ", ".join(f"{k} {v['wall_seconds']:.0f} s" for k, v in stages.items() if "wall_seconds" in v)
    missing = [k for k, v in stages.items() if v.get("missing")]
    lines = [f"# Run summary: {run_dir.name}", "", table.to_markdown(index=False, disable_numparse=True), "",
             f"Wall time: {summ['total_wall_seconds']:.0f} s ({walls})." if walls else "Wall time: no stage finished."]
    if missing:
        lines.append(f"Stages without a finished output: {', '.join(missing)}.")
    if stale:
        lines += ["", "**Not current** (an input changed after the stage read it, or an output was edited after it "
                  "finished; rerun the stage):", ""]
        lines += [f"- {p}" for found in stale.values() for p in found]
    lines += ["", f"Read (finished and current): {', '.join(read) or 'nothing'}.",
              "Every metric of every stage: `summary.json`; per-step series: each stage's `train_log.csv` and "
              "plots.", ""]
    atomic_write_text(run_dir / "summary.md", "\n".join(lines))
    return summ


def demo_overrides(overrides: list[str]) -> list[str]:
    """`python -m lab demo`'s overrides: into outputs/demo unless a run is named, on the demo's budget
    (`DEMO_OVERRIDE`) unless an experiment is chosen; the user's keys come after, so they win."""
    overrides = overrides if names_run(overrides) else ["run_name=demo", *overrides]
    if not any(o.lstrip("+").split("=", 1)[0].strip() == "experiment" for o in overrides):
        overrides = [DEMO_OVERRIDE, *overrides]
    return overrides


def demo_main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab demo", description="run all five notebooks on the embedded default "
                                "(with experiment=demo's shorter GRPO and voting unless an experiment= is given)")
    p.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. seed=7 run_name=demo_seed7")
    p.add_argument("--stages", nargs="+", default=[], help="subset of stages to run (default: all five); stage "
                   "names and overrides may come in any order")
    p.parse_args(argv)  # usage and help; the words are sorted below, in their command-line order
    stages, overrides = stages_and_overrides([w for w in (sys.argv[1:] if argv is None else argv)
                                              if w not in ("--stages", "--")])
    t0 = time.time()
    run_dir = run_notebooks(demo_overrides(overrides), stages or STAGES)
    summary(run_dir)
    print(f"\nDemo finished in {time.time() - t0:.0f} s.")
    print(f"Executed notebooks: {run_dir / 'notebooks'}")
    print(f"Summary: {run_dir / 'summary.md'} and {run_dir / 'summary.json'}")
    print((run_dir / "summary.md").read_text(encoding="utf-8"))
    return 0


def summary_main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab summary", description="collect a run's stage metrics")
    p.add_argument("run_dir", help="a run directory, e.g. outputs/demo")
    p.add_argument("--force", action="store_true", help="write into a folder without the lab's run marker")
    args = p.parse_args(argv)
    run_dir = owner.check_run_folder(args.run_dir, "summary.md and summary.json", force=args.force)
    if not any(lineage.stage_of(d.name) == d.name and (d / "manifest.json").is_file() for d in run_dir.iterdir()):
        raise LabError(f"{run_dir}: not a run folder (no stage folder such as 01_explore/ with a manifest.json); "
                       "summary.md and summary.json would be written into it, so nothing was written: pass a run "
                       "folder, e.g. outputs/demo")
    summary(run_dir)
    print(f"wrote {run_dir / 'summary.md'} and {run_dir / 'summary.json'}")
    return 0
