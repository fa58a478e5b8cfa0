"""The puzzles a stage trains and scores on.

  dataset       loading, validating and splitting the competition's puzzle files; the data mix SFT trains on
  curriculum    GRPO's prompt selection (pass rates) and easy-to-hard ordering
  sft_examples  SFT prompt/completion pairs from the solvers' traces (what the trainer and the estimate count)
"""
