"""Projected GRPO / evaluation / vote costs (`lab.plan.estimate_infer`): positive figures, arithmetic that names
every constant it uses, and figures that move the right way when a setting changes."""

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
