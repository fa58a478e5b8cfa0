"""The real model's shapes on the meta device with the competition preset's LoRA, and the traced memory of one
training step (lab.plan.memory): on the tiny model the fake-tensor trace equals the same step run on real tensors.

The config values are a small fixture copied from the published config.json (tests/fixtures/); when ../shared holds
the real file, the fixture is checked against it. The 30B traces themselves (about a minute each) are in docs/memory.md,
"Traced peaks of the recipe", from `python -m lab memory`.
"""

from __future__ import annotations

import importlib.util
import json
import math

import pytest
from omegaconf import OmegaConf

torch = pytest.importorskip("torch")

from lab.plan import autocast_rules, grpo_policy, memory, shapes  # noqa: E402
from lab import LabError
from lab.core.config import compose  # noqa: E402
from lab.core.paths import project_root  # noqa: E402

FIXTURE = shapes.MEASURED_MODEL
REAL = project_root().parent / "shared" / "tokenizer" / "nemotron-3-nano" / "config.json"
PRESET = ["model=nemotron_nano", "experiment=competition", "data=competition"]


@pytest.fixture(scope="module")
def values():
    return json.loads(FIXTURE.read_text())


@pytest.fixture(scope="module")
def figures(values):
    return shapes.lora_figures(compose(PRESET), values)


def test_fixture_holds_the_published_values():
    if not REAL.is_file():
        pytest.skip(f"{REAL} absent")
    real = json.loads(REAL.read_text())
    fixture = json.loads(FIXTURE.read_text())
    assert {k: real[k] for k in fixture} == fixture


@pytest.mark.slow
def test_every_target_family_matches_with_the_expected_trainable_parameters(values, figures):
    v, r = values, 32
    pattern = v["hybrid_override_pattern"]
    n_mamba, n_att, n_moe = pattern.count("M"), pattern.count("*"), pattern.count("E")
    assert (n_mamba, n_att, n_moe) == (23, 6, 23)
    d, hd = v["hidden_size"], v["head_dim"]
    q_out, kv_out = v["num_attention_heads"] * hd, v["num_key_value_heads"] * hd
    inner = v["mamba_num_heads"] * v["mamba_head_dim"]
    in_out = 2 * inner + 2 * v["n_groups"] * v["ssm_state_size"] + v["mamba_num_heads"]
    E, I, S = v["n_routed_experts"], v["moe_intermediate_size"], v["moe_shared_expert_intermediate_size"]
    expect = {  # family: (modules, trainable parameters) = r x (in + out) per LoRA'd matrix
        "q_proj": (n_att, n_att * r * (d + q_out)), "k_proj": (n_att, n_att * r * (d + kv_out)),
        "v_proj": (n_att, n_att * r * (d + kv_out)), "o_proj": (n_att, n_att * r * (q_out + d)),
        "in_proj": (n_mamba, n_mamba * r * (d + in_out)), "out_proj": (n_mamba, n_mamba * r * (inner + d)),
        "shared_experts.up_proj": (n_moe, n_moe * r * (d + S)), "shared_experts.down_proj": (n_moe, n_moe * r * (S + d)),
        "experts": (2 * n_moe, 2 * n_moe * r * E * (d + I)),  # rank r per expert, up and down stacks
        "lm_head": (1, r * (d + v["vocab_size"])),
    }
    t = figures["table"].set_index("family")
    assert sorted(t.index) == sorted(expect) == sorted(str(x) for x in compose(PRESET).sft.lora.targets)
    got = {f: (int(t.loc[f, "modules"]), int(t.loc[f, "trainable_params"])) for f in t.index}
    assert got == expect
    assert figures["trainable_params"] == sum(p for _, p in expect.values())
    # the base model: 31.6 B parameters (the "30B-A3B"), counted from the meta model's shapes
    assert 31.0e9 < figures["base_params"] < 32.0e9


@pytest.mark.slow  # builds the 30B model's LoRA on the meta device: seconds (the fast lane stays short)
def test_packed_adapter_names_and_shapes_are_the_ones_vllm_reads(values, figures):
    """The preset's adapter, after `lab.model.submission.split_fused_experts` (experts split per expert), has exactly the
    names and shapes vLLM 0.33's Nemotron-H reads: per-expert `experts.{e}.up_proj/down_proj` (its expert mapping,
    `get_expert_mapping` in vllm/model_executor/models/nemotron_h.py), q/k/v/o, in/out_proj, shared experts and
    `lm_head` (`embedding_modules`). Computed on the meta device: names and shapes only."""
    from peft import get_peft_model_state_dict

    from lab.model.submission import split_fused_experts

    pm = figures["model"]
    state = get_peft_model_state_dict(pm, save_embedding_layers=False)
    config = pm.peft_config["default"].to_dict()
    config["target_parameters"] = list(config["target_parameters"])
    packed, fused = split_fused_experts(state, config)
    v, r = values, 32
    pattern = v["hybrid_override_pattern"]
    d, E, I = v["hidden_size"], v["n_routed_experts"], v["moe_intermediate_size"]
    assert len(fused) == 2 * pattern.count("E")
    want = {}
    for layer, kind in enumerate(pattern):
        p = f"base_model.model.model.layers.{layer}.mixer."
        if kind == "E":
            for e in range(E):
                want[f"{p}experts.{e}.up_proj.lora_A.weight"] = (r, d)
                want[f"{p}experts.{e}.up_proj.lora_B.weight"] = (I, r)
                want[f"{p}experts.{e}.down_proj.lora_A.weight"] = (r, I)
                want[f"{p}experts.{e}.down_proj.lora_B.weight"] = (d, r)
            S = v["moe_shared_expert_intermediate_size"]
            want.update({f"{p}shared_experts.up_proj.lora_A.weight": (r, d), f"{p}shared_experts.up_proj.lora_B.weight": (S, r),
                         f"{p}shared_experts.down_proj.lora_A.weight": (r, S),
                         f"{p}shared_experts.down_proj.lora_B.weight": (d, r)})
        elif kind == "M":
            inner = v["mamba_num_heads"] * v["mamba_head_dim"]
            in_out = 2 * inner + 2 * v["n_groups"] * v["ssm_state_size"] + v["mamba_num_heads"]
            want.update({f"{p}in_proj.lora_A.weight": (r, d), f"{p}in_proj.lora_B.weight": (in_out, r),
                         f"{p}out_proj.lora_A.weight": (r, inner), f"{p}out_proj.lora_B.weight": (d, r)})
        else:
            q, kv = v["num_attention_heads"] * v["head_dim"], v["num_key_value_heads"] * v["head_dim"]
            for mod, (i, o) in {"q_proj": (d, q), "k_proj": (d, kv), "v_proj": (d, kv), "o_proj": (q, d)}.items():
                want.update({f"{p}{mod}.lora_A.weight": (r, i), f"{p}{mod}.lora_B.weight": (o, r)})
    want.update({"base_model.model.lm_head.lora_A.weight": (r, d),
                 "base_model.model.lm_head.lora_B.weight": (v["vocab_size"], r)})
    assert {k: tuple(t.shape) for k, t in packed.items()} == want
    assert len(want) == 12010


# ---- the trace -------------------------------------------------------------------------------------------------------

TINY_ALL = ["model.dtype=bfloat16",  # transformers' grouped_mm experts: the meta kernel (fake tensors) takes bf16 only
            "sft.lora.targets=[q_proj,k_proj,v_proj,o_proj,in_proj,out_proj,shared_experts.up_proj,"
            "shared_experts.down_proj,experts,lm_head]"]


@pytest.mark.parametrize("mamba, head", [("torch", "torch"),  # the real CPU path: fast lane; the stand-ins: slow lane
                                         pytest.param("kernel", "chunked", marks=pytest.mark.slow)])
def test_traced_peak_equals_the_peak_of_the_same_step_on_real_tensors(mamba, head):
    """One SFT step of the tiny model (every LoRA family, lm_head too; checkpointing, fused AdamW, bf16 autocast):
    the peak counted on fake tensors is within 2% of the peak of the same step run on real CPU tensors, counted by
    the same dispatch mode. ("torch", "torch"): transformers' PyTorch scan and lab.train.trl_private's head, the real CPU
    path; ("kernel", "chunked"): the stand-ins for the CUDA-only kernels, run on real tensors too."""
    cfg = compose(TINY_ALL)
    fake = memory.trace(cfg, "sft", tokens=128, rows=2, mamba=mamba, head=head, fake=True)
    real = memory.trace(cfg, "sft", tokens=128, rows=2, mamba=mamba, head=head, fake=False)
    assert real.peak_bytes > 1e6
    assert abs(fake.peak_bytes - real.peak_bytes) <= 0.02 * real.peak_bytes, (fake.peak_bytes, real.peak_bytes)
    assert ("stand-in" in fake.mamba_path) == (mamba == "kernel")
    # sft.lora.experts_path=routed (the default): lab.model.experts_lora, no fold (tests/test_experts_lora.py traces both)
    assert fake.experts_path.startswith("grouped_mm") and "routed tokens" in fake.experts_path
    assert fake.phase_peaks.keys() == {"forward", "backward", "optimizer"}


@pytest.mark.slow  # three SFT-step traces of 512 tokens, one on real tensors: seconds (the fast lane stays short)
def test_the_causal_mask_pitfall_is_handled():
    """Under fake tensors transformers cannot see that a row is not packed, so it builds a [T x T] mask the real run
    skips; with the trace's answer (`_unpacked_rows`) fake and real agree, without it the fake step holds the mask."""
    cfg, T = compose(["model.dtype=bfloat16"]), 512
    real = memory.trace(cfg, "sft", tokens=T, rows=1, fake=False, unpacked=False).peak_bytes
    assert memory.trace(cfg, "sft", tokens=T, rows=1, fake=True).peak_bytes == real
    assert memory.trace(cfg, "sft", tokens=T, rows=1, fake=True, unpacked=False).peak_bytes >= real + T * T


@pytest.mark.slow  # several seconds: subprocesses or a full trace (the fast lane stays short)
def test_the_pytorch_scan_costs_more_than_the_kernel_and_8bit_adamw_less_than_fp32():
    cfg = compose(TINY_ALL)
    kernel = memory.trace(cfg, "sft", tokens=128, rows=1)
    torch_scan = memory.trace(cfg, "sft", tokens=128, rows=1, mamba="torch")
    assert torch_scan.peak_bytes > kernel.peak_bytes
    fp32 = memory.trace(cfg, "sft", tokens=8, rows=1).phase_peaks["optimizer"]
    bnb = memory.trace(compose([*TINY_ALL, "gpu.optim=adamw_bnb_8bit"]), "sft", tokens=8, rows=1)
    assert bnb.optim == "adamw_bnb_8bit" and bnb.phase_peaks["optimizer"] < fp32


def test_grpo_micro_step_is_the_trainers_micro_batch():
    cfg = compose(["model=nemotron_nano"])
    g = cfg.grpo
    assert g.packing  # conf/grpo/nemotron_nano.yaml: one pack of grpo.pack_tokens per forward/backward
    assert memory.step_shape(cfg, "grpo") == (1, g.pack_tokens, g.gradient_checkpointing)
    cfg = compose(["model=nemotron_nano", "grpo.packing=false"])  # the whole step at once
    assert memory.step_shape(cfg, "grpo")[0] == g.prompts_per_step * g.num_generations
    cfg = compose(["model=nemotron_nano", "grpo.packing=false", "grpo.per_device_train_batch_size=2"])
    assert memory.step_shape(cfg, "grpo") == (2, cfg.model.max_model_len, g.gradient_checkpointing)
    assert memory.step_shape(cfg, "sft", tokens=2048) == (cfg.sft.batch_size, 2048, cfg.sft.gradient_checkpointing)


@pytest.mark.slow  # a real-shape trace: seconds (the fast lane stays short)
def test_check_fits_skips_the_tiny_model_and_refuses_a_step_larger_than_the_card(capsys):
    assert memory.check_fits(compose([])) is None  # the CPU demo never pays for a trace

    def as_real(**gpu):  # the tiny shapes, treated as a loaded (not built) model
        cfg = OmegaConf.create(OmegaConf.to_container(compose([*TINY_ALL, "sft.max_seq_len=64"]), resolve=True))
        return OmegaConf.merge(cfg, {"model": {"build_tiny": False}, "gpu": gpu})

    with pytest.raises(LabError, match="gpu.check=false"):
        memory.check_fits(as_real(memory_gib=0.001), "sft")
    t = memory.check_fits(as_real(memory_gib=0.001, check=False), "sft")
    assert t is not None and "WARNING" in capsys.readouterr().out
    assert memory.check_fits(as_real(memory_gib=80.0), "sft").peak_gib < 1


def test_memory_command_writes_the_json(tmp_path):
    from lab.__main__ import main

    out = tmp_path / "m.json"
    rc = main(["memory", *TINY_ALL, "gpu=h100_80gb", "sft.max_seq_len=64", "--json", str(out)])
    d = json.loads(out.read_text())
    assert rc == 0 and d["fits"] is True and d["gpu_gib"] == 79.6 and d["tokens"] == 8 * 64
    assert {"peak_gib", "gpu_gib", "fits", "mamba_path", "experts_path", "tokens", "top"} <= d.keys()
    assert d["top"][0]["gib"] >= d["top"][-1]["gib"]


def test_experts_rank_lowers_only_the_routed_experts_rank_and_keeps_the_scale(values):
    from lab.model.lora import lora_config

    cfg = compose([*PRESET, "gpu=h100_80gb", "gpu.experts_rank=16"])
    lc = lora_config(cfg, shapes.meta_model(values))
    assert lc.r == 32 and set(lc.rank_pattern.values()) == {16}
    assert all(lc.alpha_pattern[k] / lc.rank_pattern[k] == lc.lora_alpha / lc.r for k in lc.rank_pattern)
    assert lora_config(compose(PRESET), shapes.meta_model(values)).rank_pattern == {}


@pytest.mark.slow
def test_experts_rank_halves_the_expert_parameters_only(values, figures):
    low = shapes.lora_figures(compose([*PRESET, "gpu.experts_rank=16"]), values)
    a, b = figures["table"].set_index("family"), low["table"].set_index("family")
    assert b.loc["experts", "trainable_params"] * 2 == a.loc["experts", "trainable_params"]
    others = [f for f in a.index if f != "experts"]
    assert (a.loc[others, "trainable_params"] == b.loc[others, "trainable_params"]).all()
    from peft.tuners.lora.layer import ParamWrapper

    wrappers = [m for m in low["model"].modules() if isinstance(m, ParamWrapper)]
    assert len(wrappers) == 2 * values["hybrid_override_pattern"].count("E")
    assert all(m.r["default"] == 16 and m.scaling["default"] == 1.0 for m in wrappers)  # alpha/r kept


def test_a_fake_trace_runs_on_the_cpu_and_the_real_kernels_must_import():
    """`device="cuda"` is for a real step on the card (bench/gpu_memory.py); a fake trace there is refused before
    anything is built, and `mamba="real"` names the missing package instead of falling back silently."""
    cfg = compose(TINY_ALL)
    with pytest.raises(LabError, match="fake-tensor trace runs on the CPU"):
        memory.trace(cfg, "sft", tokens=8, rows=1, device="cuda")
    if importlib.util.find_spec("mamba_ssm") is None:
        with pytest.raises(LabError, match="mamba_ssm's Triton chunk scan"):
            memory.trace(cfg, "sft", tokens=8, rows=1, mamba="real", fake=False)


# ---- CUDA's autocast rules on the CPU (lab.plan.autocast_rules) --------------------------------------------------------

# The rest of CUDA autocast's ops without a CPU autocast kernel (torch's aten/src/ATen/autocast_mode.h): they cast
# down to bf16 or promote to the widest input, so the CPU trace counts as much or more.
CASTS_DOWN_OR_PROMOTES = {
    "_convolution", "convolution", "cudnn_convolution", "cudnn_convolution_transpose", "addmv", "addr", "chain_matmul",
    "einsum", "linalg_multi_dot", "mv", "_scaled_dot_product_flash_attention", "lstm_cell", "gru_cell",
    "rnn_tanh_cell", "rnn_relu_cell", "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell",
    "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "index_put", "scatter_add", "tensordot", "vdot"}
EMULATED = {*autocast_rules.CUDA_FP32, *autocast_rules.CUDA_FP32_DTYPE, *autocast_rules.CUDA_FP32_NORM}


def test_the_rules_cover_every_op_cuda_autocast_runs_in_fp32_and_the_cpus_does_not():
    """Every op of the installed torch with a CUDA autocast kernel and no CPU one is either emulated or casts down /
    promotes; a torch that adds one fails here, naming it."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    split = {n.removeprefix("aten::") for n in torch._C._dispatch_get_all_op_names()
             if has(n, "AutocastCUDA") and not has(n, "AutocastCPU")}
    assert split - EMULATED - CASTS_DOWN_OR_PROMOTES == set(), "new in CUDA autocast's lists"
    assert (EMULATED | CASTS_DOWN_OR_PROMOTES) - split == set(), "no longer in CUDA autocast's lists"
    assert not EMULATED & CASTS_DOWN_OR_PROMOTES


def _samples(x3, x4, x5):
    """Arguments for each emulated op from bf16 tensors of 3, 4 and 5 dimensions."""
    up = {"upsample_nearest1d": (x3, [8]), "_upsample_nearest_exact1d": (x3, [8]),
          "upsample_linear1d": (x3, [8], False),
          "upsample_nearest2d": (x4, [8, 8]), "_upsample_nearest_exact2d": (x4, [8, 8]),
          "upsample_bilinear2d": (x4, [8, 8], False), "_upsample_bilinear2d_aa": (x4, [8, 8], False),
          "upsample_bicubic2d": (x4, [8, 8], False), "_upsample_bicubic2d_aa": (x4, [8, 8], False),
          "upsample_nearest3d": (x5, [8, 8, 8]), "_upsample_nearest_exact3d": (x5, [8, 8, 8]),
          "upsample_trilinear3d": (x5, [8, 8, 8], False)}
    return {**{n: (x3,) for n in ("acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
                                  "reciprocal", "rsqrt", "sinh", "tan", "softplus", "sum", "linalg_vector_norm",
                                  "linalg_matrix_norm.str_ord")},
            "pow.Tensor_Scalar": (x3, 2.0), "pow.Tensor_Tensor": (x3, x3), "pow.Scalar": (2.0, x3),
            "layer_norm": (x3, [4]), "native_layer_norm": (x3, [4], None, None, 1e-5), "group_norm": (x3, 2),
            "rms_norm": (x3, [4]), "frobenius_norm.dim": (x3, [1]), "cosine_similarity": (x3, x3), "dist": (x3, x3),
            "renorm": (x3, 2, 0, 1.0), "logsumexp": (x3, [1]), "softmax.int": (x3, -1), "log_softmax.int": (x3, -1),
            "cumsum": (x3, 0), "cumprod": (x3, 0), "sum.dim_IntList": (x3, [0]), "linalg_matrix_norm": (x3, 1),
            "norm.Scalar": (x3, 2), "norm.ScalarOpt_dim": (x3, 2, [1]), **up}


def _run(name, device):
    """(output dtypes, bytes the call allocated) of one op on fake bf16 tensors under `device`'s autocast."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x3, x4, x5 = (torch.empty(*[2, 4, 4, 4, 4][:d], dtype=torch.bfloat16, device=device) for d in (3, 4, 5))
        args, counter = _samples(x3, x4, x5)[name], memory.LiveBytes()
        torch.set_autocast_enabled(device, True)  # torch.autocast("cuda") turns itself off where CUDA is absent
        torch.set_autocast_dtype(device, torch.bfloat16)
        try:
            with counter:
                out = autocast_rules._aten(name)(*args)
        finally:
            torch.set_autocast_enabled(device, False)
        outs = out if isinstance(out, tuple) else (out,)
        return [o.dtype for o in outs], counter.peak


@pytest.mark.parametrize("name", sorted(EMULATED - {"nuclear_norm", "nuclear_norm.dim", "pdist"}))  # these three
def test_each_rule_does_what_cuda_autocast_does(name):  # need a CUDA device guard even on fake tensors
    """CUDA's own autocast kernel on fake CUDA tensors, against the rule on fake CPU tensors: the same output dtypes
    and the same bytes allocated; without the rule the CPU's autocast leaves the op in bf16."""
    cuda = _run(name, "cuda")
    assert torch.float32 in cuda[0]  # CUDA autocast runs it in fp32 in the installed torch
    assert _run(name, "cpu")[0] != cuda[0]
    with autocast_rules.cuda_autocast_rules():
        assert _run(name, "cpu") == cuda
    assert _run(name, "cpu")[0] != cuda[0]  # the rules are gone once closed


def test_grpo_generation_phase_bound_adds_up_from_the_config(values, figures):
    """rollout_backend=vllm: the engine's bf16 weights, adapter slot, KV cache and Mamba state against its share, the
    trainer's LoRA and optimizer states beside it (lab.plan.grpo_policy.generation_phase), by hand from config.json."""
    cfg = compose([*PRESET, "gpu=h100_80gb", "grpo.rollout_backend=vllm", "grpo.max_num_seqs=64"])
    ph = grpo_policy.generation_phase(cfg, values)
    GIB, P, base = 1024 ** 3, figures["trainable_params"], figures["base_params"]
    seqs = 64  # grpo.max_num_seqs
    layer = 64 * 64 * 128 * 4 + 3 * (64 * 64 + 2 * 8 * 128) * 2  # one Mamba layer: fp32 SSM state + bf16 conv state
    block = 16 * math.ceil(layer / (16 * 2 * 2 * 128 * 2))  # vLLM's hybrid block: (K, V) x 2 kv heads x 128 x bf16
    page = block * 2 * 2 * 128 * 2  # one layer's page, the Mamba state padded to it
    held = (300 + (0.95 * 1209 ** 4 / 823 ** 2 + 0.05 * 7680 ** 2) / (2 * (0.95 * 1209 + 0.05 * 7680))) * 1.25
    kv = 6 * page * (held / block + 1) * seqs  # 6 attention layers, the in-flight context and a partly filled block
    mamba = 24 * page * seqs  # 23 Mamba layers in groups of 6 (the attention layers' count): 24 pages
    assert ph["engine_need_gib"] == pytest.approx((2 * base + 2 * P + kv + mamba) / GIB)
    assert ph["trainer_gib_total"] == pytest.approx((4 + 2 + 8 / 256) * P / GIB)  # fp32 LoRA + 8-bit AdamW
    assert ph["share"] == 0.88 and ph["fits"]  # null: 95% of 79.6 GiB less the trainer's 5.0 GiB, rounded down
    assert grpo_policy.engine_share(cfg) == 0.88
    small = grpo_policy.generation_phase(compose([*PRESET, "gpu=h100_80gb", "grpo.vllm_gpu_memory_utilization=0.8",
                                             "grpo.max_num_seqs=64"]), values)
    assert not small["fits"]  # the negative control: 0.8 x 79.6 GiB cannot hold the engine's 66 GiB
    fp32 = grpo_policy.generation_phase(compose([*PRESET, "gpu=h100_80gb", "gpu.optim=adamw_torch_fused",
                                            "grpo.max_num_seqs=64",
                                            "grpo.vllm_gpu_memory_utilization=0.88"]), values)
    assert not fp32["fits"]  # fp32 AdamW's 6.6 GiB of moments beside a 0.88 share pass 95% of the card


@pytest.mark.parametrize("card", ["h100_80gb", "rtx_pro_6000"])
def test_the_rollout_engine_takes_as_many_sequences_as_its_share_holds(values, card):
    """grpo.max_num_seqs=null: the most sequences (in eights, at most one round's) whose KV cache and Mamba state fit
    the engine's share beside the weights; eight more would not fit (the negative control)."""
    cfg = compose([*PRESET, f"gpu={card}", "grpo.rollout_backend=vllm"])
    ph = grpo_policy.generation_phase(cfg, values)
    seqs = ph["sequences"]
    assert seqs % 8 == 0 and 64 < seqs <= grpo_policy.rollout_round(cfg) and ph["fits"]
    more = grpo_policy.generation_phase(compose([*PRESET, f"gpu={card}", "grpo.rollout_backend=vllm",
                                            f"grpo.max_num_seqs={seqs + 8}"]), values)
    assert more["engine_need_gib"] > more["share"] * more["card_gib"] and not more["fits"]
