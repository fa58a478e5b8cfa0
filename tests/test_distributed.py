"""Several processes on CPU (gloo), the way a GPU user launches them (docs/scaling.md).

`accelerate launch --multi_gpu --num_processes 2` of scripts/train_sft.py and train_grpo.py on a machine without
GPUs (torchrun underneath; scripts/_launch.py joins the processes in one gloo group), each run wrapped by
tests/launch_probe.py, which records what every rank trained on and which files it wrote. Shown: the 2-process
SFT adapter equals the 1-process one with the same global batch and seed (float tolerance below), the ranks see
disjoint data whose union is the 1-process data, only rank 0 writes, a run whose rank 1 was killed resumes from
its checkpoint to the same adapter; GRPO under 2 processes; FSDP2 (torch `fully_shard`) on CPU with the lm_head
LoRA (tests/fsdp2_probe.py). The launch guards and the lm_head's float32 cast are fast tests.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from lab import LabError
from lab.train.launch import DIST_ENV

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import _launch  # noqa: E402

# 4 optimizer steps of a global batch of 4 (1 x 4, 2 x 2 or 1 x 2 x 2 accumulation), float32, the same seed
SFT = ["--no-eval", "data.n_train=32", "data.n_val=4", "sft.max_steps=4", "sft.warmup_ratio=0", "sft.save_steps=2",
       "sft.logging_steps=1"]
GRPO = ["--no-eval", "data.n_train=32", "data.n_val=4", "infer.max_tokens=24", "grpo.max_steps=2", "grpo.n_prompts=8",
        "grpo.pass_rate_k=2", "grpo.drop_threshold=1.0", "grpo.drop_unsolved=false", "grpo.num_generations=2",
        "grpo.prompts_per_step=2", "grpo.mask_truncated_completions=false"]
# DDP on CPU: the two ranks' gradients are averaged by gloo's all-reduce, one process sums two micro-batches by
# gradient accumulation; the same float operations up to the order of one addition (docs/scaling.md, section 3).
TOL = 1e-6


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(probe: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in DIST_ENV and not k.startswith("LAB_")}
    probe.mkdir(parents=True, exist_ok=True)
    return {**env, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
            "CUDA_VISIBLE_DEVICES": "", "PROBE_DIR": str(probe), **extra}


def run(script: str, args: list[str], probe: Path, processes: int = 2, **env) -> subprocess.CompletedProcess:
    """`[accelerate launch --multi_gpu --num_processes N] tests/launch_probe.py scripts/<script> ARGS`."""
    launch = ([sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes),
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
               "--main_process_port", str(_port())] if processes > 1 else [sys.executable])
    return subprocess.run([*launch, str(ROOT / "tests" / "launch_probe.py"), str(ROOT / "scripts" / script), *args],
                          cwd=ROOT, env=_env(probe, **env), capture_output=True, text=True, timeout=600)


def probes(d: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(d.glob("probe_*.json"))]


def adapter(run_dir: Path, stage: str = "02_sft") -> dict:
    from safetensors.torch import load_file

    return load_file(run_dir / stage / "adapter" / "adapter_model.safetensors")


def max_abs(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


# ---- fast: the launch guards, the head's float32 cast -----------------------------------------------------

def test_a_cpu_launch_that_starts_one_process_is_refused():
    """`accelerate launch --cpu --num_processes 2` starts one process (MASTER_ADDR set, no WORLD_SIZE)."""
    with pytest.raises(LabError, match="started one process"):
        _launch.check_world({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "ACCELERATE_USE_CPU": "True"})
    with pytest.raises(LabError, match="--use_fsdp without a GPU"):
        _launch.check_world({"ACCELERATE_USE_FSDP": "true", "WORLD_SIZE": "2"}, cuda=False)
    _launch.check_world({"MASTER_ADDR": "127.0.0.1", "WORLD_SIZE": "2", "RANK": "1", "ACCELERATE_USE_CPU": "False"},
                        cuda=False)  # torchrun / accelerate --multi_gpu
    _launch.check_world({}, cuda=False)  # one plain process


def test_lm_head_lora_honours_cast_to_fp32():
    """`cast_lm_head_to_fp32`: a bf16 LoRA head computed in float32, equal to the float32 copy's own forward."""
    from peft import LoraConfig, get_peft_model

    from lab.model.lora import head_as_linear

    torch.manual_seed(0)
    net = torch.nn.Module()
    net.lm_head = torch.nn.Linear(16, 40, bias=False)
    pm = get_peft_model(net, LoraConfig(r=4, lora_alpha=8, target_modules=["lm_head"]))
    head = pm.base_model.model.lm_head
    torch.nn.init.normal_(head.lora_B["default"].weight, std=0.5)
    x = torch.randn(6, 16)
    want = head(x)  # PEFT's own float32 forward
    head.to(torch.bfloat16)
    h, w, b = head_as_linear(head, x.to(torch.bfloat16), fp32=True)
    assert h.dtype == w.dtype == torch.float32 and b is None
    torch.testing.assert_close(h @ w.t(), want, rtol=2e-2, atol=2e-2)  # bf16 weights: their rounding only
    h16, w16, _ = head_as_linear(head, x.to(torch.bfloat16))
    assert h16.dtype == w16.dtype == torch.bfloat16  # without the cast: the base weight's dtype, as before


# ---- slow: real 2-process runs -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def sft_runs(tmp_path_factory):
    """1 process x batch 2 x accumulation 2, and 2 processes x batch 2: the same global batch of 4."""
    root = tmp_path_factory.mktemp("dist")
    one = run("train_sft.py", [f"run_dir={root / 'one'}", "sft.batch_size=2", "sft.grad_accum=2", *SFT],
              root / "probe_one", processes=1)
    assert one.returncode == 0, one.stdout[-3000:] + one.stderr[-3000:]
    two = run("train_sft.py", [f"run_dir={root / 'two'}", "sft.batch_size=2", *SFT], root / "probe_two")
    assert two.returncode == 0, two.stdout[-3000:] + two.stderr[-3000:]
    return root


@pytest.mark.slow
def test_two_processes_train_what_one_process_trains(sft_runs):
    root = sft_runs
    assert json.loads((root / "two" / "02_sft" / "metrics.json").read_text())["processes"] == 2
    assert max_abs(adapter(root / "one"), adapter(root / "two")) <= TOL
    (one,), (r0, r1) = probes(root / "probe_one"), probes(root / "probe_two")
    assert (r0["world_size"], r1["world_size"]) == (2, 2)
    assert len(r0["batches"]) == len(r1["batches"]) == 4
    for step, (b0, b1) in enumerate(zip(r0["batches"], r1["batches"])):
        assert not set(b0) & set(b1), f"step {step}: both ranks got the same example"
        # the 1-process run's two micro-batches of this step: the same four examples
        assert sorted(b0 + b1) == sorted(one["batches"][2 * step] + one["batches"][2 * step + 1])
    run_dir = str(root / "two")
    assert not [p for p in r1["replaced"] if p.startswith(run_dir)], "rank 1 wrote outputs"
    # a stage writes into its working folder `.02_sft.partial`, swapped in for `02_sft` when it finishes (lab.core.run.Stage)
    written = {Path(p).relative_to(run_dir).as_posix().replace(".02_sft.partial/", "02_sft/")
               for p in r0["replaced"] if p.startswith(run_dir)}
    assert {"02_sft/adapter", "02_sft/metrics.json", "02_sft/train_log.csv", "02_sft/manifest.json"} <= written
    assert all((root / "two" / f).exists() for f in ("02_sft/adapter", "02_sft/metrics.json"))


@pytest.mark.slow
def test_a_run_whose_rank_1_is_killed_resumes_to_the_same_adapter(sft_runs, tmp_path):
    """Rank 1 dies (SIGKILL) at step 3, after checkpoint-2; the launcher ends rank 0; the same command resumes."""
    run_dir = tmp_path / "killed"
    args = [f"run_dir={run_dir}", "sft.batch_size=2", *SFT]
    dead = run("train_sft.py", args, tmp_path / "probe_dead", PROBE_KILL_RANK="1", PROBE_KILL_STEP="3")
    assert dead.returncode != 0
    assert (run_dir / "checkpoints" / "02_sft" / "checkpoint-2").is_dir()  # outside the stage folder (lab.train.checkpoints)
    assert not (run_dir / "02_sft" / "metrics.json").exists()  # the stage did not finish
    again = run("train_sft.py", args, tmp_path / "probe_again")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    metrics = json.loads((run_dir / "02_sft" / "metrics.json").read_text())
    assert metrics["resumed_from"].endswith("checkpoint-2") and metrics["steps"] == 4
    assert max_abs(adapter(run_dir), adapter(sft_runs / "two")) <= TOL
    full = probes(sft_runs / "probe_two")
    for rank, rec in enumerate(probes(tmp_path / "probe_again")):
        assert rec["batches"] == full[rank]["batches"][2:]  # each rank continues with its own next examples


@pytest.mark.slow
def test_grpo_under_two_processes(sft_runs):
    """train_grpo.py from the 2-process SFT adapter: each rank samples its own prompts' groups, rank 0 writes."""
    run_dir = sft_runs / "two"
    out = run("train_grpo.py", [f"run_dir={run_dir}", *GRPO], sft_runs / "probe_grpo")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    metrics = json.loads((run_dir / "03_grpo" / "metrics.json").read_text())
    assert metrics["processes"] == 2
    r0, r1 = probes(sft_runs / "probe_grpo")
    assert len(r0["batches"]) == len(r1["batches"]) == 2
    for b0, b1 in zip(r0["batches"], r1["batches"]):
        assert len(b0) == len(b1) == 4  # 2 prompts x 2 generations per rank and step
        assert not set(b0) & set(b1)
    assert not [p for p in r1["replaced"] if p.startswith(str(run_dir))]
    assert str(run_dir / ".03_grpo.partial" / "adapter") in r0["replaced"]  # the working folder, swapped in at finish
    assert (run_dir / "03_grpo" / "adapter").is_dir()


@pytest.mark.slow
def test_fsdp2_on_cpu_shards_the_model_and_the_lora_head_matches(tmp_path):
    """torch's FSDP2 (`fully_shard`) on CPU/gloo: the lm_head LoRA's fused head equals the unsharded reference."""
    from lab.core import config
    from lab.model import models

    models.model_path(config.compose([f"run_dir={tmp_path}", f"model.path={tmp_path / 'base_model'}"]))
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                          str(_port()), str(ROOT / "tests" / "fsdp2_probe.py"), str(tmp_path)],
                         cwd=ROOT, env=_env(tmp_path / "probe"), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    ranks = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("fsdp2_rank*.json"))]
    assert sorted(r["rank"] for r in ranks) == [0, 1]
    for r in ranks:
        assert r["sharded"]
        assert r["head_as_linear_max_abs"] <= TOL and r["grad_max_abs"] <= 1e-5
        assert abs(r["loss"] - r["ref_loss"]) <= 1e-5


def test_tensor_parallel_size_reaches_vllm_and_the_scorer_keeps_one(monkeypatch):
    """`infer.tensor_parallel_size=4` (local evaluation on 4 GPUs) is what lab.model.generate hands vLLM's engine; the
    scoring settings (the `competition` node, lab/core/schema.py) keep the scorer's 1; 0 is refused."""
    import types

    from lab.core import config
    from lab.model import generate

    seen = {}
    vllm = types.ModuleType("vllm")
    vllm.LLM = lambda **kw: seen.update(kw)  # records the engine's keywords; nothing runs
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    generate.vllm_engine(config.compose(["infer.tensor_parallel_size=4"]), "/models/x")
    assert seen["tensor_parallel_size"] == 4 and seen["gpu_memory_utilization"] == 0.85
    assert config.compose(["infer.tensor_parallel_size=4"]).competition.tensor_parallel_size == 1
    with pytest.raises(LabError, match="tensor_parallel_size"):
        config.compose(["infer.tensor_parallel_size=0"])
