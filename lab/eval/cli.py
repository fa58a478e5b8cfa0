"""The evaluation commands, `python -m lab score|compare`: arguments in, one call, printing.

  score PREDICTIONS.csv --gold GOLD.csv   the competition's metric over a file, overall and per category
  compare RUN_A RUN_B                     puzzles fixed and broken between two runs (`lab.eval.analysis.compare`);
                                          each a predictions.csv or a run folder (`find_predictions`)
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pandas as pd

from lab import LabError
from lab.eval.analysis import compare, load_predictions
from lab.core import lineage, owner
from lab.core.io import atomic_write_csv
from lab.competition.metric import VERSIONS, judge, read_table, verify
from lab.core.paths import resolve_path
from lab.puzzles import classify


def find_predictions(arg: str | os.PathLike) -> tuple[Path, str]:
    """Resolve a `compare` argument to a predictions file and a note saying why that one.

    Rule: a file is used as is (one inside a run's stage folder only when that stage is finished and current); for a
    stage folder, its predictions.csv when the stage is finished and current; for a run folder, the predictions.csv of
    its last stage (by number: 04_vote, then 03_grpo, then 02_sft) that is finished and current
    (`lab.core.lineage.problems`); an attempt that did not finish (`.NN_name.partial/`) is never read. Relative
    paths are tried from the current folder, then from the project root. LabError naming the path and what was
    skipped when nothing is found.
    """
    p = Path(os.path.expanduser(str(arg)))
    if not p.exists() and not p.is_absolute():
        try:
            p = resolve_path(p) if resolve_path(p).exists() else p
        except LabError:  # no checkout (conf/config.yaml) to look in
            pass
    if not p.exists():
        raise LabError(f"{p}: no such file or run folder")
    if any(part.startswith(".") and part.endswith(".partial") for part in p.resolve().parts):
        raise LabError(f"{p}: lies in a stage attempt that did not finish (.partial); pass the run folder or a "
                       "finished stage's predictions.csv")
    stage_dir = p.parent if p.is_file() else p
    if lineage.stage_of(stage_dir.name) == stage_dir.name and (stage_dir / "manifest.json").exists():
        if not (stage_dir / "metrics.json").is_file() or (found := lineage.problems(stage_dir.parent, stage_dir.name)):
            why = "not finished" if not (stage_dir / "metrics.json").is_file() else "; ".join(found)
            raise LabError(f"{p}: stage {stage_dir.name} is not finished and current ({why}); rerun it or pass "
                           "another file")
        if p.is_file():
            return p, f"stage {stage_dir.name}, finished and current"
    if p.is_file():
        return p, "the file given"
    if (p / "predictions.csv").is_file():
        return p / "predictions.csv", f"stage {p.name}, finished and current" if lineage.stage_of(p.name) == p.name \
            else "the folder's predictions.csv"
    skipped = []
    memo: dict = {}
    for d in sorted((d for d in p.iterdir() if lineage.stage_of(d.name) == d.name), reverse=True):
        if not (d / "predictions.csv").is_file():
            continue
        if not (d / "metrics.json").is_file():
            skipped.append(f"{d.name} (not finished)")
        elif found := lineage.problems(p, d.name, memo):
            skipped.append(f"{d.name} (not current: {found[0]})")
        else:
            note = f"{d.name}, the last finished and current stage with predictions"
            return d / "predictions.csv", note + (f"; skipped {', '.join(skipped)}" if skipped else "")
    raise LabError(f"{p}: no finished and current stage with a predictions.csv"
                   + (f" (skipped {'; '.join(skipped)})" if skipped else " (no */predictions.csv)"))


def compare_main(argv: list[str] | None = None) -> int:
    """`python -m lab compare RUN_A RUN_B [--examples N] [--budget B]`: fixed/broken per category."""
    ap = argparse.ArgumentParser(prog="python -m lab compare",
                                 description="Puzzles fixed and broken between two runs. Each argument is a "
                                             "predictions.csv or a run folder (the predictions of its last "
                                             "finished and current stage).")
    ap.add_argument("run_a")
    ap.add_argument("run_b")
    ap.add_argument("--examples", type=int, default=10, help="changed puzzles to list (default 10, 0: none)")
    ap.add_argument("--budget", type=int, default=None, help="token budget: rows at or over it count as truncated")
    args = ap.parse_args(argv)
    (pa, why_a), (pb, why_b) = find_predictions(args.run_a), find_predictions(args.run_b)
    a, b = load_predictions(pa), load_predictions(pb)
    summary, ex = compare(a, b, budget=args.budget)
    print(f"A: {pa} ({why_a})\nB: {pb} ({why_b})\n")
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
        if Path(args.details).is_dir():
            raise LabError(f"--details {args.details}: is a folder; name the CSV file to write, e.g. "
                           f"{Path(args.details) / 'details.csv'}")
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
    if empty := [str(i) for i, a in zip(gold["id"], gold["answer"]) if not str(a).strip()]:
        raise LabError(f"{args.gold}: {len(empty)} row(s) with an empty gold answer (ids {', '.join(empty[:5])}); "
                       "an empty answer cannot be scored (an empty prediction would count as correct): fill or drop "
                       "them")
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
