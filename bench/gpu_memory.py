"""The memory trace checked against a GPU: a real-width slice of Nemotron-3-Nano, traced on fake tensors and run.

`python bench/gpu_memory.py [--tokens 2048 8192] [--cases kernel real torch] [--timing-tokens N ...] [--out DIR]
[-- OVERRIDES ...]` (on a CUDA machine; without one it prints the traced figures and says that nothing was measured;
scripts/gpu_smoke.sh runs it there)

What it does
  The slice is the real model's config.json (`lab.plan.shapes.model_config_values`: the model folder, ../shared's copy or
  the test fixture) with three decoder blocks instead of 52: one Mamba-2 mixer, one attention layer and one MoE
  layer (128 routed experts, the shared expert), the real vocabulary's embedding and `lm_head`, bf16, the
  configured LoRA (default `experiment=competition`: rank 32 on every family, `lm_head` included), gradient
  checkpointing, fused AdamW (`gpu=rtx_pro_6000`: no lever). For each token count and case it runs one SFT
  micro-step through `lab.plan.memory.trace`:
    - `traced`: on fake tensors on the CPU, the number `check_fits` trusts (the kernels' stand-ins, or the
      PyTorch scan);
    - `counted` / `allocator`: the same step on the card, counted by the same dispatch mode, and
      `torch.cuda.max_memory_allocated` over it.
  Cases: `stand-ins` (the trace's kernel stand-ins, run on the card too), `real kernels` (`mamba_ssm`'s Triton
  chunk scan and TRL's Triton log-prob head; skipped, with the reason, when they do not import), `torch scan`
  (transformers' PyTorch scan; a step the card cannot hold is recorded as out of memory).
  Then, at each `--timing-tokens` count (default: the largest of `--tokens`), each block kind's seconds (forward,
  and forward + backward under checkpointing, median of 3 after a warm-up that also absorbs Triton's autotuning),
  the slice's whole step, and a projection to the 52-block model marked projected.
  Writes `gpu_memory.json` and `gpu_memory.md` into `--out` (default `outputs/bench/`), atomically.

What it simplifies
  1. One row of `tokens` tokens, every position labelled (as `lab.plan.memory` traces it); random weights, so the
     router spreads tokens over the experts about evenly (a trained router need not).
  2. `mamba_ssm` is loaded without its package `__init__` when its compiled Mamba-1 extension is missing
     (`load_mamba_ssm_triton`): Nemotron-H's Mamba-2 path uses only the Triton chunk scan. `causal_conv1d` is used
     when it imports, else transformers' PyTorch conv (the case's label says which).
  3. The projection multiplies per-block seconds by the block counts of the real pattern; it leaves out the
     other blocks' share of the optimizer step and any difference in expert load.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from lab.plan import memory, shapes  # noqa: E402
from lab.model import models
from lab.core.config import compose  # noqa: E402
from lab.core.io import atomic_write_text  # noqa: E402

GIB = memory.GIB
SCAN_MODULE = models.MAMBA_KERNELS["mamba_ssm"][0]  # the module whose chunk scan transformers resolves
SLICE = "M*E"  # one of each block kind, in the real model's order


def load_mamba_ssm_triton() -> str:
    """Make `mamba_ssm.ops.triton.ssd_combined` importable: as installed, or, when the package's `__init__` fails on
    its compiled Mamba-1 extension (`selective_scan_cuda`, which Nemotron-H never calls), as a bare package whose
    submodules load without that `__init__`. Returns how it was loaded, or why not."""
    import importlib
    import importlib.util

    try:
        importlib.import_module(SCAN_MODULE)
        return "mamba_ssm's Triton scan imports" + ("" if "mamba_ssm" in sys.modules else
                                                    " (its package __init__ does not: a module left by an earlier try)")
    except Exception as first:
        for name in [m for m in sys.modules if m == "mamba_ssm" or m.startswith("mamba_ssm.")]:
            del sys.modules[name]
        spec = importlib.util.find_spec("mamba_ssm")
        if spec is None or not spec.submodule_search_locations:
            return f"mamba_ssm not installed ({type(first).__name__}: {first})"
        bare = types.ModuleType("mamba_ssm")
        bare.__path__ = list(spec.submodule_search_locations)
        sys.modules["mamba_ssm"] = bare
        try:
            importlib.import_module(SCAN_MODULE)
        except Exception as e:
            del sys.modules["mamba_ssm"]
            return f"mamba_ssm's Triton scan does not import ({type(e).__name__}: {e})"
        return f"mamba_ssm's Triton modules without the package __init__ ({type(first).__name__}: {first})"


def slice_config(overrides: list[str]):
    """The composed config with `model.architecture` = the real config.json values cut to one block of each kind."""
    cfg = compose(overrides)
    values = shapes.model_config_values(cfg)
    values = {k: v for k, v in values.items() if k not in ("layers_block_type", "auto_map", "architectures")}
    values.update(hybrid_override_pattern=SLICE, num_hidden_layers=len(SLICE))
    plain = OmegaConf.to_container(cfg, resolve=True)
    plain["model"]["architecture"] = values
    return OmegaConf.create(plain), shapes.model_config_values(cfg)


def _clear():
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def step_case(cfg, tokens: int, mamba: str, head: str, cuda: bool) -> dict:
    """One SFT micro-step traced on fake tensors and, on a GPU, run on the card (module docstring)."""
    row = {"tokens": tokens, "mamba": mamba, "head": head}
    fake_head = "chunked" if head == "triton" else head  # the trace's stand-in for TRL's Triton head
    fake_mamba = "kernel" if mamba == "real" else mamba  # ... and for the Mamba kernels
    t = memory.trace(cfg, "sft", tokens=tokens, rows=1, mamba=fake_mamba, head=fake_head)
    row.update(traced_gib=t.peak_bytes / GIB, traced_path=t.mamba_path, experts_path=t.experts_path,
               traced_phases={k: v / GIB for k, v in t.phase_peaks.items()})
    if not cuda:
        return row
    _clear()
    t0 = time.perf_counter()
    try:
        r = memory.trace(cfg, "sft", tokens=tokens, rows=1, mamba=mamba, head=head, fake=False, device="cuda")
    except torch.OutOfMemoryError as e:
        row.update(error="out of memory: " + str(e).split("\n")[0][:300])
        return row
    except Exception as e:  # noqa: BLE001 - a case that breaks is a finding; the other cases still run
        import traceback

        row.update(error=f"{type(e).__name__}: {e}"[:500], traceback=traceback.format_exc()[-3000:])
        return row
    finally:
        _clear()
    row.update(counted_gib=r.peak_bytes / GIB, allocator_gib=r.device_peak_bytes / GIB, run_path=r.mamba_path,
               run_experts_path=r.experts_path, run_seconds=time.perf_counter() - t0,
               run_phases={k: v / GIB for k, v in r.phase_peaks.items()},
               run_top=[(k, v / GIB) for k, v in r.top[:8]])
    return row


def _median_seconds(fn, repeats: int = 3) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1000)
    return statistics.median(times)


def block_seconds(cfg, tokens: int, mamba: str) -> dict:
    """Seconds of each block kind at `tokens` (forward; forward + backward under non-reentrant checkpointing, as
    training runs it) and of the slice's whole step, on the card, with the configured LoRA attached."""
    from torch.utils.checkpoint import checkpoint

    values = dict(shapes.model_config_values(cfg), use_mamba_kernels=False)
    fig = shapes.lora_figures(cfg, values, torch.bfloat16)
    pm = fig["model"]
    pm.to_empty(device="cuda")
    memory.random_weights(pm)
    pm.train()
    out = {}
    hidden = cfg.model.architecture["hidden_size"]
    x = torch.randn(1, tokens, hidden, device="cuda", dtype=torch.bfloat16) * 0.1
    blocks = [m for m in pm.modules() if getattr(m, "block_type", None) is not None]
    with memory._mamba_kernels(mamba), memory._unpacked_rows():
        for block in blocks:
            def fwd():
                with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
                    block(x)

            def fwd_bwd():
                xi = x.detach().requires_grad_(True)
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    y = checkpoint(block, xi, use_reentrant=False)
                y.float().sum().backward()

            out[block.block_type] = {"forward_s": _median_seconds(fwd), "forward_backward_s": _median_seconds(fwd_bwd)}
            pm.zero_grad(set_to_none=True)
        # the slice's whole step as training runs it: forward, TRL's head, backward, the optimizer (no counting)
        pm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        trainable = [p for p in pm.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(trainable, lr=1e-6, fused=True)
        ids = torch.randint(0, 1000, (1, tokens), device="cuda")

        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                h = pm.base_model.model.model(input_ids=ids, attention_mask=None, use_cache=False).last_hidden_state
                loss = memory._head_loss(pm, h, 1.0, ("log_probs", "entropy", "is_top1"), "triton")
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        out["slice_step_s"] = _median_seconds(step)
    del pm, fig
    _clear()
    return out


def project(per_block: dict, slice_step_s: float, pattern: str) -> dict:
    """The 52-block step: the slice's step plus the other blocks' forward + backward (module docstring, 3)."""
    kinds = {"M": "linear_attention", "*": "full_attention", "E": "moe"}  # NemotronHBlock.block_type (Mamba-2: linear)
    counts = {kinds[c]: pattern.count(c) for c in kinds}
    extra = sum((counts[k] - 1) * per_block[k]["forward_backward_s"] for k in counts if k in per_block)
    return {"counts": counts, "step_s": slice_step_s + extra}


def table(rows: list[dict]) -> str:
    lines = ["| tokens | case | traced GiB | counted on the card GiB | allocator peak GiB | allocator / traced |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        case = f"{r['mamba']} / {r['head']}"
        if "error" in r:
            lines.append(f"| {r['tokens']:,} | {case} | {r['traced_gib']:.2f} | {r['error'][:60]} | | |")
        elif "allocator_gib" in r:
            lines.append(f"| {r['tokens']:,} | {case} | {r['traced_gib']:.2f} | {r['counted_gib']:.2f} | "
                         f"{r['allocator_gib']:.2f} | {r['allocator_gib'] / r['traced_gib']:.3f} |")
        else:
            lines.append(f"| {r['tokens']:,} | {case} | {r['traced_gib']:.2f} | (no GPU) | | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[2048, 8192])
    ap.add_argument("--torch-scan-tokens", type=int, nargs="*", default=[2048, 8192],
                    help="token counts for transformers' PyTorch scan (its backward is large)")
    ap.add_argument("--no-timing", action="store_true", help="skip the per-block seconds")
    ap.add_argument("--cases", nargs="*", default=["kernel", "real", "torch"],
                    help="which Mamba paths to run a step of (none: timing only)")
    ap.add_argument("--timing-tokens", type=int, nargs="*", default=None,
                    help="token counts for the per-block seconds (default: the largest of --tokens)")
    ap.add_argument("--out", default="outputs/bench")
    ap.add_argument("overrides", nargs="*", default=None)
    a = ap.parse_args(argv)
    overrides = a.overrides or ["experiment=competition", "gpu=rtx_pro_6000"]
    cuda = torch.cuda.is_available()
    # transformers resolves its Mamba functions when this module is imported: import it before mamba_ssm is made
    # importable, so `torch` stays transformers' PyTorch path and only `real` runs the Triton scan
    import transformers.models.nemotron_h.modeling_nemotron_h  # noqa: F401

    kernels = load_mamba_ssm_triton() if cuda else "no GPU"
    try:
        import trl.kernels  # noqa: F401

        triton_head = True
    except Exception as e:
        triton_head, kernels = False, kernels + f"; TRL's Triton head does not import ({type(e).__name__}: {e})"
    kernels_ok = cuda and triton_head and "does not import" not in kernels and "not installed" not in kernels
    cfg, real_values = slice_config(overrides)
    env = {"torch": torch.__version__, "cuda": torch.version.cuda,
           "gpu": torch.cuda.get_device_name(0) if cuda else None,
           "gpu_total_gib": torch.cuda.get_device_properties(0).total_memory / GIB if cuda else None,
           "kernels": kernels, "overrides": overrides, "slice": SLICE,
           "real_pattern": real_values.get("hybrid_override_pattern")}
    print(json.dumps(env, indent=1), flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    result = {"env": env, "steps": rows}

    def save():  # after every case: a run cut short keeps what it measured
        md = [f"# GPU memory check ({env['gpu'] or 'no GPU'}; torch {env['torch']})", "", f"kernels: {kernels}", "",
              table(rows)]
        atomic_write_text(out / "gpu_memory.json", json.dumps(result, indent=1))
        atomic_write_text(out / "gpu_memory.md", "\n".join(md) + "\n")
        return md

    for tokens in sorted(a.tokens, reverse=True):  # the recipe's length first
        cases = [("kernel", "chunked")]
        if kernels_ok:
            cases.append(("real", "triton"))
        if tokens in a.torch_scan_tokens:
            cases.append(("torch", "triton" if cuda and triton_head else "torch"))
        for mamba, head in [c for c in cases if c[0] in a.cases]:
            rows.append(step_case(cfg, tokens, mamba, head, cuda))
            print(json.dumps(rows[-1]), flush=True)
            save()
    if cuda and not a.no_timing:
        mamba = "real" if kernels_ok else "torch"
        result["timing"] = []
        for tokens in a.timing_tokens or [max(a.tokens)]:
            try:
                per_block = block_seconds(cfg, tokens, mamba)
            except Exception as e:  # noqa: BLE001
                import traceback

                per_block = {"error": f"{type(e).__name__}: {e}"[:500], "traceback": traceback.format_exc()[-3000:]}
            timing = {"tokens": tokens, "mamba": mamba, "per_block": per_block}
            if "slice_step_s" in per_block:
                timing["projected_52_blocks"] = project(per_block, per_block["slice_step_s"],
                                                        env["real_pattern"] or SLICE)
            result["timing"].append(timing)
            print(json.dumps(timing), flush=True)
            save()
    print("\n".join(save()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
