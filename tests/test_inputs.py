"""Input files of every shape get a clear answer: small competition files, files without answers, empty or
non-UTF-8 puzzle files, missing or duplicate ids, prediction files with both `answer` and `completion`."""

import pandas as pd
import pytest

from lab import LabError
from lab.core.config import compose
from lab.data.dataset import prepare
from lab.puzzles import CATEGORIES, generate


def _competition_file(tmp_path, per_category: int, answers: bool = True):
    df = pd.concat([generate(c, per_category, seed=3) for c in CATEGORIES], ignore_index=True)
    df["id"] = [f"p{i:03d}" for i in range(len(df))]
    df = df[["id", "prompt", "answer"] if answers else ["id", "prompt"]]
    path = tmp_path / "small.csv"
    df.to_csv(path, index=False)
    return path


def test_a_small_competition_file_gives_every_category_a_validation_row(tmp_path, capsys):
    path = _competition_file(tmp_path, 4)  # 24 rows: at 0.1 no category would hold one out
    cfg = compose(["data=competition", f"data.path={path}", f"run_dir={tmp_path}/run"])
    train, val = prepare(cfg)
    assert len(val) == 6 and sorted(val["category"]) == sorted(CATEGORIES) and len(train) == 18
    assert "one is held out" in capsys.readouterr().out
    import json

    info = json.loads((tmp_path / "run" / "data" / "split.json").read_text())
    assert len(info["notes"]) == 6 and all(v["val"] == 1 for v in info["per_category"].values())
    train2, val2 = prepare(cfg)  # read back, hash-checked
    assert val2["id"].tolist() == val["id"].tolist()


def test_a_file_too_small_for_any_validation_row_fails_clearly(tmp_path):
    path = _competition_file(tmp_path, 1)
    with pytest.raises(LabError, match="no validation rows"):
        prepare(compose(["data=competition", f"data.path={path}", f"run_dir={tmp_path}/run"]))


def test_a_file_without_answers_is_refused_by_stages_that_score(tmp_path):
    path = _competition_file(tmp_path, 4, answers=False)
    cfg = compose(["data=competition", f"data.path={path}", f"run_dir={tmp_path}/run"])
    with pytest.raises(LabError, match=r"small\.csv: no 'answer' column"):
        prepare(cfg)
    train, val = prepare(cfg, need_answers=False)  # a caller that never scores
    assert "answer" not in train.columns and len(val) == 6
    with pytest.raises(LabError, match="no 'answer' column"):
        prepare(cfg)  # the saved split is checked as well


# ---- python -m lab puzzles solve ---------------------------------------------------------------

def _solve(tmp_path, content: bytes, capsys):
    from lab.puzzles.cli import main

    inp = tmp_path / "in.csv"
    inp.write_bytes(content)
    rc = main(["solve", str(inp), str(tmp_path / "out.csv")])
    return rc, capsys.readouterr()


@pytest.mark.parametrize("content,message", [
    (b"", "empty file"), ("id,prompt\n1,caf\xe9\n".encode("latin-1"), "not UTF-8"),
    (b"id,prompt\n", "no rows under the header"), (b"id,text\n1,x\n", "missing column(s) ['prompt']"),
    (b"id,prompt\n1,a\n1,b\n", "duplicate id(s) ['1']")])
def test_solve_refuses_bad_input_files_cleanly(tmp_path, capsys, content, message):
    rc, out = _solve(tmp_path, content, capsys)
    assert rc == 2 and message in out.err and "in.csv" in out.err and "Traceback" not in out.err
    assert not (tmp_path / "out.csv").exists()


def test_solve_says_when_it_numbers_rows_without_an_id_column(tmp_path, capsys):
    rc, out = _solve(tmp_path, b"prompt\nsomething\nsomething else\n", capsys)
    assert rc == 0 and "no 'id' column" in out.err and "0..1" in out.err


def test_solve_into_an_unwritable_folder_is_a_clear_error(tmp_path, capsys, monkeypatch):
    from lab.core import io as lab_io

    def refuse(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(lab_io.tempfile, "mkstemp", refuse)
    rc, out = _solve(tmp_path, b"id,prompt\n1,x\n", capsys)
    assert rc == 2 and "out.csv: cannot write here (Permission denied)" in out.err


# ---- python -m lab score -----------------------------------------------------------------------

def test_score_says_which_column_it_scores_when_both_are_present(tmp_path, capsys):
    from lab.eval.cli import score_main as main

    gold = tmp_path / "gold.csv"
    pred = tmp_path / "pred.csv"
    pd.DataFrame({"id": ["1", "2"], "answer": ["7", "8"]}).to_csv(gold, index=False)
    pd.DataFrame({"id": ["1", "2"], "answer": ["7", "8"], "completion": ["\\boxed{7}", "\\boxed{0}"]}).to_csv(
        pred, index=False)
    assert main([str(pred), "--gold", str(gold)]) == 0
    out = capsys.readouterr().out
    assert "both 'completion' and 'answer': scoring 'completion'" in out and "0.5000" in out
    assert main([str(pred), "--gold", str(gold), "--column", "answer"]) == 0
    out = capsys.readouterr().out
    assert "scoring 'answer' as given" in out and "1.0000" in out
