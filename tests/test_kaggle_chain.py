"""Kernels as Kaggle runs them, one after the other, on the tiny model (issue 44): a made-up Kaggle tree
(`$LAB_KAGGLE_ROOT`: input/ with the dependency dataset and each finished kernel's output, made read-only; working/;
temp/ as scratch), each kernel's built notebook executed by papermill in its own Jupyter kernel process with a fresh
working and scratch folder, its install cell as built (pip recorded, not run: the lab is already importable here).

The chain: 01_explore; 02_sft stopped by its wall-clock budget after one step; 02_sft again, attaching the stopped
kernel, resuming from its checkpoint; 04_vote attaching that, voting with the SFT adapter. Each kernel's working
folder is checked: what the stage reads came back from the kernel before it, nothing else did, checkpoints stayed in
scratch except the stopped kernel's resumable state. `python tests/test_kaggle_chain.py` prints the files and sizes
each kernel left (the issue's "must show")."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import sys
from pathlib import Path

import pytest

from lab.kaggle import kernel as kaggle

OVERRIDES = ["experiment=smoke", "sft.max_steps=3", "sft.save_steps=1", "sft.save_total_limit=1",
             "kaggle.python_version='%d.%d'" % sys.version_info[:2]]  # the install cell checks the image's Python


def _files(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file()}


def _read_only(folder: Path) -> None:
    for p in sorted(folder.rglob("*"), reverse=True):
        p.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH | (stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH
                                                               if p.is_dir() else 0))
    folder.chmod(0o555)


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for rel, _ in _files(folder).items():
        h.update(rel.encode() + (folder / rel).read_bytes())
    return h.hexdigest()


class FakeKaggle:
    def __init__(self, root: Path):
        self.root = root
        self.input, self.working, self.temp = root / "input", root / "working", root / "temp"
        deps = self.input / "nemotron-reasoning-lab-deps"
        deps.mkdir(parents=True)
        (deps / "nemotron_reasoning_lab-0.1.0-py3-none-any.whl").write_bytes(b"")
        kaggle._source_tarball(deps)
        _read_only(self.input / "nemotron-reasoning-lab-deps")
        self.left: dict[str, dict[str, int]] = {}

    def run(self, folder: Path) -> dict[str, int]:
        """Run the kernel in `folder` as Kaggle would: fresh working and scratch folders, its kernel_sources
        attached read-only under input/, then its working folder kept as its output (input/<its slug>)."""
        import papermill as pm

        meta = json.loads((folder / "kernel-metadata.json").read_text())
        for src in meta["kernel_sources"]:
            assert (self.input / src.split("/")[1]).is_dir(), f"{src} has not run"
        for d in (self.working, self.temp):
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
        nb = json.loads((folder / meta["code_file"]).read_text())
        for i, cell in enumerate(nb["cells"]):
            if cell["cell_type"] != "code":
                continue
            code = "".join(cell["source"]).replace("/kaggle/", f"{self.root}/")
            if i == 0:
                code = code.replace(kaggle.LAB_ROOT_ON_KAGGLE, str(self.root / "lab_root" / folder.name))
                code = code.replace('subprocess.run([sys.executable, "-m", "pip"',
                                    'print([sys.executable, "-m", "pip"').replace("], check=True)", "])")
            cell["source"] = code
        local = self.root / "notebooks" / f"{meta['id'].split('/')[1]}.ipynb"
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_text(json.dumps(nb))
        before = {p.name: _digest(p) for p in self.input.iterdir()}
        pm.execute_notebook(str(local), str(local.with_suffix(".out.ipynb")), kernel_name="python3",
                            progress_bar=False, log_output=False, cwd=str(self.root))
        assert {p.name: _digest(p) for p in self.input.iterdir() if p.name in before} == before  # input untouched
        out = self.input / meta["id"].split("/")[1]
        shutil.copytree(self.working, out)
        _read_only(out)
        self.left[meta["id"]] = _files(self.working)
        return self.left[meta["id"]]


def run_chain(tmp: Path) -> tuple[FakeKaggle, dict[str, dict[str, int]], dict[str, int]]:
    k = FakeKaggle(tmp / "kaggle")
    build = tmp / "build"
    chain = kaggle.build_chain(["01_explore", "02_sft", "04_vote"], OVERRIDES, username="alice", run_name="c1",
                               out=build / "chain", model_source="", competition="")
    stop = kaggle.build_kernel("02_sft", [*OVERRIDES, "sft.wall_clock_budget_min=1e-6"], username="alice",
                               title="Nemotron lab c1 02_sft stopped", out=build / "02_sft_stopped", run_name="c1",
                               kernel_sources=["alice/nemotron-lab-c1-01-explore"], model_source="", competition="")
    resumed = kaggle.build_kernel("02_sft", OVERRIDES, username="alice", title="Nemotron lab c1 02_sft",
                                  out=build / "chain" / "02_sft", run_name="c1",
                                  kernel_sources=["alice/nemotron-lab-c1-02-sft-stopped"], model_source="",
                                  competition="")
    scratch = {}
    for folder in (chain[0], stop, resumed, chain[2]):
        k.run(folder)
        scratch[folder.name] = sum(_files(k.temp).values())
    return k, k.left, scratch


@pytest.mark.slow  # four papermill kernels of the tiny model in their own processes: minutes on a CPU
def test_three_kernels_under_a_made_up_kaggle_layout(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_KAGGLE_ROOT", str(tmp_path / "kaggle"))
    monkeypatch.setenv("KAGGLE_KERNEL_RUN_TYPE", "Batch")
    monkeypatch.delenv("LAB_KERNEL_START", raising=False)
    assert not Path("/kaggle").exists(), "a real /kaggle here: this test lays out its own"
    k, left, scratch = run_chain(tmp_path)
    assert not Path("/kaggle").exists()  # nothing escaped the made-up tree
    assert scratch["02_sft_stopped"] > 0 and scratch["02_sft"] > 0 and scratch["04_vote"] == 0
    explore, stopped, resumed, vote = (left[f"alice/nemotron-lab-c1-{s}"]
                                       for s in ("01-explore", "02-sft-stopped", "02-sft", "04-vote"))
    run = "outputs/c1/"
    assert f"{run}01_explore/metrics.json" in explore and f"{run}data/split.json" in explore
    # the stopped kernel: the split came back, 01_explore's report did not; its resumable state is kept
    assert not any(f.startswith(f"{run}01_explore/") for f in stopped)
    kept = [f for f in stopped if f.startswith(f"{run}checkpoints/02_sft/")]
    assert f"{run}checkpoints/02_sft/checkpoint-1/optimizer.pt" in kept and f"{run}checkpoints/02_sft/lab_run.json" in kept
    m = json.loads((k.input / "nemotron-lab-c1-02-sft-stopped" / run / "02_sft" / "metrics.json").read_text())
    assert m["stopped_by_budget"] and m["steps"] == 1 and "--kernel-sources" in m["resume_note"]
    # the resumed kernel continued at step 1 and finished; no checkpoint in its working folder
    m = json.loads((k.input / "nemotron-lab-c1-02-sft" / run / "02_sft" / "metrics.json").read_text())
    assert m["resumed_from"] == str(k.temp / run / "checkpoints" / "02_sft" / "checkpoint-1")  # scratch, copied back
    assert m["steps"] == 3 and not m["stopped_by_budget"]
    assert not any("checkpoints" in f for f in resumed)
    # the adapter kept in /kaggle/working is bf16 (kaggle.adapter_dtype); the resumable checkpoint kept fp32
    from safetensors.torch import load_file
    import torch

    saved = load_file(str(k.input / "nemotron-lab-c1-02-sft" / run / "02_sft" / "adapter" / "adapter_model.safetensors"))
    assert saved and {v.dtype for v in saved.values()} == {torch.bfloat16}
    kept_ckpt = load_file(str(k.input / "nemotron-lab-c1-02-sft-stopped" / run / "checkpoints" / "02_sft" / "checkpoint-1"
                              / "adapter_model.safetensors"))
    assert {v.dtype for v in kept_ckpt.values()} == {torch.float32}
    # 04_vote found 02_sft's adapter (copied back whole) and the split, and nothing else came back
    # the run lock, the run's marker (copied back with the run), the evaluation cache, the tiny model built
    made_here = {".lock", ".lab-run", "evaluations", "base_model"}
    assert {f.split("/")[2] for f in vote} - made_here == {"data", "02_sft", "04_vote"}
    assert f"{run}04_vote/metrics.json" in vote


if __name__ == "__main__":  # the figures: files and sizes each kernel left in /kaggle/working, scratch at its end
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="kaggle_chain_"))
    os.environ.update(LAB_KAGGLE_ROOT=str(tmp / "kaggle"), KAGGLE_KERNEL_RUN_TYPE="Batch")
    _, left, scratch = run_chain(tmp)
    for (kid, files), (name, s) in zip(left.items(), scratch.items()):
        print(f"\n{kid}: {len(files)} files, {sum(files.values()):,} bytes in working; scratch at its end {s:,} bytes")
        for rel, size in files.items():
            print(f"  {size:>12,}  {rel}")
    sys.exit(0)
