"""A rerun never mixes two experiments (issue 28, items 1-4 and 8): checkpoints keyed by their config and counted only
when complete, stage lineage in the manifests, a failed rerun that leaves the finished stage as it was."""

from __future__ import annotations

import errno
import os

import pandas as pd
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from lab.train import checkpoints  # noqa: E402
from lab.data import dataset as data
from lab.core import lineage
from lab.core import io as lab_io
from lab.core import paths
from lab.core import run
from lab import LabError
from lab.core.config import compose  # noqa: E402
from lab.core.run import stage_output  # noqa: E402
from lab.core.io import atomic_write_csv
from lab.core.run import Stage, stage_input
from lab.runs.pipeline import headline_table, summary  # noqa: E402


def preds(correct: list[bool]) -> pd.DataFrame:
    return pd.DataFrame({"id": [f"p{i}" for i in range(len(correct))], "category": "numeral_system",
                         "gold": "X", "completion": ["\\boxed{X}" if c else "\\boxed{V}" for c in correct],
                         "answer": ["X" if c else "V" for c in correct], "correct": correct, "tokens": 10})


def sft_stage(cfg, adapter: bytes, correct: list[bool]) -> None:
    """A finished 02_sft made by hand: an adapter file, predictions before and after, metrics."""
    st = Stage("02_sft", cfg=cfg)
    ad = paths.resolve_path(st.cfg.sft.adapter_dir)  # points into the stage's fresh folder while it runs
    ad.mkdir(parents=True)
    (ad / "adapter_model.safetensors").write_bytes(adapter)
    atomic_write_csv(st.path("predictions_before.csv"), preds([False] * len(correct)))
    atomic_write_csv(st.path("predictions.csv"), preds(correct))
    st.finish({"accuracy_before": 0.0, "accuracy_after": sum(correct) / len(correct)})


def grpo_stage(cfg, adapter: bytes, correct: list[bool]) -> None:
    """A finished 03_grpo made by hand, reading 02_sft as the notebook does."""
    st = Stage("03_grpo", cfg=cfg)
    stage_output(cfg, "02_sft")
    stage_input(cfg, cfg.grpo.init_adapter)
    ad = paths.resolve_path(st.cfg.grpo.adapter_dir)
    ad.mkdir(parents=True)
    (ad / "adapter_model.safetensors").write_bytes(adapter)
    atomic_write_csv(st.path("predictions.csv"), preds(correct))
    st.finish({"accuracy_after": sum(correct) / len(correct)})


def files(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# ---- item 2: stage lineage ------------------------------------------------------------------------

def test_a_stage_read_from_an_upstream_that_was_rerun_is_refused_and_marked(tmp_path):
    cfg = compose([f"run_dir={tmp_path}"])
    sft_stage(cfg, b"sft adapter 1", [True] * 4 + [False] * 6)
    grpo_stage(cfg, b"grpo adapter 1", [True] * 5 + [False] * 5)
    m = lab_io.read_json(tmp_path / "03_grpo" / "manifest.json")
    assert set(m["inputs"]) >= {"02_sft", "02_sft/adapter"} and "predictions.csv" in m["outputs"]
    assert stage_input(cfg, cfg.grpo.adapter_dir).is_dir()  # 04_vote may read 03_grpo: it is current

    sft_stage(cfg, b"sft adapter 2, other settings", [True] * 6 + [False] * 4)  # 02_sft rerun
    assert any("02_sft/adapter" in p for p in lineage.problems(tmp_path, "03_grpo"))
    with pytest.raises(LabError, match=r"03_grpo.*02_sft/adapter.*02_sft was rerun"):
        stage_input(cfg, cfg.grpo.adapter_dir)  # 04_vote would evaluate the GRPO adapter trained from the old SFT
    rows = {r["stage"]: r for r in headline_table(tmp_path)}  # the stale stage: one row, none of its figures
    assert rows["03_grpo (not current)"]["value"] is None and rows["03_grpo (not current)"]["fixed / broken"] == ""
    assert rows["02_sft"]["fixed / broken"] == "6 / 0"
    summary(tmp_path)
    md = (tmp_path / "summary.md").read_text()
    assert "Not current" in md and "03_grpo read 02_sft/adapter" in md

    grpo_stage(cfg, b"grpo adapter 2", [True] * 7 + [False] * 3)  # rerun downstream: current again
    assert lineage.problems(tmp_path, "03_grpo") == [] and stage_input(cfg, cfg.grpo.adapter_dir).is_dir()


def test_a_changed_split_makes_the_stages_that_read_it_stale(tmp_path):
    cfg = compose([f"run_dir={tmp_path}", "data.n_train=6", "data.n_val=3"])
    st = Stage("02_sft", cfg=cfg)
    data.prepare(st.cfg)
    st.finish({"accuracy_after": 0.5})
    assert "data" in lab_io.read_json(tmp_path / "02_sft" / "manifest.json")["inputs"]
    with open(tmp_path / "data" / "val.csv", "a", encoding="utf-8") as f:
        f.write("extra,row\n")
    with pytest.raises(LabError, match="02_sft read data"):
        stage_output(cfg, "02_sft")


# ---- item 8: a hand-edited output -----------------------------------------------------------------

def test_a_hand_edited_metrics_file_is_detected(tmp_path):
    cfg = compose([f"run_dir={tmp_path}"])
    sft_stage(cfg, b"sft adapter", [True] * 4 + [False] * 6)
    grpo_stage(cfg, b"grpo adapter", [True] * 5 + [False] * 5)
    path = tmp_path / "02_sft" / "metrics.json"
    m = lab_io.read_json(path)
    lab_io.atomic_write_json(path, {**m, "accuracy_after": 0.99})
    rows = headline_table(tmp_path)
    assert not any(r["value"] == 0.99 for r in rows)  # the edited number is not shown
    stages = {r["stage"] for r in rows}
    assert {"02_sft (not current)", "03_grpo (not current)"} <= stages  # 03_grpo read the edited stage
    summary(tmp_path)
    assert "metrics.json changed or removed after the stage finished" in (tmp_path / "summary.md").read_text()
    with pytest.raises(LabError, match="metrics.json changed"):
        stage_output(cfg, "02_sft", "predictions.csv")


# ---- item 3: a failed rerun leaves the finished stage intact --------------------------------------

def test_a_rerun_that_fails_inside_the_stage_leaves_the_finished_stage_byte_identical(tmp_path):
    cfg = compose([f"run_dir={tmp_path}", "data.n_train=6", "data.n_val=3"])
    st = Stage("04_vote", cfg=cfg)
    data.prepare(st.cfg)
    atomic_write_csv(st.path("predictions.csv"), preds([True, False, True]))
    st.finish({"greedy_accuracy": 2 / 3})
    before = files(tmp_path / "04_vote")

    # seed=99 passes compose, then the stage refuses inside: the split was made with seed 1234
    bad = compose([f"run_dir={tmp_path}", "data.n_train=6", "data.n_val=3", "seed=99"])
    st2 = Stage("04_vote", cfg=bad)
    atomic_write_csv(st2.path("predictions.csv"), preds([False, False, False]))  # a half-done rerun's output
    with pytest.raises(LabError, match="split.json"):
        data.prepare(st2.cfg)
    assert files(tmp_path / "04_vote") == before  # byte for byte: metrics, config.yaml, manifest, predictions
    assert stage_output(cfg, "04_vote", "predictions.csv").is_file() and lineage.problems(tmp_path, "04_vote") == []

    # the next run starts from a fresh folder, and only its finish replaces the result
    st3 = Stage("04_vote", cfg=cfg)
    assert not st3.path("predictions.csv").exists() and files(tmp_path / "04_vote") == before
    st3.finish({"greedy_accuracy": 0.0})
    assert lab_io.read_json(tmp_path / "04_vote" / "metrics.json")["greedy_accuracy"] == 0.0
    assert not any(p.name.startswith(".04_vote") for p in tmp_path.iterdir())


def test_an_interrupted_swap_puts_the_previous_result_back(tmp_path):
    from lab.core import owner

    owner.claim_run(tmp_path)  # the run folder it happened in
    old = tmp_path / ".04_vote.old"  # what a finish killed between its two renames leaves
    old.mkdir(parents=True)
    (old / "metrics.json").write_text('{"greedy_accuracy": 0.5}')
    st = Stage("04_vote", cfg=compose([f"run_dir={tmp_path}"]))
    assert (tmp_path / "04_vote" / "metrics.json").is_file() and not old.exists()
    run.release_lock(st.run_dir)


def test_a_scheduler_transformers_does_not_know_is_refused_before_anything_is_touched(tmp_path):
    with pytest.raises(LabError, match="sft.lr_scheduler_type='cosinee' is not one of transformers' schedulers"):
        Stage("02_sft", [f"run_dir={tmp_path / 'run'}", "sft.lr_scheduler_type=cosinee"])
    assert not (tmp_path / "run").exists()


# ---- greedy evaluations cached by their key (lab.eval.greedy.evaluate) ----------------------------------------

def test_an_evaluation_key_follows_content_not_paths(tmp_path):
    from lab.eval.greedy import evaluation_key

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")

    def cfg(*extra):
        return compose([f"run_dir={tmp_path}", "model.build_tiny=false", f"model.path={model}", *extra])

    for name, content in (("work", b"adapter 1"), ("final", b"adapter 1"), ("other", b"adapter 2")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "adapter_model.safetensors").write_bytes(content)
    puzzles = pd.DataFrame({"id": ["a", "b"], "prompt": ["p1", "p2"], "answer": ["1", "2"]})
    key = evaluation_key(cfg(), tmp_path / "work", puzzles)
    assert evaluation_key(cfg(), tmp_path / "final", puzzles) == key  # 03_grpo's working folder, 04_vote's final one
    assert evaluation_key(cfg(), tmp_path / "other", puzzles) != key
    assert evaluation_key(cfg(), None, puzzles) != key
    assert evaluation_key(cfg("infer.max_tokens=12"), tmp_path / "work", puzzles) != key
    assert evaluation_key(cfg("infer.temperature=0.5"), tmp_path / "work", puzzles) != key
    assert evaluation_key(cfg(), tmp_path / "work", puzzles.assign(prompt=["p1", "p3"])) != key
    (model / "config.json").write_text('{"another": "model"}')
    assert evaluation_key(cfg(), tmp_path / "work", puzzles) != key


# ---- item 4: checkpoints count only when complete; a full disk is a message -----------------------

def test_resume_takes_the_newest_complete_checkpoint_and_says_so(tmp_path):
    from lab.train import grpo

    out = tmp_path / "checkpoints"
    for step in (1, 2, 3):
        ck = out / f"checkpoint-{step}"
        ck.mkdir(parents=True)
        (ck / "adapter_model.safetensors").write_bytes(b"x" * 100)
        (ck / "trainer_state.json").write_text("{}")
        if step < 3:  # checkpoint-3: killed mid-save, never marked
            checkpoints.mark_complete(ck)
    with open(out / "checkpoint-2" / "adapter_model.safetensors", "r+b") as f:
        f.truncate(40)  # damaged: a full disk cut the file short
    fp = {"grpo": {"learning_rate": 1e-4}, "seed": 1}
    lab_io.atomic_write_json(out / checkpoints.RUN_RECORD, {"fingerprint": fp, "order": ["a"]})
    cfg = compose([f"run_dir={tmp_path}", "grpo.resume=true", "grpo.max_steps=5"])
    last, record, notes = grpo.resume_point(cfg, out, fp)
    assert last == out / "checkpoint-1" and record["order"] == ["a"]
    assert any("checkpoint-2 is incomplete (" in n and "adapter_model.safetensors: changed since lab_complete.json"
               in n for n in notes)
    assert any("checkpoint-3 is incomplete (no lab_complete.json" in n for n in notes)
    assert notes[-1] == f"resuming from {out / 'checkpoint-1'} (the newest complete checkpoint)"
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["checkpoint-1"]


def test_a_changed_fingerprint_starts_afresh_with_a_note_or_refuses_when_resume_was_asked(tmp_path):
    out = tmp_path / "checkpoints"
    (out / "checkpoint-1").mkdir(parents=True)
    checkpoints.mark_complete(out / "checkpoint-1")
    old = {"sft": {"learning_rate": 0.01, "max_steps": 150}, "seed": 1}
    new = {"sft": {"learning_rate": 0.0001, "max_steps": 150}, "seed": 1}
    checkpoints.write_record(out, {"fingerprint": old})
    with pytest.raises(LabError, match=r"sft.learning_rate: 0.01 -> 0.0001"):
        checkpoints.resume_point(out, new, resume=True, asked=True, what="sft")
    assert (out / "checkpoint-1").is_dir()  # refused: nothing deleted
    last, _, notes = checkpoints.resume_point(out, new, resume=True, asked=False, what="sft")
    assert last is None and "sft.learning_rate: 0.01 -> 0.0001" in notes[0] and not out.exists()
    assert checkpoints.asked_to_resume(["seed=1", "sft.resume=true"], "sft.resume")
    assert not checkpoints.asked_to_resume(["sft.resume=false"], "sft.resume")


def test_a_full_disk_is_a_message_naming_the_folder_and_the_space(tmp_path):
    folder = tmp_path / "checkpoints"
    with pytest.raises(LabError) as e:
        with checkpoints.disk_full_guard(folder, 10 * 2**20):
            raise OSError(errno.ENOSPC, "No space left on device")
    msg = str(e.value)
    assert msg.startswith(f"{folder}: the disk is full") and "needs about 10.0 MB" in msg and "free there" in msg
    with pytest.raises(PermissionError):  # any other error passes through as it is
        with checkpoints.disk_full_guard(folder, 1):
            raise PermissionError(errno.EACCES, "denied")


# ---- end to end on the tiny model: SFT (items 1 and 4) ---------------------------------------------

@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("rerun")


def sft_cfg(root, name, *extra):
    return compose([f"run_dir={root / name}", f"model.path={root / 'base_model'}", "sft.batch_size=2",
                    "sft.logging_steps=1", "sft.save_steps=1", "sft.max_steps=3", "sft.gradient_check=false", *extra])


def sft_run(cfg, overrides=()):
    from lab.puzzles import generate
    from train_steps import sft_train

    return sft_train(cfg, Stage("02_sft", overrides, cfg=cfg), generate("numeral_system", 6, 0))[0]


@pytest.mark.slow
def test_a_changed_sft_rerun_never_resumes_the_old_run(root, capsys):
    m = sft_run(sft_cfg(root, "changed"))
    assert m["steps"] == 3 and m["resumed_from"] is None
    # another learning rate on a folder with checkpoints: starts afresh, naming the change
    capsys.readouterr()
    m = sft_run(sft_cfg(root, "changed", "sft.learning_rate=1e-4"))
    assert m["resumed_from"] is None and m["steps"] == 3
    assert "different SFT configuration (sft.learning_rate: 0.01 -> 0.0001)" in capsys.readouterr().out
    # asked to resume (sft.resume=true passed), another configuration is refused
    with pytest.raises(LabError, match=r"sft.learning_rate: 0.0001 -> 0.005"):
        sft_run(sft_cfg(root, "changed", "sft.learning_rate=5e-3"), overrides=["sft.resume=true"])
    # fewer steps lays the learning-rate schedule out differently: afresh too, never the longer run's adapter
    m = sft_run(sft_cfg(root, "changed", "sft.learning_rate=1e-4", "sft.max_steps=2"))
    assert m["resumed_from"] is None and m["steps"] == 2
    # the same settings again resume (here from the finished run's last checkpoint)
    m = sft_run(sft_cfg(root, "changed", "sft.learning_rate=1e-4", "sft.max_steps=2"), overrides=["sft.resume=true"])
    assert m["resumed_from"].endswith("checkpoint-2")


@pytest.mark.slow
def test_sft_survives_a_full_disk_and_resumes_from_the_newest_complete_checkpoint(root, monkeypatch, capsys):
    from transformers import Trainer

    ck = root / "disk" / "checkpoints" / "02_sft"
    save_rng = Trainer._save_rng_state

    def full_at_step_2(self, output_dir):  # the model and optimizer of checkpoint-2 are written, then the disk is full
        if output_dir.endswith("checkpoint-2"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return save_rng(self, output_dir)

    monkeypatch.setattr(Trainer, "_save_rng_state", full_at_step_2)
    with pytest.raises(LabError, match=rf"{ck}: the disk is full .* one checkpoint needs about"):
        sft_run(sft_cfg(root, "disk"))
    assert (ck / "checkpoint-2" / "adapter_model.safetensors").is_file()  # half a checkpoint is left
    monkeypatch.setattr(Trainer, "_save_rng_state", save_rng)

    # the rerun skips the half-written checkpoint and resumes from the newest complete one, saying so
    capsys.readouterr()
    m = sft_run(sft_cfg(root, "disk"))
    out = capsys.readouterr().out
    assert "checkpoint-2 is incomplete" in out and f"resuming from {ck / 'checkpoint-1'}" in out
    assert m["resumed_from"] == str(ck / "checkpoint-1") and m["steps"] == 3


@pytest.mark.slow
def test_a_second_stage_reuses_the_greedy_evaluation_and_a_changed_key_generates_again(root, monkeypatch):
    """03_grpo's evaluation and 04_vote's greedy pass of the same model: one pass (sampling.predictions counted,
    not replaced); another budget is another key, generated again."""
    from lab.eval import greedy, sampling

    calls = []
    real = sampling.predictions
    monkeypatch.setattr(sampling, "predictions", lambda gen, puzzles, **kw: calls.append(len(puzzles)) or
                        real(gen, puzzles, **kw))
    run_dir = root / "evals"

    def evaluate(name, *extra):
        st = Stage(name, cfg=compose([f"run_dir={run_dir}", f"model.path={root / 'base_model'}", "data.n_train=4",
                                      "data.n_val=3", "infer.max_tokens=8", *extra]))
        _, val = data.prepare(st.cfg)
        pred = greedy.evaluate(st.cfg, val, None, st.path("predictions.csv"))
        st.finish({})
        return pred

    first = evaluate("03_grpo")
    assert calls == [3]
    again = evaluate("04_vote")
    assert calls == [3]  # not generated again
    assert (run_dir / "04_vote" / "predictions.csv").read_bytes() == (run_dir / "03_grpo" / "predictions.csv").read_bytes()
    pd.testing.assert_frame_equal(first, again)
    evaluate("04_vote", "infer.max_tokens=6")
    assert calls == [3, 3] and len(list((run_dir / "evaluations").glob("*.csv"))) == 2
