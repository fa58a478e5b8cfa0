"""What a person sees while a stage runs: plain step lines outside a notebook, one line redrawn in place inside one
(its last state kept in the saved notebook), expected library warnings said once as a plain line, a LabError as one
line in a notebook and one message from the stage runner."""

import logging

import pytest

from lab.core import console


def _tiny_trainer(tmp_path, steps=4):
    from tiny_trainer import tiny_trainer  # tests/tiny_trainer.py, shared with tests/test_notebooks.py's kernel

    return tiny_trainer(tmp_path, steps)


def test_training_prints_plain_step_lines_with_loss_and_eta_not_a_bar(tmp_path, capsys, monkeypatch):
    from transformers.trainer_callback import ProgressCallback
    from transformers.utils.notebook import NotebookProgressCallback

    trainer = _tiny_trainer(tmp_path)
    names = [type(cb) for cb in trainer.callback_handler.callbacks]
    assert ProgressCallback not in names and NotebookProgressCallback not in names
    monkeypatch.setattr(console, "EVERY_S", 0.0)
    for cb in trainer.callback_handler.callbacks:
        if hasattr(cb, "every_s"):
            cb.every_s = 0.0  # a line per step, as a long run prints one every EVERY_S seconds
    trainer.train()
    out, err = capsys.readouterr()
    lines = [ln for ln in out.splitlines() if ln.startswith("train step")]
    assert [ln.split(" | ")[0] for ln in lines] == [f"train step {i}/4 ({i * 25}%)" for i in (1, 2, 3, 4)]
    assert "| loss " in lines[1] and "ETA 0:00:" in lines[1] and "elapsed" in lines[-1]
    assert "\r" not in out + err and "it/s]" not in err  # no redrawn bar


def test_known_warnings_become_one_plain_note_each(capsys):
    """A known library message becomes one short line on stdout (a plain line in a notebook, not a stderr box), said
    once; other messages of the same loggers pass as they are (to the loggers' own handlers: whether they propagate
    depends on what the libraries set up earlier in the process)."""
    console.quiet_known_warnings()
    console.quiet_known_warnings()  # twice: still one filter per logger
    kernels = logging.getLogger("transformers.integrations.hub_kernels")
    trl = logging.getLogger("trl.trainer.grpo_trainer")
    assert sum(isinstance(f, console._SayOnce) for f in kernels.filters) == 1
    for f in kernels.filters + trl.filters:  # a fresh process: nothing said yet
        f.said = False
    passed = []
    keep = logging.Handler()
    keep.emit = lambda record: passed.append(record.getMessage())
    levels = [(lg, lg.level, lg.disabled) for lg in (kernels, trl)]  # a logging config run earlier may disable them
    for lg, _, _ in levels:
        lg.addHandler(keep)
        lg.setLevel(logging.WARNING)
        lg.disabled = False
    try:
        for fn in ("causal_conv1d_fn", "mamba_chunk_scan_combined", "selective_state_update"):
            kernels.warning(f"`{fn}` is falling back to its reference PyTorch implementation because ...")
        for _ in range(5):
            trl.warning("All reward functions returned None for the following kwargs:\n{'prompt': '...'}")
        trl.warning("something else")
    finally:
        for lg, level, disabled in levels:
            lg.removeHandler(keep)
            lg.setLevel(level)
            lg.disabled = disabled
    assert passed == ["something else"]
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and out[0].startswith("note: Mamba-2 runs on") and "mask_truncated" in out[1]
    assert all(len(line) <= 160 for line in out)


def test_progress_lines_count_every_batch_and_end_once(capsys):
    p = console.Progress("generate", 5, "puzzles", every_s=0.0)
    for _ in range(5):
        p.update(1)
    p.set(5, **{"tok/s": "12"})
    p.close()
    out = capsys.readouterr().out.splitlines()
    assert [ln.split(" | ")[0] for ln in out] == [f"generate {i}/5 puzzles ({i * 20}%)" for i in range(1, 6)]


@pytest.mark.slow
def test_a_labs_error_inside_a_stage_is_one_message(tmp_path):
    """02_sft of the real model on this CPU machine: the preflight refuses in the notebook's first cell, and the
    runner says so in one LabError naming the executed notebook, not with papermill's traceback."""
    import torch

    from lab import LabError
    from lab.runs.pipeline import execute_stage

    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    with pytest.raises(LabError) as e:
        execute_stage("02_sft", tmp_path, ["model=nemotron_nano", f"run_dir={tmp_path}"], log_output=False)
    msg = str(e.value)
    assert msg.startswith("stage 02_sft stopped: 02_sft with model=nemotron_nano cannot run on this machine")
    assert "no CUDA device" in msg and str(tmp_path / "notebooks" / "02_sft.ipynb") in msg
    assert "Traceback" not in msg and "----" not in msg


KERNEL_CELLS = ("""
import time
from lab.core.console import Progress
p = Progress("generate", 30, "puzzles")
for i in range(30):
    p.update(1)
    time.sleep(0.05)
p.close()
""", """
from lab import LabError
raise LabError("a refusal in one sentence")
""")


@pytest.mark.slow  # a Jupyter kernel
def test_in_a_kernel_progress_is_one_line_that_ends_at_its_last_count_and_a_lab_error_one_line(tmp_path, monkeypatch):
    """A papermill kernel: the counter is one display output whose saved state is its last count (not a frozen first
    frame, not thirty lines); with LAB_PROGRESS_ECHO its plain lines go to the kernel's own stderr, not into the
    notebook; a LabError's error output is its message alone."""
    import nbformat
    import papermill as pm
    from nbformat.v4 import new_code_cell, new_notebook

    from lab.core.paths import project_root

    monkeypatch.setenv("PYTHONPATH", str(project_root()))
    monkeypatch.setenv(console.ECHO_ENV, "1")
    nbformat.write(new_notebook(cells=[new_code_cell(c) for c in KERNEL_CELLS]), tmp_path / "t.ipynb")
    with pytest.raises(pm.PapermillExecutionError) as e:
        pm.execute_notebook(str(tmp_path / "t.ipynb"), str(tmp_path / "out.ipynb"), kernel_name="python3",
                            progress_bar=False, cwd=str(project_root()))
    assert e.value.ename == "LabError"
    cells = nbformat.read(tmp_path / "out.ipynb", as_version=4).cells
    counter, error = [c.outputs for c in cells if c.cell_type == "code"]
    assert len(counter) == 1 and counter[0].output_type == "display_data"
    assert counter[0].data["text/plain"].startswith("generate 30/30 puzzles (100%)")
    assert [o.output_type for o in error] == ["error"] and error[0].traceback == ["LabError: a refusal in one sentence"]
