"""`python -m lab calibrate [OVERRIDES...] [--json PATH]`: a rented card's first minutes, measured. Random weights at
the configured model's shapes (nothing downloaded); every step's result is written atomically as soon as it ends, so a
run killed mid-way keeps what it measured. Without a GPU the same steps run on the composed model with small packs and
the JSON says so: a CPU calibration is never read as a card's. Written to `--json PATH` and to
`outputs/calibration/<gpu.name>.json`, which `python -m lab estimate` reads. Its steps and their JSON keys:
docs/internals.md, lab.train.calibrate; the design and the time budget: docs/calibrate.md.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import functools
import importlib
import importlib.util
import inspect
import json
import platform
import sys
import time
from pathlib import Path
from unittest import mock

import numpy as np
from omegaconf import DictConfig, OmegaConf

from lab import LabError
from lab.core import owner
from lab.core.io import atomic_write_json
from lab.plan import estimate
from lab.plan.shapes import param_counts

MADE_BY = estimate.CALIBRATION_MADE_BY
GPU_PACKS = (1024, 8192, 16384)
CPU_PACKS = (64, 256, 512)
EXACT_TOKENS = {"cuda": 2048, "cpu": 96}  # one pack of rows for the exactness checks
EXACT_PATHS = ("packed_rows_fused", "packed_rows_unfused", "varlen_attention", "routed_experts")
PACKAGES = ("torch", "transformers", "peft", "trl", "accelerate", "triton", "mamba_ssm", "causal_conv1d",
            "bitsandbytes", "vllm")


# ---- where it writes ------------------------------------------------------------------------------------------------

def default_path(cfg: DictConfig, cuda: bool) -> Path:
    """outputs/calibration/<gpu.name>.json on a GPU (what `lab estimate` reads), cpu.json without one."""
    return estimate.calibration_dir() / (f"{cfg.gpu.name}.json" if cuda else "cpu.json")


def check_writable(path: Path, force: bool = False) -> None:
    """`--json PATH` must be new, or a calibration this command made (its `meta.made_by`); anything else goes through
    the lab's one owner check (`lab.core.owner.output_file`: refused unless --force)."""
    if path.is_file():
        try:
            if json.loads(path.read_text(encoding="utf-8")).get("meta", {}).get("made_by") == MADE_BY:
                return
        except (ValueError, AttributeError, OSError):
            pass
    owner.output_file(path, "calibrate --json", force, what="calibration file")


def make_default_folder(path: Path) -> None:
    """The card's calibration folder (`outputs/calibration`): new, or the one this command made (`owner.output_dir`)."""
    owner.output_dir(path.parent, "calibrate")


# ---- meta and env ---------------------------------------------------------------------------------------------------

def step_meta(ctx) -> dict:
    import torch

    from lab.core.run import git_commit

    cuda = ctx["cuda"]
    return {"made_by": MADE_BY, "card": str(ctx["cfg"].gpu.name) if cuda else "cpu",
            "device": torch.cuda.get_device_name(0) if cuda else f"cpu ({platform.processor() or platform.machine()})",
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "lab_commit": git_commit(), "model": str(ctx["cfg"].model.name),
            "recipe_key": estimate.recipe_key(ctx["cfg"], ctx["values"]),
            "what": ("the configured model at full depth on this card" if cuda else
                     "NO GPU: the composed model on the CPU with small packs; not a card's calibration")}


def _version(name: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(name.replace("_", "-"))
    except Exception:
        return None


def _bind(module: str, attr: str, args: tuple, kwargs: dict) -> dict:
    """Whether `module.attr(*args, **kwargs)` binds to the installed function's signature."""
    try:
        fn = importlib.import_module(module)
        for part in attr.split("."):
            fn = getattr(fn, part)
    except Exception as e:
        return {"imports": False, "why": f"{type(e).__name__}: {str(e)[:200]}"}
    try:
        inspect.signature(fn).bind(*args, **kwargs)
        return {"imports": True, "binds": True}
    except TypeError as e:
        return {"imports": True, "binds": False, "why": str(e)}


# the calls the lab makes, spelled as it makes them (placeholder values: only the names and positions are bound)
CALLS = {
    "varlen_attn": ("torch.nn.attention.varlen", "varlen_attn", (0,) * 7,
                    {"scale": None, "window_size": (-1, 0), "enable_gqa": True}),  # lab/model/packed_rows.py
    "mamba_split_conv1d_scan_combined": (
        "mamba_ssm.ops.triton.ssd_combined", "mamba_split_conv1d_scan_combined", (0,) * 5,
        {"D": 0, "chunk_size": 0, "activation": "silu", "rmsnorm_weight": 0, "rmsnorm_eps": 0, "outproj_weight": None,
         "outproj_bias": None, "headdim": 0, "ngroups": 0, "norm_before_gate": False, "return_final_states": False,
         "dt_limit": (0.0, 1.0), "seq_idx": 0}),  # transformers' mixer + lab.model.lora's guard
    "mamba_chunk_scan_combined": (
        "mamba_ssm.ops.triton.ssd_combined", "mamba_chunk_scan_combined", (0,) * 5,
        {"chunk_size": 0, "D": 0, "z": None, "dt_bias": 0, "initial_states": None, "dt_softplus": True,
         "dt_limit": (0.0, 1.0), "return_final_states": False, "seq_idx": 0}),
    "causal_conv1d_fn": ("causal_conv1d", "causal_conv1d_fn", (0, 0, 0), {"activation": "silu", "seq_idx": 0}),
    "vllm.LLM.sleep": ("vllm", "LLM.sleep", (None,), {"level": 2}),  # lab/train/rollouts.py
    "vllm.LLM.wake_up": ("vllm", "LLM.wake_up", (None,), {"tags": ["weights"]}),
    "vllm.LLM.collective_rpc": ("vllm", "LLM.collective_rpc", (None, "reload_weights"), {}),
    "vllm.LoRARequest": ("vllm.lora.request", "LoRARequest", ("a", 1, "/path"), {}),
}


def step_env(ctx) -> dict:
    import torch

    from lab.model import models, packed_rows

    out = {"python": platform.python_version(), "packages": {p: _version(p) for p in PACKAGES},
           "cuda": torch.version.cuda, "device": "cuda" if ctx["cuda"] else "cpu",
           "kernels_missing": models.missing_mamba_kernels(),
           "calls": {name: _bind(*spec) for name, spec in CALLS.items()}}
    try:
        import transformers.models.nemotron_h.modeling_nemotron_h as mh

        out["takes_seq_idx"] = {n: packed_rows._takes_seq_idx(getattr(mh, n, None))
                                for n in packed_rows.KERNEL_FUNCTIONS}
    except Exception as e:
        out["takes_seq_idx"] = f"{type(e).__name__}: {e}"
    return out


# ---- exactness ------------------------------------------------------------------------------------------------------

def rel_err(a, b) -> float:
    """max |a - b| / max |b| (b: the reference)."""
    scale = float(b.abs().max())
    return float((a.double() - b.double()).abs().max()) / (scale if scale > 0 else 1.0)


def worst(cand: list, ref: list) -> float:
    return max(rel_err(c, r) for c, r in zip(cand, ref, strict=True))


def verdict(ref: list, base: list, cand: list, neg: list, dtype) -> dict:
    """The `exact.<path>` entry: candidate and slow path in `dtype`, the negative control, against the reference."""
    import torch

    eps = torch.finfo(dtype).eps
    factor = 1000.0 if dtype in (torch.float32, torch.float64) else 10.0
    err, b, n = worst(cand, ref), worst(base, ref), worst(neg, ref)
    bound = 4 * b + 4 * eps
    return {"err": err, "base": b, "bound": bound, "negative": n, "factor": factor,
            "ok": bool(err <= bound and n >= factor * bound)}


def exact_values(ctx) -> dict:
    """The model the exactness checks run: on a GPU a real-width slice (one block of each kind, in the real order),
    on the CPU the composed model itself."""
    values = dict(ctx["values"])
    if ctx["cuda"]:
        values.pop("layers_block_type", None)
        values.update(hybrid_override_pattern="M*E", num_hidden_layers=3)
    return values


def exact_rows(ctx, total: int) -> list[int]:
    """Row lengths for one pack of `total` tokens, from the data's distribution scaled to the pack (at least 4
    rows, each at least 8 tokens)."""
    rng = np.random.default_rng(0)
    pool = np.asarray(ctx["rows"], dtype=float)
    rows, left = [], total
    while left > 0:
        n = int(max(8, round(rng.choice(pool) * total / 4 / max(pool.mean(), 1))))
        rows.append(min(n, left))
        left -= rows[-1]
    return rows if len(rows) > 1 else [total // 2, total - total // 2]


def build_exact_model(ctx, values: dict, device: str):
    """The configured LoRA attached (lab.model.lora.attach_lora) to randomly initialised weights, in fp32, with
    every LoRA factor random (PEFT starts lora_B at zero, where any LoRA layout would pass)."""
    import torch
    from transformers import NemotronHConfig, NemotronHForCausalLM

    from lab.model.lora import attach_lora

    skip = ("model_type", "torch_dtype", "architectures", "auto_map")
    torch.manual_seed(0)
    with torch.device(device):
        model = NemotronHForCausalLM(NemotronHConfig(**{k: v for k, v in values.items() if k not in skip})).float()
    pm, _ = attach_lora(ctx["cfg"], model)
    g = torch.Generator(device=device).manual_seed(1)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_" in n:
                p.copy_(torch.randn(p.shape, generator=g, device=device) * 0.02)
    pm.train()
    return pm


def run_rows(pm, ids, rows: list[int], weights, packed: bool) -> list:
    """Per-token log-probabilities of the next token and every LoRA gradient of sum(weights x log-probs): the rows
    one by one (`packed=False`) or as one pack whose position_ids restart at each row."""
    import torch

    params = [p for n, p in pm.named_parameters() if "lora_" in n]
    for p in params:
        p.grad = None
    bounds = np.cumsum([0, *rows])
    if packed:
        pos = torch.cat([torch.arange(n, device=ids.device) for n in rows])[None]
        logits = pm(input_ids=ids[None], position_ids=pos, use_cache=False).logits[0].float()
        parts = [logits[s:e] for s, e in zip(bounds[:-1], bounds[1:])]
    else:
        parts = [pm(input_ids=ids[None, s:e], use_cache=False).logits[0].float() for s, e in zip(bounds[:-1],
                                                                                              bounds[1:])]
    logp = torch.cat([torch.log_softmax(p[:-1], -1).gather(-1, ids[s + 1:e, None])[:, 0]
                      for p, s, e in zip(parts, bounds[:-1], bounds[1:])])
    (logp.double() * weights[:logp.numel()]).sum().backward()
    return [logp.detach()] + [p.grad.detach().clone() for p in params]


def _requirement(path: str, cuda: bool, cfg: DictConfig) -> str | None:
    """Why `path`'s fast path cannot run here (None: it can)."""
    from lab.model import packed_rows

    if path == "routed_experts":
        return None if "experts" in [str(t) for t in cfg.sft.lora.targets] else "no experts LoRA in sft.lora.targets"
    if not cuda:
        return ("no CUDA device: the varlen kernel is CUDA only" if path == "varlen_attention" else
                "no CUDA device: the Mamba kernels (mamba_ssm, causal_conv1d) are CUDA only")
    if path == "varlen_attention":
        try:
            importlib.import_module("torch.nn.attention.varlen")
            return None
        except Exception as e:
            return f"torch.nn.attention.varlen does not import ({type(e).__name__}: {e})"
    try:
        packed_rows.require_kernels()
        return None
    except LabError as e:
        return str(e)


def _variants(path: str):
    """(fast, negative) contexts for `path`: what the lab runs, and a known-wrong variant of it. Each is a callable
    `(pm) -> context manager` entered around the candidate's call."""
    from lab.model import experts_lora, lora, packed_rows

    @contextlib.contextmanager
    def packed(pm, attention="mask", fused=True, wrong_attention=False):
        def one_row(module, query, key, value, attention_mask, **kw):  # every row attends to the whole pack
            if kw.get("seq_idx") is not None:
                kw["seq_idx"] = kw["seq_idx"].new_zeros(kw["seq_idx"].shape)
            return original(module, query, key, value, attention_mask, **kw)

        original = packed_rows.packed_attention_forward
        with contextlib.ExitStack() as stack:
            if wrong_attention:  # registered by install; the lab's own registered again on the way out
                stack.callback(packed_rows.register_attention)
                stack.enter_context(mock.patch.object(packed_rows, "packed_attention_forward", one_row))
            stack.enter_context(lora.fused_mamba_as(pm, fused))
            handle = packed_rows.install(pm, attention=attention)
            stack.callback(handle.remove)
            yield

    @contextlib.contextmanager
    def leaky(pm, fused=True):  # no packed_rows: the Mamba state runs on from one row into the next
        with lora.fused_mamba_as(pm, fused):
            yield

    @contextlib.contextmanager
    def experts(pm, wrong=False):
        def b_expert_major(w, adapter):  # lora_B read expert-major, PEFT's layout is expert-fastest
            A, _, s = right(w, adapter)
            b = w.lora_B[adapter].weight
            return A, b.reshape(b.shape[0], w.num_experts, -1).permute(1, 0, 2).contiguous().to(A.dtype), s

        right = experts_lora.expert_factors
        experts_lora.apply("routed", pm)
        try:
            wrong_layout = mock.patch.object(experts_lora, "expert_factors", b_expert_major)
            with wrong_layout if wrong else contextlib.nullcontext():
                yield
        finally:
            experts_lora.apply("fold", pm)

    if path == "packed_rows_fused":
        return (lambda pm: packed(pm)), (lambda pm: leaky(pm)), True
    if path == "packed_rows_unfused":
        return (lambda pm: packed(pm, fused=False)), (lambda pm: leaky(pm, fused=False)), True
    if path == "varlen_attention":
        return (lambda pm: packed(pm, "varlen")), (lambda pm: packed(pm, "varlen", wrong_attention=True)), True
    return (lambda pm: experts(pm)), (lambda pm: experts(pm, wrong=True)), False


def exact_path(ctx, path: str) -> dict:
    """One `exact.<path>` entry (docs/internals.md, lab.train.calibrate)."""
    import torch

    from lab.model import experts_lora

    cuda = ctx["cuda"]
    device = "cuda" if cuda else "cpu"
    ref_dtype, dtype = (torch.float32, torch.bfloat16) if cuda else (torch.float64, torch.float32)
    if "exact_model" not in ctx:
        ctx["exact_model"] = build_exact_model(ctx, exact_values(ctx), device)
    base_pm = ctx["exact_model"]
    total = EXACT_TOKENS[device]
    rows = exact_rows(ctx, total)
    g = torch.Generator(device="cpu").manual_seed(3)
    vocab = base_pm.get_output_embeddings().weight.shape[0] if hasattr(base_pm, "get_output_embeddings") else None
    ids = torch.randint(0, int(vocab or ctx["values"]["vocab_size"]), (total,), generator=g).to(device)
    weights = torch.randn(total, generator=g, dtype=torch.float64).to(device)
    fast, negative, packs = _variants(path)
    models = {}

    def model(dt):
        if dt not in models:
            models[dt] = copy.deepcopy(base_pm).to(dt)
            if dt != torch.bfloat16:  # torch's grouped_mm takes bf16 only on CUDA, no fp64 anywhere
                models[dt].base_model.model.set_experts_implementation("eager")
            experts_lora.apply("fold" if path == "routed_experts" else str(ctx["cfg"].sft.lora.get(
                "experts_path", "routed")), models[dt])
        return models[dt]

    def run(dt, variant):
        pm = model(dt)
        with variant(pm) if variant else contextlib.nullcontext():
            return run_rows(pm, ids, rows, weights, packed=packs and variant is not None)

    why = _requirement(path, cuda, ctx["cfg"])
    if path == "routed_experts" and why:
        return {"skipped": why}
    ref, base = run(ref_dtype, None), run(dtype, None)
    where = {"rows": rows, "tokens": total, "dtype": str(dtype).removeprefix("torch."),
             "reference": str(ref_dtype).removeprefix("torch."),
             "model": "real-width slice M*E" if cuda else f"{ctx['cfg'].model.name}, full depth"}
    result = verdict(ref, base, run(dtype, fast), run(dtype, negative), dtype)
    if why:
        return {"skipped": why, "cpu_branch": {**result, **where,
                                               "what": "the lab's branch on this device (not the fast path)"}}
    return {**result, **where}


def step_exact(ctx) -> dict:
    out = {}
    for path in EXACT_PATHS:
        t0 = time.perf_counter()
        try:
            out[path] = exact_path(ctx, path)
        except Exception as e:  # one path failing must not hide the others
            out[path] = {"error": f"{type(e).__name__}: {e}"}
        out[path]["seconds"] = round(time.perf_counter() - t0, 2)
        ctx["partial"]("exact", out)
    ctx.pop("exact_model", None)
    return out


# ---- speed ----------------------------------------------------------------------------------------------------------

def pack_rows(ctx, tokens: int) -> list[int]:
    """Whole rows drawn (seeded) from the data's row lengths until `tokens` is filled, the last cut to fit; on the
    CPU the lengths are scaled by the small pack over the real one (16,384)."""
    if not ctx["cfg"].sft.get("packing", False):
        return [tokens]  # the recipe trains unpacked rows: one row of that many tokens
    rng = np.random.default_rng(tokens)
    pool = np.asarray(ctx["rows"], dtype=float)
    scale = 1.0 if ctx["cuda"] else CPU_PACKS[-1] / GPU_PACKS[-1]
    rows, left = [], tokens
    while left > 0:
        n = max(2, int(round(rng.choice(pool) * scale)))
        rows.append(min(n, left))
        left -= rows[-1]
    return rows


class Stepper:
    """One training micro-step of the recipe at full depth: forward through the backbone (packed rows installed as
    the recipe says), TRL's log-prob head (its Triton kernel on CUDA, lab.train.trl_private on the CPU), backward,
    the recipe's optimizer step. Timed with the device synchronised."""

    def __init__(self, ctx):
        import torch

        from lab.model import packed_rows
        from lab.plan import memory, shapes

        cfg, self.cuda = ctx["cfg"], ctx["cuda"]
        self.device = "cuda" if self.cuda else "cpu"
        self.dtype = getattr(torch, str(cfg.model.dtype))
        fig = shapes.lora_figures(cfg, ctx["values"], self.dtype)
        self.pm = fig["model"]
        self.pm.to_empty(device=self.device)
        memory.random_weights(self.pm)
        if cfg.sft.gradient_checkpointing:
            self.pm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.pm.train()
        self.packing = bool(cfg.sft.get("packing", False))
        if self.packing:
            self.handle = packed_rows.install(self.pm, attention=str(cfg.sft.get("packed_attention", "mask")))
        self.trainable = [p for p in self.pm.parameters() if p.requires_grad]
        self.optim = str(cfg.gpu.optim or "adamw_torch_fused")
        self.opt = self._optimizer(float(cfg.sft.learning_rate))
        self.head = "triton" if self.cuda and importlib.util.find_spec("trl.kernels") else "torch"
        self.vocab = int(ctx["values"]["vocab_size"])

    def _optimizer(self, lr: float):
        import torch

        if self.optim == "adamw_bnb_8bit":
            try:
                import bitsandbytes as bnb

                return bnb.optim.AdamW8bit(self.trainable, lr=lr)
            except Exception as e:  # the smoke's 64 MiB carry no bitsandbytes: time torch's, and say so
                self.optim = f"adamw_torch_fused (the recipe's adamw_bnb_8bit does not import: {type(e).__name__})"
                return torch.optim.AdamW(self.trainable, lr=lr, fused=self.cuda)
        if self.optim in ("adamw_torch_fused", "adamw_torch"):
            return torch.optim.AdamW(self.trainable, lr=lr, fused=self.optim.endswith("fused") and self.cuda)
        raise LabError(f"gpu.optim={self.optim!r}: calibrate times adamw_torch_fused, adamw_torch or adamw_bnb_8bit")

    def step(self, rows: list[int], train: bool = True) -> float:
        import torch

        from lab.plan import memory

        ids = torch.randint(0, self.vocab, (1, sum(rows)), device=self.device)
        pos = torch.cat([torch.arange(n, device=self.device) for n in rows])[None]
        autocast = torch.autocast(self.device, dtype=self.dtype) if self.dtype == torch.bfloat16 else \
            contextlib.nullcontext()
        self._sync()
        t0 = time.perf_counter()
        with autocast, (contextlib.nullcontext() if train else torch.no_grad()):
            hidden = self.pm.base_model.model.model(input_ids=ids, position_ids=pos, use_cache=False).last_hidden_state
            loss = memory._head_loss(self.pm, hidden, 1.0, ("log_probs", "entropy"), self.head)
        if train:
            loss.backward()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        self._sync()
        return time.perf_counter() - t0

    def _sync(self):
        import torch

        if self.cuda:
            torch.cuda.synchronize()

    def measure(self, rows: list[int], train: bool = True, repeats: int = 3) -> dict:
        """A warm-up and `repeats` timed steps; a step the card cannot hold is recorded as out of memory."""
        import torch

        try:
            return self._measure(rows, train, repeats)
        except torch.cuda.OutOfMemoryError as e:
            self.opt.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            return {"tokens": sum(rows), "rows": len(rows), "error": f"out of memory: {str(e)[:200]}"}

    def _measure(self, rows: list[int], train: bool, repeats: int) -> dict:
        import torch

        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        warm = self.step(rows, train)
        times = [self.step(rows, train) for _ in range(repeats)]
        out = {"tokens": sum(rows), "rows": len(rows), "warmup_s": round(warm, 4), "seconds": times,
               "median_s": float(np.median(times))}
        out["peak_gib"] = torch.cuda.max_memory_allocated() / 2 ** 30 if self.cuda else None
        return out


def fit(points: list[tuple[int, float]]) -> dict:
    """Least squares seconds = fixed_s + tokens x us_per_token / 1e6 over the packs' medians, with residuals."""
    if len(points) < 2:
        raise LabError(f"calibrate: {len(points)} pack(s) timed, a line needs two")
    t = np.asarray([p[0] for p in points], dtype=float)
    y = np.asarray([p[1] for p in points], dtype=float)
    per, fixed = np.polyfit(t, y, 1)
    return {"fixed_s": float(fixed), "us_per_token": float(per * 1e6), "points": len(points),
            "residuals_s": [float(r) for r in y - (fixed + per * t)]}


def step_speed(ctx) -> dict:
    import torch

    from lab.model import experts_lora, lora
    from lab.plan import memory

    cfg, cuda = ctx["cfg"], ctx["cuda"]
    st = Stepper(ctx)
    packs = GPU_PACKS if cuda else CPU_PACKS
    out = {"model": f"{cfg.model.name}, full depth" + ("" if cuda else " (NO GPU: CPU, small packs)"),
           "optimizer": st.optim, "head": st.head, "packing": st.packing,
           "packed_attention": str(cfg.sft.get("packed_attention", "mask")) if st.packing else None,
           "experts_lora": experts_lora.path_of(st.pm), "packs": {}}
    for n in packs:
        rows = pack_rows(ctx, n)
        out["packs"][str(n)] = m = st.measure(rows)
        m["trace_gib"], m["trace"] = None, "not traced: the trace runs the bf16 model only (torch's grouped_mm)"
        if st.dtype == torch.bfloat16:
            try:
                t = memory.trace(cfg, "sft", tokens=n, mamba="kernel")
                m["trace_gib"] = t.peak_gib
                m["trace"] = f"lab memory --tokens {n}: one unpacked row, fake tensors, {t.mamba_path}"
            except Exception as e:
                m["trace"] = f"{type(e).__name__}: {e}"
        ctx["partial"]("speed", out)
    try:
        out["fit"] = fit([(m["tokens"], m["median_s"]) for m in out["packs"].values() if "median_s" in m])
    except LabError as e:
        out["fit"] = {"error": str(e)}
    small = pack_rows(ctx, packs[0])
    if out["experts_lora"] == "routed":
        experts_lora.apply("fold", st.pm)
        out["fold"] = st.measure(small)
        experts_lora.apply("routed", st.pm)
    with lora.fused_mamba_as(st.pm, False):
        out["unfused"] = st.measure(small)
        out["unfused"]["note"] = ("every Mamba mixer on transformers' PyTorch path with the kernels" if cuda
                                  else "no kernel on the CPU: the same path as the packs")
    ctx["partial"]("speed", out)
    grpo = int(cfg.model.max_model_len)
    out["grpo_row"] = st.measure([grpo])
    out["no_grad_forward"] = st.measure([grpo], train=False)
    return out


# ---- vLLM's decode step ---------------------------------------------------------------------------------------------

DECODE_BATCHES = {"cuda": (1, 8, 32, 64, 128, 256), "cpu": (1, 4)}  # sequences decoding at once
DECODE_TOKENS = {"cuda": (64, 320), "cpu": (4, 36)}  # (T1, T2): max_tokens of the two timed generations


def decode_batches(cfg, cuda: bool) -> list[int]:
    """The batch sizes timed: on a GPU `DECODE_BATCHES` up to the rollout engine's most sequences in flight
    (`lab.plan.grpo_policy.rollout_seqs`; the pass rates' own engine where it has one), 64 and that cap always in;
    on the CPU (1, 4)."""
    if not cuda:
        return list(DECODE_BATCHES["cpu"])
    from lab.plan.grpo_policy import rollout_seqs

    cap = rollout_seqs(cfg, engine_phase(cfg))
    return sorted({s for s in DECODE_BATCHES["cuda"] if s <= cap} | {64, cap})


def engine_phase(cfg) -> str:
    """The rollout engine the decode steps are timed on: the pass rates' own (the larger) where GRPO builds one
    (`lab.plan.grpo_policy.separate_pass_engine`), else the rounds'."""
    from lab.plan.grpo_policy import separate_pass_engine

    return "pass_rates" if separate_pass_engine(cfg) else "rounds"


def engine_folder(ctx, folder: Path) -> str | None:
    """The configured model's config.json values in `folder` (as published: `lab.plan.shapes.model_config_values`),
    with its tokenizer where the lab reaches one (the tiny one built in memory; else `data.tokenizer_path` or the model
    folder); no weights (vLLM's `load_format="dummy"`). Returns where the tokenizer came from, None without one."""
    from transformers import AutoTokenizer

    from lab.core.paths import resolve_path
    from lab.model import models

    cfg = ctx["cfg"]
    values = {**ctx["values"], "model_type": "nemotron_h", "architectures": ["NemotronHForCausalLM"],
              "torch_dtype": str(cfg.model.dtype)}
    tok, source = None, None
    if cfg.model.build_tiny:  # as lab.model.models.build_tiny makes it
        tok, source = models.build_tiny_tokenizer(int(values["vocab_size"])), "the tiny tokenizer, built in memory"
        values.update(vocab_size=len(tok), pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                      eos_token_id=tok.eos_token_id)
    else:
        for p in (cfg.data.get("tokenizer_path"), cfg.model.path):
            if p and (resolve_path(str(p)) / "tokenizer.json").is_file():
                tok, source = AutoTokenizer.from_pretrained(str(resolve_path(str(p)))), str(resolve_path(str(p)))
                break
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(values, indent=1), encoding="utf-8")
    if tok is not None:
        tok.save_pretrained(folder)
    return source


def time_decode(llm, s: int, tokens: tuple[int, int], prompt: int, vocab: int, sampling) -> dict:
    """Seconds per decode step of `s` sequences: `s` random prompts of `prompt` tokens generated to exactly T1 and T2
    tokens (`ignore_eos`), after a warm-up at T1; (t(T2) - t(T1)) / (T2 - T1) leaves out prefill and each call's
    start, which both runs pay alike. Fresh prompts each call: no prefix-cache hit shortens the second run."""
    rng = np.random.default_rng(s)
    times = {}
    for name, T in (("warmup", tokens[0]), ("t1", tokens[0]), ("t2", tokens[1])):
        prompts = [{"prompt_token_ids": rng.integers(0, vocab, prompt).tolist()} for _ in range(s)]
        params = [sampling(max_tokens=T, seed=i) for i in range(s)]
        t = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        times[name] = time.perf_counter() - t
        got = sorted({len(o.outputs[0].token_ids) for o in outs})
        if len(outs) != s or got != [T]:
            raise LabError(f"calibrate vllm: {s} prompts to {T} tokens gave {len(outs)} outputs of {got} tokens")
    step = (times["t2"] - times["t1"]) / (tokens[1] - tokens[0])
    return {"seconds": step if step > 0 else None, "T1": tokens[0], "T2": tokens[1],
            "raw_s": {k: round(v, 4) for k, v in times.items()},
            **({} if step > 0 else {"why": "t(T2) <= t(T1): the difference is within the noise"})}


def time_switch(llm, weights_gib: float) -> dict:
    """Seconds of the rollout engine's switch (lab.train.rollouts): sleep(1) + wake_up() where the host holds the
    weights (`lab.plan.grpo_policy.host_gib`, with its margin), then sleep(2) + wake_up(["weights"]) + reload +
    wake_up(["kv_cache"]). The reload reads the weights from the model folder, which dummy weights do not have
    (vLLM 0.33, model_executor/model_loader/reload/inplace.py: NotImplementedError for load_format "dummy")."""
    from lab.plan.grpo_policy import HOST_MARGIN_GIB, host_gib

    host = host_gib()
    out = {"weights_gib": weights_gib, "host_gib": host}
    levels = (1, 2)
    if host is None or host < weights_gib + HOST_MARGIN_GIB:
        levels = (2,)
        out["level_1"] = {"not_measured": f"the host's memory ({host} GiB) may not hold the weights"}
    for level in levels:
        t0 = time.perf_counter()
        llm.sleep(level=level)
        t1 = time.perf_counter()
        llm.wake_up(tags=["weights"] if level == 2 else None)
        row = {"sleep_s": round(t1 - t0, 3), "wake_s": round(time.perf_counter() - t1, 3)}
        if level == 2:
            t = time.perf_counter()
            try:
                llm.collective_rpc("reload_weights")
                row["reload_s"] = round(time.perf_counter() - t, 3)
                row["reload"] = "dummy weights: random values, not a read of the model folder"
            except Exception as e:
                row["reload"] = f"not measured: {type(e).__name__}: {str(e)[:200]}"
            t = time.perf_counter()
            llm.wake_up(tags=["kv_cache"])
            row["wake_s"] = round(row["wake_s"] + time.perf_counter() - t, 3)
        out[f"level_{level}"] = row
    return out


def step_vllm(ctx):
    """Seconds per decode step of GRPO's rollout engine (as lab.train.rollouts builds it) on random weights, per
    batch size (`time_decode`), and its sleep / wake switch on CUDA (`time_switch`); docs/calibrate.md."""
    import tempfile

    from lab.model import generate, vllm_cpu
    from lab.plan.estimate_infer import CONSTANTS

    cfg, cuda = ctx["cfg"], ctx["cuda"]
    if "vllm" not in sys.modules and importlib.util.find_spec("vllm") is None:
        return "absent"  # (no environment set for it)
    if not cuda:
        vllm_cpu.cpu_environment()  # before vLLM is imported
    try:
        import vllm
    except Exception:
        return "absent"
    generate.release_memory()  # the speed step's model, gone with its step
    import torch

    out = {"version": getattr(vllm, "__version__", None) or _version("vllm"),
           "device": torch.cuda.get_device_name(0) if cuda else f"cpu ({platform.processor() or platform.machine()})",
           "decode_step_s": {}, "detail": {}}
    d = out["detail"]
    if not cuda:
        vllm_cpu.install_expert_matmul_standin()
        d["note"] = "NO GPU: vLLM's CPU build, routed experts through lab.model.vllm_cpu's TEST-ONLY stand-in"
    batches = decode_batches(cfg, cuda)
    tokens = DECODE_TOKENS["cuda" if cuda else "cpu"]
    max_len = min(int(cfg.infer.max_model_len), int(cfg.model.max_model_len))
    prompt = min(int(CONSTANTS["prompt_tokens"][0]), max_len - tokens[1] - 1)
    share, phase = None, engine_phase(cfg)
    if cuda:
        from lab.plan.grpo_policy import engine_share

        share = float(cfg.grpo.vllm_gpu_memory_utilization or engine_share(cfg, phase))
    g = cfg.grpo
    with tempfile.TemporaryDirectory(prefix="lab_calibrate_vllm_") as folder:
        d["tokenizer"] = engine_folder(ctx, Path(folder)) or "none reachable: skip_tokenizer_init=True"
        vocab = int(json.loads((Path(folder) / "config.json").read_text())["vocab_size"])
        d["engine"] = {"weights": "load_format=dummy: random, nothing read or written", "max_num_seqs": max(batches),
                       "sized_for": phase if cuda else None,
                       "gpu_memory_utilization": share, "max_model_len": max_len, "enable_lora": True,
                       "max_lora_rank": int(cfg.infer.max_lora_rank), "dtype": str(cfg.model.dtype),
                       "sleep_mode": bool(cuda and g.vllm_sleep_mode), "logprobs_mode": "processed_logprobs",
                       "gpu_allocated_before_gib": torch.cuda.memory_allocated() / 2 ** 30 if cuda else None,
                       "lora": "no adapter served: the decode step without the LoRA's matmuls"}
        t = time.perf_counter()
        llm = generate.vllm_engine(cfg, folder, max_num_seqs=max(batches), gpu_memory_utilization=share,
                                   enable_sleep_mode=d["engine"]["sleep_mode"], logprobs_mode="processed_logprobs",
                                   load_format="dummy", skip_tokenizer_init=d["tokenizer"].startswith("none"))
        d["engine"]["start_s"] = round(time.perf_counter() - t, 2)
        try:
            if cuda:  # the real pool against the lab's bound (its activation and CUDA-graph memory are not in it)
                from lab.train.rollouts import engine_pool

                d["engine"]["pool"] = engine_pool(cfg, llm, max(batches), phase)
            ctx["partial"]("vllm", out)
            with contextlib.suppress(AttributeError):
                d["engine"]["mamba_ssm_cache_dtype"] = str(
                    llm.llm_engine.vllm_config.cache_config.mamba_ssm_cache_dtype)
            d.update(prompt_tokens=prompt, sampling={"temperature": float(g.temperature), "top_p": float(g.top_p),
                                                     "logprobs": 0, "ignore_eos": True, "seed": "per request"},
                     batches={})
            sampling = functools.partial(vllm.SamplingParams, temperature=float(g.temperature), top_p=float(g.top_p),
                                         logprobs=0, ignore_eos=True)
            for s in batches:
                try:
                    d["batches"][str(s)] = row = time_decode(llm, s, tokens, prompt, vocab, sampling)
                except Exception as e:  # the batches timed so far stay; the engine may be broken: stop here
                    d["batches"][str(s)] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                    out["switch_s"] = {"not_measured": f"the batch of {s} failed"}
                    break
                out["decode_step_s"][str(s)] = row["seconds"]
                ctx["partial"]("vllm", out)
            else:
                out["switch_s"] = {"not_measured": "sleep mode runs on CUDA only (lab.model.generate.vllm_engine)"}
                if d["engine"]["sleep_mode"]:
                    try:
                        out["switch_s"] = time_switch(llm, 2 * param_counts(cfg)[0] / 2 ** 30)
                    except Exception as e:
                        out["switch_s"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        finally:
            generate.close_engine(llm)
            del llm
            generate.release_memory()
    return out


STEPS = {"meta": step_meta, "env": step_env, "exact": step_exact, "speed": step_speed, "vllm": step_vllm}


# ---- the command ----------------------------------------------------------------------------------------------------

def calibrate(cfg: DictConfig, paths: list[Path], rows: list[int] | None = None) -> dict:
    """Run every step of `STEPS`, writing the result to each of `paths` after each step (and inside the long ones).
    A step that fails is recorded as {"error": ...} and the next one runs."""
    import torch

    from lab.plan.shapes import model_config_values

    cuda = torch.cuda.is_available()
    result: dict = {}

    def write():
        for p in paths:
            atomic_write_json(p, result)

    def partial(key, value):
        result[key] = value
        write()

    ctx = {"cfg": cfg, "cuda": cuda, "values": model_config_values(cfg), "partial": partial,
           "rows": rows or estimate.row_tokens(cfg, sample=200)[0]}
    for name, fn in STEPS.items():
        t0 = time.perf_counter()
        try:
            result[name] = fn(ctx)
        except Exception as e:
            result[name] = {"error": f"{type(e).__name__}: {e}"}
        if isinstance(result[name], dict):
            result[name]["step_seconds"] = round(time.perf_counter() - t0, 2)
        print(f"calibrate: {name} done in {time.perf_counter() - t0:.1f} s", flush=True)
        write()
    return result


def _g(x, fmt: str = ".3g") -> str:
    return "-" if x is None else format(x, fmt) if isinstance(x, (int, float)) else str(x)


def markdown(result: dict) -> list[str]:
    """A calibration as Markdown tables (scripts/gpu_smoke.sh's report, RESULTS.md's "GPU check")."""
    m = result.get("meta", {})
    out = [f"Calibration: gpu={m.get('card')}, {m.get('device')}, {m.get('date')}, lab commit {m.get('lab_commit')}, "
           f"model {m.get('model')} ({m.get('what')})", "",
           "| exact path | err | base | bound | negative | ok |", "|---|---|---|---|---|---|"]
    for path, e in (result.get("exact") or {}).items():
        if not isinstance(e, dict):
            continue
        row = e.get("cpu_branch", e)
        note = f" (skipped: {e['skipped']}; the lab's branch here:)" if "skipped" in e else ""
        if "error" in e:
            out.append(f"| {path} | error: {e['error'][:150]} | | | | |")
        elif "err" in row:
            out.append(f"| {path}{note} | {_g(row['err'])} | {_g(row['base'])} | {_g(row['bound'])} | "
                       f"{_g(row['negative'])} | {row['ok']} |")
        elif "skipped" in e:
            out.append(f"| {path} | skipped: {e['skipped']} | | | | |")
    sp = result.get("speed") or {}
    if "error" in sp:
        out += ["", f"speed: error: {sp['error']}"]
    elif sp:
        out += ["", f"Speed ({sp.get('model')}; optimizer {sp.get('optimizer')}, head {sp.get('head')}, experts LoRA "
                f"{sp.get('experts_lora')}, packing {sp.get('packing')}):", "",
                "| step | tokens | rows | median s | warm-up s | peak GiB | trace GiB |",
                "|---|---|---|---|---|---|---|"]
        cases = [(f"pack {k}", v) for k, v in sorted(sp.get("packs", {}).items(), key=lambda kv: int(kv[0]))]
        cases += [(k, sp[k]) for k in ("fold", "unfused", "grpo_row", "no_grad_forward") if k in sp]
        for name, v in cases:
            out.append(f"| {name} | {v.get('tokens')} | {v.get('rows')} | {_g(v.get('median_s'), '.4f')} | "
                       f"{_g(v.get('warmup_s'), '.4f')} | {_g(v.get('peak_gib'), '.2f')} | "
                       f"{_g(v.get('trace_gib'), '.2f')} |")
        f = sp.get("fit") or {}
        out += ["", f"fit: {_g(f.get('fixed_s'), '.4f')} s + {_g(f.get('us_per_token'), '.2f')} us/token per "
                    f"micro-step (residuals {f.get('residuals_s')})"]
    out += [""] + vllm_markdown(result.get("vllm"))
    return out


def vllm_markdown(v) -> list[str]:
    """The `vllm` key as a table: seconds per decode step per batch size, with the raw times, and the switch."""
    if not isinstance(v, dict) or "error" in v:
        return [f"vLLM: {v}"]
    d = v.get("detail", {})
    out = [f"vLLM {v.get('version')} on {v.get('device')}, dummy weights, prompts of {d.get('prompt_tokens')} tokens, "
           f"engine start {_g(d.get('engine', {}).get('start_s'))} s:", "",
           "| sequences | s per decode step | T1 | T2 | t(T1) s | t(T2) s | warm-up s |",
           "|---|---|---|---|---|---|---|"]
    for s, r in d.get("batches", {}).items():
        raw = r.get("raw_s", {})
        out.append(f"| {s} | {_g(r.get('seconds'), '.4f') if 'error' not in r else 'error: ' + r['error'][:100]} | "
                   f"{_g(r.get('T1'))} | {_g(r.get('T2'))} | {_g(raw.get('t1'))} | {_g(raw.get('t2'))} | "
                   f"{_g(raw.get('warmup'))} |")
    return out + ["", f"switch: {v.get('switch_s')}"]


def report(folder: Path) -> str:
    """scripts/gpu_smoke.sh's one report from its folder: the parts, the calibration, the tests."""
    import xml.etree.ElementTree as ET

    lines = ["## GPU check (scripts/gpu_smoke.sh)", ""]
    parts = folder / "parts.txt"
    lines += ["```", parts.read_text().strip() if parts.is_file() else "no parts.txt", "```", ""]
    cal = folder / "calibration.json"
    lines += markdown(json.loads(cal.read_text())) if cal.is_file() else ["no calibration.json (calibrate did not "
                                                                          "finish a step)"]
    xml = folder / "tests.xml"
    if xml.is_file():
        suite = ET.parse(xml).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        lines += ["", "tests (fast lane, CUDA visible): " + ", ".join(f"{k} {suite.get(k)}" for k in
                                                                     ("tests", "failures", "errors", "skipped"))]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """`python -m lab calibrate [OVERRIDES...] [--json PATH]`; `--report DIR`: scripts/gpu_smoke.sh's report"""
    from lab.core.config import compose

    ap = argparse.ArgumentParser(prog="python -m lab calibrate", description="measure the fast paths' exactness and "
                                 "the training step's speed on this card (docs/internals.md, lab.train.calibrate)")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. experiment=competition gpu=h100_80gb")
    ap.add_argument("--json", default=None, help="also write the calibration here (a new file)")
    ap.add_argument("--force", action="store_true", help="--json may replace a file calibrate did not make")
    ap.add_argument("--report", default=None, help="print scripts/gpu_smoke.sh's report of this folder, run nothing")
    a = ap.parse_intermixed_args(argv)
    if a.report:
        print(report(Path(a.report)), end="")
        return 0
    import torch

    cfg = compose(a.overrides)
    cuda = torch.cuda.is_available()
    if not cuda and not cfg.model.build_tiny:
        raise LabError(f"model={cfg.model.name} without a GPU: calibrate runs the real model's shapes on a card only; "
                       "here it runs the tiny model (no model override)")
    paths = [default_path(cfg, cuda)] + ([Path(a.json)] if a.json else [])
    if a.json:
        check_writable(paths[1], a.force)
    make_default_folder(paths[0])
    if not cuda:
        print("calibrate: NO GPU here: the composed model on the CPU with small packs (not a card's calibration)")
    result = calibrate(cfg, paths)
    print(json.dumps(summary(result), indent=1))
    print("written: " + ", ".join(map(str, paths)))
    return 0 if all(not (isinstance(v, dict) and "error" in v) for v in result.values()) else 1


def summary(result: dict) -> dict:
    """The headline figures of a calibration."""
    ex = result.get("exact", {})
    sp = result.get("speed", {})
    vl = result.get("vllm")
    return {"card": result.get("meta", {}).get("card"),
            "exact": {k: (v.get("ok") if "skipped" not in v else "skipped") for k, v in ex.items()
                      if isinstance(v, dict) and k != "step_seconds"},
            "fit": sp.get("fit") if isinstance(sp, dict) else None,
            "decode_step_s": vl.get("decode_step_s", vl.get("error")) if isinstance(vl, dict) else vl}

