r"""GRPO reward functions, in the style of open-r1's rewards.py: plain functions in a registry, options per reward.

`REWARDS` maps a name to a function with TRL 1.15 GRPOTrainer's reward signature
``f(prompts, completions, completion_ids=None, **kwargs) -> list[float | None]``. `build(weights, ...)`
turns the config's ``grpo.rewards`` mapping (name -> weight) into what the trainer takes:
``GRPOTrainer(reward_funcs=funcs, args=GRPOConfig(reward_weights=weights, ...))``, each function a
`Reward` with only its own options bound (as open-r1's reward factories bind theirs).

What TRL 1.15 passes (read in ``trl/trainer/grpo_trainer.py``, ``_calculate_rewards``): keywords
``prompts`` (list), ``completions`` (for the lab's plain-text dataset, `lab.train.grpo.build_dataset`, the
strings decoded with ``skip_special_tokens=True``; a conversational dataset's message lists are not
accepted), ``completion_ids`` (lists of token ids, unpadded; a
finished completion ends with its EOS token, a truncated one does not), every dataset column but
``prompt``/``completion``/``completion_ids`` as a list aligned with the completions (here ``answer``,
``solver_trace``, ``category``, ...), and ``trainer_state`` (transformers' TrainerState),
``log_extra`` and ``log_metric`` (logging callbacks), plus ``environments`` when environments are
used. A function may return ``None`` for a completion: TRL stores it as NaN, which drops that
function's term for that completion (the weighted sum is a ``nansum``); only when EVERY function
returns None for a completion is it "unscorable": excluded from the group's mean and std and
given advantage 0. TRL names each reward in its logs by ``__name__``.

The rewards, by registry name (the plain functions are `<name>_reward`, as in open-r1; each
is in [0, 1] except `length`, which is in [-1, 0]):

``correctness``
  1.0 if ``lab.competition.metric.verify(answer, extract_answer(completion))`` else 0.0: exactly the
  competition's scoring, fall-backs included (a completion with no box can still be read by the
  "Final answer:" / last-number rules). A missing gold answer (None/NaN) gives None.
``format``
  ``0.5 * closed + 0.5 * box``. ``closed`` is 1 when ``</think>`` occurs exactly once. ``box`` is
  judged on the answer part (the text after the last ``</think>``; the whole completion when there
  is none): 1.0 for a clean ending (exactly one ``\boxed{`` there, only whitespace after its last
  ``}``, and the content the metric reads, up to that last ``}``, is non-empty after stripping);
  0.5 when the metric's boxed rule still reads a non-empty answer from the answer part but the
  ending is untidy (two boxes, text after the box, an unclosed box); 0 for no box or only empty
  boxes. So: clean 1.0; clean but no ``</think>`` 0.5; two boxes or trailing text 0.75; an empty
  box after ``</think>`` 0.5; nothing 0. Boxes inside the reasoning are ignored.
``length``
  DAPO's soft overlong penalty on the completion's token count L (``len(completion_ids)``) with
  budget B = ``max_completion_length`` and buffer W = ``length_buffer`` (default B // 4): 0 while
  L <= B - W, then falling linearly to -1 at L = B. A truncated completion (see below) gets -1
  when ``truncation="penalise"`` and None when ``truncation="mask"``. Give it a positive weight.
``trace_agreement``
  Where the row has a solver trace: the share of the trace's reasoning lines (before its
  ``</think>``) that the completion's reasoning (before its first ``</think>``, or all of it when
  unclosed) reproduces in order, i.e. the length of the longest common subsequence of the two line
  lists over the number of trace lines. Lines are compared exactly after collapsing whitespace and
  dropping blank lines. No trace (empty, None, NaN) gives 0.0.

Truncation: a completion is truncated when ``len(ids) >= max_completion_length`` and, if
``eos_token_ids`` are given, its last id is not one of them (without them, a completion ending
with EOS exactly at the budget is also counted as truncated: rare and harmless). With
``truncation="mask"``, `build` makes EVERY reward it returns give None for truncated completions,
so TRL treats them as unscorable (no reward, advantage 0, out of the group baseline), as DAPO's
overlong filtering does; also set ``GRPOConfig(mask_truncated_completions=True)`` to drop their
tokens from the loss. With ``"penalise"`` (default) they are scored as Kaggle would score them and
`length` adds -1.

What it simplifies:
1. Rewards are stateless (no schedule over ``trainer_state``).
2. The format check is textual, not token-level, and assumes ``</think>`` survives decoding with
   ``skip_special_tokens=True`` (true for the lab's tokenizers, where it is an ordinary added token).
3. Trace agreement is exact line matching, so a numeric line differing in one digit counts as a miss.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

from lab import LabError
from lab.competition.metric import VERSIONS, boxed_candidates, extract_answer, verify

THINK_END = "</think>"
TRUNCATION = ("penalise", "mask")


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------

def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _column(kwargs: dict, name: str, reward: str, n: int) -> list:
    if name not in kwargs:
        cols = sorted(k for k in kwargs if k not in ("trainer_state", "log_extra", "log_metric", "environments"))
        raise LabError(f"reward {reward!r} needs the dataset column {name!r}; the columns passed are {cols}")
    values = list(kwargs[name])
    if len(values) != n:
        raise LabError(f"reward {reward!r}: {len(values)} values in column {name!r} for {n} completions")
    return values


def is_truncated(ids: Sequence[int], max_completion_length: int, eos_token_ids: Sequence[int] | None = None) -> bool:
    """True when a completion used the whole budget without ending (see the module docstring)."""
    ids = list(ids)
    if len(ids) < int(max_completion_length):
        return False
    return not eos_token_ids or not ids or ids[-1] not in set(eos_token_ids)


def _ids(completion_ids: Sequence | None, n: int, reward: str) -> list:
    if completion_ids is None:
        raise LabError(f"reward {reward!r} needs completion_ids (token ids of each completion); none were passed")
    ids = list(completion_ids)
    if len(ids) != n:
        raise LabError(f"reward {reward!r}: {len(ids)} completion_ids for {n} completions")
    return ids


def _budget(budget: Any, reward: str) -> int:
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise LabError(f"{reward} needs max_completion_length (the completion budget in tokens, an int >= 1), "
                       f"got {budget!r}; pass it to lab.train.rewards.build")
    return budget


# ----------------------------------------------------------------------------------------------
# the rewards
# ----------------------------------------------------------------------------------------------

def correctness_reward(prompts, completions, completion_ids=None, metric_version: str = "final", **kwargs) -> list:
    """1.0 when the competition's metric scores the completion correct against `answer`, else 0.0 (None: no gold)."""
    golds = _column(kwargs, "answer", "correctness", len(completions))
    out = []
    for gold, c in zip(golds, completions):
        if _missing(gold):
            out.append(None)
            continue
        if not isinstance(gold, str):
            raise LabError(f"reward 'correctness': gold answer {gold!r} is a {type(gold).__name__}, not a str; "
                           "read the data with dtype=str (binary answers such as 0101 lose their leading zeros)")
        out.append(1.0 if verify(gold, extract_answer(c, metric_version), metric_version) else 0.0)
    return out


def _box_score(answer_part: str) -> float:
    """1.0 clean final box, 0.5 readable but untidy, 0.0 no non-empty box (see the module docstring)."""
    boxes = boxed_candidates(answer_part)  # what the metric's boxed rule reads from each box
    if len(boxes) == 1 and boxes[0].strip() and answer_part.rstrip().endswith("}"):
        return 1.0
    return 0.5 if any(b.strip() for b in boxes) else 0.0


def format_score(text: str) -> float:
    """The `format` reward of one completion text."""
    closed = text.count(THINK_END) == 1
    answer_part = text.rsplit(THINK_END, 1)[-1]
    return 0.5 * closed + 0.5 * _box_score(answer_part)


def format_reward(prompts, completions, completion_ids=None, **kwargs) -> list:
    """`</think>` once, then exactly one non-empty `\\boxed{}` at the very end: 1.0; partial credit otherwise."""
    return [format_score(c) for c in completions]


def length_reward(prompts, completions, completion_ids=None, max_completion_length: int | None = None,
           length_buffer: int | None = None, truncation: str = "penalise",
           eos_token_ids: Sequence[int] | None = None, **kwargs) -> list:
    """0 well inside the budget, down to -1 at the budget (DAPO soft overlong); truncated: -1 or None (mask)."""
    budget = _budget(max_completion_length, "reward 'length'")
    buffer = _buffer(length_buffer, budget)
    _check_truncation(truncation)
    out = []
    for ids in _ids(completion_ids, len(completions), "length"):
        n = len(ids)
        if is_truncated(ids, budget, eos_token_ids):
            out.append(None if truncation == "mask" else -1.0)
        elif n <= budget - buffer:
            out.append(0.0)
        else:
            out.append(-min(1.0, (n - (budget - buffer)) / buffer))
    return out


def _steps(text: str) -> list[str]:
    """Whitespace-normalised non-empty lines of the reasoning (the text before the first `</think>`)."""
    reasoning = text.split(THINK_END, 1)[0]
    return [s for s in (" ".join(line.split()) for line in reasoning.splitlines()) if s]


def _lcs(a: list[str], b: list[str]) -> int:
    """Length of the longest common subsequence of two lists of lines."""
    wanted = set(a)
    b = [x for x in b if x in wanted]  # lines absent from `a` can never match
    if not a or not b:
        return 0
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0] * (len(b) + 1)
        for j, y in enumerate(b, 1):
            cur[j] = prev[j - 1] + 1 if x == y else max(prev[j], cur[j - 1])
        prev = cur
    return prev[-1]


def agreement(completion: str, solver_trace: str | None) -> float:
    """Share of the solver trace's reasoning lines the completion reproduces in order (0.0 without a trace)."""
    trace = [] if _missing(solver_trace) else _steps(str(solver_trace))  # a blank trace has no steps
    return _lcs(trace, _steps(completion)) / len(trace) if trace else 0.0


def trace_agreement_reward(prompts, completions, completion_ids=None, **kwargs) -> list:
    """Share of the row's `solver_trace` reasoning lines reproduced in order (LCS over lines); 0.0 without one."""
    traces = _column(kwargs, "solver_trace", "trace_agreement", len(completions))
    return [agreement(c, t) for c, t in zip(completions, traces)]


REWARDS: dict[str, Callable[..., list]] = {
    "correctness": correctness_reward,
    "format": format_reward,
    "length": length_reward,
    "trace_agreement": trace_agreement_reward,
}


# each reward's range (the module docstring): what a mean of them can be, for its plotted interval
RANGES = {"correctness": (0.0, 1.0), "format": (0.0, 1.0), "length": (-1.0, 0.0), "trace_agreement": (0.0, 1.0)}


def log_bounds(weights: Mapping[str, Any]) -> dict[str, tuple[float, float]]:
    """The range of each logged reward mean (TRL's `rewards/<name>/mean`) and of the weighted total (`reward`) under
    the config's ``grpo.rewards`` weights: a mean of values in [a, b] stays in [a, b]."""
    out, lo, hi = {}, 0.0, 0.0
    for name, w in dict(weights or {}).items():
        a, b = RANGES[str(name)]
        out[f"rewards/{name}/mean"] = (a, b)
        lo, hi = lo + min(w * a, w * b), hi + max(w * a, w * b)
    out["reward"] = (lo, hi)
    return out


# ----------------------------------------------------------------------------------------------
# build: config mapping -> (reward_funcs, reward_weights)
# ----------------------------------------------------------------------------------------------

def _check_truncation(truncation: str) -> None:
    if truncation not in TRUNCATION:
        raise LabError(f"unknown truncation {truncation!r}; allowed: {', '.join(TRUNCATION)}")


def _buffer(length_buffer: Any, budget: int) -> int:
    buffer = max(1, budget // 4) if length_buffer is None else int(length_buffer)
    if not 1 <= buffer <= budget:
        raise LabError(f"length_buffer must be between 1 and max_completion_length ({budget}), got {length_buffer!r}")
    return buffer


class Reward:
    """One reward function with its own options bound (what open-r1's reward factories do, as an object: picklable,
    and named by ``__name__``, which TRL logs). With ``mask=(budget, eos_token_ids)`` it returns None for every
    truncated completion (``truncation="mask"``)."""

    def __init__(self, name: str, func: Callable[..., list], mask: tuple | None = None, **options):
        self.__name__ = self.__qualname__ = self.name = name
        self.func, self.mask, self.options = func, mask, options

    def __call__(self, prompts=None, completions=(), completion_ids=None, **kwargs) -> list:
        completions = list(completions)
        rewards = self.func(prompts, completions, completion_ids, **{**kwargs, **self.options})
        if self.mask is not None:
            budget, eos = self.mask
            ids = _ids(completion_ids, len(completions), self.name)
            rewards = [None if is_truncated(i, budget, eos) else r for i, r in zip(ids, rewards)]
        return rewards

    def __repr__(self) -> str:
        return f"Reward({self.name!r}, {self.options})"


def build(weights: Mapping[str, Any], *, max_completion_length: int | None = None, length_buffer: int | None = None,
          truncation: str = "penalise", eos_token_ids: Sequence[int] | None = None, metric_version: str = "final"
          ) -> tuple[list[Reward], list[float]]:
    """(reward_funcs, reward_weights) for GRPOTrainer / GRPOConfig from a name -> weight mapping.

    `weights` is the config's ``grpo.rewards`` (a dict or DictConfig), in order; names must be keys of `REWARDS`.
    Each reward gets its own options: ``correctness`` the metric version; ``length`` the completion budget
    `max_completion_length` (also needed by ``truncation="mask"``), `length_buffer` (default budget // 4),
    `truncation` and `eos_token_ids`; the others none. ``truncation="mask"`` makes every reward None for a
    truncated completion (module docstring).
    """
    if weights is None or not len(weights):
        raise LabError(f"no rewards configured (grpo.rewards is empty); known rewards: {', '.join(REWARDS)}")
    names = [str(k) for k in weights.keys()]
    unknown = [n for n in names if n not in REWARDS]
    if unknown:
        raise LabError(f"unknown reward(s) {unknown} in grpo.rewards; known rewards: {', '.join(REWARDS)}")
    values = []
    for n in names:
        w = weights[n]
        try:
            w = float(w)
        except (TypeError, ValueError):
            raise LabError(f"grpo.rewards.{n}: weight must be a number, got {w!r}") from None
        if not math.isfinite(w):
            raise LabError(f"grpo.rewards.{n}: weight must be finite, got {w!r}")
        values.append(w)
    _check_truncation(truncation)
    if metric_version not in VERSIONS:
        raise LabError(f"unknown metric_version {metric_version!r}; allowed: {', '.join(VERSIONS)}")
    eos = None if eos_token_ids is None else [int(i) for i in eos_token_ids]
    options: dict[str, dict] = {"correctness": {"metric_version": metric_version}}
    if "length" in names or truncation == "mask" or max_completion_length is not None:
        why = "reward 'length'" if "length" in names else "truncation='mask'" if truncation == "mask" else "build"
        budget = _budget(max_completion_length, why)
        options["length"] = {"max_completion_length": budget, "length_buffer": _buffer(length_buffer, budget),
                             "truncation": truncation, "eos_token_ids": eos}
    mask = (options["length"]["max_completion_length"], eos) if truncation == "mask" else None
    return [Reward(n, REWARDS[n], mask, **options.get(n, {})) for n in names], values
