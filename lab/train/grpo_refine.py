"""Iterative refinement for GRPO (`grpo.refine`, after iGRPO, arXiv:2602.09000): a TRL `rollout_func`.

Each step samples `num_generations` drafts per prompt with the trainer's own generation, scores them with the
run's rewards as TRL would (`draft_scores`), puts the best draft of each group (first on ties, unscorable last,
`best_drafts`) into the prompt as `chat_prompt(tokenizer, puzzle + REFINE_SUFFIX.format(draft=DRAFT))` with the
draft spliced in as its own token ids (`refine_prompt_ids`), and samples the group's completions from that prompt:
the trainer trains on the refinements only. The trainer's generation is reached through TRL's private API, in
`lab.train.trl_private` only.

What it simplifies:
1. Drafts and refinements each cost a full rollout (no matched budget as in the paper), and they share the context:
   `lab.train.grpo.max_completion_length` halves the budget.
2. Tested on the transformers back-end only.
"""

from __future__ import annotations

import json
import math
from typing import Sequence

import numpy as np

from lab import LabError
from lab.train import trl_private
from lab.competition.prompts import chat_prompt

REFINE_SUFFIX = ("\n\nHere is an earlier attempt at this puzzle:\n<attempt>\n{draft}\n</attempt>\n"
                 "Check the attempt, correct any mistakes, and solve the puzzle again.")
_DRAFT_SLOT = "\x00DRAFT\x00"  # stands where the draft's ids are spliced in


def refine_prompt_text(tokenizer, puzzle: str, draft: str) -> str:
    """The refinement prompt as text: `chat_prompt(tokenizer, puzzle + REFINE_SUFFIX.format(draft=draft))`."""
    return chat_prompt(tokenizer, puzzle + REFINE_SUFFIX.format(draft=draft))


def refine_prompt_ids(tokenizer, puzzle: str, draft_ids: Sequence[int]) -> list[int]:
    """The refinement prompt's token ids: the text around the draft tokenised as TRL tokenises prompts (the part
    before with the tokenizer's special tokens, the part after without), the draft's own ids in between with
    end-of-turn ids removed from its end."""
    pre, post = refine_prompt_text(tokenizer, puzzle, _DRAFT_SLOT).split(_DRAFT_SLOT)
    ids = list(draft_ids)
    ends = {tokenizer.eos_token_id, tokenizer.pad_token_id}
    while ids and ids[-1] in ends:
        ids.pop()
    return list(tokenizer(text=pre)["input_ids"]) + ids + list(tokenizer(post, add_special_tokens=False)["input_ids"])


def draft_scores(funcs, weights: Sequence[float], prompts: list, drafts: list[str], draft_ids: list, rows: list[dict]
                 ) -> list[float]:
    """The weighted reward of each draft as TRL would compute it (nansum over functions of weight * reward); a
    draft every function returns None for scores -inf (it ranks last)."""
    cols = {k: [r[k] for r in rows] for k in rows[0]} if rows else {}
    cols.pop("prompt", None)
    per_func = []
    for f in funcs:
        vals = f(prompts=prompts, completions=drafts, completion_ids=draft_ids, **cols)
        per_func.append([math.nan if v is None else float(v) for v in vals])
    out = []
    for i in range(len(drafts)):
        vals = [w * fv[i] for w, fv in zip(weights, per_func) if not math.isnan(fv[i])]
        out.append(float(sum(vals)) if vals else -math.inf)
    return out


def best_drafts(scores: Sequence[float], group: int) -> list[int]:
    """Per group of `group` consecutive drafts, the index (into `scores`) of the highest score, first on ties."""
    if group < 1 or len(scores) % group:
        raise LabError(f"{len(scores)} draft scores do not split into groups of {group}")
    return [start + int(np.argmax(scores[start:start + group])) for start in range(0, len(scores), group)]


def refine_rollout(tokenizer, funcs, weights, rows_by_prompt: dict[str, dict], records: list[dict]):
    """A TRL `rollout_func` doing iGRPO's drafts, then refinements, with the trainer's own generation (module
    docstring); each chosen draft is appended to `records`."""

    def rollout(prompts: list, trainer) -> dict:
        group = int(trainer.num_generations)
        draft_ids, _ = trl_private.generate(trainer, trl_private.prompt_ids(trainer, prompts), group)  # 1: drafts
        drafts = tokenizer.batch_decode(draft_ids, skip_special_tokens=True)
        rows = [rows_by_prompt[p] for p in prompts]
        scores = draft_scores(funcs, weights, prompts, drafts, draft_ids, rows)
        best = best_drafts(scores, group)
        refined = []
        for b in best:
            ids = refine_prompt_ids(tokenizer, rows[b]["puzzle"], draft_ids[b])
            refined += [ids] * group
            records.append({"step": int(trainer.state.global_step) + 1, "id": rows[b]["id"],
                            "draft_reward": scores[b], "draft_rewards": json.dumps(scores[b - b % group:][:group]),
                            "draft_tokens": len(draft_ids[b]), "draft": drafts[b]})
        completion_ids, logprobs = trl_private.generate(trainer, refined, group)  # 2: refinements
        finite = [s for s in scores if math.isfinite(s)]
        chosen = [scores[b] for b in best if math.isfinite(scores[b])]
        trl_private.log_metric(trainer, "refine/draft_reward_mean", float(np.mean(finite)) if finite else math.nan)
        trl_private.log_metric(trainer, "refine/best_draft_reward_mean", float(np.mean(chosen)) if chosen else math.nan)
        return {"prompt_ids": refined, "completion_ids": completion_ids, "logprobs": logprobs}

    return rollout
