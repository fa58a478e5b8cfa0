"""The trace audit (lab.puzzles.audit) on literal traces, corrupted ones included, and the bits derivation in the
competition's layout (lab.puzzles.bits._layout): it replays, reads F as a table, states its choice and
its default, and the checker rejects a table with a clash and a default on a key an example shows."""

import random

import pandas as pd

from lab.puzzles import solve
from lab.puzzles.__main__ import main
from lab.puzzles.audit import audit_frame, audit_trace, shape
from lab.puzzles.bitrules import b8, make_prompt, shift_copy
from lab.puzzles.check import replay_derivation

PROMPT = "numbers 12 and 30 here, then 7"
CLEAN = "note add them\nex1: add 12 30 = 42\nex1: mul 42 2 = 84\ncopy 30\n</think>\n\\boxed{30}"


def test_provenance_distance_and_shapes_on_a_literal_trace():
    a = audit_trace(PROMPT, CLEAN)
    kinds = [ln["kind"] for ln in a["lines"]]
    assert kinds == ["note", "op", "op", "copy"]
    assert [p for p, _ in a["lines"][1]["operands"]] == ["prompt", "prompt"]
    (p, d), two = a["lines"][2]["operands"]
    assert two == ("constant", 0)
    assert p == "line" and d == 1  # 42 ends the previous line: one newline back (characters, no tokenizer)
    (p, d), = a["lines"][3]["operands"]
    assert p == "line"  # 30 is nearer in line 2 than in the prompt
    assert not a["breaks"] and not a["recalls"] and a["replay_fail"] == 0
    assert [shape(ln) for ln in CLEAN.split("\n")[:4]] == ["note add", "ex: add", "ex: mul", "copy"]


def test_corrupted_traces_break_references_and_count_recalls():
    skipped = "ex1: mul 42 2 = 84\n</think>\n\\boxed{84}"  # 42 is cited before any line writes it
    a = audit_trace(PROMPT, skipped)
    assert a["breaks"] == [(1, "42")] and a["lines"][0]["operands"][0] == ("hidden", None)
    in_note = "note 42 is the sum\nex1: mul 42 2 = 84\n</think>\n\\boxed{84}"  # a note makes nothing available
    assert audit_trace(PROMPT, in_note)["breaks"] == [(2, "42")]
    inside = "copy 23\n</think>\n\\boxed{23}"
    assert audit_trace("x 123 y", inside)["breaks"] == [(1, "23")]  # 23 only inside 123: not a whole value
    rec = "note no single copy fits; recall the rule shl1 XOR x\nrecall 10100101\nlet # = 4\n</think>\n\\boxed{4}"
    a = audit_trace("a # b", rec)
    assert a["recalls"] == ["rule", "mask", "digit map"] and not a["breaks"]
    assert audit_trace(PROMPT, "note choose shl3\ncopy 12\n</think>\n\\boxed{12}")["choices"] == 1


def test_frame_tables_and_exit_status(tmp_path, capsys):
    rows = [{"id": "a", "category": "numeral_system", "status": "solved", "prompt": PROMPT, "trace": CLEAN,
             "trace_style": "derivation"},
            {"id": "b", "category": "numeral_system", "status": "solved", "prompt": PROMPT,
             "trace": "note recall 99\nrecall 99\ncopy 99\n</think>\n\\boxed{99}", "trace_style": "derivation"},
            {"id": "c", "category": "gravity", "status": "ambiguous", "prompt": PROMPT, "trace": "mul 5 5 = 25",
             "trace_style": "derivation"}]
    summary, shapes, breaks = audit_frame(pd.DataFrame(rows))
    (s,) = summary.to_dict("records")  # the unsolved gravity row is not audited
    assert s["traces"] == 2 and s["recall_share"] == 0.5 and s["ref_breaks"] == 0 and s["hidden_share"] == 0
    assert s["recalled"] == "99 1, value 1"
    assert shapes.set_index("shape").loc["copy", "traces_share"] == 1.0
    assert shapes.set_index("shape").loc["ex: add", "traces_share"] == 0.5
    good = tmp_path / "good.csv"
    pd.DataFrame(rows).to_csv(good, index=False)
    assert main(["audit", str(good)]) == 0
    rows[0]["trace"] = "ex1: mul 42 2 = 84\n</think>\n\\boxed{84}"
    bad = tmp_path / "bad.csv"
    pd.DataFrame(rows).to_csv(bad, index=False)
    assert main(["audit", str(bad)]) == 1
    assert "BREAK a (numeral_system) line 1: '42'" in capsys.readouterr().out


def _layout_puzzle(seed, f=lambda r, s, t: r ^ (s & t), shifts=(3, 1, 2), n=8):
    """A puzzle of the competition's layout: out bit p = f(rotl a, shl b, shr c at p)."""
    rng = random.Random(seed)
    a, b, c = shifts

    def rule(v):
        r, s, t = (b8(shift_copy(k, m, v)) for k, m in (("rotl", a), ("shl", b), ("shr", c)))
        return int("".join(str(f(int(r[p]), int(s[p]), int(t[p])) & 1) for p in range(8)), 2)

    xs = rng.sample(range(256), n + 1)
    return make_prompt([(v, rule(v)) for v in xs[:-1]], xs[-1]), b8(rule(xs[-1]))


def test_bits_layout_derivation_replays_without_recall():
    for seed in range(6):
        prompt, answer = _layout_puzzle(seed)
        sol = solve(prompt, style="derivation")
        if sol.status != "solved" or sol.answer != answer:
            continue
        ok, line, msg, recalls = replay_derivation(prompt, sol.trace)
        assert ok and recalls == 0, msg
        assert "note choose" in sol.trace and "\ntable = " in sol.trace and "recall" not in sol.trace
        a = audit_trace(prompt, sol.trace)
        assert not a["breaks"] and a["choices"] == 1 and not a["recalls"]
        lines = sol.trace.split("\n")
        t = next(i for i, ln in enumerate(lines) if ln.startswith("ex2: pairs"))
        flipped = lines[t][:-1] + ("1" if lines[t][-1] == "0" else "0")  # ex2's last pair now says the other bit
        bad = "\n".join(lines[:t] + [flipped] + lines[t + 1:])
        assert not replay_derivation(prompt, bad)[0]
        return
    raise AssertionError("no layout puzzle solved")


def test_default_only_for_a_key_no_example_shows():
    prompt = "00000000 -> 00000000"
    shown = "keys 00000000 = 0 0 0 0 0 0 0 0\npairs 0 0 0 0 0 0 0 0 00000000 = 0:0 0:0 0:0 0:0 0:0 0:0 0:0 0:0\n"
    assert replay_derivation(prompt, shown + "table = 0:0\nread 0 0 = 00\n</think>\n\\boxed{00}")[0]
    assert not replay_derivation(prompt, shown + "default 0 = 0:0\n</think>\n\\boxed{0:0}")[0]
    assert replay_derivation(prompt + " 11111111", shown + "keys 11111111 = 1 1 1 1 1 1 1 1\n"
                             "default 1 = 1:0\nread 1 0 = 00\n</think>\n\\boxed{00}")[0]
    clash = shown + "pairs 0 0 0 0 0 0 0 0 11111111 = 0:1 0:1 0:1 0:1 0:1 0:1 0:1 0:1\ntable = 0:0 0:1\n"
    assert "both bits" in replay_derivation(prompt + " 11111111", clash + "</think>\n\\boxed{x}")[2]


def test_layout_breaks_a_tie_between_equally_simple_rules():
    from lab.puzzles.bitrules import _pick, parse

    prompt, answer = _layout_puzzle(1, f=lambda r, s, t: r ^ s, shifts=(1, 2, 3))
    ex, q = parse(prompt)
    wrong = int(answer, 2) ^ 1
    found = [((3, 0), ("one", 1), wrong), ((3, 0), ("one", 2), wrong), ((3, 0), ("one", 3), int(answer, 2))]
    assert _pick(found, q).answer == b8(wrong)  # the most common prediction
    tied = _pick(found, q, ex)
    assert tied.answer == answer and tied.status == "ambiguous" and "breaks the tie" in tied.reason


def test_layout_generator_is_solved_in_the_layout():
    from lab.puzzles import generate

    df = generate("bit_manipulation", 12, seed=4, layout=1)
    sols = [solve(p, style="derivation") for p in df["prompt"]]
    assert sum(s.answer == a for s, a in zip(sols, df["answer"])) >= 11
    assert all("note choose" in s.trace and replay_derivation(p, s.trace)[0]
               for s, p in zip(sols, df["prompt"]) if s.status == "solved")


def test_anchor_bench_finds_a_known_layout_from_its_boundary_bits():
    """bench/bits_anchors.py: at bit 7 shl reads 0 and at bit 0 shr reads 0, so each anchor reads two columns."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("bits_anchors", Path(__file__).resolve().parents[1] / "bench" /
                                                  "bits_anchors.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    layout = (("rotl", 3), ("shl", 1), ("shr", 2))
    assert bench.anchor_columns(layout, 7) == {2, 5} and bench.anchor_columns(layout, 0) == {3, 1}
    assert bench.explains(["0011", "0101"], "0110") and not bench.explains(["0011"], "0110")
    prompt, answer = _layout_puzzle(0, f=lambda r, s, t: r ^ s ^ t, shifts=(3, 1, 2), n=10)
    row = bench.measure(prompt, answer, "rotl3 shl1 shr2")
    assert row["last_exact"] and row["first_exact"] and row["first_fit_is_answer"]
    assert 1 <= row["passing"] < len(bench.LAYOUTS) and row["rank"] is not None
