"""The symbolic equations' written search (lab.puzzles.eqsearch) and its replay: signatures, the catalog
built from the rule space, literal puzzles searched without a recalled digit map, corrupted lines failing."""

import pytest

from lab.puzzles import eqsearch as Q
from lab.puzzles.check import Replay, replay_derivation
from lab.puzzles.eqrules import HEADER, compute
from lab.puzzles.solve import derivation, solve

# generated (`generate('equation_transformation', 60, seed=3, symbolic=1.0, n_examples=5)`): plain a+b+1, plain a+b
ADD1 = (["-<$<{ = &-", '";^"\' = {\\&', '{{^"" = {;"', "'<!&/ = ;'", '"]!"- = "'], '{&$"-', ";-")
ADD = (["%(^%. = !@?.", "-$'%( = ($-", "(-^$( = :(-", ":!'.$ = %.", "%:_@( = %:@("], "@?'(.", "$%")
# digits 0-9 written < > [ ] { } @ # & ? (as in test_equations): plain, ^ is mod; its results are one symbol each,
# so no example's catalog entry is small enough to branch on: the fallback
MOD = (["&}^>? = ?", "#>^[] = [", "?{^]< = {", "}@^># = }", "]@|{# = |>>", "?<|>[ = #&", "{}+]& = &]"], "@#^[<", "#")


def prompt(lines, query):
    return "\n".join([HEADER, *lines, f"Now, determine the result for: {query}"])


def test_signature_letters_in_order_operator_and_marker():
    assert Q.signature("%$", "<", "`#", "<]]") == "ABoCD=oEE"
    assert Q.signature("`$", "<", "((", "<(]") == "ABoCC=oCD"
    assert Q.signature("12", "-", "34", "-22") == "AB-CD=-BB"


def test_catalog_comes_from_the_rule_space():
    cat = Q.catalog()
    # `ABoCD=AAAE` under plain a*b: 12*93 = 1116 is one of its candidates
    assert ("plain", "a*b", "1293", "1116") in cat["ABoCD=AAAE"]
    for sig in ("ABoCD=AAAE", "ABoCD=oEE", "AB-CD=-EE"):
        for mode, meaning, xy, r in cat[sig]:
            sym = "-" if "-" in sig else "o"
            assert compute(meaning, xy[:2], xy[2:], mode, sym) == r
            assert Q._digit_signature(xy[:2], sym, xy[2:], r) == sig
    assert Q.readings("ABoCD=oEE")[0] == "p:a-b"


@pytest.mark.parametrize("case", [ADD1, ADD], ids=["plain a+b+1", "plain a+b"])
def test_literal_puzzle_is_searched_without_recall(case):
    lines, query, answer = case
    p = prompt(lines, query)
    s = derivation(p, solve(p))
    assert s.status == "solved" and s.answer == answer
    assert not s.trace.startswith("note fallback")
    assert "\nlet " not in s.trace and "recall" not in s.trace
    assert " cands " in s.trace and " try " in s.trace
    ok, line, msg, recalls = replay_derivation(p, s.trace, Q.OPS, Q.BRANCHES)
    assert ok, msg
    assert recalls == 0


def _swap(trace, pred, fn):
    out, done = [], False
    for ln in trace.split("\n"):
        if not done and pred(ln):
            ln, done = fn(ln), True
        out.append(ln)
    assert done
    return "\n".join(out)


def test_corrupted_search_lines_fail():
    lines, query, _ = ADD
    p = prompt(lines, query)
    t = derivation(p, solve(p)).trace
    bad = [
        _swap(t, lambda ln: " cands " in ln and ln.count(":") > 6, lambda ln: ln.rsplit(" ", 1)[0]),  # a candidate dropped
        _swap(t, lambda ln: " try " in ln, lambda ln: ln[:-1] + ("1" if ln[-1] != "1" else "2")),  # not a listed candidate
        _swap(t, lambda ln: " fit " in ln and ln.endswith("yes"), lambda ln: ln[:-3] + "no"),  # the fit misjudged
        _swap(t, lambda ln: " sig " in ln, lambda ln: ln[:-1] + "Z"),  # a wrong signature
        _swap(t, lambda ln: " readings " in ln, lambda ln: ln + " r:ab"),  # a reading the catalog does not list
        _swap(t, lambda ln: ln == "back", lambda ln: "back\nback\nback\nback\nback\nback"),  # closes too many
    ]
    for b in bad:
        assert not replay_derivation(p, b, Q.OPS, Q.BRANCHES)[0]


@pytest.mark.parametrize("case", [MOD, ADD])
def test_unfit_puzzle_gets_the_stated_fallback(monkeypatch, case):
    lines, query, answer = case
    p = prompt(lines, query)
    if case is ADD:
        monkeypatch.setattr(Q, "MAX_CANDS", 1)
    s = derivation(p, solve(p))
    assert s.trace.startswith("note fallback: the smallest candidate list has")
    assert "\nlet " in s.trace and s.answer == answer
    assert replay_derivation(p, s.trace, Q.OPS, Q.BRANCHES)[0]


def test_rest_binds_the_last_digit_only_when_nine_are_bound():
    r = Replay("AB+CD = J", Q.OPS, Q.BRANCHES)
    r.symbols.update({c: d for c, d in zip("ABCDEFGHI", "012345678")})
    assert r.step("rest J = 9") == "9" and r.symbols["J"] == "9"
    r2 = Replay("ab", Q.OPS, Q.BRANCHES)
    r2.symbols.update({"A": "1"})
    with pytest.raises(Exception):
        r2.step("rest J = 9")


def test_drills_recall_the_catalog_lines_a_trace_writes():
    d = Q.drills(5, seed=0)
    assert len(d) == 5 and d == Q.drills(5, seed=0) and d != Q.drills(5, seed=1)
    for q, a in d:
        sig = q.rsplit(" ", 1)[-1]
        readings_line, cands_line = a.split("\n")
        assert readings_line == f"readings {sig} = {' '.join(Q.readings(sig))}"
        assert cands_line == f"cands {sig} = " + " ".join(Q.Search().candidates(*_example_of(sig)))
        assert len(Q.catalog()[sig]) <= Q.MAX_CANDS


def _example_of(sig):
    """An example with signature `sig` written in symbols (letters stand for themselves, operator `*` or `-`)."""
    lhs, r = sig.split("=")
    op = lhs[2]
    sym = "-" if op == "-" else "*"
    return lhs[:2], sym, lhs[3:], r.replace(op, sym)
