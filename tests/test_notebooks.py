"""The five notebooks: stored clean with a `parameters` cell, calling their recipe's steps in its order, and executed
end to end by papermill on the smoke budget."""

import json
import re

import nbformat
import pytest

from lab.core.paths import project_root
from lab.runs.pipeline import SMOKE_OVERRIDES, STAGES, run_notebooks, summary

NOTEBOOKS = [project_root() / "notebooks" / f"{s}.ipynb" for s in STAGES]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=STAGES)
def test_notebook_is_clean_and_parameterised(path):
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert not any(c.get("outputs") or c.get("execution_count") for c in code), "stored with outputs"
    params = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1 and "overrides: list[str] = []" in params[0].source
    assert nb.cells[0].cell_type == "markdown" and "What this notebook does" in nb.cells[0].source
    assert any(f'common.open_stage("{path.stem}", overrides' in c.source for c in code)


@pytest.mark.slow
def test_all_notebooks_run_on_the_smoke_budget(smoke_run):
    run_dir = smoke_run  # the shared run of the five notebooks (tests/conftest.py)
    s = summary(run_dir)
    for stage in STAGES:
        assert "missing" not in s["stages"][stage], stage
        assert (run_dir / "notebooks" / f"{stage}.ipynb").is_file()
        assert json.loads((run_dir / stage / "manifest.json").read_text())["status"] == "finished"
    st = s["stages"]
    assert {"accuracy_before", "accuracy_after", "wall_seconds"} <= set(st["02_sft"])
    assert {"reward_per_step", "accuracy_after", "accuracy_sft_start"} <= set(st["03_grpo"])
    assert {"greedy_accuracy", "maj_at_k"} <= set(st["04_vote"])
    assert {"accuracy_by_category", "taxonomy"} <= set(st["05_errors"])
    m3, m5 = (json.loads((run_dir / stage / "metrics.json").read_text()) for stage in ("03_grpo", "05_errors"))
    # fixed - broken is the net change from the SFT start, counted once (not once per category and again in "all")
    net = m5["fixed_since_sft"] - m5["broken_since_sft"]
    assert net == round(m5["n"] * (m5["accuracy"] - m3["accuracy_sft_start"]))
    assert (run_dir / "summary.md").is_file() and (run_dir / "02_sft" / "adapter" / "adapter_config.json").is_file()
    # 04_vote's greedy pass of the GRPO adapter is 03_grpo's evaluation of it, reused (lab.eval.greedy.evaluate)
    greedy = (run_dir / "04_vote" / "predictions.csv").read_bytes()
    assert greedy == (run_dir / "03_grpo" / "predictions.csv").read_bytes()
    said = [o.get("text", "") for c in nbformat.read(run_dir / "notebooks" / "04_vote.ipynb", as_version=4).cells
            for o in c.get("outputs", [])]
    assert any("reused, not generated" in t for t in said)
    assert len(list((run_dir / "evaluations").glob("*.csv"))) == 3  # the base model, the SFT and the GRPO adapter


@pytest.mark.slow
def test_same_seed_gives_identical_metrics(smoke_run, tmp_path):
    """Two runs with the same seed agree on every metric (timings aside) on CPU: the shared smoke run of all five
    notebooks, and 02_sft and 03_grpo run again on their own."""

    def metrics(run_dir):
        out = {}
        for stage in ["02_sft", "03_grpo"]:
            m = json.loads((run_dir / stage / "metrics.json").read_text())
            out[stage] = {k: v for k, v in m.items() if "seconds" not in k and k not in ("resumed_from",)}
        return out

    b = run_notebooks(SMOKE_OVERRIDES + [f"run_dir={tmp_path}/b"], stages=["02_sft", "03_grpo"], log_output=False)
    assert metrics(smoke_run) == metrics(b)


def test_the_smoke_preset_yields_to_the_users_keys_and_joins_another_experiment():
    """`experiment=smoke` (conf/experiment/smoke.yaml): a key the user gives wins; `with_smoke` (sweep --smoke) joins
    an experiment the user chose instead of replacing it."""
    from lab.core.config import compose
    from lab.runs.pipeline import with_smoke

    assert SMOKE_OVERRIDES == ["experiment=smoke"]
    cfg = compose(with_smoke(["sft.max_steps=5", "run_name=x"]))
    assert cfg.sft.max_steps == 5 and cfg.data.n_train == 16 and cfg.vote.k == 2 and cfg.model.name == "tiny"
    cfg = compose(with_smoke(["experiment=competition", "data.n_val=8"]))
    assert (cfg.model.name, cfg.data.source, cfg.data.trace_style) == ("nemotron_nano", "competition", "derivation")
    assert cfg.sft.max_steps == 2 and cfg.grpo.max_steps == 1 and cfg.data.n_val == 8


@pytest.mark.slow  # a real-model config composed and checked end to end: seconds (the fast lane stays short)
def test_a_notebooks_first_call_checks_the_machine_before_it_opens_the_stage(tmp_path):
    """`lab.recipes.common.open_stage`: the real model on a machine without CUDA is refused before any folder is
    made."""
    import torch

    from lab import LabError
    from lab.recipes.common import open_stage

    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    with pytest.raises(LabError, match="02_sft with model=nemotron_nano cannot run on this machine"):
        open_stage("02_sft", ["model=nemotron_nano", f"run_dir={tmp_path / 'run'}"])
    assert not (tmp_path / "run").exists()


SMALL_DATA = ["data.n_train=16", "data.n_val=4", "data.explore_max=16"]


def _readme_papermill_call() -> list[str]:
    """The headless papermill call README.md documents, split as a shell would."""
    import shlex

    lines = [ln.strip() for ln in (project_root() / "README.md").read_text(encoding="utf-8").splitlines()
             if ln.strip().startswith("papermill ")]
    assert lines, "README.md documents no `papermill ...` call"
    return shlex.split(lines[0].split("  #")[0])


@pytest.mark.slow
def test_the_readme_papermill_call_runs(tmp_path):
    """README's `papermill NB OUT -p overrides '[...]'` through papermill's own command line: the notebook receives
    the JSON string and reads it as the list (only the data size and the run folder are added here)."""
    import subprocess
    import sys

    args = _readme_papermill_call()
    assert args[:2] == ["papermill", "notebooks/01_explore.ipynb"] and args[3:5] == ["-p", "overrides"]
    overrides = json.loads(args[5])
    assert overrides == ["seed=7", "run_name=seed7"]
    args[5] = json.dumps([*overrides, *SMALL_DATA, f"run_dir={tmp_path / 'run'}"])
    out = subprocess.run([sys.executable, "-m", "papermill", args[1], str(tmp_path / "out.ipynb"), *args[3:],
                          "-k", "python3"], cwd=project_root(), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    m = json.loads((tmp_path / "run" / "01_explore" / "manifest.json").read_text())
    assert m["status"] == "finished" and m["seed"] == 7 and m["overrides"][:2] == overrides


@pytest.mark.slow
def test_two_interactive_runs_with_defaults_get_two_folders_and_leave_the_demo_alone(tmp_path, monkeypatch):
    """01_explore executed twice with its parameters cell as stored (no run_name), against a copy of conf/ whose
    data defaults are small: two time-stamped run folders, and outputs/demo (the demo's) untouched."""
    import shutil
    import time

    import papermill as pm

    notebook = project_root() / "notebooks" / "01_explore.ipynb"
    root = tmp_path / "lab"
    shutil.copytree(project_root() / "conf", root / "conf")
    syn = root / "conf" / "data" / "synthetic.yaml"
    text = syn.read_text()
    for key, small in (("n_train", 16), ("n_val", 4), ("explore_max", 16)):
        text = text.replace(f"\n{key}: ", f"\n{key}: {small}  # ", 1)
    syn.write_text(text)
    demo = root / "outputs" / "demo"
    demo.mkdir(parents=True)
    (demo / "summary.md").write_text("the demo's own summary")
    monkeypatch.setenv("LAB_ROOT", str(root))
    for i in range(2):
        pm.execute_notebook(str(notebook), str(tmp_path / f"run{i}.ipynb"),
                            cwd=str(root), kernel_name="python3", progress_bar=False)
        time.sleep(1.1)  # the folder name has whole seconds
    runs = sorted(p.name for p in (root / "outputs").iterdir() if p.name != "demo")
    assert len(runs) == 2, runs
    for r in runs:
        assert json.loads((root / "outputs" / r / "01_explore" / "metrics.json").read_text())["n_train"] == 16
    assert sorted(p.name for p in demo.iterdir()) == ["summary.md"] and (demo / "summary.md").read_text() == \
        "the demo's own summary"


# ---- the notebooks' cells are their recipe's steps --------------------------------------------------------------

RECIPES = dict(zip(STAGES, ("explore", "sft", "grpo", "vote", "errors")))  # notebook -> lab.recipes module
UNPACKED = {"common.split": 2, "explore.explore_split": 3, "common.gradient_check": 2, "vote.vote_adapter": 2}


def _recipe_run(notebook: str, monkeypatch) -> list[str]:
    """The steps (`module.function`) the stage function `lab.recipes.<recipe>.<recipe>` calls, in order, run with
    every public function of its module and of `lab.recipes.common` replaced by a recorder, on the smoke config
    (so a loop over `vote.methods` runs); a step called several times in a row counts once."""
    import inspect
    from unittest import mock

    import importlib

    from lab.core.config import compose
    from lab.recipes import common

    name = RECIPES[notebook]
    recipe = importlib.import_module(f"lab.recipes.{name}")
    ran: list[str] = []

    def recorder(step):
        def call(*args, **kwargs):
            if not ran or ran[-1] != step:
                ran.append(step)
            n = UNPACKED.get(step)
            return mock.MagicMock(name=step) if n is None else tuple(mock.MagicMock(name=f"{step}[{i}]")
                                                                     for i in range(n))
        return call

    for module in (common, recipe):
        short = module.__name__.rsplit(".", 1)[1]
        for fn_name, fn in vars(module).items():
            if inspect.isfunction(fn) and fn.__module__ == module.__name__ and not fn_name.startswith("_") \
                    and fn_name != name:
                monkeypatch.setattr(module, fn_name, recorder(f"{short}.{fn_name}"))
    stage = mock.MagicMock(name="stage")
    stage.cfg = compose(SMOKE_OVERRIDES)
    getattr(recipe, name)(stage)
    return ran


def _cell_calls(path) -> list[str]:
    """The recipe steps the notebook's code cells call (`module.function`), in the order they stand: names bound by
    `from lab import recipes` (`recipes.vote.replay`) and `from lab.recipes import common, vote as recipe`
    (`recipe.replay`) are resolved to their module."""
    import ast

    nb = nbformat.read(path, as_version=4)
    cells = [ast.parse(c.source) for c in nb.cells
             if c.cell_type == "code" and "parameters" not in c.metadata.get("tags", [])]
    bound = {}  # local name -> dotted module path
    for tree in cells:
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom) and n.module:
                bound.update({a.asname or a.name: f"{n.module}.{a.name}" for a in n.names})
    out = []
    for tree in cells:
        found = []
        for n in ast.walk(tree):
            if not isinstance(n, ast.Call) or not isinstance(n.func, ast.Attribute):
                continue
            parts, node = [], n.func
            while isinstance(node, ast.Attribute):
                parts.insert(0, node.attr)
                node = node.value
            if isinstance(node, ast.Name) and node.id in bound:
                dotted = f"{bound[node.id]}.{'.'.join(parts)}"
                if dotted.startswith("lab.recipes."):
                    found.append((n.lineno, n.col_offset, ".".join(dotted.split(".")[-2:])))
        out += [name for *_, name in sorted(found)]
    return out


def _follows(notebook: str, path, monkeypatch) -> tuple[list[str], list[str]]:
    """(the stage function's steps, the notebook's calls of those steps): equal when the notebook runs them all, in
    the recipe's order."""
    ran = _recipe_run(notebook, monkeypatch)
    calls = _cell_calls(path)
    return ran, [c for i, c in enumerate(calls) if c in set(ran) and (i == 0 or calls[i - 1] != c)]


@pytest.mark.parametrize("notebook", STAGES)
def test_each_notebook_runs_the_steps_its_recipe_runs_in_the_same_order(notebook, monkeypatch):
    """`lab.recipes.<recipe>.<recipe>` (what scripts/train_*.py and a headless caller run) is its steps in order, and
    the notebook's cells call those same steps in that same order: the two write the same files and metrics."""
    ran, in_notebook = _follows(notebook, project_root() / "notebooks" / f"{notebook}.ipynb", monkeypatch)
    assert len(ran) >= 4, ran  # a stage of steps, not one call
    assert in_notebook == ran


@pytest.mark.parametrize("change", ["skip", "swap"])
def test_a_notebook_that_skips_or_reorders_a_step_fails_the_check(change, tmp_path, monkeypatch):
    """The negative control: 04_vote with its sampling call dropped, or its curves and replay cells swapped, no
    longer follows its recipe."""
    nb = nbformat.read(project_root() / "notebooks" / "04_vote.ipynb", as_version=4)
    if change == "skip":
        cell = next(c for c in nb.cells if "recipe.sample(" in c.source)
        cell.source = "\n".join(line for line in cell.source.splitlines() if "recipe.sample(" not in line)
    else:
        i, j = (next(k for k, c in enumerate(nb.cells) if s in c.source)
                for s in ("recipe.pass_maj_curves(", "recipe.replay("))
        nb.cells[i], nb.cells[j] = nb.cells[j], nb.cells[i]
    nbformat.write(nb, tmp_path / "04_vote.ipynb")
    ran, in_notebook = _follows("04_vote", tmp_path / "04_vote.ipynb", monkeypatch)
    assert in_notebook != ran and sorted(set(in_notebook)) == sorted(set(ran) - ({"vote.sample"} if change == "skip"
                                                                                   else set()))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=STAGES)
def test_notebooks_reach_the_lab_through_recipes_and_draw_figures_from_their_objects(path):
    """A notebook imports `lab.recipes` alone, and draws figures from the figure objects the steps return
    (`common.show`), not by reading the PNGs back."""
    import ast

    code = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")
    tree = ast.parse(code)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "lab":
            assert node.module == "lab.recipes", ast.unparse(node)  # lab.recipes imports none of its modules
        if isinstance(node, ast.Import):
            assert not any(a.name.split(".")[0] == "lab" for a in node.names), ast.unparse(node)
    assert not [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and str(n.value).endswith(".png")]
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == "Image"]
    assert "common.show" in _cell_calls(path)


# ---- progress: the Trainer's live table in Jupyter, plain lines under papermill ----------------------------------

@pytest.mark.parametrize("kernel, session, setting, live", [
    (True, "notebooks/02_sft.ipynb", None, True),   # a notebook open in Jupyter: its server set JPY_SESSION_NAME
    (True, None, None, False),                       # papermill's kernel: no Jupyter server
    (False, "x.ipynb", None, False),                 # not a kernel (a script started from a Jupyter terminal)
    (True, "notebooks/02_sft.ipynb", "plain", False),  # LAB_PROGRESS decides when set
    (True, None, "live", True),
])
def test_live_progress_is_for_a_notebook_open_in_jupyter(monkeypatch, kernel, session, setting, live):
    from lab.core import console

    monkeypatch.setattr(console, "in_kernel", lambda: kernel)
    for var, value in (("JPY_SESSION_NAME", session), ("LAB_PROGRESS", setting)):
        if value is None:
            monkeypatch.delenv(var, raising=False)
        else:
            monkeypatch.setenv(var, value)
    assert console.live_progress() is live


@pytest.mark.parametrize("live", [True, False])
def test_the_trainer_keeps_its_own_progress_only_where_it_is_live(tmp_path, monkeypatch, live):
    """Live: the Trainer's DEFAULT_PROGRESS_CALLBACK (NotebookProgressCallback inside a notebook) stays and the plain
    lines are off; otherwise it is taken off and TrainProgress prints (lab.train.callbacks)."""
    import torch
    from transformers import Trainer, TrainingArguments
    from transformers.trainer import DEFAULT_PROGRESS_CALLBACK

    from lab.train import callbacks

    monkeypatch.setattr(callbacks, "live_progress", lambda: live)
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=1, report_to="none", use_cpu=True,
                             save_strategy="no", disable_tqdm=False)
    trainer = Trainer(model=torch.nn.Linear(1, 1), args=args, callbacks=callbacks.trainer_callbacks(None, 0))
    callbacks.use_text_progress(trainer)
    kinds = {type(cb) for cb in trainer.callback_handler.callbacks}
    assert (DEFAULT_PROGRESS_CALLBACK in kinds) is live and (callbacks.TrainProgress in kinds) is not live
    assert callbacks.LabCallback in kinds


@pytest.mark.slow
def test_under_papermill_figures_are_inline_and_progress_is_one_final_line(smoke_run):
    """The executed notebooks of the shared smoke run: each figure drawn inline as a PNG output (from the figure
    object), the training steps as one display line saved at its last count (not a line per step, not a frozen first
    frame), no HTML progress table, no library bar ("0%|") and the Mamba note not on stderr."""
    expected = {"01_explore": 1, "02_sft": 2, "03_grpo": 2, "04_vote": 2, "05_errors": 3}
    for stage, n in expected.items():
        outputs = [o for c in nbformat.read(smoke_run / "notebooks" / f"{stage}.ipynb", as_version=4).cells
                   for o in c.get("outputs", [])]
        assert sum("image/png" in o.get("data", {}) for o in outputs) == n, stage
        assert not any("text/html" in o.get("data", {}) and "progress" in str(o["data"]["text/html"])
                       for o in outputs), stage
        text = "".join(o.get("text", "") for o in outputs)
        shown = [o["data"]["text/plain"] for o in outputs if o.output_type == "display_data"
                 and " step " in o.get("data", {}).get("text/plain", "")]
        assert not re.search(r"^(SFT|GRPO) step ", text, re.M) and "0%|" not in text, stage
        assert not [o for o in outputs if o.get("name") == "stderr" and ("%|" in o.text or "Mamba" in o.text)], stage
        if stage == "02_sft":
            assert len(shown) == 1 and shown[0].startswith("SFT step 2/2")
        if stage == "03_grpo":
            assert len(shown) == 1 and shown[0].startswith("GRPO step 1/1")


@pytest.mark.slow
def test_the_stage_functions_write_what_the_notebooks_write(smoke_run, tmp_path):
    """`recipes.sft.sft` and `recipes.grpo.grpo` called in one process (as scripts/train_sft.py and train_grpo.py
    call them) write the same metrics (timings and paths aside), predictions, LoRA table and submission.zip members
    (the config's base-model path aside) as the notebooks' cells did in the shared smoke run; so do
    `recipes.vote.vote` and `recipes.errors.errors` (samples, curves, methods, taxonomy, failures)."""
    from lab.recipes import common, errors, grpo, sft, vote

    def same(run_dir, stage):
        m = json.loads((run_dir / stage / "metrics.json").read_text())
        return {k: v for k, v in m.items() if "seconds" not in k and k not in ("resumed_from", "adapter")}

    def packed(run_dir, stage):
        """The zip's members; the config without base_model_name_or_path, which names the run folder's tiny model
        (made relative to the project root by `pack`, absolute here: both runs live outside it)."""
        import zipfile

        with zipfile.ZipFile(run_dir / stage / "submission.zip") as z:
            members = {n: z.read(n) for n in z.namelist()}
        config = json.loads(members.pop("adapter_config.json"))
        assert config.pop("base_model_name_or_path").endswith("base_model")
        return members, config

    run = tmp_path / "run"
    for stage, fn in (("02_sft", sft.sft), ("03_grpo", grpo.grpo)):
        fn(common.open_stage(stage, SMOKE_OVERRIDES + [f"run_dir={run}"]))
        assert same(run, stage) == same(smoke_run, stage), stage
        assert (run / stage / "predictions.csv").read_bytes() == (smoke_run / stage / "predictions.csv").read_bytes()
        assert packed(run, stage) == packed(smoke_run, stage), stage
    for name in ("02_sft/train_log.csv", "02_sft/predictions_before.csv", "02_sft/lora_targets.csv"):
        assert (run / name).read_bytes() == (smoke_run / name).read_bytes(), name  # (GRPO's log has step times)
    for stage, fn in (("04_vote", vote.vote), ("05_errors", errors.errors)):
        fn(common.open_stage(stage, SMOKE_OVERRIDES + [f"run_dir={run}"]))
        assert same(run, stage) == same(smoke_run, stage), stage
    for name in ("04_vote/samples.csv", "04_vote/curves.csv", "04_vote/methods.csv", "05_errors/taxonomy.csv",
                 "05_errors/failures.csv", "05_errors/errors_metrics.json"):
        assert (run / name).read_bytes() == (smoke_run / name).read_bytes(), name


def test_a_trained_model_holder_is_empty_and_training_it_again_is_refused():
    """The training steps empty the notebook's `lora` (the saved adapter is scored, not a model a notebook variable
    keeps in memory); running the training cell again without a fresh model is a clear error, not a crash."""
    import pandas as pd

    from lab import LabError
    from lab.model.lora import Trainee

    holder = Trainee(object(), object(), pd.DataFrame({"family": ["q_proj"], "modules": [2]}))
    model, tok = holder.take("sft_train")
    assert model is not None and holder.model is None and holder.tokenizer is None
    with pytest.raises(LabError, match="already trained.*sft_model"):
        holder.take("sft_train")
    assert "released" in repr(holder) and "q_proj" in repr(holder)


TRAIN_CELL = '''
from tests.tiny_trainer import tiny_trainer  # the kernel runs in the project root

tiny_trainer(OUT).train()
'''


@pytest.mark.slow  # two Jupyter kernels
@pytest.mark.parametrize("session", [None, "notebooks/02_sft.ipynb"], ids=["papermill", "jupyter"])
def test_a_kernel_a_jupyter_server_started_shows_the_live_table_papermills_prints_lines(tmp_path, monkeypatch,
                                                                                       session):
    """A real kernel trains a few steps with the lab's callbacks: started as papermill starts it, the steps come as
    one line (saved at its last count) and no HTML table; with the variable a Jupyter server gives its kernels
    (JPY_SESSION_NAME), the Trainer's own NotebookProgressCallback draws its HTML table (a <progress> bar) and the
    lab's line is left out."""
    import papermill as pm
    from nbformat.v4 import new_code_cell, new_notebook

    monkeypatch.delenv("LAB_PROGRESS", raising=False)
    if session is None:
        monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    else:
        monkeypatch.setenv("JPY_SESSION_NAME", session)
    monkeypatch.setenv("PYTHONPATH", str(project_root()))
    nb = new_notebook(cells=[new_code_cell(f"OUT = {str(tmp_path / 'out')!r}\n" + TRAIN_CELL)])
    nbformat.write(nb, tmp_path / "train.ipynb")
    pm.execute_notebook(str(tmp_path / "train.ipynb"), str(tmp_path / "done.ipynb"), kernel_name="python3",
                        progress_bar=False, cwd=str(project_root()))
    outputs = [o for c in nbformat.read(tmp_path / "done.ipynb", as_version=4).cells for o in c.get("outputs", [])]
    html = [str(o["data"]["text/html"]) for o in outputs if "text/html" in o.get("data", {})]
    lines = [o["data"]["text/plain"] for o in outputs if o.output_type == "display_data"
             and o["data"].get("text/plain", "").startswith("train step")]
    if session is None:
        assert not html and len(lines) == 1 and lines[0].startswith("train step 4/4")
    else:
        assert any("<progress" in h for h in html) and not lines


def test_the_stage_runner_asks_its_kernels_for_plain_lines_even_inside_a_jupyter_kernel(monkeypatch):
    """`lab.runs.pipeline.execute_stage` run from a notebook open in Jupyter (a Kaggle notebook running the pipeline):
    its papermill kernels inherit JPY_SESSION_NAME, so it sets LAB_PROGRESS=plain while they start (a value the
    caller set wins) and restores the environment after."""
    import os

    from lab.core import console
    from lab.runs.pipeline import plain_progress

    monkeypatch.setattr(console, "in_kernel", lambda: True)
    monkeypatch.setenv("JPY_SESSION_NAME", "pipeline.ipynb")
    monkeypatch.delenv("LAB_PROGRESS", raising=False)
    assert console.live_progress()
    with plain_progress():
        assert os.environ["LAB_PROGRESS"] == "plain" and not console.live_progress()
    assert "LAB_PROGRESS" not in os.environ
    monkeypatch.setenv("LAB_PROGRESS", "live")
    with plain_progress():
        assert console.live_progress()
    assert os.environ["LAB_PROGRESS"] == "live"
