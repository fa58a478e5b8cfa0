"""The rollout engine's slots (`lab.plan.grpo_policy.generation_phase`): sized by the KV a sequence holds in flight in
vLLM's pages (`vllm_pages`), not by model.max_model_len; literal numbers worked by hand from the real model's
config.json, and a setting whose Mamba state alone cannot fit refused before anything loads."""

import math

import numpy as np
import pytest

from lab import LabError
from lab.core.config import compose
from lab.plan import estimate_infer, grpo_policy

REAL = ["model=nemotron_nano", "experiment=competition", "data=competition"]
GIB = 2 ** 30


def test_vllm_pages_of_the_real_model():
    """One Mamba layer: 64 heads x 64 x 128 fp32 SSM state + 3 x (4,096 + 2 x 8 x 128) bf16 conv state = 2,134,016 B;
    an attention layer's token: (K, V) x 2 kv heads x 128 x 2 B = 1,024 B. vLLM's block: the fewest multiple of 16
    tokens whose page holds the Mamba layer, 16 x ceil(2,134,016 / 16,384) = 2,096 tokens; 23 Mamba layers in groups
    of 6 (the attention layers' count) take 24 pages."""
    pg = grpo_policy.vllm_pages(grpo_policy.model_config_values(compose(REAL)))
    assert (pg["attn_layers"], pg["mamba_layers"]) == (6, 23)
    assert pg["block_tokens"] == 16 * 131 == 2096 and pg["page_bytes"] == 2096 * 1024 == 2_146_304
    assert (pg["mamba_pages"], pg["attn_pages"]) == (24, 6) and pg["mamba_bytes"] == 24 * 2_146_304
    assert pg["mamba_state"] == 23 * 2_134_016 and pg["kv_per_token"] == 6 * 1024
    # not hybrid (no Mamba layer): the exact bytes, no pages to pad
    dense = grpo_policy.vllm_pages({"hybrid_override_pattern": "**", "num_key_value_heads": 2, "head_dim": 128})
    assert dense["block_tokens"] == 1 and dense["mamba_bytes"] == 0 and dense["kv_per_token"] == 2 * 1024


def test_the_in_flight_context_is_length_biased():
    """prompt 300 + E[c^2] / (2 E[c]): 95% log-normal (median 823, mean 1,209: E[t^2] = 1209^4 / 823^2), 5% at the
    7,680-token budget: 300 + (0.95 x 3,155,497 + 0.05 x 58,982,400) / (2 x 1,532.55) = 2,240 tokens, longer than the
    prompt + mean completion (1,833) the old figure took, and far short of model.max_model_len's 8,192."""
    ctx, text = estimate_infer.inflight_context_tokens(7680)
    by_hand = 300 + (0.95 * 1209 ** 4 / 823 ** 2 + 0.05 * 7680 ** 2) / (2 * (0.95 * 1209 + 0.05 * 7680))
    assert ctx == pytest.approx(by_hand) and round(ctx) == 2240
    assert "trace_median_tokens" in text and "2,240 tokens" in text
    assert ctx > 300 + estimate_infer.mean_completion_tokens(7680)[0]
    assert estimate_infer.inflight_context_tokens(1000)[0] < ctx  # a shorter budget holds less


@pytest.mark.parametrize("card, free_gib, slots", [("h100_80gb", 0.88 * 79.6, 120), ("rtx_pro_6000", 0.84 * 95.6, 256)])
def test_slots_from_the_kv_a_sequence_holds(card, free_gib, slots):
    """grpo.max_num_seqs=null: (share - weights - adapter) / (24 Mamba pages + 6 pages x (2,240 x 1.25 tokens / 2,096
    + 1) blocks) x 2,146,304 B = 81.6 MB a sequence; H100: 126, in eights 120; RTX PRO 6000: 261, capped at a round's
    256. The old bound, 8,192 tokens of KV a sequence, gave the H100 96."""
    cfg = compose([*REAL, f"gpu={card}"])
    ph = grpo_policy.generation_phase(cfg)
    per_seq = 2_146_304 * (24 + 6 * (2240.0 * 1.25 / 2096 + 1))
    assert ph["bytes_per_sequence"]["held"] == pytest.approx(per_seq, rel=1e-4) and round(per_seq / 1e6, 1) == 81.6
    free = ph["weights_free_gib"] * GIB
    assert ph["share"] * ph["card_gib"] == pytest.approx(free_gib, abs=0.1)
    assert ph["sequences"] == slots == min(int(free // per_seq) // 8 * 8, 256) and ph["fits"]
    assert "81.6 MB a sequence" in ph["sequences_why"] and "inflight_kv_margin 1.25" in ph["kv_note"]
    old = 6 * 1024 * 8192 + 23 * 2_134_016  # max_model_len of KV + the Mamba state: what the old bound reserved
    if card == "h100_80gb":
        assert int(free // old) // 8 * 8 == 96 < slots


def test_a_setting_whose_mamba_state_alone_cannot_fit_is_refused(monkeypatch):
    """grpo.max_num_seqs=256 on the H100: 256 x 24 pages x 2,146,304 B = 12.3 GiB of Mamba state alone, more than the
    9.6 GiB the 0.88 share leaves beside the weights: it does not fit, the report says why, and the preflight's
    check refuses it before anything loads; the engine's own size passes (the control)."""
    cfg = compose([*REAL, "gpu=h100_80gb", "grpo.max_num_seqs=256"])
    ph = grpo_policy.generation_phase(cfg)
    assert ph["mamba_gib"] == pytest.approx(256 * 24 * 2_146_304 / GIB) and round(ph["mamba_gib"], 1) == 12.3
    assert ph["mamba_gib"] > ph["weights_free_gib"] and not ph["fits"]
    assert "the Mamba state alone, 12.3 GiB for 256 sequences, exceeds" in grpo_policy.generation_report(ph, 0.95)
    monkeypatch.setattr(grpo_policy, "host_gib", lambda: 128.0)  # the H100 machine: the host check passes
    with pytest.raises(LabError, match="(?s)rollout_backend=vllm does not fit gpu=h100_80gb.*Mamba state alone"):
        grpo_policy.check_generation_fits(cfg)  # what the preflight of 03_grpo runs (tests/test_preflight.py)
    assert grpo_policy.check_generation_fits(compose([*REAL, "gpu=h100_80gb"]))["fits"]
    # 136 sequences: the Mamba state fits (7.0 GiB), their KV in flight does not (vLLM would preempt): refused too
    over = grpo_policy.generation_phase(compose([*REAL, "gpu=h100_80gb", "grpo.max_num_seqs=136"]))
    assert over["mamba_gib"] < over["weights_free_gib"] and not over["fits"]
    assert math.isclose(over["mamba_gib"], 136 * 24 * 2_146_304 / GIB)


def test_the_replay_counts_the_pages_a_growing_sequence_holds(bench):
    """bench/rollout_slots.py's replay: a sequence holds its Mamba pages and one attention block per block_tokens of
    its context so far (prompt + the token being written), a freed slot takes the next completion, a finished one
    with none left holds nothing. By hand, 2-token blocks, no prompt, 1 Mamba page: one 3-token completion peaks at
    1 + ceil(3 / 2) = 3 pages; lengths [1, 4, 4] in two slots peak when the 2nd and 3rd write tokens 4 and 3:
    (1 + 2) + (1 + 2) = 6 (with 3 attention pages a block: 2 x (1 + 3 x 2) = 14); [4, 1] peak at their first tokens,
    2 x (1 + 1) = 4, the 4-token one alone reaching only 1 + 2 = 3."""
    rs = bench("rollout_slots")
    assert rs.peak_pages(1, np.array([3]), 0, 2, 1, 1) == 3
    assert rs.peak_pages(2, np.array([1, 4, 4]), 0, 2, 1, 1) == 6
    assert rs.peak_pages(2, np.array([1, 4, 4]), 0, 2, 1, 3) == 14
    assert rs.peak_pages(2, np.array([4, 1]), 0, 2, 1, 1) == 4
    assert rs.peak_pages(1, np.array([3]), 2, 2, 1, 1) == 1 + 3  # a 2-token prompt: 5 tokens at the end, 3 blocks


def test_the_pass_rates_engine_takes_the_optimizers_room():
    """Before step 1 the trainer holds its LoRA weights but no optimizer states: the pass rates' engine gets that
    room (0.90 of the H100 against the rounds' 0.88: 144 sequences against 120), capped by the pass-rate batch, not a
    round; GRPO builds it only when the share is null (negative controls: a share the user set, the hf back-end)."""
    cfg = compose([*REAL, "gpu=h100_80gb"])
    rounds, first = (grpo_policy.generation_phase(cfg, phase=p) for p in ("rounds", "pass_rates"))
    opt = next(v for k, v in rounds["trainer_gib"].items() if k.startswith("optimizer"))
    assert not any(k.startswith("optimizer") for k in first["trainer_gib"])
    assert first["trainer_gib_total"] == pytest.approx(rounds["trainer_gib_total"] - opt)
    assert (rounds["share"], first["share"]) == (0.88, 0.90) and (rounds["sequences"], first["sequences"]) == (120, 144)
    assert first["fits"] and "at most the pass-rate batch's 4096" in first["sequences_why"]
    assert grpo_policy.separate_pass_engine(cfg)
    assert grpo_policy.engine_share(cfg, "pass_rates") == 0.90 and grpo_policy.rollout_seqs(cfg, "pass_rates") == 144
    assert not grpo_policy.separate_pass_engine(compose([*REAL, "gpu=h100_80gb", "grpo.vllm_gpu_memory_utilization=0.88"]))
    assert not grpo_policy.separate_pass_engine(compose([*REAL, "gpu=h100_80gb", "grpo.rollout_backend=hf"]))
    with pytest.raises(LabError, match="phase='warmup'"):
        grpo_policy.generation_phase(cfg, phase="warmup")


def test_the_real_pool_against_the_sizing():
    """`pool_capacity` reads a started engine's pool (vLLM's num_gpu_blocks: one page of each layer of a group per
    block): on the H100 a sequence takes (24 + 6 x (2,800 / 2,096 + 1)) / 6 = 6.34 blocks, so the 120 sequences the
    bound asks for need 761; a pool of 761 holds them, 700 (vLLM's activation and graphs took more than the bound
    left) holds 110 and says to ask for 104; a block size other than the lab's 2,096 says its reading of vLLM fails."""
    cfg = compose([*REAL, "gpu=h100_80gb"])
    ok = grpo_policy.pool_capacity(cfg, 761, 2096, 120)
    assert ok["sequences"] == 120 and ok["holds_asked"] and ok["block_matches"] and "FEWER" not in ok["text"]
    assert ok["pool_gib"] == pytest.approx(761 * 6 * 2_146_304 / GIB)
    short = grpo_policy.pool_capacity(cfg, 700, 2096, 120)
    assert short["sequences"] == 110 and not short["holds_asked"] and "grpo.max_num_seqs=104" in short["text"]
    other = grpo_policy.pool_capacity(cfg, 761, 1024, 120)
    assert not other["block_matches"] and "no longer holds" in other["text"]
