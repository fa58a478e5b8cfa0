"""The fused Mamba kernels are part of the real-model path (issue 26): `lab.model.models.check_mamba_kernels` refuses to
train model=nemotron_nano where mamba_ssm / causal_conv1d do not import, and names how to get them. CPU only: the
packages cannot import here (CUDA extensions), and the stand-in modules below are test-only fakes with the functions'
names, nothing more."""

from __future__ import annotations

import sys
import types

import pytest

from lab.core import config
from lab.model import models
from lab import LabError


def test_the_tiny_model_is_not_checked():
    models.check_mamba_kernels(config.compose([]))  # builds nothing, raises nothing


def test_real_model_training_is_refused_without_the_kernels(monkeypatch):
    for name in ("mamba_ssm", "mamba_ssm.ops", "mamba_ssm.ops.triton", "mamba_ssm.ops.triton.ssd_combined",
                 "causal_conv1d"):
        monkeypatch.setitem(sys.modules, name, None)  # import fails, as on a machine without them
    cfg = config.compose(["experiment=competition"])
    with pytest.raises(LabError) as e:
        models.check_mamba_kernels(cfg)
    msg = str(e.value)
    assert "mamba_ssm: ModuleNotFoundError" in msg and "causal_conv1d: ModuleNotFoundError" in msg
    assert "scripts/build_mamba_wheels.sh" in msg and "causal-conv1d==1.7.0 mamba-ssm==2.3.2.post1" in msg


def _fake(monkeypatch, name, **funcs):
    mod = types.ModuleType(name)
    for k, v in funcs.items():
        setattr(mod, k, v)
    monkeypatch.setitem(sys.modules, name, mod)


def test_importable_kernels_pass_and_a_missing_function_is_named(monkeypatch):
    f = lambda *a, **k: None  # noqa: E731
    for name in ("mamba_ssm", "mamba_ssm.ops", "mamba_ssm.ops.triton"):
        _fake(monkeypatch, name)
    _fake(monkeypatch, "mamba_ssm.ops.triton.ssd_combined", mamba_chunk_scan_combined=f,
          mamba_split_conv1d_scan_combined=f)
    _fake(monkeypatch, "causal_conv1d", causal_conv1d_fn=f, causal_conv1d_update=f)
    cfg = config.compose(["experiment=competition"])
    assert models.missing_mamba_kernels() == {}
    models.check_mamba_kernels(cfg)
    _fake(monkeypatch, "causal_conv1d", causal_conv1d_fn=f)
    with pytest.raises(LabError, match="causal_conv1d: causal_conv1d lacks causal_conv1d_update"):
        models.check_mamba_kernels(cfg)


def test_build_script_agrees_with_the_lab_on_versions_and_is_valid_bash():
    import re
    import subprocess

    from lab.kaggle import kernel as kaggle
    from lab.core.paths import project_root

    script = project_root() / "scripts" / "build_mamba_wheels.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    text = script.read_text()
    for pin in re.findall(r"(?:causal-conv1d|mamba-ssm)==[\w.]+", models.MAMBA_WHEELS_HELP):
        assert f'"{pin}"' in text, pin
    assert f'"{kaggle.MAMBA_EXTRA_DEP}"' in text
    assert all(g.split("-")[0] in text for g in kaggle.MAMBA_WHEEL_GLOBS)  # the wheel names the install cell looks for


def test_a_package_whose_init_fails_is_missing_even_when_its_submodule_imports(monkeypatch, tmp_path):
    """mamba_ssm built without its CUDA extensions: the package's __init__ fails on `selective_scan_cuda`, after it
    imported the Triton scan's module, which stays in sys.modules. transformers then runs its PyTorch scan, so the
    check (and with it check_fits' choice of the Mamba path to trace) must say the kernels are missing, whatever
    was imported before."""
    pkg = tmp_path / "mamba_ssm"
    (pkg / "ops" / "triton").mkdir(parents=True)
    (pkg / "__init__.py").write_text("import mamba_ssm.ops.triton.ssd_combined\nimport selective_scan_cuda\n")
    (pkg / "ops" / "__init__.py").write_text("")
    (pkg / "ops" / "triton" / "__init__.py").write_text("")
    (pkg / "ops" / "triton" / "ssd_combined.py").write_text(
        "def mamba_chunk_scan_combined(*a, **k): pass\ndef mamba_split_conv1d_scan_combined(*a, **k): pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    f = lambda *a, **k: None  # noqa: E731
    _fake(monkeypatch, "causal_conv1d", causal_conv1d_fn=f, causal_conv1d_update=f)
    assert not any(m.startswith("mamba_ssm") for m in sys.modules)
    try:
        with pytest.raises(ImportError):
            import mamba_ssm  # noqa: F401  (the failed try transformers makes at its own import)
        assert "mamba_ssm.ops.triton.ssd_combined" in sys.modules  # left behind
        missing = models.missing_mamba_kernels()
        assert list(missing) == ["mamba_ssm"] and "selective_scan_cuda" in missing["mamba_ssm"]
    finally:  # the fake's modules must not outlive the test
        for name in [m for m in sys.modules if m.startswith("mamba_ssm")]:
            del sys.modules[name]
