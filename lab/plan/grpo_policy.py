"""GRPO's runtime choices, made from config and the card before anything loads, and the bound they come from.

The trainer and the rollout engine (`lab.train.grpo`, `lab.train.rollouts`) take them at run time, the preflight and the
estimates before it, so they live here, apart from the fake-tensor trace (`lab.plan.memory`), and import no trainer: the
trainer's micro-batch (`micro_batch`); with `grpo.rollout_backend=vllm`, the memory bound of the generation phase
(`generation_phase`: the engine's weights, adapter slot, KV cache and Mamba state beside what the trainer keeps on the
card), from which the engine's memory share (`engine_share`) and its sequences in flight (`rollout_seqs`) follow, and
the level the engine sleeps at between rounds, from the host's memory (`sleep_level`). TRL's batching and vLLM's sleep
mode, as read in their sources: docs/internals.md, lab.plan.grpo_policy.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from omegaconf import DictConfig, OmegaConf

from lab import LabError
from lab.plan.shapes import GIB, gpu_gib, model_config_values, optimizer_bytes_per_param, param_counts


def micro_batch(cfg: DictConfig) -> tuple[int, int]:
    """(completions per training micro-step, micro-steps per optimiser step) for one process.

    One optimiser step covers `prompts_per_step x num_generations` completions per process (the whole group of
    every prompt); `grpo.per_device_train_batch_size` of them go through one forward/backward (null: all at once).
    `lab.train.grpo.grpo_args` sets TRL's `steps_per_generation` to the second value (times
    `grpo.steps_per_generation`), so one generation round feeds whole optimiser steps and the summed micro-steps give
    the loss of the one big step (TRL's batching, read in its source: docs/internals.md, lab.plan.grpo_policy)."""
    g = cfg.grpo
    group = g.prompts_per_step * g.num_generations
    m = group if g.per_device_train_batch_size is None else int(g.per_device_train_batch_size)
    if not 1 <= m <= group or group % m:
        raise LabError(f"conf/grpo: per_device_train_batch_size={m} must divide prompts_per_step x num_generations "
                       f"= {g.prompts_per_step} x {g.num_generations} = {group} (the completions of one optimiser "
                       "step), or be null (all of them in one micro-step)")
    return m, group // m


# ---- the generation phase (rollout_backend=vllm): a bound from shapes, not a trace --------------------------------

KERNEL_BLOCK = 16  # tokens: the attention kernels' block alignment vLLM rounds a hybrid model's block size to


def vllm_pages(values: Mapping[str, Any]) -> dict:
    """How vLLM's v1 engine lays out a hybrid model's cache (its source: docs/internals.md): every layer's page holds
    the same bytes, so the attention block is the fewest tokens (a multiple of `KERNEL_BLOCK`) whose K and V of one
    layer hold one Mamba layer's state, which is padded to that page; layers go in groups of the smaller count (6
    attention, 23 Mamba: groups of 6, the last Mamba group padded). A running sequence holds one page per Mamba layer
    (its state, whatever its length) and one block per attention layer per `block_tokens` of its context, allocated
    as it grows."""
    pattern = str(values.get("hybrid_override_pattern", ""))
    attn, mamba = pattern.count("*"), pattern.count("M")
    kv_layer_token = 2 * int(values.get("num_key_value_heads", 0)) * int(values.get("head_dim", 0)) * 2
    ssm_item = 4 if str(values.get("mamba_ssm_cache_dtype", "float32")) == "float32" else 2
    heads, hdim, state = (int(values.get(k, 0)) for k in ("mamba_num_heads", "mamba_head_dim", "ssm_state_size"))
    conv = (int(values.get("conv_kernel", 4)) - 1) * (heads * hdim + 2 * int(values.get("n_groups", 1)) * state) * 2
    mamba_layer = heads * hdim * state * ssm_item + conv
    out = {"attn_layers": attn, "mamba_layers": mamba, "kv_per_token": attn * kv_layer_token,
           "mamba_state": mamba * mamba_layer}
    if not (attn and mamba and kv_layer_token):  # not hybrid: no pages to align (the exact bytes, 1-token blocks)
        return {**out, "block_tokens": 1, "page_bytes": kv_layer_token, "mamba_pages": 0, "attn_pages": attn,
                "mamba_bytes": mamba * mamba_layer, "group": max(attn, 1)}
    block = KERNEL_BLOCK * -(-mamba_layer // (KERNEL_BLOCK * kv_layer_token))
    group = max(attn, mamba) if max(attn, mamba) < 1.5 * min(attn, mamba) else min(attn, mamba)
    mamba_pages, page = -(-mamba // group) * group, block * kv_layer_token
    return {**out, "block_tokens": block, "page_bytes": page, "mamba_pages": mamba_pages,
            "attn_pages": -(-attn // group) * group, "mamba_bytes": mamba_pages * page, "group": group}


PHASES = ("rounds", "pass_rates")  # the engine's two uses: training rounds, and the pass rates before step 1


def generation_phase(cfg: DictConfig, values: Mapping[str, Any] | None = None,
                     counts: tuple[int, int] | None = None, phase: str = "rounds") -> dict:
    """GPU memory while GRPO samples through vLLM on the same card (`grpo.rollout_backend=vllm`): the engine holds the
    bf16 base weights, one adapter slot and the cache of the sequences in flight, inside its share
    (`grpo.vllm_gpu_memory_utilization` of the card, which vLLM claims whole; null: `gpu.max_use` of the card less the
    trainer's part, rounded down to a hundredth, `engine_share`); the trainer keeps what it does not
    move to the CPU while the engine is awake: its fp32 LoRA weights and the optimizer's states (an upper bound: the
    frozen base is moved out, lab.train.rollouts). Both must fit `gpu.max_use` of the card together.

    The engine's figures are lower bounds of what vLLM needs (its activation and CUDA-graph memory, profiled inside the
    share, are not modelled): bf16 weights 2 B per base parameter; the adapter slot at rank r in bf16 (2 P); per
    sequence in flight, in vLLM's pages (`vllm_pages`), its Mamba state (SSM heads x head_dim x state in
    `mamba_ssm_cache_dtype`, config.json, plus the bf16 conv state) and the attention KV of the context it holds in
    flight: the length-biased mean context (`lab.plan.estimate_infer.inflight_context_tokens`) x inflight_kv_margin,
    plus one partly filled block; vLLM allocates KV blocks as a sequence grows and preempts (recomputes) a request
    when they run out. Sequences: `grpo.max_num_seqs`, or null: as many as the share holds beside the weights and the
    adapter, in eights, at most one round's. `counts`: (base, LoRA parameters) when the caller has them.

    `phase="pass_rates"`: the pass rates before step 1, when the trainer holds its LoRA weights but no optimizer
    states yet (the optimizer is made at the first step), so a null share is larger, and the sequences are capped
    by the pass-rate batch (grpo.n_prompts x pass_rate_k) instead of a round (`separate_pass_engine`)."""
    from lab.plan.estimate_infer import CONSTANTS, inflight_context_tokens

    values = dict(values or model_config_values(cfg))
    base, P = counts or param_counts(cfg, values)
    pg = vllm_pages(values)
    g = cfg.grpo
    max_len = int(cfg.model.max_model_len)
    budget = int(g.get("max_completion_length") or cfg.infer.max_tokens)
    ctx, ctx_text = inflight_context_tokens(budget)
    margin = CONSTANTS["inflight_kv_margin"][0]
    held = min(ctx * margin, max_len)
    blocks = held / pg["block_tokens"] + 1  # the last block of each sequence partly filled
    kv_per_seq = pg["attn_pages"] * pg["page_bytes"] * blocks
    per_seq = pg["mamba_bytes"] + kv_per_seq
    full_request = pg["mamba_bytes"] + pg["attn_pages"] * pg["page_bytes"] * -(-max_len // pg["block_tokens"])
    per, how = optimizer_bytes_per_param(cfg)
    if phase not in PHASES:
        raise LabError(f"generation_phase: phase={phase!r}, not one of {PHASES}")
    trainer = {"LoRA weights (fp32)": 4 * P}
    if phase == "rounds":
        trainer[f"optimizer states ({how})"] = int(per * P)
    card = gpu_gib(cfg)
    keep = sum(trainer.values()) / GIB
    share = float(OmegaConf.select(cfg, "grpo.vllm_gpu_memory_utilization", default=None) or 0.0)
    if not share and card is not None:  # null: the rest of the card once the trainer's part is set aside
        share = math.floor(100 * (float(cfg.gpu.max_use) * card - keep) / card) / 100
    free = share * card * GIB - 2 * base - 2 * P if card is not None else 0.0
    round_seqs = rollout_round(cfg) if phase == "rounds" else int(g.n_prompts) * int(g.pass_rate_k)
    cap_text = "a round's" if phase == "rounds" else "the pass-rate batch's"
    asked = OmegaConf.select(cfg, "grpo.max_num_seqs", default=None)
    seq_text = (f"({pg['mamba_pages']} Mamba pages + {pg['attn_pages']} attention pages x ({held:,.0f} tokens / "
                f"{pg['block_tokens']:,} + 1) blocks) x {pg['page_bytes'] / 1e6:.2f} MB = {per_seq / 1e6:.1f} MB a "
                f"sequence")
    if asked is not None:
        seqs, why = int(asked), f"grpo.max_num_seqs={int(asked)}"
    elif card is not None and share > 0:  # null: as many as the share holds beside the weights, in eights
        most = max(8, int(free // per_seq) // 8 * 8)
        seqs = min(most, round_seqs)
        why = (f"grpo.max_num_seqs=null: ({share:.2f} x {card:.1f} GiB - weights - adapter) / {seq_text} = "
               f"{free / per_seq:.0f}, in eights {most}, at most {cap_text} {round_seqs}")
    else:
        seqs, why = int(cfg.infer.max_num_seqs), "grpo.max_num_seqs=null and no card size: infer.max_num_seqs"
    engine = {"bf16 base weights": 2 * base, "adapter slot (bf16, rank r)": 2 * P,
              f"KV cache ({pg['attn_layers']} attention layers x {seqs} sequences x ~{held:,.0f} tokens in flight, "
              f"in {pg['block_tokens']:,}-token blocks)": kv_per_seq * seqs,
              f"Mamba state ({pg['mamba_layers']} layers in {pg['mamba_pages']} pages x {seqs} sequences)":
                  pg["mamba_bytes"] * seqs}
    need = sum(engine.values()) / GIB
    kv_note = (f"KV assumed: what a sequence holds in flight, {ctx_text}; x inflight_kv_margin {margin} = "
               f"{held:,.0f} tokens (not model.max_model_len {max_len:,}: vLLM allocates blocks as a sequence grows, "
               f"preempts and recomputes a request when they run out); one {max_len:,}-token request "
               f"({full_request / 1e6:.0f} MB, vLLM's start-up check) must fit too")
    out = {"phase": phase, "engine_gib": {k: v / GIB for k, v in engine.items()},
           "trainer_gib": {k: v / GIB for k, v in trainer.items()},
           "engine_need_gib": need, "trainer_gib_total": keep, "share": share, "card_gib": card,
           "sequences": seqs, "sequences_why": why, "tokens": held, "inflight_tokens": ctx, "kv_note": kv_note,
           "mamba_gib": pg["mamba_bytes"] * seqs / GIB, "pages": pg,
           "bytes_per_sequence": {"mamba_state": pg["mamba_state"], "kv_per_token": pg["kv_per_token"],
                                  "held": per_seq}}
    if card is not None:
        use = float(cfg.gpu.max_use)
        out["engine_share_gib"] = share * card
        out["weights_free_gib"] = free / GIB
        out["fits"] = bool(need <= share * card and share * card + keep <= use * card and full_request <= free)
    weights = engine["bf16 base weights"] / GIB
    host = host_gib()
    out["host"] = {"weights_gib": weights, "level_1_gib": 2 * weights + HOST_MARGIN_GIB,
                   "level_2_gib": weights + HOST_MARGIN_GIB, "this_machine_gib": host}
    return out


def pool_capacity(cfg: DictConfig, num_blocks: int, block_size: int | None, asked: int,
                  phase: str = "rounds") -> dict:
    """What a started engine's real pool holds (vLLM's `cache_config.num_gpu_blocks` after its own memory profile:
    each block is one page of each layer of a group), against what it was asked for: sequences at the context the
    bound takes in flight (`generation_phase`), and whether vLLM's block size is the one the lab's page arithmetic
    reads (`vllm_pages`). The bound leaves out vLLM's activation and CUDA-graph memory: this is where a card shows
    how much they took."""
    ph = generation_phase(cfg, phase=phase)
    pg = ph["pages"]
    per_seq = ph["bytes_per_sequence"]["held"] / (pg["group"] * pg["page_bytes"])  # in blocks of `group` pages
    held = int(num_blocks // per_seq)
    gib = num_blocks * pg["group"] * pg["page_bytes"] / GIB
    text = (f"rollout engine's pool: {num_blocks:,} blocks ({gib:.1f} GiB) hold {held} sequences at ~"
            f"{ph['tokens']:,.0f} tokens in flight ({per_seq:.2f} blocks each); max_num_seqs {asked}")
    if held < asked:
        text += (f". FEWER than asked: vLLM will preempt and recompute when blocks run out (its activation and "
                 f"CUDA-graph memory, outside the lab's bound, took the rest); "
                 f"grpo.max_num_seqs={max(8, held // 8 * 8)} asks for what fits")
    same = block_size is None or int(block_size) == int(pg["block_tokens"])
    if not same:
        text += (f". vLLM's block is {block_size} tokens, the lab's page arithmetic says {pg['block_tokens']}: its "
                 "reading of vLLM (docs/internals.md, lab.plan.grpo_policy.vllm_pages) no longer holds")
    return {"num_blocks": int(num_blocks), "pool_gib": gib, "sequences": held, "asked": int(asked),
            "block_size": block_size, "lab_block_tokens": int(pg["block_tokens"]), "holds_asked": held >= asked,
            "block_matches": same, "text": text}


def rollout_round(cfg: DictConfig) -> int:
    """Sequences of one rollout round: grpo.steps_per_generation x prompts_per_step x num_generations."""
    g = cfg.grpo
    return int(g.get("steps_per_generation") or 1) * int(g.prompts_per_step) * int(g.num_generations)


def rollout_seqs(cfg: DictConfig, phase: str = "rounds") -> int:
    """The rollout engine's `max_num_seqs` (`generation_phase`: grpo.max_num_seqs, or null: what its share holds)."""
    return int(generation_phase(cfg, phase=phase)["sequences"])


def separate_pass_engine(cfg: DictConfig) -> bool:
    """Whether the pass rates get an engine of their own, shut down before the first round: with a null share, when
    the card before step 1 (no optimizer states yet) leaves the engine a larger share than the rounds can have. It
    costs one more engine start and buys the pass rates the optimizer's room in sequences (lab.train.rollouts)."""
    if cfg.grpo.rollout_backend != "vllm" or cfg.grpo.vllm_gpu_memory_utilization is not None:
        return False
    first, later = (generation_phase(cfg, phase=p)["share"] for p in ("pass_rates", "rounds"))
    return bool(first and first > later)


HOST_MARGIN_GIB = 16.0  # host memory kept free beside the weights a switch holds (the process, pinned buffers, the OS)


def host_gib() -> float | None:
    """This machine's physical memory in GiB (None where the OS does not say)."""
    import os

    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    except (ValueError, OSError, AttributeError):
        return None


def sleep_level(cfg: DictConfig, host: float | None = None, weights_gib: float | None = None) -> tuple[int, str]:
    """(the level the rollout engine sleeps at between rounds, why). Level 1 (vLLM keeps its weights in CPU memory
    while it sleeps) makes the host hold the weights twice at a switch: the engine's copy and the trainer's frozen
    base, which moves to the CPU while the engine is awake. Level 2 discards the engine's weights and reloads them
    from the model folder at each wake-up (`LLM.collective_rpc("reload_weights")`), so the host holds them once, at
    the price of reading them from disk each round. `grpo.vllm_sleep_level` chooses; null: 1 when the host holds
    twice the bf16 weights plus `HOST_MARGIN_GIB`, else 2. A LabError when it cannot hold them once."""
    level = OmegaConf.select(cfg, "grpo.vllm_sleep_level", default=None)
    if weights_gib is None:
        weights_gib = 2 * param_counts(cfg)[0] / GIB
    host = host_gib() if host is None else host
    if host is not None and host < weights_gib + HOST_MARGIN_GIB:
        raise LabError(f"grpo.rollout_backend=vllm: this machine has {host:.0f} GiB of memory; a switch between the "
                       f"trainer and the rollout engine holds the {weights_gib:.1f} GiB of bf16 weights in it at "
                       f"least once (+{HOST_MARGIN_GIB:.0f} GiB margin). Use a machine with more memory, or "
                       "grpo.rollout_backend=hf")
    if level is not None:
        return int(level), f"grpo.vllm_sleep_level={int(level)}"
    if host is None:
        return 2, "the host's memory is unknown: level 2 (the weights once on the host)"
    if host >= 2 * weights_gib + HOST_MARGIN_GIB:
        return 1, (f"the host's {host:.0f} GiB hold the {weights_gib:.1f} GiB of weights twice: level 1 (the engine "
                   "keeps its weights in CPU memory while it sleeps)")
    return 2, (f"the host's {host:.0f} GiB cannot hold the {weights_gib:.1f} GiB of weights twice: level 2 (the "
               "engine reloads its weights from the model folder at each wake-up)")


def engine_share(cfg: DictConfig, phase: str = "rounds") -> float:
    """The `gpu_memory_utilization` GRPO's vLLM engine is built with: `grpo.vllm_gpu_memory_utilization`, or when
    null the share `generation_phase` leaves it (needs the card's size: `gpu.memory_gib` or a CUDA device)."""
    ph = generation_phase(cfg, phase=phase)
    if not ph["share"]:
        raise LabError("grpo.vllm_gpu_memory_utilization=null needs the card's size (gpu.memory_gib, or a CUDA device "
                       "here): set gpu=<card> or the share itself")
    if ph["share"] <= 0:
        raise LabError(f"grpo.vllm_gpu_memory_utilization: the trainer keeps {ph['trainer_gib_total']:.1f} GiB during "
                       f"generation, more than gpu.max_use of the card leaves; use gpu.optim=adamw_bnb_8bit")
    return ph["share"]


def check_generation_fits(cfg: DictConfig) -> dict | None:
    """Before 03_grpo loads anything (`lab.plan.preflight`), with rollout_backend=vllm: the generation phase's bound
    fits the card (`generation_phase`) and the host can hold the weights at a switch (`sleep_level`); a LabError
    naming the figures otherwise. None for the hf back-end."""
    if cfg.grpo.rollout_backend != "vllm":
        return None
    ph = generation_phase(cfg)
    first = generation_phase(cfg, phase="pass_rates") if separate_pass_engine(cfg) else None
    for p in (ph, first or {}):
        if p.get("fits") is False:
            raise LabError(f"03_grpo with rollout_backend=vllm does not fit gpu={cfg.gpu.name}:\n"
                           + generation_report(p, float(cfg.gpu.max_use))
                           + "\nlower grpo.vllm_gpu_memory_utilization (null: the rest of the card), or the "
                             "trainer's part (gpu.optim=adamw_bnb_8bit)")
    ph["pass_rates"] = first  # the pass rates' own engine, where GRPO builds one
    if cfg.grpo.vllm_sleep_mode:
        ph["sleep_level"] = sleep_level(cfg, weights_gib=ph["host"]["weights_gib"])
    return ph


def generation_report(ph: dict, use: float) -> str:
    """The generation phase's bound (`generation_phase`) as lines for a person: what the engine and the trainer hold
    and whether both fit the card."""
    what = ("its training rounds" if ph.get("phase", "rounds") == "rounds" else
            "the pass rates before step 1 (no optimizer states yet)")
    lines = [f"GRPO generation phase (grpo.rollout_backend=vllm), {what}, bounded from shapes "
             "(lab.plan.grpo_policy.generation_phase):",
             f"  the rollout engine decodes {ph['sequences']} sequences at once ({ph['sequences_why']})",
             f"  the engine needs at least {ph['engine_need_gib']:.1f} GiB:"]
    lines += [f"    {v:8.2f} GiB  {k}" for k, v in ph["engine_gib"].items()]
    lines.append(f"    ({ph['kv_note']})")
    lines.append(f"  the trainer keeps at most {ph['trainer_gib_total']:.1f} GiB on the card meanwhile:")
    lines += [f"    {v:8.2f} GiB  {k}" for k, v in ph["trainer_gib"].items()]
    h = ph["host"]
    lines.append(f"  host memory at a switch (lab.plan.grpo_policy.sleep_level): sleep level 1 holds the weights "
                 f"twice, {h['level_1_gib']:.0f} GiB with the margin; level 2 once, {h['level_2_gib']:.0f} GiB"
                 + (f"; this machine has {h['this_machine_gib']:.0f} GiB" if h["this_machine_gib"] else ""))
    if ph.get("card_gib") is not None:
        card, share = ph["card_gib"], ph["share"]
        verdict = "fits" if ph["fits"] else "does NOT fit"
        lines.append(f"  {verdict}: engine {ph['engine_need_gib']:.1f} GiB within its share grpo.vllm_gpu_memory_"
                     f"utilization {share:.2f} x {card:.1f} = {share * card:.1f} GiB, and share + trainer "
                     f"{share * card + ph['trainer_gib_total']:.1f} GiB within {use:.0%} of the card = "
                     f"{use * card:.1f} GiB")
        if ph["mamba_gib"] > ph["weights_free_gib"]:
            lines.append(f"  the Mamba state alone, {ph['mamba_gib']:.1f} GiB for {ph['sequences']} sequences, exceeds "
                         f"the {ph['weights_free_gib']:.1f} GiB the share leaves beside the weights and the adapter: "
                         "vLLM could not hold them in flight whatever their length")
    return "\n".join(lines)

