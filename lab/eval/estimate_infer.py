"""Projected costs of the generation-bound stages on one card: greedy evaluation, 04_vote, GRPO's pass rates and its
optimizer step. For `python -m lab estimate` (its `eval`, `vote` and `grpo` sections) and for 03_grpo / 04_vote to
print before any model loads. Every figure is PROJECTED from the constants below, none is measured on the real
model: each function returns the figure, the arithmetic as text (every constant named with its value) and the
constants with where each comes from.

The model of a vLLM decode step (`decode_step_s`): with `infer.max_num_seqs` = 64 sequences in flight, each token
routed to 6 of 128 experts in each MoE layer, a step touches almost every expert (128 x (1 - (1 - 6/128)^64) = 122 of
128), so it reads about the whole 59 GiB of bf16 weights: memory-bound. Issue 43 puts the step at about 30 ms on an
H100 (the 59 GiB read at the H100's 3.35 TB/s alone takes 19 ms); other cards scale by their memory bandwidth. Prefill
(1,000 prompts of a few hundred tokens: about 3e5 tokens, seconds) and engine start-up are left out.

Completion lengths (`mean_completion_tokens`): a finished completion of a trained adapter is taken as long as the
derivation traces SFT trains on (RESULTS.md, "First contact with a GPU": prompt + trace mean 1,209 tokens with the
real tokenizer, used whole, so an upper bound for the trace alone), and a share `TRUNCATED_SHARE` of completions is
assumed to run to the budget (`infer.max_tokens`); both are assumptions until a real evaluation measures them.

Evaluation without waves (lab.model.generate: every prompt in one hand-over): decode steps = sequences x mean length
/ max_num_seqs, plus one budget's worth of steps for the tail (the last, longest completions run with the batch no
longer full). In waves of 64 (the lab before issue 43), each wave costs its longest completion: with a 5% truncated
share, 96% of waves hold one that runs to the budget; `eval_hours_per_1000` reports that figure as `in_waves_hours`
for comparison.

GRPO rollouts from the served adapter, on one GPU (`grpo.rollout_backend=vllm`, built in `lab.train.rollouts`; these
figures are PROJECTED, nothing of it has run on a GPU):
- Rounds. One generation round samples `grpo.steps_per_generation` (S) optimizer steps' prompts x num_generations in
  one hand-over to a vLLM engine on the base model with the current adapter packed by the submission's own code
  (`lab.model.submission.pack`) and served through a `LoRARequest` with a new lora_int_id each round: never merged,
  so what is sampled is what would be submitted (no bf16 merge drift, `lab.train.grpo.check_backend`). The S steps
  then train on those completions, the later ones lagging the policy by up to S - 1 steps; TRL 1.15 corrects that
  with its old log-probabilities and clipped ratio (computed when `gradient_accumulation_steps % steps_per_generation
  != 0`, trl/trainer/grpo_trainer.py `_generate_and_score_completions`; `lab.train.memory.micro_batch`). TRL's
  `vllm_importance_sampling_correction` runs only with its own `use_vllm`, which the lab never sets: the
  sampler-vs-trainer gap is logged (`rollout/logp_diff_*`), not corrected.
- Taking turns on the card. The engine and the training model cannot both hold 59 GiB on an 80 or 96 GB card. The
  engine sleeps while the trainer trains, and the trainer moves its frozen base weights to CPU memory while the
  engine samples (the LoRA and its optimizer states stay on the card): `lab.train.rollouts.engine_phase`. Sleep
  level 1 (`LLM.sleep(level=1)`: weights offloaded to CPU memory, KV cache freed; `wake_up()` copies them back)
  moves 4 x 59 GiB per round over PCIe (`switch_gbps`, an assumed constant rate; `engine_phase` moves the trainer's
  weights one tensor at a time, unpinned, so the real rate may be lower) and holds both copies on the host at a
  switch, about 134 GiB with a margin; level 2 (weights discarded, reloaded from the model folder at wake-up,
  `collective_rpc("reload_weights")`) moves 2 x 59 GiB and reads the weights from disk (`disk_gbps`, assumed),
  holding them once. `grpo.vllm_sleep_level` null picks level 1 only on a host that holds the weights twice
  (`lab.train.memory.sleep_level`; a 128 GiB H100 machine does not), so this projection takes level 2 unless the
  config says 1. Measured on CPU (the vLLM lane, tiny model): packing the adapter and loading its LoRARequest take
  hundredths of a second per round, and reloading the weights from the model folder restores what a change to
  them broke (tests/vllm_lane/test_vllm_rollouts.py); the sleep itself is CUDA only, so the lane says nothing about
  the GPU switch's seconds; the packing of the real adapter (its routed experts split per expert) is not in this
  estimate.
- Why this beats transformers rollouts: `generate` with the adapter attached rebuilds the experts' LoRA delta at every
  decode step (issue 43: 16-37 minutes per optimizer step on an H100), while vLLM applies the LoRA in its kernels.
- Pass rates: the same engine, before step 1, `grpo.n_prompts` x `grpo.pass_rate_k` samples in one hand-over, written
  per prompt as each finishes (`lab.train.grpo.pass_rate_table` with a cache).
Training per optimizer step: prompts_per_step x num_generations completions, each one micro-step at batch 1, at the
H100 projection of RESULTS.md ("First contact with a GPU": 1.05 s per micro-step plus 73 microseconds per token,
forward + backward with checkpointing), plus one forward (a third of that) for the old log-probabilities the
importance-sampling correction needs; other cards scaled by memory bandwidth (the fixed part is PEFT's expert-delta
rebuild, memory traffic, by RESULTS.md's reading).
"""

from __future__ import annotations

import math

from lab import LabError

GIB = 2 ** 30

# name -> (value, source); every figure's arithmetic names the ones it uses
CONSTANTS = {
    "h100_step_s": (0.030, "issue 43's estimate of one vLLM decode step of 64 sequences on an H100 (projected; the "
                           "59 GiB weight read alone takes 19 ms at 3.35 TB/s)"),
    "weights_gib": (59.0, "issue 43 / README: the real model's bf16 weights"),
    "h100_tbps": (3.35, "NVIDIA H100 SXM5 80GB datasheet, HBM3 memory bandwidth (RESULTS.md's card: H100 80GB HBM3)"),
    "h200_tbps": (4.8, "NVIDIA H200 datasheet, HBM3e memory bandwidth"),
    "rtx_pro_6000_tbps": (1.792, "NVIDIA RTX PRO 6000 Blackwell datasheet, GDDR7 memory bandwidth"),
    "trace_tokens": (1209, "RESULTS.md 'First contact with a GPU': prompt + derivation trace mean, real tokenizer, "
                           "1,837 dev rows (assumed length of a finished completion)"),
    "truncated_share": (0.05, "assumed share of completions running to the budget (not measured on the real model)"),
    "prompt_tokens": (300, "assumed mean prompt length in tokens (the chat-rendered puzzle)"),
    "micro_step_s": (1.05, "RESULTS.md 'First contact with a GPU': projected H100 micro-step, token-independent part"),
    "per_token_s": (73e-6, "RESULTS.md 'First contact with a GPU': projected H100 micro-step, per token"),
    "old_logp_forward": (1 / 3, "assumed cost of the extra forward for old log-probabilities, as a share of "
                                "forward + backward"),
    "switch_gbps": (25.0, "assumed effective host<->GPU copy rate, GB/s (PCIe Gen5 x16: 64 GB/s theoretical)"),
    "disk_gbps": (2.0, "assumed read rate of the model folder from local NVMe, GB/s, for a sleep-level-2 reload "
                       "(not measured)"),
    "steps_per_generation": (4, "optimizer steps per generation round when the config has none (grpo.steps_per_generation "
                                "is used when set: conf/grpo/nemotron_nano.yaml sets 4)"),
}
CARD_BANDWIDTH = {"h100_80gb": "h100_tbps", "h200": "h200_tbps", "rtx_pro_6000": "rtx_pro_6000_tbps"}


def _c(name: str) -> float:
    return CONSTANTS[name][0]


def _cited(*names: str) -> dict:
    return {n: {"value": CONSTANTS[n][0], "source": CONSTANTS[n][1]} for n in names}


def card_name(card) -> str:
    """A `gpu=` preset's name, from the name itself or the composed `cfg.gpu` node."""
    name = str(getattr(card, "name", card))
    if name not in CARD_BANDWIDTH:
        raise LabError(f"no projection for gpu={name}: the estimates know {', '.join(CARD_BANDWIDTH)} (conf/gpu)")
    return name


def decode_step_s(card) -> tuple[float, str, list[str]]:
    """(seconds per vLLM decode step of max_num_seqs sequences on `card`, its arithmetic, constants used)."""
    bw = CARD_BANDWIDTH[card_name(card)]
    s = _c("h100_step_s") * _c("h100_tbps") / _c(bw)
    text = f"decode step = h100_step_s {_c('h100_step_s')} s x h100_tbps {_c('h100_tbps')} / {bw} {_c(bw)} = {s:.4f} s"
    return s, text, ["h100_step_s", "h100_tbps", bw]


def mean_completion_tokens(budget: int) -> tuple[float, str]:
    """Mean completion length under a budget of `budget` tokens: finished ones as long as a trace, a share run out."""
    t, s = min(_c("trace_tokens"), budget), _c("truncated_share")
    mean = (1 - s) * t + s * budget
    return mean, (f"mean completion = (1 - truncated_share {s}) x trace_tokens {t:g} + truncated_share {s} x budget "
                  f"{budget} = {mean:.0f} tokens")


def generation_s(sequences: int, budget: int, slots: int, card) -> tuple[float, str, list[str]]:
    """Seconds to decode `sequences` completions handed over at once with `slots` in flight (no waves): decode
    steps = sequences x mean length / slots, plus one budget of steps for the tail."""
    step, step_text, used = decode_step_s(card)
    mean, mean_text = mean_completion_tokens(budget)
    steps = sequences * mean / slots + budget
    secs = steps * step
    text = (f"{mean_text}; {step_text}; steps = {sequences} sequences x {mean:.0f} / {slots} slots + {budget} (tail) "
            f"= {steps:,.0f}; time = {steps:,.0f} x {step:.4f} s = {secs:,.0f} s")
    return secs, text, used + ["trace_tokens", "truncated_share"]


def _result(name: str, value: float, unit: str, text: str, used: list[str], **extra) -> dict:
    return {"figure": name, name: round(value, 3), "unit": unit, "projected": True, "arithmetic": text,
            "constants": _cited(*dict.fromkeys(used)), **extra}


def eval_hours_per_1000(cfg, card) -> dict:
    """Greedy evaluation of 1,000 puzzles at the scorer's settings (infer.max_tokens, infer.max_num_seqs), every
    prompt handed over at once; the same in waves of max_num_seqs for comparison."""
    budget, slots = int(cfg.infer.max_tokens), int(cfg.infer.max_num_seqs)
    secs, text, used = generation_s(1000, budget, slots, card)
    step = decode_step_s(card)[0]
    s = _c("truncated_share")
    waves = math.ceil(1000 / slots)
    p_long = 1 - (1 - s) ** slots  # a wave with at least one completion that runs to the budget
    wave_steps = p_long * budget + (1 - p_long) * min(_c("trace_tokens"), budget)
    wave_h = waves * wave_steps * step / 3600
    text += (f"; hours = {secs:,.0f} / 3600 = {secs / 3600:.2f} h. In waves of {slots} (each wave waiting for its "
             f"longest): {waves} waves "
             f"x ({p_long:.2f} x {budget} + {1 - p_long:.2f} x {min(_c('trace_tokens'), budget):g}) steps x {step:.4f} s "
             f"= {wave_h:.2f} h")
    return _result("hours_per_1000", secs / 3600, "hours per 1,000 puzzles", text, used,
                   in_waves_hours=round(wave_h, 3))


def vote_hours(cfg, card, puzzles: int = 1000) -> dict:
    """04_vote at the configured k: `puzzles` held-out puzzles x vote.k samples handed over at once (k samples in
    full: live early stopping draws fewer, as many as its rounds need, which only a run measures)."""
    budget, slots, k = int(cfg.infer.max_tokens), int(cfg.infer.max_num_seqs), int(cfg.vote.k)
    secs, text, used = generation_s(puzzles * k, budget, slots, card)
    text += f" (k = vote.k {k} samples x {puzzles} puzzles); hours = {secs / 3600:.2f} h"
    return _result("hours", secs / 3600, f"hours for {puzzles:,} puzzles at k={k}", text, used, k=k,
                   puzzles=puzzles)


def _grpo_budget(cfg) -> int:
    b = cfg.grpo.get("max_completion_length")
    return int(b) if b is not None else int(cfg.infer.max_tokens)


def pass_rate_hours(cfg, card) -> dict:
    """GRPO's pass-rate sampling before step 1: grpo.n_prompts x grpo.pass_rate_k samples through the vLLM engine
    with the start adapter served, in one hand-over (the GRPO completion budget, infer.max_num_seqs in flight)."""
    g = cfg.grpo
    n = int(g.n_prompts) * int(g.pass_rate_k)
    secs, text, used = generation_s(n, _grpo_budget(cfg), int(cfg.infer.max_num_seqs), card)
    text += f" ({g.n_prompts} prompts x pass_rate_k {g.pass_rate_k}); hours = {secs / 3600:.2f} h"
    return _result("pass_rate_hours", secs / 3600, "hours", text, used)


def grpo_step_minutes(cfg, card) -> dict:
    """Minutes per GRPO optimizer step with rollouts from the served adapter (the module docstring's design):
    (one round's generation + the phase switches) / S + training of one step."""
    g = cfg.grpo
    S = int(g.get("steps_per_generation") or _c("steps_per_generation"))
    group = int(g.prompts_per_step) * int(g.num_generations)
    budget, slots = _grpo_budget(cfg), int(cfg.infer.max_num_seqs)
    gen, gen_text, used = generation_s(S * group, budget, slots, card)
    name = card_name(card)
    bw = CARD_BANDWIDTH[name]
    level = g.get("vllm_sleep_level")
    level = 2 if level is None else int(level)  # null: chosen from the host's memory at run time; project the slower
    weights_gb = _c("weights_gib") * GIB / 1e9
    if level == 1:  # engine out and in, trainer's base out and in
        moved = 4 * weights_gb
        switch = moved / _c("switch_gbps")
        switch_text = (f"Switch per round (sleep level 1) = 4 x weights_gib {_c('weights_gib')} GiB ({moved:.0f} GB) / "
                       f"switch_gbps {_c('switch_gbps')} = {switch:.1f} s")
    else:  # trainer's base out and in; the engine's weights reloaded from disk
        moved = 2 * weights_gb
        switch = moved / _c("switch_gbps") + weights_gb / _c("disk_gbps")
        note = (", grpo.vllm_sleep_level null: level 1 where the host holds the weights twice"
                if g.get("vllm_sleep_level") is None else "")
        switch_text = (f"Switch per round (sleep level 2{note}) = 2 x weights_gib "
                       f"{_c('weights_gib')} GiB ({moved:.0f} GB) / switch_gbps {_c('switch_gbps')} + reload "
                       f"{weights_gb:.0f} GB / disk_gbps {_c('disk_gbps')} = {switch:.1f} s")
    mean, _ = mean_completion_tokens(budget)
    scale = _c("h100_tbps") / _c(bw)
    micro = (_c("micro_step_s") + _c("per_token_s") * (_c("prompt_tokens") + mean)) * scale
    train = group * micro * (1 + _c("old_logp_forward"))
    minutes = ((gen + switch) / S + train) / 60
    text = (f"generation round of S = steps_per_generation {S} steps x {group} completions ({g.prompts_per_step} prompts x "
            f"{g.num_generations}): {gen_text}. {switch_text}. Training per step = {group} "
            f"micro-steps x (micro_step_s {_c('micro_step_s')} + per_token_s {_c('per_token_s'):g} x (prompt_tokens "
            f"{_c('prompt_tokens'):g} + {mean:.0f})) x bandwidth scale {scale:.2f} x (1 + old_logp_forward "
            f"{_c('old_logp_forward'):.2f}) = {train:.0f} s. Minutes per step = (({gen:,.0f} + {switch:.1f}) / {S} + "
            f"{train:.0f}) / 60 = {minutes:.2f}")
    used += ["weights_gib", "switch_gbps", *(["disk_gbps"] if level == 2 else []), "micro_step_s", "per_token_s", "prompt_tokens", "old_logp_forward",
             "steps_per_generation"]
    return _result("step_minutes", minutes, "minutes per optimizer step", text, used,
                   parts_s={"generation_per_step": round(gen / S, 1), "switch_per_step": round(switch / S, 1),
                            "training_per_step": round(train, 1)}, steps_per_generation=S, sleep_level=level)


def sections(cfg, card) -> dict:
    """The JSON sections `python -m lab estimate` adds: grpo (step_minutes, pass_rate_hours), eval
    (hours_per_1000), vote (hours), each with its arithmetic and constants."""
    step, rates = grpo_step_minutes(cfg, card), pass_rate_hours(cfg, card)
    return {"grpo": {"step_minutes": step["step_minutes"], "pass_rate_hours": rates["pass_rate_hours"],
                     "detail": {"step_minutes": step, "pass_rate_hours": rates}},
            "eval": eval_hours_per_1000(cfg, card), "vote": vote_hours(cfg, card)}


def report(cfg, card) -> str:
    """The sections as lines for a terminal (03_grpo and 04_vote print theirs before any model loads)."""
    out = [f"PROJECTED on gpu={card_name(card)} (lab.eval.estimate_infer: constants and sources in its CONSTANTS)"]
    for label, r in (("GRPO minutes per optimizer step", grpo_step_minutes(cfg, card)),
                     ("GRPO pass-rate sampling, hours", pass_rate_hours(cfg, card)),
                     ("greedy evaluation, hours per 1,000 puzzles", eval_hours_per_1000(cfg, card)),
                     ("04_vote, hours", vote_hours(cfg, card))):
        out.append(f"- {label}: {r[r['figure']]:.2f}\n    {r['arithmetic']}")
    return "\n".join(out)
