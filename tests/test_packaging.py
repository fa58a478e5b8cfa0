"""The lab as an installed package: pyproject.toml lists every package of lab/ and every group of conf/ (conf/ ships
inside the wheel as lab/conf, the measured model's config values with lab.plan), and the wheel, installed into a
fresh venv, runs `python -m lab estimate` and `python -m lab memory` from a folder outside the checkout."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from lab.core.paths import project_root

ROOT = project_root()
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
REAL = ["model=nemotron_nano", "experiment=competition", "data=competition", "gpu=h100_80gb"]


def test_every_package_and_conf_group_is_listed():
    lab = sorted(".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "lab").rglob("__init__.py"))
    conf = ["lab.conf"] + sorted(f"lab.conf.{p.name}" for p in (ROOT / "conf").iterdir()
                                 if p.is_dir() and any(p.glob("*.yaml")))
    assert sorted(SETUPTOOLS["packages"]) == sorted(lab + conf)
    assert SETUPTOOLS["package-dir"] == {"lab.conf": "conf"}
    assert SETUPTOOLS["package-data"] == {"*": ["*.yaml"], "lab.plan": ["*.json"]}


def test_the_measured_models_values_ship_with_the_package():
    """A model folder without config.json (a Hub id, nothing downloaded) plans with the published values that ship
    in lab/plan, not with a file of the repository around it."""
    from lab.core.config import compose
    from lab.plan import shapes

    assert shapes.MEASURED_MODEL.parent == Path(shapes.__file__).parent
    cfg = compose(REAL)
    assert not (Path(str(cfg.model.path)) / "config.json").is_file()
    values = shapes.model_config_values(cfg)
    assert values["hybrid_override_pattern"].count("E") == 23 and values["n_routed_experts"] == 128


def test_an_installed_package_composes_its_own_conf_in_the_working_folder(tmp_path, monkeypatch):
    """No $LAB_ROOT, no checkout around the package, no conf/ in the working folder: the config comes from the conf/
    the package ships (`lab/conf`), and the project root, where outputs go, is the working folder."""
    import shutil

    from lab.core import config, paths

    site = tmp_path / "site-packages"
    shutil.copytree(ROOT / "conf", site / "lab" / "conf")
    monkeypatch.setattr(paths, "__file__", str(site / "lab" / "core" / "paths.py"))  # where a wheel puts it
    monkeypatch.setattr(paths, "PACKAGED_CONF", site / "lab" / "conf")
    monkeypatch.delenv("LAB_ROOT", raising=False)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert paths.project_root() == work.resolve() and paths.config_dir() == site / "lab" / "conf"
    assert config.compose(["model=nemotron_nano"]).model.name == "nemotron_nano"
    monkeypatch.setattr(paths, "PACKAGED_CONF", site / "gone")  # negative control: nothing shipped, nothing found
    with pytest.raises(Exception, match="conf/config.yaml not found"):
        paths.project_root()


def _venv_python(venv: Path) -> Path:
    return venv / ("Scripts" if os.name == "nt" else "bin") / "python"


@pytest.mark.slow  # builds the wheel, makes a venv and traces the real model's shapes on fake tensors: about a minute
def test_the_wheel_runs_estimate_and_memory_from_another_folder(tmp_path):
    """Offline: the lab's own wheel build (`lab.kaggle.kernel._build_wheel`: pip wheel --no-deps --no-build-isolation
    --no-index on a copy of the tracked files), a fresh venv that borrows this venv's dependencies through a .pth
    file, the wheel installed with --no-deps --no-index, both commands run from an empty folder with no checkout
    above it."""
    from lab.kaggle import kernel

    wheel = kernel._build_wheel(tmp_path / "dist")
    names = zipfile.ZipFile(wheel).namelist()
    assert {"lab/conf/config.yaml", "lab/conf/model/nemotron_nano.yaml", "lab/plan/nemotron_3_nano_config.json"} \
        <= set(names)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = _venv_python(venv)
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    deps = [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
    (Path(site) / "lab_deps.pth").write_text("\n".join(deps) + "\n")  # torch, transformers, ... of this venv
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index", "-q",
                    "--disable-pip-version-check", str(wheel)], check=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LAB_ROOT", "LAB_DATA")}

    def lab(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(py), *args], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600)

    where = lab("-c", "import lab, lab.core.paths as p; print(lab.__file__); print(p.config_dir())")
    assert where.returncode == 0, where.stderr
    assert all(line.startswith(site) for line in where.stdout.split()), where.stdout  # the wheel's, not the checkout's
    est = lab("-m", "lab", "estimate", *REAL, "--assume-rows")
    assert est.returncode == 0, est.stderr[-3000:]
    assert "02_sft" in est.stdout and "03_grpo" in est.stdout and "ASSUMED" in est.stdout
    mem = lab("-m", "lab", "memory", *REAL, "--tokens", "1024")
    assert mem.returncode == 0, mem.stderr[-3000:]
    assert "Traced peak of one SFT training micro-step" in mem.stdout and "fits:" in mem.stdout
    print(f"$ python -m lab estimate {' '.join(REAL)} --assume-rows\n{est.stdout}\n"
          f"$ python -m lab memory {' '.join(REAL)} --tokens 1024\n{mem.stdout}")
