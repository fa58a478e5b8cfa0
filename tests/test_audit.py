"""The trace audit (lab.puzzles.audit) on literal traces, corrupted ones included, and the bits derivation in the
competition's layout (lab.puzzles.bits._anchored): it scans the boundary bits, tries the layouts that pass them in
order, reads F as a table with its stated default, and the checker rejects a wrong scan, a skipped or out-of-order
layout, a table with a clash and a default on a key an example shows."""

import random
import re

import pandas as pd

from lab.puzzles import solve
from lab.puzzles.cli import main
from lab.puzzles.audit import audit_frame, audit_trace, shape
from lab.puzzles.bitlayout import LAYOUTS, b8, shift_copy
from lab.puzzles.bitrules import make_prompt
from lab.puzzles.check import replay_derivation
from lab.puzzles.solve import replay

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


def _bits_replay(prompt, trace):
    return replay("derivation", "bit_manipulation", prompt, trace)


def _anchored(tries=1, f=lambda r, s, t: r ^ (s | t), shifts=(3, 1, 2)):
    """A layout puzzle whose solved derivation reads its layout off the anchor scans (not stated), trying at least
    `tries` layouts."""
    for seed in range(40):
        prompt, answer = _layout_puzzle(seed, f=f, shifts=shifts)
        sol = solve(prompt, style="derivation")
        if sol.status == "solved" and sol.answer == answer and sol.trace.count("\ntry ") >= tries:
            return prompt, sol.trace
    raise AssertionError(f"no layout puzzle derived on the page with {tries} tries")


def test_bits_layout_derived_from_the_boundary_bits_replays_without_recall_or_choice():
    prompt, trace = _anchored()
    assert _bits_replay(prompt, trace)[:3] == (True, 0, "")
    assert "note choose" not in trace and "recall" not in trace and "\ntable = " in trace
    lines = trace.split("\n")
    assert lines[[i for i, ln in enumerate(lines) if ln.startswith("try ")][-1]] == "try rotl3 shl1 shr2"
    a = audit_trace(prompt, trace, category="bit_manipulation")
    assert not a["breaks"] and a["choices"] == 0 and not a["recalls"] and a["replay_fail"] == 0

    def corrupt(pred, change):
        i = next(i for i, ln in enumerate(lines) if pred(ln))
        return "\n".join(lines[:i] + [change(lines[i])] + lines[i + 1:])

    flip = {"yes": "no", "no": "yes"}
    bad_scan = corrupt(lambda ln: ln.startswith("scan 7 "),
                       lambda ln: ln.rsplit(" ", 1)[0] + " " + flip[ln.split()[-1]])
    assert not _bits_replay(prompt, bad_scan)[0]
    last_fill = max(i for i, ln in enumerate(lines) if ": fill " in ln)
    bad_fill = lines[last_fill][:-1] + ("1" if lines[last_fill][-1] == "0" else "0")
    assert not _bits_replay(prompt, "\n".join(lines[:last_fill] + [bad_fill] + lines[last_fill + 1:]))[0]
    out_of_order = trace.replace("try rotl3 shl1 shr2", "try shl1 shr2")
    assert not _bits_replay(prompt, out_of_order)[0]


def test_a_rejected_layout_clashes_its_pairs_leave_the_table_and_none_is_skipped():
    prompt, trace = _anchored(tries=2)
    assert _bits_replay(prompt, trace)[0] and " clash\n" in trace
    lines = trace.split("\n")
    tries = [i for i, ln in enumerate(lines) if ln.startswith("try ")]
    # without the last `try` line, the rejected layout's pairs stay in the table and the replay fails
    assert not _bits_replay(prompt, "\n".join(lines[:tries[-1]] + lines[tries[-1] + 1:]))[0]
    # skipping the first layout tried (its lines gone) is refused: it passes every anchor scan
    assert "next layout" in _bits_replay(prompt, "\n".join(lines[:tries[0]] + lines[tries[1]:]))[2]


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
    solved = [(s, p) for s, p in zip(sols, df["prompt"]) if s.status == "solved"]
    assert all(("\ntry " in s.trace or "note choose" in s.trace) and _bits_replay(p, s.trace)[0] for s, p in solved)
    assert sum("\ntry " in s.trace for s, _ in solved) >= len(solved) // 2  # most derive the layout on the page


def test_anchor_scans_read_the_boundary_bits_and_the_bench_counts_the_tries(bench):
    """At bit 7 shl reads 0 and at bit 0 shr reads 0, so each anchor reads at most two bits of x."""
    from lab.puzzles.bitlayout import anchor_columns, anchor_scan

    layout = (("rotl", 3), ("shl", 1), ("shr", 2))
    assert anchor_columns(layout, 7) == {2, 5} and anchor_columns(layout, 0) == {3, 1}
    xs, ys = [0b10000000, 0b00000000, 0b10000001], [0b00000001, 0b00000000, 0b00000000]
    assert anchor_scan(xs, ys, 7, (0,)) == ("1>1 0>0 1>0 no", False)
    assert anchor_scan(xs, ys, 7, (0, 7)) == ("10>1 00>0 11>0 yes", True)
    assert anchor_scan(xs, ys, 0, ()) == ("0 0 0 yes", True)
    bench = bench("bits_anchors")
    prompt, trace = _anchored(tries=2)
    m = bench.measure(prompt)
    assert m["tries"] == trace.count("\ntry ") and m["scans"] == trace.count("\nscan ") and m["passing"] >= 2
    fit = LAYOUTS.index(tuple(("rotl", 0) if n == "x" else (n[:-1], int(n[-1]))
                              for n in [ln for ln in trace.split("\n") if ln.startswith("try ")][-1].split()[1:]))
    written = trace.split("note try the layouts")[1].count("\nscan ")  # the scans written before a layout
    assert m["silent"] <= fit + 1 - m["tries"] and m["silent"] >= fit + 1 - m["tries"] - written


def test_anchor_bits_are_scanned_just_before_the_layout_that_needs_them():
    from lab.puzzles.bitlayout import anchor_columns, candidates, scans_before
    from lab.puzzles.bitrules import parse

    # scans_before: a passed set the layout's bits hold lets it on; the failed scan of exactly its bits skips it
    layout = (("rotl", 3), ("shr", 2))  # reads {2, 5} at bit 7, {3} at 0, {1, 4} at 6, {4} at 1
    xs, ys = [0b00100000, 0b00000100, 0b00100100], [0b00000001, 0b00000001, 0b00000000]
    assert scans_before(layout, {(7, (2,)): True, (0, (3,)): True, (6, (1, 4)): False}, xs, ys) == ([], False)
    written = {(7, (2,)): True, (0, ()): True}
    scans, tried = scans_before(layout, written, xs, ys)
    assert [(p, c) for p, c, _ in scans] == [(6, (1, 4)), (1, (4,))][:len(scans)] and (6, (1, 4)) in written
    assert tried == all(written[(p, c)] for p, c, _ in scans)

    _, two = _anchored(f=lambda r, s, t: s ^ t)  # shl1 shr2: one bit of x at bit 7 and at bit 0
    assert "try shl1 shr2" in two and not re.search(r"^scan [70] \d \d ", two, re.M)
    prompt, trace = _anchored(tries=2)
    ex, _ = parse(prompt)
    lines = trace.split("\n")
    scans = [ln.split(" = ")[0] for ln in lines if ln.startswith("scan ")]
    assert len(scans) == len(set(scans))  # no scan written twice
    # the scans that passed just before a `try` are the tried layout's bits at their anchors
    for i, ln in enumerate(lines):
        if ln.startswith("try "):
            cps = candidates([a for a, _ in ex], [b for _, b in ex])[sum(x.startswith("try ") for x in lines[:i])]
            j = i
            while lines[j - 1].startswith("scan ") and lines[j - 1].endswith(" yes") and "note" not in lines[j - 2]:
                p, *cols = map(int, lines[j - 1].split(" = ")[0].split()[1:])
                assert set(cols) == anchor_columns(cps, p), (ln, lines[j - 1])
                j -= 1


def test_a_fill_follows_the_clash_order_and_a_try_waits_for_a_clash():
    prompt, trace = _anchored(tries=3, f=lambda r, s, t: (r & t) | s)
    lines = trace.split("\n")
    clashed = [ln.split(":")[0] for ln in lines if ln.endswith(" clash")]
    assert set(clashed) - {"ex1"}  # the order moves
    assert _bits_replay(prompt, trace)[0]
    tries = [i for i, ln in enumerate(lines) if ln.startswith("try ")]
    first_fill = [next(ln.split(":")[0] for ln in lines[i:] if ": fill " in ln) for i in tries[1:]]
    assert first_fill == clashed  # each try fills first the example the one before clashed on
    # a try whose fills stop before a clash: the next try is refused
    k = next(i for i, ln in enumerate(lines) if ln.endswith(" clash"))
    assert "not clashed" in _bits_replay(prompt, "\n".join(lines[:k] + lines[k + 1:]))[2]
    # two of the fitting try's examples swapped, out of the clash order: refused
    fills = [i for i in range(tries[-1], len(lines)) if ": fill " in lines[i]]
    order = [lines[i].split(":")[0] for i in fills]
    assert order != sorted(order, key=lambda t: int(t[2:]))
    a, b = lines[tries[-1] + 1:fills[0] + 1], lines[fills[0] + 1:fills[1] + 1]  # two examples' copies and fill
    swapped = lines[:tries[-1] + 1] + b + a + lines[fills[1] + 1:]
    assert "next example to fill" in _bits_replay(prompt, "\n".join(swapped))[2]


def test_each_copy_of_an_example_is_written_once_and_a_fill_must_use_the_tried_layouts_copies():
    prompt, trace = _anchored(tries=2)
    lines = trace.split("\n")
    copies = [ln.split(" = ")[0] for ln in lines if re.match(r"ex\d+: (rotl|shl|shr)\d ", ln)]
    assert len(copies) == len(set(copies))  # a later try cites the line an earlier one wrote
    assert _bits_replay(prompt, trace)[0]
    fills = [i for i, ln in enumerate(lines) if ": fill " in ln]
    i = fills[-1]
    tag, rest = lines[i].split(": fill ")
    args, result = rest.split(" = ")
    *vals, y = args.split()
    other = [ln for ln in lines[:i] if re.match(r"ex\d+: (rotl|shl|shr)\d ", ln) and not ln.startswith(tag + ":")]
    stolen = other[0].split(" = ")[1]  # a copy written earlier in the trace, but of another example
    for bad in (f"{tag}: fill {stolen} {' '.join(vals[1:])} {y} = {result}",   # another example's copy
                f"{tag}: fill {' '.join(vals)} {vals[0]} = {result}",           # not the example's output
                f"ex99: fill {args} = {result}"):                              # no such example
        assert not _bits_replay(prompt, "\n".join(lines[:i] + [bad] + lines[i + 1:]))[0], bad
