"""Projected costs of the generation-bound stages on one card: greedy evaluation, 04_vote, GRPO's pass rates and its
optimizer step, for `python -m lab estimate` and for 03_grpo / 04_vote to print before any model loads. Every figure is
PROJECTED from `CONSTANTS` (each with its source), none measured on the real model; each function returns the figure,
its arithmetic as text and the constants it used. The decode-step model, the completion lengths and the parts of a GRPO
round: docs/internals.md, lab.plan.estimate_infer.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lab import LabError

GIB = 2 ** 30
MEASURED_MODEL = Path(__file__).with_name("nemotron_3_nano_config.json")  # Nemotron-3-Nano-30B-A3B's config values

# name -> (value, source); every figure's arithmetic names the ones it uses
CONSTANTS = {
    "h100_step_s": (0.030, "the lab's estimate of one vLLM decode step of 64 sequences on an H100 (projected; the "
                           "59 GiB weight read alone takes 19 ms at 3.35 TB/s)"),
    "weights_gib": (59.0, "README: the real model's bf16 weights"),
    "h100_tbps": (3.35, "NVIDIA H100 SXM5 80GB datasheet, HBM3 memory bandwidth (RESULTS.md's card: H100 80GB HBM3)"),
    "h200_tbps": (4.8, "NVIDIA H200 datasheet, HBM3e memory bandwidth"),
    "rtx_pro_6000_tbps": (1.792, "NVIDIA RTX PRO 6000 Blackwell datasheet, GDDR7 memory bandwidth"),
    "h100_tflops": (989.0, "NVIDIA H100 SXM5 80GB datasheet, bf16 dense tensor peak"),
    "h200_tflops": (989.0, "NVIDIA H200 SXM datasheet, bf16 dense tensor peak (the H100's die)"),
    "rtx_pro_6000_tflops": (500.0, "ASSUMED: NVIDIA publishes 4,000 AI TOPS for the RTX PRO 6000 Blackwell (FP4 with "
                                   "2:4 sparsity): /2 dense, /4 for bf16; no bf16 datasheet figure"),
    "decode_gemm_share": (0.5, "assumed share of the bf16 peak a decode step's dense matmuls reach once the sequences "
                               "in flight make them compute-bound (not measured)"),
    "trace_tokens": (1209, "RESULTS.md 'First contact with a GPU': prompt + derivation trace mean, real tokenizer, "
                           "1,837 dev rows (assumed length of a finished completion)"),
    "trace_median_tokens": (823, "RESULTS.md 'First contact with a GPU': prompt + derivation trace p50, the same rows "
                                 "(with trace_tokens, a log-normal's median and mean)"),
    "inflight_kv_margin": (1.25, "assumed safety factor on the KV a sequence holds in flight: a truncated_share twice "
                                 "the assumed one lengthens the in-flight context 1.18x; beyond it vLLM preempts and "
                                 "recomputes a request, it does not fail (docs/internals.md)"),
    "truncated_share": (0.05, "assumed share of completions running to the budget (not measured on the real model)"),
    "prompt_tokens": (300, "assumed mean prompt length in tokens (the chat-rendered puzzle)"),
    "old_logp_forward": (1 / 3, "assumed cost of the extra forward for old log-probabilities, as a share of "
                                "forward + backward"),
    "h100_step_seqs": (64, "the sequences in flight h100_step_s was estimated for (infer.max_num_seqs)"),
    "switch_gbps": (25.0, "assumed effective host<->GPU copy rate, GB/s (PCIe Gen5 x16: 64 GB/s theoretical)"),
    "disk_gbps": (2.0, "assumed read rate of the model folder from local NVMe, GB/s, for a sleep-level-2 reload "
                       "(not measured)"),
    "engine_start_s": (60.0, "assumed seconds a vLLM engine takes to start beside reading its weights (compile cache "
                             "warm, CUDA graphs captured); not measured: python -m lab calibrate records start_s on "
                             "random weights"),
    "steps_per_generation": (4, "optimizer steps per generation round when the config has none "
                                "(grpo.steps_per_generation is used when set: conf/grpo/nemotron_nano.yaml sets 4)"),
}
CARD_BANDWIDTH = {"h100_80gb": "h100_tbps", "h200": "h200_tbps", "rtx_pro_6000": "rtx_pro_6000_tbps"}
CARD_PEAK = {"h100_80gb": "h100_tflops", "h200": "h200_tflops", "rtx_pro_6000": "rtx_pro_6000_tflops"}


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


def mean_completion_tokens(budget: int) -> tuple[float, str]:
    """Mean completion length under a budget of `budget` tokens: finished ones as long as a trace, a share run out."""
    t, s = min(_c("trace_tokens"), budget), _c("truncated_share")
    mean = (1 - s) * t + s * budget
    return mean, (f"mean completion = (1 - truncated_share {s}) x trace_tokens {t:g} + truncated_share {s} x budget "
                  f"{budget} = {mean:.0f} tokens")


def inflight_context_tokens(budget: int) -> tuple[float, str]:
    """Mean context of the sequences in flight when slots are kept full: a completion of length c stays in flight for
    c steps at positions 0..c, so the in-flight mean is length-biased, E[c^2] / (2 E[c]), plus the prompt. Finished
    completions log-normal (trace_median_tokens, trace_tokens: E[t^2] = mean^4 / median^2), a truncated_share at the
    budget. What the rollout engine's slots are sized by (`lab.plan.grpo_policy.generation_phase`)."""
    t, med = min(_c("trace_tokens"), budget), _c("trace_median_tokens")
    s, p = _c("truncated_share"), _c("prompt_tokens")
    mean = (1 - s) * t + s * budget
    second = (1 - s) * t ** 4 / min(med, t) ** 2 + s * budget ** 2
    ctx = p + second / (2 * mean)
    return ctx, (f"in flight: prompt_tokens {p:g} + E[c^2] / (2 E[c]) with c = trace_tokens {t:g} (log-normal, "
                 f"trace_median_tokens {med:g}: E[t^2] = {t:g}^4 / {min(med, t):g}^2) or, for truncated_share {s}, "
                 f"the budget {budget}: {p:g} + {second:,.0f} / (2 x {mean:.0f}) = {ctx:,.0f} tokens")


def step_model(card, seq_bytes: float = 0.0, decode: dict | None = None):
    """(seconds of one decode step as a function of the sequences n in flight, its arithmetic, constants used).
    `decode` ({"steps": {n: seconds}, "measured_by": text}, `lab.plan.estimate.measured_decode`): the steps
    `python -m lab calibrate` timed on the card, linear between its batch sizes and past the largest at its last
    slope (their short contexts leave out the KV a longer one reads: 6 kB a token a sequence).

    Else projected: a step reads what it touches at the card's bandwidth: the weights outside the routed experts,
    the experts its n tokens are routed to (vLLM's fused MoE reads only experts with tokens: `experts_touched`) and
    `seq_bytes` of state per sequence (its Mamba state read and written, its KV read:
    `lab.plan.estimate.rollout_figures`). The rest of h100_step_s at h100_step_seqs is a per-step cost (launches,
    sampling, scheduling), scaled by bandwidth like the step, so at h100_step_seqs the step is h100_step_s x
    h100_tbps / the card's on every card. Once the sequences make the dense matmuls (the parameters outside the
    routed experts and the input embedding, 2 FLOP each a token) slower at decode_gemm_share of the card's bf16 peak
    than reading their weights, the step waits for the difference (a roofline; the routed experts get a few tokens
    each and stay memory-bound)."""
    name = card_name(card)
    bw = CARD_BANDWIDTH[name]
    if decode:
        xs = np.array(sorted(decode["steps"]), dtype=float)
        ys = np.array([decode["steps"][n] for n in sorted(decode["steps"])], dtype=float)
        slope = max(0.0, (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])) if len(xs) > 1 else 0.0

        def measured(n):
            n = np.asarray(n, dtype=float)
            return np.where(n <= xs[-1], np.interp(n, xs, ys), ys[-1] + (n - xs[-1]) * slope)

        points = ", ".join(f"{int(x)}: {y * 1e3:.1f} ms" for x, y in zip(xs, ys))
        return measured, (f"decode step with n sequences in flight MEASURED at n = {points} ({decode['measured_by']}), "
                          "linear between them and past the last at its slope"), []
    experts, e, k, e_text = routed_experts()
    rest = _c("weights_gib") * GIB - experts
    dense = rest / 2 - embedding_params()  # parameters a token multiplies by (bf16: 2 B each)
    h100, card_bps = _c("h100_tbps") * 1e12, _c(bw) * 1e12
    flops = _c(CARD_PEAK[name]) * 1e12 * _c("decode_gemm_share")
    n0 = _c("h100_step_seqs")

    def read(n):
        return rest + experts * experts_touched(n, e, k) / e + n * seq_bytes

    def compute_wait(n):  # the dense matmuls' time beyond reading their weights
        return np.maximum(0.0, 2 * dense * np.asarray(n, dtype=float) / flops - 2 * dense / card_bps)

    fixed = max(0.0, _c("h100_step_s") - read(n0) / h100) * _c("h100_tbps") / _c(bw)

    def step(n):
        return fixed + read(n) / card_bps + compute_wait(n)

    state = f" + n x {seq_bytes / 1e6:.0f} MB of state" if seq_bytes else ""
    text = (f"decode step with n sequences in flight = {fixed * 1e3:.1f} ms per step (h100_step_s {_c('h100_step_s')} "
            f"s at h100_step_seqs {n0:g} less its {read(n0) / 1e9:.1f} GB read at h100_tbps {_c('h100_tbps')}, x "
            f"h100_tbps / {bw} {_c(bw)}) + (weights_gib {_c('weights_gib')} GiB less {experts / GIB:.1f} GiB of routed "
            f"experts + the experts touched{state}) / {_c(bw)} TB/s + what the dense matmuls take beyond reading "
            f"their weights: 2 x {dense / 1e9:.2f}B parameters x n / ({CARD_PEAK[name]} {_c(CARD_PEAK[name]):g} "
            f"TFLOP/s x decode_gemm_share {_c('decode_gemm_share')}), from n = {flops / card_bps:.0f}; {e_text}")
    return step, text, ["h100_step_s", "h100_step_seqs", "h100_tbps", "weights_gib", bw, CARD_PEAK[name],
                        "decode_gemm_share"]


def experts_touched(n, e: int, k: int):
    """Distinct experts of `e` that `n` tokens, each routed to `k`, touch in one MoE layer, expected under uniform
    routing: e x (1 - (1 - k/e)^n). For a fixed number of routed picks uniform routing touches the most experts, so
    a trained router reads no more."""
    return e * (1 - (1 - k / e) ** np.asarray(n, dtype=float))


@functools.lru_cache(maxsize=1)
def _measured_values() -> str:
    return MEASURED_MODEL.read_text(encoding="utf-8")


def measured_values() -> dict:
    """The measured model's config.json values (`MEASURED_MODEL`, shipped with the package): the model the estimates
    were measured on and project."""
    return json.loads(_measured_values())


def routed_experts() -> tuple[float, int, int, str]:
    """(bf16 bytes of the routed experts, experts per MoE layer, experts per token, the arithmetic) of the measured
    model (`measured_values`): up and down projections, no gate (relu2), per expert."""
    v = measured_values()
    layers, e, k = v["hybrid_override_pattern"].count("E"), int(v["n_routed_experts"]), int(v["num_experts_per_tok"])
    h, i = int(v["hidden_size"]), int(v["moe_intermediate_size"])
    b = layers * e * 2 * h * i * 2
    return b, e, k, (f"routed experts {layers} MoE layers x {e} x (up + down) 2 x {h} x {i} x 2 B = {b / GIB:.1f} GiB "
                     f"({MEASURED_MODEL.name}); experts touched by n tokens = {e} x (1 - (1 - {k}/{e})^n) (uniform "
                     f"routing: the most n tokens touch; vLLM's fused MoE skips experts with no token, "
                     f"docs/internals.md)")


def embedding_params() -> int:
    """The input embedding's parameters (vocab x hidden: a lookup, no matmul) of the measured model."""
    v = measured_values()
    return int(v["vocab_size"]) * int(v["hidden_size"])


def completion_survival(budget: int) -> np.ndarray:
    """P(a completion is still decoding after t tokens), t = 0..budget-1, under the length model of
    `mean_completion_tokens`: a finished completion log-normal (trace_median_tokens, trace_tokens), capped at the
    budget; a truncated_share runs to the budget."""
    from scipy.special import erfc

    t, med = _c("trace_tokens"), _c("trace_median_tokens")
    sigma = math.sqrt(2 * math.log(max(t, med) / med))
    x = np.arange(budget, dtype=float)
    z = (np.log(np.maximum(x, 1e-9)) - math.log(med)) / (sigma * math.sqrt(2)) if sigma else None
    finished = 0.5 * erfc(z) if sigma else (x < med).astype(float)
    s = _c("truncated_share")
    return (1 - s) * finished + s


def generation_s(sequences: int, budget: int, slots: int, card, seq_bytes: float = 0.0,
                 decode: dict | None = None) -> tuple[float, str, list[str]]:
    """Seconds to decode `sequences` completions handed over at once with `slots` in flight (no waves). While
    sequences wait, every slot is busy: (sequences - slots) x mean length / slots steps at `slots` in flight. Then
    the drain: the last ones in flight finish over at most `budget` steps, their number falling as each ends
    (`completion_survival`: a fresh start's lengths when all fit at once, else their remaining lengths), each step
    costing what its sequences touch (`step_model`; `decode`: measured steps). The expected count in flight is used
    per step: the step is concave in it, so this bounds the expected time from above."""
    step, step_text, used = step_model(card, seq_bytes, decode)
    mean, mean_text = mean_completion_tokens(budget)
    alive = completion_survival(budget)
    queue = max(0, sequences - slots) * mean / slots
    if sequences > slots:
        flight = slots * np.cumsum(alive[::-1])[::-1] / alive.sum()
        who = f"the last {slots} in flight x P(remaining length > t)"
    else:
        flight = sequences * alive
        who = f"{sequences} x P(length > t)"
    costs = step(flight)
    drain, full = float(costs.sum()), float(step(slots))
    secs = queue * full + drain
    marks = [t for t in (0, 1000, 3000, budget - 1) if t < budget]
    law = (f"lengths log-normal with trace_median_tokens {_c('trace_median_tokens'):g} and mean trace_tokens "
           f"{_c('trace_tokens'):g}, truncated_share {_c('truncated_share')} at the budget")
    seen = ", ".join(f"t={t:,}: {flight[t]:.1f} in flight, {costs[t] * 1e3:.1f} ms" for t in marks)
    text = (f"{mean_text}; {step_text}. Queue: ({sequences} - {slots}) sequences x {mean:.0f} / {slots} slots = "
            f"{queue:,.0f} steps x {full:.4f} s = {queue * full:,.0f} s; drain: {budget} steps with {who} ({seen}) "
            f"({law}) = {drain:,.0f} s; time = {secs:,.0f} s")
    return secs, text, used + ["trace_tokens", "trace_median_tokens", "truncated_share"]


def _result(name: str, value: float, unit: str, text: str, used: list[str], **extra) -> dict:
    return {"figure": name, name: round(value, 3), "unit": unit, "projected": True, "arithmetic": text,
            "constants": _cited(*dict.fromkeys(used)), **extra}


def eval_hours_per_1000(cfg, card, decode: dict | None = None) -> dict:
    """Greedy evaluation of 1,000 puzzles at the scorer's settings (infer.max_tokens, infer.max_num_seqs), every
    prompt handed over at once; the same in waves of max_num_seqs for comparison."""
    budget, slots = int(cfg.infer.max_tokens), int(cfg.infer.max_num_seqs)
    secs, text, used = generation_s(1000, budget, slots, card, decode=decode)
    step = step_model(card, decode=decode)[0]
    waves = math.ceil(1000 / slots)
    wave = float(step(slots * completion_survival(budget)).sum())
    wave_h = waves * wave / 3600
    text += (f"; hours = {secs:,.0f} / 3600 = {secs / 3600:.2f} h. In waves of {slots} (each wave waiting for its "
             f"longest): {waves} waves x {wave:,.0f} s ({budget} steps with {slots} x P(length > t) in flight) "
             f"= {wave_h:.2f} h")
    return _result("hours_per_1000", secs / 3600, "hours per 1,000 puzzles", text, used,
                   in_waves_hours=round(wave_h, 3))


def vote_hours(cfg, card, puzzles: int = 1000, decode: dict | None = None) -> dict:
    """04_vote at the configured k: `puzzles` held-out puzzles x vote.k samples handed over at once (k samples in
    full: live early stopping draws fewer, as many as its rounds need, which only a run measures)."""
    budget, slots, k = int(cfg.infer.max_tokens), int(cfg.infer.max_num_seqs), int(cfg.vote.k)
    secs, text, used = generation_s(puzzles * k, budget, slots, card, decode=decode)
    text += f" (k = vote.k {k} samples x {puzzles} puzzles); hours = {secs / 3600:.2f} h"
    return _result("hours", secs / 3600, f"hours for {puzzles:,} puzzles at k={k}", text, used, k=k,
                   puzzles=puzzles)


def _grpo_budget(cfg) -> int:
    b = cfg.grpo.get("max_completion_length")
    return int(b) if b is not None else int(cfg.infer.max_tokens)


@dataclass
class Rollout:
    """What the GRPO figures take from the training side (`lab.plan.estimate.rollout_figures`): the rollout engine's
    sequences in flight and the bytes a decode step moves for each, and the training micro-step's line (seconds
    fixed + per token) with one micro-step per pack (`grpo.packing`) or per completion, from SFT's model; `used`: the
    CONSTANTS its texts name; `decode`: the card's measured decode steps (`step_model`) or None."""
    slots: int
    seq_bytes: float
    slots_text: str
    fixed_s: float
    per_token_s: float
    train_text: str
    used: tuple[str, ...] = ()
    decode: dict | None = None  # a decode step measured on the card (`step_model`), else None: projected
    pass_slots: int = 0  # the pass rates' sequences in flight (0: the rounds' engine, `slots`)
    pass_slots_text: str = ""  # with pass_slots: why that many, on an engine of their own


def _rollout(cfg, rollout: Rollout | None) -> Rollout:
    if rollout is not None:
        return rollout
    raise LabError("lab.plan.estimate_infer: the GRPO figures need the rollout engine and the training micro-step "
                   "(lab.plan.estimate.rollout_figures)")


def pass_rate_hours(cfg, card, rollout: Rollout | None = None) -> dict:
    """GRPO's pass-rate sampling before step 1: grpo.n_prompts x grpo.pass_rate_k samples through the rollout engine
    with the start adapter served, in one hand-over (the GRPO completion budget, the rollout engine's slots). On an
    engine of their own (`r.pass_slots`: `lab.plan.grpo_policy.separate_pass_engine`), with that engine's start:
    engine_start_s + the weights read from disk."""
    g, r = cfg.grpo, _rollout(cfg, rollout)
    n = int(g.n_prompts) * int(g.pass_rate_k)
    slots, why = (r.pass_slots, r.pass_slots_text) if r.pass_slots else (r.slots, r.slots_text)
    start = 0.0
    secs, text, used = generation_s(n, _grpo_budget(cfg), slots, card, r.seq_bytes, r.decode)
    text += f" ({g.n_prompts} prompts x pass_rate_k {g.pass_rate_k}; {slots} slots: {why})"
    if r.pass_slots:
        weights_gb = _c("weights_gib") * GIB / 1e9
        start = _c("engine_start_s") + weights_gb / _c("disk_gbps")
        text += (f"; their engine's start, shut down for the rounds' = engine_start_s {_c('engine_start_s'):g} + "
                 f"{weights_gb:.0f} GB / disk_gbps {_c('disk_gbps')} = {start:.0f} s; {secs:,.0f} + {start:.0f}")
        secs += start
        used += ["engine_start_s", "weights_gib", "disk_gbps"]
    text += f" = {secs:,.0f} s; hours = {secs / 3600:.2f} h"
    return _result("pass_rate_hours", secs / 3600, "hours", text, used + list(r.used), slots=slots,
                   engine_start_s=round(start))


def grpo_step_minutes(cfg, card, rollout: Rollout | None = None) -> dict:
    """Minutes per GRPO optimizer step with rollouts from the served adapter (docs/internals.md,
    lab.plan.estimate_infer): (one round's generation + the phase switches) / S + training of one step
    (`training_s`)."""
    g, r = cfg.grpo, _rollout(cfg, rollout)
    S = int(g.get("steps_per_generation") or _c("steps_per_generation"))
    group = int(g.prompts_per_step) * int(g.num_generations)
    budget = _grpo_budget(cfg)
    gen, gen_text, used = generation_s(S * group, budget, r.slots, card, r.seq_bytes, r.decode)
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
    train, train_text, tused = training_s(cfg, r, S)
    minutes = ((gen + switch) / S + train) / 60
    text = (f"generation round of S = steps_per_generation {S} steps x {group} completions ({g.prompts_per_step} "
            f"prompts x {g.num_generations}) with {r.slots} slots ({r.slots_text}): {gen_text}. {switch_text}. "
            f"{train_text}. Minutes per step = (({gen:,.0f} + {switch:.1f}) / {S} + {train:.1f}) / 60 = {minutes:.2f}")
    used += ["weights_gib", "switch_gbps", *(["disk_gbps"] if level == 2 else []), *tused, "steps_per_generation",
             *r.used]
    return _result("step_minutes", minutes, "minutes per optimizer step", text, used,
                   parts_s={"generation_per_step": round(gen / S, 1), "switch_per_step": round(switch / S, 1),
                            "training_per_step": round(train, 1)}, steps_per_generation=S, sleep_level=level,
                   slots=r.slots)


def training_s(cfg, r: Rollout, S: int) -> tuple[float, str, list[str]]:
    """Seconds of training per optimizer step: prompts_per_step x num_generations completions of prompt_tokens + the
    mean completion; a truncated completion (truncated_share) carries no loss with mask_truncated_completions, and
    packing does not run it. Packed (`grpo.packing`): the rest best-fit into packs of grpo.pack_tokens, one
    micro-step each; unpacked: one micro-step per completion (TRL's batch of one, as conf/grpo/nemotron_nano.yaml
    had). Each micro-step costs SFT's line (r.fixed_s + r.per_token_s x tokens), plus a no-grad forward
    (old_logp_forward of it) for the old log-probs when S > 1 and grpo.old_logprobs=trainer."""
    g = cfg.grpo
    group = int(g.prompts_per_step) * int(g.num_generations)
    budget = _grpo_budget(cfg)
    mean, _ = mean_completion_tokens(budget)
    finished = min(_c("trace_tokens"), budget)
    p, share = _c("prompt_tokens"), _c("truncated_share")
    packing = bool(g.get("packing", False))
    old = S > 1 and str(g.get("old_logprobs", "trainer")) == "trainer"
    f_old = 1 + (_c("old_logp_forward") if old else 0.0)
    if packing:
        masked = round(share * group) if g.mask_truncated_completions else 0
        rows = [int(p + finished)] * (group - masked) + [int(p + budget)] * (0 if g.mask_truncated_completions
                                                                          else masked)
        per_pack = max(1, int(g.pack_tokens) // rows[0])
        packs = math.ceil(len(rows) / per_pack)
        tokens = sum(rows)
        secs = (packs * r.fixed_s + tokens * r.per_token_s) * f_old
        text = (f"Training per step, packed (grpo.packing, {int(g.pack_tokens):,}-token packs): {group} completions, "
                f"{masked} of them truncated (truncated_share {share} x {group}, masked, not run), {len(rows)} rows of "
                f"prompt_tokens {p:g} + trace_tokens {finished:g} = {rows[0]:,} tokens, {per_pack} a pack: {packs} "
                f"packs; ({packs} x {r.fixed_s:.3f} s + {tokens:,} tokens x {r.per_token_s * 1e6:.1f} us)")
    else:
        tokens = group * (p + mean)
        secs = (group * r.fixed_s + tokens * r.per_token_s) * f_old
        text = (f"Training per step, unpacked: {group} micro-steps of one completion x ({r.fixed_s:.3f} s + "
                f"(prompt_tokens {p:g} + mean {mean:.0f}) tokens x {r.per_token_s * 1e6:.1f} us)")
    text += (f" x (1 + old_logp_forward {_c('old_logp_forward'):.2f}: old log-probs from the trainer)" if old else
             (" (old log-probs from the sampler: no extra forward)" if S > 1 else " (S = 1: no old log-probs)"))
    text += f" = {secs:.1f} s; the micro-step line: {r.train_text}"
    return secs, text, ["prompt_tokens", "trace_tokens", "truncated_share", *(["old_logp_forward"] if old else [])]


def _decode(rollout: Rollout | None) -> dict | None:
    return rollout.decode if rollout is not None else None


def sections(cfg, card, rollout: Rollout | None = None) -> dict:
    """The JSON sections `python -m lab estimate` adds: grpo (step_minutes, pass_rate_hours), eval
    (hours_per_1000), vote (hours), each with its arithmetic and constants."""
    step, rates = grpo_step_minutes(cfg, card, rollout), pass_rate_hours(cfg, card, rollout)
    return {"grpo": {"step_minutes": step["step_minutes"], "pass_rate_hours": rates["pass_rate_hours"],
                     "detail": {"step_minutes": step, "pass_rate_hours": rates}},
            "eval": eval_hours_per_1000(cfg, card, _decode(rollout)),
            "vote": vote_hours(cfg, card, decode=_decode(rollout))}


def report(cfg, card, rollout: Rollout | None = None) -> str:
    """The sections as lines for a terminal (03_grpo and 04_vote print theirs before any model loads)."""
    out = [f"PROJECTED on gpu={card_name(card)} (lab.plan.estimate_infer: constants and sources in its CONSTANTS)"]
    for label, r in (("GRPO minutes per optimizer step", grpo_step_minutes(cfg, card, rollout)),
                     ("GRPO pass-rate sampling, hours", pass_rate_hours(cfg, card, rollout)),
                     ("greedy evaluation, hours per 1,000 puzzles",
                      eval_hours_per_1000(cfg, card, _decode(rollout))),
                     ("04_vote, hours", vote_hours(cfg, card, decode=_decode(rollout)))):
        out.append(f"- {label}: {r[r['figure']]:.2f}\n    {r['arithmetic']}")
    return "\n".join(out)
