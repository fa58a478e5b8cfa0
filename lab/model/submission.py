"""Packing the Kaggle `submission.zip` (a LoRA adapter for vLLM 0.33), and its command, `python -m lab pack`.

`pack(adapter_dir, out_zip)` writes exactly `adapter_config.json` and `adapter_model.safetensors` at the zip's root;
the config keeps only standard PEFT LoraConfig fields and names the base model by a relative path or Hub id, never
this machine's absolute path. A config `check` would refuse is refused before anything is converted; the zip is
written to a temporary file, checked with `check` (lab/model/submission_check.py), given the user's normal file
permissions and only then renamed into place. Three conversions turn PEFT's adapter into what vLLM reads: the fused
routed-expert LoRAs split per expert (`split_fused_experts`), rank/alpha patterns rewritten for the per-expert
names, lm_head's full base copy dropped. Why each, read in the vllm 0.33.0 wheel: docs/internals.md,
lab.model.submission.

Commands: `python -m lab pack ADAPTER_DIR OUT.zip [--dtype bfloat16] [--base-model-name HUB_ID]` and
`python -m lab check ZIP [--base-model DIR]` (exit 0 only when valid); `python -m lab gate` (the zip served by
vLLM) lives in lab/kaggle/gate.py.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import zipfile
from pathlib import Path

from lab import LabError
from lab.core import owner
from lab.core.io import atomic_file, check_not_input, read_json
from lab.core.paths import project_root
from lab.model.submission_check import (_FUSED, BASE_COPIES, CONFIG_NAME, EXPERT_PARAMS, WEIGHTS_NAME, _strip,
                                  alpha_for, check, config_problems, lora_config_fields, rank_for)

# The dtype of a submission's LoRA tensors (02_sft, 03_grpo, `python -m lab pack`): half the bytes of the
# fp32 adapter PEFT saves, and what vLLM 0.33 computes in anyway: `LoRAModel.from_lora_tensors`
# (vllm/lora/lora_model.py) casts every lora_a / lora_b with `tensor.to(device, dtype=lora_dtype)`, and `lora_dtype`
# "auto" is the model's dtype (`LoRAConfig`, vllm/config/lora.py): bf16 for Nemotron-3-Nano; nothing checks the file's.
SUBMISSION_DTYPE = "bfloat16"
PACK_DTYPES = ("bfloat16", "float16", "float32")  # what --dtype names (torch's spelling)


def pack_dtype(cfg) -> str | None:
    """The dtype GRPO's rounds pack their served adapter in: the model's when it is a half type, since vLLM casts the
    LoRA to the model's dtype when it loads it (lora_dtype "auto", vllm/config/lora.py), so a bf16 pack serves the
    same weights at half the bytes and is what the submission holds (`SUBMISSION_DTYPE`); None (as trained, fp32)
    for the fp32 tiny model."""
    return str(cfg.model.dtype) if str(cfg.model.dtype) in ("bfloat16", "float16") else None


# ---- the expert conversion --------------------------------------------------------------------------

def split_fused_experts(tensors: dict, config: dict, num_experts: int | None = None) -> tuple[dict, list]:
    """Rewrite PEFT `target_parameters` expert keys into the per-expert keys vLLM reads for Nemotron-H (the layouts
    and their sources: the module docstring): A[e*r:(e+1)*r] and B[:, e::E] for expert e, the innermost wrapper
    (most `.base_layer`s) being the first targeted parameter. Returns (new tensors, the (fused key prefix,
    parameter) pairs converted)."""
    tp = [str(t) for t in (config.get("target_parameters") or [])]
    targeted = [p for p in EXPERT_PARAMS if any(t in (p, f"experts.{p}") or t.endswith(f".experts.{p}") for t in tp)]
    groups: dict[tuple[str, int], dict[str, object]] = {}
    out = {}
    for name, t in tensors.items():
        if m := _FUSED.match(name):
            groups.setdefault((m["prefix"], m["nest"].count(".base_layer")), {})[m["ab"]] = t
        else:
            out[name] = t
    if not groups:
        return out, []
    if not targeted:
        raise LabError("adapter has fused expert LoRA keys (...experts.lora_A.weight) but adapter_config.json "
                       "target_parameters names no experts.up_proj/down_proj; cannot tell which is which")
    done = []
    for (prefix, depth), ab in sorted(groups.items()):
        if set(ab) != {"lora_A", "lora_B"}:
            raise LabError(f"{prefix}: fused expert LoRA with only {sorted(ab)}")
        if depth >= len(targeted):
            raise LabError(f"{prefix}: {depth} nested .base_layer but only {len(targeted)} targeted expert parameters")
        param = targeted[len(targeted) - 1 - depth]
        A, B = ab["lora_A"], ab["lora_B"]
        r = rank_for(_strip(prefix) + "." + param, config)
        if A.shape[0] % r or B.shape[1] != A.shape[0]:
            raise LabError(f"{prefix} ({param}): lora_A {tuple(A.shape)} / lora_B {tuple(B.shape)} do not fit rank {r}")
        E = A.shape[0] // r
        if num_experts is not None and E != num_experts:
            raise LabError(f"{prefix} ({param}): {E} experts in the LoRA, {num_experts} in the base model")
        for e in range(E):
            out[f"{prefix}.{e}.{param}.lora_A.weight"] = A[e * r:(e + 1) * r].contiguous()
            out[f"{prefix}.{e}.{param}.lora_B.weight"] = B[:, e::E].contiguous()
        done.append((prefix, param))
    return out, done


def _keep_expert_patterns(config: dict, split: list) -> None:
    """After the split, give each per-expert module the rank and alpha PEFT gave its fused parameter (module
    docstring, rank_pattern / alpha_pattern): where they differ, one escaped key per (layer, parameter) is put first
    (the first match wins in PEFT and vLLM alike)."""
    orig = dict(config)  # the loop below replaces the pattern dicts, never changes them
    for prefix, param in split:
        fused, one = f"{_strip(prefix)}.{param}", f"{_strip(prefix)}.0.{param}"
        want = (rank_for(fused, orig), alpha_for(fused, orig))
        if (rank_for(one, config), alpha_for(one, config)) != want:
            key = re.escape(_strip(prefix)) + r"\.\d+\." + param
            config["rank_pattern"] = {key: want[0], **(config.get("rank_pattern") or {})}
            config["alpha_pattern"] = {key: want[1], **(config.get("alpha_pattern") or {})}


# ---- pack ---------------------------------------------------------------------------------------------

ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # every member's time stamp in submission.zip: reproducible bytes


def _member(name: str) -> zipfile.ZipInfo:
    """A zip member with a fixed time and the mode `ZipFile.writestr` gives a plain name (0600)."""
    info = zipfile.ZipInfo(name, ZIP_TIME)
    info.external_attr = 0o600 << 16
    return info


def _portable_name(name):
    """base_model_name_or_path without this machine's absolute path: relative to the project root (how the lab's
    configs name paths, `lab.core.paths.resolve_path`); a Hub id or a relative name is kept."""
    if not isinstance(name, str) or not Path(name).expanduser().is_absolute():
        return name
    return os.path.relpath(Path(name).expanduser(), project_root())


def pack(adapter_dir: str | os.PathLike, out_zip: str | os.PathLike, dtype: str | None = None,
         base_model: str | os.PathLike | None = None, base_model_name: str | None = None) -> Path:
    """Write `out_zip` (adapter_config.json + adapter_model.safetensors at its root) atomically; returns its path.

    `base_model_name` (e.g. the Hub id) replaces the adapter's base_model_name_or_path; without it an absolute
    local path is made relative to the project root. The zip is written by `lab.core.io.atomic_file`, so it gets the
    permissions of any file the user creates (0666 less the umask), not mkstemp's 0600.
    """
    import torch
    from safetensors.torch import load_file, save

    adapter_dir, out_zip = Path(adapter_dir), Path(out_zip)
    if dtype and not (isinstance(getattr(torch, dtype, None), torch.dtype) and getattr(torch, dtype).is_floating_point):
        raise LabError(f"--dtype {dtype}: not a torch floating-point dtype; use {', '.join(PACK_DTYPES)} or keep")
    check_not_input(out_zip, adapter_dir, base_model, what="submission zip")  # never over the trained weights
    cfg_path, w_path = adapter_dir / CONFIG_NAME, adapter_dir / WEIGHTS_NAME
    if not cfg_path.is_file():
        raise LabError(f"{adapter_dir}: no {CONFIG_NAME}; not a PEFT adapter folder")
    if not w_path.is_file():
        hint = (" (adapter_model.bin found: re-save with safe_serialization)"
                if (adapter_dir / "adapter_model.bin").is_file() else "")
        raise LabError(f"{adapter_dir}: no {WEIGHTS_NAME}{hint}")
    config = read_json(cfg_path, kind=dict)
    dropped = sorted(set(config) - lora_config_fields())
    config = {k: v for k, v in config.items() if k in lora_config_fields()} | {"inference_mode": True}
    if problems := config_problems(config):
        raise LabError(f"{cfg_path}: cannot be submitted: {'; '.join(problems)}")
    if dropped:
        print(f"dropping fields that are not standard PEFT LoraConfig fields: {', '.join(dropped)}")
    config["base_model_name_or_path"] = base_model_name or _portable_name(config.get("base_model_name_or_path"))

    try:
        tensors = load_file(str(w_path))
    except Exception as e:  # safetensors raises its own SafetensorError (truncated, bad header) or OSError
        raise LabError(f"{w_path}: not a readable safetensors file ({type(e).__name__}: {e}); the adapter is "
                       "damaged, save it again") from None
    # full lm_head / embed_tokens copies (PEFT's save_embedding_layers="auto" when they are targeted): vLLM skips them
    copies = sorted(k for k in tensors if k.endswith(BASE_COPIES))
    if copies:
        print(f"dropping full base-weight copies that vLLM does not load: {', '.join(copies)}")
        tensors = {k: v for k, v in tensors.items() if k not in copies}
    # keys saved with an adapter name (`lora_A.default.weight`) are not what vLLM parses: drop the name
    tensors = {re.sub(r"\.(lora_[AB])\.[^.]+\.weight$", r".\1.weight", k): v for k, v in tensors.items()}
    tensors, split = split_fused_experts(tensors, config)
    if split:
        _keep_expert_patterns(config, split)
        config["target_parameters"] = None
        tm, params = config.get("target_modules") or [], sorted({q for _, q in split})
        config["target_modules"] = (rf"(?:{tm})|.*\.experts\.\d+\.(?:{'|'.join(params)})" if isinstance(tm, str)
                                    else sorted(set(tm) | set(params)))
        print(f"split {len(split)} fused expert LoRA pairs into per-expert tensors for vLLM")
    if dtype:
        tensors = {k: v.to(getattr(torch, dtype)) for k, v in tensors.items()}

    with atomic_file(out_zip) as tmp:  # replaces out_zip only once the packed zip passes the check
        with zipfile.ZipFile(tmp, "w") as zf:
            # the members' time is fixed (zip's earliest), so the same adapter packs to the same bytes on every run;
            # top-level keys sorted; rank_pattern/alpha_pattern keep their order (the first matching key wins)
            zf.writestr(_member(CONFIG_NAME), json.dumps(dict(sorted(config.items())), indent=2)
                        + "\n", compress_type=zipfile.ZIP_DEFLATED)
            zf.writestr(_member(WEIGHTS_NAME), save(
                {k: v.contiguous() for k, v in sorted(tensors.items())}, metadata={"format": "pt"}),
                compress_type=zipfile.ZIP_STORED)
        problems = check(tmp, base_model, label=str(out_zip))
        if problems:
            raise LabError(f"{adapter_dir}: cannot be packed into {out_zip}; the packed adapter has these "
                           "problems:\n  - " + "\n  - ".join(problems))
    return out_zip

# ---- CLI ------------------------------------------------------------------------------------------------

def pack_main(argv: list[str] | None = None) -> int:
    """`python -m lab pack ADAPTER_DIR OUT.zip [--dtype D] [--base-model DIR] [--base-model-name HUB_ID]`."""
    p = argparse.ArgumentParser(prog="python -m lab pack",
                                description="ADAPTER_DIR -> OUT.zip (adapter_config.json + adapter_model.safetensors)")
    p.add_argument("adapter_dir")
    p.add_argument("out_zip", help="the zip to write (a new file)")
    p.add_argument("--force", action="store_true", help="replace OUT.zip when it exists")
    p.add_argument("--dtype", default=SUBMISSION_DTYPE,
                   help="cast the LoRA tensors to this torch dtype (default %(default)s, what vLLM computes in); "
                        "'keep': as the adapter saved them")
    p.add_argument("--base-model", help="folder with the base model's config.json")
    p.add_argument("--base-model-name", help="base_model_name_or_path to write, e.g. the Hub id (default: the "
                                             "adapter's, made relative)")
    args = p.parse_args(argv)
    owner.output_file(args.out_zip, "pack", args.force, (args.adapter_dir, args.base_model), "submission zip")
    out = pack(args.adapter_dir, args.out_zip, dtype=None if args.dtype == "keep" else args.dtype,
               base_model=args.base_model, base_model_name=args.base_model_name)
    print(f"wrote {out}")
    return 0


def check_main(argv: list[str] | None = None) -> int:
    """`python -m lab check ZIP [--base-model DIR]`: every problem of a submission zip; exit 0 only when valid."""
    c = argparse.ArgumentParser(prog="python -m lab check", description="list every problem with ZIP; exit 0 only "
                                                                        "when valid")
    c.add_argument("zip")
    c.add_argument("--base-model", help="folder with the base model's config.json")
    args = c.parse_args(argv)
    problems = check(args.zip, base_model=args.base_model)
    if problems:
        print(f"{args.zip}: {len(problems)} problem(s):")
        for x in problems:
            print(f"  - {x}")
        return 1
    n = len(problems.warnings)
    print(f"{args.zip}: valid" + (f" ({n} warning(s) above: not everything could be checked)" if n else ""))
    return 0
