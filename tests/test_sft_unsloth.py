"""sft.backend=unsloth: what the lab itself decides (which Unsloth calls, with which arguments from the config; what it
refuses before Unsloth is imported), against a test-only stand-in for `unsloth.FastModel` (Unsloth needs a CUDA GPU).

The stand-in takes exactly the named parameters of the pinned Unsloth (2026.10.9, pyproject's GPU extra), read from
its wheel (`pip download --no-deps unsloth==2026.10.9`): `FastModel.from_pretrained` in `unsloth/models/loader.py`,
and `FastBaseModel.get_peft_model` in `unsloth/models/vision.py`, where `FastModel.get_peft_model(model, *args,
**kwargs)` (loader.py) sends its arguments. Both real functions also take `**kwargs`, passed on or dropped
silently; the stand-in does not, so a keyword the real function does not name fails here. Where Unsloth is installed
(the GPU extra), a test checks these names against its source, read without importing it."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import subprocess
import sys
import types
from pathlib import Path

import pytest

from lab import LabError
from lab.core import config
from lab.train import sft, sft_unsloth
from lab.core.run import Stage
from train_steps import sft_train  # noqa: E402

FROM_PRETRAINED = (
    "model_name", "max_seq_length", "dtype", "load_in_4bit", "load_in_8bit", "load_in_16bit", "full_finetuning",
    "token", "device_map", "device_map_planner_kwargs", "rope_scaling", "fix_tokenizer", "trust_remote_code",
    "use_gradient_checkpointing", "resize_model_vocab", "revision", "return_logits", "fullgraph",
    "use_exact_model_name", "auto_model", "whisper_language", "whisper_task", "unsloth_force_compile",
    "offload_embedding", "float32_mixed_precision", "fast_inference", "gpu_memory_utilization", "float8_kv_cache",
    "random_state", "max_lora_rank", "disable_log_stats", "qat_scheme", "load_in_fp8", "unsloth_tiled_mlp",
    "target_parameters", "text_only", "on_model_resolved")
GET_PEFT_MODEL = (
    "model", "r", "target_modules", "lora_alpha", "lora_dropout", "bias", "finetune_vision_layers",
    "finetune_language_layers", "finetune_attention_modules", "finetune_mlp_modules", "finetune_last_n_layers",
    "layers_to_transform", "layers_pattern", "use_gradient_checkpointing", "random_state", "max_seq_length",
    "use_rslora", "modules_to_save", "init_lora_weights", "loftq_config", "task_type", "temporary_location",
    "qat_scheme", "target_parameters", "ensure_weight_tying", "finetune_audio_layers", "offload_layers",
    "checkpoint_skip_layers")


class Recorded(Exception):
    """Raised by the stand-in once it has recorded a call: the tests need nothing after it."""


def _signature(names):
    """The real function's named parameters, each with a default (what the lab leaves out is not recorded)."""
    return inspect.Signature([inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None)
                              for n in names])


@pytest.fixture
def calls(monkeypatch):
    """Install the test-only stand-in `unsloth` module; returns the list of (call, bound arguments) it records."""
    seen = []

    def call(name, names):
        def f(*args, **kwargs):
            seen.append((name, _signature(names).bind(*args, **kwargs).arguments))  # TypeError on an unknown keyword
            raise Recorded
        return staticmethod(f)

    fast_model = type("StandInFastModel", (), {"from_pretrained": call("from_pretrained", FROM_PRETRAINED),
                                               "get_peft_model": call("get_peft_model", GET_PEFT_MODEL)})
    monkeypatch.setitem(sys.modules, "unsloth", types.SimpleNamespace(FastModel=fast_model))
    return seen


def cfg_for(tmp_path, *extra):
    (tmp_path / "nemotron").mkdir(exist_ok=True)  # model.path must be a model folder (validated at compose time)
    (tmp_path / "nemotron" / "config.json").write_text("{}")  # never loaded
    return config.compose([f"run_dir={tmp_path / 'run'}", "model=nemotron_nano", f"model.path={tmp_path / 'nemotron'}",
                           "sft.backend=unsloth", "sft.packing=false", *extra])  # packing: sft.backend=hf only


def _parameters(path: Path, cls: str, fn: str) -> tuple[str, ...]:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for f in node.body:
                if isinstance(f, ast.FunctionDef) and f.name == fn:
                    return tuple(a.arg for a in f.args.posonlyargs + f.args.args + f.args.kwonlyargs)
    raise AssertionError(f"{path}: no {cls}.{fn}")


def test_the_stand_in_names_the_installed_unsloths_parameters():
    spec = importlib.util.find_spec("unsloth")  # finds the package without importing it (no GPU needed)
    if spec is None:
        pytest.skip("unsloth is not installed (the GPU extra)")
    models = Path(spec.submodule_search_locations[0]) / "models"
    assert _parameters(models / "loader.py", "FastModel", "from_pretrained") == FROM_PRETRAINED
    assert _parameters(models / "loader.py", "FastModel", "get_peft_model") == ("model",)  # forwards, see above
    assert _parameters(models / "vision.py", "FastBaseModel", "get_peft_model") == GET_PEFT_MODEL


def test_the_stand_in_refuses_a_keyword_unsloth_does_not_name(calls):
    import unsloth

    with pytest.raises(TypeError, match="max_seq_len"):
        unsloth.FastModel.from_pretrained(model_name="m", max_seq_len=8)


def test_unsloth_is_not_imported_with_the_lab():
    code = "import sys, lab.train.sft, lab.train.sft_unsloth; print('unsloth' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_sft_loads_through_fastmodel_with_the_configs_values(tmp_path, monkeypatch, calls):
    """With no model handed in, SFT loads through FastModel.from_pretrained (16-bit LoRA), not transformers, with
    the sequence length, dtype, checkpointing and seed of the config."""
    from lab.model import models
    from lab.puzzles import generate

    monkeypatch.setattr(models, "load", lambda *a, **k: pytest.fail("loaded with transformers, not Unsloth"))
    monkeypatch.setattr(models, "model_path", lambda cfg: "/models/nemotron")
    cfg = cfg_for(tmp_path, "sft.lora.targets=[q_proj,experts]", "sft.max_seq_len=4096", "seed=7",
                  "sft.gradient_checkpointing=false")
    with pytest.raises(Recorded):
        sft_train(cfg, Stage("02_sft", cfg=cfg), generate("numeral_system", 2, 0))
    (name, kw), = calls
    assert name == "from_pretrained" and kw["model_name"] == "/models/nemotron"
    assert kw["max_seq_length"] == 4096 and str(kw["dtype"]) == "torch.bfloat16" and kw["random_state"] == 7
    assert (kw["load_in_4bit"], kw["load_in_8bit"], kw["load_in_16bit"], kw["full_finetuning"]) == (False, False, True,
                                                                                                    False)
    assert kw["trust_remote_code"] is False and kw["use_gradient_checkpointing"] is False


def test_get_peft_model_gets_the_labs_targets(tmp_path, calls):
    """The lab's families become Unsloth's target_modules (sorted) and, for the fused routed experts, PEFT's
    target_parameters; rank and alpha come from sft.lora."""
    pytest.importorskip("torch")
    from omegaconf import OmegaConf

    from lab.plan import shapes

    tiny = shapes.meta_model(OmegaConf.to_container(config.compose([]).model.architecture))  # shapes only
    cfg = cfg_for(tmp_path, "sft.lora.targets=[q_proj,in_proj,experts]", "sft.lora.r=16", "sft.lora.alpha=8")
    with pytest.raises(Recorded):
        sft_unsloth.attach_lora(cfg, tiny)
    (name, kw), = calls
    assert name == "get_peft_model" and kw["model"] is tiny and (kw["r"], kw["lora_alpha"]) == (16, 8)
    assert kw["target_modules"] == ["in_proj", "q_proj"]
    assert kw["target_parameters"] == ["mixer.experts.up_proj", "mixer.experts.down_proj"]
    assert (kw["bias"], kw["use_rslora"], kw["lora_dropout"]) == ("none", False, 0.0)


def test_lm_head_is_refused_before_unsloth_is_imported(tmp_path, monkeypatch):
    """Unsloth would turn an lm_head target into a full trained copy of the head (modules_to_save), which vLLM does
    not load: the preset's targets (lm_head included) are refused before anything imports Unsloth or loads weights."""
    monkeypatch.setitem(sys.modules, "unsloth", None)  # an import now would raise the "needs the package" error
    cfg = cfg_for(tmp_path)
    with pytest.raises(LabError, match=r"lm_head.*modules_to_save.*sft\.backend=hf"):
        sft_train(cfg, Stage("02_sft", cfg=cfg), None)
    with pytest.raises(LabError, match=r"lm_head.*sft\.backend=hf"):
        sft_unsloth.attach_lora(cfg, model=None)


def test_without_unsloth_the_error_says_what_to_do(monkeypatch):
    monkeypatch.setitem(sys.modules, "unsloth", None)  # import unsloth -> ImportError
    with pytest.raises(LabError, match=r"backend=unsloth needs the `unsloth` package.*sft\.backend=hf"):
        sft_unsloth.fast_model()
