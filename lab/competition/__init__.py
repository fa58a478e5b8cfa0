"""The competition's own rules, reproduced to the character.

  metric    the scorer: answer extraction, comparison, accuracy (`python -m lab score`)
  prompts   the exact prompt Kaggle builds, for any tokenizer with a chat template
"""
