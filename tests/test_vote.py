"""Voting and pass@k / maj@k on hand-made sample tables (no model)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest

from lab import LabError
from lab.competition.metric import NOT_FOUND, verify
from lab.eval.vote import (METHODS, assign_classes, confidence_vote, curves, early_stop_vote, leader_probability,
                      majority_vote, pass_at_k, pass_rates, replay, summary, weighted_vote)

NF = NOT_FOUND


def table(rows, gold=True, logprobs=True):
    """rows: (id, category, gold, answers, tokens, logprobs or None) -> a samples table."""
    out = []
    for pid, cat, g, answers, tokens, lps in rows:
        for j, a in enumerate(answers):
            out.append({"id": pid, "category": cat, "gold": g, "sample": j, "completion": f"\\boxed{{{a}}}",
                        "answer": a, "tokens": tokens[j], "finish_reason": "stop",
                        "mean_logprob": (lps[j] if lps is not None else math.nan)})
    df = pd.DataFrame(out)
    if not gold:
        df = df.drop(columns="gold")
    if not logprobs:
        df["mean_logprob"] = math.nan
    return df


# ----------------------------------------------------------------------------------------------
# classes
# ----------------------------------------------------------------------------------------------

def test_numeric_answers_within_tolerance_merge():
    labels, reps = assign_classes(["12.00", "12.001", "12", "13"])
    assert labels == [0, 0, 0, 1]
    assert reps == ["12.00", "13"]


def test_binary_answers_do_not_merge():
    labels, reps = assign_classes(["0101", "101", "0101", "00101"])
    assert labels == [0, 1, 0, 2]
    assert majority_vote(["101", "0101", "0101"]) == "0101"
    assert majority_vote(["0101", "101", "101"]) == "101"


def test_case_insensitive_strings_merge_and_first_seen_is_representative():
    assert assign_classes(["ABC", "abc", " abc "]) == ([0, 0, 0], ["ABC"])
    assert majority_vote(["12.001", "12.00", "12", "7"]) == "12.001"


def test_asymmetry_representative_is_gold_side():
    # verify("1.0", "1") is True (float compare) but verify("1", "1.0") is False (binary gold)
    assert assign_classes(["1.0", "1"])[0] == [0, 0]
    assert assign_classes(["1", "1.0"])[0] == [0, 1]


# ----------------------------------------------------------------------------------------------
# majority
# ----------------------------------------------------------------------------------------------

def test_majority_simple_and_tie_goes_to_first_seen():
    assert majority_vote(["a", "b", "b"]) == "b"
    assert majority_vote(["b", "a", "a", "b"]) == "b"
    assert majority_vote(["a", "b", "b", "a"]) == "a"


def test_majority_all_different_takes_first():
    assert majority_vote(["3", "4", "5", "6"]) == "3"


def test_not_found_never_wins_unless_alone():
    assert majority_vote([NF, NF, NF, "x"]) == "x"
    assert majority_vote([NF, "", "  ", None, float("nan"), "7"]) == "7"
    assert majority_vote([NF, NF]) == NF
    assert majority_vote([None]) == NF
    assert majority_vote([]) == NF


def test_weighted_vote():
    assert weighted_vote(["a", "b", "b"], [3.0, 1.0, 1.0]) == "a"
    assert weighted_vote(["a", "b", "b"], [2.0, 1.0, 1.0]) == "a"  # tie: first seen
    assert weighted_vote(["a", "b"], [1.0, 1.5]) == "b"
    assert weighted_vote([NF, "b"], [10.0, 0.1]) == "b"
    with pytest.raises(ValueError):
        weighted_vote(["a"], [1.0, 2.0])


# ----------------------------------------------------------------------------------------------
# confidence
# ----------------------------------------------------------------------------------------------

def test_confidence_picks_confident_minority():
    answers = ["a", "a", "a", "b", "b"]
    conf = [-2.0, -2.0, -2.0, -0.1, -0.1]
    assert majority_vote(answers) == "a"
    assert confidence_vote(answers, conf, keep_top=0.5) == "b"   # keeps b, b and one a
    assert confidence_vote(answers, conf, keep_top=1.0) == "b"   # 2*exp(-0.1) > 3*exp(-2)


def test_confidence_weights_are_exp_mean_logprob():
    lp = math.log
    assert confidence_vote(["a", "b", "b"], [lp(0.6), lp(0.3), lp(0.25)], keep_top=1.0) == "a"  # 0.6 > 0.55
    assert confidence_vote(["a", "b", "b"], [lp(0.6), lp(0.3), lp(0.35)], keep_top=1.0) == "b"  # 0.6 < 0.65


def test_confidence_keep_top_share():
    answers = [str(i % 3) for i in range(10)]  # 0 1 2 0 1 2 0 1 2 0: majority "0"
    conf = [-1.0] * 10
    conf[5] = -0.5                              # the single most confident trace says "2"
    assert confidence_vote(answers, conf, keep_top=0.1) == "2"
    assert confidence_vote(answers, conf, keep_top=1.0) == "0"
    # ties in confidence keep the earlier sample
    assert confidence_vote(["x", "y"], [-1.0, -1.0], keep_top=0.5) == "x"
    with pytest.raises(ValueError):
        confidence_vote(["x"], [-1.0], keep_top=0.0)
    with pytest.raises(ValueError):
        confidence_vote(["x"], [-1.0], keep_top=1.5)


def test_confidence_nan_falls_back_to_majority():
    assert confidence_vote(["a", "a", "b"], [math.nan, -3.0, -0.01], keep_top=0.1) == "a"
    assert confidence_vote(["a", "a", "b"], [math.nan] * 3) == "a"


def test_confidence_ignores_confident_not_found():
    assert confidence_vote([NF, "a", "b"], [-0.01, -2.0, -1.0], keep_top=0.1) == "b"
    assert confidence_vote([NF, NF], [-0.01, -2.0]) == NF
    assert confidence_vote([], []) == NF


# ----------------------------------------------------------------------------------------------
# early stopping
# ----------------------------------------------------------------------------------------------

def test_early_stop_unanimous_first_window():
    assert early_stop_vote(list("aaaabbbb"), [1, 2, 3, 4, 5, 6, 7, 8], window=4) == ("a", 4, 10)


def test_early_stop_continues_when_first_window_disagrees():
    # a a b a | b b b b: never safe before the end; majority of 8 is b (5 vs 3)
    assert early_stop_vote(list("aabab" "bbb"), [1, 2, 3, 4, 5, 6, 7, 8], window=4) == ("b", 8, 36)


def test_early_stop_agreement_share():
    answers, toks = list("aaabbbbb"), [10] * 8
    assert early_stop_vote(answers, toks, window=4, agree=0.75) == ("a", 4, 40)
    assert early_stop_vote(answers, toks, window=4, agree=1.0) == ("b", 8, 80)


def test_early_stop_when_leader_cannot_be_overtaken():
    # after 4 of 6: a=3, b=1, 2 left: b could only tie, and a tie goes to a (seen first): stop
    assert early_stop_vote(list("abaa" "bb"), [1] * 6, window=2) == ("a", 4, 4)
    # after 4 of 6: b=1 (seen first), a=3: b could tie and would win the tie: go on (and it does)
    assert early_stop_vote(list("baaa" "bb"), [1] * 6, window=2) == ("b", 6, 6)
    # after 4 of 8: a=3, b=1, 4 left: a brand-new answer could win 4 to 3: go on
    assert early_stop_vote(list("abaa" "cccc"), [1] * 8, window=4)[1:] == (8, 8)


def test_early_stop_not_found_window_does_not_stop():
    assert early_stop_vote([NF] * 4 + ["x"] * 4, [1] * 8, window=4) == ("x", 8, 8)
    assert early_stop_vote([NF] * 4, [5] * 4, window=2) == (NF, 4, 20)


def test_leader_probability_is_the_beta_mass_above_one_half():
    assert leader_probability(0, 0) == 0.5
    assert leader_probability(4, 0) == 1 - 1 / 32            # Beta(5, 1): 1 - 0.5**5
    assert leader_probability(3, 0) == 1 - 1 / 16
    assert leader_probability(2, 2) == 0.5                    # symmetric
    assert abs(leader_probability(10, 4) - 0.9408) < 1e-4     # P(Binomial(15, 1/2) <= 10)
    assert leader_probability(11, 4) > 0.95 > leader_probability(10, 4)


def test_early_stop_on_leader_probability():
    toks = [1] * 32
    # unanimous: P = 1 - 2**-(a+1) passes 0.95 at a = 4 (0.969), not at 3 (0.9375)
    assert early_stop_vote(["x"] * 32, toks, window=1, agree=None, stop_prob=0.95) == ("x", 4, 4)
    # one dissent early: x y x x x x ... -> a=5, b=1 after 6: P(Bin(7) <= 5) = 0.9375; a=6, b=1: 0.9648
    assert early_stop_vote(["x", "y"] + ["x"] * 30, toks, window=1, agree=None, stop_prob=0.95) == ("x", 7, 7)
    # an even split never becomes probable: it goes on until only the overtaking rule stops it (4:3 with 1 left)
    assert early_stop_vote(list("xyxyxyxy"), [1] * 8, window=1, agree=None, stop_prob=0.95)[1] == 7
    # agree=None alone: only the overtaking rule (after 4 of 8 a new answer could at most tie, and lose the tie)
    assert early_stop_vote(["x"] * 8, [1] * 8, window=2, agree=None) == ("x", 4, 4)
    with pytest.raises(ValueError):
        early_stop_vote(["a"], [1], stop_prob=0.5)


def test_early_stop_budget_and_validation():
    assert early_stop_vote(list("abcabc"), [1] * 6, budget=3, window=4) == ("a", 3, 3)
    assert early_stop_vote([], [], window=4) == (NF, 0, 0)
    with pytest.raises(ValueError):
        early_stop_vote(["a"], [1], window=0)
    with pytest.raises(ValueError):
        early_stop_vote(["a"], [1], agree=0)


# ----------------------------------------------------------------------------------------------
# replay
# ----------------------------------------------------------------------------------------------

ROWS = [
    # id, category, gold, answers (sample order), tokens, mean_logprob
    ("p1", "bits", "0101", ["101", "0101", "0101", "101", "0101", "0101", "0101", "0101"],
     [10, 11, 12, 13, 14, 15, 16, 17], [-0.1, -1, -1, -0.1, -1, -1, -1, -1]),
    ("p2", "num", "12", ["12.001", "12.00", "12", "12", "9", "9", "9", "9"],
     [5, 5, 5, 5, 5, 5, 5, 5], [-1, -1, -1, -1, -0.2, -0.2, -0.2, -0.2]),
    ("p3", "num", "7", [NF, NF, "7", NF, "8", "7", "7", "7"],
     [100, 100, 3, 100, 4, 4, 4, 4], [-0.01, -0.01, -0.5, -0.01, -0.6, -0.5, -0.5, -0.5]),
]


def test_replay_each_method():
    s = table(ROWS)
    g = replay(s, "greedy", 8)
    assert list(g.columns) == ["id", "category", "answer", "samples_used", "tokens_used", "correct"]
    assert g["answer"].tolist() == ["101", "12.001", NF]
    assert g["correct"].tolist() == [False, True, False]
    assert g["samples_used"].tolist() == [1, 1, 1] and g["tokens_used"].tolist() == [10, 5, 100]

    m = replay(s, "majority", 8)
    assert m["answer"].tolist() == ["0101", "12.001", "7"]   # p2: 4 x "12" class vs 4 x "9": tie, first seen
    assert m["correct"].tolist() == [True, True, True]
    assert m["samples_used"].tolist() == [8, 8, 8]
    assert m["tokens_used"].tolist() == [108, 40, 319]
    assert m["category"].tolist() == ["bits", "num", "num"]

    c = replay(s, "confidence", 8, keep_top=0.5)
    assert c["answer"].tolist() == ["101", "9", "7"]
    assert c["correct"].tolist() == [False, False, True]
    assert c["tokens_used"].tolist() == [108, 40, 319]

    e = replay(s, "early_stop", 8, window=4)
    assert e["answer"].tolist() == ["0101", "12.001", "7"]
    assert e["samples_used"].tolist() == [8, 4, 8]           # p2's first window is one class: stop
    assert e["tokens_used"].tolist() == [108, 20, 319]


def test_replay_first_k_and_sample_order():
    s = table(ROWS).sample(frac=1.0, random_state=0)         # rows shuffled: replay sorts by sample
    m = replay(s, "majority", 3)
    assert m["id"].tolist() == list(dict.fromkeys(s["id"]))  # ids in first-appearance order
    m = m.set_index("id")
    assert m.loc["p1", "answer"] == "0101" and m.loc["p1", "tokens_used"] == 33
    assert m.loc["p3", "answer"] == "7" and m.loc["p3", "samples_used"] == 3
    assert replay(s, "early_stop", 2, window=4).set_index("id").loc["p2", "samples_used"] == 2


def test_replay_greedy_table_and_unlabeled():
    greedy = pd.DataFrame({"id": ["a", "b"], "category": ["x", "y"], "answer": ["1", NF], "tokens": [3, 9]})
    r = replay(greedy, "greedy")
    assert r["answer"].tolist() == ["1", NF] and r["tokens_used"].tolist() == [3, 9]
    assert r["correct"].isna().all()
    s = table(ROWS, gold=False)
    assert replay(s, "majority", 4)["correct"].isna().all()


def test_replay_confidence_without_logprobs_is_majority():
    s = table(ROWS, logprobs=False)
    pd.testing.assert_series_equal(replay(s, "confidence", 8, keep_top=0.1)["answer"],
                                   replay(s, "majority", 8)["answer"])


def test_replay_errors():
    s = table(ROWS)
    with pytest.raises(ValueError, match="unknown voting method"):
        replay(s, "best_of_n", 4)
    with pytest.raises(ValueError, match="unknown option"):
        replay(s, "confidence", 4, keeptop=0.5)
    with pytest.raises(ValueError):
        replay(s, "majority", 0)
    numeric = s.assign(answer=pd.to_numeric(s["answer"], errors="coerce"))
    with pytest.raises(LabError, match="leading zeros"):
        replay(numeric, "majority", 4)
    assert set(METHODS) == {"greedy", "majority", "confidence", "early_stop"}


def test_summary():
    r = replay(table(ROWS), "early_stop", 8, window=4)
    s = summary(r)
    assert s["puzzles"] == 3 and s["accuracy"] == 1.0
    assert s["tokens_used"] == pytest.approx((108 + 20 + 319) / 3)
    assert s["tokens_per_correct"] == pytest.approx((108 + 20 + 319) / 3)


# ----------------------------------------------------------------------------------------------
# metrics
# ----------------------------------------------------------------------------------------------

def brute_pass_at_k(n, c, k):
    flags = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(flags[i] for i in sub) for sub in subsets) / len(subsets)


def test_pass_at_k_matches_enumeration():
    for n in range(1, 8):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(n, c, k), abs=1e-12), (n, c, k)


def test_pass_at_k_edges_and_large_n():
    assert pass_at_k(10, 0, 5) == 0.0
    assert pass_at_k(10, 10, 1) == 1.0
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert 0.0 < pass_at_k(2000, 1, 1) < 1.0  # no overflow from huge binomials
    for bad in [(3, 4, 1), (3, 1, 0), (3, 1, 4), (3, -1, 1)]:
        with pytest.raises(ValueError):
            pass_at_k(*bad)


TINY = [
    ("q1", "a", "5", ["5", "7", "7"], [10, 20, 30], None),
    ("q2", "b", "0101", ["0101", "101", "101"], [1, 2, 3], None),
]


def test_majority_over_the_first_k_and_curves_on_tiny_table():
    s = table(TINY)

    def maj_at_k(k):
        return replay(s, "majority", k)["correct"].astype(bool).mean()

    assert maj_at_k(1) == 1.0
    assert maj_at_k(2) == 1.0   # q1: 5 vs 7 tie -> 5; q2: 0101 vs 101 tie -> 0101
    assert maj_at_k(3) == 0.0
    cv = curves(s)
    assert cv["k"].tolist() == [1, 2, 3] and cv["puzzles"].tolist() == [2, 2, 2]
    np.testing.assert_allclose(cv["pass_at_k"], [1 / 3, 2 / 3, 1.0])
    # curves averages maj@k over the 3 cyclic windows (0,1) (1,2) (2,0): right only in (0,1), where 5 wins the
    # tie by coming first; so maj@1 is pass@1, the mean of all samples, not the first sample's 1.0
    np.testing.assert_allclose(cv["maj_at_k"], [1 / 3, 1 / 3, 0.0])
    np.testing.assert_allclose(cv["tokens_per_puzzle"], [11.0, 22.0, 33.0])  # k times the mean sample (20 and 2)
    assert cv["tokens_per_correct"].tolist()[:2] == [33.0, 66.0] and math.isinf(cv["tokens_per_correct"].iloc[2])
    cv2 = curves(s, K=2)
    np.testing.assert_allclose(cv2["pass_at_k"], [0.5, 1.0])   # both ids: 1 correct of their first 2
    with pytest.raises(LabError, match="only 3 samples"):
        curves(s, K=4)


def test_curves_maj_at_k_is_the_window_average_of_majority_vote_and_meets_pass_at_k():
    """maj@k from `curves` equals majority_vote over every cyclic window of k samples, averaged; at k=1 it is pass@1."""
    rng = np.random.default_rng(0)
    rows = []
    for i in range(25):
        gold = str(rng.integers(0, 3))
        for j, a in enumerate(rng.choice(["0", "1", "2", "NOT_FOUND", ""], size=6, p=[0.3, 0.25, 0.2, 0.15, 0.1])):
            rows.append({"id": f"p{i}", "category": "c", "gold": gold, "sample": j, "answer": str(a), "tokens": 1})
    s = pd.DataFrame(rows)
    cv = curves(s)
    assert cv["maj_at_k"].iloc[0] == pytest.approx(cv["pass_at_k"].iloc[0])
    for k in range(1, 7):
        hits = []
        for _, g in s.groupby("id", sort=False):
            answers, gold = g["answer"].tolist(), g["gold"].iloc[0]
            for r in range(6):
                window = [answers[(r + t) % 6] for t in range(k)]
                hits.append(verify(gold, majority_vote(window)))
        assert cv["maj_at_k"].iloc[k - 1] == pytest.approx(np.mean(hits)), k


def test_metrics_need_gold():
    with pytest.raises(LabError, match="gold"):
        curves(table(TINY, gold=False))
    with pytest.raises(LabError, match="gold"):
        pass_rates(table(TINY, gold=False))


def test_pass_rates():
    pr = pass_rates(table(ROWS))
    assert list(pr.columns) == ["id", "n", "correct", "pass_rate"]
    assert pr["id"].tolist() == ["p1", "p2", "p3"]
    assert pr["n"].tolist() == [8, 8, 8]
    assert pr["correct"].tolist() == [6, 4, 4]
    np.testing.assert_allclose(pr["pass_rate"], [0.75, 0.5, 0.5])
