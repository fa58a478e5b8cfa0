"""solve_frame, trace_tokens and the `python -m lab puzzles` commands (CPU only, offline)."""

import pandas as pd

from lab.puzzles import CATEGORIES, generate, solve_frame, trace_tokens
from lab.puzzles.cli import main


def mixed(n=8, seed=0):
    return pd.concat([generate(c, n, seed) for c in CATEGORIES], ignore_index=True)


def test_solve_frame_columns_and_correct():
    df = mixed()
    out = solve_frame(df)
    for col in ["id", "category", "subtype", "status", "answer", "trace", "trace_tokens", "reason", "correct"]:
        assert col in out.columns
    assert out["id"].tolist() == df["id"].tolist()
    assert out["category"].tolist() == df["category"].tolist()
    assert out["correct"].mean() > 0.9
    assert (out["trace_tokens"] > 0).all() and (out["trace_tokens"] < 400).all()
    assert "correct" not in solve_frame(df.drop(columns=["answer"])).columns


def test_trace_tokens_estimate_and_tokenizer():
    t = "rule: x\nx = 00000001\n</think>\n\\boxed{00000001}"
    # without a tokenizer, an estimate: each digit 1, a space before a digit 1, a run of letters or a mark 1, each
    # newline 1: rule : x / x = _ 8 digits / < / think > / \ boxed { 8 digits } (the real tokenizer: 31)
    assert trace_tokens(t) == 3 + 11 + 4 + 12 + 3

    class Tok:  # a stand-in with the HF call signature
        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": list(text)}

    assert trace_tokens(t, Tok()) == len(t)


def test_cli_generate_and_solve(tmp_path, capsys):
    inp, out = tmp_path / "in.csv", tmp_path / "out.csv"
    assert main(["generate", "--category", "equation_transformation", "--n", "12", "--seed", "3",
                 "--set", "symbolic=0.5", "--set", "ops=simple", str(inp)]) == 0
    df = pd.read_csv(inp, dtype=str, keep_default_na=False)
    assert len(df) == 12 and df["id"].is_unique
    assert main(["solve", str(inp), str(out)]) == 0
    res = pd.read_csv(out, dtype=str, keep_default_na=False)
    assert {"id", "category", "subtype", "status", "answer", "trace_tokens", "trace"} <= set(res.columns)
    text = capsys.readouterr().out
    assert "equation_transformation" in text and "accuracy" in text and "puzzles/s" in text


def test_cli_errors(tmp_path, capsys):
    assert main(["solve", str(tmp_path / "missing.csv"), str(tmp_path / "o.csv")]) == 2
    assert main(["generate", "--category", "nope", "--n", "1", str(tmp_path / "o.csv")]) == 2
    assert "error:" in capsys.readouterr().err


def test_solve_frame_pool_matches_serial():
    df = mixed(3, seed=4)
    a = solve_frame(df, workers=1).drop(columns=["seconds"])
    b = solve_frame(df, workers=2).drop(columns=["seconds"])
    pd.testing.assert_frame_equal(a, b)


def test_method_table_counts_solver_methods():
    from lab.puzzles import method_table

    out = pd.DataFrame({"category": ["bit_manipulation"] * 3 + ["gravity"],
                        "method": ["pipeline", "pipeline", "one copy", ""],
                        "status": ["solved", "ambiguous", "solved", "solved"], "correct": [True, False, True, True]})
    t = method_table(out)
    assert t.to_dict("records") == [
        {"category": "bit_manipulation", "method": "pipeline", "n": 2, "solved": 1, "accuracy": 0.5},
        {"category": "bit_manipulation", "method": "one copy", "n": 1, "solved": 1, "accuracy": 1.0}]
    assert "accuracy" not in method_table(out.drop(columns=["correct"])).columns
