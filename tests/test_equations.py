"""Equation rule model: hand-written puzzles in the real format for every family, mode and marker
form, round trips through the generator for every meaning (numeric and symbolic), the learned
priors and the honesty of `solved` (CPU only, offline)."""

import pandas as pd
import pytest

from lab.competition.metric import verify
from lab.puzzles import generate, solve, solve_frame
from lab.puzzles import eqrules as rules
from lab.puzzles import eqsolve as eq


def prompt(lines, query):
    return "\n".join([rules.HEADER, *lines, f"Now, determine the result for: {query}"])


# Invented puzzles, worked by hand (the comment under each says how).
HANDWRITTEN = {
    # plain; ] is max mod min: 85 mod 19 = 9, 71 mod 23 = 2; + adds. 60 mod 17 = 9
    "plain mod": (["85]19 = 9", "23]71 = 2", "36+47 = 83", "14+22 = 36"], "17]60", "9", "solved"),
    # reversed (47+25: 74+52 = 126, written 621); - writes |a-b| with its marker in front when a<b:
    # 21 vs 39 -> -81, 58 vs 12 -> 64. Query 63 vs 91: 28, written -82
    "reversed a-b": (["12-93 = -81", "85-21 = 64", "47+25 = 621"], "36-19", "-82", "solved"),
    # reversed (14*32 = 448); } marks a>b at the end: 69 vs 28 -> 41 -> 14}, 21 vs 54 -> 33. 37 vs 12: 52}
    "reversed b-a end": (["96}82 = 14}", "12}45 = 33", "41*23 = 844"], "73}21", "52}", "solved"),
    # plain (61*23 = 1403); # always marks, a zero result is 0. 70-24: #46
    "plain ±|a-b|": (["35#61 = #26", "84#15 = #69", "52#52 = 0", "61@23 = 1403"], "70#24", "#46", "solved"),
    # reversed (72+53 = 125 -> 521); ? always marks, at the end: 85 vs 32 -> 53 -> 35?. 06 vs 81: 75 -> 57?
    "reversed ±|a-b| end": (["58?23 = 35?", "14?97 = 83?", "27!35 = 521"], "60?18", "57?", "solved"),
    # plain (25*13 = 325); ' joins b then a
    "plain ba": (["47'19 = 1947", "82'30 = 3082", "25*13 = 325"], "56'08", "0856", "solved"),
    # * never appears; add and subtract are used, so * keeps its usual meaning: 13*12 = 156
    "plain a*b": (["48+37 = 85", "66+19 = 85", "70-18 = 52"], "13*12", "156", "undetermined"),
    # + never appears and another operator (*) adds: + cannot add; multiply is the likeliest of the rest
    "plain a*b, + taken": (["48*37 = 85", "66*19 = 85", "70-18 = 52"], "13+12", "156", "undetermined"),
    # symbolic, digits 0-9 written < > [ ] { } @ # & ?: plain, ^ is mod (85 mod 19 = 9, ...), | is a-b
    # (36|47 = |11), + adds (45+38 = 83). Query 67 mod 20 = 7
    "symbolic plain mod": (["&}^>? = ?", "#>^[] = [", "?{^]< = {", "}@^># = }", "]@|{# = |>>", "?<|>[ = #&",
                            "{}+]& = &]"], "@#^[<", "#", "solved"),
    # symbolic, same digits: reversed, ~ marks a>b at the end (96~82: 69 vs 28 -> 14~), + adds
    # (47+25: 74+52 = 126 -> 621). Query 81~60: 18 vs 06 -> 12 -> 21~
    "symbolic reversed b-a end": (["?@~&[ = >{~", ">[~{} = ]]", "#]~[> = }[~", "{#+[} = @[>", "]&+>@ = {{>",
                                   "}<+&? = ]<>"], "&>~@<", "[>~", "solved"),
}


@pytest.mark.parametrize("name", list(HANDWRITTEN))
def test_handwritten(name):
    lines, query, answer, status = HANDWRITTEN[name]
    s = solve(prompt(lines, query))
    assert (s.answer, s.status, s.method) == (answer, status, name.split(", ")[0].removeprefix("symbolic "))
    assert s.trace.endswith(f"answer: {answer}\n</think>\n\\boxed{{{answer}}}")
    assert "written: " in s.trace


def test_one_sign_case_shown_is_ambiguous():
    # plain, - only ever shown with a>b: whether it marks a<b is open, so the answer is a prior's choice
    s = solve(prompt(["85-21 = 64", "47-15 = 32", "48+37 = 85"], "21-85"))
    assert s.status == "ambiguous" and s.answer in ("-64", "64") and s.reason


def test_batch_priors_decide_ties():
    # the same ambiguous puzzle, in a file whose deducible subtractions never mark: |a-b| wins there
    tie = prompt(["85-21 = 64", "47-15 = 32", "48+37 = 85"], "21-85")
    alone = solve(tie)
    df = generate("equation_transformation", 60, seed=1, mode="plain", meaning="|a-b|", n_examples=6)
    prior = eq.learn_priors(df["prompt"])
    assert prior.var["|a-b|"] >= 20 and prior.modes["reversed"] == 0
    batch = pd.concat([df, pd.DataFrame({"id": ["tie"], "prompt": [tie], "answer": ["64"]})], ignore_index=True)
    out = solve_frame(batch, workers=1)
    assert out["answer"].iloc[-1] == "64" and out["status"].iloc[-1] == "ambiguous"
    assert alone.answer == "-64"  # the default prior, from a file where marked subtraction is the commoner form


def test_priors_never_read_answers():
    df = generate("equation_transformation", 80, seed=2)
    shuffled = df["prompt"].str.replace(r"result for: .*$", "result for: 12+34", regex=True)
    assert eq.learn_priors(df["prompt"]).as_dict() == eq.learn_priors(shuffled).as_dict()


CASES = [(mode, m) for mode in rules.MODES for m in rules.MEANINGS if m in rules.meanings_for(mode, "+")]


@pytest.mark.parametrize("mode,meaning", CASES)
def test_roundtrip_numeric_every_meaning(mode, meaning):
    df = generate("equation_transformation", 20, seed=5, mode=mode, meaning=meaning, n_examples=5)
    sols = [solve(p) for p in df["prompt"]]
    right = [verify(a, s.answer) for a, s in zip(df["answer"], sols)]
    assert not [s for s, ok in zip(sols, right) if s.status == "solved" and not ok]  # solved is always right
    assert sum(right) >= 0.45 * len(df)
    assert any(s.status == "solved" and s.method == f"{mode} {meaning}" for s in sols)


@pytest.mark.parametrize("mode,meaning", CASES)
def test_roundtrip_symbolic_every_meaning(mode, meaning):
    df = generate("equation_transformation", 8, seed=5, mode=mode, meaning=meaning, n_examples=6, symbolic=1.0)
    sols = [solve(p) for p in df["prompt"]]
    assert all(s.subtype == "symbolic_deduce" for s in sols)
    assert not [s for a, s in zip(df["answer"], sols) if s.status == "solved" and not verify(a, s.answer)]
    assert any(s.status == "solved" and s.method == f"{mode} {meaning}" for s in sols)


@pytest.mark.parametrize("symbolic", [0.0, 1.0])
def test_roundtrip_guess_uses_an_unused_family(symbolic):
    df = generate("equation_transformation", 30, seed=9, guess=1.0, symbolic=symbolic, n_examples=6)
    for p in df["prompt"]:
        s = solve(p)
        assert s.status == "undetermined" and "never appears" in s.reason and s.answer
        examples, query = rules.equation_parts(p)
        if symbolic:
            continue
        shown = {rules.family(h[2][o]) for h in eq.numeric_hypotheses(eq.by_operator(examples), eq.default_prior())
                 for o in h[2]}
        if len(shown) == len(eq.by_operator(examples)):  # every shown operator's family is determined
            assert rules.family(s.method.split(" ", 1)[1]) not in shown


def test_symbolic_caps_are_never_solved():
    # one concatenation example: every digit map fits (5,040 per mode), and all give the same answer
    examples, q = rules.equation_parts(prompt(["<>+[] = <>[]"], "[<+>]"))
    full = eq.solve_symbolic(examples, q, "symbolic_deduce", cap=20_000)
    assert (full.answer, full.status) == ("[<>]", "solved")
    for kw, why in [({"join_cap": 1_000}, "work cap"), ({"vote_cap": 10}, "work cap"),
                    ({"cap": 100}, "solution cap")]:
        s = eq.solve_symbolic(examples, q, "symbolic_deduce", **kw)
        assert s.answer == "[<>]" and s.status == "ambiguous" and why in s.reason, kw
        assert eq.solve_symbolic(examples, q, "symbolic_deduce", **kw) == s  # a count, not a clock: the same stop


def test_generator_rejects_an_end_marker_in_plain_mode():
    with pytest.raises(ValueError, match="plain"):
        generate("equation_transformation", 1, seed=0, mode="plain", meaning="b-a end")


def test_family_table_names_kind_family_and_mode():
    from lab.puzzles import family_table

    names = ["plain mod", "reversed b-a end", "plain a*b", "symbolic plain mod"]
    df = pd.DataFrame({"id": names, "prompt": [prompt(*HANDWRITTEN[k][:2]) for k in names],
                       "answer": [HANDWRITTEN[k][2] for k in names]})
    out = solve_frame(df, workers=1)
    assert out["method"].tolist() == ["plain mod", "reversed b-a end", "plain a*b", "plain mod"]
    rows = {tuple(r[:3]): tuple(r[3:]) for r in family_table(out).itertuples(index=False)}
    assert rows == {("numeric", "mod", "plain"): (1, 1, 1.0), ("numeric", "sub", "reversed"): (1, 1, 1.0),
                    ("numeric (operator unseen)", "mul", "plain"): (1, 0, 1.0),
                    ("symbolic", "mod", "plain"): (1, 1, 1.0)}


def test_small_batches_use_the_default_prior():
    few = generate("equation_transformation", 5, seed=3)["prompt"]
    assert eq.learn_priors(few).as_dict() == eq.default_prior().as_dict()
    assert eq.learn_priors([]).as_dict() == eq.default_prior().as_dict()
