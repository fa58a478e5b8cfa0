"""The real model's shapes on the meta device with the competition preset's LoRA, and the memory estimate.

The config values are a small fixture copied from the published config.json (tests/fixtures/); when ../shared holds
the real file, the fixture is checked against it.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from lab import memory  # noqa: E402
from lab.config import compose, project_root  # noqa: E402

FIXTURE = project_root() / "tests" / "fixtures" / "nemotron_3_nano_config_values.json"
REAL = project_root().parent / "shared" / "tokenizer" / "nemotron-3-nano" / "config.json"
PRESET = ["model=nemotron_nano", "experiment=competition", "data=competition"]


@pytest.fixture(scope="module")
def values():
    return memory.load_config_values(FIXTURE)


@pytest.fixture(scope="module")
def figures(values):
    return memory.lora_figures(compose(PRESET), values)


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
    assert figures["adapter_mb_fp32"] == pytest.approx(figures["trainable_params"] * 4 / 1e6)
    # the base model: 31.6 B parameters (the "30B-A3B"), counted from the meta model's shapes
    assert 31.0e9 < figures["base_params"] < 32.0e9


@pytest.mark.slow
def test_memory_estimate_terms_add_up(values, figures):
    cfg = compose(PRESET)
    m = memory.sft_step_memory(cfg, values, figures)
    assert m["tokens"] == 8192 and m["gradient_checkpointing"] is True
    assert m["weights"] == pytest.approx(figures["base_params"] * 2 / memory.GIB)  # bf16
    assert m["lora_params_grads_adamw"] == pytest.approx(figures["trainable_params"] * 16 / memory.GIB)
    parts = ("weights", "lora_params_grads_adamw", "activations", "output_head", "cuda_context_allowance")
    assert m["total"] == pytest.approx(sum(m[k] for k in parts))
    # checkpointing keeps one layer's working set, not all 52
    off = memory.sft_step_memory(compose([*PRESET, "sft.gradient_checkpointing=false"]), values, figures)
    assert off["activations"] > 3 * m["activations"]
    text = memory.report(cfg, values)
    assert "lm_head" in text and "estimate" in text and "GiB" in text


def test_packed_adapter_names_and_shapes_are_the_ones_vllm_reads(values, figures):
    """The preset's adapter, after `lab.submission.split_fused_experts` (experts split per expert), has exactly the
    names and shapes vLLM 0.33's Nemotron-H reads: per-expert `experts.{e}.up_proj/down_proj` (its expert mapping,
    `get_expert_mapping` in vllm/model_executor/models/nemotron_h.py), q/k/v/o, in/out_proj, shared experts and
    `lm_head` (`embedding_modules`). Computed on the meta device: names and shapes only."""
    from peft import get_peft_model_state_dict

    from lab.submission import split_fused_experts

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
