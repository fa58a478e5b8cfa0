"""Round trips and hand-written real-format examples for lab.puzzles (CPU only, offline, fast)."""

import pandas as pd
import pytest

from lab.puzzles import CATEGORIES, Solution, classify, generate, solve

try:
    from lab.competition.metric import verify
except Exception:  # noqa: BLE001
    def verify(gold, pred):
        return gold.strip() == pred.strip()

BIT_REAL = ("In Alice's Wonderland, a secret bit manipulation rule transforms 8-bit binary numbers. The transformation "
            "involves operations like bit shifts, rotations, XOR, AND, OR, NOT, and possibly majority or choice functions."
            "\n\nHere are some examples of input -> output:\n01010001 -> 11011101\n00001001 -> 01101101\n\n"
            "Now, determine the output for: 00110100")
GRAVITY_REAL = ("In Alice's Wonderland, the gravitational constant has been secretly changed. Here are some example "
                "observations:\nFor t = 1.37s, distance = 14.92 m\nNow, determine the falling distance for t = 4.41s "
                "given d = 0.5*g*t^2.")
CIPHER_REAL = ("In Alice's Wonderland, secret encryption rules are used on text. Here are some examples:\n"
               "ucoov pwgtfyoqg vorq yrjjoe -> queen discovers near valley\n"
               "Now, decrypt the following text: trb wzrswvog hffk")
UNIT_REAL = ("In Alice's Wonderland, a secret unit conversion is applied to measurements. For example:\n"
             "10.08 m becomes 6.69\n17.83 m becomes 11.83\nNow, convert the following measurement: 25.09 m")
EQ_SYMBOLIC_REAL = ("In Alice's Wonderland, a secret set of transformation rules is applied to equations. Below are a "
                    "few examples:\n`!*[{ = '\"[`\nNow, determine the result for: [[-!'")
EQ_NUMERIC_REAL = ("In Alice's Wonderland, a secret set of transformation rules is applied to equations. Below are a "
                   "few examples:\n34/44 = 1\n41/32 = 9\n34|25 = 69\n87\\64 = 8853\n"
                   "Now, determine the result for: 69/52")
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
    ("gravity", {}), ("unit_conversion", {"n_examples": 2}), ("text_cipher", {}),
    ("equation_transformation", {"symbolic": 0.5, "guess": 0.3}),
    ("numeral_system", {}), ("numeral_system", {"max_value": 10, "n_examples": 2}),
    ("numeral_system", {"max_value": 3999, "n_examples": 6}),
    ("bit_manipulation", {"complexity": 1}), ("bit_manipulation", {"complexity": 2, "n_examples": 10}),
    ("bit_manipulation", {"complexity": 3, "n_examples": 10}), ("bit_manipulation", {"complexity": 4}),
    ("bit_manipulation", {"complexity": 5}), ("bit_manipulation", {"complexity": 6}),
    ("bit_manipulation", {"complexity": 7}), ("bit_manipulation", {"complexity": 8}),
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


ROUNDTRIP = [  # (category, difficulty, minimum accuracy over non-guess puzzles)
    ("numeral_system", {"max_value": 100}, 1.0), ("numeral_system", {"max_value": 3999, "n_examples": 3}, 1.0),
    ("bit_manipulation", {"complexity": 1, "n_examples": 6}, 1.0),
    ("bit_manipulation", {"complexity": 2, "n_examples": 8}, 0.95),
    ("bit_manipulation", {"complexity": 3, "n_examples": 10}, 0.9),
    ("bit_manipulation", {"complexity": 4, "n_examples": 10}, 0.9),  # a pipeline of 2-3 steps
    ("bit_manipulation", {"complexity": 5, "n_examples": 10}, 0.9),  # any function of three copies
    ("bit_manipulation", {"complexity": 6, "n_examples": 8}, 0.9),  # a one- or two-copy rule, then a mask
    ("bit_manipulation", {"complexity": 7, "n_examples": 8}, 0.95),  # XOR of 4-5 copies
    ("bit_manipulation", {"complexity": 8, "n_examples": 10}, 0.8),  # any function of four copies
    ("gravity", {"n_examples": 1}, 1.0), ("gravity", {"n_examples": 6, "g_min": 1, "g_max": 30}, 1.0),
    ("unit_conversion", {"n_examples": 2}, 1.0), ("unit_conversion", {"n_examples": 6, "x_max": 500}, 1.0),
    ("text_cipher", {"n_examples": 2}, 0.95), ("text_cipher", {"n_examples": 5}, 0.95),
    ("equation_transformation", {"ops": "simple", "n_examples": 5}, 0.9),
    ("equation_transformation", {"n_examples": 8, "n_operators": 2, "mode": "reversed"}, 0.9),
    ("equation_transformation", {"guess": 1.0}, None),
    ("equation_transformation", {"symbolic": 1.0, "n_examples": 8}, 0.75),
]


@pytest.mark.parametrize("category,kw,min_acc", ROUNDTRIP)
def test_roundtrip(category, kw, min_acc):
    df = generate(category, 30, seed=11, **kw)
    right, total, solved_wrong = 0, 0, []
    for p, a, sub in zip(df["prompt"], df["answer"], df["subtype"]):
        s = solve(p)
        check_trace(s)
        assert s.category == category and s.subtype == sub
        ok = verify(a, s.answer)
        if sub.endswith("guess"):
            assert s.status == "undetermined" and s.reason
            continue
        total += 1
        right += ok
        if s.status == "solved" and not ok:
            solved_wrong.append((p, a, s.answer))
    if min_acc is not None:
        assert right / total >= min_acc
    assert len(solved_wrong) <= 0.05 * len(df), solved_wrong[:2]


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


@pytest.mark.parametrize("f,first,method", [
    # rotl3, then x XOR shr2 (x), then NOT: a program, whose copy shr2(rotl3(x)) no expression level has
    (lambda v: ~(((v << 3) | (v >> 5)) & 255 ^ (((v << 3) | (v >> 5)) & 255) >> 2) & 255,
     "rule: rotl3, then XOR shr2, then NOT\nx = 00110100\nrotl3: 10100001\n"
     "XOR shr2: 10100001 XOR 00101000 = 10001001\nNOT: 01110110\n</think>", "pipeline"),
    # (x AND NOT shl1) XOR rotr2: a NOT inside a three-copy rule, outside the named level 3
    (lambda v: (v & ~(v << 1) & 255) ^ (((v >> 2) | (v << 6)) & 255), "rule: table of (x, shl1, rotr2)", "table of three"),
    # (shl1 OR rotr3) AND 10110110: a constant mask
    (lambda v: ((v << 1) | ((v >> 3) | (v << 5))) & 0b10110110,
     "rule: (shl1 OR rotr3) AND 10110110\nx = 00110100\nshl1 = 01101000\nrotr3 = 10000110\n"
     "shl1 OR rotr3 = 11101110\n11101110 AND 10110110 = 10100110\n</think>", "rule then mask"),
    # x XOR shl1 XOR shr2 XOR rotl3, NOT: four copies, past every named level
    (lambda v: ~(v ^ (v << 1) ^ (v >> 2) ^ (((v << 3) | (v >> 5)) & 255)) & 255, "rule: NOT (x XOR shl1 XOR", "xor of copies"),
])
def test_bit_rules_past_the_named_levels(f, first, method):
    import re

    from lab.puzzles import bitrules as bits

    xs = [0b01010001, 0b00001001, 0b11110000, 0b10000001, 0b01111110, 0b00110011, 0b11001010, 0b00011100,
          0b10101101, 0b01100110]
    body = "\n".join(f"{v:08b} -> {f(v) & 255:08b}" for v in xs)
    prompt = BIT_REAL.split("01010001 ->")[0] + body + "\n\nNow, determine the output for: 00110100"
    s = solve(prompt)
    check_trace(s)
    assert (s.status, s.answer) == ("solved", f"{f(0b00110100) & 255:08b}")
    assert s.trace.startswith(first)
    assert s.method == method
    for name, val in re.findall(r"^(\w+) = ([01]{8})$", s.trace, re.M):  # every copy line is checkable
        assert val == bits.b8(bits.apply_t(name, 0b00110100)), name


def test_real_examples_classified_and_solved():
    assert classify(GRAVITY_REAL) == ("gravity", "")
    s = solve(GRAVITY_REAL)
    assert s.status == "solved" and verify("154.62", s.answer)
    assert classify(UNIT_REAL) == ("unit_conversion", "")
    assert (solve(UNIT_REAL).status, solve(UNIT_REAL).answer) == ("solved", "16.65")
    assert classify(CIPHER_REAL) == ("text_cipher", "")
    s = solve(CIPHER_REAL)
    assert (s.status, s.answer) == ("solved", "cat imagines book")
    assert classify(EQ_NUMERIC_REAL) == ("equation_transformation", "numeric_deduce")
    s = solve(EQ_NUMERIC_REAL)
    # reversed 96 and 25: |a-b| ("17"), b-a with its marker at the end ("17/") and mod ("12") all fit '/';
    # the learned prior picks between them, and the status says the examples do not decide
    assert s.answer in ("17/", "17") and s.status == "ambiguous"
    assert classify(EQ_SYMBOLIC_REAL) == ("equation_transformation", "symbolic_guess")
    s = solve(EQ_SYMBOLIC_REAL)
    assert s.status == "undetermined" and s.reason
    for p in (GRAVITY_REAL, UNIT_REAL, CIPHER_REAL, EQ_NUMERIC_REAL, EQ_SYMBOLIC_REAL):
        check_trace(solve(p))


def test_equation_backtick_is_a_symbol():
    from lab.puzzles.eqrules import equation_parts
    assert equation_parts(EQ_SYMBOLIC_REAL) == ([("`!*[{", "'\"[`")], "[[-!'")
    # a puzzle whose symbols include the backtick, at the edges of lines too, solves like the same puzzle
    # written with another symbol in its place
    df = generate("equation_transformation", 60, seed=3, symbolic=1.0, n_examples=8)
    ticked = [(p, a) for p, a in zip(df["prompt"], df["answer"]) if "`" in p.split("\n", 1)[1]]
    assert len(ticked) >= 5
    for p, a in ticked:
        s1, s2 = solve(p), solve(p.replace("`", "\u00a7"))
        assert (s1.answer.replace("`", "\u00a7"), s1.status) == (s2.answer, s2.status)


EQ_SYMBOLIC_DEDUCE = ("In Alice's Wonderland, a secret set of transformation rules is applied to equations. Below are a "
                      "few examples:\n\"#*$% = %!)\n&'+() = &'()\n{!-\"$ = -((\n#(*%& = \"#\"&\n)$+'\" = )$'\"\n"
                      "%{-\"( = -$#\n$&*## = ((!\n'%-&) = -'\nNow, determine the result for: #'-\"%")


def test_equation_subtypes_handmade():
    # symbolic, deduce: digits 0-9 written !"#$%&'(){ ; * is a*b, + concatenates, - is b-a (its minus written -)
    assert classify(EQ_SYMBOLIC_DEDUCE) == ("equation_transformation", "symbolic_deduce")
    s = solve(EQ_SYMBOLIC_DEDUCE)
    assert (s.status, s.answer, s.method) == ("solved", '-"#', "plain b-a")  # 14-26 = -12
    assert "#'-\"% -> 26-14" in s.trace
    # numeric, guess: the query's operator never appears; a guess is given, flagged undetermined
    guess = EQ_NUMERIC_REAL.replace("69/52", "69&52")
    assert classify(guess) == ("equation_transformation", "numeric_guess")
    s = solve(guess)
    assert s.status == "undetermined" and "never appears" in s.reason and s.answer
    check_trace(s)


def test_cipher_unseen_letters_use_word_patterns():
    prompt = CIPHER_REAL.replace("trb wzrswvog hffk", "hffk")
    s = solve(prompt)
    assert (s.status, s.answer) == ("solved", "book")
    assert "hffk = ?oo? = book" in s.trace


def test_numeric_equation_trace():
    prompt = EQ_NUMERIC_REAL.replace("69/52", "87\\11")
    s = solve(prompt)
    assert (s.status, s.answer) == ("solved", "858")  # reversed: 78*11 = 858, written reversed
    assert s.trace.startswith("mode: reversed\n\\ means a*b")


@pytest.mark.parametrize("prompt", [
    "", "garbage", None, 42,
    GRAVITY_REAL.split("For t")[0] + "Now, determine the falling distance for t = 4.41s given d = 0.5*g*t^2.",
    GRAVITY_REAL.rsplit("Now,", 1)[0], UNIT_REAL.rsplit("Now,", 1)[0],
    UNIT_REAL.replace("10.08 m becomes 6.69\n17.83 m becomes 11.83\n", ""),
    CIPHER_REAL.rsplit("Now,", 1)[0], CIPHER_REAL.replace("ucoov pwgtfyoqg vorq yrjjoe -> queen discovers near valley\n", ""),
    EQ_NUMERIC_REAL.rsplit("Now,", 1)[0], EQ_NUMERIC_REAL.split("\n34/44")[0] + "\nNow, determine the result for: 69/52",
    EQ_NUMERIC_REAL.replace("69/52", "6/9/52"), EQ_SYMBOLIC_REAL.replace("[[-!'", "[["),
    BIT_REAL.split("Here are")[0],                      # no examples, no query
    BIT_REAL.rsplit("Now,", 1)[0],                      # query missing
    NUMERAL_REAL.split("\n11")[0] + "\nNow, write the number 38 in the Wonderland numeral system.",  # no examples
    NUMERAL_REAL.rsplit("Now,", 1)[0],
])
def test_malformed(prompt):
    s = solve(prompt)
    assert s.status == "undetermined" and s.reason
    check_trace(s)


def test_cipher_reads_unseen_words_from_the_batch_vocabulary():
    from lab.puzzles import cipher, solve_frame

    key = dict(zip("abcdefghijklmnopqrstuvwxyz", "qwertyuiopasdfghjklzxcvbnm"))
    enc = lambda s: "".join(key.get(ch, ch) for ch in s)  # noqa: E731
    # 'zephyr' is not in the built-in word list; puzzle b's own examples never show z, p, h or y
    a = cipher.make_prompt([(enc("the zephyr reads a book"), "the zephyr reads a book")], enc("the book"))
    b = cipher.make_prompt([(enc("alice sees the castle"), "alice sees the castle")], enc("the zephyr"))
    assert "zephyr" not in cipher.WORDS
    alone = solve(b)
    assert alone.status == "undetermined" and "zephyr" not in alone.answer
    assert cipher.vocabulary([a, b, "not a cipher prompt", BIT_REAL])["zephyr"] == 1
    pooled = solve(b, cipher.vocabulary([a]))
    assert (pooled.answer, pooled.status, pooled.method) == ("the zephyr", "solved", "batch words")
    assert alone.method == "no word"
    out = solve_frame(pd.DataFrame({"id": ["a", "b"], "prompt": [a, b], "answer": ["the book", "the zephyr"]}))
    assert out["correct"].tolist() == [True, True] and out["status"].tolist() == ["solved", "solved"]
    assert out["method"].tolist() == ["key", "batch words"]


def test_units_with_longer_unit_names():
    prompt = UNIT_REAL.replace(" m becomes", " square m becomes").replace("6.69", "6.69 ft").replace(
        "25.09 m", "25.09 square m")
    s = solve(prompt)
    assert (s.status, s.answer) == ("solved", "16.65")
