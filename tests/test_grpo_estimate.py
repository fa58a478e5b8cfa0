"""Projected GRPO / evaluation / vote costs (`lab.plan.estimate_infer`): positive figures, arithmetic that names
every constant it uses, and figures that move the right way when a setting changes."""

import numpy as np
import pytest

from lab import LabError
from lab.core.config import compose
from lab.plan import estimate_infer as E
from lab.plan.estimate import rollout_figures

REAL = ["model=nemotron_nano", "experiment=competition", "data=competition"]


def grpo_step_minutes(cfg, card):
    return E.grpo_step_minutes(cfg, card, rollout_figures(cfg, E.card_name(card)))


def pass_rate_hours(cfg, card):
    return E.pass_rate_hours(cfg, card, rollout_figures(cfg, E.card_name(card)))


FUNCS = [E.eval_hours_per_1000, E.vote_hours, grpo_step_minutes, pass_rate_hours]


@pytest.mark.parametrize("card", ["h100_80gb", "rtx_pro_6000", "h200"])
@pytest.mark.parametrize("fn", FUNCS, ids=lambda f: f.__name__)
def test_each_figure_is_positive_projected_and_shows_its_constants(fn, card):
    cfg = compose([*REAL, f"gpu={card}"])
    r = fn(cfg, cfg.gpu)
    assert r["projected"] is True and r[r["figure"]] > 0
    assert r["constants"]
    for name, c in r["constants"].items():
        assert name in r["arithmetic"], f"{name} not in the arithmetic of {fn.__name__}"
        assert c["source"] and c["value"] > 0


def _fig(fn, *over, card="h100_80gb"):
    cfg = compose([*REAL, f"gpu={card}", *over])
    r = fn(cfg, card)
    return r[r["figure"]]


def test_figures_move_with_the_settings():
    # negative controls: a longer budget, more samples, more prompts, a slower card cost more
    assert _fig(E.eval_hours_per_1000, "infer.max_tokens=15360", "model.max_model_len=16384") > \
        _fig(E.eval_hours_per_1000)
    assert _fig(E.vote_hours, "vote.k=16") > 1.9 * _fig(E.vote_hours)
    assert _fig(pass_rate_hours, "grpo.pass_rate_k=16") > _fig(pass_rate_hours)
    assert _fig(grpo_step_minutes, "grpo.prompts_per_step=16") > _fig(grpo_step_minutes)
    assert _fig(grpo_step_minutes, card="rtx_pro_6000") > _fig(grpo_step_minutes) > \
        _fig(grpo_step_minutes, card="h200")
    # handing every prompt over at once beats waves of max_num_seqs
    cfg = compose([*REAL, "gpu=h100_80gb"])
    r = E.eval_hours_per_1000(cfg, "h100_80gb")
    assert r["in_waves_hours"] > r["hours_per_1000"]


def test_sections_and_an_unknown_card():
    cfg = compose([*REAL, "gpu=h100_80gb"])
    s = E.sections(cfg, cfg.gpu, rollout_figures(cfg, "h100_80gb"))
    assert set(s) == {"grpo", "eval", "vote"} and s["grpo"]["step_minutes"] > 0 and s["grpo"]["pass_rate_hours"] > 0
    assert s["eval"]["hours_per_1000"] > 0 and s["vote"]["hours"] > 0
    assert "PROJECTED" in E.report(cfg, cfg.gpu, rollout_figures(cfg, "h100_80gb"))
    with pytest.raises(LabError, match="rollout_figures"):
        E.grpo_step_minutes(cfg, cfg.gpu)
    with pytest.raises(LabError, match="no projection for gpu=none"):
        E.eval_hours_per_1000(compose([]), compose([]).gpu)


def test_packing_and_the_sampler_log_probs_shorten_the_step():
    """grpo.packing trains a step in packs (fewer micro-steps, masked rows not run); old log-probs from the sampler
    drop the extra forward; more rollout slots shorten the generation (negative controls: each undone costs more)."""
    packed = grpo_step_minutes(compose([*REAL, "gpu=h100_80gb"]), "h100_80gb")
    assert "packed (grpo.packing" in packed["arithmetic"]
    unpacked = grpo_step_minutes(compose([*REAL, "gpu=h100_80gb", "grpo.packing=false",
                                          "grpo.per_device_train_batch_size=1"]), "h100_80gb")
    assert unpacked["parts_s"]["training_per_step"] > 3 * packed["parts_s"]["training_per_step"]
    sampler = grpo_step_minutes(compose([*REAL, "gpu=h100_80gb", "grpo.old_logprobs=sampler"]), "h100_80gb")
    assert sampler["parts_s"]["training_per_step"] < packed["parts_s"]["training_per_step"]
    few = grpo_step_minutes(compose([*REAL, "gpu=h100_80gb", "grpo.max_num_seqs=64"]), "h100_80gb")
    assert few["slots"] == 64 < packed["slots"]
    assert few["parts_s"]["generation_per_step"] > packed["parts_s"]["generation_per_step"]


@pytest.mark.parametrize("card, tbps", [("h100_80gb", 3.35), ("rtx_pro_6000", 1.792), ("h200", 4.8)])
def test_the_decode_step_at_its_estimated_point_and_around_it(card, tbps):
    """`step_model`: at h100_step_seqs (64) the step is h100_step_s x 3.35 TB/s / the card's, whatever the state bytes
    a sequence moves; one sequence reads 6 experts' weights, not 122, so its step costs under half (negative
    control: a model that read every expert at any count would be flat below 64); more sequences cost more."""
    for seq_bytes in (0.0, 112e6):
        step = E.step_model(card, seq_bytes)[0]
        assert float(step(64)) == pytest.approx(0.030 * 3.35 / tbps)
        assert float(step(1)) < 0.5 * float(step(64)) < float(step(64)) < float(step(120))


def test_uniform_routing_touches_the_most_experts():
    """6 of 128 experts a token: one token touches 6, 64 tokens 122 (the estimate's 64-sequence step), many tokens
    all 128; a skewed router with the same 6 picks a token touches fewer, so uniform routing bounds the weights a
    trained router's step reads."""
    assert float(E.experts_touched(1, 128, 6)) == pytest.approx(6)
    assert round(float(E.experts_touched(64, 128, 6))) == 122
    assert float(E.experts_touched(10_000, 128, 6)) == pytest.approx(128)
    w = np.exp(-np.arange(128) / 64)
    p = 6 * w / w.sum()  # each expert's chance to be picked by a token, 6 picks a token, the largest 0.11
    assert float(p.sum()) == pytest.approx(float(E.experts_touched(1, 128, 6)))  # one token: its 6 picks either way
    for n in (8, 64, 256):
        assert float((1 - (1 - p) ** n).sum()) < float(E.experts_touched(n, 128, 6))


@pytest.mark.parametrize("n, slots", [(1200, 100), (256, 256)])
def test_generation_time_against_a_replay_of_the_lengths(bench, n, slots):
    """`generation_s` (the expected count in flight per step) against bench/rollout_slots.py's replay of seeded
    lengths from the same model, each step costed at the sequences then in flight: at most 5% above it, never below
    (the step is concave in the count). Negative control: the old count, sequences x mean / slots + the budget in
    steps all at full slots, overstates the replay by over 20% when every sequence fits at once (it adds a mean
    completion to a round that lasts its longest)."""
    rs = bench("rollout_slots")
    c = {k: v[0] for k, v in E.CONSTANTS.items()}
    step = E.step_model("h100_80gb", 112e6)[0]
    est = E.generation_s(n, 7680, slots, "h100_80gb", 112e6)[0]
    replay = np.mean([float(step(rs.in_flight(slots, rs.sample_lengths(n, 7680, np.random.default_rng(seed), c)))
                            .sum()) for seed in range(3)])
    assert replay <= est <= 1.05 * replay
    old = (n * E.mean_completion_tokens(7680)[0] / slots + 7680) * float(step(slots))
    assert old > 1.05 * est
    if n <= slots:
        assert old > 1.2 * replay


def test_the_replay_keeps_every_slot_busy_while_sequences_wait(bench):
    """bench/rollout_slots.py's `in_flight` by hand: lengths [3, 1, 2, 2] in two slots: slot 0 runs 3 (steps 0-2),
    slot 1 runs 1 (step 0), then 2 (steps 1-2); the last 2 waits for a free slot and runs at steps 3-4."""
    rs = bench("rollout_slots")
    assert rs.in_flight(2, np.array([3, 1, 2, 2])).tolist() == [2, 2, 2, 1, 1]


def test_the_step_waits_for_the_dense_matmuls_once_they_are_compute_bound():
    """Past the card's ridge (the dense matmuls at decode_gemm_share of the bf16 peak slower than reading their
    weights: from 140 sequences on an RTX PRO 6000), each more sequence adds its matmuls' time: 2 x 1.95B FLOP at
    250 TFLOP/s = 15.6 us, besides its state's bytes; below it, none (negative control: at 64 to 128 sequences the
    step grows by the state and the experts only)."""
    step = E.step_model("rtx_pro_6000", 0.0)[0]
    per_seq = float(step(2000) - step(1000)) / 1000
    assert per_seq == pytest.approx(2 * 1.95e9 / (500e12 * 0.5), rel=0.01)
    flat = E.step_model("h100_80gb", 0.0)[0]  # the H100's ridge is at 148 sequences
    experts = E.routed_experts()[0] * float(E.experts_touched(128, 128, 6) - E.experts_touched(64, 128, 6)) / 128
    assert float(flat(128) - flat(64)) == pytest.approx(experts / 3.35e12)  # the experts' read only, no matmul wait
    assert "decode_gemm_share" in E.step_model("h100_80gb")[1]
