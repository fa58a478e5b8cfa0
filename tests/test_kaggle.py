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
import types
import zipfile
from pathlib import Path

import pytest

from lab.kaggle import kernel as kaggle
from lab import LabError
from lab.core.paths import project_root

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
    assert meta["model_sources"] == ["metric/nemotron-3-nano-30b-a3b-bf16/transformers/default/1"]
    assert meta["machine_shape"] == "NvidiaRtxPro6000"  # conf/kaggle/default.yaml: one 96 GB GPU
    assert meta["dataset_sources"] == ["alice/nemotron-reasoning-lab-deps"]
    assert meta["kernel_sources"] == ["alice/nemotron-lab-01-explore"]


HANDLES = {  # model source -> accepted by kaggle 2.2.5's validate_model_instance_version_string
    "metric/nemotron-3-nano-30b-a3b-bf16/transformers/default/1": True,
    "nvidia/nemotron-3-nano-30b-a3b/transformers/bf16/12": True,
    "nvidia/nemotron-3-nano-30b-a3b/transformers/bf16": False,  # the lab's earlier default: no version
    "nvidia/nemotron-3-nano-30b-a3b/transformers/bf16/latest": False,
    "nvidia/nemotron/transformers//1": False,
    "nvidia/nemotron/transformers/bf16/1/2": False,
    "nvidia/nemotron-3-nano-30b-a3b": False,
}


@pytest.mark.parametrize("handle,ok", HANDLES.items())
def test_model_source_is_a_versioned_handle(handle, ok, tmp_path):
    if ok:
        assert kaggle.check_model_source(handle) == handle
    else:
        with pytest.raises(LabError, match="owner/model/framework/instance/version"):
            kaggle.build_kernel("01_explore", [], username="bob", out=tmp_path / "k", model_source=handle)


@pytest.fixture
def kaggle_api(monkeypatch, tmp_path):
    """kaggle 2.2.5's own KaggleApi, when installed (it is not in the dev extra: see pyproject.toml). Importing the
    package authenticates: it is pointed at an empty config folder with no credential in the environment, and
    nothing here reaches the network (`build_kaggle_client` is replaced by a recorder)."""
    monkeypatch.setenv("KAGGLE_CONFIG_DIR", str(tmp_path / "kaggle_config"))
    (tmp_path / "kaggle_config").mkdir()
    for k in ("KAGGLE_USERNAME", "KAGGLE_KEY", "KAGGLE_API_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    ext = pytest.importorskip("kaggle.api.kaggle_api_extended", reason="kaggle==2.2.5 is not installed")
    import kaggle as kaggle_pkg

    if kaggle_pkg.__version__ != "2.2.5":
        pytest.skip(f"kaggle {kaggle_pkg.__version__} installed; these rules were read from 2.2.5")
    return ext.KaggleApi()


def test_check_model_source_agrees_with_kaggle(kaggle_api):
    for handle, ok in HANDLES.items():
        try:
            kaggle_api.validate_model_instance_version_string(handle)
            accepted = True
        except ValueError:
            accepted = False
        assert accepted is ok, handle


def test_competition_kernel_passes_kaggles_own_push_validation(kaggle_api, tmp_path, monkeypatch, capsys):
    """`kaggle kernels push` (KaggleApi.kernels_push) on the built `model=nemotron_nano experiment=competition` kernel:
    every metadata field goes through kaggle's own checks and into its request; the request is recorded, not sent."""
    import types

    out = kaggle.build_kernel("02_sft", ["model=nemotron_nano", "experiment=competition"], username="alice",
                              out=tmp_path / "02_sft")
    sent = []

    class Client:
        kernels = types.SimpleNamespace(kernels_api_client=types.SimpleNamespace(
            save_kernel=lambda request: sent.append(request) or types.SimpleNamespace(error=None)))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(kaggle_api, "build_kaggle_client", lambda: Client())
    capsys.readouterr()
    kaggle_api.kernels_push(str(out))
    assert "does not resolve to the specified id" not in capsys.readouterr().out
    (req,) = sent
    meta = json.loads((out / "kernel-metadata.json").read_text())
    assert req.slug == meta["id"] == "alice/nemotron-lab-02-sft" and req.new_title == meta["title"]
    assert req.language == "python" and req.kernel_type == "notebook" and req.is_private is True
    assert req.enable_gpu is True and req.enable_internet is False and req.enable_tpu is False
    assert list(req.model_data_sources) == ["metric/nemotron-3-nano-30b-a3b-bf16/transformers/default/1"]
    assert list(req.competition_data_sources) == ["nvidia-nemotron-model-reasoning-challenge"]
    assert list(req.dataset_data_sources) == ["alice/nemotron-reasoning-lab-deps"]
    assert req.machine_shape == "NvidiaRtxPro6000"
    body = json.loads(req.text)
    assert "nemotron-reasoning-lab[vllm]" in body["cells"][0]["source"]  # the real model evaluates with vLLM


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
    assert '"--no-index", "--find-links"' in code and '"nemotron-reasoning-lab[vllm]"' in code  # and not unsloth
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
    from lab.core.config import compose

    assert str(compose(["run_dir=/kaggle/working/outputs/x"]).run_dir) == "/kaggle/working/outputs/x"


def test_kernel_options(tmp_path, monkeypatch):
    out = kaggle.build_kernel("pipeline", ["run_dir=/kaggle/working/mine", "seed=7"], username="bob",
                              title="Full pipeline, seed 7", out=tmp_path / "p", enable_gpu=False, model_source="",
                              dataset="carol/lab-deps")
    meta = json.loads((out / "kernel-metadata.json").read_text())
    assert meta["id"] == "bob/full-pipeline-seed-7" and meta["enable_gpu"] is False and "machine_shape" not in meta
    assert meta["model_sources"] == [] and meta["dataset_sources"] == ["carol/lab-deps"]
    nb = cells(out / "pipeline.ipynb")
    assert 'PACKAGE = "nemotron-reasoning-lab"\n' in src(nb[0]) and 'LAB_DATASET = "lab-deps"' in src(nb[0])
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


@pytest.mark.slow  # builds the lab's wheel in a subprocess: seconds (the fast lane stays short)
def test_dependency_dataset(tmp_path):
    top_build = (project_root() / "build").exists()
    out = kaggle.build_dataset("alice", out=tmp_path / "ds")
    meta = json.loads((out / "dataset-metadata.json").read_text())
    assert meta["id"] == "alice/" + kaggle.slugify(meta["title"]) == "alice/nemotron-reasoning-lab-deps"
    assert meta["licenses"] == [{"name": "other"}]
    wheels = list(out.glob("nemotron_reasoning_lab-*-py3-none-any.whl"))
    assert len(wheels) == 1
    names = zipfile.ZipFile(wheels[0]).namelist()
    assert "lab/runs/sweep.py" in names and "lab/kaggle/kernel.py" in names and not any("__pycache__" in n for n in names)
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

    conf = project_root() / "scripts" / "accelerate"
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


@pytest.mark.parametrize("notebook,overrides,extras", [
    ("01_explore", ["model=nemotron_nano"], []),
    ("05_errors", ["model=nemotron_nano"], []),
    ("02_sft", ["model=nemotron_nano"], ["vllm"]),
    ("04_vote", ["model=nemotron_nano"], ["vllm"]),
    ("04_vote", [], []),  # the tiny model generates with transformers
    ("03_grpo", ["grpo.rollout_backend=vllm"], ["vllm"]),
    ("02_sft", ["model=nemotron_nano", "sft.backend=unsloth"], ["vllm", "unsloth"]),
    ("pipeline", ["model=nemotron_nano"], ["vllm"]),
    ("02_sft", ["model=nemotron_nano", "gpu=h100_80gb"], ["vllm", "bnb"]),
])
def test_install_cell_installs_only_what_the_kernel_needs(notebook, overrides, extras):
    from lab.core.config import compose

    assert kaggle.kernel_extras(compose(overrides), notebook) == extras
    proj = kaggle._pyproject()["project"]["optional-dependencies"]
    assert all(x in proj for x in extras) and set(proj["gpu"]) == set(proj["vllm"]) | set(proj["unsloth"]) | set(proj["bnb"])


def test_wheel_set_builds_sdist_only_dependencies_first(tmp_path, monkeypatch):
    """antlr4-python3-runtime 4.9.3 (omegaconf pins 4.9.*) has no wheel on PyPI, so `pip download --only-binary=:all:`
    alone fails: it is built with `pip wheel` into the same folder first, which the download then finds."""
    from importlib import metadata

    name, version = kaggle.SDIST_ONLY[0].split("==")
    assert metadata.version(name) == version  # the version this environment resolved for hydra-core
    (tmp_path / "requirements.txt").write_text("hydra-core==1.3.2\n")
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: calls.append(cmd) or types.SimpleNamespace(returncode=0))
    kaggle.fetch_wheels(tmp_path, "3.11")
    build, download = calls
    assert build[2:4] == ["pip", "wheel"] and "--no-deps" in build and kaggle.SDIST_ONLY[0] in build
    assert build[build.index("--wheel-dir") + 1] == str(tmp_path)
    assert download[2:4] == ["pip", "download"] and "--only-binary=:all:" in download
    assert download[download.index("--find-links") + 1] == str(tmp_path) == download[download.index("--dest") + 1]
    assert download[download.index("--python-version") + 1] == "3.11"
    with pytest.raises(LabError, match="requirements.txt"):
        kaggle.fetch_wheels(tmp_path / "empty")
