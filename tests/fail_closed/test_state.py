"""Fail closed on state: every cache, manifest and done-file is verified before it is trusted (cases 3, 9, 10 and 11
of the fail-closed probe, and a copied run's checkpoints); what is missing, unreadable or changed is made again or
refused, never used."""

from __future__ import annotations

import json
import os
import types

import pandas as pd
import pytest

from finished import mark_finished  # tests/finished.py
from lab import LabError
from lab.core import lineage
from lab.core.io import atomic_write_csv, atomic_write_json


def preds(correct: list[bool]) -> pd.DataFrame:
    return pd.DataFrame({"id": [f"p{i}" for i in range(len(correct))], "category": "numeral_system", "gold": "X",
                         "completion": ["\\boxed{X}" if c else "\\boxed{V}" for c in correct],
                         "answer": ["X" if c else "V" for c in correct], "correct": correct, "tokens": 10})


# ---- the seal helper --------------------------------------------------------------------------------------------

def test_a_seal_vouches_for_its_key_and_its_files_content(tmp_path):
    f = tmp_path / "a.csv"
    f.write_text("x\n1\n")
    lineage.seal(tmp_path / "a.json", {"k": 1}, [f])
    assert lineage.check_seal(tmp_path / "a.json", {"k": 1})["sha256"] == {"a.csv": lineage.content_hash(f)}
    with pytest.raises(lineage.Unsealed, match="made with other settings"):
        lineage.check_seal(tmp_path / "a.json", {"k": 2})
    f.write_text("x\n2\n")
    with pytest.raises(lineage.Unsealed, match="a.csv: changed since a.json sealed it"):
        lineage.check_seal(tmp_path / "a.json", {"k": 1})
    (tmp_path / "a.json").write_text("{ half")
    with pytest.raises(lineage.Unsealed, match="unreadable"):
        lineage.check_seal(tmp_path / "a.json")


# ---- case 3: the greedy evaluation cache --------------------------------------------------------------------------

def test_a_cut_evaluation_cache_is_generated_again_not_reused(tmp_path, monkeypatch, capsys):
    """Case 3: `<run>/evaluations/<key>.csv` cut to 2 of 4 rows, all correct, was 'reused, not generated'."""
    from lab.eval import greedy, sampling

    made = []

    def predictions(gen, puzzles, out_csv):
        made.append(len(puzzles))
        atomic_write_csv(out_csv, preds([True, False, False, False]))

    monkeypatch.setattr(greedy, "evaluation_key", lambda cfg, adapter, puzzles: {"model": "m", "puzzles": "p"})
    monkeypatch.setattr(sampling, "predictions", predictions)
    stage_dir = tmp_path / "02_sft"
    stage_dir.mkdir()
    stage = types.SimpleNamespace(cfg=types.SimpleNamespace(run_dir=str(tmp_path)), path=lambda n: stage_dir / n)
    puzzles = preds([True] * 4)
    first = greedy.evaluate(stage.cfg, puzzles, None, stage.path("predictions_before.csv"), gen=object())
    assert made == [4] and first["correct"].sum() == 1
    assert greedy.evaluate(stage.cfg, puzzles, None, stage.path("p2.csv"), gen=object())["correct"].sum() == 1 and made == [4]  # reused

    (entry,) = (tmp_path / "evaluations").glob("*.csv")
    atomic_write_csv(entry, preds([True, True]))  # cut to 2 of 4 rows, both correct
    again = greedy.evaluate(stage.cfg, puzzles, None, stage.path("p3.csv"), gen=object())
    assert made == [4, 4] and len(again) == 4 and again["correct"].sum() == 1  # generated again, not 2/2 correct
    out = capsys.readouterr().out
    assert "cache not reused" in out and f"{entry}: changed since {entry.stem}.seal.json sealed it" in out
    entry.with_suffix(".seal.json").unlink()  # the seal gone: the entry is not trusted either
    greedy.evaluate(stage.cfg, puzzles, None, stage.path("p4.csv"), gen=object())
    assert made == [4, 4, 4]


# ---- case 9: summary with a missing or truncated manifest ------------------------------------------------------

@pytest.fixture()
def run(tmp_path):
    atomic_write_csv(tmp_path / "02_sft" / "predictions_before.csv", preds([False] * 4))
    atomic_write_csv(tmp_path / "02_sft" / "predictions.csv", preds([True, False, False, False]))
    atomic_write_json(tmp_path / "02_sft" / "metrics.json", {"accuracy_before": 0.0, "accuracy_after": 0.25})
    mark_finished(tmp_path / "02_sft")
    atomic_write_csv(tmp_path / "04_vote" / "predictions.csv", preds([True, True, False, False]))
    atomic_write_json(tmp_path / "04_vote" / "metrics.json", {"greedy_accuracy": 0.5})
    mark_finished(tmp_path / "04_vote")
    return tmp_path


@pytest.mark.parametrize("damage", ["deleted", "truncated", "running"])
def test_summary_does_not_show_figures_its_manifest_does_not_vouch_for(run, damage):
    """Case 9: a stage's manifest.json truncated or deleted and metrics.json edited: the edited figures showed as
    current (a missing or broken manifest switched lineage checking off)."""
    from lab.runs.pipeline import summary

    man = run / "02_sft" / "manifest.json"
    if damage == "deleted":
        man.unlink()
    elif damage == "truncated":
        man.write_text(man.read_text()[:40])
    else:
        atomic_write_json(man, {**json.loads(man.read_text()), "status": "running"})
    atomic_write_json(run / "02_sft" / "metrics.json", {"accuracy_before": 0.0, "accuracy_after": 0.99})
    s = summary(run)
    assert not any(r["value"] == 0.99 for r in s["headline"])
    assert "02_sft" in s["not_current"] and "manifest.json is" in s["not_current"]["02_sft"][0]
    assert s["stages"]["02_sft"] == {"not_current": s["not_current"]["02_sft"]}
    assert "02_sft/metrics.json" not in s["read"] and "04_vote/metrics.json" in s["read"]
    md = (run / "summary.md").read_text()
    assert "0.990" not in md and "Read (finished and current): 04_vote/metrics.json" in md


# ---- case 11: compare reads finished, current stages only --------------------------------------------------------

def test_compare_takes_the_last_current_stage_never_a_dead_attempt(run, capsys):
    """Case 11: `compare` picked each run's newest predictions by mtime (02_sft's over 04_vote's) and read a dead
    attempt's `.04_vote.partial/predictions.csv`."""
    from lab.eval.cli import compare_main, find_predictions

    os.utime(run / "04_vote" / "predictions.csv", (1_000_000_000, 1_000_000_000))  # older than 02_sft's
    atomic_write_csv(run / ".04_vote.partial" / "predictions.csv", preds([False] * 4))  # the newest file of all
    assert compare_main([str(run), str(run / "02_sft"), "--examples", "0"]) == 0
    out = capsys.readouterr().out
    assert f"A: {run / '04_vote' / 'predictions.csv'} (04_vote, the last finished and current stage" in out
    atomic_write_json(run / "04_vote" / "metrics.json", {"greedy_accuracy": 1.0})  # edited: not current
    path, why = find_predictions(run)
    assert path == run / "02_sft" / "predictions.csv" and "skipped 04_vote (not current" in why
    with pytest.raises(LabError, match="did not finish"):
        find_predictions(run / ".04_vote.partial")


# ---- case 10: a sweep job rerun by hand --------------------------------------------------------------------------

def test_a_sweep_job_rerun_by_hand_is_not_finished_earlier(tmp_path, monkeypatch, capsys):
    """Case 10: a job's folder rerun by hand with other settings was still 'finished earlier: skipped', and the report
    listed the hand run's figures under the job's settings (done.json trusted over the folder)."""
    from lab.runs import sweep as sw
    from lab.runs import sweep_report as rp

    ran = []

    def execute_stage(stage, job_dir, nb_overrides, **kw):
        ran.append(stage)
        atomic_write_json(job_dir / stage / "metrics.json", {"accuracy_after": 0.25})
        mark_finished(job_dir / stage)

    monkeypatch.setattr(sw, "execute_stage", execute_stage)
    monkeypatch.setattr(sw, "job_config", lambda nbo: {"seed": 1})
    d = tmp_path / "seed=1"
    assert sw.run_job(d, ["seed=1"], ["02_sft"])["status"] == "finished" and ran == ["02_sft"]
    assert sw.run_job(d, ["seed=1"], ["02_sft"])["status"] == "skipped"  # the control: untouched, it is kept
    # by hand, into the job's folder, with other settings
    atomic_write_json(d / "02_sft" / "metrics.json", {"accuracy_after": 0.75})
    mark_finished(d / "02_sft", overrides=["seed=1", "sft.learning_rate=0.5"])
    job = json.loads((d / "job.json").read_text())
    assert rp.job_status(d, job) == "not current"
    df, _ = rp.collect(tmp_path)
    assert "02_sft.accuracy_after" not in df.columns or pd.isna(df.loc[0, "02_sft.accuracy_after"])
    assert sw.run_job(d, ["seed=1"], ["02_sft"])["status"] == "finished" and ran == ["02_sft", "02_sft"]


# ---- fingerprints by content ----------------------------------------------------------------------------------

def test_a_copied_runs_checkpoints_keep_their_fingerprint(tmp_path):
    """Low item: a copied run's checkpoints were discarded because the fingerprint held the model's path."""
    import shutil

    from lab.core.config import compose
    from lab.train import checkpoints

    a = tmp_path / "a" / "model"
    a.mkdir(parents=True)
    (a / "config.json").write_text('{"model_type": "nemotron_h"}')
    (a / "model.safetensors").write_bytes(b"weights")
    b = tmp_path / "b" / "model"
    shutil.copytree(a, b)
    fp = [checkpoints.fingerprint(compose([f"run_dir={tmp_path / r}", f"model.path={m}", "model.build_tiny=false"]),
                                  "sft", ["adapter_dir"]) for r, m in (("ra", a), ("rb", b))]
    assert fp[0] == fp[1]
    (b / "model.safetensors").write_bytes(b"other weights")  # the negative control: other content, other fingerprint
    fp_b = checkpoints.fingerprint(compose([f"run_dir={tmp_path / 'rb'}", f"model.path={b}",
                                            "model.build_tiny=false"]), "sft", ["adapter_dir"])
    assert lineage.diff(fp[0], fp_b) and all(line.startswith("model_sha256") for line in lineage.diff(fp[0], fp_b))


# ---- 04_vote's samples cache (an append-only log: verified by scoring it again, not by a seal) -------------------

def test_cached_samples_are_scored_again_and_a_changed_gold_is_drawn_again(tmp_path, capsys):
    """Second probe: a samples.jsonl row hand-edited to correct=true was reused as correct; a puzzle whose gold answer
    changed kept its old rows."""
    from lab.eval.sampling import _rescored

    def rec(pid, gold, completion, correct):
        return {"id": pid, "gold": gold, "sample": 0, "completion": completion, "answer": "?", "correct": correct}

    done = {"a": [rec("a", "X", "\\boxed{V}", True)], "b": [rec("b", "7", "\\boxed{7}", True)]}
    puzzles = pd.DataFrame({"id": ["a", "b"], "answer": ["X", "8"]})
    kept = _rescored(done, puzzles, "final", tmp_path / "samples.jsonl")
    assert list(kept) == ["a"] and kept["a"][0]["correct"] is False and kept["a"][0]["answer"] == "V"
    assert "1 puzzle(s) whose gold answer differs from the cache's are drawn again" in capsys.readouterr().out
