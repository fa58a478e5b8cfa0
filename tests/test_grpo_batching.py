"""GRPO micro-batching (issue 26, items 2 and 9): one optimiser step covers every group whatever the micro-batch,
TRL's own checks run before the pass-rate sampling, and that sampling uses grpo.top_p. CPU, no training."""

from __future__ import annotations

import pandas as pd
import pytest
from omegaconf import OmegaConf

torch = pytest.importorskip("torch")

from lab.core import config  # noqa: E402
from lab.plan import grpo_policy, memory
from lab.train import grpo
from lab.model import lora, models
from lab.core import paths
from lab import LabError
from lab.core.run import Stage  # noqa: E402
from lab.puzzles import generate  # noqa: E402
from train_steps import grpo_train  # noqa: E402


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("grpo_batching")


def compose(root, *extra):
    return config.compose([f"run_dir={root / 'run'}", f"model.path={root / 'base_model'}", "grpo.n_prompts=4",
                           "grpo.pass_rate_k=2", "infer.max_tokens=12", *extra])


def literal(prompts, generations, micro):
    return OmegaConf.create({"grpo": {"prompts_per_step": prompts, "num_generations": generations,
                                      "per_device_train_batch_size": micro}})


@pytest.mark.parametrize("prompts, generations, micro, expect", [
    (8, 8, 1, (1, 64)),      # the nemotron_nano preset: 64 micro-steps of one completion
    (8, 8, 2, (2, 32)),
    (8, 8, None, (64, 1)),   # null: the whole step at once (the tiny default)
    (4, 8, 32, (32, 1)),
    (3, 2, 3, (3, 2)),       # a micro-batch need not hold whole groups
])
def test_micro_batch_arithmetic_covers_the_whole_group(prompts, generations, micro, expect):
    m, accum = grpo_policy.micro_batch(literal(prompts, generations, micro))
    assert (m, accum) == expect and m * accum == prompts * generations


@pytest.mark.parametrize("micro", [3, 0, 65])
def test_a_micro_batch_that_does_not_divide_the_step_is_refused(micro):
    with pytest.raises(LabError, match=rf"per_device_train_batch_size={micro} must divide .* = 64"):
        grpo_policy.micro_batch(literal(8, 8, micro))


@pytest.mark.parametrize("micro, accum", [(1, 64), (2, 32), (None, 1)])
def test_trl_derives_one_generation_round_per_optimiser_step(root, micro, accum):
    """TRL 1.15's GRPOConfig.__post_init__: generation_batch_size = micro x processes x steps_per_generation."""
    cfg = compose(root, "grpo.prompts_per_step=8", "grpo.num_generations=8",
                  f"grpo.per_device_train_batch_size={'null' if micro is None else micro}")
    args = grpo.grpo_args(cfg, root / "out", 37, [1.0], cuda=False)
    assert args.per_device_train_batch_size == (micro or 64)
    assert args.gradient_accumulation_steps == args.steps_per_generation == accum
    assert args.generation_batch_size == 64 * args.world_size == 64  # every prompt's whole group, once per step


def test_the_nemotron_nano_preset_trains_a_step_in_packs():
    """grpo.packing: TRL sees the step's completions as one micro-batch, the lab trains them in packs of
    grpo.pack_tokens (lab.train.grpo_packed), and the memory trace takes one pack as the micro-step."""
    cfg = config.compose(["experiment=competition"])
    assert cfg.grpo.packing and cfg.grpo.per_device_train_batch_size is None
    assert grpo_policy.micro_batch(cfg) == (cfg.grpo.prompts_per_step * cfg.grpo.num_generations, 1)
    assert memory.step_shape(cfg, "grpo") == (1, cfg.grpo.pack_tokens, True)
    with pytest.raises(LabError, match="per_device_train_batch_size=null"):
        config.compose(["experiment=competition", "grpo.per_device_train_batch_size=1"])


def test_a_config_trl_refuses_fails_before_any_sampling(root, monkeypatch):
    """num_generations=1 composes (>= 1), TRL refuses it; the pass-rate sampler must never be reached."""
    def sampler(*a, **k):
        raise AssertionError("pass-rate sampling ran before TRL's checks")

    monkeypatch.setattr(grpo, "pass_rate_table", sampler)
    cfg = compose(root, "grpo.num_generations=1", "grpo.prompts_per_step=2")
    stage = Stage("03_grpo", cfg=cfg)
    model, tok = models.load(cfg)
    pm, _ = lora.attach_lora(cfg, model)
    with pytest.raises(LabError, match="GRPOConfig refuses these settings: GRPO requires at least 2 generations"):
        grpo_train(cfg, stage, generate("numeral_system", 4, 0), pm, tok)
    micro = compose(root, "grpo.per_device_train_batch_size=3")  # 4 x 8 = 32 completions: 3 does not divide it
    with pytest.raises(LabError, match="per_device_train_batch_size=3 must divide"):
        grpo_train(micro, stage, generate("numeral_system", 4, 0), pm, tok)


def test_pass_rate_sampling_uses_the_rollouts_top_p(root, monkeypatch):
    import lab.eval.sampling as S
    import lab.model.generate as G

    seen = {}

    class FakeGenerator:
        def __init__(self, cfg, model=None, tokenizer=None, backend=None):
            seen["backend"] = backend

    def fake_sample_table(gen, puzzles, spec, **kw):
        seen.update(n=spec.n, temperature=spec.temperature, top_p=spec.top_p, max_tokens=spec.max_tokens)
        return pd.DataFrame({"id": ["a", "a"], "gold": ["1", "1"], "answer": ["1", "2"], "tokens": [3, 3]})

    monkeypatch.setattr(G, "Generator", FakeGenerator)
    monkeypatch.setattr(S, "sample_table", fake_sample_table)
    cfg = compose(root, "grpo.top_p=0.85", "grpo.temperature=0.6")
    rates = grpo.pass_rate_table(cfg, None, None, pd.DataFrame({"id": ["a"], "prompt": ["p"]}), budget=10)
    assert seen == {"backend": "hf", "n": 2, "temperature": 0.6, "top_p": 0.85, "max_tokens": 10}
    assert float(rates["pass_rate"].iloc[0]) == 0.5


def token_mean_reward(prompts, completions, completion_ids=None, **kwargs):
    """Varies across sampled completions (the mean token id, scaled), so every group has an advantage."""
    return [sum(ids) / len(ids) / 1000.0 if len(ids) else 0.0 for ids in completion_ids]


@pytest.mark.slow
def test_micro_batched_step_equals_the_one_big_step(root, monkeypatch):
    """One optimiser step with 2 completions per micro-step (4 micro-steps) moves the adapter as the same step
    taken in one forward/backward: same completions (one generation round), same loss, same update."""
    from safetensors.torch import load_file

    from lab.train import rewards

    monkeypatch.setitem(rewards.REWARDS, "token_mean", token_mean_reward)
    puzzles = generate("numeral_system", 6, 0)
    common = ("grpo.num_generations=4", "grpo.prompts_per_step=2", "grpo.max_steps=1", "grpo.save_steps=1",
              "grpo.drop_threshold=1.0", "grpo.drop_unsolved=false", "grpo.gradient_checkpointing=false",
              "grpo.mask_truncated_completions=false", "grpo.gradient_check=false", "+grpo.rewards.token_mean=1.0")
    out = {}
    for micro in ("null", "2"):
        cfg = config.compose([f"run_dir={root / ('micro_' + micro)}", f"model.path={root / 'base_model'}",
                              "grpo.n_prompts=4", "grpo.pass_rate_k=2", "infer.max_tokens=12", *common,
                              f"grpo.per_device_train_batch_size={micro}"])
        stage = Stage("03_grpo", cfg=cfg)
        model, tok = models.load(cfg)
        pm, _ = lora.attach_lora(cfg, model)
        metrics, _, _ = grpo_train(cfg, stage, puzzles, pm, tok)
        assert metrics["steps"] == 1 and metrics["lora_weight_change"] > 0
        out[micro] = (metrics, load_file(str(paths.resolve_path(cfg.grpo.adapter_dir) / "adapter_model.safetensors")))
    (m_a, a), (m_b, b) = out["null"], out["2"]
    assert m_a["reward_per_step"] == m_b["reward_per_step"]  # the same completions were scored
    # the accumulated gradient: Adam's first update hardly depends on the gradient's scale, its norm does
    assert m_b["grad_norm_per_step"] == pytest.approx(m_a["grad_norm_per_step"], rel=1e-4)
    assert set(a) == set(b)
    for k in a:  # float summation order differs; elements whose gradient is ~0 may move by a fraction of lr
        torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-5, msg=k)
