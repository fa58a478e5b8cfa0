"""The exact prompt Kaggle builds, for any tokenizer with a chat template.

Kaggle appends one fixed instruction line to the puzzle text, sends it as a single user turn
(no system message) and renders it with `add_generation_prompt=True, enable_thinking=True`.
Nemotron-3-Nano's template then writes an empty system turn first, so the real prompt is
`<|im_start|>system\\n<|im_end|>\\n<|im_start|>user\\n{puzzle}\\n{instruction}<|im_end|>\\n`
`<|im_start|>assistant\\n<think>\\n`;
the tiny tokenizer's template (lab.model.models.CHAT_TEMPLATE) renders the same bytes (the prompt tests
hold both against the real template when it is present).
Every stage that generates or trains goes through `chat_prompt`, so train and test prompts
are the same bytes.

What it simplifies:
1. One prompt builder for every stage, and no system message (Kaggle sends none).
2. SFT examples are this prompt text followed by the completion text, never a rendered conversation: the real
   template trims assistant turns and, with `truncate_history_thinking` (its default), drops the reasoning of an
   assistant turn that a user turn follows.
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
