"""Trace styles and the trace checker (each category's `derive`, lab.puzzles.check): the styles differ in the trace
only, both replay, and corrupted traces (a wrong digit, a skipped step, a wrong box) do not."""

import re
from pathlib import Path

import pandas as pd
import pytest

from lab import LabError
from lab.core.config import compose
from lab.puzzles import CATEGORIES, generate, solve, solve_frame, token_table
from lab.puzzles.cli import main
from lab.puzzles.check import replay_derivation, split_trace
from lab.puzzles.solve import check_frame, replay

TOKENIZER = Path(__file__).resolve().parents[2] / "shared" / "tokenizer" / "nemotron-3-nano"
KNOBS = {"bit_manipulation": [{"complexity": c} for c in (1, 2, 3, 5)],
         "equation_transformation": [{}, {"symbolic": 1.0}]}


def puzzles(category, n=4):
    frames = [generate(category, n, seed=i, **k) for i, k in enumerate(KNOBS.get(category, [{}]))]
    return pd.concat(frames, ignore_index=True)


@pytest.fixture(scope="module", params=CATEGORIES)
def solved(request):
    df = puzzles(request.param)
    a = solve_frame(df, progress=False, workers=1, style="compact")
    b = solve_frame(df, progress=False, workers=1, style="derivation")
    return df, a, b


def test_styles_differ_in_trace_only(solved):
    df, a, b = solved
    for col in ("status", "answer", "method", "category", "subtype", "correct"):
        assert a[col].tolist() == b[col].tolist(), col
    assert (a["status"] == "solved").any()
    assert (a["trace"] != b["trace"]).any()


def test_both_styles_replay(solved):
    df, a, b = solved
    for style, out in (("compact", a), ("derivation", b)):
        rows, summary = check_frame(out.assign(prompt=df["prompt"].tolist()), style=style)
        assert len(rows) and rows["ok"].all(), rows.loc[~rows["ok"], "message"].tolist()[:3]


def _derivation(category):
    for p in puzzles(category)["prompt"]:
        s = solve(p, style="derivation")
        if s.status == "solved":
            return p, s
    raise AssertionError(f"no solved {category} puzzle")


def _corrupt_digit(trace):
    """The first op line whose result ends in a digit (a letter for the cipher) gets that character changed."""
    lines = trace.split("\n")
    swaps = ((r"\d$", lambda c: "1" if c == "0" else "0"), (r"[a-z]$", lambda c: "a" if c != "a" else "b"))
    for pattern, swap in swaps:
        for i, ln in enumerate(lines):
            if " = " in ln and re.search(pattern, ln) and not ln.startswith(("note", "let")) and ln[-5:] not in (
                    "= yes", " = no"):
                lines[i] = ln[:-1] + swap(ln[-1])
                return "\n".join(lines), i + 1
    raise AssertionError("no step to corrupt")


def _skip_step(prompt, trace):
    """Removes the first op line whose result (not in the prompt) a later line uses."""
    lines = trace.split("\n")
    for i, ln in enumerate(lines[:-2]):
        if " = " not in ln or ln.startswith(("note", "let")):
            continue
        res = ln.rsplit(" = ", 1)[1]
        earlier = {v for e in lines[:i] for v in e.split()}
        if len(res) > 1 and res not in ("yes", "no", *earlier) and res not in prompt and any(res in later.split()
                                                                             for later in lines[i + 1:]):
            return "\n".join(lines[:i] + lines[i + 1:])
    raise AssertionError("no step to skip")


@pytest.mark.parametrize("category", CATEGORIES)
def test_checker_rejects_corrupted_derivations(category):
    prompt, sol = _derivation(category)
    assert replay("derivation", category, prompt, sol.trace)[0]
    bad, line = _corrupt_digit(sol.trace)
    ok, at, msg, _ = replay("derivation", category, prompt, bad)
    assert not ok and at == line, msg
    ok, _, msg, _ = replay("derivation", category, prompt, _skip_step(prompt, sol.trace))
    assert not ok and "neither in the prompt nor in an earlier line" in msg
    wrong_box = sol.trace.rsplit("\\boxed{", 1)[0] + "\\boxed{" + sol.answer[::-1] + "x}"
    ok, _, msg, _ = replay("derivation", category, prompt, wrong_box)
    assert not ok and "boxed" in msg


@pytest.mark.parametrize("category", ["bit_manipulation", "gravity", "numeral_system"])
def test_checker_rejects_corrupted_compact(category):
    p = next(p for p in puzzles(category)["prompt"] if solve(p).status == "solved")
    sol = solve(p)
    assert replay("compact", category, p, sol.trace)[0]
    lines = sol.trace.split("\n")
    i = next(i for i, ln in enumerate(lines) if re.search(r"[\d)] = [^=]*\d$", ln))  # a computed line
    lines[i] = lines[i][:-1] + ("1" if lines[i][-1] == "0" else "0")
    assert not replay("compact", category, p, "\n".join(lines))[0]
    assert not replay("compact", category, p, sol.trace.replace(f"\\boxed{{{sol.answer}}}", "\\boxed{0}"))[0]


def test_grammar_basics():
    prompt = "numbers 12 and 30 here"
    ok = "add 12 30 = 42\nmul 42 2 = 84\n</think>\n\\boxed{84}"
    assert replay_derivation(prompt, ok)[0]
    assert not replay_derivation(prompt, "add 12 31 = 43\n</think>\n\\boxed{43}")[0]  # 31 is not written anywhere
    assert replay_derivation(prompt, "add 1 30 = 31\n</think>\n\\boxed{31}")[0]  # one character is a constant
    assert not replay_derivation(prompt, "add 12 3 = 15\nfoo 15 = 1\n</think>\n\\boxed{1}")[0]  # unknown op
    assert not replay_derivation("x 123 y", "copy 12\n</think>\n\\boxed{12}")[0]  # 12 only inside 123
    assert replay_derivation(prompt, "div 12 30 = 0.4\ndiv 30 12 = 2.5\n</think>\n\\boxed{2.5}")[0]
    assert not replay_derivation(prompt, "div 30 7 = 4.28\n</think>\n\\boxed{4.28}")[0]  # 4.2857 rounds to 4.29
    assert split_trace("a\n</think>\n\\boxed{x y}") == (["a"], "x y")


def test_cli_solve_and_check(tmp_path, capsys):
    df = pd.concat([generate(c, 3, seed=5) for c in CATEGORIES], ignore_index=True)
    inp, out = tmp_path / "in.csv", tmp_path / "out.csv"
    df.to_csv(inp, index=False)
    assert main(["solve", str(inp), str(out), "--trace-style", "derivation"]) == 0
    got = pd.read_csv(out, dtype=str, keep_default_na=False)
    assert {"trace", "trace_tokens", "trace_style", "prompt"} <= set(got.columns)
    assert set(got["trace_style"]) == {"derivation"}
    assert "p99" in capsys.readouterr().out
    assert main(["check", str(out)]) == 0
    row = got.index[got["status"] == "solved"][0]
    got.loc[row, "trace"] = got.loc[row, "trace"].replace("\\boxed{", "\\boxed{9")
    got.to_csv(out, index=False)
    assert main(["check", str(out)]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_token_table_columns():
    df = pd.DataFrame({"category": ["a", "a", "b"], "trace_style": ["compact"] * 3, "trace_tokens": [10, 20, 9000]})
    t = token_table(df)
    assert list(t.columns) == ["category", "trace_style", "n", "p50", "p90", "p99", "max", "over_budget"]
    assert t.loc[t["category"] == "b", "over_budget"].item() == 1.0


def test_config_trace_style(tmp_path):
    from lab.data.dataset import count_tokenizer, trace_style

    assert trace_style(compose([f"run_dir={tmp_path}"])) == "compact"
    assert trace_style(compose(["experiment=competition", f"run_dir={tmp_path}"])) == "derivation"
    with pytest.raises(LabError, match="trace_style"):
        trace_style(compose(["data.trace_style=verbose", f"run_dir={tmp_path}"]))
    assert count_tokenizer(compose([f"run_dir={tmp_path}"]), "model") == "model"
    with pytest.raises(LabError, match="tokenizer_path"):
        count_tokenizer(compose([f"data.tokenizer_path={tmp_path}", f"run_dir={tmp_path}"]))


@pytest.mark.slow  # loads the real tokenizer and solves every category: seconds (the fast lane stays short)
@pytest.mark.skipif(not (TOKENIZER / "tokenizer.json").is_file(), reason="../shared tokenizer absent")
def test_real_tokenizer_counts_within_budget():
    df = pd.concat([puzzles(c, 3) for c in CATEGORIES], ignore_index=True)
    out = solve_frame(df, tokenizer=str(TOKENIZER), progress=False, workers=1, style="derivation")
    assert (out["trace_tokens"] > 0).all()
    assert out["trace_tokens"].max() <= 7680
    bits = out.loc[out["category"] == "bit_manipulation", "trace_tokens"]
    assert bits.median() < 4900


def test_trace_bench_tables_pool_seeds_with_wilson_intervals(bench):
    """bench/trace_bench.py's tables: per job and pooled over seeds, accuracy with its Wilson interval."""
    from lab.eval.analysis import wilson_interval

    bench = bench("trace_bench")
    common = {"probe": "equations", "capped": 1, "trace_tokens_max": 900, "max_tokens": 1125, "train_loss": 1.0,
              "steps": 150, "wall_s": 10.0}
    rows = [{**common, "style": "derivation", "seed": 1, "n": 4, "correct": 3, "trace_tokens_p50": 500},
            {**common, "style": "derivation", "seed": 2, "n": 4, "correct": 1, "trace_tokens_p50": 700},
            {**common, "style": "compact", "seed": 1, "n": 4, "correct": 0, "trace_tokens_p50": 80}]
    table, pooled = bench.tables(rows)
    assert table["accuracy"].tolist() == [0.75, 0.25, 0.0]
    assert (table.loc[0, "lo"], table.loc[0, "hi"]) == pytest.approx(wilson_interval(3, 4))
    d = pooled.set_index("style").loc["derivation"]
    assert (d["seeds"], d["n"], d["accuracy"], d["capped"], d["trace_tokens_p50"], d["wall_s"]) == (2, 8, 0.5, 2, 600,
                                                                                                     20.0)
    assert (d["lo"], d["hi"]) == pytest.approx(wilson_interval(4, 8))


@pytest.mark.slow
def test_trace_bench_smoke_runs_both_styles_and_reuses_finished_jobs(tmp_path, bench):
    """The plumbing end to end at the smallest budget: one job per style, and a rerun trains nothing again."""
    import json

    bench = bench("trace_bench")
    argv = ["--smoke", "--categories", "numerals", "--seeds", "1", "--out", str(tmp_path)]
    assert bench.main(argv) == 0
    first = json.loads((tmp_path / "trace_bench_smoke.json").read_text())
    assert [(j["style"], j["n"], j["steps"]) for j in first["jobs"]] == [("compact", 8, 2), ("derivation", 8, 2)]
    compact, derivation = first["jobs"]
    assert derivation["trace_tokens_p50"] > 3 * compact["trace_tokens_p50"]
    assert all(j["max_tokens"] >= 1.25 * j["trace_tokens_max"] for j in first["jobs"])
    manifests = sorted(tmp_path.rglob("02_sft/manifest.json"))
    stamps = [m.read_text() for m in manifests]
    assert bench.main(argv) == 0
    assert [m.read_text() for m in manifests] == stamps  # reused, not rerun
    assert json.loads((tmp_path / "trace_bench_smoke.json").read_text())["jobs"] == first["jobs"]
    assert bench.main([*argv, "--report", "--seeds", "2"]) == 0  # seed 2 never ran: left out, nothing trained
    assert json.loads((tmp_path / "trace_bench_smoke.json").read_text())["jobs"] == first["jobs"]
    assert [m.read_text() for m in manifests] == stamps
