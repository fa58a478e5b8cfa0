"""Packing and checking the Kaggle `submission.zip` (a LoRA adapter for vLLM 0.33).

`pack(adapter_dir, out_zip)` writes a zip with exactly two files at its root,
`adapter_config.json` and `adapter_model.safetensors`: no folders, no nested zip. The config
keeps only standard PEFT LoraConfig fields (fields another back-end added, e.g. Unsloth's, are
dropped) and names the base model by a relative path or Hub id, never this machine's absolute
path. DoRA, a rank above the competition's `max_lora_rank`, `modules_to_save` and LoRA biases are
refused; an unreadable adapter is a LabError naming the file. The zip is written to a temporary file, checked with `check`, given the
user's normal file permissions and only then renamed into place.

Routed experts. PEFT's `target_parameters` stores a LoRA on the fused expert parameters of
Nemotron-H (`mixer.experts.up_proj`, shape (E, out, in)) as ONE pair per parameter, and nests
the two wrappers, so an adapter holds `...mixer.experts.base_layer.lora_{A,B}.weight` (up_proj,
the first parameter of `NemotronHExperts`) and `...mixer.experts.lora_{A,B}.weight` (down_proj),
with lora_A of shape (r*E, in) (expert-major blocks: expert e is rows e*r..(e+1)*r) and lora_B of
shape (out, r*E) (rank-major: expert e is columns e, e+E, e+2E, ...), see
`peft.tuners.lora.layer.ParamWrapper.get_delta_weight`. vLLM 0.33 reads Nemotron-H expert LoRAs
per expert instead (read in the vllm 0.33.0 wheel): `NemotronHForCausalLM` leaves
`is_3d_moe_weight` at the SupportsLoRA default False (models/interfaces.py) and sets
`is_non_gated_moe`; its `get_expert_mapping` (models/nemotron_h.py) yields the checkpoint names
`experts.{e}.up_proj` (w1) and `experts.{e}.down_proj` (w2)
(`RoutedExperts.build_expert_params_mapping`, layers/fused_moe/routed_experts.py), which
`process_packed_modules_mapping` (vllm/lora/utils.py) makes the packed sub-modules of each
`...mixer.experts`; `LoRAModelManager._create_merged_loras_inplace` (vllm/lora/model_manager.py)
looks the adapter's tensors up under those names and `PackedLoRALayerWeights.pack_moe`
(vllm/lora/lora_weights.py) stacks them, refusing experts of one projection with different
ranks. Fused keys are refused at load (`_validate_moe_lora_format`: "contains fused 3D MoE
weights"). `split_fused_experts` therefore writes `...mixer.experts.{e}.up_proj.lora_A.weight`
(r, in) / `.lora_B.weight` (out, r), and the same for down_proj; the split reproduces PEFT's own
per-expert deltas exactly on the tiny model (tests/test_submission.py). vLLM also needs a LoRA
on BOTH up_proj and down_proj of EVERY routed expert of a layer (`pack_moe` asserts it).
Not verified here: loading a packed zip into a running vLLM engine (GPU only).

rank_pattern / alpha_pattern. vLLM 0.33 applies them per module (`PEFTHelper.get_rank_and_scaling`,
vllm/lora/peft_helper.py, matched like PEFT's `get_pattern_key` against the names in the file)
and refuses an adapter whose largest rank (r or any rank_pattern value) exceeds max_lora_rank.
PEFT matched the fused name `...experts.up_proj`, vLLM matches `...experts.3.up_proj`, so
`pack` adds one escaped key per layer where the two would differ.

lm_head. PEFT saves `base_model.model.lm_head.lora_A.weight` (r, hidden) / `.lora_B.weight`
(vocab, r), which is what vLLM 0.33 reads: `parse_fine_tuned_lora_name` gives module `lm_head`,
`NemotronHForCausalLM.embedding_modules` lists it and `LogitsProcessorWithLoRA`
(vllm/lora/layers/logits_processor.py) holds (r, hidden) / (vocab, r). PEFT also saves a full copy
`lm_head.base_layer.weight` when lm_head is targeted; vLLM skips that name
(`is_base_embedding_weights`), so `pack` drops it.

`check(zip, base_model=None)` returns every problem in plain words (an empty list = valid):
- the zip: two files at the root, no folders, `..` paths, duplicate or encrypted members or nested
  zips; a zip that would inflate past 16 GiB or more than 100:1 is refused unread (zip bomb);
  every byte read back must match the zip's CRC-32;
- the safetensors file, read whole, one tensor at a time: every tensor's byte range inside the
  file, the ranges contiguous and covering it exactly (a file cut short or with trailing bytes
  fails), dtype size x shape == range length, floating-point dtypes, every value finite and below
  1e4 in magnitude (random bytes read as floats are mostly NaN or huge; overwritten bytes that
  happen to read as small finite numbers cannot be told from weights);
- the config: the fields vLLM 0.33's PEFTHelper requires or refuses, rank <= `max_lora_rank` per module;
- the config against the tensors: every LoRA module is named by `target_modules` (routed experts
  also by `target_parameters`), every name there has tensors;
- the tensors: names vLLM parses, pairs complete, A (r, in) and B (out, r) at each module's rank,
  complete expert sets; against the base model's modules built on the meta device (no weights)
  when its config is at hand (`base_model`, or the adapter's `base_model_name_or_path` as a
  folder, relative to the project root, or in the local Hub cache), else against the Nemotron-H
  module families.
Base model: an ERROR (a problem) when it is known not to be Nemotron-H (a config whose model_type
is not `nemotron_h`, or a Hub id that names no Nemotron model, e.g. `meta-llama/Llama-3-8B`):
Kaggle's vLLM puts the adapter on Nemotron-3-Nano whatever the field says, so it cannot be what
the user meant. A WARNING (printed to stderr and kept in the result's `.warnings`; the zip stays
valid) when it cannot be checked here (no field, a Nemotron Hub id not downloaded, a folder not
on this machine): vLLM never reads the field, so refusing would reject every good real-model
adapter checked without the 60 GB checkpoint; its tensors are still checked against the
families and the rank.

What it simplifies:
1. `pack` reads the whole adapter into memory to convert it (fine for the ranks Kaggle loads).
2. `check` streams the safetensors file from the zip without extracting it.

CLI: `python -m lab.submission pack ADAPTER_DIR OUT.zip [--dtype bfloat16] [--base-model-name HUB_ID]`,
`python -m lab.submission check ZIP [--base-model DIR]` (exit 0 only when valid) and
`python -m lab.submission gate ZIP --model DIR [--n N]` (the zip served by vLLM; lab/gate.py).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import struct
import sys
import zipfile
import zlib
from pathlib import Path

import numpy as np

from lab import lora
from lab import LabError
from lab.config import competition
from lab.io import atomic_file
from lab.paths import project_root, resolve_path

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
# The dtype of a submission's LoRA tensors (02_sft, 03_grpo, `python -m lab.submission pack`): half the bytes of the
# fp32 adapter PEFT saves, and what vLLM 0.33 computes in anyway: `LoRAModel.from_lora_tensors`
# (vllm/lora/lora_model.py) casts every lora_a / lora_b with `tensor.to(device, dtype=lora_dtype)`, and `lora_dtype`
# "auto" is the model's dtype (`LoRAConfig`, vllm/config/lora.py): bf16 for Nemotron-3-Nano; nothing checks the file's.
SUBMISSION_DTYPE = "bfloat16"

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

# Nemotron-H module names a LoRA tensor may target (after `base_model.model.`; `backbone.` is the original
# checkpoint's prefix, which vLLM maps to `model.`): one pattern per row of lab.lora's family table.
_LAYER = r"(?:model|backbone)\.layers\.(?P<layer>\d+)\.mixer\."
_FAMILY_PATTERNS = [(f.group, re.compile(("" if f.group == "head" else _LAYER) + f"(?P<mod>{f.packed})$"))
                    for f in lora.TABLE]
_FUSED = re.compile(r"^(?P<prefix>.*\.experts)(?P<nest>(?:\.base_layer)*)\.(?P<ab>lora_A|lora_B)\.weight$")
_LORA_KEY = re.compile(r"^(?P<module>.+)\.(?P<ab>lora_A|lora_B)\.weight$")
EXPERT_PARAMS = ("up_proj", "down_proj")  # NemotronHExperts' parameters in registration order (= PEFT nesting)
# full weight copies PEFT saves when lm_head / embed_tokens are targeted; vLLM 0.33 skips exactly these
# (`is_base_embedding_weights`, vllm/lora/utils.py)
BASE_COPIES = (".lm_head.base_layer.weight", ".embed_tokens.base_layer.weight")


# ---- safetensors, read whole but one tensor at a time ----------------------------------------------

# bytes per element of every safetensors dtype (safetensors' Dtype enum); LoRA weights must be floating point
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4,
               "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1}
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")
MAX_ABS = 1e4          # no trained LoRA weight comes near this; random bytes read as floats mostly do
CHUNK = 64 << 20       # bytes read at a time (a multiple of every dtype size)
MAX_UNCOMPRESSED = 16 << 30  # a rank-32 LoRA on every family of the 30B model is a few GB even in float32
MAX_RATIO, RATIO_FROM = 100, 64 << 20  # zip bomb: > 100:1 overall once more than 64 MiB would be inflated
MAX_CONFIG = 1 << 20
MAX_HEADER = 100_000_000  # safetensors' own limit on the header length

# IEEE-754 layout per float dtype: (unsigned view, mask clearing the sign, bits of +inf, bits of MAX_ABS,
# bits -> value).
# Without the sign, a float's bits order like its magnitude and every NaN/inf is >= the bits of +inf, so one integer
# max per chunk finds NaN, inf and huge values (fast on any CPU; no float arithmetic on the weights).
_FLOAT_BITS = {
    "F64": (np.uint64, 0x7FFF_FFFF_FFFF_FFFF, 0x7FF0_0000_0000_0000, int(np.float64(MAX_ABS).view(np.uint64)),
            lambda b: float(np.array(b, np.uint64).view(np.float64))),
    "F32": (np.uint32, 0x7FFF_FFFF, 0x7F80_0000, int(np.float32(MAX_ABS).view(np.uint32)),
            lambda b: float(np.array(b, np.uint32).view(np.float32))),
    "F16": (np.uint16, 0x7FFF, 0x7C00, int(np.float16(MAX_ABS).view(np.uint16)),
            lambda b: float(np.array(b, np.uint16).view(np.float16))),
    "BF16": (np.uint16, 0x7FFF, 0x7F80, int(np.float32(MAX_ABS).view(np.uint32)) >> 16,  # bf16 = top half of f32
             lambda b: float(np.array(b << 16, np.uint32).view(np.float32))),
}


def _scan_safetensors(fobj, size: int) -> tuple[dict, list[str]]:
    """Read a whole safetensors stream of `size` bytes: (name -> {"dtype", "shape"}, problems).

    The format's own rules (safetensors' Rust `validate`): an 8-byte header length, a JSON object, each tensor's
    `data_offsets` inside the data, the ranges contiguous from 0 and covering the data exactly, each range
    dtype size x number of elements long. Then every value: finite, and below MAX_ABS.
    """
    raw = fobj.read(8)
    if len(raw) != 8:
        return {}, [f"{WEIGHTS_NAME} is not a valid safetensors file (shorter than its 8-byte header length)"]
    (n,) = struct.unpack("<Q", raw)
    if n > MAX_HEADER:
        return {}, [f"{WEIGHTS_NAME} is not a valid safetensors file (header length {n:,} is implausible)"]
    if n > size - 8:
        return {}, [f"{WEIGHTS_NAME} is truncated or not safetensors: its header claims {n:,} bytes, the file "
                    f"holds {size:,}"]
    try:
        header = json.loads(fobj.read(n))
        if not isinstance(header, dict):
            raise ValueError("the header is not a JSON object")
        header.pop("__metadata__", None)
        entries = []
        for name, v in header.items():
            dtype, shape, (begin, end) = v["dtype"], [int(x) for x in v["shape"]], v["data_offsets"]
            if dtype not in DTYPE_BYTES or any(x < 0 for x in shape) or not 0 <= int(begin) <= int(end):
                raise ValueError(f"bad entry for {name}: {v}")
            entries.append((int(begin), int(end), name, dtype, tuple(shape)))
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        return {}, [f"{WEIGHTS_NAME} is not a valid safetensors file ({e})"]
    out = {name: {"dtype": dtype, "shape": shape} for _, _, name, dtype, shape in entries}
    p, data = [], size - 8 - n
    entries.sort()
    need = max((e[1] for e in entries), default=0)
    if need > data:
        p.append(f"{WEIGHTS_NAME} is truncated: its header places tensors in {need:,} bytes of data, the file holds "
                 f"{data:,} (e.g. {next(e[2] for e in entries if e[1] > data)} lies past the end)")
    elif need < data:
        p.append(f"{WEIGHTS_NAME} has {data - need:,} bytes after its last tensor that no tensor owns "
                 "(safetensors refuses such a file)")
    pos, layout = 0, []
    for begin, end, name, dtype, shape in entries:
        numel = 1
        for x in shape:
            numel *= x
        if begin != pos:
            layout.append(f"{name} starts at byte {begin:,}, the previous tensor ends at {pos:,}")
        elif end - begin != numel * DTYPE_BYTES[dtype]:
            layout.append(f"{name} ({dtype} {shape}) needs {numel * DTYPE_BYTES[dtype]:,} bytes, its range holds "
                          f"{end - begin:,}")
        pos = max(pos, end)
    if layout:
        p.append(f"{WEIGHTS_NAME}: tensor byte ranges overlap, leave gaps or disagree with dtype x shape: "
                 f"{'; '.join(layout[:4])}{' ...' if len(layout) > 4 else ''}")
    wrong = sorted(f"{name} is {dtype}" for _, _, name, dtype, _ in entries if dtype not in FLOAT_DTYPES)
    if wrong:
        p.append(f"tensors that are not floating point ({', '.join(wrong[:4])}{' ...' if len(wrong) > 4 else ''}): "
                 "LoRA weights are floating point (F32, F16, BF16 or F64)")
    if p:  # the byte ranges cannot be trusted: do not interpret values
        return out, p
    nonfinite, huge = [], []
    for begin, end, name, dtype, shape in entries:
        uint, abs_mask, inf_bits, max_bits, to_float = _FLOAT_BITS[dtype]
        left, bad, top = end - begin, 0, 0
        while left:
            buf = fobj.read(min(left, CHUNK))
            if not buf or len(buf) % DTYPE_BYTES[dtype]:  # a short read: the zip reports the damage
                break
            left -= len(buf)
            bits = np.frombuffer(buf, dtype=uint) & uint(abs_mask)  # |x| as its bits: they order like |x|
            if bits.size and int(bits.max()) > max_bits:  # rare: count what is wrong
                bad += int((bits >= inf_bits).sum())
                top = max(top, int(bits[bits < inf_bits].max(initial=0)))
        if bad:
            nonfinite.append(f"{name} ({bad} of {max(1, (end - begin) // DTYPE_BYTES[dtype])})")
        elif top > max_bits:
            huge.append(f"{name} (|x| up to {to_float(top):.3g})")
    while fobj.read(CHUNK):  # to the end, so the zip's CRC-32 of the member is verified
        pass
    if nonfinite:
        p.append(f"NaN or infinite LoRA weights (vLLM would produce NaN logits): {', '.join(nonfinite[:6])}"
                 f"{' ...' if len(nonfinite) > 6 else ''}")
    if huge:
        p.append(f"LoRA weights far too large for a trained adapter (above {MAX_ABS:g}; the bytes look overwritten): "
                 f"{', '.join(huge[:6])}{' ...' if len(huge) > 6 else ''}")
    return out, p


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


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # owner/name, as the Hub spells repository ids
NEMOTRON_H = "nemotron_h"


def _find_base(adapter_config: dict, base_model) -> tuple[Path | None, list[str], list[str]]:
    """(folder with the base model's config.json or None, problems, warnings); see the module docstring."""
    if base_model is not None:
        p = Path(base_model)
        if not (p / "config.json").is_file():
            return None, [f"{p}: --base-model must be a folder with config.json"], []
        return p, [], []
    name = adapter_config.get("base_model_name_or_path")
    families = "the tensors are checked against the Nemotron-H module families and the rank only"
    if not isinstance(name, str) or not name:
        return None, [], [f"{CONFIG_NAME} names no base_model_name_or_path: {families}"]
    warn = []
    if Path(name).expanduser().is_absolute():
        warn.append(f"{CONFIG_NAME}: base_model_name_or_path is the absolute local path {name} (`pack` writes a "
                    "relative path or Hub id)")
    try:
        found = [Path(name).expanduser(), resolve_path(name)]  # as transformers reads it, then as the lab does
    except LabError:
        found = [Path(name).expanduser()]
    if _HUB_ID.fullmatch(name) and not name.startswith("."):
        try:
            from huggingface_hub import try_to_load_from_cache

            hit = try_to_load_from_cache(name, "config.json")  # the local Hub cache only, never the network
            if isinstance(hit, str):
                found.append(Path(hit).parent)
        except Exception:  # an id the Hub's validator refuses: treated as a name that is not cached
            pass
    for cand in found:
        if (cand / "config.json").is_file():
            return cand, [], warn
    if _HUB_ID.fullmatch(name) and "nemotron" not in name.lower():
        return None, [f"{CONFIG_NAME} names base model {name!r}, which is not Nemotron-H: Kaggle's vLLM loads the "
                      "adapter onto Nemotron-3-Nano-30B-A3B whatever this field says, so an adapter trained on "
                      "another model does not fit it"], warn
    return None, [], warn + [f"base model {name!r} cannot be checked here (not a local folder, not in the local Hub "
                             f"cache): {families}; pass --base-model DIR (a folder with its config.json) to check "
                             "every tensor against it"]


def _base_check(cdir: Path, explicit: bool) -> tuple[dict | None, int | None, list[str], list[str]]:
    """(modules or None, layer count or None, problems, warnings) for a base model folder."""
    try:
        bcfg = json.loads((cdir / "config.json").read_text(encoding="utf-8"))
        model_type = bcfg.get("model_type")
    except (OSError, ValueError, AttributeError) as e:
        return None, None, [f"{cdir}/config.json cannot be read ({e})"], []
    if model_type != NEMOTRON_H:
        return None, None, [f"the base model at {cdir} is {model_type!r}, not Nemotron-H ({NEMOTRON_H!r}): Kaggle "
                            "serves the adapter on Nemotron-3-Nano-30B-A3B"], []
    try:
        n_layers = int(bcfg["num_hidden_layers"])
    except (KeyError, TypeError, ValueError):
        n_layers = None
    try:
        return _base_modules(cdir), n_layers, [], []
    except Exception as e:  # a config this transformers cannot build: the family patterns and layer count remain
        msg = f"{cdir}: cannot build the base model's module list ({type(e).__name__}: {e})"
        return None, n_layers, ([msg] if explicit else []), ([] if explicit else [msg])


# ---- rank helpers ---------------------------------------------------------------------------------

def _pattern(patterns: dict | None, module: str):
    """The value of the first key matching `module` as `(.*\\.)?key$`, else None: PEFT's `get_pattern_key`
    (peft/utils/other.py) and vLLM 0.33's `PEFTHelper._match_pattern` (vllm/lora/peft_helper.py) alike."""
    for key, value in (patterns or {}).items():
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return None


def _rank_for(module: str, config: dict) -> int:
    r = _pattern(config.get("rank_pattern"), module)
    return int(config["r"] if r is None else r)


def _alpha_for(module: str, config: dict) -> float:
    a = _pattern(config.get("alpha_pattern"), module)
    return float(config["lora_alpha"] if a is None else a)


def _targets(module: str, targets) -> bool:
    """PEFT's `check_target_module_exists`: a string is a full regex match ("all-linear": every linear layer but
    the output layer), a list entry is the module name or a dotted suffix of it."""
    if isinstance(targets, str):
        if targets == "all-linear":
            return module.rpartition(".")[2] != "lm_head"
        return re.fullmatch(targets, module) is not None
    return any(module == t or module.endswith("." + t) for t in targets or [])


def _strip(name: str) -> str:
    return name[len("base_model.model."):] if name.startswith("base_model.model.") else name


# ---- the expert conversion --------------------------------------------------------------------------

def split_fused_experts(tensors: dict, config: dict, num_experts: int | None = None) -> tuple[dict, list]:
    """Rewrite PEFT `target_parameters` expert keys into the per-expert keys vLLM reads for Nemotron-H.

    `...experts{.base_layer*k}.lora_A.weight` (r*E, in) / `.lora_B.weight` (out, r*E) become
    `...experts.{e}.<param>.lora_A.weight` = A[e*r:(e+1)*r] (r, in) and
    `...experts.{e}.<param>.lora_B.weight` = B[:, e::E] (out, r), where <param> is the targeted
    parameter: PEFT nests the wrappers in NemotronHExperts' parameter order (up_proj, down_proj),
    so the innermost (most `.base_layer`s) is the first targeted one. Then
    delta_e = (alpha/r) * B_e @ A_e, exactly PEFT's `ParamWrapper.get_delta_weight` for expert e.
    Returns (new tensors, the (fused key prefix, parameter) pairs converted). See the module docstring for the
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
        r = _rank_for(_strip(prefix) + "." + param, config)
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
    """After the split, give each per-expert module the rank and alpha PEFT gave its fused parameter.

    PEFT matches rank_pattern/alpha_pattern against `...experts.up_proj`; vLLM 0.33 matches them against the
    names in the file (`...experts.3.up_proj`; `LoRAModel.from_lora_tensors`, vllm/lora/lora_model.py), so a
    key such as `layers.1.mixer.experts.up_proj` would no longer apply. Where the two differ, one escaped key per
    (layer, parameter) is put first (the first match wins in both).
    """
    orig = {"r": config["r"], "lora_alpha": config["lora_alpha"],
            "rank_pattern": dict(config.get("rank_pattern") or {}),
            "alpha_pattern": dict(config.get("alpha_pattern") or {})}
    for prefix, param in split:
        fused, one = f"{_strip(prefix)}.{param}", f"{_strip(prefix)}.0.{param}"
        want = (_rank_for(fused, orig), _alpha_for(fused, orig))
        if (_rank_for(one, config), _alpha_for(one, config)) != want:
            key = re.escape(_strip(prefix)) + r"\.\d+\." + param
            config["rank_pattern"] = {key: want[0], **(config.get("rank_pattern") or {})}
            config["alpha_pattern"] = {key: want[1], **(config.get("alpha_pattern") or {})}


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
    max_rank = competition().max_lora_rank
    if int(config.get("r", 0)) > max_rank:
        bad.append(f"r={config['r']} > {max_rank}")
    for k, v in (config.get("rank_pattern") or {}).items():
        if int(v) > max_rank:
            bad.append(f"rank_pattern[{k!r}]={v} > {max_rank}")
    if config.get("modules_to_save"):
        bad.append(f"modules_to_save={config['modules_to_save']} (vLLM loads LoRA weights only)")
    if config.get("lora_bias") or config.get("bias", "none") != "none":
        bad.append("LoRA/bias training (bias or lora_bias set): vLLM loads no biases")
    if bad:
        raise LabError(f"{where}: cannot be submitted: {'; '.join(bad)}")


def _portable_name(name):
    """base_model_name_or_path without this machine's absolute path: relative to the project root (how the lab's
    configs name paths, `lab.paths.resolve_path`); a Hub id or a relative name is kept."""
    if not isinstance(name, str) or not Path(name).expanduser().is_absolute():
        return name
    return os.path.relpath(Path(name).expanduser(), project_root())


def pack(adapter_dir: str | os.PathLike, out_zip: str | os.PathLike, dtype: str | None = None,
         base_model: str | os.PathLike | None = None, base_model_name: str | None = None) -> Path:
    """Write `out_zip` (adapter_config.json + adapter_model.safetensors at its root) atomically; returns its path.

    `base_model_name` (e.g. the Hub id) replaces the adapter's base_model_name_or_path; without it an absolute
    local path is made relative to the project root. The zip is written by `lab.io.atomic_file`, so it gets the
    permissions of any file the user creates (0666 less the umask), not mkstemp's 0600.
    """
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
        if not isinstance(config, dict):
            raise ValueError("not a JSON object")
    except (ValueError, UnicodeDecodeError) as e:
        raise LabError(f"{cfg_path}: not valid JSON ({e})") from None
    if config.get("peft_type", "LORA") != "LORA":
        raise LabError(f"{cfg_path}: peft_type={config.get('peft_type')!r}, not a LoRA adapter")
    _refuse(config, str(cfg_path))
    dropped = sorted(set(config) - LORA_CONFIG_FIELDS)
    if dropped:
        print(f"dropping fields that are not standard PEFT LoraConfig fields: {', '.join(dropped)}")
    config = clean_config(config)
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
        dt = getattr(torch, dtype)
        tensors = {k: v.to(dt) for k, v in tensors.items()}

    with atomic_file(out_zip) as tmp:  # replaces out_zip only once the packed zip passes the check
        with zipfile.ZipFile(tmp, "w") as zf:
            # top-level keys sorted; rank_pattern/alpha_pattern keep their order (the first matching key wins)
            zf.writestr(CONFIG_NAME, json.dumps(dict(sorted(config.items())), indent=2) + "\n",
                        compress_type=zipfile.ZIP_DEFLATED)
            zf.writestr(WEIGHTS_NAME, save({k: v.contiguous() for k, v in sorted(tensors.items())},
                                           metadata={"format": "pt"}), compress_type=zipfile.ZIP_STORED)
        problems = _check(tmp, base_model, label=str(out_zip))
        if problems:
            raise LabError(f"{adapter_dir}: cannot be packed into {out_zip}; the packed adapter has these "
                           "problems:\n  - " + "\n  - ".join(problems))
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
    max_rank = competition().max_lora_rank
    if r > max_rank:
        p.append(f"LoRA rank r={r} is above {max_rank}, the max_lora_rank Kaggle's vLLM loads")
    elif "r" in config and r < 1:
        p.append(f"LoRA rank r={config.get('r')!r} must be a positive integer")
    # vLLM 0.33 applies both per module (PEFTHelper.get_rank_and_scaling, vllm/lora/peft_helper.py) and refuses
    # an adapter whose largest rank, r or any rank_pattern value, is above max_lora_rank (validate_legal)
    for k, v in (config.get("rank_pattern") or {}).items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            p.append(f"rank_pattern gives {v!r} to {k!r}, not a positive integer rank")
        elif v > max_rank:
            p.append(f"rank_pattern gives rank {v} to {k!r}, above {max_rank}, the max_lora_rank Kaggle's vLLM loads")
    for k, v in (config.get("alpha_pattern") or {}).items():
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0:
            p.append(f"alpha_pattern gives {v!r} to {k!r}, not a positive number")
    for field in ("rank_pattern", "alpha_pattern"):
        if not isinstance(config.get(field) or {}, dict):
            p.append(f"{CONFIG_NAME}: {field} must be an object (module pattern -> value)")
            continue
        for k in config.get(field) or {}:
            try:
                re.compile(k)
            except re.error as e:
                p.append(f"{field} key {k!r} is not a valid regular expression ({e})")
    if "lora_alpha" in config and (not isinstance(config["lora_alpha"], (int, float))
                                   or isinstance(config["lora_alpha"], bool)):
        p.append(f"{CONFIG_NAME}: lora_alpha={config['lora_alpha']!r} is not a number")
    tm = config.get("target_modules")
    if "target_modules" in config and not (isinstance(tm, str) or (isinstance(tm, list)
                                                                   and all(isinstance(t, str) for t in tm))):
        p.append(f"{CONFIG_NAME}: target_modules={tm!r} is neither a list of module names nor a regex string")
    init = config.get("init_lora_weights", True)
    if isinstance(init, str) and init.lower() not in ("gaussian", "eva", "orthogonal", "mica", "lora_ga"):
        p.append(f"init_lora_weights={init!r}: vLLM 0.33 refuses inits that modify the base weights "
                 "(PiSSA, OLoRA, CorDA, LoftQ)")
    for field, what in (("alora_invocation_tokens", "Activated LoRA"), ("use_bdlora", "block-diagonal LoRA"),
                        ("use_qalora", "QALoRA")):
        if config.get(field):
            p.append(f"{field} is set: vLLM 0.33 does not support {what}")
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
        if name in fused or name.endswith(BASE_COPIES):
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
        except (KeyError, TypeError, ValueError, re.error):
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
    ranks: dict[str, set] = {}
    for module, ab in pairs.items():
        ex = re.match(r"^(?P<experts>.+\.experts)\.(?P<e>\d+)\.(?P<param>up_proj|down_proj)$", module)
        if ex:
            experts.setdefault(ex["experts"], set()).add((int(ex["e"]), ex["param"]))
            if "lora_A" in ab and len(ab["lora_A"]) == 2:
                ranks.setdefault(f"{ex['experts']}.{ex['param']}", set()).add(ab["lora_A"][0])
    for proj, rs in sorted(ranks.items()):
        if len(rs) > 1:  # vllm/lora/lora_weights.py, PackedLoRALayerWeights.pack_moe raises on this
            p.append(f"{proj}: the routed experts have different LoRA ranks {sorted(rs)}; vLLM packs the experts of "
                     "one projection into one tensor and refuses that")
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


def _check_agreement(header: dict, config: dict) -> list[str]:
    """The config describes the tensors: every LoRA module is named by target_modules (or, for routed experts,
    target_parameters), and every name there has tensors (PEFT trains a config naming an absent module without a
    word; vLLM loads whatever the tensors say, so the config would be lying)."""
    tm, tp = config.get("target_modules"), config.get("target_parameters") or []
    if not (isinstance(tm, str) or isinstance(tm, list)) or not isinstance(tp, list):
        return []  # reported by _check_config
    mods = {_strip(m["module"]) for n in header if not _FUSED.match(n) and (m := _LORA_KEY.match(n))}
    has_fused = any(_FUSED.match(n) for n in header)

    def fused_name(m: str) -> str:  # ...experts.3.up_proj -> ...experts.up_proj, what target_parameters match
        return re.sub(r"\.experts\.\d+\.", ".experts.", m)

    try:
        uncovered = sorted(m for m in mods if not _targets(m, tm)
                           and not (".experts." in m and _targets(fused_name(m), tp)))
        named = [tm] if isinstance(tm, str) else tm
        absent = [f"{t!r} (target_modules)" for t in named if t != "all-linear"
                  and not any(_targets(m, t if isinstance(tm, str) else [t]) for m in mods)]
    except re.error as e:
        return [f"{CONFIG_NAME}: target_modules {tm!r} is not a valid regular expression ({e})"]
    absent += [f"{t!r} (target_parameters)" for t in tp if not has_fused
               and not any(_targets(fused_name(m), [t]) for m in mods if ".experts." in m)]
    p = []
    if uncovered:
        p.append(f"{CONFIG_NAME} does not describe the tensors: {len(uncovered)} LoRA modules are not named by "
                 f"target_modules{'/target_parameters' if tp else ''} ({tm!r}): {', '.join(uncovered[:4])}"
                 f"{' ...' if len(uncovered) > 4 else ''}")
    if absent:
        p.append(f"{CONFIG_NAME} names targets that have no tensors in the adapter: {', '.join(absent[:6])}"
                 f"{' ...' if len(absent) > 6 else ''} (a config edited by hand, or a module this model lacks)")
    return p


class Report(list):
    """`check`'s answer: a list of problems (empty = valid) with `.warnings`, what could not be verified."""

    def __init__(self, problems=(), warnings=()):
        super().__init__(problems)
        self.warnings = list(warnings)


def check(path_to_zip: str | os.PathLike, base_model: str | os.PathLike | None = None) -> Report:
    """Every problem with a submission zip, in plain words; an empty list means it is valid.

    What could not be verified is printed to stderr as a warning and kept in the result's `.warnings`.
    """
    return _check(Path(path_to_zip), base_model)


def _check(path: Path, base_model, label: str | None = None) -> Report:
    label = label or str(path)
    if not path.is_file():
        return Report([f"{path}: file not found"])
    if not zipfile.is_zipfile(path):
        return Report([f"{path}: not a zip file"])
    problems: list[str] = []
    warnings: list[str] = []
    config = header = None
    try:
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
            names = [i.filename for i in infos]
            nested = [n for n in names if n.lower().endswith(".zip")]
            if nested:
                problems.append(f"nested zip inside the zip: {', '.join(nested)} (put the adapter files themselves "
                                "at the zip's root)")
            dups = sorted({n for n in names if names.count(n) > 1})
            if dups:
                problems.append(f"the zip holds {', '.join(dups)} more than once (which copy an unzip keeps "
                                "is up to the tool)")
            sub = [n for n in names if "/" in n.rstrip("/") or n.endswith("/") or "\\" in n]
            if sub:
                problems.append(f"files in a subfolder: {', '.join(sub[:6])} (Kaggle expects {CONFIG_NAME} and "
                                f"{WEIGHTS_NAME} at the zip's root, no folders)")
            total, packed = sum(i.file_size for i in infos), sum(i.compress_size for i in infos)
            if total > MAX_UNCOMPRESSED or (total > RATIO_FROM and total > MAX_RATIO * max(packed, 1)):
                return Report(problems + [f"{path}: would inflate {packed:,} bytes to {total:,} (ratio "
                                          f"{total / max(packed, 1):.0f}:1, limits {MAX_UNCOMPRESSED:,} bytes and "
                                          f"{MAX_RATIO}:1): a zip bomb or not an adapter; not unpacked"])
            if CONFIG_NAME not in names:
                problems.append(f"missing {CONFIG_NAME} at the zip's root")
            elif zf.getinfo(CONFIG_NAME).file_size > MAX_CONFIG:
                problems.append(f"{CONFIG_NAME} is {zf.getinfo(CONFIG_NAME).file_size:,} bytes, not an adapter config")
            else:
                try:
                    config = json.loads(zf.read(CONFIG_NAME).decode("utf-8"))
                    if not isinstance(config, dict):
                        raise ValueError("not a JSON object")
                except (ValueError, UnicodeDecodeError) as e:
                    problems.append(f"{CONFIG_NAME} is not valid JSON ({e})")
                    config = None
            if WEIGHTS_NAME not in names:
                bin_hint = " (adapter_model.bin is not accepted: save with safetensors)" if "adapter_model.bin" in names else ""
                problems.append(f"missing {WEIGHTS_NAME} at the zip's root{bin_hint}")
            else:
                with zf.open(WEIGHTS_NAME) as f:
                    header, found = _scan_safetensors(f, zf.getinfo(WEIGHTS_NAME).file_size)
                problems += found
    except (zipfile.BadZipFile, EOFError, OSError, zlib.error) as e:  # e.g. "Bad CRC-32": bytes changed in the zip
        problems.append(f"{path}: damaged zip, its bytes do not read back as written ({type(e).__name__}: {e})")
    except (RuntimeError, NotImplementedError) as e:  # encrypted members, compression methods zipfile lacks
        problems.append(f"{path}: a member cannot be read ({e}); write the zip without a password, stored or deflated")
    if config is not None:
        problems += _check_config(config)
    if config is not None and header is not None:
        cdir, p, w = _find_base(config, base_model)
        modules = n_layers = None
        if cdir is not None:
            modules, n_layers, p2, w2 = _base_check(cdir, explicit=base_model is not None)
            p, w = p + p2, w + w2
        problems += p
        warnings += w
        problems += _check_tensors(header, config, modules, n_layers)
        problems += _check_agreement(header, config)
        copies = sorted(k for k in header if k.endswith(BASE_COPIES))
        if copies:
            warnings.append(f"full base-weight copies that vLLM skips (a changed lm_head/embedding would not be "
                            f"served; `pack` drops them): {', '.join(copies)}")
    for w in warnings:
        print(f"warning: {label}: {w}", file=sys.stderr)
    return Report(problems, warnings)


# ---- CLI ------------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.submission", description="pack or check a Kaggle submission.zip")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack", help="ADAPTER_DIR -> OUT.zip (adapter_config.json + adapter_model.safetensors)")
    p.add_argument("adapter_dir")
    p.add_argument("out_zip")
    p.add_argument("--dtype", default=SUBMISSION_DTYPE,
                   help="cast the LoRA tensors to this torch dtype (default %(default)s, what vLLM computes in); "
                        "'keep': as the adapter saved them")
    p.add_argument("--base-model", default=None, help="folder with the base model's config.json")
    p.add_argument("--base-model-name", default=None,
                   help="base_model_name_or_path to write, e.g. the Hub id (default: the adapter's, made relative)")
    c = sub.add_parser("check", help="list every problem with ZIP; exit 0 only when valid")
    c.add_argument("zip")
    c.add_argument("--base-model", default=None, help="folder with the base model's config.json")
    g = sub.add_parser("gate", help="serve ZIP with vLLM as the scorer does: accuracy with and without it, and "
                                    "whether each LoRA family reaches the output (lab/gate.py); exit 0 on PASS")
    g.add_argument("zip")
    g.add_argument("--model", required=True, help="the base model folder vLLM loads")
    g.add_argument("--n", type=int, default=64, help="puzzles to generate for")
    g.add_argument("--data", default=None, help="CSV of puzzles (id, prompt, answer); default: generated ones")
    g.add_argument("--json", default=None, help="also write the report to this JSON file")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "gate":  # lab.gate sits above lab.generate, which packs with this module: reached by name,
            import importlib    # as lab/__main__.py reaches every command, so the library imports keep no cycle

            return importlib.import_module("lab.gate").main(args)
        if args.cmd == "pack":
            out = pack(args.adapter_dir, args.out_zip, dtype=None if args.dtype == "keep" else args.dtype,
                       base_model=args.base_model,
                       base_model_name=args.base_model_name)
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
    n = len(problems.warnings)
    print(f"{args.zip}: valid" + (f" ({n} warning(s) above: not everything could be checked)" if n else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
