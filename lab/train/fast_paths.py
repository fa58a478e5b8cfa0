"""Fast paths that fall back with a reason, decided once when a training stage opens (`lab.recipes.common.open_stage`).

Each fast path has a config key with an `auto` value, its fast value and its exact slow value:

    path (calibration name)  key                     fast     slow     needs
    packed_rows_fused        sft.fused_mamba         on       off      CUDA, mamba_ssm and causal_conv1d
    varlen_attention         sft.packed_attention    varlen   mask     CUDA and torch's varlen_attn (with packing)
    routed_experts           sft.lora.experts_path   routed   fold     nothing but PyTorch (with an experts LoRA)

`auto` keeps the fast path where what it needs is here and, given a calibration of the card (`python -m lab calibrate`:
`exact.<path> = {"err", "bound", "negative", "ok"}`), its exactness check passed there; otherwise the run takes the
slow path and one line says which path, why, and what it costs in `lab.plan.estimate`'s projection. The fast value
forces the path (a LabError where it cannot run: a kernel missing; a failed calibration is only named); the slow value
forces the exact path. A calibration that failed the unfused packed path leaves no exact packed path: refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf

from lab import LabError

TRAINING_STAGES = ("02_sft", "03_grpo")


@dataclass(frozen=True)
class FastPath:
    name: str         # the calibration's exact.<name>
    key: str          # its config key
    fast: str         # the key's value that takes it
    slow: str         # the key's value of the exact path instead
    needs: tuple      # what must be here: "cuda", "mamba_kernels", "varlen_attn"
    instead: str      # what runs instead, in words


PATHS = (
    FastPath("packed_rows_fused", "sft.fused_mamba", "on", "off", ("cuda", "mamba_kernels"),
             "the unfused mixer (causal_conv1d_fn + the chunk scan, then out_proj)"),
    FastPath("varlen_attention", "sft.packed_attention", "varlen", "mask", ("cuda", "varlen_attn"),
             "transformers' sdpa with the block-diagonal mask over the whole pack"),
    FastPath("routed_experts", "sft.lora.experts_path", "routed", "fold", (),
             "PEFT's fold of the experts' LoRA (W + B@A stacks at every forward)"),
)


def applies(path: FastPath, cfg: DictConfig) -> bool:
    """Whether the run would take `path` at all: packed attention only with packing, the routed experts only with an
    experts LoRA trained through the lab's own attach (sft.backend=hf)."""
    if path.name == "varlen_attention":
        return bool(cfg.sft.get("packing", False))
    if path.name == "routed_experts":
        return "experts" in [str(t) for t in cfg.sft.lora.targets] and str(cfg.sft.backend) == "hf"
    return True


def missing(need: str) -> str | None:
    """Why `need` is not here (None: it is)."""
    import torch

    if need == "cuda":
        return None if torch.cuda.is_available() else "no CUDA device"
    if need == "mamba_kernels":
        from lab.model.models import missing_mamba_kernels

        gone = missing_mamba_kernels()
        return "; ".join(f"{k} does not import ({v})" for k, v in gone.items()) or None
    if need == "varlen_attn":
        try:
            from torch.nn.attention.varlen import varlen_attn  # noqa: F401
        except ImportError as e:
            return f"torch {torch.__version__} has no varlen_attn ({e})"
        return None
    raise ValueError(need)


def calibration_failure(path: FastPath, calibration: dict | None) -> str | None:
    """Why the card's calibration rejects `path` (None: it passed, or was not measured)."""
    entry = ((calibration or {}).get("exact") or {}).get(path.name)
    if not isinstance(entry, dict) or entry.get("ok", True):
        return None
    return (f"it failed its calibrated exactness check on this card (err {entry.get('err', float('nan')):.3g} > "
            f"bound {entry.get('bound', float('nan')):.3g})")


def cost(path: FastPath, cfg: DictConfig) -> str:
    """What taking the slow path costs in lab.plan.estimate's projection, in words (projected, or why there is no
    figure)."""
    if path.name == "routed_experts":
        from lab.plan.cost_model import CARDS, card_of, cost_model
        from lab.plan.shapes import model_config_values

        if str(cfg.gpu.name) not in CARDS:
            return f"no projection (gpu={cfg.gpu.name}: lab.plan.estimate projects a configured card only)"
        try:
            card = card_of(cfg)
            rank = int(cfg.gpu.experts_rank or cfg.sft.lora.r)
            values = model_config_values(cfg)
            fold, routed = (cost_model(values, card, p, rank) for p in ("fold", "routed"))
        except Exception as e:  # e.g. no model config to read: say so rather than guess
            return f"no projection ({type(e).__name__}: {e})"
        return (f"projected on {card}: {fold.fixed_s - routed.fixed_s:+.3f} s per micro-step and "
                f"{(fold.per_token_s - routed.per_token_s) * 1e6:+.1f} us per token (lab.plan.cost_model, "
                "fold against routed)")
    if path.name == "packed_rows_fused":
        return ("none projected: lab.plan.estimate projects both Mamba paths with its measured unfused figures (the "
                "fused kernel's gain is not measured)")
    return ("not in lab.plan.estimate's projection: each pack's whole T x T attention per attention layer instead of "
            "each row's own")


def resolve(stage: str, cfg: DictConfig, calibration: dict | None = None) -> tuple[list[str], list[str]]:
    """(overrides, lines) for a stage: `key=slow` for each `auto` fast path that cannot or must not run here, with
    its line; nothing for a stage that trains nothing. LabError for a forced fast path that cannot run, or packing
    without an exact packed path on this card."""
    if stage not in TRAINING_STAGES:
        return [], []
    overrides, lines = [], []
    unfused = calibration_failure(FastPath("packed_rows_unfused", "", "", "", (), ""), calibration)
    if unfused and cfg.sft.get("packing", False):
        raise LabError(f"sft.packing=true: the unfused packed path (packed_rows_unfused) {unfused}, so no packed path "
                       "is exact here; set sft.packing=false")
    for path in PATHS:
        value = str(OmegaConf.select(cfg, path.key))
        if value == path.slow or not applies(path, cfg):
            continue
        gone = next((why for need in path.needs if (why := missing(need))), None)
        if gone == "no CUDA device" and str(cfg.gpu.name) == "none":
            continue  # a CPU run (the tiny model): the exact path is the only one there is, nothing to switch
        failed = calibration_failure(path, calibration)
        if value == path.fast:
            if gone:
                raise LabError(f"{path.key}={path.fast} forces {path.name}, but {gone}; set {path.key}=auto (falls "
                               f"back to {path.slow} with a line) or {path.key}={path.slow}")
            if failed:
                lines.append(f"fast path {path.name} forced on ({path.key}={path.fast}) although {failed}")
            continue
        why = gone or failed
        if why:
            overrides.append(f"{path.key}={path.slow}")
            lines.append(f"fast path {path.name} off ({path.key}={path.slow}): {why}; the run takes {path.instead}; "
                         f"cost: {cost(path, cfg)}")
    return overrides, lines
