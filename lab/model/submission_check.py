"""Checking a Kaggle `submission.zip` (a LoRA adapter for vLLM 0.33): `check(zip, base_model=None)` returns every
problem in plain words (an empty list = valid); `lab.model.submission.pack` runs it on every zip it writes.

In order: the zip's layout (`layout_problems`: the two files and nothing else, no zip bomb, every CRC); the
safetensors file (safetensors' own reader, then every value finite and below 1e4 in magnitude); the config
(`config_problems`: what vLLM's PEFTHelper requires or refuses, every rank within `max_lora_rank`); the config
against the tensors; the tensors against the base model's modules (built on the meta device when its config is at
hand, else the Nemotron-H families). A base model known not to be Nemotron-H is a problem; one that cannot be
checked here is a warning (`.warnings`; vLLM never reads the field). Each check in detail: docs/internals.md,
lab.model.submission_check.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import shutil
import stat
import sys
import tempfile
import zipfile
import zlib
from pathlib import Path

from lab import LabError
from lab.model import lora
from lab.core.paths import resolve_path
from lab.core.schema import rank_problem

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
REQUIRED_FIELDS = ("r", "lora_alpha", "target_modules")  # what vLLM's PEFTHelper requires
# Nemotron-H module names a LoRA tensor may target (after `base_model.model.`; `backbone.` is the original
# checkpoint's prefix, which vLLM maps to `model.`): one pattern per row of lab.model.lora's family table.
_LAYER = r"(?:model|backbone)\.layers\.(?P<layer>\d+)\.mixer\."
_FAMILY_PATTERNS = [(f.group, re.compile(("" if f.group == "head" else _LAYER) + f"(?P<mod>{f.packed})$"))
                    for f in lora.TABLE]
_FUSED = re.compile(r"^(?P<prefix>.*\.experts)(?P<nest>(?:\.base_layer)*)\.(?P<ab>lora_A|lora_B)\.weight$")
_LORA_KEY = re.compile(r"^(?P<module>.+)\.(?P<ab>lora_A|lora_B)\.weight$")
_EXPERT = re.compile(r"^(?P<experts>.+\.experts)\.(?P<e>\d+)\.(?P<param>\w+)$")  # one routed expert's projection
EXPERT_PARAMS = ("up_proj", "down_proj")  # NemotronHExperts' parameters in registration order (= PEFT nesting)
# full weight copies PEFT saves when lm_head / embed_tokens are targeted; vLLM 0.33 skips exactly these
# (`is_base_embedding_weights`, vllm/lora/utils.py)
BASE_COPIES = (".lm_head.base_layer.weight", ".embed_tokens.base_layer.weight")

FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")  # safetensors' names of the dtypes a LoRA weight may have
MAX_ABS = 1e4          # no trained LoRA weight comes near this; random bytes read as floats mostly do
MAX_UNCOMPRESSED = 16 << 30  # a rank-32 LoRA on every family of the 30B model is a few GB even in float32
MAX_RATIO, RATIO_FROM = 100, 64 << 20  # zip bomb: > 100:1 overall once more than 64 MiB would be inflated
MAX_CONFIG = 1 << 20


def _listed(items: list, n: int = 6) -> str:
    """The first `n` of `items` joined by commas, with ' ...' when there are more."""
    return ", ".join(items[:n]) + (" ..." if len(items) > n else "")


@functools.cache
def lora_config_fields() -> frozenset[str]:
    """The fields of the installed `peft.LoraConfig` (PeftConfig's included): anything else in adapter_config.json
    came from another back-end (Unsloth's, say)."""
    from peft import LoraConfig

    return frozenset(f.name for f in dataclasses.fields(LoraConfig))


def read_weights(path: Path) -> tuple[dict | None, list[str]]:
    """A safetensors file read whole, one tensor at a time: (name -> {"dtype", "shape"}, problems); None instead of
    the names when `safe_open` refuses a file whose header and data disagree (safetensors' Rust `validate`). Every
    value must be finite and below MAX_ABS."""
    import torch
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            header = {n: {"dtype": f.get_slice(n).get_dtype(), "shape": tuple(f.get_slice(n).get_shape())}
                      for n in f.keys()}
            wrong = sorted(f"{n} is {h['dtype']}" for n, h in header.items() if h["dtype"] not in FLOAT_DTYPES)
            if wrong:
                return header, [f"tensors that are not floating point ({_listed(wrong, 4)}): LoRA weights are "
                                 "floating point (F32, F16, BF16 or F64)"]
            nonfinite, huge = [], []
            for n in header:
                t = f.get_tensor(n)
                if bad := int((~torch.isfinite(t)).sum()):
                    nonfinite.append(f"{n} ({bad} of {t.numel()})")
                elif t.numel() and (top := float(t.abs().max())) > MAX_ABS:
                    huge.append(f"{n} (|x| up to {top:.3g})")
    except SafetensorError as e:
        return None, [f"{WEIGHTS_NAME} is not a valid safetensors file: truncated, with bytes no tensor owns, or with "
                    f"a header that disagrees with its data ({e})"]
    p = []
    if nonfinite:
        p.append(f"NaN or infinite LoRA weights (vLLM would produce NaN logits): {_listed(nonfinite)}")
    if huge:
        p.append(f"LoRA weights far too large for a trained adapter (above {MAX_ABS:g}; the bytes look overwritten): "
                 f"{_listed(huge)}")
    return header, p

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


def _base_check(adapter_config: dict, base_model) -> tuple[dict | None, int | None, list[str], list[str]]:
    """(the base model's modules or None, its layer count or None, problems, warnings) for the base model
    `_find_base` finds."""
    cdir, problems, warnings = _find_base(adapter_config, base_model)
    if cdir is None:
        return None, None, problems, warnings
    try:
        bcfg = json.loads((cdir / "config.json").read_text(encoding="utf-8"))
        model_type = bcfg.get("model_type")
    except (OSError, ValueError, AttributeError) as e:
        return None, None, [f"{cdir}/config.json cannot be read ({e})"], warnings
    if model_type != NEMOTRON_H:
        return None, None, [f"the base model at {cdir} is {model_type!r}, not Nemotron-H ({NEMOTRON_H!r}): Kaggle "
                            "serves the adapter on Nemotron-3-Nano-30B-A3B"], warnings
    try:
        n_layers = int(bcfg["num_hidden_layers"])
    except (KeyError, TypeError, ValueError):
        n_layers = None
    try:
        return _base_modules(cdir), n_layers, [], warnings
    except Exception as e:  # a config this transformers cannot build: the family patterns and layer count remain
        msg = [f"{cdir}: cannot build the base model's module list ({type(e).__name__}: {e})"]
        return (None, n_layers, msg, warnings) if base_model is not None else (None, n_layers, [], warnings + msg)

# ---- rank helpers ---------------------------------------------------------------------------------

def _pattern(patterns: dict | None, module: str):
    """The value of the first key of `patterns` matching `module` (PEFT's `get_pattern_key`, peft/utils/other.py,
    which vLLM 0.33's `PEFTHelper._match_pattern` copies), else None."""
    from peft.utils.other import get_pattern_key

    return (patterns or {}).get(get_pattern_key(list(patterns or {}), module))


def rank_for(module: str, config: dict) -> int:
    r = _pattern(config.get("rank_pattern"), module)
    return int(config["r"] if r is None else r)


def alpha_for(module: str, config: dict) -> float:
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

# ---- check ---------------------------------------------------------------------------------------------

def config_problems(config: dict) -> list[str]:
    """Every problem of an adapter_config.json for vLLM 0.33 (`PEFTHelper`, vllm/lora/peft_helper.py): the one
    validator of a submission's config, run by `check` on a zip and by `pack` before it converts an adapter."""
    p = []
    missing = [f for f in REQUIRED_FIELDS if f not in config]
    if missing:
        p.append(f"{CONFIG_NAME} lacks {', '.join(missing)} (vLLM requires r, lora_alpha and target_modules)")
    if config.get("peft_type", "LORA") != "LORA":
        p.append(f"{CONFIG_NAME}: peft_type is {config.get('peft_type')!r}; only LORA adapters can be submitted")
    unknown = sorted(set(config) - lora_config_fields())
    if unknown:
        p.append(f"{CONFIG_NAME} has unknown back-end fields that are not standard PEFT LoraConfig fields: "
                 f"{', '.join(unknown)} (run `python -m lab pack` to drop them)")
    patterns = {f: config.get(f) or {} for f in ("rank_pattern", "alpha_pattern")}
    for field, value in patterns.items():
        if not isinstance(value, dict):
            p.append(f"{CONFIG_NAME}: {field} must be an object (module pattern -> value)")
            patterns[field] = {}
        for k in patterns[field]:
            try:
                re.compile(k)
            except re.error as e:
                p.append(f"{field} key {k!r} is not a valid regular expression ({e})")
    # vLLM 0.33 applies r and rank_pattern per module (PEFTHelper.get_rank_and_scaling) and refuses an adapter whose
    # largest rank is above max_lora_rank (validate_legal): each is checked as the config's sft.lora.r is
    ranks = ([("r", config["r"])] if "r" in config else []) + [(f"rank_pattern[{k!r}]", v)
                                                                for k, v in patterns["rank_pattern"].items()]
    p += [f"{CONFIG_NAME}: {why}" for key, v in ranks if (why := rank_problem(key, v))]
    for k, v in patterns["alpha_pattern"].items():
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0:
            p.append(f"alpha_pattern gives {v!r} to {k!r}, not a positive number")
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


def _base_dims(modules: dict, name: str) -> tuple[int, int] | None:
    """(in_features, out_features) of the base model's linear layer `name` or routed expert projection
    (`...experts.3.up_proj`), or None when the base model has no such module."""
    ex = _EXPERT.match(name)
    if ex and modules.get(ex["experts"], (None,))[0] == "experts":
        shape = modules[ex["experts"]][1].get(ex["param"])  # (E, out, in)
        return None if shape is None or int(ex["e"]) >= shape[0] else (shape[2], shape[1])
    kind = modules.get(name, (None,))
    return (kind[1], kind[2]) if kind[0] == "linear" else None


def _check_tensors(header: dict, config: dict, modules: dict | None, n_layers: int | None = None) -> list[str]:
    p = []
    fused = sorted(k for k in header if _FUSED.match(k))
    if fused:
        p.append(f"vLLM cannot load fused expert LoRA keys (PEFT target_parameters layout) for Nemotron-H: "
                 f"{_listed(fused, 4)}; run `python -m lab pack` "
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
        module, ab, shape = _strip(m["module"]), m["ab"], info["shape"]
        pairs.setdefault(module, {})[ab] = shape
        try:
            r = rank_for(module, config)
        except (KeyError, TypeError, ValueError, re.error):
            r = None
        if len(shape) != 2:
            bad_shape.append(f"{name} has shape {shape}, LoRA weights are 2-D")
            continue
        if r is not None and (shape[0] if ab == "lora_A" else shape[1]) != r:
            want = "(r, in_features)" if ab == "lora_A" else "(out_features, r)"
            bad_shape.append(f"{name} has shape {shape} but the rank is {r} ({ab} must be {want})")
        # does it target a module of the base model?
        vmod = re.sub(r"^backbone\.", "model.", module)
        if modules is not None:
            dims = _base_dims(modules, vmod)
            if dims is None:
                unmatched.append(name)
                continue
            want = (r, dims[0]) if ab == "lora_A" else (dims[1], r)
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
        if set(ab) != {"lora_A", "lora_B"}:
            unpaired.append(f"{module} has only {', '.join(sorted(ab))}")
        elif len(ab["lora_A"]) == len(ab["lora_B"]) == 2 and ab["lora_A"][0] != ab["lora_B"][1]:  # else reported above
            bad_shape.append(f"{module}: lora_A {ab['lora_A']} and lora_B {ab['lora_B']} disagree on the rank")
        if (ex := _EXPERT.match(module)) and ex["param"] in EXPERT_PARAMS:
            experts.setdefault(ex["experts"], set()).add((int(ex["e"]), ex["param"]))
            if "lora_A" in ab and len(ab["lora_A"]) == 2:
                ranks.setdefault(f"{ex['experts']}.{ex['param']}", set()).add(ab["lora_A"][0])
    for proj, rs in sorted(ranks.items()):
        if len(rs) > 1:  # vllm/lora/lora_weights.py, PackedLoRALayerWeights.pack_moe raises on this
            p.append(f"{proj}: the routed experts have different LoRA ranks {sorted(rs)}; vLLM packs the experts of "
                     "one projection into one tensor and refuses that")
    for prefix, have in sorted(experts.items()):
        kind = (modules or {}).get(re.sub(r"^backbone\.", "model.", prefix), (None,))
        n = (kind[0] == "experts" and next(iter(kind[1].values()))[0]) or max(e for e, _ in have) + 1
        lack = sorted({(e, q) for e in range(n) for q in EXPERT_PARAMS} - have)
        if lack:
            p.append(f"{prefix}: vLLM needs a LoRA on both up_proj and down_proj of every one of the {n} routed "
                     f"experts (its pack_moe asserts it); missing {len(lack)}: "
                     f"{_listed([f'{e}.{q}' for e, q in lack], 4)}")
    if not_lora:
        p.append(f"tensors that are not LoRA weights named <module>.lora_A.weight / <module>.lora_B.weight (the "
                 f"only form vLLM parses): {_listed(not_lora)}")
    if unmatched:
        where = "the base model" if modules is not None else "the known Nemotron-H module families"
        p.append(f"tensor names that match no module of {where} ({len(unmatched)}): {_listed(unmatched)}")
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
    if not isinstance(tm, (str, list)) or not isinstance(tp, list):
        return []  # reported by config_problems
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
                 f"target_modules{'/target_parameters' if tp else ''} ({tm!r}): {_listed(uncovered, 4)}")
    if absent:
        p.append(f"{CONFIG_NAME} names targets that have no tensors in the adapter: {_listed(absent)} (a config "
                 "edited by hand, or a module this model lacks)")
    return p


def layout_problems(infos: list[zipfile.ZipInfo]) -> list[str]:
    """The documented layout: the zip holds exactly `CONFIG_NAME` and `WEIGHTS_NAME`, named exactly, as files, not
    symbolic links (a member's Unix mode is the top 16 bits of `external_attr`). A stray file, a name differing
    only in case or a link member is a problem; folders and nested zips are reported by `check`."""
    out = []
    allowed = (CONFIG_NAME, WEIGHTS_NAME)
    other = [i.filename for i in infos if i.filename not in allowed and "/" not in i.filename
             and "\\" not in i.filename and not i.filename.lower().endswith(".zip")]
    if other:
        near = [n for n in other if n.lower() in allowed]
        out.append(f"other members beside {CONFIG_NAME} and {WEIGHTS_NAME}: {_listed(other)}"
                   + (f" ({', '.join(near)}: names are exact, case included)" if near else "")
                   + "; the zip must hold exactly those two files")
    links = [i.filename for i in infos if stat.S_ISLNK(i.external_attr >> 16)]
    if links:
        out.append(f"symbolic-link member(s) {_listed(links)}: an unzip would create links, not files")
    return out


class Report(list):
    """`check`'s answer: a list of problems (empty = valid) with `.warnings`, what could not be verified."""

    def __init__(self, problems=(), warnings=()):
        super().__init__(problems)
        self.warnings = list(warnings)


def check(path_to_zip: str | os.PathLike, base_model: str | os.PathLike | None = None, label: str | None = None
          ) -> Report:
    """Every problem with a submission zip, in plain words; an empty list means it is valid.

    What could not be verified is printed to stderr as a warning (`label`: the zip's name there, default its path)
    and kept in the result's `.warnings`.
    """
    path = Path(path_to_zip)
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
            sub = [n for n in names if "/" in n or "\\" in n]
            if sub:
                problems.append(f"files in a subfolder: {', '.join(sub[:6])} (Kaggle expects {CONFIG_NAME} and "
                                f"{WEIGHTS_NAME} at the zip's root, no folders)")
            problems += layout_problems(infos)
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
                bin_hint = (" (adapter_model.bin is not accepted: save with safetensors)"
                            if "adapter_model.bin" in names else "")
                problems.append(f"missing {WEIGHTS_NAME} at the zip's root{bin_hint}")
            else:
                with tempfile.TemporaryDirectory() as tmp:  # read to the end: the zip checks the member's CRC-32
                    with zf.open(WEIGHTS_NAME) as f, open(Path(tmp) / WEIGHTS_NAME, "wb") as out:
                        shutil.copyfileobj(f, out, 64 << 20)
                    header, found = read_weights(Path(tmp) / WEIGHTS_NAME)
                problems += found
    except (zipfile.BadZipFile, EOFError, OSError, zlib.error) as e:  # e.g. "Bad CRC-32": bytes changed in the zip
        problems.append(f"{path}: damaged zip, its bytes do not read back as written ({type(e).__name__}: {e})")
    except (RuntimeError, NotImplementedError) as e:  # encrypted members, compression methods zipfile lacks
        problems.append(f"{path}: a member cannot be read ({e}); write the zip without a password, stored or deflated")
    if config is not None:
        problems += config_problems(config)
    if config is not None and header is not None:
        modules, n_layers, p, w = _base_check(config, base_model)
        problems += p + _check_tensors(header, config, modules, n_layers) + _check_agreement(header, config)
        warnings += w
        copies = sorted(k for k in header if k.endswith(BASE_COPIES))
        if copies:
            warnings.append(f"full base-weight copies that vLLM skips (a changed lm_head/embedding would not be "
                            f"served; `pack` drops them): {', '.join(copies)}")
    for w in warnings:
        print(f"warning: {label}: {w}", file=sys.stderr)
    return Report(problems, warnings)
