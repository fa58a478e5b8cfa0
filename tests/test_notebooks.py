"""The five notebooks: stored clean with a `parameters` cell, and executed end to end by papermill on the smoke budget."""

import json

import nbformat
import pytest

from lab.config import project_root
from lab.pipeline import SMOKE_OVERRIDES, STAGES, run_notebooks, summary

NOTEBOOKS = [project_root() / "notebooks" / f"{s}.ipynb" for s in STAGES]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=STAGES)
def test_notebook_is_clean_and_parameterised(path):
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert not any(c.get("outputs") or c.get("execution_count") for c in code), "stored with outputs"
    params = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1 and "overrides: list[str] = []" in params[0].source
    assert nb.cells[0].cell_type == "markdown" and "What this notebook does" in nb.cells[0].source
    assert any(f'Stage("{path.stem}"' in c.source for c in code)


@pytest.mark.slow
def test_all_notebooks_run_on_the_smoke_budget(tmp_path):
    run_dir = run_notebooks(SMOKE_OVERRIDES + [f"run_dir={tmp_path}"], log_output=False)
    s = summary(run_dir)
    for stage in STAGES:
        assert "missing" not in s["stages"][stage], stage
        assert (tmp_path / "notebooks" / f"{stage}.ipynb").is_file()
        assert json.loads((tmp_path / stage / "manifest.json").read_text())["status"] == "finished"
    st = s["stages"]
    assert {"accuracy_before", "accuracy_after", "wall_seconds"} <= set(st["02_sft"])
    assert {"reward_per_step", "accuracy_after", "accuracy_sft_start"} <= set(st["03_grpo"])
    assert {"greedy_accuracy", "maj_at_k"} <= set(st["04_vote"])
    assert {"accuracy_by_category", "taxonomy"} <= set(st["05_errors"])
    m3, m5 = (json.loads((tmp_path / stage / "metrics.json").read_text()) for stage in ("03_grpo", "05_errors"))
    # fixed - broken is the net change from the SFT start, counted once (not once per category and again in "all")
    assert m5["fixed_since_sft"] - m5["broken_since_sft"] == round(m5["n"] * (m5["accuracy"] - m3["accuracy_sft_start"]))
    assert (tmp_path / "summary.md").is_file() and (tmp_path / "02_sft" / "adapter" / "adapter_config.json").is_file()


@pytest.mark.slow
def test_same_seed_gives_identical_metrics(tmp_path):
    """Two runs with the same seed agree on every metric (timings aside) on CPU."""

    def metrics(run_dir):
        out = {}
        for stage in ["02_sft", "03_grpo"]:
            m = json.loads((run_dir / stage / "metrics.json").read_text())
            out[stage] = {k: v for k, v in m.items() if "seconds" not in k and k not in ("resumed_from",)}
        return out

    a = run_notebooks(SMOKE_OVERRIDES + [f"run_dir={tmp_path}/a"], stages=["02_sft", "03_grpo"], log_output=False)
    b = run_notebooks(SMOKE_OVERRIDES + [f"run_dir={tmp_path}/b"], stages=["02_sft", "03_grpo"], log_output=False)
    assert metrics(a) == metrics(b)
