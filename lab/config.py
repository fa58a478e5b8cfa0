"""Config, seeds, run folders and manifests: the plumbing every stage shares.

`compose(overrides)` builds the Hydra config from `conf/` wherever the caller's working
directory is (a notebook run by papermill, a test, a Kaggle kernel) onto the schema of lab/schema.py
(every value's type, unknown keys) and `validate`s it (ranges, cross-key rules, the paths it names), all
before any folder is touched; `load_saved(path)` reads a saved config back onto the same schema. `Stage`
is what a notebook opens first: it takes the run folder's lock (`run_lock`: one writer per run
folder), makes the stage folder, seeds everything, writes the resolved config, and on
`finish(metrics)` writes `metrics.json` and the manifest atomically.

What it simplifies:
- a notebook's `overrides` parameter may be a list or the string papermill's `-p` passes
  (`'["seed=7", "run_name=seed7"]'`, JSON or YAML): `parse_overrides` reads both;
- run folders: without `run_name` (or `run_dir`) a run gets its own time-stamped folder
  (`outputs/<YYYY-MM-DD_HH-MM-SS>`, Hydra's `now` resolver), so an interactive run never
  writes into `outputs/demo`, which only `python -m lab demo` (`make demo`) uses;
- seeding is `transformers.set_seed`; live training curves go where `report_to` says
  (`tracking_args`, TRL's own integrations).

Deliberately simple: no database; a run is a folder of files.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as _dt
import functools
import glob
import json
import os
import platform
import re
import subprocess
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable

import numpy as np
from omegaconf import DictConfig, OmegaConf

PACKAGES = ("lab", "torch", "transformers", "trl", "peft", "datasets", "accelerate", "hydra-core",
            "papermill", "pandas", "numpy", "vllm", "unsloth")


class LabError(Exception):
    """An error whose message names the file and the problem; shown to users as is."""


def project_root() -> Path:
    """The folder holding `conf/config.yaml`: $LAB_ROOT, else the checkout this package lives in."""
    env = os.environ.get("LAB_ROOT")
    candidates = [Path(env)] if env else []
    candidates += [Path(__file__).resolve().parent.parent, Path.cwd(), *Path.cwd().parents]
    for c in candidates:
        if (c / "conf" / "config.yaml").is_file():
            return c.resolve()
    raise LabError(f"conf/config.yaml not found (looked in {', '.join(map(str, candidates))}); "
                   "set LAB_ROOT to the lab's checkout")


def resolve_path(p: str | os.PathLike) -> Path:
    """Relative paths in the config are relative to the project root, not to the caller's cwd."""
    p = Path(os.path.expanduser(str(p)))
    return p if p.is_absolute() else project_root() / p


# Where the competition data and the base model are: here, below the modules that use them, so the
# compose-time check in `validate` needs no import of lab.data or lab.models (they re-export these names).
KAGGLE_INPUT = Path("/kaggle/input")
COMPETITION_SLUG = "nvidia-nemotron-model-reasoning-challenge"


def _on_kaggle() -> bool:
    return bool(os.environ.get("KAGGLE_KERNEL_RUN_TYPE")) or KAGGLE_INPUT.is_dir()


def _kaggle_candidates(name: str) -> list[Path]:
    if not KAGGLE_INPUT.is_dir():
        return []
    found = sorted(set(KAGGLE_INPUT.glob(f"*/{name}")) | set(KAGGLE_INPUT.glob(f"*/*/{name}")))
    return [p for p in found if p.is_file()]


def find_data_file(path: str | os.PathLike | None = None, name: str = "train.csv") -> Path:
    """Where a competition file is: `path`, else $LAB_DATA, else <project root>/data/<name>, else Kaggle.

    An explicit relative `path` is tried relative to the working directory, then to the project
    root (the config's convention). $LAB_DATA may name a folder (holding `name`) or a file (used
    when its file name is `name`, else its folder is searched). On Kaggle (KAGGLE_KERNEL_RUN_TYPE
    set or /kaggle/input present) /kaggle/input/*/<name> and /kaggle/input/*/*/<name> are searched;
    the competition's own folder wins, and several other matches are an error rather than a guess.
    """
    if path is not None and str(path) != "":
        p = Path(os.path.expanduser(str(path)))
        tried = [p]
        if not p.is_absolute():
            try:
                tried.append(project_root() / p)
            except LabError:
                pass
        for c in tried:
            if c.is_file():
                return c.resolve()
        raise LabError(f"{path}: data file not found (looked at {', '.join(map(str, tried))})")

    looked: list[str] = []
    env = os.environ.get("LAB_DATA")
    if env:
        e = Path(os.path.expanduser(env))
        if not e.exists():
            raise LabError(f"{e}: $LAB_DATA points to nothing (unset it or fix the path)")
        c = e if (e.is_file() and e.name == name) else (e / name if e.is_dir() else e.parent / name)
        if c.is_file():
            return c.resolve()
        looked.append(f"{c} ($LAB_DATA)")
    try:
        c = project_root() / "data" / name
        if c.is_file():
            return c
        looked.append(str(c))
    except LabError as err:
        looked.append(f"<project root>/data/{name} ({err})")
    if _on_kaggle():
        found = _kaggle_candidates(name)
        own = [p for p in found if COMPETITION_SLUG in str(p)]
        if len(own) == 1 or (not own and len(found) == 1):
            return (own or found)[0]
        if found:
            raise LabError(f"{KAGGLE_INPUT}: several {name} files ({', '.join(map(str, found))}); "
                           "pass data.path=... to choose one")
        looked.append(f"{KAGGLE_INPUT}/*/{name}")
    raise LabError(f"{name} not found; looked in: {'; '.join(looked)}. Pass a path (data.path=...), "
                   "set $LAB_DATA, or put the file in data/")


def kaggle_model_dir() -> Path | None:
    """The Nemotron-H checkpoint folder under the Kaggle input mount, when running on Kaggle."""
    for cfg_file in sorted(glob.glob("/kaggle/input/**/config.json", recursive=True)):
        try:
            if json.loads(Path(cfg_file).read_text()).get("model_type") == "nemotron_h":
                return Path(cfg_file).parent
        except (OSError, json.JSONDecodeError):
            continue
    return None


def check_model_path(p: str, hub_cache: bool = True) -> None:
    """A LabError unless `p` is a local model folder or a Hub id (`org/name`) whose config.json is in the local
    Hub cache (nothing is downloaded; `hub_cache=False`, as at compose time, accepts any Hub id). Without this,
    a path that does not exist reaches `from_pretrained` as a Hub id and fails with huggingface_hub's "Repo id
    must be in the form ..." message. The cache is read with `huggingface_hub.try_to_load_from_cache`
    (huggingface_hub/file_download.py: the cached file's path, else None or a "known missing" marker)."""
    local = resolve_path(p)
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise LabError(f"{local}: model folder has no config.json")
        return
    if os.path.isdir("/kaggle/input") and kaggle_model_dir() is not None:
        return
    if p.startswith((".", "/", "~")) or p.count("/") != 1:  # a path, not a Hub id
        raise LabError(f"{local}: model folder not found (model.path={p!r} is neither a folder nor a Hub id "
                       "'org/name')")
    if not hub_cache:
        return
    from huggingface_hub import try_to_load_from_cache

    if not isinstance(try_to_load_from_cache(p, "config.json"), str):
        raise LabError(f"model.path={p!r}: not a local folder, and the Hub model is not in the local cache "
                       "(nothing is downloaded at run time): download it beforehand (README, 'The real model') "
                       "or pass its folder as model.path")


def compose(overrides: Iterable[str] = ()) -> DictConfig:
    """Compose `conf/config.yaml` with Hydra overrides; errors name the file and the key."""
    from hydra import compose as _compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from lab.schema import register

    overrides = list(overrides)
    conf_dir = project_root() / "conf"
    register()  # conf/config.yaml's first default, `schema`: every group merges onto its dataclass (lab/schema.py)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
            cfg = _compose(config_name="config", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as e:
        why = _non_ascii_problem(overrides) or schema_problem(e)
        raise LabError(f"{conf_dir / 'config.yaml'}: cannot apply overrides {overrides}: {why}") from None
    try:
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as e:
        raise LabError(f"{conf_dir / 'config.yaml'}: cannot resolve config: {schema_problem(e)}") from None
    if unknown := unknown_keys(cfg):  # `+sft.foo=1` adds a key even to a structured config
        raise LabError(f"{conf_dir / 'config.yaml'}: cannot apply overrides {overrides}: no such key "
                       f"{', '.join(unknown)} (lab/schema.py lists every key)")
    validate(cfg, where=f"{conf_dir / 'config.yaml'} with overrides {overrides}")
    return cfg


def schema_problem(e: BaseException) -> str:
    """The message of a failed compose or merge, in the lab's words where the schema refused a value or a key:
    `sft.learning_rate='abc' must be a number`, `sft.learnin_rate: no such key in SftConfig`. Hydra wraps the
    OmegaConf error (hydra/_internal/config_loader_impl.py raises ConfigCompositionException from it); OmegaConf's
    errors carry `full_key`, `value` and the refusing `child_node` (omegaconf/_utils.py, format_and_raise)."""
    from omegaconf import nodes
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

    kinds = {nodes.IntegerNode: "a whole number", nodes.FloatNode: "a number", nodes.BooleanNode: "true or false"}
    cause = e.__cause__ if isinstance(e.__cause__, (ValidationError, ConfigKeyError, ConfigAttributeError)) else e
    key = getattr(cause, "full_key", None)
    if isinstance(cause, ValidationError) and key:
        what = kinds.get(type(getattr(cause, "child_node", None)), "of the type lab/schema.py gives it")
        return f"{key}={cause.value!r} must be {what}"
    if isinstance(cause, (ConfigKeyError, ConfigAttributeError)) and key:
        return f"{key}: no such key in {cause.object_type_str} (lab/schema.py lists every key)"
    return " ".join(str(e).split())


def unknown_keys(cfg: DictConfig) -> list[str]:
    """Keys of `cfg` that lab/schema.py's dataclasses do not declare (free-form maps excepted)."""
    import dataclasses

    from lab.schema import Config

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

    return walk(cfg, Config, "")


def load_saved(path: str | os.PathLike) -> DictConfig:
    """A stage's saved `config.yaml` merged onto the schema (lab/schema.py), so it reads back with the types
    `compose` gave it; a LabError names the file and the key when it no longer fits the schema."""
    from omegaconf.errors import OmegaConfBaseException

    from lab.schema import Config

    path = Path(path)
    if not path.is_file():
        raise LabError(f"{path}: file not found")
    try:
        return OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.load(path))
    except OmegaConfBaseException as e:
        raise LabError(f"{path}: {schema_problem(e)}") from None


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


@functools.cache
def competition() -> DictConfig:
    """The competition's fixed limits, read from conf/infer/kaggle.yaml (the scoring settings): `max_lora_rank` (the
    largest LoRA rank Kaggle's vLLM loads), `max_tokens` (the completion budget) and `max_model_len` (vLLM's context
    length). Their one home: the checks below, lab.lora, lab.submission and lab.generate read them here."""
    from lab.schema import InferConfig

    return OmegaConf.merge(OmegaConf.structured(InferConfig),
                           OmegaConf.load(project_root() / "conf" / "infer" / "kaggle.yaml"))


# key -> (lower bound, upper bound, bound kind): the ranges the types in lab/schema.py cannot say. Bounds are inclusive
# except where the third field says ">" (strictly above the lower bound); a bound given as a name is that key of
# `competition()`. A key absent from the config is skipped.
CHECKS = {
    "seed": (0, None, ""),
    "sft.batch_size": (1, None, ""), "sft.grad_accum": (1, None, ""),
    "sft.learning_rate": (0, None, ">"), "sft.max_seq_len": (1, None, ""),
    "sft.lora.r": (1, "max_lora_rank", ""), "sft.lora.alpha": (0, None, ">"),
    "sft.save_steps": (1, None, ""), "sft.logging_steps": (1, None, ""),
    "sft.warmup_ratio": (0, 1, ""), "sft.weight_decay": (0, None, ""),
    "grpo.learning_rate": (0, None, ">"), "grpo.max_steps": (1, None, ""),
    "grpo.num_generations": (1, None, ""), "grpo.prompts_per_step": (1, None, ""),
    "grpo.n_prompts": (1, None, ""), "grpo.pass_rate_k": (1, None, ""),
    "grpo.temperature": (0, None, ">"), "grpo.top_p": (0, 1, ">"), "grpo.beta": (0, None, ""),
    "grpo.save_steps": (1, None, ""), "grpo.logging_steps": (1, None, ""),
    "infer.max_tokens": (1, None, ""), "infer.max_model_len": (1, None, ""),
    "infer.batch_size": (1, None, ""), "infer.temperature": (0, None, ""),
    "infer.top_p": (0, 1, ">"), "infer.max_lora_rank": (1, "max_lora_rank", ""),
    "infer.tensor_parallel_size": (1, None, ""),
    "model.max_model_len": (1, None, ""),
    "vote.k": (1, None, ""), "vote.temperature": (0, None, ""), "vote.top_p": (0, 1, ">"),
    "data.val_fraction": (0, 1, ""), "data.explore_max": (1, None, ""),
}


def _problem(value, lo, hi, strict: str) -> str | None:
    # the schema types every value; a NaN (a float all the same) or a hand-built config's odd value still lands here
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return "must be a number"
    if lo is not None and (value <= lo if strict == ">" else value < lo):
        return f"must be {'>' if strict == '>' else '>='} {lo}"
    if hi is not None and value > hi:
        return f"must be <= {hi}"
    return None


def validate(cfg: DictConfig, where: str = "config") -> None:
    """Refuse a config whose values cannot run, before any stage folder is opened: one LabError listing every
    problem (key, value, what it must be). Types are lab/schema.py's (checked as the config is composed or
    loaded); ranges come from `CHECKS`; besides those, `sft.max_steps`
    is -1 (then `sft.epochs` > 0) or >= 1; `data.val_fraction` < 1; `sft.n_train`, `data.n_train` and `data.n_val`
    are null or >= 1; and the paths that must exist do: `data.path` (when the data source reads a file and a path
    is given) and `model.path` when the model is not built here and names a local folder
    (`check_model_path`)."""
    problems = []

    def get(key):
        return OmegaConf.select(cfg, key, default=_ABSENT)

    for key, (lo, hi, strict) in CHECKS.items():
        v = get(key)
        hi = competition()[hi] if isinstance(hi, str) else hi
        if v is not _ABSENT and (why := _problem(v, lo, hi, strict)):
            problems.append(f"{key}={v!r} {why}")
    v = get("sft.max_steps")
    if v is not _ABSENT and v != -1 and (why := _problem(v, 1, None, "")):
        problems.append(f"sft.max_steps={v!r} {why} (or -1: train for sft.epochs)")
    e = get("sft.epochs")
    if v == -1 and e is not _ABSENT and (why := _problem(e, 0, None, ">")):
        problems.append(f"sft.epochs={e!r} {why} (or set sft.max_steps >= 1)")
    if get("data.val_fraction") == 1:
        problems.append("data.val_fraction=1 must be < 1 (nothing left to train on)")
    if (why := run_name_problem(get("run_name"))) is not None:
        problems.append(why)
    for key in ("data.n_train", "data.n_val", "sft.n_train"):
        v = get(key)
        if v not in (_ABSENT, None) and (why := _problem(v, 1, None, "")):
            problems.append(f"{key}={v!r} {why} (or null)")
    if not problems:  # paths only once the values are sane; a /kaggle/ path is checked on Kaggle (kernel builds)
        if get("data.source") == "competition" and get("data.path") not in (_ABSENT, None, "") \
                and not _elsewhere(cfg.data.path):
            try:
                find_data_file(cfg.data.path)
            except LabError as e:
                problems.append(f"data.path: {e}")
        if get("model.build_tiny") is False and not _elsewhere(cfg.model.path):
            try:
                check_model_path(cfg.model.path, hub_cache=False)
            except LabError as e:
                problems.append(f"model.path: {e}")
    if problems:
        raise LabError(f"{where}: " + "; ".join(problems) + " (nothing was run or changed)")


_ABSENT = object()


def run_name_problem(name) -> str | None:
    """Why `run_name` cannot name a run folder, or None: it must be a relative path that stays strictly inside
    outputs/ (`run_dir` defaults to outputs/<run_name>), so `../x`, `/tmp/x`, `a/../..`, `.` and an empty or blank
    name are refused. Any other text, non-ASCII included, is a folder name (a non-ASCII value must be quoted
    on the command line: `compose` says how)."""
    if name is _ABSENT:
        return None
    text = "" if name is None else str(name)
    if not text.strip():
        return (f"run_name={text!r} is empty: the stage folders would land in outputs/ itself; "
                "give the run a name, e.g. run_name=my_run")
    norm = os.path.normpath(os.path.join("outputs", text))
    if os.path.isabs(text) or norm == "outputs" or not norm.startswith("outputs" + os.sep):
        return (f"run_name={text!r} leaves outputs/ (the run would write to {resolve_path(norm)}): a run name is a "
                "folder inside outputs/, e.g. run_name=my_run; to write elsewhere set run_dir=PATH")
    return None


def _non_ascii_problem(overrides: list[str]) -> str | None:
    """A plain message for Hydra's lexer error on an unquoted non-ASCII value (Hydra's override grammar,
    hydra/grammar/OverrideLexer.g4, reads only ASCII in unquoted values), or None."""
    bad = [o for o in overrides if not o.isascii() and "=" in o and o.split("=", 1)[1][:1] not in ("'", '"')]
    if not bad:
        return None
    key, value = bad[0].split("=", 1)
    return (f"{bad[0]!r}: Hydra reads only ASCII letters in an unquoted value; quote it: {key}='{value}' "
            f"(in a shell: \"{key}='{value}'\")")


def _elsewhere(path) -> bool:
    """A path on Kaggle's input or working mount while not on Kaggle: `lab kaggle build` composes it locally."""
    return str(path).startswith("/kaggle/") and not Path("/kaggle").is_dir()


def split_at_dashes(argv: list[str] | None) -> tuple[list[str], list[str]]:
    """A command line (default: sys.argv[1:]) split at the first `--`: (the command's own arguments, the
    Hydra overrides after it)."""
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        return argv, []
    i = argv.index("--")
    return argv[:i], argv[i + 1:]


OVERRIDES_HELP = ("""pass a list of Hydra overrides: in Python overrides = ["seed=7", "run_name=seed7"]; """
                  """with papermill -p overrides '["seed=7", "run_name=seed7"]' or -y 'overrides: [seed=7, run_name=seed7]'""")


def parse_overrides(value: str | Iterable[str] | None) -> list[str]:
    """A notebook's `overrides` parameter as a list of strings.

    papermill's `-p overrides '[...]'` hands the notebook the string itself; it is read as YAML (JSON is
    YAML), and must be a list. A list or tuple is taken as it is; None or an empty string is no override.
    """
    if value is None:
        return []
    if isinstance(value, str):
        import yaml

        text = value.strip()
        if not text:
            return []
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise LabError(f"notebook parameter overrides={text!r}: not a JSON/YAML list ({e}); {OVERRIDES_HELP}") from None
        if not isinstance(value, list):
            raise LabError(f"notebook parameter overrides={text!r}: not a list; {OVERRIDES_HELP}")
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return list(value)
    raise LabError(f"notebook parameter overrides={value!r}: expected a list of strings such as \"seed=7\"; "
                   f"{OVERRIDES_HELP}")


def names_run(overrides: Iterable[str]) -> bool:
    """True when the overrides choose the run folder (`run_name=...` or `run_dir=...`, with or without `+`/`++`)."""
    return any(o.lstrip("+").split("=", 1)[0].strip() in ("run_name", "run_dir") for o in overrides)


TRACKERS = ("none", "tensorboard", "wandb", "mlflow")


def tracker(cfg: DictConfig) -> str:
    """`cfg.report_to`, checked: one of TRACKERS, and its package installed (else a LabError naming the key)."""
    name = (cfg.get("report_to", "none") or "none").strip().lower()
    if name not in TRACKERS:
        raise LabError(f"{project_root() / 'conf' / 'config.yaml'}: report_to={name!r} is not one of "
                       f"{', '.join(TRACKERS)}")
    if name != "none":
        import importlib.util

        if importlib.util.find_spec(name) is None:
            raise LabError(f"{project_root() / 'conf' / 'config.yaml'}: report_to={name} but {name} is not installed "
                           f"(pip install {name})")
    return name


def tracking_args(cfg: DictConfig, stage: str) -> dict[str, Any]:
    """`report_to` (and where its logs go) for a stage's TrainingArguments, from `cfg.report_to` (`tracker`).

    The trackers are transformers' own integrations (transformers/integrations/integration_utils.py),
    imported by the Trainer only when chosen. TensorBoard writes under `<run_dir>/tensorboard/<stage>`
    (`tensorboard --logdir <run_dir>/tensorboard` shows every stage of the run); W&B and MLflow runs are
    named `<run_name>/<stage>`. Everything the Trainer logs goes there, TRL's per-step GRPO metrics too:
    the mean of every reward function (`rewards/<name>/mean`), the zero-variance share
    (`frac_reward_zero_std`), the truncation share (`completions/clipped_ratio`), `grad_norm`.
    """
    name = tracker(cfg)
    if name == "none":
        return {"report_to": "none"}
    if name == "tensorboard":
        # transformers' TensorBoardCallback reads its folder from this variable (TrainingArguments has no
        # logging_dir in transformers 5)
        os.environ["TENSORBOARD_LOGGING_DIR"] = str(resolve_path(cfg.run_dir) / "tensorboard" / stage)
    return {"report_to": name, "run_name": f"{cfg.run_name}/{stage}"}


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and CUDA): `transformers.set_seed` (transformers/trainer_utils.py).

    On CPU it also switches on torch's deterministic algorithms (`torch.use_deterministic_algorithms`):
    the tiny model's SFT gives the same losses and gradient norms with it as without, and GRPO and
    generation run under it (checked by hand; the tests run under it), so it only guards against an op
    without a deterministic kernel. On CUDA it stays off: the Mamba-2 PyTorch path
    (transformers/models/nemotron_h/modeling_nemotron_h.py) takes torch.cumsum of floats, which torch's
    deterministic mode refuses on CUDA (its docstring), so GPU reruns can differ in the last bits.
    A CPU rerun is identical only with the same torch thread count (the order of float sums follows it).
    """
    import torch
    from transformers import set_seed

    set_seed(int(seed), deterministic=not torch.cuda.is_available())
    os.environ.setdefault("PYTHONHASHSEED", str(seed))


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def temp_file(path: Path, suffix: str) -> tuple[int, str]:
    """(fd, name) of a new temporary file beside `path` (its folder made if missing) with the permissions a plain
    `open` would give (mkstemp's are 0600, unreadable to a shared team folder); a folder that cannot be written to
    is a LabError naming it. `atomic_file` (every atomic file write of the lab) and the run lock use it."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
    except OSError as e:
        raise LabError(f"{path}: cannot write here ({e.strerror or e})") from None
    os.chmod(tmp, 0o666 & ~_umask())
    return fd, tmp


def is_main_process() -> bool:
    """False on the ranks > 0 of a distributed launch (torchrun / accelerate set RANK); True otherwise."""
    return os.environ.get("RANK", "0") == "0"


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, suffix: str = ".tmp"):
    """Yield a temporary file's path beside `path` (`temp_file`: the user's normal permissions) to write; when the
    block ends without an error it is renamed to `path` (readers never see half a file), else it is removed. The
    one atomic file writer: text, JSON, CSV, PNG figures, the Kaggle source tarball and submission.zip use it.
    Under a distributed launch only the main process writes: on the other ranks (RANK > 0) the temporary file
    is removed instead of renamed, so the ranks of scripts/train_*.py run the same code and one writes."""
    path = Path(path)
    fd, tmp = temp_file(path, suffix)
    os.close(fd)
    try:
        yield Path(tmp)
        if is_main_process():
            os.replace(tmp, path)
        else:
            Path(tmp).unlink()
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write via a temporary file in the same folder and rename: readers never see half a file."""
    path = Path(path)
    with atomic_file(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    return path


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike):
    """Yield a temporary folder beside `path`; on success it replaces `path` whole, on error it is removed.

    Model and adapter folders are written this way, so a killed run never leaves a half-saved one.
    """
    import shutil

    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}."))
    except OSError as e:
        raise LabError(f"{path}: cannot write here ({e.strerror or e})") from None
    os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700: give the folder the user's normal permissions
    try:
        yield tmp
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")


def atomic_write_csv(path: str | os.PathLike, df) -> Path:
    """CSV without the index; every field quoted when any text holds a lone '\\r' (pandas leaves those unquoted)."""
    import csv

    has_cr = any(df[c].astype(str).str.contains("\r", regex=False).any() for c in df.columns)
    return atomic_write_text(path, df.to_csv(index=False, quoting=csv.QUOTE_ALL if has_cr else csv.QUOTE_MINIMAL))


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def read_json(path: str | os.PathLike) -> Any:
    path = Path(path)
    if not path.is_file():
        raise LabError(f"{path}: file not found")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise LabError(f"{path}: not valid JSON ({e})") from None


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=project_root(), capture_output=True,
                             text=True, timeout=10)
        if out.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=project_root(),
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def package_versions() -> dict[str, str | None]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version("nemotron-reasoning-lab" if name == "lab" else name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def hardware() -> dict[str, Any]:
    import torch

    hw = {"platform": platform.platform(), "python": platform.python_version(),
          "cpu_count": os.cpu_count(), "cuda": torch.cuda.is_available(),
          # the order of float sums follows the thread count: the tiny demo's outcome can change with it
          "torch_threads": torch.get_num_threads()}
    if torch.cuda.is_available():
        hw["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return hw


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


# ---- one writer per run folder ------------------------------------------------------------------

LOCK_FILE = ".lock"
LOCK_ENV = "LAB_RUN_LOCK"  # a driver's lock token, inherited by the notebook kernels it starts
_HELD: dict[Path, str] = {}  # lock file -> token, for the locks this process took


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def acquire_lock(run_dir: str | os.PathLike) -> bool:
    """Take `<run_dir>/.lock` (JSON: pid, host, token, since) so a second run into the same folder refuses.

    Returns True when this call took it (the caller releases it), False when it is already this process's or
    its driver's (the token in $LAB_RUN_LOCK: `python -m lab demo` and sweep jobs hold the lock while papermill
    runs each stage's notebook in a kernel of its own). A lock whose holder is a dead process on this host is
    taken over with a printed note; a live holder, or one on another host (whose process cannot be checked),
    is a LabError naming it. The lock is created with a hard link of a complete file, so a reader never sees
    half of one. Deliberately simple: two processes taking over the same stale lock at the same instant can race.
    """
    import socket
    import sys
    import uuid

    lock = Path(run_dir).resolve() / LOCK_FILE
    host = socket.gethostname()
    for _ in range(3):
        if lock in _HELD and _read_lock(lock).get("token") == _HELD[lock]:
            return True
        token = uuid.uuid4().hex
        fd, tmp = temp_file(lock, ".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps({"pid": os.getpid(), "host": host, "token": token, "since": _now()}))
        try:
            os.link(tmp, lock)
            _HELD[lock] = token
            return True
        except FileExistsError:
            pass
        finally:
            Path(tmp).unlink(missing_ok=True)
        holder = _read_lock(lock)
        if holder.get("token") and holder.get("token") == os.environ.get(LOCK_ENV):
            return False
        pid, where = holder.get("pid"), holder.get("host")
        if where == host and isinstance(pid, int) and not _alive(pid):
            print(f"note: {lock}: taking over a stale lock of process {pid} on {host} (no longer running)",
                  file=sys.stderr, flush=True)
            if _read_lock(lock).get("token") == holder.get("token"):  # not already taken over by another run
                lock.unlink(missing_ok=True)
            continue
        raise LabError(f"{lock}: run folder in use by process {pid} on {where} since {holder.get('since')}; "
                       "one run writes into one folder at a time: wait for it, use another run_name, or delete "
                       "the lock file if that process is gone")
    raise LabError(f"{lock}: could not take the run folder's lock")


def _read_lock(lock: Path) -> dict:
    try:
        d = json.loads(lock.read_text(encoding="utf-8"))
        return d if isinstance(d, dict) else {}
    except (OSError, ValueError):
        return {}


def release_lock(run_dir: str | os.PathLike) -> None:
    """Remove `<run_dir>/.lock` if this process took it."""
    lock = Path(run_dir).resolve() / LOCK_FILE
    token = _HELD.pop(lock, None)
    if token is not None and _read_lock(lock).get("token") == token:
        lock.unlink(missing_ok=True)


def _release_all() -> None:
    for lock in list(_HELD):
        release_lock(lock.parent)


atexit.register(_release_all)


@contextlib.contextmanager
def run_lock(run_dir: str | os.PathLike):
    """Hold the run folder's lock for a driver; the notebooks it runs inherit it through $LAB_RUN_LOCK."""
    took = acquire_lock(run_dir)
    lock = Path(run_dir).resolve() / LOCK_FILE
    before = os.environ.get(LOCK_ENV)
    if took:
        os.environ[LOCK_ENV] = _HELD[lock]
    try:
        yield
    finally:
        if took:
            if before is None:
                os.environ.pop(LOCK_ENV, None)
            else:
                os.environ[LOCK_ENV] = before
            release_lock(run_dir)


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
            problems.append(f"sft.lr_scheduler_type={sched!r} is not one of transformers' schedulers ({', '.join(names)})")
    dtype = OmegaConf.select(cfg, "model.dtype", default=None)
    if dtype not in (None, "auto"):
        import torch

        if not isinstance(getattr(torch, str(dtype), None), torch.dtype):
            problems.append(f"model.dtype={dtype!r} is not a torch dtype (e.g. bfloat16, float32)")
    return problems


class Stage:
    """One notebook's output folder: `<run_dir>/<name>/` with config.yaml, manifest.json, metrics.json.

    Opening a stage seeds everything and records the resolved config; `finish` writes the metrics and the
    completed manifest. A stage works in a fresh folder, `<run_dir>/.<name>.partial/` (`dir`), and `finish`
    swaps it in for `<run_dir>/<name>/` (`final`) only once it is complete, so a stage that dies at any point
    leaves the previous finished result byte for byte as it was (and a first run leaves no stage folder at all).
    While the stage runs, every path of its config that points into `final` (`sft.adapter_dir` in 02_sft, say)
    points into `dir` instead; `finish` points them back; config.yaml always records the final paths.
    Training checkpoints live outside the folder, in `checkpoint_dir` (`<run_dir>/checkpoints/<name>`), so a
    rerun still finds them. The manifest records the content hashes of what the stage read from earlier stages
    and of what it wrote (`lab.lineage`).
    """

    def __init__(self, name: str, overrides: str | Iterable[str] = (), cfg: DictConfig | None = None):
        import shutil

        from lab import lineage

        self.name = name
        self.overrides = parse_overrides(overrides)
        if cfg is None and not names_run(self.overrides) and int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise LabError(f"{name}: several processes (WORLD_SIZE={os.environ['WORLD_SIZE']}) would each make their "
                           "own time-stamped run folder; pass run_name=... so they share one")
        self.cfg = cfg if cfg is not None else compose(self.overrides)
        if cfg is not None:
            validate(cfg, where=f"stage {name}")
        tracker(self.cfg)  # a typo in report_to fails here, not after the stage's first hour
        if problems := library_problems(self.cfg):
            raise LabError(f"stage {name}: " + "; ".join(problems) + " (nothing was run or changed)")
        from lab.console import quiet_known_warnings

        quiet_known_warnings()  # expected library messages become one note each (lab.console)
        self.run_dir = resolve_path(self.cfg.run_dir)
        self.final = self.run_dir / name
        self.dir = self.run_dir / f".{name}.partial"
        self.checkpoint_dir = self.run_dir / "checkpoints" / name
        # before anything in the folder is touched; under `accelerate launch` (torchrun sets RANK) the main
        # process's lock covers the other ranks, which open the same stage after it (scripts/_launch.py)
        main = os.environ.get("RANK", "0") == "0"
        self._own_lock = acquire_lock(self.run_dir) if main else False
        if main:
            self._recover_swap()
            if self.dir.exists():
                shutil.rmtree(self.dir)  # what a stage that died left: never resumed (checkpoints live elsewhere)
        self.dir.mkdir(parents=True, exist_ok=True)
        seed_everything(self.cfg.seed)
        self._t0 = time.time()
        self.manifest = {
            "stage": name, "status": "running", "seed": self.cfg.seed, "overrides": self.overrides,
            "git_commit": git_commit(), "packages": package_versions(), "hardware": hardware(),
            "start_time": _now(), "end_time": None, "wall_seconds": None, "inputs": {},
        }
        atomic_write_text(self.dir / "config.yaml", OmegaConf.to_yaml(self.cfg))
        atomic_write_json(self.dir / "manifest.json", self.manifest)
        self._moved = self._point_into(self.final, self.dir)
        lineage.opened(self)

    def _point_into(self, old: Path, new: Path) -> dict[str, str]:
        """Point every string of `cfg` that is a path inside `old` into `new` instead; {key: previous value}."""
        moved = {}

        def walk(node, prefix):
            for k, v in node.items() if isinstance(node, dict) else ():
                if isinstance(v, dict):
                    walk(v, f"{prefix}{k}.")
                elif isinstance(v, str) and v:
                    p = resolve_path(v)
                    if p == old or old in p.parents:
                        moved[f"{prefix}{k}"] = v
                        OmegaConf.update(self.cfg, f"{prefix}{k}", str(new / p.relative_to(old)), merge=False)
                    elif p == new or new in p.parents:  # left so by an earlier stage on this cfg that did not finish
                        moved[f"{prefix}{k}"] = str(old / p.relative_to(new))

        walk(OmegaConf.to_container(self.cfg, resolve=True), "")
        return moved

    def _recover_swap(self) -> None:
        """Finish undoing what a `finish` killed between its two renames left: the previous result is put back."""
        import shutil

        old = self.run_dir / f".{self.name}.old"
        if old.exists() and not self.final.exists():
            os.replace(old, self.final)
            print(f"note: {self.final}: restored the previous result from {old.name} (a swap was interrupted)")
        elif old.exists():
            shutil.rmtree(old)

    def path(self, *parts: str) -> Path:
        return self.dir.joinpath(*parts)

    def finish(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """Write metrics.json and the finished manifest (with its output hashes) into the stage's fresh folder, then
        swap that folder in for the previous result (rename the old one aside, rename the new one in, delete the
        old one)."""
        import shutil

        from lab import lineage

        wall = round(time.time() - self._t0, 2)
        metrics = {**metrics, "wall_seconds": wall}
        atomic_write_json(self.dir / "metrics.json", metrics)
        self.manifest.update(status="finished", end_time=_now(), wall_seconds=wall, outputs=lineage.outputs(self.dir))
        atomic_write_json(self.dir / "manifest.json", self.manifest)
        if self.dir != self.final:
            old = self.run_dir / f".{self.name}.old"
            if self.final.exists():
                if old.exists():
                    shutil.rmtree(old)
                os.replace(self.final, old)
            os.replace(self.dir, self.final)
            shutil.rmtree(old, ignore_errors=True)
            self.dir = self.final
            for k, v in self._moved.items():
                OmegaConf.update(self.cfg, k, v, merge=False)
        lineage.closed(self)
        if self._own_lock:
            release_lock(self.run_dir)
        return metrics


def stage_output(cfg: DictConfig, stage: str, *parts: str) -> Path:
    """Path to an earlier stage's output; a clear error if that stage has not finished, or is not current
    (`lab.lineage.check`: an output edited since, or an input of it changed by a later rerun upstream). The path is
    recorded as an input of the stage open in this process (`lab.lineage.consumed`)."""
    d = resolve_path(cfg.run_dir) / stage
    if not (d / "metrics.json").is_file():
        raise LabError(f"{d}: stage '{stage}' has no finished output (no metrics.json); run notebooks/{stage}.ipynb "
                       f"with the same run_name (or run_dir) first; a run without run_name gets a new time-stamped "
                       f"folder, so pass e.g. overrides=[\"run_name=demo\"] to continue `make demo`'s run")
    p = d.joinpath(*parts)
    if parts and not p.exists():
        raise LabError(f"{p}: expected output of stage '{stage}' is missing")
    from lab import lineage

    if found := lineage.problems(d.parent, stage):  # still what its manifest recorded, and so are the stages it read
        raise LabError(f"{d}: stage '{stage}' is not current: {'; '.join(found)}")
    lineage.consumed(p)  # an input of the stage open in this process, if any
    return p


def stage_input(cfg: DictConfig, path: str | os.PathLike) -> Path:
    """`path` from the config (an adapter or file a stage reads), resolved. When it lies in a stage folder of this run
    (`<run_dir>/NN_name/...`), that stage must have finished, checked by `stage_output`: after a crashed rerun of
    the stage its older output is not read. A path elsewhere (an adapter from another run) is returned as it is."""
    p = resolve_path(path)
    try:
        rel = p.relative_to(resolve_path(cfg.run_dir))
    except ValueError:
        from lab import lineage

        lineage.consumed(p)  # its content hash, an input of the open stage
        return p
    if rel.parts and re.fullmatch(r"\d\d_\w+", rel.parts[0]):
        return stage_output(cfg, rel.parts[0], *rel.parts[1:])
    return p
