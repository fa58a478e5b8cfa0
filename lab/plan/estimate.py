"""`python -m lab estimate [OVERRIDES...] [--price-per-hour X] [--explain] [--json PATH]`: what the configured pipeline
costs on the `gpu=` card, projected before anything loads (no model, no GPU): a table, one row per stage (hours, cost,
Kaggle kernels and kept GB), the total, and with `--explain` the derivation of every figure.

The SFT micro-step is projected from one measured H100 run (`MEASURED`) through stated derivations, or taken from the
card's calibration when one applies (`python -m lab calibrate`, `load_calibration`); GRPO, evaluation and vote hours
come from lab.plan.estimate_infer. The measured run, the derivations and the JSON's layout: docs/internals.md,
lab.plan.estimate.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import math
from pathlib import Path

import numpy as np
from omegaconf import DictConfig, OmegaConf

from lab import LabError
from lab.plan.cost_model import CARDS, MEASURED, Model, card_of, cost_model

CACHE: Path | None = None  # where counted token lengths are kept; None: <project root>/outputs/.cache/estimate

# ---- a calibration measured on the card (python -m lab calibrate, lab.train.calibrate) -------------------------------

CALIBRATION_MADE_BY = "python -m lab calibrate"


def calibration_dir() -> Path:
    """Where `python -m lab calibrate` keeps each card's calibration (`<gpu.name>.json`), a folder the lab made."""
    from lab.core.paths import project_root

    return project_root() / "outputs" / "calibration"


def recipe_key(cfg: DictConfig, values: dict) -> str:
    """What a calibrated micro-step depends on besides the card: the model's shapes and the training recipe."""
    s = cfg.sft
    src = {"values": {k: v for k, v in sorted(values.items()) if k not in ("torch_dtype", "architectures",
                                                                            "auto_map", "transformers_version")},
           "lora": OmegaConf.to_container(s.lora, resolve=True), "packing": bool(s.get("packing", False)),
           "pack_tokens": s.get("pack_tokens"), "packed_attention": str(s.get("packed_attention", "mask")),
           "checkpointing": bool(s.gradient_checkpointing), "optim": str(cfg.gpu.optim or "adamw_torch_fused"),
           "experts_rank": cfg.gpu.experts_rank, "dtype": str(cfg.model.dtype)}
    return hashlib.sha256(json.dumps(src, sort_keys=True, default=str).encode()).hexdigest()[:16]


def load_calibration(cfg: DictConfig, card: str, path: str | None = None) -> tuple[dict | None, str]:
    """(the calibration that applies to `card` and the configured model and recipe, or None; a line saying which
    file, or why none). `path` (--calibration) must apply (else a LabError); without it the card's file in
    `calibration_dir()` is used when it exists and applies."""
    from lab.plan.shapes import model_config_values

    p = Path(path) if path else calibration_dir() / f"{card}.json"
    if not p.is_file():
        if path:
            raise LabError(f"--calibration {path}: no such file")
        return None, f"no calibration of {card} at {p} (python -m lab calibrate writes it on the card)"
    try:
        cal = json.loads(p.read_text(encoding="utf-8"))
        meta, fit = cal["meta"], cal["speed"]["fit"]
        ok = meta.get("made_by") == CALIBRATION_MADE_BY and math.isfinite(fit["fixed_s"]) and fit["us_per_token"] > 0
    except (ValueError, KeyError, TypeError) as e:
        meta, ok, why = {}, False, f"not a finished calibration ({type(e).__name__}: {e})"
    else:
        why = "" if ok else "not a calibration made by python -m lab calibrate, or its fit is not finite"
    if ok and meta.get("card") != card:
        ok, why = False, f"measured on {meta.get('card')}, not {card}"
    if ok and meta.get("recipe_key") != recipe_key(cfg, model_config_values(cfg)):
        ok, why = False, "measured for another model or recipe (recipe_key differs: rerun python -m lab calibrate)"
    if not ok:
        if path:
            raise LabError(f"--calibration {path}: {why}")
        return None, f"calibration {p} not used: {why}"
    return {**cal, "path": str(p)}, f"calibration {p}"


def measured_model(cal: dict) -> Model:
    """The micro-step line a calibration measured: its least-squares fit over the timed packs."""
    m, fit = cal["meta"], cal["speed"]["fit"]
    packs = ", ".join(f"{k:,}" for k in sorted(map(int, cal["speed"].get("packs", {}))))
    return Model(fit["fixed_s"], fit["us_per_token"] / 1e6, [
        f"MEASURED by python -m lab calibrate on {m.get('device')} (gpu={m.get('card')}), {m.get('date')}, lab commit "
        f"{m.get('lab_commit')}: {cal['path']}",
        f"measured micro-step: {fit['fixed_s']:.3f} s + {fit['us_per_token']:.1f} us/token (least squares over packs "
        f"of {packs} tokens, full depth, the recipe's LoRA, paths and optimizer)"])


def measured_decode(cal: dict | None) -> dict | None:
    """The vLLM decode steps a calibration timed (`lab.train.calibrate.step_vllm`): {"source": "measured", "steps":
    {sequences: seconds}, "measured_by": text}, or None when it has none."""
    v = (cal or {}).get("vllm")
    steps = v.get("decode_step_s") if isinstance(v, dict) else None
    steps = {int(n): float(s) for n, s in (steps or {}).items() if s is not None and math.isfinite(s) and s > 0}
    if not steps:
        return None
    m = cal["meta"]
    return {"source": "measured", "steps": steps,
            "measured_by": f"MEASURED by python -m lab calibrate on {v.get('device')} (gpu={m.get('card')}), "
                           f"{m.get('date')}, vLLM {v.get('version')}, random weights: {cal['path']}"}


def measured_label(cal: dict | None) -> dict:
    """The JSON's label of where a figure comes from."""
    if cal is None:
        return {"source": "projected", "projected_from": MEASURED["source"]}
    m = cal["meta"]
    return {"source": "measured", "measured": {k: m.get(k) for k in ("card", "device", "date", "lab_commit")}
            | {"path": cal["path"]}}


# ---- rows and packing ----------------------------------------------------------------------------------------------

def pack_bfd(tokens: list[int], capacity: int) -> list[int]:
    """Best-fit decreasing: each row, longest first, into the fullest micro-step it fits; the micro-steps' token
    counts."""
    import bisect

    free: list[tuple[int, int]] = []  # (free tokens, bin index), sorted
    bins: list[int] = []
    for t in sorted(tokens, reverse=True):
        if t > capacity:
            raise LabError(f"lab.plan.estimate: a row of {t} tokens exceeds sft.max_seq_len={capacity}")
        i = bisect.bisect_left(free, (t, -1))
        if i == len(free):
            bins.append(t)
            bisect.insort(free, (capacity - t, len(bins) - 1))
        else:
            room, b = free.pop(i)
            bins[b] += t
            bisect.insort(free, (room - t, b))
    return bins


def unpacked_steps(tokens: list[int], batch_size: int, seed: int) -> list[int]:
    """Tokens each unpacked micro-step computes: `batch_size` rows (seeded shuffle), padded to the longest."""
    order = np.random.default_rng(seed).permutation(len(tokens))
    t = np.asarray(tokens)[order]
    return [int(batch_size * t[i:i + batch_size].max()) for i in range(0, len(t), batch_size)]


# an assumed row-length distribution when the data or tokenizer is absent: RESULTS.md, "First contact with a GPU"
# (1,837 development rows, derivation traces, real tokenizer: p50 823, mean 1,209, max 6,679): a log-normal with that
# median and mean (sigma = sqrt(2 ln(mean / median))), clipped to the max
ASSUMED = {"rows": 1837, "median": 823, "mean": 1209, "max": 6679}


def assumed_tokens(max_seq_len: int) -> list[int]:
    a = ASSUMED
    sigma = math.sqrt(2 * math.log(a["mean"] / a["median"]))
    t = np.random.default_rng(0).lognormal(math.log(a["median"]), sigma, a["rows"])
    return [int(x) for x in np.clip(np.rint(t), 1, min(a["max"], max_seq_len))]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def data_sources(cfg: DictConfig) -> tuple[Path | None, Path | None, str]:
    """(data file, tokenizer folder, why not) for real token counts: data=competition's file (`data.path`, $LAB_DATA,
    data/train.csv, Kaggle: `lab.core.paths.find_data_file`) and the tokenizer (`data.tokenizer_path`, else a local
    model folder, `model.path`)."""
    from lab.core.paths import find_data_file, resolve_path

    if cfg.data.source != "competition":
        return None, None, f"data={cfg.data.source} (generated puzzles): no counted tokens"
    if cfg.data.get("synthetic_train"):
        return None, None, "data.synthetic_train=true (generated training puzzles): no counted tokens"
    try:
        data = find_data_file(cfg.data.path)
    except LabError:
        data = None
    tok = None
    for p in (cfg.data.get("tokenizer_path"), cfg.model.path):
        if p and (resolve_path(str(p)) / "tokenizer.json").is_file():
            tok = resolve_path(str(p))
            break
    why = "" if data and tok else ("no competition data file" if not data else "no local tokenizer")
    return data, tok, why


def counted_tokens(cfg: DictConfig, data: Path, tok: Path, sample: int | None) -> tuple[list[int], str]:
    """Token counts of the SFT rows the run would train (the lab's split, solver traces the metric accepts,
    `sft.max_seq_len`, `data.weights`, `sft.n_train`), as lab.train.sft builds them; cached under
    outputs/.cache/estimate keyed by the data file's and tokenizer's bytes and every setting that changes them,
    sealed (`lab.core.cache`): a cache its seal does not vouch for is counted again.
    `sample`: only that many training puzzles (seeded), the epoch scaled to all of them."""
    import pandas as pd
    from omegaconf import OmegaConf

    from lab.core import cache as kept
    from lab.core.io import atomic_write_json, read_json
    from lab.data import dataset

    styles = dataset.trace_styles(cfg)
    key_src = {"data": _sha(data), "tokenizer": _sha(tok / "tokenizer.json"), "styles": styles,
               "max_seq_len": int(cfg.sft.max_seq_len), "seed": int(cfg.seed),
               "val_fraction": float(cfg.data.val_fraction), "n_train": cfg.sft.n_train, "sample": sample,
               "weights": OmegaConf.to_container(cfg.data.weights, resolve=True), "version": 1}
    cache = kept.entry(_cache_dir(), key_src, prefix="tokens_", n=20)
    if kept.load(cache, key_src, "token count"):
        got = read_json(cache, kind=dict)
        return got["tokens"], got["source"] + " (cached: " + str(cache) + ")"
    from transformers import AutoTokenizer

    from lab.data.sft_examples import sft_examples

    df = dataset.add_categories(dataset.load_puzzles(data))
    train, _ = dataset.split(df, cfg.data.val_fraction, cfg.seed)
    n_all = len(train)
    if sample and sample < n_all:
        train = train.sample(n=sample, random_state=cfg.seed).reset_index(drop=True)
    tokenizer = AutoTokenizer.from_pretrained(str(tok))
    print(f"counting tokens: solving {len(train)} training puzzles of {data} with the tokenizer {tok} ...", flush=True)
    examples, counts = sft_examples(tokenizer, train, int(cfg.sft.max_seq_len), styles)
    examples = dataset.oversample(examples, dataset.category_weights(cfg), cfg.seed)
    tokens = [int(t) for t in examples["tokens"]]
    if sample and sample < n_all and tokens:
        scale = n_all / len(train)
        tokens = [tokens[i % len(tokens)] for i in range(int(round(len(tokens) * scale)))]
    if cfg.sft.n_train:
        tokens = tokens[:int(cfg.sft.n_train)]
    source = (f"counted: {data.name} ({len(df)} puzzles, {n_all} in the training split"
              + (f", {len(train)} sampled and scaled to all" if sample and sample < n_all else "")
              + f"), tokenizer {tok.name}, trace styles {sorted(set(styles.values()))}: {counts}")
    atomic_write_json(cache, {"key": key_src, "tokens": tokens, "source": source})
    kept.store(cache, key_src)
    return tokens, source


def _cache_dir() -> Path:
    """Where the counts are kept: `CACHE` (tests) or outputs/.cache/estimate."""
    from lab.core.paths import project_root

    return CACHE or project_root() / "outputs" / ".cache" / "estimate"


def row_tokens(cfg: DictConfig, sample: int | None = None, assume: bool = False) -> tuple[list[int], str]:
    """The SFT rows' token counts and where they come from (counted, or the stated assumption)."""
    data, tok, why = (None, None, "--assume-rows") if assume else data_sources(cfg)
    if data is not None and tok is not None:
        return counted_tokens(cfg, data, tok, sample)
    a = ASSUMED
    return assumed_tokens(int(cfg.sft.max_seq_len)), (
        f"ASSUMED ({why}): {a['rows']:,} rows, log-normal with median {a['median']} and mean {a['mean']:,} tokens, "
        f"clipped to {min(a['max'], int(cfg.sft.max_seq_len)):,} (RESULTS.md, 'First contact with a GPU': the "
        "development rows' derivation traces)")


# ---- the SFT section -----------------------------------------------------------------------------------------------

def experts_lora_path(cfg: DictConfig) -> str:
    """routed | fold: the path lab.model.lora.attach_lora puts the experts' LoRA on (lab.model.experts_lora); "none"
    without an experts LoRA."""
    if "experts" not in [str(t) for t in cfg.sft.lora.targets]:
        return "none"
    if cfg.sft.backend != "hf":
        return "fold"  # sft_unsloth attaches through Unsloth: lab.model.experts_lora is not switched on there
    path = str(cfg.sft.lora.get("experts_path", "auto"))
    return "routed" if path == "auto" else path


def mamba_path(cfg: DictConfig, values: dict) -> str:
    """Which Mamba-2 implementation SFT runs (lab.model.lora `_FusedScanGuard`; lab.model.models
    check_mamba_kernels: the real model trains only with mamba_ssm and causal_conv1d)."""
    from lab.model.lora import fused_mamba

    if not values.get("use_mamba_kernels", True) or cfg.model.get("build_tiny"):
        return "torch: transformers' PyTorch path (no kernels; the tiny CPU model)"
    note = "the measured run was unfused; projected with its figures, an upper bound"
    if not fused_mamba(cfg):
        return "unfused: the mixer's PyTorch path with mamba_ssm's chunk scan and causal_conv1d (sft.fused_mamba=off)"
    if "out_proj" in [str(t) for t in cfg.sft.lora.targets] and cfg.sft.backend == "hf":
        return ("fused: mamba_split_conv1d_scan_combined without out_proj, then the out_proj LoRA (lab.model.lora; not "
                f"yet run on a GPU; {note})")
    return f"fused: mamba_split_conv1d_scan_combined ({note})"


def _figures(model: Model, steps: list[int], units: int, per_step: int, capacity: int, unit: str) -> dict:
    """`units` rows (unpacked) or packs (packed: each one micro-step) taken `per_step` to an optimizer step
    (sft.batch_size x sft.grad_accum: with sft.packing, grad_accum counts packs)."""
    seconds = sum(model.fixed_s + model.per_token_s * t for t in steps)
    n_opt = math.ceil(units / per_step)
    return {"micro_steps": len(steps), "tokens_computed": int(sum(steps)), "seconds_per_epoch": seconds,
            "hours_per_epoch": seconds / 3600, "optimizer_steps": n_opt, "step_seconds": seconds / max(1, n_opt),
            "step_unit": f"{per_step} {unit}",
            "fill": sum(steps) / (len(steps) * capacity) if steps else 0.0}


def sft_section(cfg: DictConfig, card: str, sample: int | None = None, assume: bool = False,
                calibration: str | None = None) -> tuple[dict, list[str]]:
    """The SFT figures as (JSON dict, printed lines): projected (docs/internals.md, lab.plan.estimate), or from the
    card's calibration (`load_calibration`) when one applies."""
    from lab.plan.shapes import model_config_values

    values = model_config_values(cfg)
    el, mp = experts_lora_path(cfg), mamba_path(cfg, values)
    rank = int(cfg.gpu.experts_rank or cfg.sft.lora.r)
    cal, cal_line = load_calibration(cfg, card, calibration)
    model = measured_model(cal) if cal else cost_model(values, card, el if el != "none" else "none", rank)
    tokens, source = row_tokens(cfg, sample, assume)
    if not tokens:
        raise LabError(f"lab.plan.estimate: no SFT rows ({source})")
    from lab.model.packed_rows import pack_tokens

    cap, bs, ga = int(cfg.sft.max_seq_len), int(cfg.sft.batch_size), int(cfg.sft.grad_accum)
    pack = pack_tokens(cfg) if cfg.sft.get("packing", False) else cap  # the tokens of one pack (sft.pack_tokens)
    real = sum(tokens)
    unpacked = _figures(model, unpacked_steps(tokens, bs, int(cfg.seed)), len(tokens), bs * ga, cap, "rows")
    packs = pack_bfd(tokens, pack)
    packed = _figures(model, packs, len(packs), bs * ga, pack, f"packs, {len(tokens) / len(packs):.1f} rows a pack")
    for f in (unpacked, packed):
        f["tokens_per_s"] = real / f["seconds_per_epoch"]
    packing = bool(cfg.sft.get("packing", False))
    chosen = packed if packing else unpacked
    t = np.asarray(tokens)
    notes = [f"rows: {source}",
             f"rows: {len(tokens):,}, {real:,} tokens (median {int(np.median(t)):,}, mean {t.mean():,.0f}, max "
             f"{t.max():,})", f"calibration: {cal_line}", *model.lines,
             "not modelled: evaluation, checkpoint saves, data loading, a trained router's imbalance"]
    if card != str(cfg.gpu.name):
        notes.insert(0, f"gpu={cfg.gpu.name}: no card configured; projected for {card}")
    out = {"tokens_per_s": chosen["tokens_per_s"], "hours_per_epoch": chosen["hours_per_epoch"],
           "step_seconds": chosen["step_seconds"],
           "packing": {"enabled": packing, "efficiency": packed["fill"], "unpacked_fill": unpacked["fill"],
                       "micro_steps_packed": packed["micro_steps"], "micro_steps_unpacked": unpacked["micro_steps"]},
           "experts_lora": el, "mamba_path": mp.split(":")[0], "card": card, "projected": cal is None,
           **measured_label(cal),
           "fixed_s_per_micro_step": model.fixed_s, "us_per_token": model.per_token_s * 1e6,
           "rows": len(tokens), "tokens": real, "packed": packed, "unpacked": unpacked, "notes": notes}
    head = (f"SFT on {card}: the micro-step MEASURED (gpu={cal['meta'].get('card')}, {cal['meta'].get('date')}, lab "
            f"commit {cal['meta'].get('lab_commit')}); the epoch figures computed from it over these rows" if cal else
            f"SFT on {card}, all figures PROJECTED (lab.plan.estimate; not measured by this command)")
    lines = [head,
             f"  experts LoRA: {el}    Mamba path: {mp}", *("  " + n for n in notes),
             f"  a micro-step: {model.fixed_s:.3f} s + {model.per_token_s * 1e6:.1f} us x tokens"]
    for name, f in (("unpacked", unpacked), ("packed", packed)):
        mark = " <- sft.packing" if (name == "packed") == packing else ""
        lines.append(f"  {name:8s}: {f['micro_steps']:,} micro-steps x {model.fixed_s:.3f} s + "
                     f"{f['tokens_computed']:,} tokens x {model.per_token_s * 1e6:.1f} us = "
                     f"{f['seconds_per_epoch']:,.0f} s: {f['tokens_per_s']:,.0f} tokens/s, "
                     f"{f['hours_per_epoch']:.3f} h/epoch, {f['step_seconds']:.2f} s per optimizer step "
                     f"({f['optimizer_steps']} steps of {f['step_unit']}), fill {f['fill']:.1%} of "
                     f"{pack if name == 'packed' else cap:,}-token micro-steps{mark}")
    if packing and pack > max(MEASURED["tokens"]) and not cal:
        lines.append(f"  packs of {pack:,} tokens: the per-token line is extrapolated past the measured "
                     f"{max(MEASURED['tokens']):,}-token step (sft.pack_tokens)")
    if packing and str(cfg.sft.get("packed_attention", "mask")) == "mask":
        lines.append("  sft.packed_attention=mask: sdpa computes each pack's whole T x T under the block mask; that "
                     "extra attention work is NOT in this projection (packed_attention=varlen is what it assumes)")
    return out, lines


def rollout_figures(cfg: DictConfig, card: str, decode: dict | None = None):
    """`lab.plan.estimate_infer.Rollout` for the GRPO figures: the rollout engine's slots and the bytes a decode step
    moves per sequence (`lab.plan.grpo_policy.generation_phase`: its Mamba state read and written, its KV cache read at
    the mean context of the sequences in flight), and the training micro-step's line from SFT's `cost_model`;
    `decode`: the card's measured decode steps (`measured_decode`), or None."""
    from lab.plan import estimate_infer as ei
    from lab.plan.grpo_policy import generation_phase, separate_pass_engine
    from lab.plan.shapes import model_config_values

    values = model_config_values(cfg)
    ph = generation_phase(cfg, values)
    b = ph["bytes_per_sequence"]
    context = ph["inflight_tokens"]
    seq_bytes = 2 * b["mamba_state"] + b["kv_per_token"] * context
    el = experts_lora_path(cfg)
    model = cost_model(values, card, el if el != "none" else "none", int(cfg.gpu.experts_rank or cfg.sft.lora.r))
    slots_text = (f"{ph['sequences_why']}; {ph['kv_note']}; a step moves 2 x {b['mamba_state'] / 1e6:.1f} MB of "
                  f"Mamba state + {b['kv_per_token'] / 1e3:.1f} kB x {context:,.0f} tokens in flight of KV a "
                  "sequence")
    train_text = (f"SFT's micro-step (lab.plan.estimate.cost_model, experts LoRA {el}) on {card}: "
                  f"{model.fixed_s:.3f} s + {model.per_token_s * 1e6:.1f} us/token")
    used = ("prompt_tokens", "trace_tokens", "trace_median_tokens", "truncated_share", "inflight_kv_margin")
    first = {}
    if separate_pass_engine(cfg):  # the pass rates on an engine of their own, before the optimizer exists
        p = generation_phase(cfg, values, phase="pass_rates")
        first = {"pass_slots": int(p["sequences"]), "pass_slots_text": f"an engine of their own, shut down before "
                 f"the rounds (lab.plan.grpo_policy.separate_pass_engine): {p['sequences_why']}; {p['kv_note']}"}
    return ei.Rollout(int(ph["sequences"]), seq_bytes, slots_text, model.fixed_s, model.per_token_s, train_text, used,
                      decode, **first)


def inference_sections(cfg: DictConfig, card: str, calibration: str | None = None, **_) -> tuple[dict, list[str]]:
    """GRPO (minutes per optimizer step, pass-rate hours), greedy evaluation (hours per 1,000 puzzles) and 04_vote
    (hours): `lab.plan.estimate_infer`, whose CONSTANTS name the source of each figure; GRPO's with
    `rollout_figures`; the decode step from the card's calibration when it timed one (`measured_decode`)."""
    from lab.plan import estimate_infer

    decode = measured_decode(load_calibration(cfg, card, calibration)[0])
    r = rollout_figures(cfg, card, decode)
    out = estimate_infer.sections(cfg, card, r)
    out["grpo"].update(grpo_label(decode))
    out["decode"] = decode or {"source": "projected"}
    return out, ["", *estimate_infer.report(cfg, card, r).splitlines(), f"  GRPO: {out['grpo']['source_detail']}"]


def grpo_label(decode: dict | None = None) -> dict:
    """GRPO's figures: projected from lab.plan.estimate_infer's constants and SFT's projected micro-step line
    (`cost_model`), the decode step measured when the card's calibration timed it."""
    if decode:
        return {"source": "projected", "source_detail": f"the decode step {decode['measured_by']}; the rest PROJECTED "
                "from lab.plan.estimate_infer's CONSTANTS and SFT's projected micro-step line (cost_model)"}
    return {"source": "projected", "source_detail": "PROJECTED from lab.plan.estimate_infer's CONSTANTS (each with its "
            "source) and SFT's projected micro-step line (cost_model); the decode step is measured by python -m lab "
            "calibrate on the card (its vllm step), not yet here"}


# ---- sections: each (cfg, card, **options) -> (JSON dict, printed lines), under its name in the JSON -----------------
# a name of None: the function returns several top-level sections at once
SECTIONS = {"sft": sft_section, None: inference_sections}


def estimate(cfg: DictConfig, sample: int | None = None, assume: bool = False,
             calibration: str | None = None) -> tuple[dict, list[str]]:
    card = card_of(cfg)
    out, lines = {}, []
    for name, fn in SECTIONS.items():
        d, text = fn(cfg, card, sample=sample, assume=assume, calibration=calibration)
        out.update(d if name is None else {name: d})
        lines += text
    return out, lines


# ---- the pipeline on the card: one record per stage, for the renting decision ---------------------------------------

def lora_counts(cfg: DictConfig, values: dict) -> tuple[int, int]:
    """(base, trainable LoRA parameters): `lab.plan.shapes.param_counts` (the meta model, seconds to build), kept on
    disk beside the token counts (`lab.core.cache`, sealed), keyed by the model's shape, the LoRA config and the code
    and versions that count."""
    import peft
    import transformers

    from lab.core import cache as kept
    from lab.core.io import atomic_write_json, read_json
    from lab.plan.shapes import param_counts

    here = Path(__file__).resolve().parents[1]
    code = [_sha(here / f) for f in ("model/lora.py", "model/experts_lora.py", "plan/shapes.py")]
    key_src = {"values": values, "lora": OmegaConf.to_container(cfg.sft.lora, resolve=True),
               "experts_rank": OmegaConf.select(cfg, "gpu.experts_rank", default=None), "code": code,
               "versions": [transformers.__version__, peft.__version__]}
    cache = kept.entry(_cache_dir(), key_src, prefix="params_", n=20)
    if kept.load(cache, key_src, "LoRA parameter count"):
        got = read_json(cache, kind=dict)
        if min(got["counts"]) > 0:
            return int(got["counts"][0]), int(got["counts"][1])
    counts = param_counts(cfg, values)
    atomic_write_json(cache, {"key": key_src, "counts": list(counts)})
    kept.store(cache, key_src)
    return counts


def _eval_hours(cfg: DictConfig, card: str, puzzles: int, decode: dict | None = None) -> float:
    """One greedy pass over `puzzles` held-out puzzles (lab.plan.estimate_infer.generation_s, every prompt at once)."""
    from lab.plan import estimate_infer

    return estimate_infer.generation_s(puzzles, int(cfg.infer.max_tokens), int(cfg.infer.max_num_seqs), card,
                                       decode=decode)[0] / 3600


def _stage_hours(cfg: DictConfig, card: str, out: dict, stage: str, val: int) -> list[tuple[str, float]]:
    """The GPU work of `stage` as (what, projected hours) parts; [] for a stage with none."""
    decode = out["decode"] if out.get("decode", {}).get("source") == "measured" else None
    ev = _eval_hours(cfg, card, val, decode)
    if stage == "02_sft":
        sft = out["sft"]
        epochs = float(cfg.sft.epochs)
        if int(cfg.sft.max_steps) > 0:
            epochs = min(epochs, int(cfg.sft.max_steps) / max(1, sft["packed" if sft["packing"]["enabled"]
                                                                   else "unpacked"]["optimizer_steps"]))
        return [(f"training {epochs:g} epoch x {sft['hours_per_epoch']:.3f} h", epochs * sft["hours_per_epoch"]),
                (f"base model's evaluation, {val:,} held-out puzzles", ev),
                (f"adapter's evaluation, {val:,} held-out puzzles", ev)]
    if stage == "03_grpo":
        g = out["grpo"]
        steps = int(cfg.grpo.max_steps)
        return [(f"pass rates ({cfg.grpo.n_prompts} prompts x {cfg.grpo.pass_rate_k})", g["pass_rate_hours"]),
                (f"training {steps} steps x {g['step_minutes']:.2f} min", steps * g["step_minutes"] / 60),
                (f"adapter's evaluation, {val:,} held-out puzzles", ev)]
    if stage == "04_vote":
        from lab.plan import estimate_infer

        v = estimate_infer.vote_hours(cfg, card, puzzles=val, decode=decode)
        return [(f"k={v['k']} samples x {val:,} held-out puzzles (the greedy pass: 03_grpo's, from the evaluation "
                 "cache)", v["hours"])]
    return []


# the stages of the pipeline (lab.runs.pipeline.STAGES) and what the GPU does in each
STAGE_WORK = {"01_explore": "the split and the solvers (CPU)", "02_sft": "SFT and two evaluations",
              "03_grpo": "GRPO and one evaluation", "04_vote": "sampled votes", "05_errors": "error analysis (CPU)"}


def _card_fit(cfg: DictConfig, stage: str, counts: tuple[int, int] | None, values: dict) -> str:
    """Whether `stage` fits the card, from what is cheap to know: GRPO's generation phase is bounded from shapes
    (lab.plan.grpo_policy.generation_phase); a training step's peak needs its trace (`python -m lab memory`), which this
    command does not run (it runs the whole model's step on fake tensors; the stage's preflight runs it and refuses a
    step that does not fit)."""
    if stage not in ("02_sft", "03_grpo", "04_vote"):
        return "no GPU work"
    if stage == "04_vote":
        return "serves the model in vLLM (not bounded here)"
    step = f"step: python -m lab memory --stage {stage[3:]}"
    if stage == "03_grpo" and cfg.grpo.rollout_backend == "vllm" and counts is not None:
        from lab.plan.grpo_policy import generation_phase

        ph = generation_phase(cfg, values, counts=counts)
        if ph.get("fits") is None:
            return f"rollouts: no card size; {step}"
        return (f"rollouts {'fit' if ph['fits'] else 'do NOT fit'} ({ph['engine_need_gib']:.0f} of "
                f"{ph['engine_share_gib']:.0f} GiB); {step}")
    return f"not traced here; {step}"


def pipeline(cfg: DictConfig, out: dict, card: str, stages: list[str] | None = None,
             price: float | None = None) -> dict:
    """{"stages": one record per stage of the pipeline on `card`, "total", "held_out"}, from the sections' figures
    in `out` (`estimate`). A record: the stage's projected hours and their parts, the cost at `price` per hour,
    whether it fits the card (`_card_fit`) and Kaggle's limits (one kernel's `kaggle.run_limit_h` less
    `kaggle.budget_margin_min`; the kept output against `kaggle.output_limit_gb`, lab.plan.output_plan). The total:
    hours and kernels (and cost, given a price) over the stages, and those it could not project."""
    from lab.plan import output_plan
    from lab.plan.shapes import model_config_values

    stages = list(stages or STAGE_WORK)
    val, val_how = output_plan.val_rows(cfg)
    values = model_config_values(cfg)
    gpu = [s for s in stages if s in ("02_sft", "03_grpo", "04_vote")]
    with contextlib.redirect_stdout(io.StringIO()):  # attach_lora's table: the counts are all this needs
        counts = lora_counts(cfg, values) if gpu else None
    usable = float(cfg.kaggle.run_limit_h) - float(cfg.kaggle.budget_margin_min) / 60
    records = []
    for stage in stages:
        parts = _stage_hours(cfg, card, out, stage, val)
        hours = sum(h for _, h in parts) if parts else None
        plan = output_plan.planned_output_bytes(cfg, stage, counts[1] if counts else 0)
        kept = sum(plan["working"].values())
        kernels = max(1, math.ceil(hours / usable)) if hours else 1
        resumable = stage in output_plan.TRAINING
        records.append({
            "stage": stage, "work": STAGE_WORK[stage], "hours": hours, "projected": bool(parts),
            "parts": [{"what": w, "hours": h} for w, h in parts],
            "cost": None if price is None or hours is None else hours * price,
            "card": _card_fit(cfg, stage, counts, values),
            "kaggle": {"kernels": kernels, "fits_one_kernel": kernels == 1, "resumable": resumable,
                       "kernel_hours": usable, "kept_gb": kept / output_plan.GB,
                       "kept_limit_gb": plan["limit"] / output_plan.GB, "kept_fits": kept <= plan["limit"]}})
    total = {"hours": sum(r["hours"] or 0.0 for r in records), "kernels": sum(r["kaggle"]["kernels"] for r in records),
             "not_projected": [r["stage"] for r in records if r["hours"] is None]}
    if price is not None:
        total.update(cost=total["hours"] * price, price_per_hour=price)
    return {"stages": records, "total": total, "held_out": {"puzzles": val, "source": val_how},
            "kaggle": {"machine_shape": cfg.kaggle.machine_shape, "kernel_hours": usable,
                       "kept_limit_gb": float(cfg.kaggle.output_limit_gb)}}


def _fmt(x: float | None, width: int) -> str:
    return f"{'-':>{width}}" if x is None else f"{x:{width}.2f}"


def table_lines(p: dict, card: str, sft_source: str = "projected") -> list[str]:
    """The per-stage table of `pipeline`'s answer `p`, its total and what its figures rest on, for a terminal;
    `sft_source` "measured" when SFT's micro-step comes from this card's calibration."""
    records, total = p["stages"], p["total"]
    price = total.get("price_per_hour")
    cost = price is not None
    k = p["kaggle"]
    head = (f"{'stage':<11}{'hours':>7}" + (f"{'cost':>9}" if cost else "")
            + f"  {'Kaggle: kernels, kept':<28}  fits the card")
    how = ("PROJECTED hours (but SFT's micro-step: MEASURED by calibrate" if sft_source == "measured"
           else "PROJECTED hours (not measured by this command")
    lines = [f"The pipeline on {card}: {how}; --explain shows the derivation)"
             + (f", cost at {price:g} per hour" if cost else ""), head]
    for r in records:
        kg = r["kaggle"]
        kernel = ("1 kernel" if kg["fits_one_kernel"] else f"{kg['kernels']} kernels"
                  + (" (resumes)" if kg["resumable"] else " NO RESUME")) \
            + f", {kg['kept_gb']:.1f} GB" + ("" if kg["kept_fits"] else " OVER")
        lines.append(f"{r['stage']:<11}{_fmt(r['hours'], 7)}" + (f"{_fmt(r['cost'], 9)}" if cost else "")
                     + f"  {kernel:<28}  {r['card']}")
    lines.append(f"{'total':<11}{total['hours']:7.2f}" + (f"{total['cost']:9.2f}" if cost else "")
                 + f"  {total['kernels']} kernels")
    lines.append(f"Kaggle: one kernel runs {k['kernel_hours']:g} h (kaggle.run_limit_h less kaggle.budget_margin_min; "
                 f"a training stage stops and resumes in the next), keeps {k['kept_limit_gb']:g} GB "
                 f"(lab.plan.output_plan: python -m lab kaggle plan); the hours are {card}'s, Kaggle's kernels run on "
                 f"kaggle.machine_shape={k['machine_shape']}")
    h = p["held_out"]
    lines.append(f"each stage's hours (held-out puzzles: {h['puzzles']:,}, {h['source']}):")
    for r in records:
        if r["parts"]:
            lines.append(f"  {r['stage']} {r['hours']:.2f} h = " + " + ".join(f"{p['hours']:.2f} ({p['what']})"
                                                                          for p in r["parts"]))
        else:
            lines.append(f"  {r['stage']}: {r['work']}, not projected")
    return lines


def stage_projection(stage: str, cfg: DictConfig) -> list[str]:
    """What a real-model stage prints when it opens, before any model loads (`lab.recipes.common.open_stage`): 02_sft
    its SFT projection (tokens/s, hours per epoch) beside the memory trace the preflight printed; 03_grpo and 04_vote
    the GRPO / evaluation / vote hours (`lab.plan.estimate_infer.report`). Empty for a stage that trains or samples
    nothing, or on a card the estimate does not know (gpu=none: the tiny model)."""
    if stage not in ("02_sft", "03_grpo", "04_vote") or str(cfg.gpu.name) not in CARDS:
        return []
    card = card_of(cfg)
    try:
        if stage == "02_sft":
            return sft_section(cfg, card)[1]
        from lab.plan import estimate_infer

        decode = measured_decode(load_calibration(cfg, card)[0])
        return estimate_infer.report(cfg, card, rollout_figures(cfg, card, decode)).splitlines()
    except LabError as e:  # e.g. no data file to count: the stage itself says so, in its own words, when it reads it
        return [f"{stage}: no projection on gpu={card} ({e})"]


def main(argv: list[str] | None = None) -> int:
    """`python -m lab estimate [OVERRIDES...] [--price-per-hour X] [--explain] [--json PATH] [--stages ...]`"""
    ap = argparse.ArgumentParser(prog="python -m lab estimate", description="what the configured pipeline costs on the "
                                 "gpu= card, projected before anything is loaded: hours per stage and in all, the cost "
                                 "at --price-per-hour, and whether each stage fits the card and Kaggle's limits")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model=nemotron_nano experiment=competition")
    ap.add_argument("--price-per-hour", type=float, default=None, help="the card's rental price per hour: adds a cost "
                    "column and total (in that currency)")
    ap.add_argument("--stages", nargs="+", default=None, choices=list(STAGE_WORK), metavar="STAGE",
                    help=f"the stages to cost (default: all, {' '.join(STAGE_WORK)})")
    ap.add_argument("--explain", action="store_true", help="print the derivation behind each figure after the table")
    ap.add_argument("--json", default=None, help="write every figure as JSON here (stages, total, and each section; "
                    "a new file)")
    ap.add_argument("--force", action="store_true", help="replace --json PATH when it exists")
    ap.add_argument("--sample", type=int, default=None, help="count tokens on N training puzzles (seeded), scaled")
    ap.add_argument("--assume-rows", action="store_true", help="skip counting: the stated assumed row lengths")
    ap.add_argument("--calibration", default=None, help="a calibration of this card, model and recipe (python -m lab "
                    "calibrate); default: outputs/calibration/<gpu.name>.json when it exists and applies")
    a = ap.parse_intermixed_args(argv)
    from lab.core.config import compose
    from lab.core import owner
    from lab.core.io import atomic_write_text

    if a.price_per_hour is not None and not a.price_per_hour >= 0:
        raise LabError(f"--price-per-hour {a.price_per_hour}: a price is 0 or more")
    cfg = compose(a.overrides)
    out_json = owner.output_file(a.json, "estimate --json", a.force) if a.json else None
    out, lines = estimate(cfg, a.sample, a.assume_rows, a.calibration)
    card = card_of(cfg)
    p = pipeline(cfg, out, card, a.stages, a.price_per_hour)
    out = {"card": card, **p, **out}
    notes = [ln.strip() for ln in out["sft"]["notes"] if ln.startswith(("rows:", "gpu=", "calibration:"))]
    print("\n".join(table_lines(p, card, out["sft"].get("source", "projected")) + [f"  SFT {n}" for n in notes]))
    if a.explain:
        print("\n" + "\n".join(lines))
    if a.json:
        atomic_write_text(out_json, json.dumps(out, indent=1, default=float))
    return 0
