"""Puzzle categories: parsers, solvers with learnable traces, and generators.

Public API (other modules rely on exactly these names):
  CATEGORIES                      the six competition categories, in a fixed order
  Solution                        answer, status ('solved'|'ambiguous'|'undetermined'), trace, category, subtype, reason
  classify(prompt) -> (category, subtype)   'unknown' when not recognised, never a guess
  solve(prompt) -> Solution       never raises on malformed input
  generate(category, n, seed, **difficulty) -> DataFrame[id, prompt, answer, category, subtype]

`Solution.trace` is the whole assistant completion that follows the chat template's `<think>\n`:
short regular steps, then `</think>`, then `\boxed{answer}`.

`solve(prompt, style="derivation")` writes the trace as the solver's search, one checked step a line
(the category's `derive`); the answer and status are the same in both styles. `check` replays traces line by line.

Also: trace_tokens(trace, tokenizer=None), solve_frame(df, tokenizer=None, style=...), token_table(solved)
(p50/p90/p99/max trace tokens per category and style), method_table(solved), family_table(solved)
(equations by kind, family and mode), and the command line `python -m lab puzzles solve IN.csv OUT.csv
[--trace-style derivation] [--tokenizer DIR]` / `python -m lab puzzles check OUT.csv` /
`python -m lab puzzles generate --category C --n N --seed S OUT.csv`.
Modules: categories (the registry and `classify`: a new category is one module plus one line there),
common (Solution, Category, trace ending), solve (dispatch: solve, derivation, replay), generate, check (the
trace grammar and its replay, shared by every category), audit (where every operand of a trace comes from),
cli (`python -m lab puzzles ...`), and one per category, each defining its `CATEGORY`: bits (solver in bitrules,
the competition's bit layout in bitlayout), gravity and units (sharing factor), cipher, numeral, equations
(solvers in eqsolve, the symbolic written search in eqsearch). The solvers' figures and the trace styles:
lab/puzzles/README.md.
"""

from .categories import CATEGORIES, classify
from .common import Solution
from .eqsolve import family_table
from .generate import generate
from .solve import batch_inputs, method_table, solve, solve_frame, token_table, trace_tokens

__all__ = ["CATEGORIES", "Solution", "batch_inputs", "classify", "solve", "generate", "solve_frame", "method_table",
           "family_table", "trace_tokens", "token_table"]
