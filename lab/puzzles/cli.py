"""`python -m lab puzzles solve IN.csv OUT.csv [--trace-style derivation] [--tokenizer DIR]`,
`python -m lab puzzles check SOLVED.csv`, `python -m lab puzzles audit SOLVED.csv [--tokenizer DIR]` and
`python -m lab puzzles generate --category C --n N --seed S OUT.csv`.

solve: reads IN (columns prompt, optional id and gold answer; read as strings), writes OUT with id,
category, subtype, status, method, answer, trace_tokens, reason, seconds, trace, trace_style, prompt (and
correct when IN has answers), prints per-category counts, statuses, accuracy (if answers) and puzzles per
second, trace tokens p50/p90/p99/max against the 7,680 budget, then the same per solver method (on the
real file, which rule levels and meanings its puzzles use) and, for equations, per kind, family and mode.
check: replays every solved row's trace against its prompt (`lab.puzzles.check`), prints the share that
replays per category and style and the first failing line of each failure; exit 1 unless all replay.
audit: per category, where every operand of every solved trace comes from (prompt, an earlier line, or
hidden), how far back in tokens, recall and choice lines, and the share of traces each line shape appears
in (`lab.puzzles.audit`); exit 1 on a referential break (a value cited before it appears).
generate: writes a generated frame; difficulty knobs as `--set key=value` (repeatable).
"""

from __future__ import annotations

import argparse
import sys

from lab import LabError
from lab.core.schema import COMPETITION
from lab.core import owner
from lab.core.io import atomic_write_csv

from .eqsolve import family_table
from .solve import method_table, token_table


def _read_csv(path: str):
    """The puzzles, read as `score` reads its files (clear errors for a missing, empty, non-UTF-8 or unreadable
    file, a missing `prompt` column, duplicate ids); without an `id` column the rows are numbered, and it says so."""
    from lab.competition.metric import read_table

    df = read_table(path, ["prompt"], "puzzle")
    if df.empty:
        raise LabError(f"{path}: no rows under the header")
    if "id" not in df.columns:
        print(f"note: {path} has no 'id' column: the output numbers the rows 0..{len(df) - 1} in file order",
              file=sys.stderr)
    return df


def summary(out, has_gold: bool) -> str:
    rows = []
    for cat, g in out.groupby("category", sort=True):
        st = g["status"].value_counts()
        row = {"category": cat, "n": len(g), "solved": int(st.get("solved", 0)),
               "ambiguous": int(st.get("ambiguous", 0)), "undetermined": int(st.get("undetermined", 0)),
               "puzzles/s": round(len(g) / max(g["seconds"].sum(), 1e-9), 1),
               "mean_trace_tokens": round(g["trace_tokens"].mean(), 1)}
        if has_gold:
            row["accuracy"] = round(g["correct"].mean(), 4)
            row["acc_solved"] = round(g.loc[g["status"] == "solved", "correct"].mean(), 4) if row["solved"] else None
        rows.append(row)
    import pandas as pd

    table = pd.DataFrame(rows)
    text = table.to_string(index=False)
    if has_gold:
        text += f"\noverall accuracy: {out['correct'].mean():.4f} ({int(out['correct'].sum())}/{len(out)})"
    text += "\n(trace_tokens: " + ("tokenizer count)" if _TOK else "ESTIMATE, no tokenizer given)")
    text += f"\n\ntrace tokens (budget {COMPETITION.max_tokens:,}):\n" + token_table(out).to_string(index=False)
    by_method = method_table(out)
    text += "\n\nby method (what answered: bits, the rule level; cipher, the word source; equations, mode and " \
        "meaning, the subtraction's marker form included):\n" \
        + (by_method.to_string(index=False) if len(by_method) else "(no puzzle of a category with several methods)")
    by_family = family_table(out)
    if len(by_family):
        text += "\n\nequations by kind, the query operator's family and mode:\n" + by_family.to_string(index=False)
    return text


_TOK = None


def check_command(path: str, show: int = 20) -> int:
    from lab.competition.metric import read_table

    from .solve import check_frame

    df = read_table(path, ["prompt", "category", "status", "trace"], "solve output")
    rows, summary = check_frame(df)
    print(summary.to_string(index=False) if len(summary) else "(no solved rows)")
    bad = rows[~rows["ok"]]
    for _, r in bad.head(show).iterrows():
        print(f"FAIL {r['id']} ({r['category']}, {r['style']}) line {r['line']}: {r['message']}")
    if len(bad) > show:
        print(f"... {len(bad) - show} more failures")
    print(f"{len(rows) - len(bad)}/{len(rows)} solved traces replay")
    return 0 if len(bad) == 0 else 1


def main(argv: list[str] | None = None) -> int:
    global _TOK
    ap = argparse.ArgumentParser(prog="python -m lab puzzles", description="the per-category solvers on a puzzle CSV "
                                 "(id, prompt[, answer]): solve it, replay or audit the traces, or generate puzzles")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("solve", help="solve every prompt of a CSV")
    s.add_argument("inp", help="puzzle CSV with a prompt column (and answer, to score the solvers)")
    s.add_argument("out", help="CSV to write: each puzzle's category, status, method, answer, trace and its tokens")
    s.add_argument("--force", action="store_true", help="replace OUT when it exists")
    s.add_argument("--tokenizer", default=None, help="local tokenizer folder for exact trace token counts")
    s.add_argument("--trace-style", default="compact", choices=["compact", "derivation"],
                   help="compact: the rule and its answer; derivation: the search written out "
                        "(default: %(default)s)")
    c = sub.add_parser("check", help="replay every solved trace of a `solve` output")
    c.add_argument("solved", help="a `puzzles solve` output CSV")
    c.add_argument("--show", type=int, default=20, help="failures to print")
    a = sub.add_parser("audit", help="operand provenance, distance and recalls of every solved trace")
    a.add_argument("solved", help="a `puzzles solve` output CSV")
    a.add_argument("--tokenizer", default=None, help="local tokenizer folder: distances in its tokens")
    a.add_argument("--show", type=int, default=20, help="referential breaks to print")
    g = sub.add_parser("generate", help="write generated puzzles to a CSV")
    g.add_argument("--category", required=True,
                   help="the category to generate, e.g. numeral_system (lab.puzzles.categories)")
    g.add_argument("--n", type=int, required=True, help="number of puzzles")
    g.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    g.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="difficulty knob")
    g.add_argument("out", help="CSV to write (id, prompt, answer, category, subtype)")
    g.add_argument("--force", action="store_true", help="replace OUT when it exists")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "solve":
            from .solve import solve_frame

            owner.output_file(args.out, "puzzles solve", args.force, (args.inp, args.tokenizer), "solved CSV")
            df = _read_csv(args.inp)
            _TOK = args.tokenizer
            out = solve_frame(df, tokenizer=args.tokenizer, style=args.trace_style)
            out["trace_style"] = args.trace_style
            out["prompt"] = df["prompt"].tolist()
            atomic_write_csv(args.out, out)
            print(summary(out, "correct" in out.columns))
            print(f"wrote {args.out}")
        elif args.cmd == "check":
            return check_command(args.solved, args.show)
        elif args.cmd == "audit":
            from .audit import audit_command

            return audit_command(args.solved, args.tokenizer, args.show)
        else:
            from .generate import generate, knob_problems

            if args.n < 1:
                raise LabError(f"generate --n {args.n}: the number of puzzles must be 1 or more")
            owner.output_file(args.out, "puzzles generate", args.force, what="puzzles CSV")
            knobs = {}
            for kv in args.set:
                k, _, v = kv.partition("=")
                try:
                    knobs[k] = int(v) if v.lstrip("-").isdigit() else float(v)
                except ValueError:
                    knobs[k] = v
            try:
                if found := knob_problems(args.category, knobs, "--set "):
                    raise LabError("; ".join(found) + " (nothing was written)")
                df = generate(args.category, args.n, args.seed, **knobs)
            except ValueError as e:
                raise LabError(str(e)) from None
            atomic_write_csv(args.out, df)
            print(f"wrote {len(df)} puzzles to {args.out}")
    except LabError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0

