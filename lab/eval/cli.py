"""The evaluation commands (`python -m lab score|compare`, registered in `lab/__main__.py`): arguments in, one call,
printing.

  score PREDICTIONS.csv --gold GOLD.csv   the competition's metric (`lab.competition.metric`) over a file, overall and per
                                          category (a `category` column of either file, else the prompts classified)
  compare RUN_A RUN_B                     puzzles fixed and broken between two runs (`lab.eval.analysis.compare`); each
                                          argument a predictions.csv or a run folder (`find_predictions`)

What it simplifies: the commands only parse arguments, call `lab.competition.metric` or `lab.eval.analysis` and
print; every table they print is computed there.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pandas as pd

from lab import LabError
from lab.eval.analysis import compare, load_predictions
from lab.core import owner
from lab.core.io import atomic_write_csv
from lab.competition.metric import VERSIONS, judge, read_table, verify
from lab.core.paths import resolve_path
from lab.puzzles import classify


def find_predictions(arg: str | os.PathLike) -> Path:
    """Resolve a `compare` argument to a predictions file.

    Rule: a file is used as is; for a folder, `<folder>/predictions.csv` if it exists, else the
    newest (modification time, ties broken by path) of `<folder>/*/predictions.csv`, i.e. the
    most recently written stage of that run. Relative paths are tried from the current folder,
    then from the project root. LabError naming the path when nothing is found.
    """
    p = Path(os.path.expanduser(str(arg)))
    if not p.exists() and not p.is_absolute():
        try:
            p = resolve_path(p) if resolve_path(p).exists() else p
        except LabError:  # no checkout (conf/config.yaml) to look in
            pass
    if p.is_file():
        return p
    if not p.exists():
        raise LabError(f"{p}: no such file or run folder")
    if (p / "predictions.csv").is_file():
        return p / "predictions.csv"
    found = [c for c in p.glob("*/predictions.csv") if c.is_file()]
    if not found:
        raise LabError(f"{p}: no predictions.csv in it or in any stage folder (*/predictions.csv)")
    return max(found, key=lambda c: (c.stat().st_mtime, str(c)))


def compare_main(argv: list[str] | None = None) -> int:
    """`python -m lab compare RUN_A RUN_B [--examples N] [--budget B]`: fixed/broken per category."""
    ap = argparse.ArgumentParser(prog="python -m lab compare",
                                 description="Puzzles fixed and broken between two runs. Each argument is a "
                                             "predictions.csv or a run folder (its predictions.csv, else the "
                                             "newest */predictions.csv).")
    ap.add_argument("run_a")
    ap.add_argument("run_b")
    ap.add_argument("--examples", type=int, default=10, help="changed puzzles to list (default 10, 0: none)")
    ap.add_argument("--budget", type=int, default=None, help="token budget: rows at or over it count as truncated")
    args = ap.parse_args(argv)
    pa, pb = find_predictions(args.run_a), find_predictions(args.run_b)
    a, b = load_predictions(pa), load_predictions(pb)
    summary, ex = compare(a, b, budget=args.budget)
    print(f"A: {pa}\nB: {pb}\n")
    for name, path, df in (("A", pa, a), ("B", pb, b)):
        if bad := contradicted(df):
            print(f"WARNING: {name}: {path}: {len(bad)} row(s) whose 'correct' column the competition metric "
                  f"contradicts on their gold and answer (every metric version), e.g. ids {', '.join(bad[:5])}; "
                  f"the comparison counts the file's column: check it with `python -m lab score`\n")
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(summary.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
        only_a, only_b = summary.attrs.get("only_a", []), summary.attrs.get("only_b", [])
        if only_a or only_b:
            print(f"\nnot compared: {len(only_a)} id(s) only in A, {len(only_b)} only in B")
        if args.examples > 0 and len(ex):
            print(f"\nchanged puzzles (first {min(args.examples, len(ex))} of {len(ex)}):")
            print(ex.head(args.examples).to_string(index=False, max_colwidth=40))
    return 0


def contradicted(pred: pd.DataFrame) -> list[str]:
    """Ids of the rows (with a gold answer) whose `correct` value no version of the competition metric gives their
    gold and answer: a hand-edited or foreign predictions file."""
    rows = pred[pred["gold"].astype(str).str.strip() != ""]
    return [str(i) for i, g, a, c in zip(rows["id"], rows["gold"], rows["answer"], rows["correct"])
            if all(bool(verify(g, a, v)) != bool(c) for v in VERSIONS)]


def _categories(gold: pd.DataFrame, pred: pd.DataFrame) -> pd.Series | None:
    """The rows' categories: a `category` column of either file, else the prompts classified, else None."""
    for df in (gold, pred):
        if "category" in df.columns:
            return df["category"]
    for df in (gold, pred):
        if "prompt" in df.columns:
            return df["prompt"].map(lambda prompt: classify(prompt)[0])
    return None


def score_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab score",
                                 description="Score predictions with the competition's metric.")
    ap.add_argument("predictions", help="CSV with id and completion (raw output) or answer (extracted)")
    ap.add_argument("--gold", required=True, help="CSV with id, answer (optionally prompt or category)")
    ap.add_argument("--version", default="final", choices=VERSIONS, help="metric version (default: final)")
    ap.add_argument("--details", default=None, help="write the per-row judgement to this CSV (a new file)")
    ap.add_argument("--force", action="store_true", help="replace --details CSV when it exists")
    ap.add_argument("--column", choices=("completion", "answer"), default=None,
                    help="which predictions column to score when both are present (default: completion)")
    args = ap.parse_args(argv)
    if args.details:
        owner.output_file(args.details, "score --details", args.force, (args.predictions, args.gold), "--details file")

    pred = read_table(args.predictions, ["id"], "predictions")
    have = [c for c in ("completion", "answer") if c in pred.columns]
    if not have:
        raise LabError(f"{args.predictions}: needs a 'completion' (raw output) or 'answer' (extracted) column; "
                       f"columns are {list(pred.columns)}")
    if args.column is not None and args.column not in have:
        raise LabError(f"{args.predictions}: no {args.column!r} column to score; columns are {list(pred.columns)}")
    out_col = args.column or have[0]
    if len(have) == 2:
        print(f"note: {args.predictions} has both 'completion' and 'answer': scoring {out_col!r}"
              + (" (the answer is extracted from it again)" if out_col == "completion" else " as given")
              + f"; --column {'answer' if out_col == 'completion' else 'completion'} scores the other")
    gold = read_table(args.gold, ["id", "answer"], "gold")
    gold_ids, pred_ids = set(gold["id"]), set(pred["id"])
    if gold_ids != pred_ids:
        missing = sorted(gold_ids - pred_ids)
        extra = sorted(pred_ids - gold_ids)
        raise LabError(f"{args.predictions}: ids do not match {args.gold}: {len(missing)} gold id(s) without a "
                       f"prediction {missing[:5]}, {len(extra)} prediction id(s) not in gold {extra[:5]}")
    pred = pred.set_index("id").loc[gold["id"]].reset_index()

    if out_col == "completion":
        table = judge(gold["answer"], pred["completion"], args.version)
    else:
        table = pd.DataFrame({"gold": gold["answer"], "answer": pred["answer"],  # judge's columns, answers as given
                              "correct": [verify(g, a, args.version) for g, a in zip(gold["answer"], pred["answer"])],
                              "source": "given"})
    table.insert(0, "id", gold["id"].values)

    n, k = len(table), int(table["correct"].sum())
    acc = k / n if n else 0.0
    print(f"accuracy ({args.version}): {acc:.4f}  ({k}/{n})")
    cats = _categories(gold, pred)
    if cats is not None:
        table["category"] = cats.values
        per = table.groupby("category", sort=True)["correct"].agg(["mean", "sum", "count"])
        width = max(8, *(len(str(c)) for c in per.index))
        print(f"{'category':<{width}}  accuracy  correct/n")
        for c, r in per.iterrows():
            print(f"{str(c):<{width}}  {r['mean']:.4f}    {int(r['sum'])}/{int(r['count'])}")
    if args.details:
        atomic_write_csv(args.details, table)
        print(f"per-row judgement written to {args.details}")
    return 0
