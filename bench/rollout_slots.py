"""The rollout engine's slots under the estimate's own length model: is the in-flight KV bound safe?

`lab.plan.grpo_policy.generation_phase` sizes `grpo.max_num_seqs` (null) by the KV a sequence holds in flight: the
length-biased mean context x inflight_kv_margin, plus one partly filled block, in vLLM's pages. This script replays
GRPO's pass-rate hand-over (grpo.n_prompts x pass_rate_k completions at once) decode step by decode step with that
many slots kept full, completion lengths drawn from the same model (lab.plan.estimate_infer: log-normal traces with
trace_median_tokens and trace_tokens, a truncated_share at the budget), and counts the pages vLLM's block manager
would hold (one page per Mamba layer's group slot, one block per attention group per block_tokens of context, as it
grows). It prints the peak against what the sizing reserved, and the decode time of the replay (each step costed
at the sequences then in flight by the estimate's step model) against `lab.plan.estimate_infer.generation_s`,
which takes the expected count in flight per step. A simulation of the ASSUMED length model, not a
measurement on the card: the model's lengths are the projection's weak point (RESULTS.md).

    python bench/rollout_slots.py [gpu=h100_80gb ...] [--seeds 3]
"""

from __future__ import annotations

import argparse
import math

import numpy as np


def peak_pages(slots: int, lengths: np.ndarray, prompt: int, block: int, mamba_pages: int, attn_pages: int) -> int:
    """The most pages held at once while `lengths` completions run through `slots` slots kept full."""
    pos, length = np.zeros(slots, int), lengths[:slots].copy()
    alive, nxt, peak = np.ones(slots, bool), slots, 0
    while alive.any():
        held = alive.sum() * mamba_pages + attn_pages * np.where(alive, -(-(prompt + pos + 1) // block), 0).sum()
        peak = max(peak, int(held))
        pos += alive
        for i in np.flatnonzero(alive & (pos >= length)):
            if nxt < len(lengths):
                pos[i], length[i], nxt = 0, lengths[nxt], nxt + 1
            else:
                alive[i] = False
    return peak


def in_flight(slots: int, lengths: np.ndarray) -> np.ndarray:
    """Sequences in flight at each decode step while `lengths` completions run through `slots` slots kept full (a
    freed slot takes the next completion at once)."""
    free = np.zeros(slots, int)  # the step each slot next frees up
    start = np.empty(len(lengths), int)
    for i, n in enumerate(lengths):  # the earliest free slot takes the next completion
        j = int(np.argmin(free))
        start[i], free[j] = free[j], free[j] + n
    end = start + lengths
    count = np.zeros(int(end.max()) + 1, int)
    np.add.at(count, start, 1)
    np.add.at(count, end, -1)
    return np.cumsum(count)[:-1]


def sample_lengths(n: int, budget: int, rng, c: dict) -> np.ndarray:
    """Completion lengths under the estimate's length model (lab.plan.estimate_infer.completion_survival)."""
    sigma = math.sqrt(2 * math.log(c["trace_tokens"] / c["trace_median_tokens"]))
    trace = np.minimum(rng.lognormal(math.log(c["trace_median_tokens"]), sigma, n), budget)
    return np.maximum(np.where(rng.random(n) < c["truncated_share"], budget, trace), 1).astype(int)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("overrides", nargs="*", default=["gpu=h100_80gb"])
    ap.add_argument("--seeds", type=int, default=3)
    a = ap.parse_args(argv)
    from lab.core.config import compose
    from lab.plan.estimate import rollout_figures
    from lab.plan.estimate_infer import CONSTANTS, generation_s, step_model
    from lab.plan.grpo_policy import generation_phase, separate_pass_engine

    cfg = compose(["model=nemotron_nano", "experiment=competition", "data=competition", *a.overrides])
    phase = "pass_rates" if separate_pass_engine(cfg) else "rounds"  # the engine the pass rates run on
    ph, c = generation_phase(cfg, phase=phase), {k: v[0] for k, v in CONSTANTS.items()}
    pg, slots = ph["pages"], ph["sequences"]
    budget = int(cfg.grpo.get("max_completion_length") or cfg.infer.max_tokens)
    n = int(cfg.grpo.n_prompts) * int(cfg.grpo.pass_rate_k)
    reserved = slots * ph["bytes_per_sequence"]["held"] / pg["page_bytes"]
    print(f"gpu={cfg.gpu.name}: {slots} slots (the {phase.replace('_', ' ')}' engine), {n:,} completions, budget {budget:,}, {pg['block_tokens']:,}-token "
          f"blocks; the sizing reserves {reserved:,.0f} pages ({ph['tokens']:,.0f} tokens of KV a sequence)")
    r = rollout_figures(cfg, str(cfg.gpu.name))
    step = step_model(cfg.gpu.name, r.seq_bytes)[0]
    est = generation_s(n, budget, slots, cfg.gpu.name, r.seq_bytes)[0]
    for seed in range(a.seeds):
        lengths = sample_lengths(n, budget, np.random.default_rng(seed), c)
        peak = peak_pages(slots, lengths, int(c["prompt_tokens"]), pg["block_tokens"], pg["mamba_pages"],
                          pg["attn_pages"])
        flight = in_flight(slots, lengths)
        print(f"  seed {seed}: peak {peak:,} pages held = {peak / reserved:.0%} of the reserve; decode "
              f"{float(step(flight).sum()):,.0f} s over {len(flight):,} steps (generation_s: {est:,.0f} s)")


if __name__ == "__main__":
    main()
