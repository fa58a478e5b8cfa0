"""Offline Kaggle kernels and the multi-GPU launch files, all without network or GPU.

A built kernel folder: metadata whose id slug is Kaggle's slug of its title and which names the
competition, model and dataset sources; a notebook whose injected-parameters cell holds the overrides
(run_dir under /kaggle/working) and whose first cell installs with --no-index and no URL. The install
cell itself is executed against a fake /kaggle tree (pip replaced by a recorder). The dependency
dataset is built for real (the wheel with pip, offline). The accelerate configs load with accelerate's
own loader.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from lab import kaggle
from lab.config import LabError, project_root

OVERRIDES = ["model=nemotron_nano", "data=competition", "sft.learning_rate=1e-4"]


def cells(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cells"]


def tagged(nb_cells: list[dict], tag: str) -> list[dict]:
    return [c for c in nb_cells if tag in c.get("metadata", {}).get("tags", [])]


def src(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


@pytest.mark.parametrize("title,slug", [
    ("Nemotron lab 02_sft", "nemotron-lab-02-sft"),
    ("  My  Kernel -- v2!! ", "my-kernel-v2"),
    ("SFT: r=32, lr=1e-4", "sft-r-32-lr-1e-4"),
])
def test_slugify(title, slug):
    assert kaggle.slugify(title) == slug


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    out = tmp_path_factory.mktemp("kernel") / "02_sft"
    kaggle.build_kernel("02_sft", OVERRIDES, username="alice", out=out, run_name="nano1",
                        kernel_sources=["alice/nemotron-lab-01-explore"])
    return out


def test_kernel_metadata(kernel):
    meta = json.loads((kernel / "kernel-metadata.json").read_text())
    user, slug = meta["id"].split("/")
    assert user == "alice" and slug == kaggle.slugify(meta["title"]) == "nemotron-lab-02-sft"
    assert meta["code_file"] == "02_sft.ipynb" and (kernel / meta["code_file"]).is_file()
    assert meta["language"] == "python" and meta["kernel_type"] == "notebook"
    assert meta["is_private"] is True and meta["enable_gpu"] is True and meta["enable_internet"] is False
    assert meta["competition_sources"] == ["nvidia-nemotron-model-reasoning-challenge"]
    assert meta["model_sources"] == [kaggle.MODEL_SOURCE] and meta["model_sources"][0].count("/") >= 3
    assert meta["dataset_sources"] == ["alice/nemotron-reasoning-lab-deps"]
    assert meta["kernel_sources"] == ["alice/nemotron-lab-01-explore"]


def test_kernel_notebook_has_parameters_baked_in(kernel):
    nb = cells(kernel / "02_sft.ipynb")
    injected = tagged(nb, "injected-parameters")
    assert len(injected) == 1
    tree = ast.parse(src(injected[0]))
    values = {t.targets[0].id: ast.literal_eval(t.value) for t in tree.body if isinstance(t, ast.Assign)}
    assert values["overrides"] == [*OVERRIDES, "run_dir=/kaggle/working/outputs/nano1"]
    # papermill puts it right after the notebook's own parameters cell, which keeps its default
    i = nb.index(tagged(nb, "parameters")[0])
    assert nb[i + 1] is injected[0] and "overrides: list[str] = []" in src(nb[i])
    import nbformat

    nbformat.validate(nbformat.reads((kernel / "02_sft.ipynb").read_text(), as_version=4))


def test_kernel_install_cell_is_offline(kernel):
    first = cells(kernel / "02_sft.ipynb")[0]
    code = src(first)
    assert kaggle.INSTALL_TAG in first["metadata"]["tags"]
    assert '"--no-index", "--find-links"' in code and '"nemotron-reasoning-lab[gpu]"' in code
    assert "http" not in code and "://" not in code and "pip download" not in code
    assert 'LAB_DATASET = "nemotron-reasoning-lab-deps"' in code and 'os.environ["LAB_ROOT"]' in code
    assert 'RUN_DIR = "/kaggle/working/outputs/nano1"' in code
    ast.parse(code)


def test_install_cell_runs_against_a_fake_kaggle_tree(tmp_path, monkeypatch):
    """Execute the cell with /kaggle and /tmp/lab_root redirected into tmp_path and pip recorded, not run."""
    root = tmp_path / "kaggle"
    deps = root / "input" / "nemotron-reasoning-lab-deps"
    deps.mkdir(parents=True)
    (deps / "nemotron_reasoning_lab-0.1.0-py3-none-any.whl").write_bytes(b"")
    kaggle._source_tarball(deps)
    prev = root / "input" / "nemotron-lab-01-explore" / "outputs" / "nano1" / "data"
    prev.mkdir(parents=True)
    (prev / "split.json").write_text("{}")
    code = kaggle.install_cell_source("nemotron-reasoning-lab-deps", "/kaggle/working/outputs/nano1")
    code = code.replace("/kaggle/", f"{root}/").replace(kaggle.LAB_ROOT_ON_KAGGLE, str(tmp_path / "lab_root"))
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: calls.append(cmd))
    monkeypatch.setenv("LAB_ROOT", "unset")
    exec(compile(code, "install_cell", "exec"), {})
    assert calls == [[sys.executable, "-m", "pip", "install", "--no-index", "--find-links", str(deps),
                      "nemotron-reasoning-lab"]]
    assert os.environ["LAB_ROOT"] == str(tmp_path / "lab_root")
    assert (tmp_path / "lab_root" / "conf" / "config.yaml").is_file()
    assert (tmp_path / "lab_root" / "notebooks" / "02_sft.ipynb").is_file()
    assert (root / "working" / "outputs" / "nano1" / "data" / "split.json").is_file()  # the earlier run continues
    from lab.config import compose

    assert str(compose(["run_dir=/kaggle/working/outputs/x"]).run_dir) == "/kaggle/working/outputs/x"


def test_kernel_options(tmp_path, monkeypatch):
    out = kaggle.build_kernel("pipeline", ["run_dir=/kaggle/working/mine", "seed=7"], username="bob",
                              title="Full pipeline, seed 7", out=tmp_path / "p", enable_gpu=False, model_source=None,
                              dataset="carol/lab-deps")
    meta = json.loads((out / "kernel-metadata.json").read_text())
    assert meta["id"] == "bob/full-pipeline-seed-7" and meta["enable_gpu"] is False
    assert meta["model_sources"] == [] and meta["dataset_sources"] == ["carol/lab-deps"]
    nb = cells(out / "pipeline.ipynb")
    assert '"nemotron-reasoning-lab"]' in src(nb[0]) and 'LAB_DATASET = "lab-deps"' in src(nb[0])
    assert "overrides = [\"run_dir=/kaggle/working/mine\", \"seed=7\"]" in src(tagged(nb, "injected-parameters")[0])
    assert "run_notebooks(overrides, stages)" in "".join(src(c) for c in nb)
    with pytest.raises(LabError, match="learning_rat"):
        kaggle.build_kernel("02_sft", ["sft.learning_rat=1"], username="bob", out=tmp_path / "x")
    with pytest.raises(LabError, match="--notebook"):
        kaggle.build_kernel("06_nothing", [], username="bob", out=tmp_path / "y")
    with pytest.raises(LabError, match="5 to 50"):
        kaggle.build_kernel("02_sft", [], username="bob", title="abc", out=tmp_path / "z")
    monkeypatch.delenv("KAGGLE_USERNAME", raising=False)
    with pytest.raises(LabError, match="KAGGLE_USERNAME"):
        kaggle.build_kernel("02_sft", [], out=tmp_path / "w")
    monkeypatch.setenv("KAGGLE_USERNAME", "dave")
    from lab.__main__ import main

    assert main(["kaggle", "build", "--notebook", "01_explore.ipynb", "--out", str(tmp_path / "cli"),
                 "--", "data.n_train=8"]) == 0
    assert json.loads((tmp_path / "cli" / "kernel-metadata.json").read_text())["id"] == "dave/nemotron-lab-01-explore"


def test_dependency_dataset(tmp_path):
    top_build = (project_root() / "build").exists()
    out = kaggle.build_dataset("alice", out=tmp_path / "ds")
    meta = json.loads((out / "dataset-metadata.json").read_text())
    assert meta["id"] == "alice/" + kaggle.slugify(meta["title"]) == "alice/nemotron-reasoning-lab-deps"
    assert meta["licenses"] == [{"name": "other"}]
    wheels = list(out.glob("nemotron_reasoning_lab-*-py3-none-any.whl"))
    assert len(wheels) == 1
    names = zipfile.ZipFile(wheels[0]).namelist()
    assert "lab/sweep.py" in names and "lab/kaggle.py" in names and not any("__pycache__" in n for n in names)
    reqs = [x for x in (out / "requirements.txt").read_text().splitlines() if x and not x.startswith("#")]
    assert "transformers==5.17.0" in reqs and "trl==1.15.0" in reqs and "vllm==0.33.0" in reqs
    assert all("==" in r for r in reqs) and not any("+cpu" in r or "://" in r for r in reqs)
    with tarfile.open(out / kaggle.SRC_TARBALL) as t:
        members = t.getnames()
    assert "conf/config.yaml" in members and "notebooks/03_grpo.ipynb" in members
    assert not any("__pycache__" in m or "/." in m for m in members)
    assert (project_root() / "build").exists() == top_build  # the wheel was built in a temporary copy
    no_gpu = kaggle.requirements(gpu_extra=False)
    assert not any(r.startswith(("vllm", "unsloth")) for r in no_gpu) and any(r.startswith("torch") for r in no_gpu)


def test_accelerate_configs_load():
    from accelerate.commands.config.config_args import load_config_from_file

    conf = project_root() / "conf" / "accelerate"
    kinds = {}
    for f in sorted(conf.glob("*.yaml")):
        c = load_config_from_file(str(f))
        kinds[f.stem] = str(c.distributed_type).split(".")[-1]
        ds = (c.deepspeed_config or {}).get("deepspeed_config_file")
        if ds:
            assert json.loads((project_root() / ds).read_text())["zero_optimization"]["stage"] in (2, 3)
    assert kinds == {"ddp": "MULTI_GPU", "deepspeed_zero2": "DEEPSPEED", "deepspeed_zero3": "DEEPSPEED"}


@pytest.mark.parametrize("script", ["train_sft.py", "train_grpo.py"])
def test_launch_scripts_answer_help(script):
    r = subprocess.run([sys.executable, str(project_root() / "scripts" / script), "--help"], capture_output=True,
                       text=True, timeout=60, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0 and "accelerate launch" in r.stdout
