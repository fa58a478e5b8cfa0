"""Puzzle categories: parsers, solvers with learnable traces, and generators (see issue 4).

Public API (other modules rely on exactly these names):
  CATEGORIES                      the six competition categories, in a fixed order
  Solution                        answer, status ('solved'|'ambiguous'|'undetermined'), trace, category, subtype, reason
  classify(prompt) -> (category, subtype)   'unknown' when not recognised, never a guess
  solve(prompt) -> Solution       never raises on malformed input
  generate(category, n, seed, **difficulty) -> DataFrame[id, prompt, answer, category, subtype]

`Solution.trace` is the whole assistant completion that follows the chat template's `<think>\n`:
short regular steps, then `</think>`, then `\boxed{answer}`.
"""
