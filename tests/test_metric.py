"""The competition's scorer: extraction, comparison, score/judge and the `score` command line."""

from __future__ import annotations


import pandas as pd
import pytest

from lab.competition import metric
from lab import LabError
from lab.eval.cli import score_main
from lab.competition.metric import extract_answer, judge, score, verify

B = "\\boxed"

# (text, final answer, final source, legacy answer)
EXTRACTION = [
    pytest.param(B + "{42}", "42", "boxed", "42", id="simple-box"),
    pytest.param(B + "{\\frac{1}{2}}", "\\frac{1}{2}", "boxed", "\\frac{1", id="nested-braces"),
    pytest.param("so " + B + "{@&}} done", "@&}", "boxed", "@&", id="brace-inside-answer"),
    pytest.param(B + "{17}/}", "17}/", "boxed", "17", id="brace-then-slash"),
    pytest.param(B + "{1} then " + B + "{2} and " + B + "{3}", "3", "boxed", "3", id="several-boxes"),
    pytest.param(B + "{a}} x " + B + "{b}", "b", "boxed", "b", id="several-boxes-brace-in-first"),
    pytest.param(B + "{7} and finally " + B + "{}", "7", "boxed", "7", id="empty-last-box"),
    pytest.param(B + "{7} and finally " + B + "{  }", "7", "boxed", "7", id="blank-last-box"),
    pytest.param(B + "{} " + B + "{ }", "", "boxed", "", id="all-boxes-empty"),
    pytest.param("answer " + B + "{ 12 ", "12", "boxed", "12", id="unclosed-box"),  # legacy: last number
    pytest.param(B + "{5} is it. 99 more words", "5", "boxed", "5", id="text-after-box"),
    pytest.param(B + "{ 00011011 }", "00011011", "boxed", "00011011", id="box-stripped-leading-zeros"),
    pytest.param(B + "{-3}\n" + B + "{x", "x", "boxed", "-3", id="unclosed-last-box"),
    pytest.param("The final answer is: 12\nok", "12", "phrase", "12", id="phrase-the-final-answer-is"),
    pytest.param("final ANSWER is:  abc  ", "abc", "phrase", "abc", id="phrase-case-insensitive"),
    pytest.param("Final answer: 3\nFinal answer: 4", "4", "phrase", "4", id="phrase-last-match"),
    pytest.param("Final answer：XLII", "XLII", "phrase", "XLII", id="phrase-full-width-colon"),
    pytest.param("Final answer ： 8", "8", "phrase", "8", id="phrase-space-before-colon"),
    pytest.param("Final answer:\n42", "42", "phrase", "42", id="phrase-crosses-line-break"),
    pytest.param("The final answer is: 5\nFinal answer: 7", "5", "phrase", "5", id="phrase-pattern-order"),
    pytest.param("we get 3 then 4.5 then -12.25.", "-12.25", "number", "-12.25", id="last-number"),
    pytest.param("x = -7", "-7", "number", "-7", id="last-number-negative"),
    pytest.param("1e5", "5", "number", "5", id="number-regex-not-float"),
    pytest.param("no digits here\n  the answer is cat  \n\n", "the answer is cat", "last_line",
                 "the answer is cat", id="last-line"),
    pytest.param("   \n\t\n", "NOT_FOUND", "not_found", "NOT_FOUND", id="blank-text"),
    pytest.param("", "NOT_FOUND", "not_found", "NOT_FOUND", id="empty-text"),
    pytest.param(None, "NOT_FOUND", "not_found", "NOT_FOUND", id="none"),
]


@pytest.mark.parametrize("text, final, source, legacy", EXTRACTION)
def test_extraction(text, final, source, legacy):
    assert extract_answer(text) == final
    assert extract_answer(text, "final") == final
    assert metric._extract(text, "final") == (final, source)
    assert extract_answer(text, version="legacy") == legacy


# (gold, predicted, final, legacy)
COMPARISON = [
    pytest.param("00011011", "11011", False, True, id="binary-leading-zeros-dropped"),
    pytest.param("00011011", "00011011", True, True, id="binary-same"),
    pytest.param("00011011", " 00011011 ", True, True, id="binary-stripped"),
    pytest.param("1", "1.0", False, True, id="binary-vs-float"),
    pytest.param("10", "10.001", False, True, id="binary-near-float"),
    pytest.param("1010", "1011", False, True, id="binary-different-but-within-1pct-as-floats"),
    pytest.param("200", "201.9", True, True, id="inside-tolerance-above"),
    pytest.param("200", "198.1", True, True, id="inside-tolerance-below"),
    pytest.param("200", "202.1", False, False, id="outside-tolerance-above"),
    pytest.param("200", "197.9", False, False, id="outside-tolerance-below"),
    pytest.param("-50", "-50.4", True, True, id="negative-inside"),
    pytest.param("-50", "-51", False, False, id="negative-outside"),
    pytest.param("-50", "50", False, False, id="negative-sign"),
    pytest.param("0.0", "0.000009", True, True, id="abs-tol-inside"),
    pytest.param("0.0", "0.0001", False, False, id="abs-tol-outside"),
    pytest.param("0", "0.000009", False, True, id="gold-0-is-binary"),
    pytest.param("25.5", "2.55e1", True, True, id="exponent-parses"),
    pytest.param(" 11 ", "11.05", False, True, id="binary-after-strip"),
    pytest.param("12.0", " 12 ", True, True, id="spaces-stripped"),
    pytest.param("nan", "nan", False, False, id="nan-never-equal"),
    pytest.param("inf", "INF", True, True, id="inf-equal"),
    pytest.param("0x10", "0X10", True, True, id="hex-is-a-string"),
    pytest.param("0x10", "16", False, False, id="hex-not-a-number"),
    pytest.param("1_000", "1000", True, True, id="underscore-parses-like-python"),
    pytest.param("XLII", "xlii", True, True, id="string-case-insensitive"),
    pytest.param("3.5 m", "3.5", False, False, id="no-unit-stripping"),
    pytest.param("\\frac{1}{2}", "0.5", False, False, id="no-latex-normalising"),
    pytest.param("@&}", "@&}", True, True, id="brace-answer"),
    pytest.param("abc", "NOT_FOUND", False, False, id="not-found"),
]


@pytest.mark.parametrize("gold, predicted, final, legacy", COMPARISON)
def test_verify(gold, predicted, final, legacy):
    assert verify(gold, predicted) is final
    assert verify(gold, predicted, "legacy") is legacy


def test_whitespace_gold_12_is_not_binary():
    # after stripping, " 12 " is "12": not only 0/1, so compared as numbers
    assert verify(" 12 ", "12.05")


def test_verify_none_prediction_and_bad_gold():
    assert verify("NOT_FOUND", None) is True
    assert verify("5", None) is False
    with pytest.raises(TypeError, match="gold answer must be a str"):
        verify(5, "5")


def test_legacy_and_final_differ_on_brace_answer():
    out = "thinking...\n" + B + "{@&}}"
    assert verify("@&}", extract_answer(out)) is True
    assert verify("@&}", extract_answer(out, "legacy"), "legacy") is False
    assert score(["@&}"], [out]) == 1.0
    assert score(["@&}"], [out], version="legacy") == 0.0


def test_legacy_and_final_differ_on_binary_as_float():
    out = B + "{11011}"
    assert score(["00011011"], [out]) == 0.0
    assert score(["00011011"], [out], "legacy") == 1.0


@pytest.mark.parametrize("fn", [lambda v: extract_answer("x", v), lambda v: verify("1", "1", v),
                                lambda v: score(["1"], ["1"], v), lambda v: judge(["1"], ["1"], v)])
def test_unknown_version(fn):
    with pytest.raises(ValueError, match="final, legacy"):
        fn("v3")


def test_score_small_list():
    golds = ["42", "00011011", "XLII", "3.14", "cat"]
    outs = [B + "{42}", B + "{11011}", "Final answer: xlii", "pi is about 3.1416", None]
    assert score(golds, outs) == pytest.approx(3 / 5)
    assert score(golds, outs, "legacy") == pytest.approx(4 / 5)
    assert score([], []) == 0.0
    with pytest.raises(ValueError, match="2 gold answers but 1 outputs"):
        score(["1", "2"], ["1"])


def test_judge_columns():
    golds = ["42", "7", "XLII", "9", "x"]
    outs = [B + "{42}", "Final answer: 8", "nothing\nXLII", "is 9.", ""]
    t = judge(golds, outs)
    assert list(t.columns) == ["gold", "answer", "correct", "source"]
    assert t["gold"].tolist() == golds
    assert t["answer"].tolist() == ["42", "8", "XLII", "9", "NOT_FOUND"]
    assert t["correct"].tolist() == [True, False, True, True, False]
    assert t["correct"].dtype == bool
    assert t["source"].tolist() == ["boxed", "phrase", "last_line", "number", "not_found"]


# ---------------------------------------------------------------------------------------------
# the command line
# ---------------------------------------------------------------------------------------------

def _write(path, df):
    df.to_csv(path, index=False)
    return str(path)


@pytest.fixture
def gold_csv(tmp_path):
    return _write(tmp_path / "gold.csv", pd.DataFrame({
        "id": ["a1", "b2", "c3", "d4"],
        "answer": ["00011011", "42", "@&}", "XLII"],
        "category": ["bit_manipulation", "gravity", "equation", "numeral_system"],
    }))


def test_cli_with_completions(tmp_path, gold_csv, capsys):
    pred = _write(tmp_path / "pred.csv", pd.DataFrame({
        "id": ["d4", "c3", "b2", "a1"],  # another order: matched by id
        "completion": ["Final answer: xlii", "<think>ok</think>" + B + "{@&}}", "it is 41.9", B + "{11011}"],
    }))
    details = tmp_path / "details.csv"
    assert score_main([pred, "--gold", gold_csv, "--details", str(details)]) == 0
    out = capsys.readouterr().out
    assert "accuracy (final): 0.7500  (3/4)" in out
    assert "bit_manipulation" in out and "0.0000    0/1" in out
    d = pd.read_csv(details, dtype=str, keep_default_na=False)
    assert d["id"].tolist() == ["a1", "b2", "c3", "d4"]
    assert d["source"].tolist() == ["boxed", "number", "boxed", "phrase"]

    assert score_main([pred, "--gold", gold_csv, "--version", "legacy"]) == 0
    assert "accuracy (legacy): 0.7500  (3/4)" in capsys.readouterr().out  # binary right, brace wrong


def test_cli_with_extracted_answers(tmp_path, gold_csv, capsys):
    pred = _write(tmp_path / "pred.csv", pd.DataFrame({
        "id": ["a1", "b2", "c3", "d4"], "answer": ["00011011", "42.1", "@&}", "XLI"]}))
    assert score_main([pred, "--gold", gold_csv]) == 0
    assert "accuracy (final): 0.7500  (3/4)" in capsys.readouterr().out


def test_cli_through_dispatcher(tmp_path, gold_csv, capsys):
    from lab.__main__ import main as lab_main

    pred = _write(tmp_path / "pred.csv", pd.DataFrame({"id": ["a1", "b2", "c3", "d4"], "answer": ["0"] * 4}))
    assert lab_main(["score", pred, "--gold", gold_csv]) == 0
    assert "0.0000  (0/4)" in capsys.readouterr().out
    assert lab_main(["score", str(tmp_path / "nope.csv"), "--gold", gold_csv]) == 2
    assert "nope.csv: predictions file not found" in capsys.readouterr().err


def test_cli_categories_from_classify(tmp_path, capsys, monkeypatch):
    import lab.eval.cli

    monkeypatch.setattr(lab.eval.cli, "classify", lambda prompt: ("alpha" if "A" in prompt else "beta", "x"))
    gold = _write(tmp_path / "gold.csv", pd.DataFrame({"id": ["1", "2"], "prompt": ["A?", "B?"], "answer": ["5", "6"]}))
    pred = _write(tmp_path / "pred.csv", pd.DataFrame({"id": ["1", "2"], "answer": ["5", "7"]}))
    assert score_main([pred, "--gold", gold]) == 0
    out = capsys.readouterr().out
    assert "alpha" in out and "1.0000    1/1" in out and "beta" in out and "0.0000    0/1" in out


def test_cli_no_categories(tmp_path, capsys):
    gold = _write(tmp_path / "gold.csv", pd.DataFrame({"id": ["1"], "answer": ["5"]}))
    pred = _write(tmp_path / "pred.csv", pd.DataFrame({"id": ["1"], "answer": ["5"]}))
    assert score_main([pred, "--gold", gold]) == 0
    out = capsys.readouterr().out
    assert "1.0000  (1/1)" in out and "category" not in out


@pytest.mark.parametrize("pred_df, gold_df, message", [
    (pd.DataFrame({"id": ["1"], "text": ["5"]}), None, "pred.csv: needs a 'completion'"),
    (pd.DataFrame({"answer": ["5"]}), None, "pred.csv: missing column(s) ['id']"),
    (None, pd.DataFrame({"id": ["1"], "gold": ["5"]}), "gold.csv: missing column(s) ['answer']"),
    (pd.DataFrame({"id": ["1", "9"], "answer": ["5", "5"]}), None, "1 prediction id(s) not in gold ['9']"),
    (pd.DataFrame({"id": ["x"], "answer": ["5"]}), None, "1 gold id(s) without a prediction ['1']"),
    (pd.DataFrame({"id": ["1", "1"], "answer": ["5", "5"]}), None, "pred.csv: duplicate id(s) ['1']"),
])
def test_cli_errors(tmp_path, pred_df, gold_df, message):
    pred_df = pred_df if pred_df is not None else pd.DataFrame({"id": ["1"], "answer": ["5"]})
    gold_df = gold_df if gold_df is not None else pd.DataFrame({"id": ["1"], "answer": ["5"]})
    pred = _write(tmp_path / "pred.csv", pred_df)
    gold = _write(tmp_path / "gold.csv", gold_df)
    with pytest.raises(LabError) as e:
        score_main([pred, "--gold", gold])
    assert message in str(e.value)


def test_cli_missing_empty_and_non_utf8_files(tmp_path):
    gold = _write(tmp_path / "gold.csv", pd.DataFrame({"id": ["1"], "answer": ["5"]}))
    with pytest.raises(LabError, match="missing.csv: predictions file not found"):
        score_main([str(tmp_path / "missing.csv"), "--gold", gold])
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(LabError, match="empty.csv: empty file"):
        score_main([str(tmp_path / "empty.csv"), "--gold", gold])
    (tmp_path / "latin.csv").write_bytes("id,answer\n1,caf\xe9\n".encode("latin-1"))
    with pytest.raises(LabError, match="latin.csv: not UTF-8"):
        score_main([str(tmp_path / "latin.csv"), "--gold", gold])


def test_cli_keeps_leading_zeros_and_na(tmp_path, capsys):
    gold = _write(tmp_path / "gold.csv", pd.DataFrame({"id": ["007", "NA"], "answer": ["0101", "NA"]}))
    pred = _write(tmp_path / "pred.csv", pd.DataFrame({"id": ["NA", "007"], "answer": ["na", "101"]}))
    assert score_main([pred, "--gold", gold]) == 0
    assert "0.5000  (1/2)" in capsys.readouterr().out
