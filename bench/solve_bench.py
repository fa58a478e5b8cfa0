"""Solver throughput on a competition-sized batch: 9,500 generated puzzles, the six categories in equal shares
(half the equations symbolic, a fifth with an operator the examples never show).

Prints the wall seconds for the whole batch through `lab.puzzles.solve_frame` (the process pool
the `solve` command uses) and the CPU seconds it took (user and system, this process and its
workers: on a machine shared with other work, wall time alone says little), how many symbolic
equations stopped at the search's time or solution cap, and, per category, the CPU milliseconds
per puzzle (200 solved one by one) and accuracy against the generators' answers. The real train.csv
is not in the repository; with it, run
`python -m lab puzzles solve data/train.csv out.csv` for the real figures.

Also:
- bit puzzles by rule complexity, 3 to 8: the named three-copy rules, 2-3 step pipelines, any
  function of three copies, a one- or two-copy rule then a constant mask, an XOR of four or five
  copies, any function of four copies;
- cipher puzzles whose vocabulary the solver's built-in word list does not know (every word spelled
  backwards, which keeps the letter key valid), solved one by one and as one batch, where the
  vocabulary pooled from all examples fills the gaps: how much a file's own examples make up for
  an unknown vocabulary.

Deliberately simple: generated puzzles are drawn from the same rule spaces the solvers search,
so the accuracy here is an upper bound; the timing is what this script is for.
"""

from __future__ import annotations

import re
import resource
import sys
import time

import pandas as pd

from lab.core.io import atomic_write_json
from lab.core.paths import project_root
from lab.puzzles import CATEGORIES, generate, solve, solve_frame

N = 9500
N_CIPHER = 1600  # about the real file's share of cipher puzzles


def backwards(text: str) -> str:
    """Every lower-case word spelled backwards (a cipher puzzle stays valid: same letter key)."""
    return re.sub(r"[a-z]+", lambda m: m.group(0)[::-1], text)


def backwards_prompt(prompt: str) -> str:
    """A cipher prompt with its examples and query spelled backwards, its wording kept."""
    head, *examples, last = prompt.split("\n")
    ask, query = last.rsplit(": ", 1)
    return "\n".join([head, *map(backwards, examples), f"{ask}: {backwards(query)}"])


def unknown_vocabulary(n_examples: int) -> dict:
    """Accuracy and solved share on backwards-vocabulary cipher puzzles, one by one and pooled."""
    df = generate("text_cipher", N_CIPHER, seed=7, n_examples=n_examples)
    df["prompt"] = [backwards_prompt(p) for p in df["prompt"]]
    df["answer"] = [backwards(a) for a in df["answer"]]
    alone = [solve(p) for p in df["prompt"]]
    pooled = solve_frame(df, progress=False)
    return {"n_examples": n_examples, "n": len(df),
            "accuracy_alone": round(sum(s.answer == a for s, a in zip(alone, df["answer"])) / len(df), 4),
            "accuracy_pooled": round(float(pooled["correct"].mean()), 4),
            "solved_alone": round(sum(s.status == "solved" for s in alone) / len(df), 4),
            "solved_pooled": round(float((pooled["status"] == "solved").mean()), 4)}


def _cpu() -> tuple[float, float]:
    """(user, system) CPU seconds of this process and its finished children (the pool's workers)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + kids.ru_utime, me.ru_stime + kids.ru_stime


def main() -> int:
    per = N // len(CATEGORIES)
    opts = {"equation_transformation": {"symbolic": 0.5, "guess": 0.2}}  # half symbolic, the slow kind
    df = pd.concat([generate(c, per + (1 if i < N % len(CATEGORIES) else 0), seed=2026, **opts.get(c, {}))
                    for i, c in enumerate(CATEGORIES)], ignore_index=True)
    cpu0 = _cpu()
    t0 = time.time()
    out = solve_frame(df)
    wall = time.time() - t0
    user, system = (b - a for a, b in zip(cpu0, _cpu()))
    sym = out[out["subtype"].str.startswith("symbolic")]
    caps = {"n_symbolic": len(sym), "time_cap": int(sym["reason"].str.contains("time cap").sum()),
            "solution_cap": int(sym["reason"].str.contains("solution cap").sum()),
            "max_wall_seconds": round(float(sym["seconds"].max()), 2),
            "mean_wall_seconds": round(float(sym["seconds"].mean()), 3)}
    rows = []
    for cat, g in df.groupby(df["category"] + df["subtype"].map(lambda s: f"/{s.split('_')[0]}" if s else "")):
        t = time.process_time()  # CPU seconds: other work on a shared machine does not inflate them
        for p in g["prompt"].head(200):
            solve(p)
        per_puzzle = (time.process_time() - t) / min(200, len(g))
        o = out.loc[g.index]
        rows.append({"category": cat, "n": len(g), "accuracy": round(float(o["correct"].mean()), 4),
                     "solved_share": round(float((o["status"] == "solved").mean()), 4),
                     "cpu_ms_per_puzzle": round(per_puzzle * 1000, 2),
                     "est_cpu_seconds": round(per_puzzle * len(g), 1)})
    table = pd.DataFrame(rows).sort_values("est_cpu_seconds", ascending=False)
    print(f"solved {len(df)} puzzles in {wall:.1f} s wall (solve_frame, process pool), "
          f"{user:.1f} s user + {system:.1f} s system CPU")
    print(f"symbolic equations: {caps['n_symbolic']}, stopped at the time cap {caps['time_cap']}, at the solution cap "
          f"{caps['solution_cap']}; slowest {caps['max_wall_seconds']} s wall, mean {caps['mean_wall_seconds']} s")
    print(table.to_string(index=False))
    hard = []
    for c in (3, 4, 5, 6, 7, 8):  # past the default: named three-copy rules, pipelines, tables, masks, XOR of 4-5, tables of 4
        g = generate("bit_manipulation", 400, seed=21, complexity=c, n_examples=8)
        o = solve_frame(g, progress=False)
        hard.append({"complexity": c, "n": len(g), "accuracy": round(float(o["correct"].mean()), 4),
                     "solved_share": round(float((o["status"] == "solved").mean()), 4),
                     "solved_but_wrong": int(((o["status"] == "solved") & ~o["correct"]).sum()),
                     "ms_per_puzzle": round(1000 * float(o["seconds"].mean()), 2)})
    print("\nbit manipulation by rule complexity (8 examples each):")
    print(pd.DataFrame(hard).to_string(index=False))
    vocab = [unknown_vocabulary(k) for k in (2, 3, 4)]
    print("\ncipher, vocabulary unknown to the solver (words spelled backwards), one by one vs pooled over the batch:")
    print(pd.DataFrame(vocab).to_string(index=False))
    atomic_write_json(project_root() / "outputs" / "bench" / "solve_bench.json",
                      {"n": len(df), "wall_seconds": round(wall, 1), "user_seconds": round(user, 1),
                       "system_seconds": round(system, 1), "symbolic_caps": caps, "per_category": rows,
                       "bits_by_complexity": hard, "cipher_unknown_vocabulary": vocab})
    return 0


if __name__ == "__main__":
    sys.exit(main())
