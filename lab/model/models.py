"""Loading the base model and tokenizer, or building the tiny embedded one; attaching adapters.

`model=tiny` builds a randomly initialised `NemotronHForCausalLM` with the real model's module names and a small
byte-level BPE tokenizer trained locally on a fixed text, whose chat template (`CHAT_TEMPLATE`) renders the real
template's bytes. Both are saved once to `model.path` and reloaded from there, so every stage of a run uses the same
weights. Nothing is downloaded.
`model=nemotron_nano` loads the real checkpoint through transformers' own Nemotron-H implementation (no remote code
unless configured), from a local folder, the Kaggle model mount or the Hub cache, straight onto its device.
`check_mamba_kernels(cfg)` refuses real-model training without the fused Mamba kernels (`mamba_ssm`,
`causal_conv1d`; built by scripts/build_mamba_wheels.sh). More: docs/internals.md, lab.model.models.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from lab import LabError
from lab.core import owner
from lab.core.io import atomic_dir, check_replaceable
from lab.core.lineage import diff
from lab.core.paths import check_model_path, kaggle_model_dir, resolve_path

SPECIAL_TOKENS = ["<pad>", "<s>", "<|im_end|>", "<|im_start|>", "<unk>"]  # ids 0..4: pad, bos, eos, ...
THINK_TOKENS = ["<think>", "</think>"]  # ordinary added tokens: they stay visible in decoded text

# The tiny tokenizer's chat template: the lab's own, written to render the same bytes as Nemotron-3-Nano's
# template for every conversation without tools: a system turn always comes first (empty unless the first
# message is a system message); an assistant turn gets `<think></think>` when it has no think tags, is trimmed,
# and, when a later user turn follows it and `truncate_history_thinking` (default true) holds, keeps only what
# follows its last `</think>`; the generation prompt opens `<think>\n` (`<think></think>` with thinking off).
# The prompt tests render it against the real template, when present, for each of these cases.
CHAT_TEMPLATE = r"""
{%- set enable_thinking = enable_thinking if enable_thinking is defined else true -%}
{%- set truncate_history_thinking = truncate_history_thinking if truncate_history_thinking is defined else true -%}
{%- if messages and messages[0]['role'] == 'system' -%}
  {%- set system_text = messages[0]['content'] -%}
  {%- set turns = messages[1:] -%}
{%- else -%}
  {%- set system_text = '' -%}
  {%- set turns = messages -%}
{%- endif -%}
{%- set ns = namespace(last_user=-1) -%}
{%- for m in turns -%}
  {%- if m['role'] == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}
{%- endfor -%}
{{- '<|im_start|>system\n' + system_text + '<|im_end|>\n' -}}
{%- for m in turns -%}
  {%- if m['role'] == 'assistant' -%}
    {%- set text = m['content'] | default('', true) | string -%}
    {%- if '<think>' not in text and '</think>' not in text -%}{%- set text = '<think></think>' + text -%}{%- endif -%}
    {%- if truncate_history_thinking and loop.index0 < ns.last_user and '<think>' in text and '</think>' in text -%}
      {%- set text = '<think></think>' + text.split('</think>')[-1] -%}
    {%- endif -%}
    {{- '<|im_start|>assistant\n' + (text | trim) + '<|im_end|>\n' -}}
  {%- else -%}
    {{- '<|im_start|>' + m['role'] + '\n' + (m['content'] | string) + '<|im_end|>\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|im_start|>assistant\n<think>\n' if enable_thinking else '<|im_start|>assistant\n<think></think>' -}}
{%- endif -%}
""".strip()

# The fixed text the tiny tokenizer learns its merges from: the competition's wording.
_TOKENIZER_TEXT = """In Alice's Wonderland, a secret bit manipulation rule transforms 8-bit binary numbers. \
The transformation involves operations like bit shifts, rotations, XOR, AND, OR, NOT, and possibly majority or \
choice functions.
Here are some examples of input -> output:
Now, determine the output for:
In Alice's Wonderland, the gravitational constant has been secretly changed. Here are some example observations:
For t = 1.37s, distance = 14.92 m
Now, determine the falling distance for t = 4.41s given d = 0.5*g*t^2.
In Alice's Wonderland, secret encryption rules are used on text. Here are some examples:
Now, decrypt the following text:
In Alice's Wonderland, numbers are secretly converted into a different numeral system. Some examples are given below:
Now, write the number 38 in the Wonderland numeral system.
In Alice's Wonderland, a secret unit conversion is applied to measurements. For example:
10.08 m becomes 6.69
Now, convert the following measurement: 25.09 m
In Alice's Wonderland, a secret set of transformation rules is applied to equations. Below are a few examples:
Now, determine the result for:
Please put your final answer inside `\\boxed{}`. For example: `\\boxed{your answer}`
queen discovers near valley cat imagines book the a of and to in is was rabbit hatter
"""


def build_tiny_tokenizer(vocab_size: int = 768):
    """A byte-level BPE tokenizer with Nemotron-style chat turns. Digits and capital letters are always single
    tokens, so a number or a Roman numeral is spelled the same wherever it appears (with merges, ' XXX' in a
    trace line and 'XXX' in the answer were different tokens, and the tiny model had to learn to re-spell them)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.Split(Regex("[A-Z]"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([_TOKENIZER_TEXT] * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="<|im_end|>",
                                   pad_token="<pad>", unk_token="<unk>",
                                   additional_special_tokens=["<|im_start|>"])
    fast.add_tokens(THINK_TOKENS)
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "left"
    return fast


RECIPE_FILE = "tiny_recipe.json"  # what a built tiny model was built from; a changed config must not reuse it


@functools.lru_cache(maxsize=4)
def _tokenizer_sha(vocab_size: int) -> str:
    """The tokenizer's vocabulary and merges plus its chat template: a model built with another template is stale."""
    tok = build_tiny_tokenizer(vocab_size)
    return hashlib.sha256((tok.backend_tokenizer.to_str() + tok.chat_template).encode()).hexdigest()[:16]


def tiny_recipe(cfg: DictConfig) -> dict:
    """Everything the tiny model's weights and tokenizer depend on."""
    arch = OmegaConf.to_container(cfg.model.architecture, resolve=True)
    return {"architecture": arch, "seed": cfg.seed, "head_init_std": cfg.model.head_init_std,
            "tokenizer_sha256": _tokenizer_sha(int(arch["vocab_size"]))}


def check_tiny_recipe(cfg: DictConfig, path: Path) -> None:
    """Refuse a built tiny model whose recipe differs from the config (a silently stale base model would make
    every later number wrong)."""
    f = path / RECIPE_FILE
    want = tiny_recipe(cfg)
    try:
        have = json.loads(f.read_text())
    except (OSError, json.JSONDecodeError):
        have = None
    if have == want:
        return
    why = (f"{f} is missing or unreadable (built by an older version of the lab)" if have is None
           else "; ".join(diff(have, want)) + ": built -> config")
    raise LabError(f"{path}: this tiny base model was built from a different recipe ({why}). Delete the folder "
                   "(and the run's stage folders, whose adapters were trained on it) or use another run_name.")


def build_tiny(cfg: DictConfig, path: Path) -> None:
    """Build the tiny tokenizer and model from `cfg.model.architecture` and save both to `path` atomically,
    with the recipe they were built from."""
    import torch
    from transformers import NemotronHConfig, NemotronHForCausalLM

    tok = build_tiny_tokenizer(cfg.model.architecture.vocab_size)
    arch = OmegaConf.to_container(cfg.model.architecture, resolve=True)
    arch["vocab_size"] = len(tok)
    mcfg = NemotronHConfig(**arch, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                           eos_token_id=tok.eos_token_id)
    with torch.random.fork_rng():
        torch.manual_seed(cfg.seed)
        model = NemotronHForCausalLM(mcfg)
        # The 0.02 init suits a 4096-wide model; at width 64 it caps every logit near +-1, so a frozen
        # head could never be confident (the LoRA cannot reach lm_head: TRL 1.15's SFTTrainer refuses it).
        torch.nn.init.normal_(model.lm_head.weight, std=cfg.model.head_init_std)
    with atomic_dir(path, "tiny model (model.path)") as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / RECIPE_FILE).write_text(json.dumps(tiny_recipe(cfg), indent=1))


def model_path(cfg: DictConfig) -> str:
    """Where the base model lives: a local folder (built if tiny), the Kaggle mount, or the Hub id."""
    p = cfg.model.path
    local = resolve_path(p)
    if cfg.model.build_tiny:
        if not (local / "config.json").is_file():
            # built only into a missing or empty folder, or one the lab built (lab.core.io.atomic_dir): a folder of
            # the user's without config.json (a half-downloaded model, a typo) is refused, never deleted
            check_replaceable(local, "tiny model (model.path)")
            owner.config_output(cfg, "model.path")  # inside this run, or new (lab.core.owner)
            build_tiny(cfg, local)
        check_tiny_recipe(cfg, local)
        return str(local)
    check_model_path(p)  # a LabError unless a local folder with config.json, the Kaggle mount or a cached Hub id
    if local.is_dir():
        return str(local)
    return str(kaggle_model_dir() or p)  # else a Hub id found in the local Hub cache


# The fused Mamba-2 kernels transformers 5.17's Nemotron-H calls when their packages import
# (models/nemotron_h/modeling_nemotron_h.py: `use_kernel_func_from_hub_with_fallback(name, package)`, resolved at import
# time in integrations/hub_kernels.py through `_KERNELS_INTERNAL_PATH_MAPPINGS`): package -> (module, functions).
MAMBA_KERNELS = {
    "mamba_ssm": ("mamba_ssm.ops.triton.ssd_combined",
                  ("mamba_chunk_scan_combined", "mamba_split_conv1d_scan_combined")),
    "causal_conv1d": ("causal_conv1d", ("causal_conv1d_fn", "causal_conv1d_update")),
}
MAMBA_WHEELS_HELP = ("build the two wheels once with scripts/build_mamba_wheels.sh (causal-conv1d 1.7.0, mamba-ssm "
                     "2.3.2.post1 against torch 2.14's CUDA build, for sm_90 and sm_120; `pip install "
                     "--no-build-isolation causal-conv1d==1.7.0 mamba-ssm==2.3.2.post1` does the same in place, needs "
                     "nvcc) and install them; on Kaggle put them in the wheel dataset, the kernel's install cell "
                     "installs them")


def missing_mamba_kernels() -> dict[str, str]:
    """package -> why its fused kernels cannot be used (import error or missing function); empty when all import.

    The package itself is imported first, as transformers does before it looks for the function: `mamba_ssm`'s
    `__init__` needs its compiled Mamba-1 extension, and where that is missing transformers runs the PyTorch scan even
    though `mamba_ssm.ops.triton.ssd_combined` imports once an earlier failed try has left its parents in
    `sys.modules` (seen on a GPU machine, RESULTS.md "First contact with a GPU"): asking for the submodule alone
    answered by the order of imports, not by what transformers will run."""
    import importlib

    out = {}
    for package, (module, names) in MAMBA_KERNELS.items():
        try:
            importlib.import_module(package)
            mod = importlib.import_module(module)
        except Exception as e:  # ImportError, or an extension built against another torch/CUDA (OSError, ...)
            out[package] = f"{type(e).__name__}: {e}"
            continue
        absent = [n for n in names if not callable(getattr(mod, n, None))]
        if absent:
            out[package] = f"{module} lacks {', '.join(absent)}"
    return out


def check_mamba_kernels(cfg: DictConfig) -> None:
    """Refuse to train the real model on the PyTorch reference Mamba scan (a LabError naming how to get the kernels).

    Without `mamba_ssm`, transformers' Nemotron-H runs its PyTorch reference `mamba2_chunk_scan`, whose backward holds
    large fp32 temporaries a Mamba layer at a time (`python -m lab memory --mamba torch` traces it; docs/memory.md,
    "Traced peaks of the recipe"). transformers' other route, Hub kernels (`kernels-community/
    mamba-ssm` through the `kernels` package, integrations/hub_kernels.py), applies only to `from_pretrained(...,
    use_kernels=True)` with the Hub reachable at load time; the lab loads without it (and Kaggle kernels run
    offline), so the two packages are the route. The tiny model (built here, CPU) trains on the PyTorch path and is
    not checked."""
    if cfg.model.build_tiny:
        return
    missing = missing_mamba_kernels()
    if missing:
        why = "; ".join(f"{p}: {w}" for p, w in missing.items())
        raise LabError(f"model={cfg.model.name}: training the real model needs the fused Mamba kernels "
                       f"(mamba_ssm and causal_conv1d), and they do not import here ({why}). Without them every "
                       "Mamba layer runs transformers' PyTorch reference scan, whose backward does not fit the GPU. To "
                       "get them: " + MAMBA_WHEELS_HELP)


def load_tokenizer(cfg: DictConfig):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path(cfg), trust_remote_code=cfg.model.trust_remote_code)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def check_weights(folder: str | os.PathLike, what: str) -> None:
    """A LabError naming the first `*.safetensors` file of a local `folder` that safetensors' own header check refuses
    (`safe_open`: a truncated or damaged file, a header that disagrees with the data); reads headers only."""
    from safetensors import SafetensorError, safe_open

    folder = Path(folder)
    for f in sorted(folder.glob("*.safetensors")) if folder.is_dir() else ():
        try:
            with safe_open(str(f), framework="pt"):
                pass
        except (SafetensorError, OSError) as e:
            raise LabError(f"{f}: the {what}'s weights cannot be read ({e}): truncated or damaged; copy or save it "
                           "again") from None


def load(cfg: DictConfig, adapter: str | os.PathLike | None = None, trainable: bool = False):
    """(model, tokenizer) on the configured device; `adapter` attaches a saved LoRA adapter.

    The weights load straight onto the device: transformers 5.17's `from_pretrained(device_map=...)`
    (modeling_utils.py, integrations/accelerate.py `check_and_set_device_map`) turns a device name into
    `{"": device}` ("cuda" into this process's `cuda:LOCAL_RANK`), builds the model on the meta device and
    writes each tensor to that device as it is read, so the real model's weights never sit in host RAM
    first (as they did with `from_pretrained(...)` then `.to(device)`). With one device no accelerate hooks
    are added (`accelerate_dispatch` runs only for several devices or disk offload). Under DeepSpeed ZeRO-3
    transformers refuses a device_map, so none is passed there."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.integrations import is_deepspeed_zero3_enabled

    path = model_path(cfg)
    tok = load_tokenizer(cfg)
    device = cfg.model.device if cfg.model.device != "auto" else "cuda" if torch.cuda.is_available() else "cpu"
    check_weights(path, "base model")
    if adapter is not None:
        check_weights(resolve_path(adapter), "adapter")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, cfg.model.dtype),
                                                 device_map=None if is_deepspeed_zero3_enabled() else device,
                                                 trust_remote_code=cfg.model.trust_remote_code)
    if adapter is not None:
        from peft import PeftModel

        from lab.model.lora import allow_out_proj, fused_mamba, guard_fused_mamba_out_proj

        adapter = resolve_path(adapter)
        if not (adapter / "adapter_config.json").is_file():
            raise LabError(f"{adapter}: not a LoRA adapter folder (no adapter_config.json)")
        with allow_out_proj():  # the lab trains out_proj through the PyTorch Mamba path (see lab.model.lora)
            model = PeftModel.from_pretrained(model, str(adapter), is_trainable=trainable)
        guard_fused_mamba_out_proj(model, fused=fused_mamba(cfg))
    model.train(trainable)
    return model, tok
