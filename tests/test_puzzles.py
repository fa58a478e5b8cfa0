"""Round trips and hand-written real-format examples for lab.puzzles (CPU only, offline, fast)."""

import pandas as pd
import pytest

from lab.puzzles import CATEGORIES, Solution, classify, generate, solve

try:
    from lab.metric import verify
except Exception:  # noqa: BLE001
    def verify(gold, pred):
        return gold.strip() == pred.strip()

BIT_REAL = ("In Alice's Wonderland, a secret bit manipulation rule transforms 8-bit binary numbers. The transformation "
            "involves operations like bit shifts, rotations, XOR, AND, OR, NOT, and possibly majority or choice functions."
            "\n\nHere are some examples of input -> output:\n01010001 -> 11011101\n00001001 -> 01101101\n\n"
            "Now, determine the output for: 00110100")
NUMERAL_REAL = ("In Alice's Wonderland, numbers are secretly converted into a different numeral system. Some examples "
                "are given below:\n11 -> XI\n15 -> XV\n94 -> XCIV\n19 -> XIX\nNow, write the number 38 in the "
                "Wonderland numeral system.")


def check_trace(sol: Solution):
    assert sol.trace.endswith(f"</think>\n\\boxed{{{sol.answer}}}")
    assert sol.trace.count("\\boxed{") == 1
    assert sol.status in ("solved", "ambiguous", "undetermined")


def test_api():
    assert CATEGORIES == ["bit_manipulation", "gravity", "unit_conversion", "text_cipher", "numeral_system",
                          "equation_transformation"]
    s = Solution("a", "solved", "t", "gravity")
    assert s.subtype == "" and s.reason == ""


@pytest.mark.parametrize("category,kw", [
    ("numeral_system", {}), ("numeral_system", {"max_value": 10, "n_examples": 2}),
    ("numeral_system", {"max_value": 3999, "n_examples": 6}),
    ("bit_manipulation", {"complexity": 1}), ("bit_manipulation", {"complexity": 2, "n_examples": 10}),
    ("bit_manipulation", {"complexity": 3, "n_examples": 10}),
])
def test_generate_frame(category, kw):
    df = generate(category, 30, seed=7, **kw)
    assert list(df.columns) == ["id", "prompt", "answer", "category", "subtype"]
    assert len(df) == 30 and df["id"].is_unique and df["id"].iloc[7] == f"{df['id'].iloc[0][:-5]}-0007"
    assert all(isinstance(v, str) for col in df.columns for v in df[col])
    pd.testing.assert_frame_equal(df, generate(category, 30, seed=7, **kw))
    assert not df.equals(generate(category, 30, seed=8, **kw))
    assert (df["category"] == category).all()
    assert all(classify(p)[0] == category for p in df["prompt"])


@pytest.mark.parametrize("category,kw,min_acc", [
    ("numeral_system", {"max_value": 100}, 1.0), ("numeral_system", {"max_value": 3999, "n_examples": 3}, 1.0),
    ("bit_manipulation", {"complexity": 1, "n_examples": 6}, 1.0),
    ("bit_manipulation", {"complexity": 2, "n_examples": 8}, 0.95),
    ("bit_manipulation", {"complexity": 3, "n_examples": 10}, 0.9),
])
def test_roundtrip(category, kw, min_acc):
    df = generate(category, 40, seed=11, **kw)
    right, solved_wrong = 0, []
    for p, a in zip(df["prompt"], df["answer"]):
        s = solve(p)
        check_trace(s)
        assert s.category == category
        ok = verify(a, s.answer)
        right += ok
        if s.status == "solved" and not ok:
            solved_wrong.append((p, a, s.answer))
    assert right / len(df) >= min_acc
    assert len(solved_wrong) <= 0.05 * len(df)


def test_numeral_real_example():
    assert classify(NUMERAL_REAL) == ("numeral_system", "")
    s = solve(NUMERAL_REAL)
    assert (s.status, s.answer) == ("solved", "XXXVIII")
    assert s.trace == "38 = 30 + 8\n30 -> XXX\n8 -> VIII\nXXX + VIII = XXXVIII\n</think>\n\\boxed{XXXVIII}"


def test_numeral_not_roman():
    s = solve(NUMERAL_REAL.replace("11 -> XI", "11 -> 1011"))
    assert s.status == "undetermined" and "Roman" in s.reason
    check_trace(s)


def test_bit_real_example():
    assert classify(BIT_REAL) == ("bit_manipulation", "")
    s = solve(BIT_REAL)
    check_trace(s)
    assert s.answer == "10010111" or s.status != "solved"


def test_bit_handmade_rotation_xor():
    # rule: rotl1(x) XOR shr2(x)
    xs = [0b01010001, 0b00001001, 0b11110000, 0b10000001, 0b01111110, 0b00110011, 0b11001010, 0b00011100]
    f = lambda v: (((v << 1) | (v >> 7)) & 255) ^ (v >> 2)  # noqa: E731
    body = "\n".join(f"{v:08b} -> {f(v):08b}" for v in xs)
    prompt = BIT_REAL.split("01010001 ->")[0] + body + "\n\nNow, determine the output for: 00110100"
    s = solve(prompt)
    assert (s.status, s.answer) == ("solved", f"{f(0b00110100):08b}")
    assert s.trace.splitlines()[0].startswith("rule: ")
    check_trace(s)


@pytest.mark.parametrize("prompt", [
    "", "garbage", None, 42,
    BIT_REAL.split("Here are")[0],                      # no examples, no query
    BIT_REAL.rsplit("Now,", 1)[0],                      # query missing
    NUMERAL_REAL.split("\n11")[0] + "\nNow, write the number 38 in the Wonderland numeral system.",  # no examples
    NUMERAL_REAL.rsplit("Now,", 1)[0],
])
def test_malformed(prompt):
    s = solve(prompt)
    assert s.status == "undetermined" and s.reason
    check_trace(s)
