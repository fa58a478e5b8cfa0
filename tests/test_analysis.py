"""Error analysis (lab.eval.analysis): taxonomy classes and their priority, Wilson intervals, departures
from solver traces, length tables, comparing runs, the compare CLI, and the files 05_errors' recipe writes.

All predictions are hand-made; the solver is replaced by hand-made solutions or a monkeypatched
`lab.puzzles.solve`, so nothing here depends on the solvers' quality.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pandas as pd
import pytest

from lab.eval import analysis as errors
from lab import LabError
from lab.core.io import atomic_write_csv, atomic_write_json
from lab.eval.analysis import (CLASSES, FAILURE_PRIORITY, accuracy_table, classify_failure, compare, departure_table,
                               examples, first_departure, length_table, load_predictions, taxonomy, wilson_interval)
from lab.eval.cli import compare_main, find_predictions


def row(id, category, gold, completion, correct=None, subtype="", finish_reason="stop", tokens=100, prompt=None,
        answer=None):
    from lab.competition.metric import extract_answer, verify

    ans = extract_answer(completion) if answer is None else answer
    return {"id": id, "category": category, "subtype": subtype, "prompt": prompt or f"puzzle {id}", "gold": gold,
            "completion": completion, "answer": ans, "correct": verify(gold, ans) if correct is None else correct,
            "tokens": tokens, "finish_reason": finish_reason}


def done(steps: str, answer: str) -> str:
    return f"{steps}\n</think>\n\\boxed{{{answer}}}"


# every class once (plus priority conflicts); the expected class is the id's prefix
CASES = [
    row("correct-1", "bit_manipulation", "01010101", done("xor with mask", "01010101")),
    row("correct-2", "gravity", "100.00", done("g = 9.8", "100.4")),  # within the metric's 1%
    # truncated beats think_unclosed and no_box (cut off mid-thought)
    row("truncated-1", "gravity", "45.20", "step 1\nstep 2 d = 45.2 + 3", finish_reason="length", tokens=7680),
    # think_unclosed beats right_in_reasoning and wrong (a box, but no </think>)
    row("think_unclosed-1", "text_cipher", "cat", "decode: cat\n\\boxed{dog}"),
    row("think_unclosed-2", "numeral_system", "XIV", "<think>\nhmm"),  # also no box: think_unclosed wins
    # no_box beats right_in_reasoning (the metric then reads a number; still no box)
    row("no_box-1", "unit_conversion", "12.50", "convert 12.5\n</think>\nThe answer is 13"),
    row("no_box-2", "text_cipher", "cat", ""),
    # empty_box beats right_in_reasoning
    row("empty_box-1", "numeral_system", "XIV", done("14 is XIV", " ")),
    # wrong_format beats near_miss / right_in_reasoning
    row("wrong_format-1", "bit_manipulation", "01010101", done("got 01010101", "0101")),
    row("wrong_format-2", "bit_manipulation", "01010101", done("x", "0101010a")),
    row("wrong_format-3", "numeral_system", "XIV", done("XIV", "14")),
    row("wrong_format-4", "gravity", "100.00", done("d = 100.00", "101 m")),
    row("wrong_format-5", "unit_conversion", "3.25", done("ratio", "three")),
    # near_miss beats right_in_reasoning
    row("near_miss-1", "gravity", "100.00", done("maybe 100.00", "103.00")),
    row("near_miss-2", "unit_conversion", "20.00", done("x", "19.2")),
    # right_in_reasoning: literal token, and numerically equal value in a numeric category
    row("right_in_reasoning-1", "text_cipher", "hello world", done("so: Hello World", "hello word")),
    row("right_in_reasoning-2", "gravity", "45.20", done("d = 45.2 m", "60.00")),
    row("right_in_reasoning-3", "bit_manipulation", "00110011", done("\\boxed{00110011} no wait", "00110010")),
    # wrong: no shape problem, far off, gold not in the reasoning (12 is not a token of 123)
    row("wrong-1", "gravity", "100.00", done("d = 110", "110.00")),
    row("wrong-2", "equation_transformation", "12", done("12345 and 1.2", "13"), subtype="numeric_deduce"),
    row("wrong-3", "text_cipher", "cat", "\\boxed{dog}"),  # no reasoning, no </think>: not think_unclosed
    row("wrong-4", "numeral_system", "XIV", done("x", "XV")),
]


def test_every_class_reachable_and_assigned():
    got = {r["id"]: classify_failure(r) for r in CASES}
    for id_, cls in got.items():
        assert cls == id_.rsplit("-", 1)[0], (id_, cls)
    assert set(got.values()) == set(CLASSES)
    assert CLASSES == ("correct",) + FAILURE_PRIORITY


def test_row_without_answer_or_correct_is_scored_by_the_metric():
    r = {"completion": done("x", "101.2"), "gold": "100.00", "category": "gravity"}
    assert classify_failure(r) == "near_miss"
    assert classify_failure({**r, "completion": done("x", "100.3")}) == "correct"
    assert classify_failure({**r, "correct": "True"}) == "correct"  # a given `correct` is trusted


def test_budget_counts_as_truncation_only_when_given():
    r = row("x", "gravity", "1.00", done("x", "2.00"), tokens=7680)
    assert classify_failure(r) == "wrong"
    assert classify_failure(r, budget=7680) == "truncated"
    assert classify_failure(r, budget=8000) == "wrong"


def test_wrong_format_shapes():
    assert classify_failure(row("a", "numeral_system", "42", done("x", "XLII"))) == "wrong_format"  # gold numeric
    assert classify_failure(row("b", "numeral_system", "XIV", done("x", "xv"))) == "wrong"  # case is not shape
    assert classify_failure(row("b", "numeral_system", "XIV", done("x", "xiv"))) == "correct"
    assert classify_failure(row("c", "bit_manipulation", "0101", done("x", "01010101"))) == "wrong_format"
    assert classify_failure(row("d", "unit_conversion", "3.25", done("x", "1e3"))) == "wrong"  # a number
    assert classify_failure(row("e", "equation_transformation", "@#", done("x", "!!!"))) == "wrong"  # no check


def test_taxonomy_counts_and_examples():
    pred = pd.DataFrame(CASES)
    tax = taxonomy(pred)
    assert list(tax.columns) == ["category", "n", *CLASSES]
    assert tax["category"].iloc[-1] == "all"
    total = tax.set_index("category").loc["all"]
    assert total["n"] == len(CASES)
    assert sum(int(total[c]) for c in CLASSES) == len(CASES)
    assert total["wrong_format"] == 5 and total["correct"] == 2 and total["right_in_reasoning"] == 3
    per = tax.set_index("category")
    assert per.loc["bit_manipulation", "wrong_format"] == 2
    assert per.loc["gravity", ["correct", "truncated", "near_miss", "right_in_reasoning", "wrong"]].tolist() \
        == [1, 1, 1, 1, 1]
    assert list(tax["category"][:-1]) == [c for c in errors.CATEGORY_ORDER if c in set(pred["category"])]

    ex = examples(pred, "wrong_format", n=2)
    assert list(ex["id"]) == ["wrong_format-1", "wrong_format-2"]
    assert list(examples(pred, "wrong_format", n=5, category="gravity")["id"]) == ["wrong_format-4"]
    with pytest.raises(LabError, match="unknown class"):
        examples(pred, "oops")


def test_wilson_interval_known_values():
    # Newcombe (1998), Statistics in Medicine 17:857, Table I, method 3 (Wilson score, no correction)
    for (k, n), (lo, hi) in {(81, 263): (0.2553, 0.3662), (15, 148): (0.0624, 0.1605),
                             (0, 20): (0.0, 0.1611), (1, 29): (0.0061, 0.1718)}.items():
        got = wilson_interval(k, n)
        assert got == pytest.approx((lo, hi), abs=5e-5)
    assert wilson_interval(10, 10)[1] == 1.0
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_accuracy_table_by_category_and_subtype():
    pred = pd.DataFrame(CASES)
    acc = accuracy_table(pred)
    assert list(acc.columns) == ["category", "n", "correct", "accuracy", "lo", "hi"]
    g = acc.set_index("category").loc["gravity"]
    assert (g["n"], g["correct"]) == (6, 1)
    assert (g["lo"], g["hi"]) == pytest.approx(wilson_interval(1, 6))
    assert acc.set_index("category").loc["all", "n"] == len(CASES)
    sub = accuracy_table(pred[pred["category"] == "equation_transformation"], ("subtype",), total=False)
    assert sub.to_dict("records")[0]["subtype"] == "numeric_deduce"
    with pytest.raises(LabError, match="no column"):
        accuracy_table(pred, ("nope",))


@pytest.fixture
def fake_solver(monkeypatch):
    """Replace the solver analysis calls: status by the prompt's first word, trace 'step a / step b'."""
    calls = []

    def solve(prompt, style="compact", **inputs):
        calls.append(prompt)
        solve.inputs.append(sorted(inputs))
        status = prompt.split()[0]
        return SimpleNamespace(answer="1", status=status, trace=done("step a\nstep b", "1"), reason="")

    solve.inputs = []
    monkeypatch.setattr(errors, "solve", solve)
    monkeypatch.setattr(errors, "_SOLVER_MEMO", {})
    return calls


def _status_pred():
    return pd.DataFrame([
        row("s1", "gravity", "1", done("step a\nstep b", "1"), prompt="solved one"),
        row("s2", "gravity", "1", done("step a\nstep c", "2"), prompt="solved two"),
        row("a1", "gravity", "1", done("other", "2"), prompt="ambiguous three"),
        row("u1", "gravity", "1", done("step a", "1"), prompt="undetermined four"),
    ])


def test_accuracy_by_status_and_solver_cache(fake_solver, tmp_path):
    acc = accuracy_table(_status_pred(), ("status",)).set_index("status")
    assert list(acc.index) == ["solved", "ambiguous", "undetermined", "all"]
    assert acc.loc["solved", ["n", "correct"]].tolist() == [2, 1]
    assert len(fake_solver) == 4
    assert errors.solve.inputs == [["priors", "vocab"]] * 4  # the batch's inputs, as solve_frame builds them
    accuracy_table(_status_pred(), ("status",))  # memo: no new solver calls
    assert len(fake_solver) == 4

    cache = tmp_path / "solutions.csv"
    errors.solve_prompts(["solved x"], cache_path=cache)
    assert len(fake_solver) == 5 and cache.is_file()
    errors._SOLVER_MEMO.clear()
    sol = errors.solve_prompts(["solved x"], cache_path=cache)  # from the CSV
    assert len(fake_solver) == 5 and sol["status"].tolist() == ["solved"]
    errors._SOLVER_MEMO.clear()
    df = pd.read_csv(cache, dtype=str, keep_default_na=False).assign(fingerprint="stale")
    atomic_write_csv(cache, df)
    errors.solve_prompts(["solved x"], cache_path=cache)  # other solver code: recomputed
    assert len(fake_solver) == 6


def test_first_departure():
    trace = done("step one\nstep two\nstep three", "7")
    assert first_departure(trace, trace) is None
    assert first_departure("step one\n\n  step   two \n", trace) is None  # prefix, whitespace-normalised
    assert first_departure("step one\nstep 2\nstep three", trace) == 2
    assert first_departure("something else", trace) == 1
    assert first_departure(trace + "\nextra", trace) == 6  # 5 trace steps, then more
    assert first_departure(done("step one\nstep two\nstep three", "8"), trace) == 5  # the box differs
    assert first_departure("anything", "") is None
    assert first_departure("anything", None) is None


def test_departure_table_uses_given_solutions():
    pred = _status_pred()
    sol = pd.DataFrame({"id": ["u1", "a1", "s2", "s1"], "status": ["undetermined", "ambiguous", "solved", "solved"],
                        "solver_trace": [done("cannot", ""), done("other", "2"), done("step a\nstep b", "1"),
                                         done("step a\nstep b", "1")]})
    dep = departure_table(pred, solutions=sol).set_index("id")
    assert list(dep.index) == ["s1", "s2", "a1"]  # undetermined left out
    assert pd.isna(dep.loc["s1", "departure"]) and pd.isna(dep.loc["a1", "departure"])
    assert dep.loc["s2", "departure"] == 2
    assert (dep.loc["s2", "model_step"], dep.loc["s2", "trace_step"]) == ("step c", "step b")
    with pytest.raises(LabError, match="no solution"):
        departure_table(pred, solutions=sol.iloc[:2])


def test_length_table_against_budget():
    pred = pd.DataFrame([row("a", "gravity", "1", done("x", "1"), tokens=100),
                         row("b", "gravity", "1", done("x", "2"), tokens=300),
                         row("c", "gravity", "1", "cut", tokens=500, finish_reason="length"),
                         row("d", "gravity", "1", done("x", "3"), tokens=1000)])
    t = length_table(pred, budget=1000).set_index(["category", "outcome"])
    assert t.loc[("gravity", "correct"), ["n", "max", "at_budget"]].tolist() == [1, 100.0, 0]
    w = t.loc[("gravity", "wrong")]
    assert (w["n"], w["median"], w["at_budget"]) == (3, 500.0, 2)
    assert t.loc[("all", "wrong"), "n"] == 3


def _pair():
    a = pd.DataFrame([row("1", "gravity", "1.00", done("x", "1.00")),
                      row("2", "gravity", "1.00", done("x", "5.00")),
                      row("3", "text_cipher", "cat", done("x", "cat")),
                      row("4", "text_cipher", "cat", done("x", "dog")),
                      row("5", "text_cipher", "cat", done("x", "dog"))])
    b = pd.DataFrame([row("1", "gravity", "1.00", done("x", "9.00")),  # broken
                      row("2", "gravity", "1.00", done("x", "1.00")),  # fixed
                      row("3", "text_cipher", "cat", done("x", "dog")),  # broken
                      row("4", "text_cipher", "cat", done("x", "cat")),  # fixed
                      row("5", "text_cipher", "cat", done("x", "cat")),  # fixed
                      row("6", "text_cipher", "cat", done("x", "cat"))])  # only in B
    return a, b


def test_compare_fixed_and_broken():
    a, b = _pair()
    summary, ex = compare(a, b)
    s = summary.set_index("category")
    assert s.loc["gravity", ["fixed", "broken", "net"]].tolist() == [1, 1, 0]
    assert s.loc["text_cipher", ["fixed", "broken", "net"]].tolist() == [2, 1, 1]
    assert s.loc["all", ["n", "fixed", "broken", "net"]].tolist() == [5, 3, 2, 1]
    assert s.loc["all", "acc_b"] - s.loc["all", "acc_a"] == pytest.approx(1 / 5)
    assert summary.attrs["only_b"] == ["6"] and summary.attrs["only_a"] == []
    assert ex["change"].tolist() == ["fixed"] * 3 + ["broken"] * 2
    assert ex.set_index("id").loc["1", ["answer_a", "answer_b", "failure_b"]].tolist() == ["1.00", "9.00", "wrong"]

    with pytest.raises(LabError, match="share no puzzle"):
        compare(a, b.assign(id=b["id"] + "x"))
    with pytest.raises(LabError, match="different gold"):
        compare(a, b.assign(gold="zzz"))


def test_compare_main_on_two_csvs(tmp_path, capsys):
    a, b = _pair()
    pa, pb = tmp_path / "a.csv", tmp_path / "b.csv"
    atomic_write_csv(pa, a)
    atomic_write_csv(pb, b)
    assert compare_main([str(pa), str(pb), "--examples", "2"]) == 0
    out = capsys.readouterr().out
    assert "text_cipher" in out and "fixed" in out and "broken" in out
    assert "1 only in B" in out and "first 2 of 5" in out
    assert load_predictions(pa)["correct"].tolist() == a["correct"].tolist()


def test_find_predictions_rule_and_errors(tmp_path, capsys):
    """A run folder: the last finished and current stage's predictions (never a .partial attempt, never by time)."""
    from finished import mark_finished  # tests/finished.py

    a, _ = _pair()
    run = tmp_path / "run"
    for stage in ("02_sft", "04_vote"):
        atomic_write_csv(run / stage / "predictions.csv", a)
        atomic_write_json(run / stage / "metrics.json", {})
        mark_finished(run / stage)
    atomic_write_csv(run / ".05_errors.partial" / "predictions.csv", a)  # a dead attempt: never read
    os.utime(run / "04_vote" / "predictions.csv", (1_000_000_000, 1_000_000_000))  # older: order is by stage
    assert find_predictions(run)[0] == run / "04_vote" / "predictions.csv"
    atomic_write_json(run / "04_vote" / "metrics.json", {"edited": 1})  # 04_vote no longer current: 02_sft's
    path, why = find_predictions(run)
    assert path == run / "02_sft" / "predictions.csv" and "skipped 04_vote (not current" in why
    with pytest.raises(LabError, match="04_vote is not finished and current"):
        find_predictions(run / "04_vote")
    with pytest.raises(LabError, match="did not finish"):
        find_predictions(run / ".05_errors.partial" / "predictions.csv")
    atomic_write_csv(tmp_path / "p.csv", a)
    assert find_predictions(tmp_path / "p.csv") == (tmp_path / "p.csv", "the file given")
    (tmp_path / "empty").mkdir()
    with pytest.raises(LabError, match="empty: no finished and current stage"):
        find_predictions(tmp_path / "empty")
    with pytest.raises(LabError, match="no such file"):
        find_predictions(tmp_path / "missing")

    from lab.__main__ import main

    assert main(["compare", str(run), str(tmp_path / "missing")]) == 2
    assert str(tmp_path / "missing") in capsys.readouterr().err


def test_load_predictions_types_and_errors(tmp_path):
    p = tmp_path / "p.csv"
    atomic_write_csv(p, pd.DataFrame(CASES[:3]).assign(tokens=["12", "", "7680"]))
    df = load_predictions(p)
    assert df["correct"].dtype == bool and df["correct"].tolist() == [True, True, False]
    assert str(df["tokens"].dtype) == "Int64" and pd.isna(df["tokens"].iloc[1])
    atomic_write_csv(p, pd.DataFrame(CASES[:2]).assign(tokens=["12", "many"]))
    with pytest.raises(LabError, match="row 2: column 'tokens'"):
        load_predictions(p)
    atomic_write_csv(p, pd.DataFrame(CASES[:2]).drop(columns=["gold"]))
    with pytest.raises(LabError, match="missing column"):
        load_predictions(p)
    with pytest.raises(LabError, match="not found"):
        load_predictions(tmp_path / "none.csv")


def test_the_analysis_returns_tables_and_a_headline_and_writes_nothing(fake_solver, tmp_path, monkeypatch):
    """The library returns data: the taxonomy, the solver's view and the headline, with no file written (the
    solver cache only where asked)."""
    monkeypatch.chdir(tmp_path)
    pred = pd.DataFrame(CASES)
    pred["prompt"] = ["solved " + i for i in pred["id"]]
    failures = errors.with_failures(pred, budget=7680)
    view = errors.solver_view(failures)
    m = errors.headline(accuracy_table(failures), taxonomy(failures), 7680, view)
    json.dumps(m, allow_nan=False)
    assert m["n"] == len(CASES) and m["budget"] == 7680
    assert m["accuracy"] == pytest.approx(2 / len(CASES))
    assert m["accuracy_by_category"]["gravity"]["n"] == 6
    assert m["taxonomy"]["all"]["wrong_format"] == 5
    assert m["accuracy_by_status"]["solved"]["n"] == len(CASES) and "all" in m["imitation"]
    table = errors.failures_table(view.failures)
    assert table["failure"].tolist() == [i.rsplit("-", 1)[0] for i in pred["id"]]
    assert list(table.columns) == list(errors.FAILURE_COLUMNS)
    assert "accuracy_by_status" not in errors.headline(accuracy_table(failures), taxonomy(failures), 7680)
    assert list(tmp_path.iterdir()) == []


def test_the_errors_recipe_writes_the_files_it_lists(fake_solver, tmp_path):
    """lab.recipes.errors' steps after the predictions, on a stand-in stage (a folder and a `finish` that keeps the
    metrics): every file of ANALYSIS_FILES and SOLVER_FILES is written, nothing else, and errors_metrics.json lists
    them; without prompts the solver's files are left out."""
    from lab.core.config import compose
    from lab.recipes import errors as recipe

    class StandIn:
        def __init__(self, folder):
            self.dir, self.cfg, self.finished = folder, compose(["experiment=smoke"]), None
            folder.mkdir()

        def path(self, *parts):
            return self.dir.joinpath(*parts)

        def finish(self, metrics):
            self.finished = metrics
            return metrics

    pred = pd.DataFrame(CASES)
    for name, prompts in (("with_solver", True), ("no_prompts", False)):
        pred["prompt"] = ["solved " + i for i in pred["id"]] if prompts else ""
        stage = StandIn(tmp_path / name)
        failures = recipe.classify(pred, 7680)
        by_category, classes = recipe.accuracy(stage, failures), recipe.taxonomy(stage, failures)
        solver = recipe.solver_or_imitation(stage, failures)
        recipe.lengths(stage, failures, 7680)
        changes = pd.DataFrame({"category": ["all"], "fixed": [3], "broken": [1]})
        m = recipe.errors_finish(stage, failures, solver, by_category, classes, 7680, changes)
        expected = sorted(recipe.ANALYSIS_FILES + (recipe.SOLVER_FILES if prompts else ()))
        assert sorted(p.name for p in stage.dir.iterdir()) == expected
        assert json.loads(stage.path("errors_metrics.json").read_text())["files"] == expected
        for png in stage.dir.glob("*.png"):
            assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (m["fixed_since_sft"], m["broken_since_sft"], m["n"]) == (3, 1, len(CASES))
        assert ("accuracy_by_status" in m) is prompts and "files" not in m
        failures_csv = pd.read_csv(stage.path("failures.csv"), dtype=str, keep_default_na=False)
        assert failures_csv["failure"].tolist() == [i.rsplit("-", 1)[0] for i in pred["id"]]


def test_empty_predictions():
    from lab.recipes import errors as recipe

    empty = pd.DataFrame(columns=list(CASES[0]))
    assert taxonomy(empty)["n"].tolist() == [0]
    assert accuracy_table(empty)["n"].tolist() == [0]
    with pytest.raises(LabError, match="no predictions"):
        recipe.classify(empty, 7680)


def test_solver_cache_keyed_by_trace_style(fake_solver):
    """Departures compare with the trace style the model was trained on: each style is solved and cached apart."""
    errors.solve_prompts(["solved one"])
    errors.solve_prompts(["solved one"], style="derivation")
    errors.solve_prompts(["solved one"], style="derivation")
    assert len(fake_solver) == 2


def test_line_kind():
    from lab.eval.analysis import line_kind

    assert line_kind("ex3: cands !*[{ '\"[ = none") == "cands"
    assert line_kind("q: add 12 34 = 46") == "add"
    assert line_kind("back") == "back"
    assert line_kind("note keep plain a+b") == "note"
    assert line_kind("mode: reversed") == "mode"
    assert line_kind("|37-12| = 25") == "|N-N| = N"
    assert line_kind("</think>") == "</think>"
    assert line_kind("\\boxed{5}") == "box"
    assert line_kind("  ") == ""


def test_imitation_table_on_literal_completions():
    from lab.eval.analysis import imitation_table, with_solver

    trace = done("ex1: add 1 2 = 3\nex1: eq 3 3 = yes\nq: add 2 2 = 4", "4")
    pred = pd.DataFrame([
        row("p1", "equation_transformation", "4", trace),  # the trace, line for line: perfect
        row("p2", "equation_transformation", "4", done("ex1: add 1 2 = 3\nex1: eq 3 3 = yes\nq: mul 2 2 = 4", "4")),
        row("p3", "equation_transformation", "4", done("ex1: add 1 2 = 4", "5")),  # leaves at line 1, an add
        row("g1", "gravity", "9.80", done("q: mul 2 4.9 = 9.8", "9.80")),
        row("g2", "gravity", "1.00", done("q: mul 2 4.9 = 9.8", "9.80")),  # the solver is wrong here too
    ])
    sol = pd.DataFrame({"id": ["p1", "p2", "p3", "g1", "g2"], "status": ["solved"] * 5,
                        "solver_answer": ["4", "4", "4", "9.80", "9.80"],
                        "solver_trace": [trace, trace, trace, done("q: mul 2 4.9 = 9.8", "9.80"),
                                         done("q: mul 2 4.9 = 9.8", "9.80")]})
    df = with_solver(pred, solutions=sol)
    dep = departure_table(df)
    # the trace's line there
    assert dict(zip(dep["id"], dep["kind"])) == {"p1": "", "p2": "add", "p3": "add", "g1": "", "g2": ""}
    t = imitation_table(df, dep).set_index("category")
    eq = t.loc["equation_transformation"]
    assert (eq["n"], eq["model_accuracy"], eq["solver_accuracy"]) == (3, round(2 / 3, 4), 1.0)
    assert eq["solver_minus_model"] == round(1 - 2 / 3, 4)
    assert eq["perfect_trace_rate"] == round(1 / 3, 4)
    assert (eq["median_departure"], eq["departure_kind"], eq["departure_kind_n"]) == (2.0, "add", 2)
    g = t.loc["gravity"]
    assert (g["model_accuracy"], g["solver_accuracy"], g["solver_minus_model"], g["perfect_trace_rate"]) == \
        (0.5, 0.5, 0.0, 1.0)
    assert t.loc["all", "n"] == 5 and t.loc["all", "perfect_trace_rate"] == 0.6
    with pytest.raises(LabError, match="solver_answer"):
        imitation_table(pred, dep)
