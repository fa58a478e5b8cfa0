"""Packing and checking the Kaggle `submission.zip` (a LoRA adapter for vLLM 0.33).

`pack(adapter_dir, out_zip)` writes a zip with exactly two files at its root,
`adapter_config.json` and `adapter_model.safetensors`: no folders, no nested zip. The config
keeps only standard PEFT LoraConfig fields (fields another back-end added, e.g. Unsloth's, are
dropped). DoRA, rank > 32, `modules_to_save` and LoRA biases are refused. The zip is written to
a temporary file, checked with `check`, and only then renamed into place.

Routed experts. PEFT's `target_parameters` stores a LoRA on the fused expert parameters of
Nemotron-H (`mixer.experts.up_proj`, shape (E, out, in)) as ONE pair per parameter, and nests
the two wrappers, so an adapter holds `...mixer.experts.base_layer.lora_{A,B}.weight` (up_proj,
the first parameter of `NemotronHExperts`) and `...mixer.experts.lora_{A,B}.weight` (down_proj),
with lora_A of shape (r*E, in) (expert-major blocks: expert e is rows e*r..(e+1)*r) and lora_B of
shape (out, r*E) (rank-major: expert e is columns e, e+E, e+2E, ...), see
`peft.tuners.lora.layer.ParamWrapper.get_delta_weight`. vLLM reads Nemotron-H expert LoRAs per
expert instead: `NemotronHForCausalLM.get_expert_mapping` (vllm/model_executor/models/nemotron_h.py)
yields `experts.{e}.up_proj` (w1) and `experts.{e}.down_proj` (w2), which
`vllm/lora/utils.py:process_packed_modules_mapping` turns into the packed sub-modules of each
`...mixer.experts` module; `LoRAModelManager._create_merged_loras_inplace`
(vllm/lora/model_manager.py) looks the adapter's tensors up under those names and
`PackedLoRALayerWeights.pack_moe(..., is_non_gated_moe=True)` (vllm/lora/lora_weights.py)
stacks them. Nemotron-H does not set `is_3d_moe_weight`, so the fused PEFT keys take the 2-D
`FusedMoEWithLoRA` path and fail to load (`assert isinstance(lora_a, list)`, vllm-project/vllm
PR #47088, closed unmerged). `split_fused_experts` therefore writes
`...mixer.experts.{e}.up_proj.lora_A.weight` (r, in) / `.lora_B.weight` (out, r), and the
same for down_proj, which is the layout of an adapter trained on the original per-expert
`nn.Linear` modules. `check` reports fused keys as a problem.
What is verified: the layout was read from vLLM's sources as stored in a public code index
(vllm-project/vllm on GitHub, recent main-branch versions of the files named above, release not
identifiable; vLLM is GPU-only and not installed here), and the split reproduces PEFT's own
per-expert deltas exactly on the tiny model (tests/test_submission.py). What is NOT verified:
loading the packed zip into vLLM 0.33 itself; if 0.33 sets `is_3d_moe_weight` for Nemotron-H,
it would want the fused keys instead, and `split_fused_experts` (and `check`'s fused-key rule)
would need to change. vLLM also needs a LoRA on BOTH up_proj and down_proj of EVERY routed
expert of a layer (`pack_moe` asserts it); `check` reports incomplete expert sets.

`check(zip, base_model=None)` validates any zip and returns every problem in plain words
(empty list = valid): layout, config fields, rank, DoRA, tensor names, shapes against the rank,
and, when a base model config is available (`base_model`, or the adapter's own
`base_model_name_or_path` when that folder has a config.json), every tensor against the module it
targets, built on the meta device (no weights are loaded). Without one, names are checked
against the known Nemotron-H module families.

Deliberately simple: the whole adapter is read into memory to convert it (fine for rank <= 32),
and tensor headers are read straight from the zip without extracting it.

CLI: `python -m lab.submission pack ADAPTER_DIR OUT.zip [--dtype bfloat16]` and
`python -m lab.submission check ZIP [--base-model DIR]` (exit 0 only when valid).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import struct
import sys
import tempfile
import zipfile
from pathlib import Path

from lab.config import LabError

MAX_RANK = 32
CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"

# The fields of peft.LoraConfig (PEFT 0.21.2, including PeftConfig's), fixed here so packing does not
# depend on the installed PEFT. Anything else in adapter_config.json came from another back-end.
LORA_CONFIG_FIELDS = frozenset({
    "alora_invocation_tokens", "alpha_pattern", "arrow_config", "auto_mapping", "base_model_name_or_path", "bias",
    "corda_config", "ensure_weight_tying", "eva_config", "exclude_modules", "fan_in_fan_out", "inference_mode",
    "init_lora_weights", "kasa_config", "layer_replication", "layers_pattern", "layers_to_transform", "loftq_config",
    "lora_alpha", "lora_bias", "lora_dropout", "lora_ga_config", "megatron_config", "megatron_core",
    "modules_to_save", "monteclora_config", "peft_type", "peft_version", "qalora_group_size", "r", "rank_pattern",
    "revision", "runtime_config", "target_modules", "target_parameters", "task_type", "trainable_token_indices",
    "use_bdlora", "use_dora", "use_qalora", "use_rslora", "velora_config",
})
REQUIRED_FIELDS = ("r", "lora_alpha", "target_modules")  # what vLLM's PEFTHelper requires

# Nemotron-H module families a LoRA tensor may target (after `base_model.model.`; `backbone.` is the
# original checkpoint's prefix, which vLLM maps to `model.`).
_LAYER = r"(?:model|backbone)\.layers\.(?P<layer>\d+)\.mixer\."
_FAMILY_PATTERNS = [
    ("attention", re.compile(_LAYER + r"(?P<mod>q_proj|k_proj|v_proj|o_proj)$")),
    ("mamba", re.compile(_LAYER + r"(?P<mod>in_proj|out_proj)$")),
    ("moe", re.compile(_LAYER + r"(?P<mod>shared_experts\.(?:up_proj|down_proj))$")),
    ("moe", re.compile(_LAYER + r"experts\.(?P<expert>\d+)\.(?P<mod>up_proj|down_proj)$")),
    ("moe", re.compile(_LAYER + r"(?P<mod>fc1_latent_proj|fc2_latent_proj)$")),
    ("mlp", re.compile(_LAYER + r"(?P<mod>up_proj|down_proj)$")),
    ("head", re.compile(r"(?P<mod>lm_head)$")),
]
_FUSED = re.compile(r"^(?P<prefix>.*\.experts)(?P<nest>(?:\.base_layer)*)\.(?P<ab>lora_A|lora_B)\.weight$")
_LORA_KEY = re.compile(r"^(?P<module>.+)\.(?P<ab>lora_A|lora_B)\.weight$")
EXPERT_PARAMS = ("up_proj", "down_proj")  # NemotronHExperts' parameters in registration order (= PEFT nesting)


# ---- safetensors without loading ------------------------------------------------------------------

def _read_header(fobj) -> dict:
    """name -> {"dtype", "shape"} from a safetensors stream, reading only its header."""
    raw = fobj.read(8)
    if len(raw) != 8:
        raise ValueError("file shorter than a safetensors header")
    (n,) = struct.unpack("<Q", raw)
    if n > 100_000_000:
        raise ValueError("header length is implausible")
    header = json.loads(fobj.read(n))
    header.pop("__metadata__", None)
    return {k: {"dtype": v["dtype"], "shape": tuple(v["shape"])} for k, v in header.items()}


# ---- base model modules -------------------------------------------------------------------------

def _base_modules(config_dir: str | os.PathLike) -> dict:
    """Module name -> ("linear", in, out) or ("experts", {param: shape}) for a base model, built on meta."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(config_dir), trust_remote_code=False)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    out = {}
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear):
            out[name] = ("linear", mod.in_features, mod.out_features)
        elif type(mod).__name__.endswith("Experts"):
            out[name] = ("experts", {p: tuple(t.shape) for p, t in mod.named_parameters(recurse=False)})
    return out


def _base_config_dir(adapter_config: dict, base_model) -> Path | None:
    if base_model is not None:
        p = Path(base_model)
        if not (p / "config.json").is_file():
            raise LabError(f"{p}: --base-model must be a folder with config.json")
        return p
    p = adapter_config.get("base_model_name_or_path")
    if isinstance(p, str) and p and (Path(p) / "config.json").is_file():
        return Path(p)
    return None


# ---- rank helpers ---------------------------------------------------------------------------------

def _rank_for(module: str, config: dict) -> int:
    """PEFT's rank for a module: rank_pattern (PEFT's `(.*\\.)?pattern$` match) else r."""
    for pattern, r in (config.get("rank_pattern") or {}).items():
        if re.match(rf"(.*\.)?({pattern})$", module):
            return int(r)
    return int(config["r"])


def _strip(name: str) -> str:
    return name[len("base_model.model."):] if name.startswith("base_model.model.") else name


# ---- the expert conversion --------------------------------------------------------------------------

def split_fused_experts(tensors: dict, config: dict, num_experts: int | None = None) -> tuple[dict, int]:
    """Rewrite PEFT `target_parameters` expert keys into the per-expert keys vLLM reads for Nemotron-H.

    `...experts{.base_layer*k}.lora_A.weight` (r*E, in) / `.lora_B.weight` (out, r*E) become
    `...experts.{e}.<param>.lora_A.weight` = A[e*r:(e+1)*r] (r, in) and
    `...experts.{e}.<param>.lora_B.weight` = B[:, e::E] (out, r), where <param> is the targeted
    parameter: PEFT nests the wrappers in NemotronHExperts' parameter order (up_proj, down_proj),
    so the innermost (most `.base_layer`s) is the first targeted one. Then
    delta_e = (alpha/r) * B_e @ A_e, exactly PEFT's `ParamWrapper.get_delta_weight` for expert e.
    Returns (new tensors, number of fused pairs converted). See the module docstring for the
    vLLM source this layout comes from.
    """
    tp = [str(t) for t in (config.get("target_parameters") or [])]
    targeted = [p for p in EXPERT_PARAMS if any(t in (p, f"experts.{p}") or t.endswith(f".experts.{p}") for t in tp)]
    groups: dict[tuple[str, int], dict[str, object]] = {}
    out = {}
    for name, t in tensors.items():
        m = _FUSED.match(name)
        if m is None:
            out[name] = t
            continue
        depth = m["nest"].count(".base_layer")
        groups.setdefault((m["prefix"], depth), {})[m["ab"]] = t
    if not groups:
        return out, 0
    if not targeted:
        raise LabError("adapter has fused expert LoRA keys (...experts.lora_A.weight) but adapter_config.json "
                       "target_parameters names no experts.up_proj/down_proj; cannot tell which is which")
    for (prefix, depth), ab in sorted(groups.items()):
        if set(ab) != {"lora_A", "lora_B"}:
            raise LabError(f"{prefix}: fused expert LoRA with only {sorted(ab)}")
        if depth >= len(targeted):
            raise LabError(f"{prefix}: {depth} nested .base_layer but only {len(targeted)} targeted expert parameters")
        param = targeted[len(targeted) - 1 - depth]
        A, B = ab["lora_A"], ab["lora_B"]
        r = _rank_for(_strip(prefix) + "." + param, config)
        if A.shape[0] % r or B.shape[1] != A.shape[0]:
            raise LabError(f"{prefix} ({param}): lora_A {tuple(A.shape)} / lora_B {tuple(B.shape)} do not fit rank {r}")
        E = A.shape[0] // r
        if num_experts is not None and E != num_experts:
            raise LabError(f"{prefix} ({param}): {E} experts in the LoRA, {num_experts} in the base model")
        for e in range(E):
            out[f"{prefix}.{e}.{param}.lora_A.weight"] = A[e * r:(e + 1) * r].contiguous()
            out[f"{prefix}.{e}.{param}.lora_B.weight"] = B[:, e::E].contiguous()
    return out, len(groups)


# ---- pack ---------------------------------------------------------------------------------------------

def clean_config(config: dict) -> dict:
    """Only standard PEFT LoraConfig fields; inference mode."""
    out = {k: v for k, v in config.items() if k in LORA_CONFIG_FIELDS}
    out["inference_mode"] = True
    return out


def _refuse(config: dict, where: str) -> None:
    bad = []
    if config.get("use_dora"):
        bad.append("use_dora is true (vLLM cannot serve DoRA)")
    if int(config.get("r", 0)) > MAX_RANK:
        bad.append(f"r={config['r']} > {MAX_RANK}")
    for k, v in (config.get("rank_pattern") or {}).items():
        if int(v) > MAX_RANK:
            bad.append(f"rank_pattern[{k!r}]={v} > {MAX_RANK}")
    if config.get("modules_to_save"):
        bad.append(f"modules_to_save={config['modules_to_save']} (vLLM loads LoRA weights only)")
    if config.get("lora_bias") or config.get("bias", "none") != "none":
        bad.append("LoRA/bias training (bias or lora_bias set): vLLM loads no biases")
    if bad:
        raise LabError(f"{where}: cannot be submitted: {'; '.join(bad)}")


def pack(adapter_dir: str | os.PathLike, out_zip: str | os.PathLike, dtype: str | None = None,
         base_model: str | os.PathLike | None = None) -> Path:
    """Write `out_zip` (adapter_config.json + adapter_model.safetensors at its root) atomically; returns its path."""
    import torch
    from safetensors.torch import load_file, save

    adapter_dir, out_zip = Path(adapter_dir), Path(out_zip)
    cfg_path, w_path = adapter_dir / CONFIG_NAME, adapter_dir / WEIGHTS_NAME
    if not cfg_path.is_file():
        raise LabError(f"{adapter_dir}: no {CONFIG_NAME}; not a PEFT adapter folder")
    if not w_path.is_file():
        hint = " (adapter_model.bin found: re-save with safe_serialization)" if (adapter_dir / "adapter_model.bin").is_file() else ""
        raise LabError(f"{adapter_dir}: no {WEIGHTS_NAME}{hint}")
    try:
        config = json.loads(cfg_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise LabError(f"{cfg_path}: not valid JSON ({e})") from None
    if config.get("peft_type", "LORA") != "LORA":
        raise LabError(f"{cfg_path}: peft_type={config.get('peft_type')!r}, not a LoRA adapter")
    _refuse(config, str(cfg_path))
    dropped = sorted(set(config) - LORA_CONFIG_FIELDS)
    if dropped:
        print(f"dropping fields that are not standard PEFT LoraConfig fields: {', '.join(dropped)}")
    config = clean_config(config)

    tensors = load_file(str(w_path))
    # keys saved with an adapter name (`lora_A.default.weight`) are not what vLLM parses: drop the name
    tensors = {re.sub(r"\.(lora_[AB])\.[^.]+\.weight$", r".\1.weight", k): v for k, v in tensors.items()}
    tensors, n_fused = split_fused_experts(tensors, config)
    if n_fused:
        config["target_parameters"] = None
        config["target_modules"] = sorted(set(config.get("target_modules") or []) | set(EXPERT_PARAMS))
        print(f"split {n_fused} fused expert LoRA pairs into per-expert tensors for vLLM")
    if dtype:
        dt = getattr(torch, dtype)
        tensors = {k: v.to(dt) for k, v in tensors.items()}

    out_zip.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out_zip.parent, prefix=f".{out_zip.name}.", suffix=".tmp")
    os.close(fd)
    try:
        with zipfile.ZipFile(tmp, "w") as zf:
            zf.writestr(CONFIG_NAME, json.dumps(config, indent=2, sort_keys=True) + "\n",
                        compress_type=zipfile.ZIP_DEFLATED)
            zf.writestr(WEIGHTS_NAME, save({k: v.contiguous() for k, v in sorted(tensors.items())},
                                           metadata={"format": "pt"}), compress_type=zipfile.ZIP_STORED)
        problems = check(tmp, base_model=base_model)
        if problems:
            raise LabError(f"{out_zip}: the packed adapter is not valid:\n  - " + "\n  - ".join(problems))
        os.replace(tmp, out_zip)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out_zip


# ---- check ---------------------------------------------------------------------------------------------

def _check_config(config: dict) -> list[str]:
    p = []
    missing = [f for f in REQUIRED_FIELDS if f not in config]
    if missing:
        p.append(f"{CONFIG_NAME} lacks {', '.join(missing)} (vLLM requires r, lora_alpha and target_modules)")
    if config.get("peft_type", "LORA") != "LORA":
        p.append(f"{CONFIG_NAME}: peft_type is {config.get('peft_type')!r}; only LORA adapters can be submitted")
    unknown = sorted(set(config) - LORA_CONFIG_FIELDS)
    if unknown:
        p.append(f"{CONFIG_NAME} has unknown back-end fields that are not standard PEFT LoraConfig fields: "
                 f"{', '.join(unknown)} (run `python -m lab.submission pack` to drop them)")
    try:
        r = int(config.get("r", 0))
    except (TypeError, ValueError):
        r = 0
        p.append(f"{CONFIG_NAME}: r={config.get('r')!r} is not an integer")
    if r > MAX_RANK:
        p.append(f"LoRA rank r={r} is above {MAX_RANK}, the max_lora_rank Kaggle's vLLM loads")
    elif "r" in config and r < 1:
        p.append(f"LoRA rank r={config.get('r')!r} must be a positive integer")
    for k, v in (config.get("rank_pattern") or {}).items():
        if not isinstance(v, int) or v < 1:
            p.append(f"rank_pattern gives {v!r} to {k!r}, not a positive integer rank")
        elif v > MAX_RANK:
            p.append(f"rank_pattern gives rank {v} to {k!r}, above {MAX_RANK}, the max_lora_rank Kaggle's vLLM loads")
    if config.get("rank_pattern") or config.get("alpha_pattern"):
        p.append("rank_pattern/alpha_pattern are set, but vLLM scales every module by one lora_alpha/r; "
                 "retrain with a single rank and alpha")
    if config.get("use_dora"):
        p.append("use_dora is true: vLLM cannot serve DoRA adapters")
    if config.get("modules_to_save"):
        p.append(f"modules_to_save={config['modules_to_save']}: vLLM loads only LoRA weights, these full "
                 "modules would be ignored or refused")
    if config.get("lora_bias") or config.get("bias", "none") != "none":
        p.append("bias/lora_bias training is set: vLLM loads no LoRA biases")
    if config.get("layer_replication"):
        p.append("layer_replication is set: vLLM does not support it")
    return p


def _check_tensors(header: dict, config: dict, modules: dict | None, n_layers: int | None = None) -> list[str]:
    p = []
    fused = sorted(k for k in header if _FUSED.match(k))
    if fused:
        p.append(f"vLLM cannot load fused expert LoRA keys (PEFT target_parameters layout) for Nemotron-H: "
                 f"{', '.join(fused[:4])}{' ...' if len(fused) > 4 else ''}; run `python -m lab.submission pack` "
                 f"to split them into per-expert keys (...experts.<e>.up_proj.lora_A.weight)")
    not_lora, unmatched, bad_shape, unpaired = [], [], [], []
    pairs: dict[str, dict] = {}
    for name, info in sorted(header.items()):
        if name in fused:
            continue
        m = _LORA_KEY.match(name)
        if m is None:
            not_lora.append(name)
            continue
        module = _strip(m["module"])
        pairs.setdefault(module, {})[m["ab"]] = info["shape"]
        shape = info["shape"]
        try:
            r = _rank_for(module, config)
        except (KeyError, TypeError, ValueError):
            r = None
        if len(shape) != 2:
            bad_shape.append(f"{name} has shape {shape}, LoRA weights are 2-D")
            continue
        if r is not None and (shape[0] if m["ab"] == "lora_A" else shape[1]) != r:
            want = "(r, in_features)" if m["ab"] == "lora_A" else "(out_features, r)"
            bad_shape.append(f"{name} has shape {shape} but the rank is {r} ({m['ab']} must be {want})")
        # does it target a module of the base model?
        vmod = re.sub(r"^backbone\.", "model.", module)
        if modules is not None:
            ex = re.match(r"^(?P<experts>.+\.experts)\.(?P<e>\d+)\.(?P<param>\w+)$", vmod)
            if ex and modules.get(ex["experts"], (None,))[0] == "experts":
                params = modules[ex["experts"]][1]
                if ex["param"] not in params or int(ex["e"]) >= params[ex["param"]][0]:
                    unmatched.append(name)
                    continue
                _, out_f, in_f = params[ex["param"]]
            elif modules.get(vmod, (None,))[0] == "linear":
                _, in_f, out_f = modules[vmod]
            else:
                unmatched.append(name)
                continue
            want = (r, in_f) if m["ab"] == "lora_A" else (out_f, r)
            if r is not None and shape != want:
                bad_shape.append(f"{name} has shape {shape}, the base model's {vmod} needs {want} at rank {r}")
        else:
            hit = next((fm for _, pat in _FAMILY_PATTERNS if (fm := pat.match(vmod))), None)
            if hit is None or (n_layers is not None and hit.groupdict().get("layer") is not None
                               and int(hit["layer"]) >= n_layers):  # layer indices from the base config
                unmatched.append(name)
    experts: dict[str, set] = {}
    for module in pairs:
        ex = re.match(r"^(?P<experts>.+\.experts)\.(?P<e>\d+)\.(?P<param>up_proj|down_proj)$", module)
        if ex:
            experts.setdefault(ex["experts"], set()).add((int(ex["e"]), ex["param"]))
    for prefix, have in sorted(experts.items()):
        vprefix = re.sub(r"^backbone\.", "model.", prefix)
        n = None
        if modules is not None and modules.get(vprefix, (None,))[0] == "experts":
            n = next(iter(modules[vprefix][1].values()))[0]
        n = n or max(e for e, _ in have) + 1
        lack = sorted({(e, q) for e in range(n) for q in EXPERT_PARAMS} - have)
        if lack:
            shown = ", ".join(f"{e}.{q}" for e, q in lack[:4]) + (" ..." if len(lack) > 4 else "")
            p.append(f"{prefix}: vLLM needs a LoRA on both up_proj and down_proj of every one of the {n} routed "
                     f"experts (its pack_moe asserts it); missing {len(lack)}: {shown}")
    for module, ab in pairs.items():
        if set(ab) != {"lora_A", "lora_B"}:
            unpaired.append(f"{module} has only {', '.join(sorted(ab))}")
        elif ab["lora_A"][0] != ab["lora_B"][1]:
            bad_shape.append(f"{module}: lora_A {ab['lora_A']} and lora_B {ab['lora_B']} disagree on the rank")
    if not_lora:
        p.append(f"tensors that are not LoRA weights named <module>.lora_A.weight / <module>.lora_B.weight (the "
                 f"only form vLLM parses): {', '.join(not_lora[:6])}"
                 f"{' ...' if len(not_lora) > 6 else ''}")
    if unmatched:
        where = "the base model" if modules is not None else "the known Nemotron-H module families"
        p.append(f"tensor names that match no module of {where} ({len(unmatched)}): "
                 f"{', '.join(unmatched[:6])}{' ...' if len(unmatched) > 6 else ''}")
    p += [f"tensor shape disagrees with the rank: {s}" for s in bad_shape[:10]]
    if len(bad_shape) > 10:
        p.append(f"... and {len(bad_shape) - 10} more tensors whose shapes disagree with the rank")
    if unpaired:
        p.append(f"LoRA pairs with a missing half: {'; '.join(unpaired[:6])}")
    if not header:
        p.append(f"{WEIGHTS_NAME} holds no tensors")
    return p


def check(path_to_zip: str | os.PathLike, base_model: str | os.PathLike | None = None) -> list[str]:
    """Every problem with a submission zip, in plain words; an empty list means it is valid."""
    path = Path(path_to_zip)
    if not path.is_file():
        return [f"{path}: file not found"]
    if not zipfile.is_zipfile(path):
        return [f"{path}: not a zip file"]
    problems: list[str] = []
    with zipfile.ZipFile(path) as zf:
        infos = zf.infolist()
        names = [i.filename for i in infos]
        nested = [n for n in names if n.lower().endswith(".zip")]
        if nested:
            problems.append(f"nested zip inside the zip: {', '.join(nested)} (put the adapter files themselves at "
                            "the zip's root)")
        sub = [n for n in names if "/" in n.rstrip("/") or n.endswith("/") or "\\" in n]
        if sub:
            problems.append(f"files in a subfolder: {', '.join(sub[:6])} (Kaggle expects {CONFIG_NAME} and "
                            f"{WEIGHTS_NAME} at the zip's root, no folders)")
        config = None
        if CONFIG_NAME not in names:
            problems.append(f"missing {CONFIG_NAME} at the zip's root")
        else:
            try:
                config = json.loads(zf.read(CONFIG_NAME).decode("utf-8"))
                if not isinstance(config, dict):
                    raise ValueError("not a JSON object")
            except (ValueError, UnicodeDecodeError) as e:
                problems.append(f"{CONFIG_NAME} is not valid JSON ({e})")
                config = None
        header = None
        if WEIGHTS_NAME not in names:
            bin_hint = " (adapter_model.bin is not accepted: save with safetensors)" if "adapter_model.bin" in names else ""
            problems.append(f"missing {WEIGHTS_NAME} at the zip's root{bin_hint}")
        else:
            try:
                with zf.open(WEIGHTS_NAME) as f:
                    header = _read_header(f)
            except (ValueError, KeyError, struct.error) as e:
                problems.append(f"{WEIGHTS_NAME} is not a valid safetensors file ({e})")
    if config is not None:
        problems += _check_config(config)
    if config is not None and header is not None:
        modules, n_layers = None, None
        try:
            cdir = _base_config_dir(config, base_model)
        except LabError as e:
            problems.append(str(e))
            cdir = None
        if cdir is not None:
            try:
                modules = _base_modules(cdir)
            except Exception as e:  # an unknown model type: fall back to the family patterns and the layer count
                if base_model is not None:
                    problems.append(f"{cdir}: cannot build the base model's module list ({type(e).__name__}: {e})")
                try:
                    n_layers = int(json.loads((cdir / "config.json").read_text())["num_hidden_layers"])
                except (OSError, ValueError, KeyError, TypeError):
                    n_layers = None
        problems += _check_tensors(header, config, modules, n_layers)
    return problems


# ---- CLI ------------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.submission", description="pack or check a Kaggle submission.zip")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack", help="ADAPTER_DIR -> OUT.zip (adapter_config.json + adapter_model.safetensors)")
    p.add_argument("adapter_dir")
    p.add_argument("out_zip")
    p.add_argument("--dtype", default=None, help="cast the LoRA tensors, e.g. bfloat16")
    p.add_argument("--base-model", default=None, help="folder with the base model's config.json")
    c = sub.add_parser("check", help="list every problem with ZIP; exit 0 only when valid")
    c.add_argument("zip")
    c.add_argument("--base-model", default=None, help="folder with the base model's config.json")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "pack":
            out = pack(args.adapter_dir, args.out_zip, dtype=args.dtype, base_model=args.base_model)
            print(f"wrote {out}")
            return 0
        problems = check(args.zip, base_model=args.base_model)
    except LabError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if problems:
        print(f"{args.zip}: {len(problems)} problem(s):")
        for x in problems:
            print(f"  - {x}")
        return 1
    print(f"{args.zip}: valid")
    return 0


if __name__ == "__main__":
    sys.exit(main())
