"""One recipe per notebook: each module is its notebook's steps, in order, called by the notebook cell by cell and
by the stage function (and its script), so a notebook and its script write the same files and metrics.

  common   opening a stage, the split, figures shown inline, the cached greedy evaluation, the adapter packed
  explore  01_explore     sft  02_sft     grpo  03_grpo     vote  04_vote     errors  05_errors

The package imports none of them: import the one you use (`from lab.recipes import common, sft as recipe`).
"""
