"""Loading, validating, splitting and saving puzzle files (lab.data.dataset)."""

from __future__ import annotations

import hashlib
import json
import sys
import types
from pathlib import Path

import pandas as pd
import pytest

from lab.core import paths
from lab import LabError
from lab.data.dataset import add_categories, find_data_file, load_puzzles, load_split, rows_hash, save_split, split

FIXTURE = Path(__file__).parent / "fixtures" / "tricky.csv"

TRICKY = {  # id -> (prompt, answer, note), exactly as written in tests/fixtures/tricky.csv
    "00042": ("In Alice's Wonderland, numbers are secretly converted.\nNow, write the number 38", "XXXVIII", "roman"),
    "007": ('Bit rule "x": transform 8-bit strings', "01010001", "leading zeros"),
    "NA": ("null", "NA", "na strings"),
    "id 4 ": ("prompt four", " 12 ", "spaces kept"),
    "ünï": ("Ünïcødé prompt ✓ — “quotes”", "αβγ✓", "unicode"),
    "x6": ("equation with a brace answer", "@&}", "brace"),
    "x7": ("comma answer", "3,5", "comma"),
    "x8": ("quote answer", 'say "x"', "quote"),
    "x9": ("newline answer", "a\nb", "newline"),
    "x10": ("empty note", "1e5", ""),
}


def _csv(tmp_path: Path, text: str | bytes, name: str = "puzzles.csv") -> Path:
    p = tmp_path / name
    if isinstance(text, str):
        text = text.encode("utf-8")
    p.write_bytes(text)
    return p


def _frame(n_per_cat: dict[str, int]) -> pd.DataFrame:
    rows = [{"id": f"{cat[:3]}{i:04d}", "prompt": f"{cat} puzzle {i}", "answer": str(i), "category": cat}
            for cat, n in n_per_cat.items() for i in range(n)]
    return pd.DataFrame(rows, dtype=str)


# ---------------------------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------------------------

def test_fixture_round_trips_byte_for_byte():
    df = load_puzzles(FIXTURE)
    assert list(df.columns) == ["id", "prompt", "answer", "note"]
    assert df["id"].tolist() == list(TRICKY)
    for _, r in df.iterrows():
        assert (r["prompt"], r["answer"], r["note"]) == TRICKY[r["id"]]
    assert all(isinstance(v, str) for v in df.to_numpy().ravel())


def test_crlf_file_bom_and_trailing_blank_lines(tmp_path):
    text = "\ufeffid,prompt,answer\r\n01,\"two\r\nlines\",0010\r\n02,p,NA\r\n\r\n\r\n"
    df = load_puzzles(_csv(tmp_path, text))
    assert df.to_dict("records") == [{"id": "01", "prompt": "two\r\nlines", "answer": "0010"},
                                     {"id": "02", "prompt": "p", "answer": "NA"}]


def test_test_file_without_answer(tmp_path):
    df = load_puzzles(_csv(tmp_path, "id,prompt\na,b\n"))
    assert list(df.columns) == ["id", "prompt"] and df["id"].tolist() == ["a"]


ERRORS = [
    pytest.param(b"", "empty file", id="empty"),
    pytest.param(b" \n\n", "empty file", id="blank"),
    pytest.param("id,prompt,answer\n1,ok,1\n2,caf\xe9,2\n".encode("latin-1"), "not UTF-8 text: byte 0xe9 at line 3",
                 id="latin-1"),
    pytest.param(b"id,question,answer\n1,q,1\n", "missing column(s) ['prompt']", id="missing-prompt"),
    pytest.param(b"prompt,answer\nq,1\n", "missing column(s) ['id']", id="missing-id"),
    pytest.param(b"id,prompt,answer,answer\n1,q,1,2\n", "duplicate column name(s) ['answer']", id="dup-column"),
    pytest.param(b"id,prompt,answer\n", "no rows under the header", id="header-only"),
    pytest.param(b"id,prompt,answer\n1,q,1\n2,q\n", "row 3 has 2 field(s), the header has 3", id="short-row"),
    pytest.param(b"id,prompt,answer\n1,q,1,extra\n", "row 2 has 4 field(s), the header has 3", id="long-row"),
    pytest.param(b"id,prompt,answer\n1,q,1\n\n2,q,2\n", "row 3 is a blank line", id="blank-line"),
    pytest.param(b"id,prompt,answer\n1,q,1\n2,,2\n", "row 3: empty prompt", id="empty-prompt"),
    pytest.param(b'id,prompt,answer\n1,"a\nb",1\n2," \n ",2\n', "row 3: empty prompt", id="blank-prompt-after-multiline"),
    pytest.param(b"id,prompt,answer\n,q,1\n", "row 2: empty id", id="empty-id"),
    pytest.param(b"id,prompt,answer\n1,q,1\n2,q, \n", "row 3: empty answer", id="empty-answer"),
    pytest.param(b"id,prompt,answer\n7,a,1\n8,b,2\n7,c,3\n", "row 4: duplicate id '7', first seen in row 2",
                 id="duplicate-id"),
    pytest.param(b'id,prompt,answer\n1,"q"x,1\n', "malformed CSV at line 2 of the file", id="bad-quote"),
]


@pytest.mark.parametrize("content, message", ERRORS)
def test_validation_errors_name_file_and_row(tmp_path, content, message):
    p = _csv(tmp_path, content, name="bad_file.csv")
    with pytest.raises(LabError) as e:
        load_puzzles(p)
    msg = str(e.value)
    assert msg.startswith(f"{p}: "), msg
    assert message in msg, msg
    if "row " in message:
        assert "header = row 1" in msg


def test_missing_file(tmp_path):
    with pytest.raises(LabError, match=r"nope\.csv: file not found"):
        load_puzzles(tmp_path / "nope.csv")
    with pytest.raises(LabError, match="not a file"):
        load_puzzles(tmp_path)


# ---------------------------------------------------------------------------------------------
# finding the file
# ---------------------------------------------------------------------------------------------

@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """A fake project root with conf/config.yaml, no $LAB_DATA, no Kaggle."""
    root = tmp_path / "root"
    (root / "conf").mkdir(parents=True)
    (root / "conf" / "config.yaml").write_text("seed: 1\n")
    monkeypatch.setenv("LAB_ROOT", str(root))
    monkeypatch.delenv("LAB_DATA", raising=False)
    monkeypatch.delenv("KAGGLE_KERNEL_RUN_TYPE", raising=False)
    monkeypatch.setattr(paths, "KAGGLE_INPUT", tmp_path / "kaggle" / "input")  # find_data_file lives in lab.core.paths
    monkeypatch.chdir(tmp_path)
    return root


def test_find_explicit(isolated, tmp_path):
    f = _csv(tmp_path, "id,prompt\n1,a\n", "mine.csv")
    assert find_data_file(str(f)) == f.resolve()
    assert find_data_file("mine.csv") == f.resolve()  # relative to the working directory
    (isolated / "data").mkdir()
    g = _csv(isolated / "data", "id,prompt\n1,a\n", "rel.csv")
    assert find_data_file("data/rel.csv") == g.resolve()  # relative to the project root
    with pytest.raises(LabError, match=r"missing\.csv: data file not found"):
        find_data_file("missing.csv")


def test_find_lab_data(isolated, tmp_path, monkeypatch):
    d = tmp_path / "elsewhere"
    d.mkdir()
    f = _csv(d, "id,prompt\n1,a\n", "train.csv")
    monkeypatch.setenv("LAB_DATA", str(d))
    assert find_data_file(None) == f.resolve()
    monkeypatch.setenv("LAB_DATA", str(f))
    assert find_data_file(None) == f.resolve()
    t = _csv(d, "id,prompt\n1,a\n", "test.csv")
    assert find_data_file(None, name="test.csv") == t.resolve()  # a file's folder is searched for other names
    monkeypatch.setenv("LAB_DATA", str(tmp_path / "typo"))
    with pytest.raises(LabError, match=r"typo: \$LAB_DATA points to nothing"):
        find_data_file(None)


def test_find_project_data_folder(isolated):
    (isolated / "data").mkdir()
    f = _csv(isolated / "data", "id,prompt\n1,a\n", "train.csv")
    assert find_data_file(None) == f


def test_find_on_kaggle(isolated, tmp_path, monkeypatch):
    kin = tmp_path / "kaggle" / "input"
    monkeypatch.setenv("KAGGLE_KERNEL_RUN_TYPE", "Batch")
    with pytest.raises(LabError, match=r"train.csv not found; looked in: .*kaggle/input/\*/train.csv"):
        find_data_file(None)
    (kin / "some-dataset").mkdir(parents=True)
    other = _csv(kin / "some-dataset", "id,prompt\n1,a\n", "train.csv")
    assert find_data_file(None) == other
    (kin / "another").mkdir()
    _csv(kin / "another", "id,prompt\n1,a\n", "train.csv")
    with pytest.raises(LabError, match="several train.csv files"):
        find_data_file(None)
    (kin / "competitions" / paths.COMPETITION_SLUG).mkdir(parents=True)
    own = _csv(kin / "competitions" / paths.COMPETITION_SLUG, "id,prompt\n1,a\n", "train.csv")
    assert find_data_file(None) == own


def test_find_nothing_lists_places(isolated):
    with pytest.raises(LabError) as e:
        find_data_file(None, name="train.csv")
    msg = str(e.value)
    assert "train.csv not found" in msg and str(isolated / "data" / "train.csv") in msg
    assert "kaggle" not in msg  # not on Kaggle: the mount is not searched


# ---------------------------------------------------------------------------------------------
# categories, split, hashes, save/load
# ---------------------------------------------------------------------------------------------

def test_add_categories(monkeypatch):
    fake = types.ModuleType("lab.puzzles.categories")
    fake.classify = lambda p: ("bit_manipulation", "xor") if "bit" in p else ("unknown", "unknown")
    monkeypatch.setitem(sys.modules, "lab.puzzles.categories", fake)
    df = pd.DataFrame({"id": ["1", "2"], "prompt": ["bit rule", "??"]}, dtype=str)
    out = add_categories(df)
    assert out["category"].tolist() == ["bit_manipulation", "unknown"]
    assert out["subtype"].tolist() == ["xor", "unknown"]
    assert "category" not in df.columns  # the input is not modified


def test_split_deterministic_stratified_disjoint():
    df = _frame({"gravity": 40, "numeral": 20, "cipher": 10, "tiny": 1})
    tr, va = split(df, 0.1, seed=7)
    tr2, va2 = split(df, 0.1, seed=7)
    pd.testing.assert_frame_equal(tr, tr2)
    pd.testing.assert_frame_equal(va, va2)
    assert va["category"].value_counts().to_dict() == {"gravity": 4, "numeral": 2, "cipher": 1}
    assert set(tr["id"]) | set(va["id"]) == set(df["id"]) and not set(tr["id"]) & set(va["id"])
    assert len(tr) + len(va) == len(df)
    # row order in each part follows the input
    order = {i: k for k, i in enumerate(df["id"])}
    assert [order[i] for i in va["id"]] == sorted(order[i] for i in va["id"])
    # another seed, another held-out set; shuffled input rows, the same one
    assert set(split(df, 0.1, seed=8)[1]["id"]) != set(va["id"])
    shuffled = df.sample(frac=1.0, random_state=3).reset_index(drop=True)
    assert set(split(shuffled, 0.1, seed=7)[1]["id"]) == set(va["id"])
    assert tr.attrs["split"] == {"seed": 7, "val_fraction": 0.1}


def test_split_without_category_and_edge_fractions():
    df = _frame({"x": 30}).drop(columns="category")
    tr, va = split(df, 0.2, seed=1)
    assert (len(tr), len(va)) == (24, 6)
    tr, va = split(df, 0.0, seed=1)
    assert (len(tr), len(va)) == (30, 0)
    for bad in (-0.1, 1.0):
        with pytest.raises(LabError, match="val_fraction"):
            split(df, bad, seed=1)


def test_rows_hash_stable_and_sensitive():
    df = pd.DataFrame({"id": ["1", "2"], "prompt": ["p", "q"], "answer": ["01", "x"]}, dtype=str)
    h = rows_hash(df)
    manual = hashlib.sha256(b"id\x1fprompt\x1fanswer\n")
    for v in ["1", "p", "01", "2", "q", "x"]:
        manual.update(len(v).to_bytes(8, "big") + v.encode())
    assert h == manual.hexdigest()
    assert h == "d5638c71c40687dbb656136f07bb17a5a8bd3f56672875abc7b91a5e331326f5"  # pinned: must never drift
    assert rows_hash(df.assign(category="c")) == h  # only id/prompt/answer count
    assert rows_hash(df.assign(answer=["1", "x"])) != h  # a leading zero matters
    assert rows_hash(df.iloc[::-1]) != h  # order matters
    a = pd.DataFrame({"id": ["ab"], "prompt": ["c"]})
    b = pd.DataFrame({"id": ["a"], "prompt": ["bc"]})
    assert rows_hash(a) != rows_hash(b)


def test_save_load_round_trip(tmp_path):
    df = load_puzzles(FIXTURE)
    extra = pd.DataFrame({"id": ["cr"], "prompt": ["lone\rreturn"], "answer": ["a\rb"], "note": ["cr"]}, dtype=str)
    df = pd.concat([df, extra], ignore_index=True).assign(category=["a", "b"] * 5 + ["a"])
    tr, va = split(df, 0.3, seed=5)
    info = save_split(tr, va, tmp_path / "split")
    on_disk = json.loads((tmp_path / "split" / "split.json").read_text())
    assert on_disk == info
    assert info["seed"] == 5 and info["val_fraction"] == 0.3
    assert (info["n_train"], info["n_val"]) == (len(tr), len(va))
    assert info["per_category"] == {c: {"train": int((tr["category"] == c).sum()), "val": int((va["category"] == c).sum())}
                                    for c in ("a", "b")}
    tr2, va2 = load_split(tmp_path / "split")
    pd.testing.assert_frame_equal(tr2, tr, check_dtype=False)
    pd.testing.assert_frame_equal(va2, va, check_dtype=False)
    assert not list((tmp_path / "split").glob("*.tmp"))


def test_save_load_empty_val_and_explicit_seed(tmp_path):
    df = _frame({"x": 5})
    tr, va = split(df, 0.0, seed=1)
    info = save_split(tr, va, tmp_path, seed=99, val_fraction=0.0, source="synthetic")
    assert info["seed"] == 99 and info["source"] == "synthetic" and info["n_val"] == 0
    tr2, va2 = load_split(tmp_path)
    assert len(tr2) == 5 and len(va2) == 0 and list(va2.columns) == list(df.columns)


def test_load_split_detects_changes(tmp_path):
    tr, va = split(_frame({"x": 10}), 0.2, seed=1)
    save_split(tr, va, tmp_path)
    p = tmp_path / "val.csv"
    p.write_text(p.read_text().replace("x puzzle", "X puzzle"))
    with pytest.raises(LabError, match=r"val\.csv: content hash .* differs from split\.json"):
        load_split(tmp_path)
    with pytest.raises(LabError, match=r"split\.json: file not found"):
        load_split(tmp_path / "nowhere")


def test_add_categories_with_the_real_classifier():
    puzzles = pytest.importorskip("lab.puzzles")
    if not hasattr(puzzles, "classify"):
        pytest.skip("lab.puzzles.classify not written yet")
    df = load_puzzles(FIXTURE)
    out = add_categories(df)
    assert len(out) == len(df) and out["id"].tolist() == df["id"].tolist()
    assert out.loc[out["id"] == "x7", "category"].item() == "unknown"  # not a competition prompt
    assert all(isinstance(c, str) for c in out["category"]) and all(isinstance(s, str) for s in out["subtype"])
