"""Puzzle categories: parsers, solvers with learnable traces, and generators.

Public API for notebooks and users (lab's own modules import each name from the module that defines it):
  CATEGORIES                      the six competition categories, in a fixed order
  Solution                        answer, status ('solved'|'ambiguous'|'undetermined'), trace, category, subtype, reason
  classify(prompt) -> (category, subtype)   'unknown' when not recognised, never a guess
  solve(prompt) -> Solution       never raises on malformed input
  generate(category, n, seed, **difficulty) -> DataFrame[id, prompt, answer, category, subtype]
`Solution.trace` is the whole assistant completion after the chat template's `<think>\n`: short regular steps, then
`</think>`, then `\boxed{answer}`; `solve(prompt, style="derivation")` writes the solver's search, one checked step
a line, and `check` replays traces line by line. A new category is one module plus one line in `categories`.
The other helpers, the command line and each module's part: docs/internals.md, lab.puzzles; the solvers' figures
and the trace styles: lab/puzzles/README.md.
"""

from .categories import CATEGORIES, classify
from .common import Solution
from .eqsolve import family_table
from .generate import generate
from .solve import batch_inputs, method_table, solve, solve_frame, token_table, trace_tokens

__all__ = ["CATEGORIES", "Solution", "batch_inputs", "classify", "solve", "generate", "solve_frame", "method_table",
           "family_table", "trace_tokens", "token_table"]
