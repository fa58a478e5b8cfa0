"""lab.train.rollouts without vLLM (the real engine is in tests/vllm_lane/test_vllm_rollouts.py): the round folders
are the submission's packing of the in-memory adapter, keyed by step and weights, reused for the same weights and
pruned to the last two; TRL's repeated prompt slice is split into groups or refused."""

from __future__ import annotations

import json
import sys

import pytest

torch = pytest.importorskip("torch")

from lab import LabError  # noqa: E402
from lab.core import config  # noqa: E402
from lab.model import lora, models  # noqa: E402
from lab.train import rollouts  # noqa: E402


@pytest.fixture(scope="module")
def trainee(tmp_path_factory):
    root = tmp_path_factory.mktemp("rollouts")
    cfg = config.compose([f"run_dir={root}", f"model.path={root / 'base_model'}", "grpo.rollout_backend=vllm"])
    model, tok = models.load(cfg)
    pm, _ = lora.attach_lora(cfg, model)
    return cfg, pm, tok, root


def test_round_folders_are_the_packed_adapter_keyed_by_step_and_weights(trainee, tmp_path):
    cfg, pm, tok, _ = trainee
    ro = rollouts.VLLMRollouts(cfg, pm, tok, tmp_path, budget=12)
    assert "vllm" not in sys.modules  # nothing of vLLM until an engine is built
    first = ro.pack("step000000")
    assert sorted(p.name for p in first.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    conf = json.loads((first / "adapter_config.json").read_text())
    assert conf["inference_mode"] is True and conf["target_parameters"] is None  # pack's per-expert form for vLLM
    from safetensors import safe_open

    with safe_open(str(first / "adapter_model.safetensors"), "pt") as f:
        keys = list(f.keys())
    assert any(".experts.0.up_proj.lora_A" in k for k in keys) and not any("lora_A.default" in k for k in keys)
    stamp = (first / "adapter_model.safetensors").stat().st_mtime_ns
    assert ro.pack("step000000") == first and (first / "adapter_model.safetensors").stat().st_mtime_ns == stamp
    with torch.no_grad():  # the adapter moves: a new folder, keyed by the new checksum
        next(p for n, p in pm.named_parameters() if "lora_B" in n).add_(0.01)
    second = ro.pack("step000001")
    assert second.parent != first.parent and second.parent.name.split("-")[1] != first.parent.name.split("-")[1]
    assert first.parent.is_dir()  # the last two rounds are kept
    with torch.no_grad():
        next(p for n, p in pm.named_parameters() if "lora_B" in n).add_(0.01)
    third = ro.pack("step000002")
    assert not first.parent.exists() and second.parent.is_dir() and third.parent.is_dir()
    assert sorted(p.name for p in (tmp_path / "rollouts").iterdir() if not p.name.startswith(".")) == \
        sorted([second.parent.name, third.parent.name])


def test_groups_split_trls_repeated_prompts_and_refuse_anything_else():
    assert rollouts.groups(["a", "a", "b", "b", "a", "a"], 2) == ["a", "b", "a"]  # a prompt scheduled twice: two groups
    with pytest.raises(LabError, match="do not split into groups of num_generations=2"):
        rollouts.groups(["a", "a", "b"], 2)
    with pytest.raises(LabError, match="prompts differ"):
        rollouts.groups(["a", "b", "b", "b"], 2)


def test_engine_phase_moves_nothing_without_the_switch(trainee):
    _, pm, _, _ = trainee

    class Engine:
        calls = []

        def wake_up(self):
            self.calls.append("wake")

        def sleep(self, level=1):
            self.calls.append(f"sleep{level}")

    timings = {}
    with rollouts.engine_phase(pm, Engine(), switch=False, timings=timings):
        pass
    assert Engine.calls == [] and timings == {"switch_s": 0.0}


def test_wake_reloads_the_weights_between_the_two_wake_ups_at_level_2():
    """Level 1: one wake_up. Level 2 (the weights were discarded): the weights' memory, the reload from the model
    folder, then the KV cache; the reload's seconds are kept (vllm/entrypoints/llm.py wake_up tags). The stand-in's
    methods bind every call to vLLM 0.33's LLM.wake_up / LLM.collective_rpc (tests/real_signatures.py)."""
    import real_signatures as rs

    class Engine:
        def __init__(self):
            self.calls = []

        wake_up = rs.stand_in("LLM.wake_up", method=True,
                              body=lambda self, tags=None: self.calls.append(("wake_up", tuple(tags) if tags else None)))
        collective_rpc = rs.stand_in("LLM.collective_rpc", method=True,
                                     body=lambda self, method, *a, **k: self.calls.append(("rpc", method)))

    one, two, timings = Engine(), Engine(), {}
    rollouts.wake(one, 1, timings)
    assert one.calls == [("wake_up", None)] and "reload_s" not in timings
    rollouts.wake(two, 2, timings)
    assert two.calls == [("wake_up", ("weights",)), ("rpc", "reload_weights"), ("wake_up", ("kv_cache",))]
    assert timings["reload_s"] >= 0


def test_the_sleep_level_follows_the_hosts_memory():
    """Null: level 1 only where the host holds the bf16 weights twice (+ the margin), else 2; a host that cannot
    hold them once is refused before anything loads; an explicit level wins."""
    from lab.core.config import compose
    from lab.plan import grpo_policy

    cfg = compose(["grpo.rollout_backend=vllm"])
    w = 58.8
    assert grpo_policy.sleep_level(cfg, host=2 * w + grpo_policy.HOST_MARGIN_GIB, weights_gib=w)[0] == 1
    assert grpo_policy.sleep_level(cfg, host=128, weights_gib=w)[0] == 2  # a 128 GiB H100 machine
    with pytest.raises(LabError, match="holds the 58.8 GiB of bf16 weights in it at least once"):
        grpo_policy.sleep_level(cfg, host=64, weights_gib=w)
    assert grpo_policy.sleep_level(compose(["grpo.vllm_sleep_level=1"]), host=128, weights_gib=w) == (
        1, "grpo.vllm_sleep_level=1")


def test_a_bf16_model_packs_its_rounds_in_bf16(trainee, tmp_path):
    """vLLM casts a LoRA to the model's dtype when it loads it (lora_dtype auto), so a bf16 model's rounds are packed
    in bf16, as the submission is (half the bytes, the same weights served); the fp32 tiny model packs as trained."""
    from safetensors.torch import load_file

    cfg, pm, tok, _ = trainee
    fp32 = rollouts.VLLMRollouts(cfg, pm, tok, tmp_path / "a", budget=12).pack("step000000")
    bf16 = rollouts.VLLMRollouts(config.compose([*[f"{k}={v}" for k, v in (("run_dir", cfg.run_dir),
                                                                          ("model.path", cfg.model.path))],
                                                 "model.dtype=bfloat16"]), pm, tok, tmp_path / "b",
                                 budget=12).pack("step000000")
    a, b = (load_file(str(d / "adapter_model.safetensors")) for d in (fp32, bf16))
    assert a.keys() == b.keys() and {v.dtype for v in a.values()} == {torch.float32}
    assert {v.dtype for v in b.values()} == {torch.bfloat16}
    assert all(torch.equal(b[k], a[k].to(torch.bfloat16)) for k in a)


@pytest.mark.parametrize("own", [True, False])
def test_the_pass_rates_get_an_engine_of_their_own_shut_down_before_the_first_round(trainee, tmp_path, monkeypatch,
                                                                                    own):
    """Where `separate_pass_engine` says so, the pass rates' engine is built at their phase's share and sequences and
    shut down when they end; the first round builds the rounds' engine. Negative control (own=False): one engine,
    the rounds', built for the pass rates and kept up for the rounds."""
    from types import SimpleNamespace

    from lab.plan import grpo_policy

    cfg, pm, tok, _ = trainee
    cfg = config.compose([*trainee_overrides(trainee), "grpo.vllm_gpu_memory_utilization=null"])
    built, shut = [], []

    def engine(cfg, path, **kw):  # stands for lab.model.generate.vllm_engine: records what it was asked for
        built.append((kw["gpu_memory_utilization"], kw["max_num_seqs"]))
        return SimpleNamespace(llm_engine=SimpleNamespace(engine_core=SimpleNamespace(
            shutdown=lambda: shut.append(len(built)))))

    monkeypatch.setattr(rollouts.generate, "vllm_engine", engine)
    monkeypatch.setattr(rollouts, "separate_pass_engine", lambda cfg: own)
    monkeypatch.setattr(grpo_policy, "engine_share", lambda cfg, phase="rounds": {"rounds": 0.88,
                                                                                   "pass_rates": 0.90}[phase])
    monkeypatch.setattr(grpo_policy, "rollout_seqs", lambda cfg, phase="rounds": {"rounds": 120,
                                                                                   "pass_rates": 144}[phase])
    monkeypatch.setattr(rollouts.generate.Generator, "serving", staticmethod(lambda *a: "a generator"))
    ro = rollouts.VLLMRollouts(cfg, pm, tok, tmp_path, budget=12)
    ro.cuda = True  # the switch stays off (set at construction): nothing moves between CPU and GPU here
    monkeypatch.setattr(ro, "_serve", lambda path, name: None)
    with ro.pass_rate_generator() as gen:
        assert gen == "a generator" and built == [(0.90, 144) if own else (0.88, 120)] and not shut
    ro._round("step000000", lambda: None)
    if own:
        assert shut == [1] and built == [(0.90, 144), (0.88, 120)]
    else:
        assert not shut and built == [(0.88, 120)]


def trainee_overrides(trainee) -> list[str]:
    _, _, _, root = trainee
    return [f"run_dir={root}", f"model.path={root / 'base_model'}", "grpo.rollout_backend=vllm"]


def test_a_started_engine_says_what_its_pool_holds(trainee, capsys):
    """`engine_pool` reads vLLM's cache_config from the started engine (a stand-in with those attributes) and prints
    the pool against what was asked; an engine that does not say gives None and a line."""
    from types import SimpleNamespace

    cfg = config.compose(["model=nemotron_nano", "experiment=competition", "data=competition", "gpu=h100_80gb"])
    llm = SimpleNamespace(llm_engine=SimpleNamespace(vllm_config=SimpleNamespace(
        cache_config=SimpleNamespace(num_gpu_blocks=700, block_size=2096))))
    pool = rollouts.engine_pool(cfg, llm, 120, "rounds")
    assert pool["sequences"] == 110 and "FEWER than asked" in capsys.readouterr().out
    assert rollouts.engine_pool(cfg, SimpleNamespace(), 120, "rounds") is None
    assert "did not report" in capsys.readouterr().out
