"""Judging completions: voting, error analysis, and the commands that score runs.

  sampling  completions drawn for a puzzle table and scored (the table every evaluation reads), with their cache
  greedy    greedy evaluations cached by what they depend on, and two compared per category
  vote      inference-time voting over sampled completions, and the pass@k / maj@k curves that judge it
  analysis  error analysis of one evaluation run (accuracy by category, failure taxonomy), and two runs compared
  cli       `python -m lab score` and `python -m lab compare`
"""
