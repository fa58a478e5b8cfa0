"""Every call the lab makes into a GPU-only package or a CUDA-only torch API, bound to the pinned version's real
signature on the CPU (tests/real_signatures.py: the pinned packages' own sources, `make gpu-sources`).

Each call is captured where the lab makes it (the lab's own code runs against stand-ins built from the real
signatures), and each has a negative control: the same call with a keyword misspelled fails, or, for the Mamba
kernels (transformers' wrapper drops keywords the kernel does not name), a kernel whose `seq_idx` is spelled
otherwise is reported as dropping it. torch's `varlen_attn` runs for real, forward and backward, on meta tensors.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import types

import pytest

torch = pytest.importorskip("torch")

import real_signatures as rs  # noqa: E402

from lab.core import config  # noqa: E402
from lab.model import lora, packed_rows  # noqa: E402

ROOT = rs.ROOT


# ---- torch: varlen_attn, exactly as packed_rows calls it ------------------------------------------------------------

def _meta_qkv(T=4096, hq=32, hkv=2, d=128):
    """Query / key / value at Nemotron-3-Nano's attention shapes (32 query heads, 2 key-value heads, 128 wide) on the
    meta device: nothing is computed or allocated."""
    q = torch.empty(1, hq, T, d, device="meta", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.empty(1, hkv, T, d, device="meta", dtype=torch.bfloat16, requires_grad=True) for _ in "kv")
    return q, k, v


def _seq_idx(lengths):
    return torch.cat([torch.full((n,), i, dtype=torch.int32) for i, n in enumerate(lengths)])[None]


def test_varlen_attn_runs_forward_and_backward_on_meta_as_packed_rows_calls_it(monkeypatch):
    from torch.nn.attention.varlen import varlen_attn

    calls = []
    monkeypatch.setattr(packed_rows, "VARLEN_ATTN", rs.stand_in("varlen_attn", varlen_attn, calls))
    q, k, v = _meta_qkv()
    module = types.SimpleNamespace(_packed_force_varlen=True)  # the CUDA branch
    out, _ = packed_rows.packed_attention_forward(module, q, k, v, None, scaling=0.088,
                                                  seq_idx=_seq_idx([1000, 2500, 596]))
    assert out.shape == (1, 4096, 32, 128) and out.device.type == "meta"
    out.float().sum().backward()  # torch's registered autograd of _varlen_attn, on meta
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape
    (call,) = calls
    a = call.bound.arguments
    assert a["window_size"] == (-1, 0) and a["enable_gqa"] is True and a["max_q"] == a["max_k"] == 2500
    assert a["cu_seq_q"].dtype == torch.int32 and a["cu_seq_q"].device.type == "meta"
    assert (signature := inspect.signature(varlen_attn)) == rs.signature("varlen_attn") and "is_causal" not in \
        signature.parameters  # torch 2.10 spelled causality is_causal; 2.13's varlen_attn takes window_size


def test_varlen_attn_negative_control_a_misspelled_keyword_fails(monkeypatch):
    from torch.nn.attention.varlen import varlen_attn

    calls = []
    monkeypatch.setattr(packed_rows, "VARLEN_ATTN", rs.stand_in("varlen_attn", varlen_attn, calls))
    q, k, v = _meta_qkv(T=64)
    packed_rows.packed_attention_forward(types.SimpleNamespace(_packed_force_varlen=True), q, k, v, None,
                                         seq_idx=_seq_idx([30, 34]))
    for keyword in calls[0].kwargs:
        with pytest.raises(TypeError, match="unexpected keyword"):
            rs.replay_misspelled(calls[0], keyword)
    with pytest.raises(TypeError):  # the real function itself refuses it too (not only the stand-in's binding)
        varlen_attn(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), calls[0].args[3],
                    calls[0].args[4], 34, 34, is_causal=True)


# ---- mamba_ssm and causal_conv1d, as transformers' Nemotron-H calls them with the lab's seq_idx and out_proj guard -

MAMBA = {"mamba2_split_conv1d_scan_combined": "mamba_split_conv1d_scan_combined",
         "causal_conv1d_fn": "causal_conv1d_fn", "mamba2_chunk_scan": "mamba_chunk_scan_combined"}


def _tiny_lora_model():
    from transformers import NemotronHConfig, NemotronHForCausalLM

    cfg = config.compose(["sft.lora.targets=[in_proj,out_proj,q_proj]"])
    torch.manual_seed(0)
    arch = config.OmegaConf.to_container(cfg.model.architecture, resolve=True)
    pm, _ = lora.attach_lora(cfg, NemotronHForCausalLM(NemotronHConfig(**arch)).float())  # installs the guard
    pm.train()
    return pm


def _install_kernels(monkeypatch, calls, seen, renamed: str | None = None):
    """transformers' module-level kernel functions as they are where mamba_ssm and causal_conv1d import: its hub
    wrapper over stand-ins with the pinned signatures (bodies: transformers' PyTorch paths, row boundaries ignored:
    exactness is tests/test_packed_rows.py's). `seen[name]`: the keywords the mixer handed each wrapper. `renamed`:
    the negative control, that kernel with `seq_idx` spelled `seq_idx_renamed`."""
    import transformers.models.nemotron_h.modeling_nemotron_h as mh

    guard = mh.__dict__[lora.FUSED_FN]
    assert isinstance(guard, lora._FusedScanGuard)
    fallback = {"mamba2_split_conv1d_scan_combined": guard.inner, "causal_conv1d_fn": mh.causal_conv1d_fn,
                "mamba2_chunk_scan": mh.mamba2_chunk_scan}
    torch_conv, torch_scan = (getattr(fallback[n], "__wrapped__", fallback[n])
                              for n in ("causal_conv1d_fn", "mamba2_chunk_scan"))
    bodies = {
        "mamba2_split_conv1d_scan_combined": None,  # None: "no fused result", the mixer goes on to conv and scan
        "causal_conv1d_fn": lambda x, w, b=None, seq_idx=None, activation=None, **k: torch_conv(x, w, b, activation),
        "mamba2_chunk_scan": lambda *a, seq_idx=None, z=None, **k: torch_scan(*a, **k),
    }
    for attr, name in MAMBA.items():
        sig = rs.signature(name)
        if name == renamed:
            sig = sig.replace(parameters=[p.replace(name="seq_idx_renamed") if p.name == "seq_idx" else p
                                          for p in sig.parameters.values()])
        wrapped = rs.hub_kernel(monkeypatch, name, fallback[attr], bodies[attr], calls, sig=sig)

        def spy(*a, _w=wrapped, _n=attr, **k):
            seen.setdefault(_n, []).append(set(k))
            return _w(*a, **k)
        spy.__wrapped__ = wrapped  # packed_rows._takes_seq_idx reads the wrapper's applicable_params through it
        if attr == lora.FUSED_FN:
            monkeypatch.setattr(guard, "inner", spy)
        else:
            monkeypatch.setattr(mh, attr, spy)


def _takes_seq_idx_through_spy(monkeypatch):
    """packed_rows._takes_seq_idx looks through `.inner` (the guard); let it look through the spy's `__wrapped__`."""
    orig = packed_rows._takes_seq_idx
    monkeypatch.setattr(packed_rows, "_takes_seq_idx", lambda fn: orig(getattr(getattr(fn, "inner", fn),
                                                                               "__wrapped__", fn)))


def _packed_step(pm):
    lengths = [37, 90, 13]
    ids = torch.randint(5, 300, (1, sum(lengths)), generator=torch.Generator().manual_seed(0))
    pos = torch.cat([torch.arange(n) for n in lengths])[None]
    h = packed_rows.install(pm, force_kernel_path=True)
    try:
        pm(input_ids=ids, position_ids=pos, labels=ids, use_cache=False).loss.backward()
    finally:
        h.remove()
    return sum(lengths)


def test_mamba_kernel_calls_bind_to_the_pinned_signatures_with_seq_idx_and_no_out_proj(monkeypatch):
    """One packed training step with gradient checkpointing through transformers' mixer: the fused kernel (called
    by lab.model.lora's guard with `outproj_weight=None`), causal_conv1d_fn and mamba_chunk_scan_combined each bind
    to the pinned signature, receive `seq_idx` ((1, T) int32) through transformers' wrapper, and that wrapper drops
    no keyword the mixer passed (the lab and transformers spell nothing the kernels do not name)."""
    pm = _tiny_lora_model()
    pm.base_model.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    calls, seen = [], {}
    _install_kernels(monkeypatch, calls, seen)
    _takes_seq_idx_through_spy(monkeypatch)
    mixers = [m for m in pm.modules() if type(m).__name__ == packed_rows.MIXER_CLASS]
    assert all(packed_rows.kernel_functions_without_seq_idx(m) == [] for m in mixers)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    packed_rows.require_kernels(pm)  # the real model's refusal passes with the pinned kernels
    T = _packed_step(pm)
    by_name = {n: [c for c in calls if c.name == n] for n in MAMBA.values()}
    for name, got in by_name.items():
        assert len(got) == 2 * len(mixers), name  # forward and the checkpointed recomputation
        for c in got:
            s = c.bound.arguments["seq_idx"]
            assert s.dtype == torch.int32 and tuple(s.shape) == (1, T) and s.is_contiguous(), name
    for c in by_name["mamba_split_conv1d_scan_combined"]:
        assert c.bound.arguments["outproj_weight"] is None and c.bound.arguments["outproj_bias"] is None
    for attr, name in MAMBA.items():
        named = set(rs.signature(name).parameters)
        dropped = set().union(*seen[attr]) - named
        assert dropped <= {"output_attentions", "output_hidden_states"}, f"dropped before {name}: {sorted(dropped)}"


@pytest.mark.parametrize("renamed", sorted(set(MAMBA.values())))
def test_mamba_negative_control_a_kernel_without_seq_idx_is_caught(monkeypatch, renamed):
    """The same step where one kernel spells seq_idx otherwise: the wrapper drops it, the lab reports that function
    (so require_kernels refuses the real model) and the kernel receives no row boundaries."""
    pm = _tiny_lora_model()
    calls, seen = [], {}
    _install_kernels(monkeypatch, calls, seen, renamed=renamed)
    _takes_seq_idx_through_spy(monkeypatch)
    mixer = next(m for m in pm.modules() if type(m).__name__ == packed_rows.MIXER_CLASS)
    attr = next(a for a, n in MAMBA.items() if n == renamed)
    assert packed_rows.kernel_functions_without_seq_idx(mixer) == [attr]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(Exception, match="would drop seq_idx"):
        packed_rows.require_kernels(pm)
    _packed_step(pm)
    assert calls and all("seq_idx_renamed" not in c.bound.arguments for c in calls if c.name == renamed)


def test_the_benchs_real_kernel_calls_pass_seq_idx(monkeypatch):
    """lab.plan.memory's real-kernel path (`mamba=real`, the GPU bench) hands the kernels the mixer's keywords they
    name, seq_idx included (it used to drop every extra keyword), and only those."""
    import sys

    from lab.plan import memory

    calls = []
    conv = types.ModuleType("causal_conv1d")
    conv.causal_conv1d_fn = rs.stand_in("causal_conv1d_fn", calls=calls)
    ssd = types.ModuleType("mamba_ssm.ops.triton.ssd_combined")
    ssd.mamba_chunk_scan_combined = rs.stand_in("mamba_chunk_scan_combined", calls=calls)
    monkeypatch.setitem(sys.modules, "causal_conv1d", conv)
    monkeypatch.setitem(sys.modules, "mamba_ssm.ops.triton.ssd_combined", ssd)
    (scan, _), (conv_fn, label) = memory._real_kernels()
    assert label == "causal_conv1d (real kernel)"
    s = torch.zeros(1, 8, dtype=torch.int32)
    x = torch.zeros(1, 4, 8)
    conv_fn(x, torch.zeros(4, 4), None, activation="silu", seq_idx=s, output_attentions=False)  # as the mixer does
    scan(x, x, x, x, x, chunk_size=64, D=None, z=None, return_final_states=False, dt_bias=None, dt_softplus=True,
         initial_states=None, dt_limit=(0.0, float("inf")), seq_idx=s, output_attentions=False)
    assert [c.name for c in calls] == ["causal_conv1d_fn", "mamba_chunk_scan_combined"]
    assert all(c.bound.arguments["seq_idx"] is s for c in calls)
    with pytest.raises(TypeError):
        rs.replay_misspelled(calls[0], "seq_idx")


# ---- vLLM 0.33: the engine, sleep / wake / reload, LoRARequest, SamplingParams, the engine's request loop ----------

def _fake_vllm(monkeypatch, calls):
    """A `vllm` whose every class and method the lab touches binds to vLLM's pinned signatures (`rs.stand_in`); the
    `LLM(**kwargs)` keywords vLLM hands to EngineArgs bind to its fields, and `collective_rpc(method, args, kwargs)`
    binds to the worker's method and, for reload_weights, the model runner's (vllm/v1/worker/gpu_worker.py forwards
    its *args, **kwargs there)."""
    import sys

    def engine_args(self, *args, **kwargs):
        extra = rs.signature("LLM").bind(*args, **kwargs).arguments.get("kwargs", {})
        rs.check("EngineArgs", **extra)
        self.llm_engine = Engine()

    def rpc(self, method, timeout=None, args=(), kwargs=None):
        rs.stand_in(f"Worker.{method}", calls=calls)(*args, **(kwargs or {}))
        if method == "reload_weights":
            rs.stand_in("GPUModelRunner.reload_weights", calls=calls)(*args, **(kwargs or {}))
        return []

    def fields(cls):
        def init(self, *args, **kwargs):
            self.__dict__.update(rs.check(cls, *args, **kwargs).arguments)
        return init

    def m(name, body=None):
        return rs.stand_in(name, body, calls, method=True)

    Engine = type("LLMEngine", (), {
        "add_request": m("LLMEngine.add_request"), "step": m("LLMEngine.step", lambda self: []),
        "abort_request": m("LLMEngine.abort_request"),
        "has_unfinished_requests": m("LLMEngine.has_unfinished_requests", lambda self: False),
        "add_lora": m("LLMEngine.add_lora"), "remove_lora": m("LLMEngine.remove_lora")})
    LLM = type("LLM", (), {"__init__": m("LLM", engine_args), "generate": m("LLM.generate", lambda self, *a, **k: []),
                           "sleep": m("LLM.sleep"), "wake_up": m("LLM.wake_up"),
                           "collective_rpc": m("LLM.collective_rpc", rpc)})
    SamplingParams = type("SamplingParams", (), {"__init__": m("SamplingParams", fields("SamplingParams"))})
    LoRARequest = type("LoRARequest", (), {"__init__": m("LoRARequest", fields("LoRARequest"))})
    modules = {"vllm": {"LLM": LLM, "SamplingParams": SamplingParams},
               "vllm.sampling_params": {"SamplingParams": SamplingParams,
                                        "RequestOutputKind": types.SimpleNamespace(FINAL_ONLY="FINAL_ONLY")},
               "vllm.lora": {}, "vllm.lora.request": {"LoRARequest": LoRARequest}}
    for name, attrs in modules.items():
        mod = types.ModuleType(name)
        mod.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, mod)
    return LLM


VLLM_CALLS = {"LLM", "EngineArgs", "LLM.generate", "LLM.sleep", "LLM.wake_up", "LLM.collective_rpc",
              "Worker.reload_weights", "GPUModelRunner.reload_weights", "SamplingParams", "LoRARequest",
              "LLMEngine.add_request", "LLMEngine.has_unfinished_requests", "LLMEngine.abort_request",
              "LLMEngine.add_lora", "LLMEngine.remove_lora"}


def _drive_the_lab(monkeypatch, tmp_path, calls):
    """Every vLLM call of the lab, made by the lab's own code on the CUDA branch: the rollout engine
    (generate.vllm_engine as lab.train.rollouts builds it), sampling with and without the request loop, a round's
    LoRARequest served and replaced, level-1 and level-2 wake-ups (with the weights' reload) and sleep."""
    from lab.model import generate
    from lab.train import rollouts

    _fake_vllm(monkeypatch, calls)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cfg = config.compose(["model=nemotron_nano"])
    llm = generate.vllm_engine(cfg, "/models/nemotron", gpu_memory_utilization=0.45, enable_sleep_mode=True,
                               logprobs_mode="processed_logprobs")
    spec = generate.Sampling(max_tokens=16, n=4, temperature=1.0, top_p=0.95, seed=3, logprobs=True)
    generate.generate_vllm(llm, ["a", "b"], spec)
    with pytest.raises(RuntimeError, match="never finished"):  # the stand-in engine finishes nothing
        generate.generate_vllm(llm, [{"prompt_token_ids": [1, 2]}], spec, on_done=lambda i, c: None, seeds=[5])
    owner = types.SimpleNamespace(llm=llm, lora=None, _ids=itertools.count(1))
    rollouts.VLLMRollouts._serve(owner, tmp_path / "r1", "round-1")
    rollouts.VLLMRollouts._serve(owner, tmp_path / "r2", "round-2")
    rollouts.wake(llm, 2, {})
    rollouts.wake(llm, 1, {})
    rollouts._Lazy(owner).sleep(level=2)
    return {c.name for c in calls}


def test_vllm_calls_bind_to_0_33s_signatures(monkeypatch, tmp_path):
    calls = []
    names = _drive_the_lab(monkeypatch, tmp_path, calls)
    assert names | {"EngineArgs"} >= VLLM_CALLS, sorted(VLLM_CALLS - names)
    (engine,) = [c for c in calls if c.name == "LLM"]
    extra = engine.bound.arguments["kwargs"]
    assert {"enable_lora", "max_lora_rank", "enable_sleep_mode", "logprobs_mode", "enable_prefix_caching"} <= set(
        extra) and extra["enable_sleep_mode"] is True
    sleeps = [c.bound.arguments for c in calls if c.name == "LLM.sleep"]
    wakes = [c.bound.arguments.get("tags") for c in calls if c.name == "LLM.wake_up"]
    assert sleeps == [{"level": 2}] and wakes == [["weights"], ["kv_cache"], None]
    assert [c.bound.arguments["method"] for c in calls if c.name == "LLM.collective_rpc"] == ["reload_weights"]


def test_vllm_negative_control_every_call_with_a_misspelled_keyword_fails(monkeypatch, tmp_path):
    calls = []
    _drive_the_lab(monkeypatch, tmp_path, calls)
    replayed = set()
    for c in calls:
        if c.name in replayed or c.name == "Worker.reload_weights":  # (*args, **kwargs): the runner's binds them
            continue
        replayed.add(c.name)
        with pytest.raises(TypeError):
            rs.replay_misspelled(c)
    assert replayed >= VLLM_CALLS - {"EngineArgs", "Worker.reload_weights"}
    llm_class = type(next(c.args[0] for c in calls if c.name == "LLM"))
    with pytest.raises(TypeError, match="EngineArgs"):  # a keyword LLM hands on to EngineArgs, misspelled
        llm_class(model="/m", enable_sleep_mode_misspelled=True)


def test_every_vllm_constructor_call_site_in_the_lab_names_0_33s_keywords():
    """Wherever lab/ builds LLM, SamplingParams or LoRARequest, its keywords are the pinned signature's (EngineArgs'
    fields for LLM's **kwargs): a call site the driving test above does not reach is still checked."""
    accepted = {"LLM": set(rs.signature("LLM").parameters) | set(rs.signature("EngineArgs").parameters),
                "SamplingParams": set(rs.signature("SamplingParams").parameters),
                "LoRARequest": set(rs.signature("LoRARequest").parameters)}
    found = {n: 0 for n in accepted}
    for path in sorted((ROOT / "lab").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in accepted:
                kws = {k.arg for k in node.keywords}
                where = f"{path.relative_to(ROOT)}:{node.lineno}"
                assert None not in kws, f"{where}: {node.func.id}(**...): spell the keywords out"
                assert kws <= accepted[node.func.id], f"{where}: {sorted(kws - accepted[node.func.id])}"
                found[node.func.id] += 1
    assert all(found.values()), found


def test_the_name_sets_tests_test_vllm_backend_recorded_are_0_33s():
    """tests/test_vllm_backend.py checks the lab's keywords against name sets written down by hand (so it runs
    without .gpu-sources); here those sets are held to the pinned source, so they cannot drift from it."""
    import test_vllm_backend as vb

    assert vb.VLLM_LLM_PARAMS == set(rs.signature("LLM").parameters) - {"kwargs"}
    assert vb.VLLM_ENGINE_ARGS <= set(rs.signature("EngineArgs").parameters)
    assert vb.VLLM_SAMPLING_PARAMS == {p for p in rs.signature("SamplingParams").parameters if not p.startswith("_")}
    assert vb.VLLM_LORA_REQUEST == set(rs.signature("LoRARequest").parameters)
