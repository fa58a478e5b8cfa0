"""The config: `compose(overrides)` builds the Hydra config from `conf/` wherever the caller's working directory is
(a notebook run by papermill, a test, a Kaggle kernel) onto the schema of lab/core/schema.py (every value's type,
back-end names, unknown keys) and `validate`s it (the schema's ranges and cross-key rules, then the paths it names),
all before any folder is touched; `load_saved(path)` reads a saved config back onto the same schema and rules.

What it simplifies:
- a notebook's `overrides` parameter may be a list or the string papermill's `-p` passes
  (`'["seed=7", "run_name=seed7"]'`, JSON or YAML): `parse_overrides` reads both into a list of strings, and
  `parsed_overrides` reads them with Hydra's grammar (the sweep, the Kaggle kernels);
- run folders: without `run_name` (or `run_dir`) a run gets its own time-stamped folder
  (`outputs/<YYYY-MM-DD_HH-MM-SS>`, Hydra's `now` resolver), so an interactive run never
  writes into `outputs/demo`, which only `python -m lab demo` (`make demo`) uses.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from pathlib import Path
from typing import Iterable

import yaml
from omegaconf import DictConfig, OmegaConf, nodes
from omegaconf.errors import (ConfigAttributeError, ConfigKeyError, MissingMandatoryValue, OmegaConfBaseException,
                              ReadonlyConfigError, ValidationError)

from lab import LabError
from lab.core import schema
from lab.core.owner import run_dir_problems
from lab.core.paths import check_model_path, config_dir, elsewhere, find_data_file, project_root


def compose(overrides: Iterable[str] = ()) -> DictConfig:
    """Compose `conf/config.yaml` with Hydra overrides; errors name the file and the key. A dict override replaces
    the key's dict (`_replace_dicts`), where Hydra alone would merge it into the default."""
    from hydra import compose as _compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException

    overrides = list(overrides)
    conf_dir = config_dir()
    schema.register()  # conf/config.yaml's first default, `schema`: every group merges onto its dataclass
    GlobalHydra.instance().clear()
    if hydra_keys := [o for o in overrides if o.lstrip("+~").split("=", 1)[0].strip().split(".")[0] == "hydra"]:
        raise LabError(f"{conf_dir / 'config.yaml'}: cannot apply overrides {overrides}: {', '.join(hydra_keys)}: the "
                       "lab composes the config with Hydra's compose API and runs no Hydra app, so hydra.* settings "
                       "would do nothing; the run folder is run_dir=PATH (or run_name=NAME)")
    hydra_overrides, dicts = _dict_overrides(overrides)
    try:
        with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
            cfg = _compose(config_name="config", overrides=hydra_overrides)
        _replace_dicts(cfg, dicts)
    except (HydraException, OmegaConfBaseException) as e:
        why = _non_ascii_problem(overrides) or schema_problem(e)
        raise LabError(f"{conf_dir / 'config.yaml'}: cannot apply overrides {overrides}: {why}") from None
    try:
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as e:
        raise LabError(f"{conf_dir / 'config.yaml'}: cannot resolve config: {schema_problem(e)}") from None
    if unknown := unknown_keys(cfg):  # `+sft.foo=1` adds a key even to a structured config
        why = next(filter(None, map(schema.renamed_problem, unknown)), None)
        raise LabError(f"{conf_dir / 'config.yaml'}: cannot apply overrides {overrides}: " + (why or (
            f"no such key {', '.join(unknown)} (lab/core/schema.py lists every key)")))
    validate(cfg, where=f"{conf_dir / 'config.yaml'} with overrides {overrides}")
    return cfg


def _dict_overrides(overrides: list[str]) -> tuple[list[str], list[tuple[str, object]]]:
    """(what Hydra applies, [(key, value)] that `_replace_dicts` applies after it): a dict given on the command line
    replaces the key's dict, where Hydra would merge it into the default (`_apply_overrides_to_config`,
    hydra/_internal/config_loader_impl.py, calls `OmegaConf.update(..., merge=True)`): `grpo.rewards={format: 1.0}`
    means format alone, `grpo.rewards={}` means none. An override Hydra's grammar cannot parse is left to Hydra,
    which reports it."""
    try:
        parsed = parsed_overrides(overrides)
    except LabError:  # Hydra's compose reports the same error in its words
        return overrides, []
    rest, dicts, below = [], [], []
    for line, o in zip(overrides, parsed):
        plain = not o.is_delete() and not o.is_sweep_override() and o.package is None
        if plain and isinstance(o.value(), dict):
            dicts.append((o.key_or_group, o.value()))
        elif plain and any(o.key_or_group.startswith(k + ".") for k, _ in dicts):
            below.append((o.key_or_group, o.value()))  # `grpo.rewards.length=0.2` after `grpo.rewards={...}`
        else:
            rest.append(line)
    return rest, dicts + [(k, _Below(v)) for k, v in below]


class _Below:
    """A value set below a dict that an earlier override replaced (`_dict_overrides`)."""

    def __init__(self, value):
        self.value = value


def _replace_dicts(cfg: DictConfig, dicts: list[tuple[str, object]]) -> None:
    """Set each (key, dict) of `_dict_overrides` whole (`merge=False`; OmegaConf checks it against the key's type),
    then each key set below one of them (the replaced dict is the user's: a new key may be added to it)."""
    from omegaconf import open_dict

    for key, value in dicts:  # a new key (`+data.difficulty.gravity={...}`) goes into its parent like Hydra's `+`;
        # one that is no field of the schema is refused after (`unknown_keys`), a missing parent here
        parent = OmegaConf.select(cfg, key.rsplit(".", 1)[0], default=None) if "." in key else cfg
        with open_dict(parent) if isinstance(parent, DictConfig) else contextlib.nullcontext():
            if isinstance(value, _Below):
                OmegaConf.update(cfg, key, value.value, merge=True)
            else:
                OmegaConf.update(cfg, key, value, merge=False)


def schema_problem(e: BaseException) -> str:
    """The message of a failed compose or merge, in the lab's words where the schema refused a value or a key:
    `sft.learning_rate='abc' must be a number`, `sft.learnin_rate: no such key in SftConfig`. Hydra wraps the
    OmegaConf error (hydra/_internal/config_loader_impl.py raises ConfigCompositionException from it); OmegaConf's
    errors carry `full_key`, `value` and the refusing `child_node` (omegaconf/_utils.py, format_and_raise)."""
    kinds = {nodes.IntegerNode: "a whole number", nodes.FloatNode: "a number", nodes.BooleanNode: "true or false"}
    known = (ValidationError, ConfigKeyError, ConfigAttributeError, ReadonlyConfigError, MissingMandatoryValue)
    cause = e.__cause__ if isinstance(e.__cause__, known) else e
    key = getattr(cause, "full_key", None)
    for c in (cause, e.__context__):  # a group file's error: Hydra raises it inside its except clause, no `from`
        if isinstance(c, (ConfigKeyError, ConfigAttributeError)):
            if renamed := schema.renamed_problem(getattr(c, "full_key", None) or ""):
                return renamed
    if isinstance(cause, MissingMandatoryValue) and key:
        return f"{key} has no value (???): set it in its conf/ file or with an override"
    if isinstance(cause, ReadonlyConfigError) and key:
        return f"{key} is fixed by the competition (lab/core/schema.py, CompetitionLimits): it cannot be set"
    if isinstance(cause, ValidationError) and key:
        node = getattr(cause, "child_node", None)
        if isinstance(node, nodes.EnumNode):
            return f"{key}={cause.value!r} is not one of {', '.join(node.enum_type.__members__)}"
        return f"{key}={cause.value!r} must be {kinds.get(type(node), 'of the type lab/core/schema.py gives it')}"
    if isinstance(cause, (ConfigKeyError, ConfigAttributeError)) and key:
        return f"{key}: no such key in {cause.object_type_str} (lab/core/schema.py lists every key)"
    return " ".join(str(e).split())


def unknown_keys(cfg: DictConfig) -> list[str]:
    """Keys of `cfg` that lab/core/schema.py's dataclasses do not declare (free-form maps excepted)."""
    def walk(node, cls, prefix):
        fields = {f.name: f for f in dataclasses.fields(cls)}
        out = []
        for k in node.keys():
            f = fields.get(k)
            if f is None:
                out.append(f"{prefix}{k}")
            elif dataclasses.is_dataclass(f.default_factory) and isinstance(node[k], DictConfig):
                out += walk(node[k], f.default_factory, f"{prefix}{k}.")
        return out

    return walk(cfg, schema.Config, "")


def load_saved(path: str | os.PathLike) -> DictConfig:
    """A stage's saved `config.yaml` merged onto the schema (lab/core/schema.py), so it reads back with the types
    `compose` gave it; a LabError names the file and the key when it no longer fits the schema (its types; for a
    complete file its ranges and rules too, and its `competition` node must be the competition's limits)."""
    path = Path(path)
    if not path.is_file():
        raise LabError(f"{path}: file not found")
    try:
        saved = OmegaConf.load(path)
        limits = saved.pop("competition", None)  # read-only in the schema: compared, not merged
        cfg = OmegaConf.merge(OmegaConf.structured(schema.Config), saved)
        found = [] if OmegaConf.missing_keys(cfg) else schema.problems(cfg)  # a partial file: its types only
    except OmegaConfBaseException as e:
        raise LabError(f"{path}: {schema_problem(e)}") from None
    if limits is not None and OmegaConf.to_container(limits) != OmegaConf.to_container(cfg.competition):
        found.append(f"competition={OmegaConf.to_container(limits)} is not the competition's fixed limits "
                     f"{OmegaConf.to_container(cfg.competition)} (lab/core/schema.py, CompetitionLimits)")
    if found:
        raise LabError(f"{path}: " + "; ".join(found))
    return cfg


def config_data(cfg: DictConfig) -> dict:
    """`cfg` as plain resolved data without `run_name` (a time stamp unless set; a job's folder is fixed by
    `run_dir`): what a kept result is compared by."""
    return {k: v for k, v in OmegaConf.to_container(cfg, resolve=True).items() if k != "run_name"}


def saved_config_matches(path: str | os.PathLike, config: dict) -> bool:
    """Whether the stage config saved at `path`, read back through the schema (`load_saved`), is `config`
    (`config_data` of the new one). False when it is missing, unreadable or no longer fits the schema: the result
    beside it is then not trusted and is made again."""
    try:
        return config_data(load_saved(path)) == config
    except Exception:  # noqa: BLE001 - not kept is the safe answer; the rerun reports any real problem
        return False


def validate(cfg: DictConfig, where: str = "config") -> None:
    """Refuse a config whose values cannot run, before any stage folder is opened: one LabError listing every
    problem (key, value, what it must be). Types, back-end names, ranges and cross-key rules are lab/core/schema.py's
    (`schema.problems`, the dataclasses' `__post_init__`); then the paths that must exist do: `data.path` (when the
    data source reads a file and a path is given) and `model.path` when the model is not built here and names a
    local folder (`check_model_path`)."""
    try:
        problems = schema.problems(cfg)
    except OmegaConfBaseException as e:  # a value left MISSING (`???`), an interpolation that does not resolve
        raise LabError(f"{where}: {schema_problem(e)}") from None
    if not problems:  # paths only once the values are sane; a /kaggle/ path is checked on Kaggle (kernel builds)
        if cfg.data.source == "competition" and cfg.data.path and not elsewhere(cfg.data.path):
            try:
                find_data_file(cfg.data.path)
            except LabError as e:
                problems.append(f"data.path: {e}")
        problems += run_dir_problems(cfg)
        if cfg.model.build_tiny is False and not elsewhere(cfg.model.path):
            try:
                check_model_path(cfg.model.path, hub_cache=False)
            except LabError as e:
                problems.append(f"model.path: {e}")
    if problems:
        raise LabError(f"{where}: " + "; ".join(problems) + " (nothing was run or changed)")


def _non_ascii_problem(overrides: list[str]) -> str | None:
    """A plain message for Hydra's lexer error on an unquoted non-ASCII value (Hydra's override grammar,
    hydra/grammar/OverrideLexer.g4, reads only ASCII in unquoted values), or None."""
    bad = [o for o in overrides if not o.isascii() and "=" in o and o.split("=", 1)[1][:1] not in ("'", '"')]
    if not bad:
        return None
    key, value = bad[0].split("=", 1)
    return (f"{bad[0]!r}: Hydra reads only ASCII letters in an unquoted value; quote it: {key}='{value}' "
            f"(in a shell: \"{key}='{value}'\")")


def split_at_dashes(argv: list[str] | None) -> tuple[list[str], list[str]]:
    """A command line (default: sys.argv[1:]) split at the first `--`: (the command's own arguments, the
    Hydra overrides after it)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        return argv, []
    i = argv.index("--")
    return argv[:i], argv[i + 1:]


OVERRIDES_HELP = ("""pass a list of Hydra overrides: in Python overrides = ["seed=7", "run_name=seed7"]; """
                  """with papermill -p overrides '["seed=7", "run_name=seed7"]' """
                  """or -y 'overrides: [seed=7, run_name=seed7]'""")


def parse_overrides(value: str | Iterable[str] | None) -> list[str]:
    """A notebook's `overrides` parameter as a list of strings.

    papermill's `-p overrides '[...]'` hands the notebook the string itself; it is read as YAML (JSON is
    YAML), and must be a list. A list or tuple is taken as it is; None or an empty string is no override.
    """
    if value is None:
        return []
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return []
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise LabError(f"notebook parameter overrides={text!r}: not a JSON/YAML list ({e}); "
                           f"{OVERRIDES_HELP}") from None
        if not isinstance(value, list):
            raise LabError(f"notebook parameter overrides={text!r}: not a list; {OVERRIDES_HELP}")
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return list(value)
    raise LabError(f"notebook parameter overrides={value!r}: expected a list of strings such as \"seed=7\"; "
                   f"{OVERRIDES_HELP}")


def parsed_overrides(value: str | Iterable[str] | None) -> list:
    """`parse_overrides(value)` read by Hydra's own grammar: one `Override` per line (key, value, sweep or not), for
    the sweep and the Kaggle kernels that look at keys. A syntax error is a LabError naming the overrides."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    overrides = parse_overrides(value)
    try:
        return OverridesParser.create().parse_overrides(overrides)
    except Exception as e:  # noqa: BLE001 - OverrideParseException and friends
        raise LabError(f"cannot parse overrides {overrides}: {e}") from None


def names_run(overrides: Iterable[str]) -> bool:
    """True when the overrides choose the run folder (`run_name=...` or `run_dir=...`, with or without `+`/`++`)."""
    return any(o.lstrip("+").split("=", 1)[0].strip() in ("run_name", "run_dir") for o in overrides)


def library_problems(cfg: DictConfig) -> list[str]:
    """Values only a library can judge, checked with the library's own list before a stage touches anything:
    `sft.lr_scheduler_type` against transformers' `SchedulerType` (transformers/trainer_utils.py, the enum
    `TrainingArguments` converts the name with) and `model.dtype` against torch's dtypes. Not part of `validate`:
    importing transformers' trainer utilities costs seconds, which every compose would pay."""
    problems = []
    sched = OmegaConf.select(cfg, "sft.lr_scheduler_type", default=None)
    if sched is not None:
        from transformers.trainer_utils import SchedulerType

        names = [e.value for e in SchedulerType]
        if sched not in names:
            problems.append(f"sft.lr_scheduler_type={sched!r} is not one of transformers' schedulers "
                            f"({', '.join(names)})")
    dtype = OmegaConf.select(cfg, "model.dtype", default=None)
    if dtype not in (None, "auto"):
        import torch

        if not isinstance(getattr(torch, str(dtype), None), torch.dtype):
            problems.append(f"model.dtype={dtype!r} is not a torch dtype (e.g. bfloat16, float32)")
    return problems
