"""Every error a sentence (case 14 and the low items of the fail-closed probe): one line naming the file and what to
do, the traceback only with --debug or LAB_DEBUG=1."""

from __future__ import annotations

import errno
import json

import pandas as pd
import pytest

from lab import LabError
from lab.__main__ import COMMANDS, main
from lab.core.io import atomic_write_json


@pytest.fixture()
def failing(monkeypatch):
    """Register a command `boom` that raises what the test sets (a stand-in for a command the probe broke)."""
    import sys
    import types

    box = {}

    def run(argv):
        raise box["error"]

    mod = types.ModuleType("lab_test_boom")
    mod.run = run
    monkeypatch.setitem(sys.modules, "lab_test_boom", mod)
    monkeypatch.setitem(COMMANDS, "boom", ("lab_test_boom", "run", "a stand-in that fails"))
    monkeypatch.delenv("LAB_DEBUG", raising=False)
    return box


@pytest.mark.parametrize("error,words", [
    (PermissionError(errno.EACCES, "Permission denied", "/r/outputs/x/.lock"), "/r/outputs/x/.lock: permission denied"),
    (OSError(errno.ENAMETOOLONG, "File name too long", "/r/outputs/xxx"), "too long for the file system"),
    (IsADirectoryError(errno.EISDIR, "Is a directory", "/r/d"), "/r/d: is a folder"),
    (ModuleNotFoundError("No module named 'vllm'", name="vllm"), "'vllm' is not installed"),
    (KeyboardInterrupt(), "interrupted (Ctrl-C)"),
])
def test_an_error_is_one_line_and_the_traceback_waits_for_debug(failing, capsys, monkeypatch, error, words):
    monkeypatch.setenv("LAB_DEBUG", "0")  # recorded first, so `--debug` setting it below does not outlive the test
    failing["error"] = error
    rc = main(["boom"])
    err = capsys.readouterr().err
    assert rc == (130 if isinstance(error, KeyboardInterrupt) else 2)
    assert words in err and "Traceback" not in err and "--debug or LAB_DEBUG=1" in err and len(err.splitlines()) == 2
    with pytest.raises(type(error)):
        main(["boom", "--debug"])
    monkeypatch.setenv("LAB_DEBUG", "1")
    with pytest.raises(type(error)):
        main(["boom"])


def test_a_dead_kernel_names_the_notebook_and_hints_at_memory(tmp_path, monkeypatch):
    """Case 14: a stage kernel killed by the out-of-memory killer surfaced as a raw nbclient DeadKernelError."""
    import papermill as pm
    from nbclient.exceptions import DeadKernelError

    from lab.runs.pipeline import execute_stage

    def killed(*a, **kw):
        raise DeadKernelError("Kernel died")

    monkeypatch.setattr(pm, "execute_notebook", killed)
    monkeypatch.delenv("LAB_DEBUG", raising=False)
    with pytest.raises(LabError, match=r"stage 02_sft: the kernel running .*notebooks/02_sft\.ipynb died .*lack of "
                                       r"memory.*log: .*02_sft\.log"):
        execute_stage("02_sft", tmp_path, [], log_file=tmp_path / "logs" / "02_sft.log")


def test_a_split_json_that_is_not_an_object_is_a_sentence(tmp_path):
    """Low item: split.json = [] raised AttributeError in 01_explore."""
    from lab.core.config import compose
    from lab.data.dataset import prepare

    cfg = compose([f"run_dir={tmp_path}", "data.n_train=2", "data.n_val=1"])
    prepare(cfg)
    (tmp_path / "data" / "split.json").write_text("[]")
    with pytest.raises(LabError, match=r"split.json: holds \[\], not an object"):
        prepare(cfg)


def test_metrics_json_null_is_not_a_traceback_in_summary_or_report(tmp_path, capsys):
    """Low item: metrics.json = null raised TypeError in summary and report."""
    from finished import mark_finished  # tests/finished.py
    from lab.runs.pipeline import summary
    from lab.runs.sweep_report import collect

    atomic_write_json(tmp_path / "seed=1" / "02_sft" / "metrics.json", {"accuracy_after": 0.5})
    mark_finished(tmp_path / "seed=1" / "02_sft")
    atomic_write_json(tmp_path / "seed=1" / "job.json", {"job": "seed=1", "params": {}, "stages": ["02_sft"]})
    (tmp_path / "seed=1" / "02_sft" / "metrics.json").write_text("null")
    assert "02_sft" in summary(tmp_path / "seed=1")["not_current"]
    df, _ = collect(tmp_path)
    assert df.loc[0, "status"] == "unreadable" and "holds null, not an object" in df.loc[0, "error"]


def test_a_truncated_safetensors_file_is_named(tmp_path):
    """Low item: a truncated external vote.adapter or base model raised SafetensorError without a file name."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    from lab.model.models import check_weights

    save_file({"w": torch.ones(64)}, str(tmp_path / "adapter_model.safetensors"))
    check_weights(tmp_path, "adapter")  # the control: whole, it reads
    data = (tmp_path / "adapter_model.safetensors").read_bytes()
    (tmp_path / "adapter_model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(LabError, match=r"adapter_model\.safetensors: the adapter's weights cannot be read .*truncated"):
        check_weights(tmp_path, "adapter")


def test_pack_refuses_a_dtype_torch_does_not_have(tmp_path, capsys):
    """Low item: `pack --dtype bf16` raised AttributeError."""
    (tmp_path / "adapter").mkdir()
    assert main(["pack", str(tmp_path / "adapter"), str(tmp_path / "s.zip"), "--dtype", "bf16"]) == 2
    assert "--dtype bf16: not a torch floating-point dtype; use bfloat16, float16, float32 or keep" in \
        capsys.readouterr().err


def test_score_refuses_an_empty_gold_answer_and_a_details_folder(tmp_path, capsys):
    """Low items: an empty gold answer was scored correct against an empty prediction; `score --details DIR` raised
    IsADirectoryError."""
    pd.DataFrame({"id": ["a", "b"], "answer": ["1", ""]}).to_csv(tmp_path / "gold.csv", index=False)
    pd.DataFrame({"id": ["a", "b"], "answer": ["1", ""]}).to_csv(tmp_path / "pred.csv", index=False)
    assert main(["score", str(tmp_path / "pred.csv"), "--gold", str(tmp_path / "gold.csv")]) == 2
    assert "1 row(s) with an empty gold answer (ids b)" in capsys.readouterr().err
    pd.DataFrame({"id": ["a"], "answer": ["1"]}).to_csv(tmp_path / "g1.csv", index=False)
    (tmp_path / "d").mkdir()
    assert main(["score", str(tmp_path / "g1.csv"), "--gold", str(tmp_path / "g1.csv"), "--details",
                 str(tmp_path / "d")]) == 2
    assert "is a folder; name the CSV file to write" in capsys.readouterr().err


def test_a_files_own_category_column_is_kept(capsys):
    """Low item: a CSV's own `category` column was silently replaced (the docs say extra columns are kept)."""
    from lab.data.dataset import add_categories
    from lab.puzzles.generate import generate

    df = generate("gravity", 2, 0)[["id", "prompt", "answer"]].assign(category=["mine", "gravity"])
    out = add_categories(df)
    assert list(out["category"]) == ["gravity", "gravity"] and list(out["category_in_file"]) == ["mine", "gravity"]
    assert "differs from the lab's classification in 1 row(s)" in capsys.readouterr().out


def test_a_run_dir_message_names_the_run_name_typed(tmp_path, monkeypatch):
    """Low item: the refusal named a `run_dir=` override the user never typed (only run_name=)."""
    from lab.core import config

    data = config.project_root() / "outputs" / "i52b_probe_run" / "train.csv"
    from lab.core import owner

    monkeypatch.setattr(owner, "find_data_file", lambda p: data)
    cfg = config.compose(["run_name=i52b_probe_run"])
    cfg.data.source = "competition"
    cfg.data.path = str(data)
    found = owner.run_dir_problems(cfg)
    assert found and found[0].startswith("run_name='i52b_probe_run' (run_dir 'outputs/i52b_probe_run')")
