"""SFT examples: each puzzle's chat prompt paired with its solver trace, kept only when the metric accepts the answer.

Built here, below training, so that the SFT trainer (`lab.train.sft`) and the SFT time estimate (`lab.plan.estimate`)
count the same rows without the estimate importing a trainer.
"""

from __future__ import annotations

import pandas as pd

from lab.competition.prompts import chat_prompt

EXAMPLE_COLUMNS = ["id", "category", "prompt", "completion", "tokens"]


def sft_examples(tokenizer, puzzles: pd.DataFrame, max_seq_len: int,
                 style: str | dict = "compact") -> tuple[pd.DataFrame, dict]:
    """Prompt/completion pairs from solver traces whose answer the competition metric accepts.

    prompt = the exact Kaggle prompt rendered by the chat template (ends with `<think>\\n`);
    completion = the solver trace in `style` (`data.trace_style`; reasoning, `</think>`, `\\boxed{answer}`) + the
    end-of-turn token. `style` may be {category: style} (`data.trace_styles`; a category it does not name: compact).
    Returns the examples and counts of what was kept, not solved, wrong, or too long. Each category's batch input
    (the cipher's pooled vocabulary, the equations' priors) comes from the frame's prompts, as in `solve_frame`.
    """
    from lab.competition.metric import verify
    from lab.puzzles.categories import classify
    from lab.puzzles.solve import batch_inputs, solve

    inputs = batch_inputs(puzzles["prompt"])
    rows, counts = [], {"puzzles": len(puzzles), "kept": 0, "unsolved": 0, "solver_wrong": 0, "overlong": 0}
    for _, row in puzzles.iterrows():
        cat = row.get("category", "") or classify(row["prompt"])[0]
        sol = solve(row["prompt"], style=style if isinstance(style, str) else style.get(cat, "compact"), **inputs)
        if sol.status != "solved":
            counts["unsolved"] += 1
            continue
        if "answer" in row and not verify(str(row["answer"]), sol.answer):
            counts["solver_wrong"] += 1
            continue
        prompt, completion, n_tok = chat_example(tokenizer, row["prompt"], sol.trace)
        if n_tok > max_seq_len:
            counts["overlong"] += 1
            continue
        rows.append({"id": row["id"], "category": cat, "prompt": prompt, "completion": completion, "tokens": n_tok})
        counts["kept"] += 1
    return pd.DataFrame(rows, columns=EXAMPLE_COLUMNS), counts


def chat_example(tokenizer, question: str, answer: str) -> tuple[str, str, int]:
    """(prompt, completion, tokens): `question`'s chat prompt, `answer` + end-of-turn token, and their token count."""
    prompt = chat_prompt(tokenizer, question)
    completion = answer + tokenizer.eos_token
    return prompt, completion, len(tokenizer(prompt + completion, add_special_tokens=False)["input_ids"])
