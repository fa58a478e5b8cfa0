"""lab/core/schema.py types the config: every group option composes onto its dataclass, a wrong type or an unknown key fails
at compose time naming the key, a saved config reads back with the same types, every field has help text."""

import dataclasses
import typing

import pytest
from omegaconf import DictConfig, ListConfig, OmegaConf

from lab import LabError
from lab.core.config import compose, load_saved
from lab.core.schema import GROUPS, Config, help_lines

# typed end to end: the default, the real model's recipe and the recipe on generated data (every option of every
# group composes through the same schema: tests/test_config.py)
OPTIONS = [[], ["experiment=competition"], ["experiment=competition", "data=synthetic"]]


def dataclass_fields(cls):
    """(dotted key, declared type) of every field of `cls`, nested dataclasses expanded."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            yield from ((f"{f.name}.{k}", t) for k, t in dataclass_fields(hints[f.name]))
        else:
            yield f.name, hints[f.name]


def check_typed(cfg: DictConfig) -> list[str]:
    """Problems: a node not of its dataclass, a key the schema lacks, a value not of its declared type."""
    problems = []
    if OmegaConf.get_type(cfg) is not Config:
        problems.append(f"root is {OmegaConf.get_type(cfg)}")
    for group, cls in GROUPS.items():
        if OmegaConf.get_type(cfg, group) is not cls:
            problems.append(f"{group} is {OmegaConf.get_type(cfg, group)}, not {cls.__name__}")
    declared = dict(dataclass_fields(Config))
    flat = OmegaConf.to_container(cfg)
    seen = set()

    def walk(node, prefix):
        for k, v in node.items():
            key = f"{prefix}{k}"
            if key in declared:
                seen.add(key)
                problems.extend(value_problems(key, v, declared[key]))
            elif isinstance(v, dict):
                walk(v, f"{key}.")
            else:
                problems.append(f"{key}: not in the schema")

    walk(flat, "")
    problems += [f"{k}: declared but not composed" for k in set(declared) - seen]
    return problems


def value_problems(key, value, tp) -> list[str]:
    args = typing.get_args(tp)
    if typing.get_origin(tp) is typing.Union:  # Optional[X]
        if value is None:
            return []
        tp = next(a for a in args if a is not type(None))
        args = typing.get_args(tp)
    origin = typing.get_origin(tp) or tp
    if origin is list:
        return [] if isinstance(value, list) and all(isinstance(v, args[0]) for v in value) else [f"{key}={value!r}"]
    if origin is dict:
        ok = isinstance(value, dict) and (args[1] is typing.Any or all(isinstance(v, args[1]) for v in value.values()))
        return [] if ok else [f"{key}={value!r}"]
    return [] if type(value) is origin else [f"{key}={value!r} is {type(value).__name__}, declared {tp}"]


@pytest.mark.parametrize("overrides", OPTIONS, ids=lambda o: " ".join(o) or "default")
def test_a_composed_config_is_typed_by_the_schema(overrides, tmp_path):
    cfg = compose([*overrides, f"run_dir={tmp_path}"])
    assert not check_typed(cfg), check_typed(cfg)


def test_the_schema_types_each_value():
    from lab.core.schema import GenerationBackend

    cfg = compose([])
    assert type(cfg.sft._get_node("learning_rate")).__name__ == "FloatNode"
    # a back-end is an Enum member that reads, prints and serialises as its name
    assert cfg.model.generation_backend is GenerationBackend.hf and cfg.model.generation_backend == "hf"
    assert f"{cfg.model.generation_backend}" == "hf" and "generation_backend: hf\n" in OmegaConf.to_yaml(cfg)
    assert type(cfg._get_node("seed")).__name__ == "IntegerNode"
    assert OmegaConf.get_type(cfg.sft, "lora") is GROUPS["sft"].__dataclass_fields__["lora"].default_factory
    assert isinstance(cfg.model.architecture, DictConfig) and isinstance(cfg.sft.lora.targets, ListConfig)
    # interpolations keep working: resolved at compose, checked against the field's type
    assert cfg.sft.max_seq_len == cfg.model.max_model_len == 384 and cfg.model.path == f"{cfg.run_dir}/base_model"
    assert compose(["model=nemotron_nano"]).sft.max_seq_len == 8192


@pytest.mark.parametrize("override,message", [
    ("sft.learning_rate=abc", "sft.learning_rate='abc' must be a number"),
    ("seed=1.5", "seed=1.5 must be a whole number"),
    ("data.n_train=many", "data.n_train='many' must be a whole number"),
    ("model.build_tiny=maybe", "model.build_tiny='maybe' must be true or false"),
    ("sft.learnin_rate=1e-3", "sft.learnin_rate: no such key"),
    ("+sft.learnin_rate=1e-3", "no such key sft.learnin_rate"),
    ("grpo.rewards.format=heavy", "grpo.rewards.format='heavy' must be a number"),
    ("grpo.rollout_backend=vlm", "grpo.rollout_backend='vlm' is not one of hf, vllm"),
    ("model.train_backend=unslot", "model.train_backend='unslot' is not one of hf, unsloth"),
    ("report_to=tensorbord", "report_to='tensorbord' is not one of none, tensorboard, wandb, mlflow"),
])
def test_a_wrong_type_or_unknown_key_fails_at_compose_naming_the_key(override, message):
    with pytest.raises(LabError) as e:
        compose([override])
    assert message in str(e.value) and "config.yaml" in str(e.value) and override in str(e.value)


def test_free_form_maps_take_new_keys():
    cfg = compose(["+data.difficulty.numeral_system={max_value: 50}", "+grpo.rewards.length=0.5"])
    assert cfg.data.difficulty.numeral_system.max_value == 50 and cfg.grpo.rewards.length == 0.5


def test_a_saved_config_reads_back_with_the_same_types(tmp_path):
    cfg = compose(["experiment=competition", f"run_dir={tmp_path}", "sft.epochs=2", "grpo.wall_clock_budget_min=0"])
    path = tmp_path / "config.yaml"
    path.write_text(OmegaConf.to_yaml(cfg))  # what Stage writes
    back = load_saved(path)
    assert not check_typed(back), check_typed(back)
    assert OmegaConf.to_container(back) == OmegaConf.to_container(cfg)
    assert type(back.sft.epochs) is float and type(back.grpo.wall_clock_budget_min) is float
    plain = OmegaConf.load(path)  # without the schema a float written as 2.0 reads back as written, 0 as an int
    assert type(plain.grpo.wall_clock_budget_min) is float
    path.write_text(OmegaConf.to_yaml(cfg).replace("wall_clock_budget_min: 0.0", "wall_clock_budget_min: 0"))
    assert type(OmegaConf.load(path).grpo.wall_clock_budget_min) is int
    assert type(load_saved(path).grpo.wall_clock_budget_min) is float


def test_a_saved_config_that_no_longer_fits_names_file_and_key(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("seed: 1\nsft:\n  learnin_rate: 0.1\n")
    with pytest.raises(LabError, match=r"config.yaml: sft.learnin_rate: no such key"):
        load_saved(path)
    path.write_text("seed: many\n")
    with pytest.raises(LabError, match=r"config.yaml: seed='many' must be a whole number"):
        load_saved(path)
    good = compose([f"run_dir={tmp_path}"])
    path.write_text(OmegaConf.to_yaml(good).replace("grad_accum: 1\n", "grad_accum: 0\n"))  # a range it breaks
    with pytest.raises(LabError, match=r"config.yaml: sft.grad_accum=0 must be >= 1"):
        load_saved(path)


def test_every_field_has_help_text():
    lines = help_lines()
    assert len(lines) == len(dict(dataclass_fields(Config)))
    empty = [f.name for cls in [Config, *GROUPS.values(), GROUPS["sft"].__dataclass_fields__["lora"].default_factory]
             for f in dataclasses.fields(cls) if not f.metadata.get("help", "").strip()]
    assert not empty, f"fields without help text: {empty}"
    assert any(line.startswith("sft.lora.r (int): LoRA rank") for line in lines)
    assert "sft.grad_accum (int): gradient accumulation steps" in "\n".join(lines)
    assert any(line.startswith("sft.grad_accum (int):") and line.endswith("[>= 1]") for line in lines)
    assert any(line.startswith("model.generation_backend (hf | vllm):") for line in lines)
