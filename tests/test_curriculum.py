"""Prompt selection and curriculum ordering on hand-made tables (no model)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from lab import LabError
from lab.data.curriculum import SHAPES, order, select, selection_summary
from lab.eval.vote import pass_rates


def samples(rows):
    """rows: (id, gold, answers) -> a samples table with k rows per id."""
    out = []
    for pid, gold, answers in rows:
        for j, a in enumerate(answers):
            out.append({"id": pid, "category": "c", "gold": gold, "sample": j, "answer": a, "tokens": 10})
    return pd.DataFrame(out)


def rates(values: dict) -> pd.DataFrame:
    """id -> pass rate, as a pass-rate table with n = 4."""
    return pd.DataFrame({"id": list(values), "n": 4, "correct": [int(round(4 * v)) for v in values.values()],
                         "pass_rate": list(values.values())})


def puzzles(ids):
    return pd.DataFrame({"id": ids, "prompt": [f"prompt {i}" for i in ids], "answer": "1", "category": "c"})


# ----------------------------------------------------------------------------------------------
# pass rates
# ----------------------------------------------------------------------------------------------

def test_pass_rates_count_verify_matches():
    s = samples([("a", "42", ["42", "42.1", "41", "NOT_FOUND"]),   # 42.1 is within 1 %
                 ("b", "0101", ["101", "0101", "0101", "0101"]),   # binary: leading zeros matter
                 ("c", "x", ["y", "y", "y", "y"])])
    got = pass_rates(s)
    assert list(got.columns) == ["id", "n", "correct", "pass_rate"]
    assert got["id"].tolist() == ["a", "b", "c"]
    assert got["correct"].tolist() == [2, 3, 0]
    assert got["pass_rate"].tolist() == [0.5, 0.75, 0.0]


# ----------------------------------------------------------------------------------------------
# select
# ----------------------------------------------------------------------------------------------

def test_select_drops_solved_prompts_and_keeps_unsolved_ones():
    table = rates({"a": 1.0, "b": 0.75, "c": 0.5, "d": 0.0, "e": 0.25})
    kept, dropped = select(table, threshold=0.75)
    assert kept == ["c", "d", "e"]                       # table order; pass rate 0 is kept
    assert dropped["id"].tolist() == ["a", "b"]          # >= threshold is dropped
    assert list(dropped.columns) == ["id", "n", "correct", "pass_rate"]
    assert selection_summary(table, 0.75) == {"threshold": 0.75, "drop_unsolved": False, "total": 5, "kept": 3,
                                              "dropped": 2, "solved": 2, "unsolved": 1}


def test_select_can_drop_unsolved_prompts_too():
    table = rates({"a": 1.0, "b": 0.75, "c": 0.5, "d": 0.0, "e": 0.25})
    kept, dropped = select(table, threshold=0.75, drop_unsolved=True)
    assert kept == ["c", "e"]
    assert dropped["id"].tolist() == ["a", "b", "d"]
    assert selection_summary(table, 0.75, drop_unsolved=True) == {
        "threshold": 0.75, "drop_unsolved": True, "total": 5, "kept": 2, "dropped": 3, "solved": 2, "unsolved": 1}


def test_select_threshold_one_drops_only_always_solved():
    table = rates({"a": 1.0, "b": 0.75, "c": 0.0})
    kept, dropped = select(table, threshold=1.0)
    assert kept == ["b", "c"] and dropped["id"].tolist() == ["a"]


def test_select_ids_become_strings():
    table = pd.DataFrame({"id": [1, 2], "n": [4, 4], "correct": [4, 0], "pass_rate": [1.0, 0.0]})
    kept, dropped = select(table)
    assert kept == ["2"] and dropped["id"].tolist() == ["1"]


def test_select_empty_table():
    kept, dropped = select(rates({}))
    assert kept == [] and dropped.empty


@pytest.mark.parametrize("threshold", [0, -0.1, 1.5, "high", None])
def test_select_bad_threshold(threshold):
    with pytest.raises(LabError, match="threshold"):
        select(rates({"a": 0.5}), threshold=threshold)


@pytest.mark.parametrize("table, match", [
    (pd.DataFrame({"id": ["a"], "n": [4]}), r"lacks column\(s\) \['pass_rate'\]"),
    (pd.DataFrame({"id": ["a", "a"], "pass_rate": [0.5, 0.5]}), "duplicate id"),
    (pd.DataFrame({"id": ["a", "b"], "pass_rate": [0.5, np.nan]}), r"in \[0, 1\].*'b'"),
    (pd.DataFrame({"id": ["a"], "pass_rate": [1.5]}), r"in \[0, 1\]"),
    ("not a table", "must be a DataFrame"),
])
def test_select_bad_tables(table, match):
    with pytest.raises(LabError, match=match):
        select(table)


# ----------------------------------------------------------------------------------------------
# order
# ----------------------------------------------------------------------------------------------

RATES = {"h1": 0.0, "e1": 0.75, "m1": 0.5, "e2": 0.75, "m2": 0.25, "h2": 0.0, "x": 0.5, "y": 0.25}


def test_linear_orders_easy_to_hard():
    out = order(puzzles(list(RATES)), rates(RATES), curriculum=True, shape="linear", seed=0)
    assert out["pass_rate"].tolist() == sorted(RATES.values(), reverse=True)
    assert sorted(out["id"]) == sorted(RATES)
    assert list(out.columns) == ["id", "prompt", "answer", "category", "pass_rate", "bucket"]
    assert out["bucket"].isna().all()
    assert out.index.tolist() == list(range(len(RATES)))
    # the other columns travel with their row
    assert (out["prompt"] == "prompt " + out["id"]).all()


def test_linear_ties_are_shuffled_by_the_seed():
    ids = [f"p{i:02d}" for i in range(40)]
    table = rates({i: 0.5 for i in ids})
    orders = {tuple(order(puzzles(ids), table, True, "linear", seed=s)["id"]) for s in range(5)}
    assert len(orders) > 1                      # not just the input order
    assert tuple(ids) not in orders


def test_order_is_deterministic_for_a_seed():
    p, r = puzzles(list(RATES)), rates(RATES)
    for curriculum, shape in [(True, "linear"), (True, "stepped"), (False, "linear")]:
        a = order(p, r, curriculum, shape, seed=7)
        b = order(p, r, curriculum, shape, seed=7)
        pd.testing.assert_frame_equal(a, b)


def test_stepped_buckets_are_easy_to_hard_and_shuffled_inside():
    ids = [f"p{i:02d}" for i in range(12)]
    values = {pid: (12 - i) / 12 for i, pid in enumerate(ids)}  # p00 easiest ... p11 hardest, all distinct
    out = order(puzzles(ids), rates(values), True, "stepped", seed=3, buckets=3)
    assert out["bucket"].tolist() == [0] * 4 + [1] * 4 + [2] * 4
    for b, members in enumerate([ids[0:4], ids[4:8], ids[8:12]]):
        assert sorted(out.loc[out["bucket"] == b, "id"]) == members
    # every bucket is easier than the next
    by_bucket = out.groupby("bucket")["pass_rate"]
    assert (by_bucket.min().to_numpy()[:-1] > by_bucket.max().to_numpy()[1:]).all()
    # within buckets the order is shuffled for some seed (not simply sorted)
    sorted_ids = [tuple(order(puzzles(ids), rates(values), True, "stepped", seed=s, buckets=3)["id"])
                  for s in range(5)]
    assert any(o != tuple(ids) for o in sorted_ids)


def test_stepped_uneven_and_more_buckets_than_puzzles():
    ids = ["a", "b", "c", "d", "e"]
    values = {"a": 1.0, "b": 0.8, "c": 0.6, "d": 0.4, "e": 0.2}
    out = order(puzzles(ids), rates(values), True, "stepped", seed=0, buckets=2)
    assert out["bucket"].tolist() == [0, 0, 0, 1, 1]
    assert sorted(out["id"][:3]) == ["a", "b", "c"]
    out = order(puzzles(ids), rates(values), True, "stepped", seed=0, buckets=9)
    assert out["id"].tolist() == ids and out["bucket"].tolist() == [0, 1, 2, 3, 4]


def test_one_bucket_is_a_shuffle():
    ids = list(RATES)
    out = order(puzzles(ids), rates(RATES), True, "stepped", seed=1, buckets=1)
    assert sorted(out["id"]) == sorted(ids) and (out["bucket"] == 0).all()


def test_curriculum_off_is_a_seeded_shuffle():
    ids = [f"p{i:02d}" for i in range(30)]
    values = {pid: i / 30 for i, pid in enumerate(ids)}
    a = order(puzzles(ids), rates(values), curriculum=False, seed=1)
    b = order(puzzles(ids), None, curriculum=False, seed=1)
    assert a["id"].tolist() == b["id"].tolist()           # the pass rates do not change the shuffle
    assert sorted(a["id"]) == ids and a["id"].tolist() != ids
    assert order(puzzles(ids), None, False, seed=2)["id"].tolist() != a["id"].tolist()
    assert a.set_index("id")["pass_rate"].to_dict() == pytest.approx(values)
    assert b["pass_rate"].isna().all() and b["bucket"].isna().all()
    # a puzzle without a pass rate is fine when the curriculum is off
    c = order(puzzles(ids + ["new"]), rates(values), curriculum=False, seed=1)
    assert np.isnan(c.set_index("id").loc["new", "pass_rate"])


def test_order_matches_ids_as_strings_and_replaces_old_columns():
    p = pd.DataFrame({"id": [1, 2, 3], "pass_rate": [9.0, 9.0, 9.0], "bucket": [5, 5, 5]})
    r = pd.DataFrame({"id": ["1", "2", "3"], "pass_rate": [0.0, 1.0, 0.5]})
    out = order(p, r, True, "linear", seed=0)
    assert out["id"].tolist() == [2, 3, 1]                 # original id values kept
    assert out["pass_rate"].tolist() == [1.0, 0.5, 0.0]


def test_order_empty_puzzles():
    for shape in SHAPES:
        out = order(puzzles([]), rates({}), True, shape, seed=0)
        assert out.empty and "pass_rate" in out.columns


@pytest.mark.parametrize("kwargs, match", [
    ({"curriculum": True, "shape": "cosine"}, r"unknown curriculum shape 'cosine'; allowed: linear, stepped"),
    ({"curriculum": False, "shape": "Linear"}, "unknown curriculum shape"),
    ({"curriculum": True, "shape": "stepped", "buckets": 0}, "buckets"),
    ({"curriculum": True, "shape": "stepped", "buckets": 2.5}, "buckets"),
])
def test_order_errors(kwargs, match):
    with pytest.raises(LabError, match=match):
        order(puzzles(list(RATES)), rates(RATES), seed=0, **kwargs)


def test_order_needs_rates_for_every_puzzle_when_on():
    with pytest.raises(LabError, match=r"1 puzzle\(s\) have no pass rate.*'new'"):
        order(puzzles(list(RATES) + ["new"]), rates(RATES), True, seed=0)
    with pytest.raises(LabError, match="no pass rates"):
        order(puzzles(list(RATES)), None, True, seed=0)


def test_order_bad_puzzles_table():
    with pytest.raises(LabError, match="column 'id'"):
        order(pd.DataFrame({"prompt": ["x"]}), None, False, seed=0)
    with pytest.raises(LabError, match="duplicate id"):
        order(puzzles(["a", "a"]), None, False, seed=0)


def test_order_seed_is_required():
    with pytest.raises(TypeError):
        order(puzzles(["a"]), None, False)  # noqa: the seed must come from the config


def test_select_then_order_pipeline():
    s = samples([("a", "1", ["1"] * 4), ("b", "1", ["1", "1", "0", "0"]), ("c", "1", ["0"] * 4),
                 ("d", "1", ["1", "0", "0", "0"])])
    table = pass_rates(s)
    kept, dropped = select(table, 0.75)
    assert kept == ["b", "c", "d"] and dropped["id"].tolist() == ["a"]
    p = puzzles(["a", "b", "c", "d"])
    out = order(p[p["id"].isin(kept)], table, True, "linear", seed=0)
    assert out["id"].tolist() == ["b", "d", "c"]
