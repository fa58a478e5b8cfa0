"""Kaggle's limits (issue 44): the dataset packs only tracked files, a run folder outside /kaggle/working and local
paths in the overrides are refused, each stage's planned output is computed from the config and checked against the
20 GB Kaggle keeps, checkpoints go to scratch on Kaggle, the wall-clock budget defaults to the run limit, a budget
stop keeps one checkpoint where the next kernel finds it, and a chain of kernels copies back only what each reads.
No network, no GPU: the install cell runs against a fake /kaggle tree with pip recorded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from lab import LabError
from lab.core.config import compose
from lab.core.paths import checkpoint_root
from lab.kaggle import kernel as kaggle
from lab.plan import output_plan
from lab.train import checkpoints


def cells(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cells"]


def src(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


# ---- the dataset packs only what git tracks ------------------------------------------------------------------------

def _project(tmp_path: Path, git: bool) -> Path:
    root = tmp_path / "proj"
    for rel, text in {"conf/config.yaml": "a: 1\n", "notebooks/01_explore.ipynb": "{}", "scripts/run.sh": "echo\n",
                      "lab/__init__.py": ""}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    if git:
        env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
               "GIT_COMMITTER_EMAIL": "t@t"}
        subprocess.run(["git", "init", "-q", str(root)], check=True, env=env)
        subprocess.run(["git", "-C", str(root), "add", "."], check=True, env=env)
    (root / "conf" / "private").mkdir()
    (root / "conf" / "private" / "secrets.yaml").write_text("token: hunter2\n")  # untracked
    (root / "notebooks" / "scratch.ipynb").write_text("{}")  # untracked
    return root


def test_dataset_sources_are_the_tracked_files_only(tmp_path, monkeypatch):
    root = _project(tmp_path, git=True)
    monkeypatch.setenv("LAB_ROOT", str(root))
    files = kaggle.tracked_files()
    assert files == ["conf/config.yaml", "lab/__init__.py", "notebooks/01_explore.ipynb", "scripts/run.sh"]
    out = tmp_path / "ds"
    out.mkdir()
    with tarfile.open(kaggle._source_tarball(out)) as t:
        names = t.getnames()
    assert names == ["conf/config.yaml", "notebooks/01_explore.ipynb", "scripts/run.sh"]


def test_dataset_outside_git_needs_an_explicit_list(tmp_path, monkeypatch):
    root = _project(tmp_path, git=False)
    monkeypatch.setenv("LAB_ROOT", str(root))
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))  # git must not find a repository above tmp_path
    with pytest.raises(LabError, match="not a git checkout.*--files-from"):
        kaggle.tracked_files()
    assert kaggle.tracked_files(["conf/config.yaml", "conf/gone.yaml"]) == ["conf/config.yaml"]
    with pytest.raises(LabError, match="inside"):
        kaggle.tracked_files(["../outside.txt"])
    out = tmp_path / "ds"
    out.mkdir()
    with tarfile.open(kaggle._source_tarball(out, ["conf/config.yaml"])) as t:
        assert t.getnames() == ["conf/config.yaml"]


# ---- the run folder and local paths --------------------------------------------------------------------------------

@pytest.mark.parametrize("kw", [{"run_name": "../../etc"}, {"run_name": "../x"}, {"overrides": ["run_dir=/tmp/x"]},
                                {"overrides": ["run_dir=/kaggle/working"]}])
def test_run_folder_must_stay_inside_kaggle_working(kw, tmp_path):
    with pytest.raises(LabError, match="not inside /kaggle/working|leaves /kaggle/working/outputs"):
        kaggle.build_kernel("01_explore", kw.get("overrides", []), username="bob", out=tmp_path / "k",
                            run_name=kw.get("run_name"), model_source="")


def test_local_paths_in_overrides_are_refused_or_named(tmp_path, capsys):
    found = kaggle.local_paths(["model.path=/home/me/nano", "data.path=~/train.csv", "seed=3", "run_name=a/b",
                                "model.path=/kaggle/input/nano", "sft.lora.targets=[q_proj,k_proj]",
                                "data.path=./train.csv", "vote.adapter=${sft.adapter_dir}", "data.path=lab/recipes/"])
    assert found == ["model.path=/home/me/nano", "data.path=~/train.csv", "data.path=./train.csv",
                     "data.path=lab/recipes/"]
    with pytest.raises(LabError, match=r"model.path=/home/me/nano: a path on this machine"):
        kaggle.build_kernel("01_explore", ["model.path=/home/me/nano"], username="bob", out=tmp_path / "k",
                            model_source="")
    out = kaggle.build_kernel("01_explore", ["data.path=/home/me/train.csv"], username="bob", out=tmp_path / "k2",
                              model_source="", allow_local_paths=True)
    assert "data.path=/home/me/train.csv: a path on this machine" in capsys.readouterr().err
    assert (out / "01_explore.ipynb").is_file()


# ---- the output plan -----------------------------------------------------------------------------------------------

def test_planned_output_bytes_follow_the_config():
    cfg = compose(["run_dir=/kaggle/working/outputs/t"])
    P = output_plan.trainable_params(cfg)
    assert P > 0
    sft = output_plan.planned_output_bytes(cfg, "02_sft", P)
    w = sft["working"]
    assert w["02_sft/adapter (bf16)"] == 2 * P and w["02_sft/submission.zip (bf16)"] == 2 * P  # kaggle.adapter_dtype
    fp32 = output_plan.planned_output_bytes(compose(["run_dir=/kaggle/working/outputs/t", "kaggle.adapter_dtype=null"]),
                                            "02_sft", P)
    assert fp32["working"]["02_sft/adapter (fp32)"] == 4 * P
    ckpt = next(v for k, v in w.items() if k.startswith("checkpoints/02_sft"))
    assert ckpt == 12 * P  # fp32 adapter + AdamW's two fp32 moments
    (scratch,) = sft["scratch"].values()
    assert scratch == (cfg.sft.save_total_limit + 1) * 12 * P
    eight = output_plan.planned_output_bytes(compose(["run_dir=/kaggle/working/outputs/t", "gpu.optim=adamw_bnb_8bit"]),
                                             "02_sft", P)
    assert next(v for k, v in eight["working"].items() if k.startswith("checkpoints/")) == int(P * (6 + 8 / 256))
    assert output_plan.stage_reads(cfg, "01_explore") == []
    assert output_plan.stage_reads(cfg, "02_sft") == ["data"]
    assert output_plan.stage_reads(cfg, "03_grpo") == ["data", "02_sft"]
    # 04_vote votes with the latest finished training stage; lineage checks 03_grpo's own inputs (02_sft) too
    assert output_plan.stage_reads(cfg, "04_vote") == ["data", "02_sft", "03_grpo"]
    assert output_plan.stage_reads(compose(["vote.adapter=${sft.adapter_dir}"]), "04_vote") == ["data", "02_sft"]
    assert output_plan.stage_reads(cfg, "05_errors") == ["data", "02_sft", "03_grpo", "04_vote"]
    assert "04_vote" in "".join(output_plan.planned_output_bytes(cfg, "05_errors", P)["working"])


def test_a_plan_over_the_limit_is_refused(capsys):
    cfg = compose(["run_dir=/kaggle/working/outputs/t", "kaggle.output_limit_gb=0.001"])
    assert output_plan.check(cfg, "02_sft") is None  # not on Kaggle: nothing printed, nothing refused
    assert capsys.readouterr().out == ""
    with pytest.raises(LabError, match="over Kaggle's 0.00 GB.*adamw_bnb_8bit"):
        output_plan.check(cfg, "02_sft", force=True)
    assert "OVER THE LIMIT" in capsys.readouterr().out
    plan = output_plan.check(compose(["run_dir=/kaggle/working/outputs/t"]), "02_sft", force=True)
    assert sum(plan["working"].values()) <= plan["limit"] and "fits" in capsys.readouterr().out


@pytest.mark.slow  # the real model's meta model: seconds
def test_competition_plan_counts_the_recipes_888m_parameters():
    cfg = compose(["experiment=competition", "gpu=rtx_pro_6000", "run_dir=/kaggle/working/outputs/c"])
    P = output_plan.trainable_params(cfg)
    assert P == 888_154_112  # the recipe's LoRA (issue 44: "888 M trainable parameters")
    for stage in ("01_explore", "02_sft", "03_grpo", "04_vote", "05_errors"):  # each fits, 03_grpo with a bf16 adapter
        plan = output_plan.planned_output_bytes(cfg, stage, P)
        assert sum(plan["working"].values()) <= 20 * 10 ** 9, stage
    fp32 = output_plan.planned_output_bytes(compose(["experiment=competition", "gpu=rtx_pro_6000", "kaggle.adapter_dtype=null",
                                                     "run_dir=/kaggle/working/outputs/c"]), "03_grpo", P)
    assert sum(fp32["working"].values()) > 20 * 10 ** 9  # the negative control: fp32 adapters do not fit


def test_kaggle_plan_command(capsys):
    from lab.__main__ import main

    assert main(["kaggle", "plan", "--stages", "01_explore,02_sft", "sft.lora.r=4"]) == 0
    out = capsys.readouterr().out
    assert "02_sft: planned /kaggle/working" in out and "one checkpoint = P x (4 B fp32 adapter" in out


def test_the_saved_adapter_is_cast_on_kaggle_only(tmp_path, monkeypatch):
    import torch
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file

    from lab.model.lora import save_adapter

    net = torch.nn.Sequential(torch.nn.Linear(8, 8))
    pm = get_peft_model(net, LoraConfig(r=2, target_modules=["0"], init_lora_weights=False))
    from lab.core import paths

    cfg = compose([])
    monkeypatch.setattr(paths, "on_kaggle", lambda: False)
    assert paths.adapter_dtype(cfg) is None
    save_adapter(pm, tmp_path / "here", dtype=paths.adapter_dtype(cfg))
    monkeypatch.setattr(paths, "on_kaggle", lambda: True)
    assert paths.adapter_dtype(cfg) == "bfloat16"
    assert paths.adapter_dtype(compose(["kaggle.adapter_dtype=null"])) is None
    save_adapter(pm, tmp_path / "kaggle", dtype=paths.adapter_dtype(cfg))
    here, kag = (load_file(str(tmp_path / d / "adapter_model.safetensors")) for d in ("here", "kaggle"))
    assert here.keys() == kag.keys() and {v.dtype for v in here.values()} == {torch.float32}
    assert {v.dtype for v in kag.values()} == {torch.bfloat16}
    assert all(torch.equal(kag[k], here[k].to(torch.bfloat16)) for k in here)
    with pytest.raises(LabError, match="not a torch dtype"):
        save_adapter(pm, tmp_path / "bad", dtype="bfloat17")
    assert not (tmp_path / "bad").exists()  # nothing half-written left where a later stage would look


# ---- checkpoints to scratch, the budget, the kept state ------------------------------------------------------------

def test_checkpoints_go_to_scratch_on_kaggle_only(monkeypatch):
    monkeypatch.delenv("KAGGLE_KERNEL_RUN_TYPE", raising=False)
    assert checkpoint_root("/kaggle/working/outputs/r", "/kaggle/temp") == Path("/kaggle/working/outputs/r/checkpoints")
    monkeypatch.setenv("KAGGLE_KERNEL_RUN_TYPE", "Batch")
    assert checkpoint_root("/kaggle/working/outputs/r", "/kaggle/temp") == Path("/kaggle/temp/outputs/r/checkpoints")
    assert checkpoint_root("/kaggle/working/outputs/r", None) == Path("/kaggle/working/outputs/r/checkpoints")
    assert checkpoint_root("/elsewhere/r", "/kaggle/temp") == Path("/elsewhere/r/checkpoints")


def test_wall_clock_budget_defaults_to_the_kaggle_run_limit(monkeypatch, capsys):
    cfg = compose(["kaggle.run_limit_h=12", "kaggle.budget_margin_min=60"])
    monkeypatch.delenv("KAGGLE_KERNEL_RUN_TYPE", raising=False)
    assert checkpoints.wall_clock_budget(cfg, "sft") == 0  # not on Kaggle: the config's 0, no budget
    monkeypatch.setenv("KAGGLE_KERNEL_RUN_TYPE", "Batch")
    monkeypatch.setenv(checkpoints.KERNEL_START_ENV, str(time.time() - 120 * 60))  # the kernel ran 2 hours
    assert checkpoints.wall_clock_budget(cfg, "sft") == pytest.approx(12 * 60 - 60 - 120, abs=0.5)
    assert "kaggle.run_limit_h 12 h" in capsys.readouterr().out
    assert checkpoints.wall_clock_budget(compose(["sft.wall_clock_budget_min=30"]), "sft") == 30
    monkeypatch.setenv(checkpoints.KERNEL_START_ENV, str(time.time() - 11.5 * 3600))
    with pytest.raises(LabError, match="no time left"):
        checkpoints.wall_clock_budget(cfg, "grpo")


def _checkpoint(folder: Path, step: int, complete: bool = True) -> Path:
    c = folder / f"checkpoint-{step}"
    c.mkdir(parents=True)
    (c / "adapter_model.safetensors").write_bytes(b"a" * 100)
    (c / "optimizer.pt").write_bytes(b"o" * 200)
    if complete:
        checkpoints.mark_complete(c)
    return c


def test_a_budget_stop_keeps_the_newest_complete_checkpoint(tmp_path):
    scratch, keep = tmp_path / "temp" / "checkpoints" / "02_sft", tmp_path / "working" / "checkpoints" / "02_sft"
    checkpoints.write_record(scratch, {"fingerprint": {"sft": 1}})
    _checkpoint(scratch, 5)
    _checkpoint(scratch, 10)
    _checkpoint(scratch, 15, complete=False)
    keep.mkdir(parents=True)
    (keep / "checkpoint-1").mkdir()  # what an earlier stop kept: replaced
    note = checkpoints.keep_for_resume(scratch, keep, "02_sft", "sft")
    assert sorted(p.name for p in keep.iterdir()) == ["checkpoint-10", checkpoints.RUN_RECORD]
    assert checkpoints.incomplete(keep / "checkpoint-10") is None
    assert "step 10" in note and "--kernel-sources" in note and "sft.resume=true" in note
    assert "no complete checkpoint" in checkpoints.keep_for_resume(tmp_path / "none", keep, "02_sft", "sft")


# ---- the chain ------------------------------------------------------------------------------------------------------

def _filled(code: str) -> dict:
    block = code.split(kaggle.FILLED[0])[1].split(kaggle.FILLED[1])[0]
    ns: dict = {}
    exec(block.split("\n", 1)[1], {}, ns)
    return ns


def test_chain_wires_run_sources_and_adapter(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("KAGGLE_USERNAME", "alice")
    from lab.__main__ import main

    assert main(["kaggle", "build", "--chain", "01_explore,02_sft,04_vote", "--run-name", "c1", "--out",
                 str(tmp_path), "--", "data.n_train=8"]) == 0
    out = capsys.readouterr().out
    metas = [json.loads((tmp_path / n / "kernel-metadata.json").read_text()) for n in ("01_explore", "02_sft", "04_vote")]
    ids = [m["id"] for m in metas]
    assert ids == ["alice/nemotron-lab-c1-01-explore", "alice/nemotron-lab-c1-02-sft", "alice/nemotron-lab-c1-04-vote"]
    assert [m["kernel_sources"] for m in metas] == [[], [ids[0]], [ids[1]]]
    pushes = [line.split("# then")[0].strip() for line in out.splitlines() if "kaggle kernels push" in line]
    assert pushes == [f"{i}. kaggle kernels push -p {tmp_path / n} --accelerator NvidiaRtxPro6000"
                      for i, n in enumerate(("01_explore", "02_sft", "04_vote"), 1)]
    cell = {n: _filled(src(cells(tmp_path / n / f"{n}.ipynb")[0])) for n in ("01_explore", "02_sft", "04_vote")}
    assert {c["RUN_DIR"] for c in cell.values()} == {"/kaggle/working/outputs/c1"}
    assert cell["01_explore"]["COPY_BACK"] == [] and cell["02_sft"]["COPY_BACK"] == ["data"]
    assert cell["04_vote"]["COPY_BACK"] == ["data", "02_sft"]
    assert cell["02_sft"]["RESUME"] == "checkpoints/02_sft" and cell["04_vote"]["RESUME"] is None
    vote = src(next(c for c in cells(tmp_path / "04_vote" / "04_vote.ipynb")
                    if "injected-parameters" in c["metadata"].get("tags", [])))
    assert "vote.adapter=${sft.adapter_dir}" in vote and "data.n_train=8" in vote
    with pytest.raises(LabError, match="order"):
        kaggle.build_chain(["02_sft", "01_explore"], username="alice", out=tmp_path / "bad")


def test_install_cell_copies_back_only_what_the_stage_reads(tmp_path, monkeypatch):
    """The 04_vote kernel after a 02_sft kernel: data/ and 02_sft/ come back into the working folder, the earlier
    kernel's 01_explore report does not; a 02_sft kernel after a budget stop gets its checkpoint into scratch."""
    monkeypatch.setenv("LAB_ROOT", "unset")
    monkeypatch.delenv("LAB_KERNEL_START", raising=False)  # the cell sets it: restored (removed) afterwards
    root = tmp_path / "kaggle"
    deps = root / "input" / "lab-deps"
    deps.mkdir(parents=True)
    (deps / "nemotron_reasoning_lab-0.1.0-py3-none-any.whl").write_bytes(b"")
    kaggle._source_tarball(deps)
    prev = root / "input" / "nemotron-lab-c1-02-sft" / "outputs" / "c1"
    for rel in (".lab-run", "data/split.json", "01_explore/metrics.json", "02_sft/adapter/adapter_config.json",
                "checkpoints/02_sft/checkpoint-7/optimizer.pt"):
        (prev / rel).parent.mkdir(parents=True, exist_ok=True)
        (prev / rel).write_text("{}")
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: calls.append(cmd))
    for stage, copy, resume in (("04_vote", ["data", "02_sft"], None), ("02_sft", ["data"], "checkpoints/02_sft")):
        code = kaggle.install_cell_source("lab-deps", "/kaggle/working/outputs/c1", copy_back=copy, resume=resume,
                                          scratch_dir="/kaggle/temp")
        code = code.replace("/kaggle/", f"{root}/").replace(kaggle.LAB_ROOT_ON_KAGGLE, str(tmp_path / stage))
        work = root / "working"
        if work.exists():
            import shutil

            shutil.rmtree(work)
        exec(compile(code, "install_cell", "exec"), {})
        kept = sorted(str(p.relative_to(work)) for p in work.rglob("*") if p.is_file())
        if stage == "04_vote":
            assert kept == ["outputs/c1/.lab-run", "outputs/c1/02_sft/adapter/adapter_config.json",
                            "outputs/c1/data/split.json"]  # the run's marker too: the same run continues
        else:
            assert kept == ["outputs/c1/.lab-run", "outputs/c1/data/split.json"]
            assert (root / "temp" / "outputs" / "c1" / "checkpoints" / "02_sft" / "checkpoint-7" / "optimizer.pt").is_file()
    assert float(os.environ["LAB_KERNEL_START"]) <= time.time()


# ---- the wheel set --------------------------------------------------------------------------------------------------

def test_wheel_platforms_cover_every_manylinux_up_to_kaggles_glibc(tmp_path):
    """pip does not widen --platform manylinux_2_28 to older manylinux_2_x tags, so bitsandbytes 0.50.2 (a
    manylinux_2_24 wheel only) had no match with manylinux_2_28 + manylinux2014 (resolved against the package index
    for Python 3.12 on the development machine: "No matching distribution found for bitsandbytes==0.50.2")."""
    (tmp_path / "requirements.txt").write_text("bitsandbytes==0.50.2\n")
    download = kaggle.wheel_commands(tmp_path, "3.12")[1]
    plats = {a.split("=", 1)[1] for a in download if a.startswith("--platform=")}
    assert {f"manylinux_2_{m}_x86_64" for m in range(17, 36)} <= plats
    assert {"manylinux2014_x86_64", "manylinux_2_5_x86_64"} <= plats and "manylinux_2_36_x86_64" not in plats


def test_fetch_wheels_names_the_pin_without_a_wheel(tmp_path, monkeypatch, capsys):
    import types

    (tmp_path / "requirements.txt").write_text("bitsandbytes==0.50.2\n")
    (tmp_path / "a-1.0-py3-none-any.whl").write_bytes(b"x" * 2_000_000)
    answers = iter([types.SimpleNamespace(returncode=0, stdout="", stderr=""),
                    types.SimpleNamespace(returncode=1, stdout="", stderr="ERROR: No matching distribution found for "
                                                                          "bitsandbytes==0.50.2\n")])
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: next(answers))
    with pytest.raises(LabError, match=r"no binary wheel of bitsandbytes==0\.50\.2 for Python 3\.12"):
        kaggle.fetch_wheels(tmp_path, "3.12")
    answers = iter([types.SimpleNamespace(returncode=0, stdout="", stderr="")] * 2)
    kaggle.fetch_wheels(tmp_path, "3.12")
    assert "1 wheels, 0.00 GB in all:" in capsys.readouterr().out and "2.0 MB  a-1.0-py3-none-any.whl" in \
        kaggle.wheel_list(tmp_path)


def test_held_out_rows_count_csv_records_not_lines(tmp_path):
    """A prompt spans several lines inside one quoted field: 3 records in 9 lines give val_fraction x 3 rows."""
    path = tmp_path / "train.csv"
    path.write_text('id,prompt,answer\n' + "".join(f'{i},"line one\nline two\nline three",{i}\n' for i in range(3)))
    cfg = compose(["data.source=competition", f"data.path={path}", "data.n_val=null", "data.val_fraction=0.5"])
    rows, how = output_plan.val_rows(cfg)
    assert (rows, "of 3 (" in how) == (int(3 * 0.5) + 1, True), how
