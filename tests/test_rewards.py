r"""GRPO reward functions on literal completion strings, called as TRL 1.15 calls them (no model)."""

from __future__ import annotations

import math
import pickle

import pytest

from lab import LabError
from lab.train.rewards import (REWARDS, Reward, agreement, build, correctness_reward, format_reward,
                         format_score, is_truncated, length_reward, trace_agreement_reward)

GOOD = "step one\nstep two\n</think>\n\\boxed{42}"
WRONG = "step one\nstep two\n</think>\n\\boxed{41}"
UNCLOSED = "step one\nstep two\n\\boxed{42}"                # no </think> at all
NOTHING = "step one\nstep two and then I ran out of"      # truncated mid-reasoning
TWO_BOXES = "step one\n</think>\n\\boxed{41} or \\boxed{42}"
EMPTY_BOX = "step one\n</think>\n\\boxed{}"
BLANK_BOX = "step one\n</think>\n\\boxed{   }"
TEXT_AFTER = "step one\n</think>\n\\boxed{42} is the answer."
TWO_THINKS = "step one\n</think>\nmore\n</think>\n\\boxed{42}"


def call(func, completions, ids=None, **columns):
    """Call a reward the way GRPOTrainer._calculate_rewards does: keywords, columns as lists, extras."""
    n = len(completions)
    extras = {"trainer_state": object(), "log_extra": lambda *a, **k: None, "log_metric": lambda *a, **k: None}
    return func(prompts=["p"] * n, completions=completions,
                completion_ids=ids if ids is not None else [[1, 2, 3]] * n, **columns, **extras)


# ----------------------------------------------------------------------------------------------
# correctness
# ----------------------------------------------------------------------------------------------

def test_correctness_right_and_wrong():
    assert call(correctness_reward, [GOOD, WRONG], answer=["42", "42"]) == [1.0, 0.0]


def test_correctness_follows_the_metric_fallbacks():
    # no box: the metric still reads the last number; no number at all: NOT_FOUND
    assert call(correctness_reward, ["so the result is 42", NOTHING], answer=["42", "42"]) == [1.0, 0.0]
    assert call(correctness_reward, [UNCLOSED, TEXT_AFTER, TWO_THINKS], answer=["42"] * 3) == [1.0, 1.0, 1.0]


def test_correctness_two_boxes_last_wins():
    assert call(correctness_reward, [TWO_BOXES, TWO_BOXES], answer=["42", "41"]) == [1.0, 0.0]


def test_correctness_empty_box_is_wrong():
    assert call(correctness_reward, [EMPTY_BOX], answer=["42"]) == [0.0]


def test_correctness_binary_leading_zeros_compared_as_strings():
    c = ["</think>\n\\boxed{00011011}", "</think>\n\\boxed{11011}", "</think>\n\\boxed{00011011.0}"]
    assert call(correctness_reward, c, answer=["00011011"] * 3) == [1.0, 0.0, 0.0]
    # legacy metric compares binary answers as floats
    assert correctness_reward(["p"], [c[1]], answer=["00011011"], metric_version="legacy") == [1.0]


def test_correctness_numeric_within_tolerance():
    c = ["</think>\n\\boxed{123.9}", "</think>\n\\boxed{125.5}", "</think>\n\\boxed{123.93}"]
    assert call(correctness_reward, c, answer=["123.93"] * 3) == [1.0, 0.0, 1.0]  # 1 % relative tolerance


def test_correctness_missing_gold_is_none_and_bad_gold_is_an_error():
    assert call(correctness_reward, [GOOD, GOOD], answer=[None, math.nan]) == [None, None]
    with pytest.raises(LabError, match="dtype=str"):
        call(correctness_reward, [GOOD], answer=[42])
    with pytest.raises(LabError, match="column 'answer'"):
        call(correctness_reward, [GOOD])


# ----------------------------------------------------------------------------------------------
# format
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    (GOOD, 1.0),
    (GOOD + "\n  \n", 1.0),                             # whitespace after the box is fine
    ("</think>The answer: \\boxed{x}", 1.0),            # text before the box is fine
    ("</think>\n\\boxed{\\frac{1}{2}}", 1.0),           # nested braces
    ("</think>\n\\boxed{@&}}", 1.0),                    # the metric reads up to the last }: '@&}'
    ("a \\boxed{7} b\n</think>\n\\boxed{42}", 1.0),     # boxes inside the reasoning are ignored
    (WRONG, 1.0),                                      # format says nothing about correctness
    (UNCLOSED, 0.5),                                   # no </think>: only the box half
    (TWO_THINKS, 0.5),                                 # </think> twice: only the box half
    (TWO_BOXES, 0.75),                                 # readable but untidy
    (TEXT_AFTER, 0.75),
    ("</think>\n\\boxed{42", 0.75),                     # unclosed box: the metric reads '42'
    (EMPTY_BOX, 0.5),                                  # closed, but an empty box
    (BLANK_BOX, 0.5),
    ("</think>\n\\boxed{} \\boxed{}", 0.5),
    ("</think>\n42", 0.5),                              # no box
    (NOTHING, 0.0),
    ("", 0.0),
])
def test_format_scores(text, expected):
    assert format_score(text) == expected
    assert call(format_reward, [text]) == [expected]


def test_format_on_a_real_solver_trace():
    from lab.puzzles import generate, solve

    df = generate("bit_manipulation", 2, seed=3)
    traces = [solve(p).trace for p in df["prompt"]]
    assert call(format_reward, traces) == [1.0, 1.0]


# ----------------------------------------------------------------------------------------------
# length and truncation
# ----------------------------------------------------------------------------------------------

def test_length_soft_penalty_near_the_budget():
    ids = [[1] * n for n in (10, 80, 85, 90, 99, 100)]  # all end in EOS (id 1): none truncated
    out = length_reward(None, ["x"] * 6, ids, max_completion_length=100, length_buffer=20,
                        eos_token_ids=[1])
    assert out == pytest.approx([0.0, 0.0, -0.25, -0.5, -0.95, -1.0])
    # the default buffer is a quarter of the budget
    assert length_reward(None, ["x"], [[1] * 87], max_completion_length=100, eos_token_ids=[1]) == \
        pytest.approx([-0.48])


def test_truncated_completion_penalised_or_masked():
    ids = [[5] * 100, [5] * 50]  # the first used the whole budget
    assert length_reward(None, ["x", "y"], ids, max_completion_length=100) == [-1.0, 0.0]
    assert length_reward(None, ["x", "y"], ids, max_completion_length=100, truncation="mask") == [None, 0.0]


def test_full_budget_ending_in_eos_is_not_truncated():
    assert is_truncated([5] * 99 + [2], 100) is True           # without eos ids: counted as truncated
    assert is_truncated([5] * 99 + [2], 100, [2]) is False
    assert is_truncated([5] * 100, 100, [2]) is True
    assert is_truncated([5] * 99, 100) is False
    assert length_reward(None, ["x"], [[5] * 99 + [2]], max_completion_length=100, eos_token_ids=[2]) == [-1.0]


def test_length_needs_the_budget_and_the_ids():
    with pytest.raises(LabError, match="max_completion_length"):
        length_reward(None, ["x"], [[1]])
    with pytest.raises(LabError, match="completion_ids"):
        length_reward(None, ["x"], None, max_completion_length=10)
    with pytest.raises(LabError, match="truncation"):
        length_reward(None, ["x"], [[1]], max_completion_length=10, truncation="drop")
    with pytest.raises(LabError, match="length_buffer"):
        length_reward(None, ["x"], [[1]], max_completion_length=10, length_buffer=11)


def test_mask_makes_every_built_reward_none_for_truncated_completions():
    funcs, _ = build({"correctness": 1.0, "format": 0.2, "length": 0.5, "trace_agreement": 0.1},
                     max_completion_length=8, truncation="mask", eos_token_ids=[0])
    truncated = "</think>\n\\boxed{42}"  # even a readable, correct answer: the budget ran out
    ids = [[7] * 8, [7] * 3 + [0], [7] * 6 + [0]]
    out = [call(f, [truncated, GOOD, GOOD], ids, answer=["42"] * 3, solver_trace=[GOOD] * 3) for f in funcs]
    assert [o[0] for o in out] == [None, None, None, None]  # every reward: TRL treats the row as unscorable
    assert [o[1] for o in out] == [1.0, 1.0, 0.0, 1.0]
    assert out[2][2] == pytest.approx(-0.5)  # budget 8, buffer 2: 7 tokens are halfway into the buffer
    at_budget = call(funcs[2], [GOOD], [[7] * 7 + [0]])  # 8 tokens ending in EOS: finished, not masked
    assert at_budget == [-1.0]


def test_penalise_scores_truncated_completions_as_kaggle_would():
    funcs, _ = build({"correctness": 1.0, "length": 1.0}, max_completion_length=4)
    out = [call(f, ["I think 42"], [[7] * 4], answer=["42"]) for f in funcs]
    assert out == [[1.0], [-1.0]]


# ----------------------------------------------------------------------------------------------
# trace agreement
# ----------------------------------------------------------------------------------------------

TRACE = "rule: shl4\nx = 1001\nshl4 = 0000\n</think>\n\\boxed{0000}"


def test_trace_agreement_full_partial_and_none():
    reordered = "shl4 = 0000\nrule: shl4\nx = 1001\n</think>\n\\boxed{0000}"
    extra = "Let me think.\nrule:   shl4\n\nsomething else\nx = 1001\nshl4 = 0000\n</think>\n\\boxed{0000}"
    half = "rule: shl4\nx = 1111\n"  # unclosed: all of it is reasoning
    out = call(trace_agreement_reward, [TRACE, reordered, extra, half, "nothing alike\n</think>"],
               solver_trace=[TRACE] * 5)
    assert out == pytest.approx([1.0, 2 / 3, 1.0, 1 / 3, 0.0])


def test_trace_agreement_without_a_trace_is_zero():
    out = call(trace_agreement_reward, [GOOD] * 4, solver_trace=["", None, math.nan, "   \n"])
    assert out == [0.0, 0.0, 0.0, 0.0]
    assert agreement(GOOD, "</think>\n\\boxed{1}") == 0.0  # a trace with no reasoning lines


def test_trace_agreement_ignores_lines_after_think():
    # the box line after </think> is not a reasoning line of either side
    assert agreement("x = 1001\n</think>\n\\boxed{0000}", "x = 1001\n</think>\n\\boxed{9}") == 1.0
    assert agreement("</think>\nrule: shl4\nx = 1001", TRACE) == 0.0


def test_trace_agreement_needs_the_column():
    with pytest.raises(LabError, match="solver_trace"):
        call(trace_agreement_reward, [GOOD], answer=["42"])


# ----------------------------------------------------------------------------------------------
# registry and build
# ----------------------------------------------------------------------------------------------

def test_registry_names_and_signature():
    assert list(REWARDS) == ["correctness", "format", "length", "trace_agreement"]
    for name, f in REWARDS.items():
        assert f.__name__ == f"{name}_reward"


def test_build_turns_the_config_mapping_into_funcs_and_weights():
    funcs, weights = build({"correctness": 1, "format": 0.2})
    assert [f.__name__ for f in funcs] == ["correctness", "format"]
    assert weights == [1.0, 0.2] and all(isinstance(w, float) for w in weights)
    assert call(funcs[0], [GOOD], answer=["42"]) == [1.0]


def test_build_names_are_what_trl_logs_and_funcs_pickle():
    from trl.trainer.utils import get_callable_name, is_async_callable

    funcs, _ = build({"trace_agreement": 0.1, "length": 0.3}, max_completion_length=100)
    assert [get_callable_name(f) for f in funcs] == ["trace_agreement", "length"]
    assert not any(is_async_callable(f) for f in funcs)
    again = pickle.loads(pickle.dumps(funcs[1]))
    assert isinstance(again, Reward) and again.__name__ == "length"
    assert again(None, ["x"], [[1] * 100]) == [-1.0]


def test_build_accepts_a_dictconfig():
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"rewards": {"correctness": 1.0, "format": 0.2}})
    funcs, weights = build(cfg.rewards)
    assert [f.__name__ for f in funcs] == ["correctness", "format"] and weights == [1.0, 0.2]


def test_build_reads_the_repo_config():
    from lab.core.config import compose

    cfg = compose()
    funcs, weights = build(cfg.grpo.rewards, metric_version=cfg.infer.metric_version)
    assert [f.__name__ for f in funcs] == list(cfg.grpo.rewards) and len(weights) == len(funcs)


def test_build_unknown_reward_names_the_known_ones():
    with pytest.raises(LabError) as e:
        build({"correctness": 1.0, "accuracy": 1.0, "fmt": 0.1})
    msg = str(e.value)
    assert "['accuracy', 'fmt']" in msg
    for name in REWARDS:
        assert name in msg


@pytest.mark.parametrize("weights, options, match", [
    ({}, {}, "no rewards"),
    (None, {}, "no rewards"),
    ({"format": "heavy"}, {}, "must be a number"),
    ({"format": float("nan")}, {}, "finite"),
    ({"format": 1.0}, {"truncation": "drop"}, "unknown truncation"),
    ({"format": 1.0}, {"metric_version": "v3"}, "metric_version"),
    ({"length": 1.0}, {}, r"reward 'length' needs max_completion_length"),
    ({"format": 1.0}, {"truncation": "mask"}, "truncation='mask' needs max_completion_length"),
    ({"length": 1.0}, {"max_completion_length": 0}, "max_completion_length"),
    ({"length": 1.0}, {"max_completion_length": "7680"}, "max_completion_length"),
    ({"length": 1.0}, {"max_completion_length": 100, "length_buffer": 0}, "length_buffer"),
])
def test_build_errors(weights, options, match):
    with pytest.raises(LabError, match=match):
        build(weights, **options)


def test_build_binds_each_reward_its_own_options():
    funcs, _ = build({"correctness": 1.0, "format": 0.2, "length": 0.5}, max_completion_length=8,
                     eos_token_ids=[0], metric_version="legacy")
    assert [f.options for f in funcs] == [
        {"metric_version": "legacy"}, {},
        {"max_completion_length": 8, "length_buffer": 2, "truncation": "penalise", "eos_token_ids": [0]}]
    assert call(funcs[2], [GOOD, GOOD], [[7] * 7 + [0], [7] * 8]) == [-1.0, -1.0]  # 8 ids: at the budget
    assert call(funcs[2], [GOOD], [[7] * 6 + [0]]) == [-0.5]  # 7 ids: half-way into the 2-token buffer
    with pytest.raises(TypeError):  # a misspelt option is refused, never ignored
        build({"format": 1.0}, truncaton="mask")


def test_every_reward_returns_one_value_per_completion():
    funcs, _ = build({name: 1.0 for name in REWARDS}, max_completion_length=50)
    completions = [GOOD, WRONG, UNCLOSED, NOTHING, TWO_BOXES, EMPTY_BOX, TEXT_AFTER]
    n = len(completions)
    ids = [[1] * (10 * i) for i in range(1, n + 1)]
    for f in funcs:
        out = call(f, completions, ids, answer=["42"] * n, solver_trace=[GOOD] * n, category=["x"] * n)
        assert len(out) == n
        assert all(r is None or isinstance(r, float) for r in out)
