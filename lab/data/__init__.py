"""The puzzles a stage trains and scores on.

  dataset     loading, validating and splitting the competition's puzzle files; the data mix SFT trains on
  curriculum  GRPO's prompt selection (pass rates) and easy-to-hard ordering
"""
