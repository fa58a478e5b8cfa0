"""The SFT micro-step cost model: one measured H100 run (`MEASURED`), the cards' published figures (`CARDS`) and the
derivations from them to any configured model and card (`cost_model`); `lab.plan.estimate` builds the stage table
on it, `lab.train.fast_paths` prices a slow path with it. The measured run and the derivations: docs/internals.md,
lab.plan.estimate.
"""

from __future__ import annotations

from dataclasses import dataclass

from lab import LabError
from lab.plan.estimate_infer import CARD_BANDWIDTH, CARD_PEAK, CONSTANTS, measured_values

# ---- the measured run (RESULTS.md, "First contact with a GPU"; docs/internals.md, lab.plan.estimate) ---------------

MEASURED = {
    "source": "RESULTS.md, 'First contact with a GPU' (one H100 80GB HBM3, 2026-11-27, bench/gpu_memory.py)",
    "card": "h100_80gb",
    "tokens": (1024, 8192),
    "block_ms": {"mamba": (16.3, 18.1), "attention": (10.7, 12.0), "moe": (30.0, 48.8)},  # fwd+bwd, checkpointed
    "slice_step_s": (0.050, 0.117),  # embed, one block of each kind, head, backward, AdamW
    "experts_lora": "fold",
    "mamba_path": "unfused",
}


@dataclass(frozen=True)
class Card:
    bf16_tflops: float   # published dense bf16 tensor peak
    tb_per_s: float      # published memory bandwidth
    source: str
    measured: bool = False


def _card(card: str, measured: bool = False) -> Card:
    """The card's published figures, from their one home, lab.plan.estimate_infer.CONSTANTS (with their sources)."""
    peak, bw = CONSTANTS[CARD_PEAK[card]], CONSTANTS[CARD_BANDWIDTH[card]]
    return Card(peak[0], bw[0], f"{peak[1]}: {peak[0]:g} TFLOP/s; {bw[1]}: {bw[0]:g} TB/s", measured=measured)


CARDS = {"h100_80gb": _card("h100_80gb", measured=True), "h200": _card("h200"), "rtx_pro_6000": _card("rtx_pro_6000")}


# ---- the model's shape ---------------------------------------------------------------------------------------------

KIND = {"M": "mamba", "mamba": "mamba", "linear_attention": "mamba", "*": "attention", "attention": "attention",
        "full_attention": "attention", "E": "moe", "moe": "moe"}


def block_kinds(values: dict) -> list[str]:
    """The model's blocks as mamba / attention / moe, from `hybrid_override_pattern` (config.json) or
    `layers_block_type` (the tiny architecture)."""
    seq = values.get("layers_block_type") or list(values.get("hybrid_override_pattern") or "")
    bad = sorted({str(s) for s in seq if s not in KIND})
    if bad or not seq:
        raise LabError(f"lab.plan.estimate: block types {bad or 'none'} are not Mamba-2, attention or MoE blocks of "
                       "Nemotron-H; the cost model knows only those")
    return [KIND[s] for s in seq]


def active_params(values: dict) -> dict:
    """Matmul parameters each token passes through, per block kind (one block) and for the head: Mamba-2 in_proj and
    out_proj, attention q/k/v/o, MoE top-k routed experts + shared experts + router, lm_head (shapes as
    transformers' modeling_nemotron_h.py builds them from these config keys)."""
    H = values["hidden_size"]
    d_in = values["mamba_num_heads"] * values["mamba_head_dim"]
    in_proj = H * (2 * d_in + 2 * values["n_groups"] * values["ssm_state_size"] + values["mamba_num_heads"])
    hd = values.get("head_dim") or H // values["num_attention_heads"]
    q = values["num_attention_heads"] * hd
    kv = values["num_key_value_heads"] * hd
    k, inter = values["num_experts_per_tok"], values["moe_intermediate_size"]
    shared = values.get("n_shared_experts", 1) * values["moe_shared_expert_intermediate_size"]
    return {"mamba": in_proj + d_in * H, "attention": 2 * H * q + 2 * H * kv,
            "moe": k * 2 * H * inter + 2 * H * shared + H * values["n_routed_experts"],
            "head": H * values["vocab_size"]}


def experts_dims(values: dict) -> dict:
    return {"E": values["n_routed_experts"], "H": values["hidden_size"], "I": values["moe_intermediate_size"],
            "k": values["num_experts_per_tok"]}


def fold_bytes(values: dict, itemsize: int = 2) -> float:
    """PEFT's fold traffic per MoE layer and micro-step: 22 x E x I x H x bytes (derivation 3, docs/internals.md)."""
    d = experts_dims(values)
    return 22.0 * d["E"] * d["I"] * d["H"] * itemsize


def flops_per_token(values: dict, experts_lora: str, experts_rank: int) -> float:
    """6 x active matmul parameters + the experts' LoRA path's own FLOPs (derivation 2, docs/internals.md)."""
    kinds, p, d = block_kinds(values), active_params(values), experts_dims(values)
    base = 6.0 * (sum(p[kind] for kind in kinds) + p["head"])
    n_moe = kinds.count("moe")
    if experts_lora == "fold":
        return base + n_moe * 4.0 * d["k"] * d["H"] * d["I"]
    if experts_lora == "routed":
        return base + n_moe * 16.0 * d["k"] * experts_rank * (d["H"] + d["I"])
    return base


# ---- the cost model ------------------------------------------------------------------------------------------------

def _line(points_s):
    """(fixed seconds, seconds per token) of the line through the two measured points."""
    (t1, t2), (y1, y2) = MEASURED["tokens"], points_s
    per = (y2 - y1) / (t2 - t1)
    return y1 - t1 * per, per


def measured_lines() -> dict:
    """Each block kind's and the slice rest's (fixed s, s/token) on the measured card (derivation 1)."""
    lines = {kind: _line((a / 1e3, b / 1e3)) for kind, (a, b) in MEASURED["block_ms"].items()}
    step = _line(MEASURED["slice_step_s"])
    lines["rest"] = (step[0] - sum(v[0] for v in lines.values()), step[1] - sum(v[1] for v in lines.values()))
    return lines


@dataclass
class Model:
    """A micro-step costs `fixed_s + per_token_s x tokens` (projected), with the arithmetic that made it."""
    fixed_s: float
    per_token_s: float
    lines: list[str]


def cost_model(values: dict, card: str, experts_lora: str, experts_rank: int) -> Model:
    """The projected per-micro-step line for `values`' model on `card` (derivations 1-4, docs/internals.md)."""
    meas, c, h100 = measured_values(), CARDS[card], CARDS[MEASURED["card"]]
    lines_m = measured_lines()
    kinds_m, kinds = block_kinds(meas), block_kinds(values)
    n_m = {kind: kinds_m.count(kind) for kind in ("mamba", "attention", "moe")}
    n = {kind: kinds.count(kind) for kind in ("mamba", "attention", "moe")}
    fixed_m = lines_m["rest"][0] + sum(n_m[k] * lines_m[k][0] for k in n_m)
    per_m = lines_m["rest"][1] + sum(n_m[k] * lines_m[k][1] for k in n_m)
    flops_m = flops_per_token(meas, MEASURED["experts_lora"], 32)
    rate = flops_m / per_m
    fold_s_m = fold_bytes(meas) / (h100.tb_per_s * 1e12)
    moe_keep = lines_m["moe"][0] - fold_s_m
    out = [f"measured ({MEASURED['source']}): per block fwd+bwd at {MEASURED['tokens'][0]:,} / "
           f"{MEASURED['tokens'][1]:,} tokens: " + ", ".join(f"{k} {a} / {b} ms" for k, (a, b) in
                                                           MEASURED["block_ms"].items())
           + f"; slice step {MEASURED['slice_step_s'][0]} / {MEASURED['slice_step_s'][1]} s",
           "derived lines (fixed ms + us/token): " + ", ".join(f"{k} {a * 1e3:.2f} + {b * 1e6:.3f}"
                                                              for k, (a, b) in lines_m.items()),
           "  (the rest's negative fixed part: the slice step was timed as one step, its blocks one by one; the "
           "difference is within that measurement, and the whole-model line below is the bench's own projection)",
           f"measured model ({n_m['mamba']} Mamba-2, {n_m['attention']} attention, {n_m['moe']} MoE blocks; fold, "
           f"unfused Mamba): {fixed_m:.3f} s + {per_m * 1e6:.1f} us/token per micro-step",
           f"derived effective rate: {flops_m / 1e9:.2f} GFLOP/token (6 x active + fold's stack gradients) / "
           f"{per_m * 1e6:.1f} us = {rate / 1e12:.0f} TFLOP/s",
           f"derived fold traffic: 22 x {experts_dims(meas)['E']} x {experts_dims(meas)['I']} x "
           f"{experts_dims(meas)['H']} x 2 B = {fold_bytes(meas) / 1e9:.1f} GB per MoE layer / {h100.tb_per_s} TB/s "
           f"= {fold_s_m * 1e3:.2f} ms of the measured MoE fixed {lines_m['moe'][0] * 1e3:.2f} ms "
           f"({n_m['moe']} layers: {n_m['moe'] * fold_s_m:.3f} s of {fixed_m:.3f} s)"]
    flops = flops_per_token(values, experts_lora, experts_rank)
    per = flops / (rate * c.bf16_tflops / h100.bf16_tflops)
    bw_scale = max(1.0, h100.tb_per_s / c.tb_per_s)
    fixed = (lines_m["rest"][0] + n["mamba"] * lines_m["mamba"][0] + n["attention"] * lines_m["attention"][0]
             + n["moe"] * moe_keep) * bw_scale
    fold_s = n["moe"] * fold_bytes(values) / (c.tb_per_s * 1e12) if experts_lora == "fold" else 0.0
    out += [f"this model: {n['mamba']} Mamba-2, {n['attention']} attention, {n['moe']} MoE blocks; experts LoRA "
            f"{experts_lora}: {flops / 1e9:.3f} GFLOP/token",
            f"card {card}{' (measured)' if c.measured else ' (NOT measured: scaled by published figures)'}: "
            f"{c.source}",
            f"projected fixed: (rest {lines_m['rest'][0] * 1e3:.1f} + {n['mamba']} x {lines_m['mamba'][0] * 1e3:.2f} "
            f"+ {n['attention']} x {lines_m['attention'][0] * 1e3:.2f} + {n['moe']} x {moe_keep * 1e3:.2f}) ms"
            f" x {bw_scale:.2f} (bandwidth)" + (f" + fold {n['moe']} x {fold_bytes(values) / 1e9:.1f} GB / "
                                               f"{c.tb_per_s} TB/s" if fold_s else "")
            + f" = {fixed + fold_s:.3f} s per micro-step",
            f"projected per token: {flops / 1e9:.3f} GFLOP / ({rate / 1e12:.0f} x {c.bf16_tflops:g}/"
            f"{h100.bf16_tflops:g} TFLOP/s) = {per * 1e6:.1f} us"]
    return Model(fixed + fold_s, per, out)


def card_of(cfg: DictConfig) -> str:
    name = str(cfg.gpu.name)
    if name == "none":
        return MEASURED["card"]
    if name not in CARDS:
        raise LabError(f"gpu={name}: lab.plan.estimate knows the cards {', '.join(CARDS)}; add its published bf16 "
                       "peak and bandwidth to CARDS")
    return name
