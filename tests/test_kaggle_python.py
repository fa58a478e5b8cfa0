"""The Kaggle wheel set's Python is a config key (issue 26, item 11) checked by the kernel's install cell, and the
install cell installs the fused Mamba kernels' wheels when the dataset holds them. The cell runs here with /kaggle
redirected into tmp_path and pip recorded, not run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from lab.kaggle import kernel as kaggle
from lab.core.config import compose


_FILES = []


def _run_cell(tmp_path, monkeypatch, python_version, wheels=()):
    monkeypatch.setenv("LAB_ROOT", "unset")  # an earlier cell in this process pointed it at its fake LAB_ROOT
    root = tmp_path / "kaggle"
    deps = root / "input" / "lab-deps"
    deps.mkdir(parents=True)
    for w in ("nemotron_reasoning_lab-0.1.0-py3-none-any.whl", *wheels):
        (deps / w).write_bytes(b"")
    _FILES[:] = _FILES or kaggle.tracked_files()  # git ls-files, before subprocess.run is replaced below
    kaggle._source_tarball(deps, _FILES)
    code = kaggle.install_cell_source("lab-deps", "/kaggle/working/outputs/x", python_version=python_version)
    code = code.replace("/kaggle/", f"{root}/").replace(kaggle.LAB_ROOT_ON_KAGGLE, str(tmp_path / "lab_root"))
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: calls.append(cmd))
    monkeypatch.setenv("LAB_ROOT", "unset")
    exec(compile(code, "install_cell", "exec"), {})
    return deps, calls


def test_python_version_is_a_config_key_and_the_wheel_set_uses_it(tmp_path):
    assert compose([]).kaggle.python_version == "3.12"  # quoted in the YAML: 3.10 must not read as 3.1
    assert compose(["kaggle.python_version='3.10'"]).kaggle.python_version == "3.10"
    download = kaggle.wheel_commands(tmp_path)[1]
    assert download[download.index("--python-version") + 1] == "3.12"


def test_install_cell_stops_on_another_python(tmp_path, monkeypatch):
    with pytest.raises(RuntimeError, match=r"runs Python \d+\.\d+, but .* built for 2\.7 \(kaggle.python_version\)"):
        _run_cell(tmp_path, monkeypatch, "2.7")


def test_install_cell_installs_the_mamba_wheels_when_present(tmp_path, monkeypatch):
    here = "%d.%d" % sys.version_info[:2]
    deps, calls = _run_cell(tmp_path / "none", monkeypatch, here)
    assert len(calls) == 1  # only the lab: no Mamba wheels in this dataset
    wheels = ("causal_conv1d-1.7.0-cp312-cp312-linux_x86_64.whl", "mamba_ssm-2.3.2.post1-cp312-cp312-linux_x86_64.whl")
    deps, calls = _run_cell(tmp_path / "with", monkeypatch, here, wheels)
    assert calls[1] == [sys.executable, "-m", "pip", "install", "--no-index", "--find-links", str(deps), "--no-deps",
                        *(str(deps / w) for w in wheels), kaggle.MAMBA_EXTRA_DEP]


def test_a_built_kernel_checks_the_configured_python(tmp_path):
    out = kaggle.build_kernel("02_sft", ["kaggle.python_version='3.13'"], username="bob", out=tmp_path / "k")
    cell = json.loads((out / "02_sft.ipynb").read_text())["cells"][0]
    code = "".join(cell["source"])
    assert 'PYTHON_VERSION = "3.13"\n' in code and "kaggle.python_version" in code
