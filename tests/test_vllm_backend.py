"""The vLLM generation back-end (`lab.model.generate`) against vLLM 0.33's real signatures (no vllm needed).

The name sets below were recorded from the vLLM 0.33.0 source distribution on PyPI
(`pip download vllm==0.33.0 --no-deps --no-binary :all:`, PKG-INFO `Version: 0.33.0`):
  vllm/entrypoints/llm.py      LLM.__init__(self, model, *, ...named..., **kwargs); kwargs go to EngineArgs
  vllm/engine/arg_utils.py     the EngineArgs dataclass fields (259 in all; those the lab may use below)
  vllm/sampling_params.py      SamplingParams (msgspec.Struct) fields
  vllm/lora/request.py         LoRARequest(lora_name, lora_int_id, lora_path="", ...); id must be >= 1
  vllm/config/lora.py          MaxLoRARanks = Literal[1, 8, 16, 32, 64, 128, 256, 320, 512]
  vllm/v1/engine/__init__.py   FINISH_REASON_STRINGS = ("stop", "length", "abort", "error", "repetition")
  vllm/sampling_params.py      _verify_greedy_sampling: temperature < 1e-5 with n > 1 raises
If the GPU extra moves to another vLLM, re-record these from that version's source.
A real vLLM engine (vLLM's CPU build, 0.32.0) serves the lab's adapters in tests/vllm_lane/ (`make test-vllm`):
reading its outputs, log-probabilities, greedy with n > 1, closing the engine and the packed adapter are checked
there, not against the stand-in module below, which remains for the lab's own guards only.
"""

from __future__ import annotations

import ast
import sys
import types
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parent.parent

VLLM_LLM_PARAMS = {  # LLM.__init__: `model` positional-or-keyword, the rest keyword-only
    "model", "runner", "convert", "tokenizer", "tokenizer_mode", "skip_tokenizer_init", "trust_remote_code",
    "allowed_local_media_path", "allowed_media_domains", "tensor_parallel_size", "dtype", "quantization", "revision",
    "tokenizer_revision", "chat_template", "seed", "gpu_memory_utilization", "cpu_offload_gb", "offload_group_size",
    "offload_num_in_group", "offload_prefetch_step", "offload_params", "enforce_eager", "enable_return_routed_experts",
    "return_sampling_mask", "disable_custom_all_reduce", "hf_token", "hf_overrides", "mm_processor_kwargs",
    "pooler_config", "structured_outputs_config", "profiler_config", "attention_config", "kv_cache_memory_bytes",
    "compilation_config", "quantization_config", "logits_processors", "spec_method", "spec_model", "spec_tokens",
}
VLLM_ENGINE_ARGS = {  # a subset of EngineArgs fields, each checked present in 0.33.0
    "enable_lora", "max_loras", "max_lora_rank", "max_cpu_loras", "lora_dtype", "max_model_len", "max_num_seqs",
    "max_num_batched_tokens", "max_logprobs", "enable_prefix_caching", "enable_chunked_prefill", "enable_sleep_mode",
    "enforce_eager", "kv_cache_dtype", "mamba_ssm_cache_dtype", "seed", "dtype", "trust_remote_code",
    "tensor_parallel_size", "gpu_memory_utilization", "distributed_executor_backend",
    # GRPO's rollout engine (lab.train.rollouts); in 0.33.0's EngineArgs too (vllm/engine/arg_utils.py: these sets
    # are held to the pinned source by tests/test_gpu_signatures.py); TRL 1.15 passes it to vLLM too
    "logprobs_mode",
    "load_format",  # lab calibrate: "dummy", random weights (vllm/model_executor/model_loader/dummy_loader.py)
}
VLLM_SAMPLING_PARAMS = {
    "n", "presence_penalty", "frequency_penalty", "repetition_penalty", "temperature", "watermarking", "top_p", "top_k",
    "min_p", "seed", "stop", "stop_token_ids", "ignore_eos", "max_tokens", "min_tokens", "logprobs", "prompt_logprobs",
    "prompt_logprob_token_ids", "prompt_logprob_start", "logprob_token_ids", "flat_logprobs", "detokenize",
    "skip_special_tokens", "spaces_between_special_tokens", "include_stop_str_in_output", "output_kind",
    "stream_interval", "skip_clone", "output_text_buffer_length", "structured_outputs", "logit_bias",
    "allowed_token_ids", "extra_args", "bad_words", "skip_reading_prefix_cache", "thinking_token_budget",
    "repetition_detection", "routed_experts_prompt_start", "trace_decode_token_ids",
}
VLLM_LORA_REQUEST = {"lora_name", "lora_int_id", "lora_path", "base_model_name", "load_inplace", "is_3d_lora_weight"}
VLLM_MAX_LORA_RANKS = {1, 8, 16, 32, 64, 128, 256, 320, 512}
VLLM_MODEL_DTYPES = {"auto", "half", "float16", "bfloat16", "float", "float32"}
VLLM_FINISH_REASONS = {"stop", "length", "abort", "error", "repetition"}

ALLOWED = {"LLM": VLLM_LLM_PARAMS | VLLM_ENGINE_ARGS, "SamplingParams": VLLM_SAMPLING_PARAMS,
           "LoRARequest": VLLM_LORA_REQUEST}


def _vllm_calls() -> dict[str, list[ast.Call]]:
    """Calls to LLM / SamplingParams / LoRARequest anywhere in lab/model/generate.py."""
    tree = ast.parse((ROOT / "lab" / "model" / "generate.py").read_text(encoding="utf-8"))
    calls: dict[str, list[ast.Call]] = {name: [] for name in ALLOWED}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name in calls:
                calls[name].append(node)
    return calls


def test_vllm_keyword_names_match_0_33_signatures():
    calls = _vllm_calls()
    for name, found in calls.items():
        assert found, f"lab/model/generate.py no longer calls {name}"
        for call in found:
            assert not call.args, f"{name}(...) at line {call.lineno}: pass keywords, not positional arguments"
            kws = {k.arg for k in call.keywords}
            assert None not in kws, f"{name}(**...) at line {call.lineno}: spell the keywords out"
            unknown = kws - ALLOWED[name]
            assert not unknown, f"{name}(...) at line {call.lineno}: {sorted(unknown)} not in vLLM 0.33's signature"


def test_engine_settings_are_values_vllm_accepts():
    from lab.core.config import compose

    cfg = compose(["model=nemotron_nano"])
    assert int(cfg.infer.max_lora_rank) in VLLM_MAX_LORA_RANKS
    assert int(cfg.sft.lora.r) <= int(cfg.infer.max_lora_rank)
    assert str(cfg.model.dtype) in VLLM_MODEL_DTYPES
    assert str(compose([]).model.dtype) in VLLM_MODEL_DTYPES


# ------------------------------------------------------------------------------------------------
# generate_vllm / vllm_engine / Generator with a stand-in vllm module
# ------------------------------------------------------------------------------------------------

class _Rec:
    def __init__(self, **kw):
        self.kw = kw


def _fake_vllm(monkeypatch, outputs):
    seen = {}

    class SamplingParams(_Rec):
        def __init__(self, **kw):
            assert set(kw) <= VLLM_SAMPLING_PARAMS
            super().__init__(**kw)
            seen["params"] = kw

    class LLM:
        def __init__(self, **kw):
            assert set(kw) <= VLLM_LLM_PARAMS | VLLM_ENGINE_ARGS
            seen["engine"] = kw
            if "on_engine" in seen:
                seen["on_engine"](kw)

        def generate(self, prompts, params, lora_request=None):
            seen["generate"] = (prompts, params, lora_request)
            return outputs(prompts, params, lora_request) if callable(outputs) else outputs

    class LoRARequest(_Rec):
        def __init__(self, **kw):
            assert set(kw) <= VLLM_LORA_REQUEST and kw["lora_int_id"] >= 1 and kw["lora_path"]
            super().__init__(**kw)

    vllm = types.ModuleType("vllm")
    vllm.LLM, vllm.SamplingParams = LLM, SamplingParams
    lora = types.ModuleType("vllm.lora")
    req = types.ModuleType("vllm.lora.request")
    req.LoRARequest = LoRARequest
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.lora", lora)
    monkeypatch.setitem(sys.modules, "vllm.lora.request", req)
    return seen


def _lp(v):
    return types.SimpleNamespace(logprob=v, rank=1, decoded_token=None)


def _out(text, token_ids, logprobs, reason):
    return types.SimpleNamespace(text=text, token_ids=token_ids, logprobs=logprobs, finish_reason=reason,
                                 cumulative_logprob=None)


def test_generate_vllm_refuses_unfinished_requests(monkeypatch):
    """A request vLLM ends with abort/error is not a result. (Reading real outputs, logprobs, greedy with n > 1 and
    closing the engine run against a real vLLM engine in tests/vllm_lane/.)"""
    from lab.model.generate import Sampling, generate_vllm

    _fake_vllm(monkeypatch, [types.SimpleNamespace(request_id="7", outputs=[_out("", [1], None, "abort")])])
    with pytest.raises(RuntimeError, match="abort"):
        generate_vllm(sys.modules["vllm"].LLM(model="m"), ["p"], Sampling(max_tokens=4))


def test_generator_vllm_branch(monkeypatch, tmp_path):
    from lab.model import generate, models
    from lab import LabError
    from lab.core.config import compose

    seen = _fake_vllm(monkeypatch, [])
    monkeypatch.setattr(models, "load_tokenizer", lambda cfg: "TOK")
    monkeypatch.setattr(models, "model_path", lambda cfg: "/models/nemotron")
    cfg = compose(["model=nemotron_nano"])
    g = generate.Generator(cfg)
    e = seen["engine"]
    assert e["model"] == "/models/nemotron" and e["enable_lora"] is True and e["max_lora_rank"] == 32
    assert e["max_model_len"] == 8192 and e["seed"] == int(cfg.seed) and e["dtype"] == "bfloat16"
    assert g.lora is None
    g.close()  # closing a real engine: tests/vllm_lane/
    assert g.llm is None
    with pytest.raises(LabError, match="closed"):
        g.run(["p"])

    tiny = compose(["model.generation_backend=vllm"])
    generate.Generator(tiny)
    assert seen["engine"]["max_model_len"] == int(tiny.model.max_model_len) < int(tiny.infer.max_model_len)

    # nothing that is not an adapter reaches vLLM, and no engine starts for it
    del seen["engine"]
    for bad in (tmp_path / "missing", tmp_path):
        with pytest.raises(LabError, match="not a LoRA adapter"):
            generate.Generator(cfg, adapter=bad)
    assert "engine" not in seen


def test_generator_passes_the_sampling_spec_to_vllm_capped_by_the_budget(monkeypatch):
    """What the caller's `Sampling` says reaches SamplingParams; max_tokens is capped by `completion_budget`;
    greedy with n > 1 asks vLLM for one completion and repeats it."""
    from lab.model import generate, models
    from lab.core.config import compose

    def outputs(prompts, params, lora_request):
        return [types.SimpleNamespace(request_id=str(i), outputs=[_out("x", [1, 2], None, "stop")] * params.kw["n"])
                for i in range(len(prompts))]

    seen = _fake_vllm(monkeypatch, outputs)
    words = lambda text, add_special_tokens=False: {"input_ids": text.split()}  # noqa: E731 - a word tokenizer
    monkeypatch.setattr(models, "load_tokenizer", lambda cfg: words)
    monkeypatch.setattr(models, "model_path", lambda cfg: "/models/nemotron")
    cfg = compose(["model.generation_backend=vllm"])
    gen = generate.Generator(cfg)
    prompt = "one two three"
    spec = generate.Sampling(max_tokens=10**6, n=3, temperature=0.7, top_p=0.8, seed=5, logprobs=True)
    assert len(gen.run([prompt], spec)[0]) == 3
    assert seen["params"] == {"n": 3, "temperature": 0.7, "top_p": 0.8, "seed": 5, "logprobs": 0,
                              "max_tokens": int(cfg.model.max_model_len) - 3}
    greedy = gen.run([prompt], generate.Sampling.competition(cfg, n=4, max_tokens=7))
    assert seen["params"]["n"] == 1 and seen["params"]["max_tokens"] == 7 and len(greedy[0]) == 4
    assert seen["params"]["temperature"] == cfg.infer.temperature == 0 and seen["params"]["seed"] == cfg.seed


def test_vllm_never_scores_an_in_memory_model(monkeypatch):
    """vLLM loads the base model itself: a model passed in would be silently replaced, so it is refused."""
    from lab.model import generate
    from lab import LabError
    from lab.core.config import compose

    seen = _fake_vllm(monkeypatch, [])
    with pytest.raises(LabError, match="in-memory model"):
        generate.Generator(compose(["model.generation_backend=vllm"]), model=object(), tokenizer=object())
    assert "engine" not in seen
    with pytest.raises(LabError, match="both"):  # hf: a model and an adapter would leave one of them unused
        generate.Generator(compose([]), adapter="x", model=object())


def test_vllm_refuses_to_start_while_a_model_holds_the_gpu(monkeypatch):
    import torch

    from lab.model import generate
    from lab import LabError
    from lab.core.config import compose

    seen = _fake_vllm(monkeypatch, [])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: 60 * 2**30)
    with pytest.raises(LabError, match="60.0 GB"):
        generate.Generator(compose(["model.generation_backend=vllm"]))
    assert "engine" not in seen


def _split_expert_names(folder: Path) -> tuple[set, set]:
    from safetensors import safe_open

    with safe_open(str(folder / "adapter_model.safetensors"), "pt") as f:
        names = set(f.keys())
    fused = {n for n in names if ".experts.lora_" in n or ".experts.base_layer." in n}
    split = {n for n in names if ".experts.0.up_proj.lora_A" in n or ".experts.0.down_proj.lora_B" in n}
    return fused, split


@pytest.mark.slow
def test_training_script_gives_vllm_the_packed_adapter_after_releasing_the_model(monkeypatch, tmp_path):
    """scripts/train_sft.py on the tiny model with the vllm back-end, vLLM replaced by a recorder: when the engine
    starts, the training model is gone (a weak reference to it is dead); the adapter vLLM is given is the folder
    of the packed zip (experts split per expert), byte for byte what `lab.model.submission.pack` writes for the trained
    adapter; the evaluation's predictions come from that engine."""
    import gc
    import weakref
    import zipfile

    from lab.train import sft
    from lab.model import submission
    from lab.runs.pipeline import SMOKE_OVERRIDES

    trained, seen = [], {}
    real_train = sft.train

    def outputs(prompts, params, lora_request):
        if lora_request is not None:  # None: the base model's evaluation before training
            path = Path(lora_request.kw["lora_path"])
            seen.setdefault("served", []).append({p.name: p.read_bytes() for p in path.iterdir()})
            seen["fused"], seen["split"] = _split_expert_names(path)
        return [types.SimpleNamespace(request_id=str(i), outputs=[_out("\\boxed{0}", [1, 2], None, "stop")])
                for i in range(len(prompts))]

    real_model_with_lora = sft.model_with_lora

    def without_fake_vllm():
        for name in ("vllm", "vllm.lora", "vllm.lora.request"):  # TRL probes for a real vllm while it trains
            monkeypatch.delitem(sys.modules, name, raising=False)

    def load_spy(*a, **kw):  # the training model loads before `train` (lab.recipes.sft.sft_model): TRL probes there too
        without_fake_vllm()
        return real_model_with_lora(*a, **kw)

    def spy(*a, **kw):
        without_fake_vllm()
        out = real_train(*a, **kw)
        trained.append(weakref.ref(out.model))
        # the stand-in appears only now: TRL probes for a real vllm package while it trains
        rec = _fake_vllm(monkeypatch, outputs)
        rec["on_engine"] = lambda kw: seen.update(model_alive_at_engine_start=trained[0]() is not None)
        return out

    monkeypatch.setattr(sft, "train", spy)
    monkeypatch.setattr(sft, "model_with_lora", load_spy)
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import train_sft

    run = tmp_path / "run"
    _fake_vllm(monkeypatch, outputs)  # the base model's evaluation, before training (lab.recipes.sft.sft)
    assert train_sft.main([f"run_dir={run}", "model.generation_backend=vllm", "sft.lora.r=8",
                           *SMOKE_OVERRIDES]) == 0
    gc.collect()
    assert seen["model_alive_at_engine_start"] is False
    assert trained[0]() is None
    assert not seen["fused"] and seen["split"], "vLLM 0.33 was given fused expert keys"
    ref = submission.pack(run / "02_sft" / "adapter", tmp_path / "ref.zip")
    with zipfile.ZipFile(ref) as z:
        packed = {n: z.read(n) for n in z.namelist()}
    assert seen["served"] and all(s == packed for s in seen["served"])
    assert sorted(packed) == ["adapter_config.json", "adapter_model.safetensors"]
    pred = pd.read_csv(run / "02_sft" / "predictions.csv")
    assert len(pred) == 4 and set(pred["answer"].astype(str)) == {"0"}

    # a packed zip (what Kaggle scores) is served as it is; the unzipped folder goes away with the generator
    from lab.model import generate

    from lab.core.config import load_saved

    cfg = load_saved(run / "02_sft" / "config.yaml")  # the stage's resolved config, typed by lab/core/schema.py
    with generate.Generator(cfg, adapter=ref) as gen:
        served = Path(gen.lora.kw["lora_path"])
        assert {p.name: p.read_bytes() for p in served.iterdir()} == packed
    assert not served.exists()

    # scripts/train_grpo.py from that SFT adapter: the same order and the same packed form
    from lab.train import grpo

    real_grpo = grpo.GrpoRun.train

    def grpo_spy(*a, **kw):
        for name in ("vllm", "vllm.lora", "vllm.lora.request"):  # TRL probes for a real vllm while it trains
            monkeypatch.delitem(sys.modules, name, raising=False)
        out = real_grpo(*a, **kw)
        trained.append(weakref.ref(out.model))
        rec = _fake_vllm(monkeypatch, outputs)
        rec["on_engine"] = lambda kw: seen.update(grpo_model_alive_at_engine_start=trained[-1]() is not None)
        return out

    monkeypatch.setattr(grpo.GrpoRun, "train", grpo_spy)
    import train_grpo

    seen.pop("served")
    assert train_grpo.main([f"run_dir={run}", "model.generation_backend=vllm", "sft.lora.r=8",
                            *SMOKE_OVERRIDES]) == 0
    gc.collect()
    assert seen["grpo_model_alive_at_engine_start"] is False and trained[-1]() is None
    with zipfile.ZipFile(submission.pack(run / "03_grpo" / "adapter", tmp_path / "ref_grpo.zip")) as z:
        assert seen["served"] == [{n: z.read(n) for n in z.namelist()}]
    assert not seen["fused"] and seen["split"]
