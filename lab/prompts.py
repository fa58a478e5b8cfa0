"""The exact prompt Kaggle builds, for any tokenizer with a chat template.

Kaggle appends one fixed instruction line to the puzzle text, sends it as a single user turn
(no system prompt) and renders it with `add_generation_prompt=True, enable_thinking=True`.
Every stage that generates or trains goes through `chat_prompt`, so train and test prompts
are the same bytes.
"""

from __future__ import annotations

BOXED_INSTRUCTION = "Please put your final answer inside `\\boxed{}`. For example: `\\boxed{your answer}`"


def user_message(puzzle: str) -> str:
    """The user turn's text: the puzzle, a new line, the boxed-answer instruction."""
    return f"{puzzle}\n{BOXED_INSTRUCTION}"


def chat_prompt(tokenizer, puzzle: str) -> str:
    """The full rendered prompt string the model continues from (ends with the thinking opener)."""
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": user_message(puzzle)}],
        tokenize=False,
        add_generation_prompt=True,
        enable_thinking=True,
    )
