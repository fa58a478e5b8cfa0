"""01_explore: the split, what the solvers answer on the training puzzles, trace lengths in the model's tokens,
the trace audit, one trace per category. `explore` runs the steps below in order; notebooks/01_explore.ipynb runs
the same steps as cells."""

from __future__ import annotations

import dataclasses

import pandas as pd

from lab.core.io import atomic_write_csv
from lab.core.run import Stage
from lab.recipes import common

def explore(stage: Stage) -> dict:
    """The whole stage: `explore_split`, `explore_solvers`, `explore_audit`, `explore_finish`."""
    train, val, counts = explore_split(stage)
    solved = explore_solvers(stage, train)
    audit = explore_audit(stage, solved)
    return explore_finish(stage, train, val, counts, solved, audit)


def explore_split(stage: Stage) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(train, val, counts): the split (`split`) and its puzzles per category, subtype and split
    (`categories.csv`)."""
    train, val = common.split(stage)
    counts = (pd.concat([train.assign(split="train"), val.assign(split="val")])
              .groupby(["category", "subtype", "split"]).size().unstack("split", fill_value=0).reset_index())
    atomic_write_csv(stage.path("categories.csv"), counts)
    return train, val, counts


@dataclasses.dataclass
class Solved:
    """What `explore_solvers` found: the sample of training puzzles, one solver row per puzzle, the trace style and
    the tokenizer counted with, the status, method and equation-family tables, the token table, the histogram."""
    sample: pd.DataFrame
    solved: pd.DataFrame
    style: str
    counter: object
    status: pd.DataFrame
    methods: pd.DataFrame
    families: pd.DataFrame
    tokens: pd.DataFrame
    figure: object


@dataclasses.dataclass
class Audit:
    """What `explore_audit` found: the audit per category, the line shapes, the referential breaks, one trace per
    category."""
    audit: pd.DataFrame
    shapes: pd.DataFrame
    breaks: pd.DataFrame
    examples: pd.DataFrame


def explore_solvers(stage: Stage, train: pd.DataFrame) -> Solved:
    """The solvers over at most `data.explore_max` training puzzles, with trace lengths in tokens of the model's
    tokenizer (`data.tokenizer_path` when set). Writes `solver_status.csv`, `solver_methods.csv`,
    `solver_equation_families.csv`, `trace_tokens.png`, `trace_tokens.csv` (both trace styles, against the
    budget)."""
    from lab import puzzles
    from lab.core import plots
    from lab.data import dataset as data
    from lab.model import models

    cfg = stage.cfg
    tokenizer = models.load_tokenizer(cfg)
    counter = data.count_tokenizer(cfg, tokenizer)  # data.tokenizer_path when set, else the model's own tokenizer
    style = data.trace_style(cfg)  # the style SFT trains on
    sample = train.sample(n=min(cfg.data.explore_max, len(train)), random_state=cfg.seed)
    solved = puzzles.solve_frame(sample, tokenizer=counter, style=style)
    status = solved.groupby(["category", "status"]).size().unstack("status", fill_value=0).reset_index()
    methods, families = puzzles.method_table(solved), puzzles.family_table(solved)
    atomic_write_csv(stage.path("solver_status.csv"), status)
    atomic_write_csv(stage.path("solver_methods.csv"), methods)
    atomic_write_csv(stage.path("solver_equation_families.csv"), families)
    fig = common.save_figure(stage, plots.histogram(solved, "trace_tokens", "category", "Solver trace length",
                                                    "tokens (model tokenizer)"), "trace_tokens.png")
    # both styles, counted as the completion the scorer sees, against the budget
    other = "compact" if style == "derivation" else "derivation"
    both = pd.concat([solved.assign(trace_style=style),
                      puzzles.solve_frame(sample, tokenizer=counter, style=other).assign(trace_style=other)])
    tokens = puzzles.token_table(both)
    atomic_write_csv(stage.path("trace_tokens.csv"), tokens)
    return Solved(sample=sample, solved=solved, style=style, counter=counter, status=status, methods=methods,
                  families=families, tokens=tokens, figure=fig)


def explore_audit(stage: Stage, solved: Solved) -> Audit:
    """The trace audit of `explore_solvers`' traces (`lab.puzzles.audit.audit_frame`; `python -m lab puzzles audit`
    prints the same) and one trace per category. Writes `trace_audit.csv`, `trace_shapes.csv`,
    `trace_examples.csv`."""
    from lab.puzzles.audit import audit_frame

    audit, shapes, breaks = audit_frame(solved.solved.assign(prompt=solved.sample["prompt"].tolist(),
                                                             trace_style=solved.style), solved.counter)
    atomic_write_csv(stage.path("trace_audit.csv"), audit)
    atomic_write_csv(stage.path("trace_shapes.csv"), shapes)
    examples = solved.solved.groupby("category").head(1)[["category", "status", "trace"]].sort_values("category")
    atomic_write_csv(stage.path("trace_examples.csv"), examples)
    return Audit(audit=audit, shapes=shapes, breaks=breaks, examples=examples)


def explore_finish(stage: Stage, train: pd.DataFrame, val: pd.DataFrame, counts: pd.DataFrame, solved: Solved,
                   audit: Audit) -> dict:
    """01_explore's metrics.json from the steps' results; finishes the stage."""
    s = solved.solved
    metrics = {
        "n_train": len(train), "n_val": len(val),
        "per_category": counts.groupby("category")[["train", "val"]].sum().to_dict("index"),
        "solver_solved_share": float((s["status"] == "solved").mean()),
        "trace_tokens_mean": float(s["trace_tokens"].mean()),
        "trace_ref_breaks": len(audit.breaks),
    }
    if "correct" in s:
        metrics["solver_accuracy"] = float(s["correct"].mean())
    return stage.finish(metrics)
