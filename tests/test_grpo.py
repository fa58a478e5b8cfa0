"""GRPO guarantees on the tiny model (CPU, offline, a few optimiser steps each), as TRL's own tests check training:
rewards finite and varying, LoRA weights moved and frozen weights did not, generation uses the trained adapter,
the saved adapter reproduces it; the budget rule, guard rails, resume, refinement prompts and GRPOConfig."""

from __future__ import annotations

import inspect
import json
import math
import sys

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")

from lab.train import callbacks, grpo, grpo_refine, rewards  # noqa: E402
from lab.core import config
from lab.model import lora, models
from lab.core import io as lab_io
from lab.core import paths
from lab import LabError
from lab.core.run import Stage  # noqa: E402
from lab.competition.prompts import BOXED_INSTRUCTION, chat_prompt  # noqa: E402
from lab.puzzles import generate  # noqa: E402
from train_steps import grpo_train  # noqa: E402  (tests/train_steps.py: the recipe's training steps)


def token_mean_reward(prompts, completions, completion_ids=None, **kwargs):
    """Surely non-constant across sampled completions: the mean token id, scaled to about [0, 1]."""
    return [float(np.mean(ids)) / 1000.0 if len(ids) else 0.0 for ids in completion_ids]


@pytest.fixture(scope="module", autouse=True)
def _test_reward():
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(rewards.REWARDS, "token_mean", token_mean_reward)
        yield


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("grpo")


@pytest.fixture(scope="module")
def puzzles():
    return generate("numeral_system", 6, 0)


BASE = ("grpo.n_prompts=4", "grpo.pass_rate_k=2", "grpo.drop_threshold=1.0", "grpo.drop_unsolved=false", "grpo.num_generations=4",
        "grpo.prompts_per_step=2", "infer.max_tokens=12", "grpo.max_steps=2", "grpo.save_steps=2",
        "grpo.gradient_checkpointing=false", "grpo.mask_truncated_completions=false", "+grpo.rewards.token_mean=1.0")


def compose(root, name="run", *extra):
    return config.compose([f"run_dir={root / name}", f"model.path={root / 'base_model'}", *BASE, *extra])


def start(cfg, overrides=()):
    """Open the stage first (it seeds everything), then a fresh LoRA on the tiny model: the same start every time."""
    stage = Stage("03_grpo", overrides, cfg=cfg)
    model, tok = models.load(cfg)
    pm, _ = lora.attach_lora(cfg, model)
    return stage, pm, tok


def run(cfg, puzzles, overrides=()):
    stage, pm, tok = start(cfg, overrides)
    return grpo_train(cfg, stage, puzzles, pm, tok)


def adapter(cfg):
    from safetensors.torch import load_file

    return load_file(str(paths.resolve_path(cfg.grpo.adapter_dir) / "adapter_model.safetensors"))


def logits(model, tok, text):
    enc = tok(text, return_tensors="pt", add_special_tokens=False)
    model.eval()
    with torch.no_grad():
        return model(**enc).logits.float()


def _stop_at(step):
    from transformers import TrainerCallback

    class Stop(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step >= step:
                control.should_save = True
                control.should_training_stop = True
            return control

    return Stop()


# ---- no model: config, budget, schedule, refinement prompts, guard rails ----------------------------------

@pytest.mark.parametrize("backend", ["hf", "vllm"])
def test_grpo_args_builds_a_valid_config_for_the_pinned_trl(root, backend, tmp_path):
    from trl import GRPOTrainer

    cfg = compose(root, "args", f"grpo.rollout_backend={backend}", "grpo.beta=0.04")
    args = grpo.grpo_args(cfg, root / "args_out", 37, [1.0, 0.2, 1.0], cuda=False)
    assert "vllm" not in sys.modules  # building the config never imports vLLM
    assert args.max_completion_length == 37 != 512 and args.shuffle_dataset is False
    assert args.num_generations == 4 and args.per_device_train_batch_size == 8 and args.generation_batch_size == 8
    assert args.steps_per_generation == 1 and args.num_iterations == 1 and args.top_k == 0
    assert args.reward_weights == [1.0, 0.2, 1.0] and args.beta == 0.04 and args.learning_rate == cfg.grpo.learning_rate
    assert args.mask_truncated_completions is False and args.gradient_checkpointing is False
    assert args.seed == cfg.seed and args.max_steps == 2 and args.save_steps == 2 and not args.bf16
    # vllm rollouts come from rollout_func (lab.train.rollouts), never TRL's own engine, which merges the adapter
    assert not args.use_vllm
    # and what `train` hands the trainer is accepted by its signature
    params = inspect.signature(GRPOTrainer.__init__).parameters
    assert {"model", "reward_funcs", "args", "train_dataset", "processing_class", "callbacks", "rollout_func"} <= set(params)


def test_steps_per_generation_feeds_several_optimiser_steps_per_round(root):
    """grpo.steps_per_generation = S: TRL's steps_per_generation is S x the micro-steps of one step, so one round
    samples S steps' groups and TRL computes old log-probabilities (its condition, trl/trainer/grpo_trainer.py
    `_generate_and_score_completions`: gradient_accumulation_steps % (steps_per_generation x num_iterations) != 0)."""
    one = grpo.grpo_args(compose(root, "args"), root / "a1", 12, [1.0], cuda=False)
    cfg = compose(root, "args", "grpo.steps_per_generation=3", "grpo.per_device_train_batch_size=4")
    args = grpo.grpo_args(cfg, root / "a3", 12, [1.0], cuda=False)
    assert one.gradient_accumulation_steps % (one.steps_per_generation * one.num_iterations) == 0  # no lag: none
    assert args.gradient_accumulation_steps == 2 and args.steps_per_generation == 6
    assert args.generation_batch_size == 3 * 2 * 4  # 3 steps x prompts_per_step x num_generations
    assert args.gradient_accumulation_steps % (args.steps_per_generation * args.num_iterations) != 0


def test_unknown_or_unavailable_rollout_backend_is_a_clear_error(root, puzzles):
    import importlib.util

    with pytest.raises(LabError, match="rollout_backend='unsloth' is not one of hf, vllm"):
        grpo.grpo_args(compose(root, "args", "grpo.rollout_backend=unsloth"), root, 8, [1.0])
    cfg = compose(root, "args", "grpo.rollout_backend=vllm")  # the tiny model is a Nemotron-H: allowed
    assert grpo.check_backend(cfg) == "vllm"
    with pytest.raises(LabError, match="refine=true with rollout_backend=vllm.*grpo.rollout_backend=hf"):
        grpo.check_backend(compose(root, "args", "grpo.rollout_backend=vllm", "grpo.refine=true"))
    if importlib.util.find_spec("vllm") is None:  # the main venv: fails before touching anything
        with pytest.raises(LabError, match="vllm is not installed.*grpo.rollout_backend=hf"):
            grpo.GrpoRun(cfg, puzzles, None, None, root / "unused")


def test_max_completion_length_is_the_competitions_budget_never_trls_default(root, puzzles):
    tok = models.load_tokenizer(compose(root))
    texts = puzzles["prompt"].tolist()
    longest = max(len(tok(chat_prompt(tok, p))["input_ids"]) for p in texts)  # as TRL tokenises
    assert grpo.max_completion_length(compose(root, "b", "infer.max_tokens=7680"), tok, texts) == compose(root, "b").model.max_model_len - longest
    assert grpo.max_completion_length(compose(root, "b", "infer.max_tokens=12"), tok, texts) == 12
    assert grpo.max_completion_length(compose(root, "b", "grpo.max_completion_length=20"), tok, texts) == 20
    with pytest.raises(LabError, match="max_completion_length=700 must be between 1 and"):
        grpo.max_completion_length(compose(root, "b", "grpo.max_completion_length=700"), tok, texts)
    # refine: the draft and the refinement share what the refinement prompt leaves
    empty = max(len(tok(grpo_refine.refine_prompt_text(tok, p, ""))["input_ids"]) for p in texts)
    assert grpo.max_completion_length(compose(root, "b", "infer.max_tokens=7680", "grpo.refine=true"), tok, texts) \
        == (compose(root, "b").model.max_model_len - empty) // 2


def test_resume_point_takes_the_newest_checkpoint_within_max_steps(root, tmp_path):
    """transformers' get_last_checkpoint picks the checkpoint once those past max_steps are deleted."""
    out = tmp_path / "checkpoints"
    from lab.train.checkpoints import mark_complete

    for step in (2, 10, 4, 6):
        (out / f"checkpoint-{step}").mkdir(parents=True)
        mark_complete(out / f"checkpoint-{step}")  # a checkpoint counts only when complete (lab.train.checkpoints)
    (out / "checkpoint-x").mkdir()
    fp = {"grpo": {"lr": 1}, "seed": 1}
    lab_io.atomic_write_json(out / grpo.RUN_RECORD, {"fingerprint": fp, "order": ["a"]})
    cfg = compose(root, "resume_point", "grpo.resume=true", "grpo.max_steps=5")
    last, record, notes = grpo.resume_point(cfg, out, fp)
    assert last == out / "checkpoint-4" and record["order"] == ["a"]
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["checkpoint-2", "checkpoint-4", "checkpoint-x"]
    assert [n.split(" ")[0] for n in notes] == ["checkpoint-6", "checkpoint-10", "resuming"]


def test_schedule_repeats_the_order_and_reshuffles_only_without_curriculum():
    order = ["a", "b", "c"]
    assert grpo.schedule(order, 7, shuffle=False, seed=1) == ["a", "b", "c", "a", "b", "c", "a"]
    s = grpo.schedule(order, 9, shuffle=True, seed=1)
    assert s[:3] == order and all(sorted(s[i:i + 3]) == order for i in (3, 6))
    assert s == grpo.schedule(order, 9, shuffle=True, seed=1)  # deterministic
    assert grpo.schedule(order, 20, shuffle=True, seed=1)[:9] == s  # a longer run extends, never reorders
    assert any(grpo.schedule(order, 30, shuffle=True, seed=1)[i:i + 3] != order for i in range(3, 30, 3))


def test_refinement_prompt_and_draft_choice_are_built_as_documented(root, puzzles):
    tok = models.load_tokenizer(compose(root))
    puzzle, gold = puzzles["prompt"].iloc[0], str(puzzles["answer"].iloc[0])
    # the exact wording: the puzzle, the attempt, the instruction, and the Kaggle boxed line last
    text = grpo_refine.refine_prompt_text(tok, puzzle, "DRAFT")
    user = (f"{puzzle}\n\nHere is an earlier attempt at this puzzle:\n<attempt>\nDRAFT\n</attempt>\n"
            f"Check the attempt, correct any mistakes, and solve the puzzle again.\n{BOXED_INSTRUCTION}")
    assert text == chat_prompt(tok, puzzle + grpo_refine.REFINE_SUFFIX.format(draft="DRAFT"))
    assert text == tok.apply_chat_template([{"role": "user", "content": user}], tokenize=False,
                                           add_generation_prompt=True, enable_thinking=True)
    # the draft's own ids are spliced in, its end-of-turn removed; the result decodes to the documented text
    draft = f"{puzzle.split()[-1]} -> ?\n</think>\n\\boxed{{{gold}}}"
    ids = tok(draft, add_special_tokens=False)["input_ids"]
    spliced = grpo_refine.refine_prompt_ids(tok, puzzle, ids + [tok.eos_token_id])
    assert tok.decode(spliced) == grpo_refine.refine_prompt_text(tok, puzzle, draft)
    assert spliced.count(tok.eos_token_id) == text.count(tok.eos_token)  # only the template's own turn ends
    # the draft kept per group: the highest weighted reward (as TRL sums it), first on ties, unscorable last
    funcs, weights = rewards.build({"correctness": 1.0, "format": 0.2})
    drafts = ["no answer", f"</think>\n\\boxed{{{gold}}}", "</think>\n\\boxed{WRONG}", f"\\boxed{{{gold}}}"]
    row = {"prompt": "p", "answer": gold, "category": "numeral_system", "solver_trace": "", "id": "x", "puzzle": puzzle}
    ids4 = [tok(d, add_special_tokens=False)["input_ids"] for d in drafts]
    scores = grpo_refine.draft_scores(funcs, weights, ["p"] * 4, drafts, ids4, [row] * 4)
    assert scores == pytest.approx([0.0, 1.2, 0.2, 1.1])
    best = grpo_refine.best_drafts
    assert best(scores, 4) == [1] and best(scores, 2) == [1, 3]
    assert best([0.5, 0.5, -math.inf, -math.inf], 2) == [0, 2]
    assert best([-math.inf, 0.0], 2) == [1]
    with pytest.raises(LabError):
        best([1.0, 2.0, 3.0], 2)


def test_group_spread_counts_groups_whose_correctness_never_varies():
    calls = iter([[1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0], [1.0, 1.0, None, 1.0, 0.0, 1.0, 0.0, None]])

    def correctness(prompts=None, completions=(), **kw):
        return next(calls)

    spread = callbacks.GroupSpread(correctness, group=4)
    assert spread.__name__ == "correctness"  # TRL logs rewards under this name
    assert spread(completions=["x"] * 8) == [1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]  # values pass through
    spread(completions=["x"] * 8)
    # call 1: group 1 varies, group 2 is all wrong; call 2: group 1 all right (None = masked), group 2 varies
    assert spread.shares == [0.5, 0.5]


def test_guard_rails_warn_when_correctness_is_flat_though_the_total_reward_varies(root):
    cfg = compose(root, "guard2", "grpo.zero_variance_warn_share=0.8")
    spread = callbacks.GroupSpread(lambda **kw: [0.0] * 8, group=4)
    spread(completions=["x"] * 8)
    guard = callbacks.GuardRails(cfg.grpo, spread)

    class State:
        global_step = 1

    with pytest.warns(UserWarning, match="every sample is equally right or wrong"):
        guard.on_log(None, State, None, logs={"completions/mean_length": 9, "completions/clipped_ratio": 0.0,
                                               "frac_reward_zero_std": 0.0, "reward": 0.1})
    assert len(guard.warnings) == 1


def test_guard_rails_warn_and_record(root):
    cfg = compose(root, "guard", "grpo.truncation_warn_share=0.5", "grpo.zero_variance_warn_share=0.8")
    guard = callbacks.GuardRails(cfg.grpo)

    class State:
        global_step = 3

    with pytest.warns(UserWarning):
        guard.on_log(None, State, None, logs={"completions/mean_length": 9, "completions/clipped_ratio": 0.75,
                                               "frac_reward_zero_std": 0.9, "reward": None})
    guard.on_log(None, State, None, logs={"completions/mean_length": 9, "completions/clipped_ratio": 0.5,
                                          "frac_reward_zero_std": 0.8, "reward": 0.1})  # at the thresholds: quiet
    guard.on_log(None, State, None, logs={"train_runtime": 1.0})  # the final summary is not a step
    assert len(guard.warnings) == 3
    assert "75% of completions hit max_completion_length" in guard.warnings[0]
    assert "90% of groups have zero reward variance" in guard.warnings[1]
    assert "no completion could be scored" in guard.warnings[2]


# ---- on the tiny model -------------------------------------------------------------------------------------

@pytest.mark.slow
def test_grpo_trains_the_adapter_and_generation_uses_it(root, puzzles):
    cfg = compose(root, "train", "grpo.max_steps=3", "grpo.save_steps=10", "grpo.beta=0.04")
    stage, pm, tok = start(cfg)
    start_dir = lora.save_adapter(pm, root / "train_start_adapter")
    base = pm.get_base_model()
    layer = next(lay for lay in base.model.layers if type(lay.mixer).__name__.endswith("Attention"))
    moe = next(lay for lay in base.model.layers if type(lay.mixer).__name__.endswith("MoE"))
    frozen = {"embeddings": base.model.embeddings.weight, "lm_head": base.lm_head.weight,
              "q_proj": layer.mixer.q_proj.base_layer.weight, "router": moe.mixer.gate.weight}
    frozen_before = {k: v.detach().clone() for k, v in frozen.items()}
    lora_before = {n: p.detach().clone() for n, p in pm.named_parameters() if p.requires_grad}

    m, model, log = grpo_train(cfg, stage, puzzles, pm, tok)

    # training happened, every step: finite rewards that vary, each reward's mean and std, KL (beta > 0)
    assert m["steps"] == 3 == len(log) and m["logged_steps"] == [1, 2, 3] and not m["stopped_by_budget"]
    assert all(r is not None and math.isfinite(r) for r in m["reward_per_step"])
    assert max(m["reward_std_per_step"]) > 0 and min(m["zero_variance_share_per_step"]) < 1
    assert set(m["rewards_per_step"]) == {"correctness", "format", "token_mean"}
    for name, d in m["rewards_per_step"].items():
        assert len(d["mean"]) == len(d["std"]) == 3 and all(v is not None for v in d["mean"]), name
    assert max(m["rewards_per_step"]["token_mean"]["std"]) > 0
    assert m["correctness_per_step"] == m["rewards_per_step"]["correctness"]["mean"]
    assert len(m["kl_per_step"]) == 3 and all(v is not None and v >= 0 for v in m["kl_per_step"])
    assert all(g is not None and g > 0 for g in m["grad_norm_per_step"])
    # the budget: infer.max_tokens=12 caps it; TRL generated within it; the barely trained model seldom ends
    # within 12 tokens, so most completions are truncated and the guard rail fired on exactly those steps
    assert m["max_completion_length"] == 12 and max(log["completions/max_length"]) <= 12
    shares = m["truncated_share_per_step"]
    assert len(shares) == len(m["completion_length_per_step"]) == 3 and min(shares) > 0.5
    warn_share = float(cfg.grpo.truncation_warn_share)
    assert sum("hit max_completion_length" in w for w in m["warnings"]) == sum(s > warn_share for s in shares)
    assert not any("zero reward variance" in w for w in m["warnings"])
    saved = pd.read_csv(stage.path("train_log.csv"))
    for col in ("reward", "reward_std", "rewards/token_mean/mean", "rewards/correctness/std", "kl",
                "completions/clipped_ratio", "frac_reward_zero_std", "completions/mean_length"):
        assert col in saved, col
    # LoRA weights moved (every tensor, every family), frozen base weights did not
    assert m["gradient_check_failed"] == [] and m["lora_weight_change"] > 0
    for n, p in model.named_parameters():
        if n in lora_before:
            assert not torch.equal(p.detach(), lora_before[n]), n
    for k, v in frozen.items():
        assert torch.equal(v.detach(), frozen_before[k]), k
    # TRL's frozen "ref" copy (beta > 0) is gone: only the trained adapter is returned and saved
    assert set(model.peft_config) == {"default"}
    out = paths.resolve_path(cfg.grpo.adapter_dir)
    assert (out / "adapter_model.safetensors").is_file() and not (out / "ref").exists()

    # generation after training uses the trained adapter; reloading the saved adapter reproduces it
    text = chat_prompt(tok, puzzles["prompt"].iloc[-1])
    trained = logits(model, tok, text)
    start_model, _ = models.load(cfg, adapter=start_dir)
    reloaded, _ = models.load(cfg, adapter=out)
    assert (trained - logits(start_model, tok, text)).abs().max() > 1e-3
    torch.testing.assert_close(logits(reloaded, tok, text), trained, rtol=1e-5, atol=1e-5)
    from lab.model.generate import Sampling, generate_hf

    g_trained = generate_hf(model, tok, [text], Sampling(max_tokens=8), progress=False)[0][0].text
    assert generate_hf(reloaded, tok, [text], Sampling(max_tokens=8), progress=False)[0][0].text == g_trained


@pytest.mark.slow
def test_grpo_moves_the_policy_towards_the_reward(root, puzzles):
    """The sign is right end to end (rollouts, advantages, the CPU log-prob kernel, the optimiser): rewarding high
    token ids makes sampled completions use higher token ids."""
    from lab.model.generate import Sampling, generate_hf

    cfg = compose(root, "direction", "grpo.max_steps=6", "grpo.save_steps=100", "grpo.learning_rate=5e-3",
                  "grpo.gradient_check=false")
    cfg.grpo.rewards = {"token_mean": 1.0}  # the only reward (a schema field cannot be deleted with ~grpo.rewards)
    stage, pm, tok = start(cfg)
    prompts = [chat_prompt(tok, p) for p in puzzles["prompt"]]

    def mean_id():
        outs = generate_hf(pm, tok, prompts, Sampling(max_tokens=12, n=16, temperature=1.0, seed=99), progress=False)
        return float(np.mean([np.mean(tok(c.text, add_special_tokens=False)["input_ids"] or [0])
                              for comps in outs for c in comps]))

    before = mean_id()
    m, pm, _ = grpo_train(cfg, stage, puzzles, pm, tok)
    after = mean_id()
    assert m["steps"] == 6 and after > before + 40, (before, after)  # ~96 samples: standard error about 5


@pytest.mark.slow
def test_resume_ends_where_an_uninterrupted_run_does(root, puzzles, monkeypatch):
    common = ("grpo.max_steps=4", "grpo.save_steps=2", "grpo.curriculum=false")
    cfg_a = compose(root, "straight", *common)
    m_a, *_ = run(cfg_a, puzzles)
    assert m_a["steps"] == 4 and m_a["resumed_from"] is None
    a = adapter(cfg_a)

    cfg_b = compose(root, "interrupted", *common)
    # 1. stopped by the wall-clock budget after step 1: a checkpoint is saved, the adapter too
    cfg_b1 = compose(root, "interrupted", *common, "grpo.wall_clock_budget_min=1e-6")
    m1, *_ = run(cfg_b1, puzzles)
    ck = paths.resolve_path(cfg_b.run_dir) / "checkpoints" / "03_grpo"
    assert m1["stopped_by_budget"] and m1["steps"] == 1 < m1["max_steps"] == 4
    for f in ("adapter_model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json"):
        assert (ck / "checkpoint-1" / f).is_file(), f
    assert (paths.resolve_path(cfg_b1.grpo.adapter_dir) / "adapter_model.safetensors").is_file()
    order = pd.read_csv(paths.resolve_path(cfg_b.run_dir) / "checkpoints" / "03_grpo" / "prompt_order.csv", dtype={"id": str})

    # 2. resumed (pass rates are NOT estimated again), stopped after step 3; 3. resumed to the end
    def no_pass_rates(*a, **k):
        raise AssertionError("pass rates re-estimated on resume")

    monkeypatch.setattr(grpo, "pass_rate_table", no_pass_rates)
    original = callbacks.trainer_callbacks
    monkeypatch.setattr(callbacks, "trainer_callbacks", lambda *args: original(*args) + [_stop_at(3)])
    m2, *_ = run(cfg_b, puzzles)
    assert m2["steps"] == 3 and m2["resumed_from"].endswith("checkpoint-1")
    monkeypatch.setattr(callbacks, "trainer_callbacks", original)
    m3, *_ = run(cfg_b, puzzles)
    assert m3["steps"] == 4 and m3["resumed_from"].endswith("checkpoint-3") and not m3["already_finished"]
    b = adapter(cfg_b)
    assert set(a) == set(b)
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-5, atol=1e-7, msg=k)  # bit-identical on CPU
    # the same samples at every step: the rewards of the stitched log equal the uninterrupted run's
    assert m3["logged_steps"] == [1, 2, 3, 4]
    assert m3["reward_per_step"] == pytest.approx(m_a["reward_per_step"], abs=1e-4)
    assert pd.read_csv(paths.resolve_path(cfg_b.run_dir) / "checkpoints" / "03_grpo" / "prompt_order.csv",
                       dtype={"id": str})["id"].tolist() == order["id"].tolist()
    # the adapter after step 3 differs from the final one: the resumed run really trained
    from safetensors.torch import load_file

    c3 = load_file(str(ck / "checkpoint-3" / "adapter_model.safetensors"))
    assert any(not torch.equal(c3[k], b[k]) for k in b)

    # 4. a finished run is not trained further (transformers would add a step): same adapter, 4 steps
    m4, *_ = run(cfg_b, puzzles)
    assert m4["already_finished"] and m4["steps"] == 4 and m4["reward_per_step"] == m3["reward_per_step"]
    b4 = adapter(cfg_b)
    assert all(torch.equal(b4[k], b[k]) for k in b)

    # 5. a changed configuration does not resume silently: asked to resume (grpo.resume=true passed) it refuses
    # (unasked it starts afresh with a note: tests/test_rerun.py); resume=false starts over
    cfg_c = compose(root, "interrupted", *common, "grpo.learning_rate=1e-3")
    lr_was = cfg_b.grpo.learning_rate
    with pytest.raises(LabError, match=rf"different GRPO configuration \(grpo.learning_rate: {lr_was} -> 0.001\)"):
        run(cfg_c, puzzles, ["grpo.resume=true"])
    monkeypatch.undo()
    cfg_d = compose(root, "interrupted", *common, "grpo.max_steps=1", "grpo.resume=false", "grpo.gradient_check=false")
    m_d, *_ = run(cfg_d, puzzles)
    assert m_d["resumed_from"] is None and m_d["steps"] == 1 and not (ck / "checkpoint-3").exists()


@pytest.mark.slow
def test_refine_trains_on_refinements_of_the_best_draft(root, puzzles, monkeypatch):
    cfg = compose(root, "refine", "grpo.refine=true", "grpo.max_steps=1", "grpo.gradient_check=false")
    stage, pm, tok = start(cfg)
    built = []
    original = grpo_refine.refine_prompt_ids
    monkeypatch.setattr(grpo_refine, "refine_prompt_ids", lambda *a: built.append(original(*a)) or built[-1])
    m, model, log = grpo_train(cfg, stage, puzzles, pm, tok)
    assert m["refine"] and m["steps"] == 1 and m["max_completion_length"] == 12
    assert len(built) == 2  # one refinement prompt per prompt of the step
    for ids in built:
        assert "\n</attempt>\nCheck the attempt, correct any mistakes" in tok.decode(ids)
    rec = pd.read_csv(stage.path("refinements.csv"), dtype={"id": str})
    assert len(rec) == 2 and (rec["step"] == 1).all() and (rec["draft_tokens"] <= 12).all()
    for _, r in rec.iterrows():
        scores = json.loads(r["draft_rewards"])
        assert len(scores) == 4 and r["draft_reward"] == pytest.approx(max(scores))
    assert {"refine/best_draft_reward_mean", "refine/draft_reward_mean"} <= set(log.columns)
    assert log["refine/best_draft_reward_mean"].iloc[0] >= log["refine/draft_reward_mean"].iloc[0]
    assert math.isfinite(m["reward_per_step"][0]) and m["lora_weight_change"] > 0


@pytest.mark.slow
def test_grpo_trains_an_lm_head_lora(root, puzzles):
    """An adapter with an lm_head LoRA (the competition preset's) trains under GRPOTrainer too (lab.model.lora), with
    TRL's reference adapter (beta > 0); the frozen head does not move."""
    cfg = compose(root, "lm_head", "sft.lora.targets=[q_proj,lm_head]", "grpo.beta=0.04", "grpo.save_steps=10")
    stage, pm, tok = start(cfg)
    head = pm.get_base_model().lm_head
    base_before = head.base_layer.weight.detach().clone()
    before = {n: p.detach().clone() for n, p in pm.named_parameters() if "lm_head.lora_" in n}
    m, model, _ = grpo_train(cfg, stage, puzzles, pm, tok)
    assert m["steps"] == 2 and m["gradient_check_failed"] == [] and len(before) == 2
    params = dict(model.named_parameters())
    for n, v in before.items():
        assert not torch.equal(params[n].detach(), v), n
    assert torch.equal(head.base_layer.weight.detach(), base_before)
