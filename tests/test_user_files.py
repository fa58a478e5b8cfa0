"""Issue 45: nothing a user owns is deleted or overwritten, a changed input is never silently reused, an override
means what it says. Each test reproduces one finding of the hostile probe (the item number in its docstring)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from lab import LabError
from lab.core.config import compose


def _cfg(tmp_path, *overrides):
    return compose([f"run_dir={tmp_path / 'run'}", *overrides])


# ---- item 1: a folder the lab builds into is the lab's --------------------------------------------------------

def test_tiny_model_path_with_a_users_folder_is_refused_not_deleted(tmp_path):
    """Item 1: model.path at an existing folder without config.json was deleted and replaced by the tiny model."""
    from lab.model import models

    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "notes.txt").write_text("secret")
    cfg = _cfg(tmp_path, f"model.path={victim}")
    with pytest.raises(LabError, match="victim.*did not make"):
        models.model_path(cfg)
    assert (victim / "notes.txt").read_text() == "secret"
    assert sorted(p.name for p in victim.iterdir()) == ["notes.txt"]


def test_atomic_dir_replaces_only_what_it_made(tmp_path):
    """Item 1 (the class): atomic_dir refuses a non-empty folder without its marker before the block runs, and
    replaces a folder it made (its marker) or an empty one."""
    from lab.core.io import MADE_MARKER, atomic_dir

    mine = tmp_path / "mine"
    with atomic_dir(mine) as tmp:
        (tmp / "a.txt").write_text("1")
    assert (mine / MADE_MARKER).is_file()
    with atomic_dir(mine) as tmp:  # the lab's own: replaced whole
        (tmp / "b.txt").write_text("2")
    assert sorted(p.name for p in mine.iterdir()) == [MADE_MARKER, "b.txt"]

    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "keep.txt").write_text("x")
    ran = []
    with pytest.raises(LabError, match="theirs"):
        with atomic_dir(theirs) as tmp:
            ran.append(tmp)
    assert ran == [] and (theirs / "keep.txt").read_text() == "x"
    a_file = tmp_path / "a_file"
    a_file.write_text("y")
    with pytest.raises(LabError, match="a_file"):
        with atomic_dir(a_file):
            pass
    assert a_file.read_text() == "y"
    empty = tmp_path / "empty"
    empty.mkdir()
    with atomic_dir(empty) as tmp:
        (tmp / "c.txt").write_text("3")
    assert (empty / "c.txt").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left behind


def test_save_adapter_refuses_a_users_folder(tmp_path):
    """Item 1, sft.adapter_dir / grpo.adapter_dir pointed outside the stage: `save_adapter` (lab.model.lora, through
    atomic_dir) and the train functions' early check refuse a folder the lab did not make."""
    from lab.model.lora import save_adapter

    victim = tmp_path / "adapter"
    victim.mkdir()
    (victim / "notes.txt").write_text("secret")

    class Model:
        def save_pretrained(self, path, **_):
            (Path(path) / "adapter_model.safetensors").write_text("w")

    with pytest.raises(LabError, match="adapter"):
        save_adapter(Model(), victim)
    assert sorted(p.name for p in victim.iterdir()) == ["notes.txt"]
    save_adapter(Model(), tmp_path / "fresh")
    save_adapter(Model(), tmp_path / "fresh")  # its own folder: replaced
    assert (tmp_path / "fresh" / "adapter_model.safetensors").is_file()


@pytest.mark.parametrize("module,key", [("sft", "sft.adapter_dir"), ("grpo", "grpo.adapter_dir")])
def test_train_refuses_a_users_adapter_dir_before_training(tmp_path, module, key):
    """Item 1: the refusal comes before any training (the check opens SFT's model with its LoRA, and the GRPO run),
    naming the key."""
    from lab.train import grpo, sft

    victim = tmp_path / "adapter"
    victim.mkdir()
    (victim / "notes.txt").write_text("secret")
    cfg = _cfg(tmp_path, f"{key}={victim}")
    with pytest.raises(LabError, match=key.replace(".", r"\.")):
        if module == "sft":
            sft.model_with_lora(cfg)
        else:
            grpo.GrpoRun(cfg, pd.DataFrame({"id": [], "prompt": []}), None, None, tmp_path / "checkpoints")
    assert sorted(p.name for p in victim.iterdir()) == ["notes.txt"]


# ---- item 2: a run folder holds neither the data it reads nor the sources ---------------------------------------

def _puzzles_csv(path: Path, n: int = 40, dup_of: int = 0) -> Path:
    """A small competition-style file: `n` numeral puzzles (classified as numeral_system), plus `dup_of` of the
    same prompts again under other ids."""
    from lab.puzzles import generate

    df = generate("numeral_system", n, seed=3)[["id", "prompt", "answer"]]
    if dup_of:
        extra = df.head(dup_of).copy()
        extra["id"] = [f"dup{i}" for i in range(dup_of)]
        df = pd.concat([df, extra], ignore_index=True)
    df.to_csv(path, index=False)
    return path


def test_run_dir_holding_the_sources_is_refused():
    """Item 2: `run_dir=.` rewrote notebooks/ and wrote the split over data/train.csv."""
    from lab.core.paths import project_root

    with pytest.raises(LabError, match="holds the lab's own sources"):
        compose(["run_dir=."])
    with pytest.raises(LabError, match="holds the lab's own sources"):
        compose([f"run_dir={project_root().parent}"])
    with pytest.raises(LabError, match="inside the repository's notebooks/"):
        compose(["run_dir=notebooks/x"])


def test_run_or_split_dir_holding_the_data_is_refused(tmp_path):
    """Item 2: a run folder (or split folder) that holds the data file it reads would write the split over it."""
    data = _puzzles_csv(tmp_path / "train.csv")
    before = data.read_bytes()
    common = ["data=competition", f"data.path={data}"]
    with pytest.raises(LabError, match="holds the data file it reads"):
        compose([*common, f"run_dir={tmp_path}"])
    with pytest.raises(LabError, match=r"data\.split_dir.*holds the data file"):
        compose([*common, f"run_dir={tmp_path / 'run'}", f"data.split_dir={tmp_path}"])
    compose([*common, f"run_dir={tmp_path / 'run'}"])  # a folder of its own is fine
    assert data.read_bytes() == before


# ---- items 3, 4, 5, 8 and the low items on the data: the competition split --------------------------------------

def _competition(tmp_path, data, *overrides):
    from lab.data.dataset import prepare

    return prepare(_cfg(tmp_path, "data=competition", f"data.path={data}", *overrides))


def test_repeated_prompts_never_straddle_the_split(tmp_path, capsys):
    """Item 3: the same prompts again under other ids landed on both sides of the split, without a word."""
    data = _puzzles_csv(tmp_path / "train.csv", n=60, dup_of=60)
    train, val = _competition(tmp_path, data, "data.val_fraction=0.2")
    assert len(train) + len(val) == 120 and len(val) > 0
    assert not set(train["prompt"]) & set(val["prompt"])
    info = json.loads((tmp_path / "run" / "data" / "split.json").read_text())
    assert info["repeated_prompts"] == 60
    assert "60 row(s) repeat the prompt of another row" in capsys.readouterr().out


def test_split_without_repeats_is_unchanged():
    """Item 3: grouping by prompt leaves a file without repeats split exactly as before (a unit is a row): the
    held-out ids of a fixed table at a fixed seed, as the starting commit's `split` chose them."""
    from lab.data.dataset import split

    df = pd.DataFrame({"id": [f"p{i:02d}" for i in range(20)], "prompt": [f"q{i}" for i in range(20)],
                       "category": ["a"] * 12 + ["b"] * 8})
    _, val = split(df, 0.25, seed=5)
    assert sorted(val["id"]) == ["p01", "p09", "p11", "p15", "p19"]


def test_conflicting_answers_and_crlf_prompts_are_named(tmp_path, capsys):
    """Low items: one prompt with two answers was accepted without a note; prompts with Windows line ends too."""
    from lab.puzzles import generate

    df = generate("numeral_system", 12, seed=3)[["id", "prompt", "answer"]]
    twin = df.iloc[[0]].assign(id="twin", answer="WRONG")
    crlf = df.iloc[[1]].assign(id="crlf", prompt=df["prompt"].iloc[1].replace("\n", "\r\n") + " ")
    pd.concat([df, twin, crlf]).to_csv(tmp_path / "train.csv", index=False)
    _competition(tmp_path, tmp_path / "train.csv")
    out = capsys.readouterr().out
    assert "one prompt has different answers" in out and "id twin -> 'WRONG'" in out
    assert "1 prompt(s) hold carriage returns" in out


def test_changed_data_file_is_refused_or_resplit(tmp_path):
    """Item 4: a data file changed in place was ignored on rerun (only its path was compared): the old split with
    the old answers was reused."""
    from lab.data.dataset import load_puzzles

    data = _puzzles_csv(tmp_path / "train.csv", n=40)
    _competition(tmp_path, data)
    df = load_puzzles(data).head(30)
    df["answer"] = "changed"
    df.to_csv(data, index=False)
    with pytest.raises(LabError, match=r"changed since this run's split.*data\.resplit=true"):
        _competition(tmp_path, data)
    train, val = _competition(tmp_path, data, "data.resplit=true")
    assert len(train) + len(val) == 30 and set(train["answer"]) == {"changed"}
    _competition(tmp_path, data)  # the new split is now the file's: reused without resplit


def _two_categories_sorted(path: Path) -> Path:
    from lab.puzzles import generate

    df = pd.concat([generate(c, 30, seed=4)[["id", "prompt", "answer"]] for c in ("numeral_system", "gravity")])
    df.to_csv(path, index=False)  # sorted by category, as an exported sheet might be
    return path


def test_n_train_n_val_draw_from_every_category(tmp_path):
    """Item 5: data.n_train / data.n_val took the first N rows in file order: on a file sorted by category,
    training held one category only."""
    data = _two_categories_sorted(tmp_path / "train.csv")
    train, val = _competition(tmp_path, data, "data.n_train=10", "data.n_val=4", "data.val_fraction=0.3")
    assert len(train) == 10 and len(val) == 4
    assert train["category"].value_counts().to_dict() == {"numeral_system": 5, "gravity": 5}
    assert val["category"].value_counts().to_dict() == {"numeral_system": 2, "gravity": 2}
    again, _ = _competition(tmp_path / "other", data, "data.n_train=10", "data.n_val=4", "data.val_fraction=0.3")
    assert list(again["id"]) == list(train["id"])  # seeded: the same rows in a fresh run


def test_sample_per_category_is_seeded_and_proportional():
    from lab.data.dataset import sample_per_category

    df = pd.DataFrame({"id": [str(i) for i in range(30)], "category": ["a"] * 20 + ["b"] * 9 + ["c"]})
    s = sample_per_category(df, 10, seed=1)
    assert len(s) == 10 and s["category"].value_counts().to_dict() == {"a": 6, "b": 3, "c": 1}
    assert list(s["id"]) == list(sample_per_category(df, 10, seed=1)["id"])
    assert list(s["id"]) != list(sample_per_category(df, 10, seed=2)["id"])
    assert list(s.index) == list(range(10)) and s["id"].astype(int).is_monotonic_increasing  # file order kept


def test_val_fraction_leaving_no_training_row_is_refused(tmp_path):
    """Item 8: data.val_fraction=0.99 on a small file saved a split with no training row (a raw TypeError later)."""
    data = _puzzles_csv(tmp_path / "train.csv", n=4)
    with pytest.raises(LabError, match="no training rows"):
        _competition(tmp_path, data, "data.val_fraction=0.99")
    assert not (tmp_path / "run" / "data" / "split.json").exists()


# ---- item 6: a dict override replaces the dict ------------------------------------------------------------------

def test_dict_override_replaces_the_dict(tmp_path):
    """Item 6: `grpo.rewards={format: 1.0}` composed to {correctness: 1.0, format: 1.0} (Hydra merges dicts)."""
    from omegaconf import OmegaConf

    cfg = _cfg(tmp_path, "grpo.rewards={format: 1.0}")
    assert OmegaConf.to_container(cfg.grpo.rewards) == {"format": 1.0}
    cfg = _cfg(tmp_path, "data.difficulty={numeral_system: {max_value: 50}}")
    assert OmegaConf.to_container(cfg.data.difficulty) == {"numeral_system": {"max_value": 50}}
    cfg = _cfg(tmp_path, "grpo.rewards.format=0.5")  # one key set: the rest kept, as Hydra says
    assert OmegaConf.to_container(cfg.grpo.rewards) == {"correctness": 1.0, "format": 0.5}
    cfg = _cfg(tmp_path, "grpo.rewards={format: 1.0}", "grpo.rewards.length=0.2")  # a key below the new dict
    assert OmegaConf.to_container(cfg.grpo.rewards) == {"format": 1.0, "length": 0.2}


def test_empty_rewards_are_refused_at_compose(tmp_path):
    """Item 6: `grpo.rewards={}` kept the defaults; now it means no reward, which cannot train: refused at compose."""
    with pytest.raises(LabError, match=r"grpo\.rewards is empty"):
        _cfg(tmp_path, "grpo.rewards={}")


# ---- items 7, 8 and the seed: enumerated values and ranges at compose -------------------------------------------

@pytest.mark.parametrize("override,message", [
    ("vote.methods=[majority,nonexistent]", r"vote\.methods='nonexistent' is not one of greedy, majority"),
    ("vote.options={confidence: {keep_topp: 0.5}}", r"vote\.options\.confidence \(its keys\)='keep_topp'"),
    ("infer.metric_version=foo", r"infer\.metric_version='foo' is not one of final, legacy"),
    ("data.trace_style=verbose", r"data\.trace_style='verbose' is not one of compact, derivation"),
    (f"seed={2**32}", r"seed=4294967296 must be <= 4294967295"),
])
def test_enumerated_values_and_ranges_are_checked_at_compose(tmp_path, override, message):
    """Items 7 and 8, the seed low item: each passed the config check and failed later (vote.methods after every
    sample was drawn, with a raw ValueError; data.categories=[unknown] with a raw EmptyDataError; a seed of 2**32
    in numpy)."""
    with pytest.raises(LabError, match=message):
        _cfg(tmp_path, override)


@pytest.mark.parametrize("override,message", [
    ("data.categories=[unknown]", r"data\.categories='unknown' is not a category, one of bit_manipulation"),
    ("data.weights={gravityy: 2}", r"data\.weights \(its keys\)='gravityy'"),
])
def test_unknown_categories_are_refused_before_the_split(tmp_path, override, message):
    """Item 8: data.categories=[unknown] ended in a raw EmptyDataError. Category names are checked against
    lab.puzzles.CATEGORIES (their one list) when the split is prepared, before any file is read or written."""
    from lab.data import dataset

    cfg = _cfg(tmp_path, override)
    with pytest.raises(LabError, match=message):
        dataset.prepare(cfg)
    assert not (tmp_path / "run").exists()


def test_schema_name_lists_match_their_owners():
    """The names compose checks (lab/core/schema.py, which may not import the packages above it) are the owners'."""
    from lab.competition import metric
    from lab.core import schema
    from lab.data import dataset
    from lab.eval import vote
    from lab.model import packed_rows
    from lab.train import rewards

    assert tuple(schema.PackedAttention.__members__) == packed_rows.ATTENTIONS
    assert schema.VOTE_METHODS == tuple(vote.METHODS)
    assert schema.VOTE_OPTIONS == tuple(vote.OPTIONS)
    assert schema.METRIC_VERSIONS == tuple(metric.VERSIONS)
    assert schema.REWARD_NAMES == tuple(rewards.REWARDS)
    assert schema.TRACE_STYLES == tuple(dataset.TRACE_STYLES)
    from lab.train import grpo_packed

    assert schema.GRPO_LOSS_TYPES == grpo_packed.LOSS_TYPES and schema.OLD_LOGPROBS == grpo_packed.OLD_LOGPROBS


def test_failed_stage_keeps_its_samples_for_the_rerun(tmp_path):
    """Item 7: a stage that failed after drawing its samples lost them with its folder, so the rerun drew every
    sample again. The keyed samples cache is carried into the rerun's fresh folder while the inputs the failed
    attempt read are unchanged; anything else it left is not."""
    from lab.core import lineage
    from lab.core.run import Stage, release_lock

    run = tmp_path / "run"
    (tmp_path / "inputs").mkdir(parents=True)  # outside the run folder: the lab writes only into a run it made
    src = tmp_path / "inputs" / "val.csv"
    src.write_text("id\n1\n")

    def attempt(fail_with: str | None = None):
        st = Stage("04_vote", [f"run_dir={run}"])
        lineage.consumed(src)
        if fail_with is not None:  # the samples are drawn, then the stage dies
            st.path("samples.jsonl").write_text(fail_with)
            st.path("curves.csv").write_text("half")
            release_lock(run)
            lineage.closed(st)
        return st

    attempt("drawn once\n")
    st = attempt()
    assert st.path("samples.jsonl").read_text() == "drawn once\n" and not st.path("curves.csv").exists()
    st.path("samples.jsonl").write_text("drawn twice\n")
    release_lock(run)
    lineage.closed(st)
    src.write_text("id\n2\n")  # the input changed: the samples are not trusted
    st = attempt()
    assert not st.path("samples.jsonl").exists()
    release_lock(run)


# ---- item 9 and the low items on commands: no command writes over its inputs ------------------------------------

def test_score_details_over_an_input_is_refused(tmp_path):
    """Item 9: `lab score PRED --gold GOLD --details GOLD` replaced the gold file with the details table."""
    from lab.eval.cli import score_main

    gold = tmp_path / "gold.csv"
    gold.write_text("id,answer\na,1\nb,2\n")
    pred = tmp_path / "pred.csv"
    pred.write_text("id,answer\na,1\nb,3\n")
    for target in (gold, pred):
        before = target.read_bytes()
        with pytest.raises(LabError, match="which this command reads"):
            score_main([str(pred), "--gold", str(gold), "--details", str(target)])
        assert target.read_bytes() == before
    (tmp_path / "link.csv").symlink_to(gold)  # the same file under another name
    with pytest.raises(LabError, match="which this command reads"):
        score_main([str(pred), "--gold", str(gold), "--details", str(tmp_path / "link.csv")])
    assert score_main([str(pred), "--gold", str(gold), "--details", str(tmp_path / "details.csv")]) == 0


def test_pack_into_the_adapter_is_refused(tmp_path):
    """Item 9: `lab pack ADAPTER ADAPTER/adapter_model.safetensors` overwrote the trained weights with a zip. A real
    (tiny) adapter, so that before the fix the command does write; its folder's marker is not packed."""
    import zipfile

    from lab.model import lora, models
    from lab.model.submission import pack_main

    cfg = _cfg(tmp_path)
    model, _ = models.load(cfg)
    pm, _ = lora.attach_lora(cfg, model)
    adapter = lora.save_adapter(pm, tmp_path / "adapter")
    weights = adapter / "adapter_model.safetensors"
    before = weights.read_bytes()
    for out in (weights, adapter / "submission.zip", adapter):
        with pytest.raises(LabError, match="which this command reads"):
            pack_main([str(adapter), str(out)])
    assert weights.read_bytes() == before and not (adapter / "submission.zip").exists()
    assert pack_main([str(adapter), str(tmp_path / "submission.zip")]) == 0
    assert sorted(zipfile.ZipFile(tmp_path / "submission.zip").namelist()) == ["adapter_config.json",
                                                                              "adapter_model.safetensors"]


def test_puzzles_solve_over_its_input_is_refused(tmp_path, capsys):
    """Item 9: `python -m lab puzzles solve IN.csv IN.csv` replaced the gold answers."""
    from lab.puzzles.cli import main

    data = _puzzles_csv(tmp_path / "in.csv", n=3)
    before = data.read_bytes()
    assert main(["solve", str(data), str(data)]) == 2
    assert "which this command reads" in capsys.readouterr().err
    assert data.read_bytes() == before


def test_puzzles_generate_refuses_a_negative_count(tmp_path, capsys):
    """Low item: `lab.puzzles generate --n -3` wrote 0 puzzles with exit 0."""
    from lab.puzzles.cli import main

    assert main(["generate", "--category", "gravity", "--n", "-3", str(tmp_path / "out.csv")]) == 2
    assert "--n -3" in capsys.readouterr().err and not (tmp_path / "out.csv").exists()


def test_summary_refuses_a_folder_that_is_not_a_run(tmp_path):
    """Low item: `lab summary` on a foreign folder overwrote a summary.md there."""
    from lab.runs.pipeline import summary_main

    (tmp_path / "summary.md").write_text("my notes")
    with pytest.raises(LabError, match="not a run folder"):
        summary_main([str(tmp_path)])
    assert (tmp_path / "summary.md").read_text() == "my notes"


def test_hydra_settings_are_refused_not_ignored(tmp_path):
    """Low item: `hydra.run.dir=...` was accepted and did nothing (the lab runs no Hydra app)."""
    with pytest.raises(LabError, match=r"hydra\.run\.dir=/tmp/elsewhere: .*run_dir=PATH"):
        _cfg(tmp_path, "hydra.run.dir=/tmp/elsewhere")


def test_compare_warns_of_a_correct_column_the_metric_contradicts(tmp_path, capsys):
    """Low item: `compare` trusted a `correct` column that `score` contradicts, without a word."""
    from lab.eval.cli import compare_main

    rows = ("id,category,gold,completion,answer,correct\na,gravity,1.5,\\boxed{{1.5}},1.5,True\n"
            "b,gravity,2.0,\\boxed{{7.0}},7.0,{b}\n")
    (tmp_path / "a.csv").write_text(rows.format(b="False"))
    (tmp_path / "b.csv").write_text(rows.format(b="True"))  # b is wrong, the file says right
    assert compare_main([str(tmp_path / "a.csv"), str(tmp_path / "b.csv"), "--examples", "0"]) == 0
    out = capsys.readouterr().out
    assert "WARNING: B:" in out and "ids b;" in out and "WARNING: A:" not in out


def test_report_does_not_average_over_an_unreadable_job(tmp_path, capsys):
    """Low item: `lab report` silently averaged over a job whose metrics.json was unreadable."""
    from lab.core.io import atomic_write_json
    from lab.runs.jobs import write_done
    from lab.runs.sweep_report import collect
    from finished import mark_finished  # tests/finished.py

    for seed, acc in ((1, 0.5), (2, 0.7)):
        d = tmp_path / f"seed={seed}"
        atomic_write_json(d / "02_sft" / "metrics.json", {"accuracy_after": acc})
        atomic_write_json(d / "03_grpo" / "metrics.json", {"accuracy_after": acc})
        atomic_write_json(d / "job.json", {"job": d.name, "status": "finished", "params": {"seed": seed},
                                           "stages": ["02_sft", "03_grpo"], "overrides": [f"seed={seed}"]})
        for stage in ("02_sft", "03_grpo"):
            mark_finished(d / stage)
        write_done(d, d.name, ["02_sft", "03_grpo"], [f"seed={seed}"], "key", "now")
    (tmp_path / "seed=2" / "03_grpo" / "metrics.json").write_text("{not json")
    df, _ = collect(tmp_path)
    bad = df.set_index("job").loc["seed=2"]
    assert bad["status"] == "unreadable" and "not valid JSON" in bad["error"]
    assert pd.isna(bad["02_sft.accuracy_after"])  # its readable stage is not averaged in either
    assert "job seed=2 is reported as unreadable" in capsys.readouterr().out


def test_sweep_value_leaving_the_sweep_folder_is_refused():
    """Low item: a swept `model.name=../../..` made a job folder outside the sweep folder."""
    from lab.runs.sweep import plan

    with pytest.raises(LabError, match=r"'\.\./\.\./\.\.' would put its job folder .* outside the sweep folder"):
        plan(["model.name=../../..,tiny"])
    assert plan(["model.name=a,b"])["named"] == ["model.name"]


def test_second_sweep_into_a_busy_folder_is_refused(tmp_path, monkeypatch):
    """Low item: two sweeps of one name ran at once: error.txt appeared inside the first one's finished job and
    sweep.json was last-writer-wins. The sweep now holds its folder's lock; a second one is refused before writing.
    The first sweep is another process holding that lock (in one process the lock is re-entrant)."""
    import os
    import subprocess
    import sys

    from lab.runs import sweep as sweep_mod

    from lab.core import owner

    folder = owner.output_dir(tmp_path / "s", "sweep")  # as the first sweep made it
    (folder / "sweep.json").write_text('{"fixed_overrides": [], "first": true}')
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from lab.core.run import acquire_lock; acquire_lock(sys.argv[1]); "
         "print('held', flush=True); time.sleep(60)", str(folder)],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setattr(sweep_mod, "multirun", lambda *a, **k: pytest.fail("the second sweep ran its jobs"))
        with pytest.raises(LabError, match="in use by process"):
            sweep_mod.sweep([], sweep_dir=str(folder))
        assert (folder / "sweep.json").read_text() == '{"fixed_overrides": [], "first": true}'
    finally:
        holder.kill()
        holder.wait()
