"""Where things are: the project root (conf/ lives there), relative config paths, the competition's data file
(an explicit path, $LAB_DATA, data/, or the Kaggle input mount) and the base model's folder.

What it simplifies: nothing is downloaded; a Hub id counts only when its config.json is in the local cache.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from lab import LabError


PACKAGED_CONF = Path(__file__).resolve().parents[1] / "conf"  # conf/ as an installed wheel ships it (pyproject.toml)


def project_root() -> Path:
    """The folder holding `conf/config.yaml`: $LAB_ROOT, else the checkout this package lives in, else the working
    directory or one above it. An installed package with none of these works in the working directory and composes
    the conf/ it ships (`config_dir`)."""
    env = os.environ.get("LAB_ROOT")
    candidates = [Path(env)] if env else []
    candidates += [Path(__file__).resolve().parents[2], Path.cwd(), *Path.cwd().parents]
    for c in candidates:
        if (c / "conf" / "config.yaml").is_file():
            return c.resolve()
    if (PACKAGED_CONF / "config.yaml").is_file():
        return Path.cwd().resolve()
    raise LabError(f"conf/config.yaml not found (looked in {', '.join(map(str, candidates))}); "
                   "set LAB_ROOT to the lab's checkout")


def config_dir() -> Path:
    """The folder the config is composed from: the project root's conf/, else the copy an installed package ships."""
    own = project_root() / "conf"
    return own if (own / "config.yaml").is_file() else PACKAGED_CONF


def resolve_path(p: str | os.PathLike) -> Path:
    """Relative paths in the config are relative to the project root, not to the caller's cwd."""
    p = Path(os.path.expanduser(str(p)))
    return p if p.is_absolute() else project_root() / p


# Where the competition data and the base model are: here, below the modules that use them, so the
# compose-time check in `validate` needs no import of lab.data.dataset or lab.model.models (they re-export these names).
# $LAB_KAGGLE_ROOT (default /kaggle) lets a test lay out a made-up Kaggle tree
KAGGLE_ROOT = Path(os.environ.get("LAB_KAGGLE_ROOT") or "/kaggle")
KAGGLE_INPUT = KAGGLE_ROOT / "input"
KAGGLE_WORKING = KAGGLE_ROOT / "working"  # what Kaggle keeps of a kernel (its output, 20 GB at most)
COMPETITION_SLUG = "nvidia-nemotron-model-reasoning-challenge"


def kaggle_path(p: str | os.PathLike) -> Path:
    """`p`, with a leading /kaggle standing for the Kaggle tree `KAGGLE_ROOT` (a made-up one under $LAB_KAGGLE_ROOT)."""
    text = str(p)
    if text == "/kaggle" or text.startswith("/kaggle/"):
        return KAGGLE_ROOT / text[len("/kaggle"):].lstrip("/")
    return Path(text)


def elsewhere(path) -> bool:
    """A path on Kaggle's input or working mount while not on Kaggle: `lab kaggle build` composes it locally."""
    return str(path).startswith("/kaggle/") and not Path("/kaggle").is_dir()


def on_kaggle() -> bool:
    """True inside a Kaggle kernel: $KAGGLE_KERNEL_RUN_TYPE set (Kaggle's image sets it) or the input mount present."""
    return bool(os.environ.get("KAGGLE_KERNEL_RUN_TYPE")) or KAGGLE_INPUT.is_dir()


def adapter_dtype(cfg, kaggle: bool | None = None) -> str | None:
    """The dtype 02_sft and 03_grpo save their adapter in (`lab.model.lora.save_adapter`): on Kaggle
    `kaggle.adapter_dtype` (bfloat16 by default: what the submission zip and vLLM compute in, half the bytes of the
    fp32 LoRA weights in the kept 20 GB); elsewhere None, the trained fp32. The resumable checkpoints keep fp32.
    `kaggle`: whether to answer as on Kaggle (None: `on_kaggle()`; lab.plan.output_plan plans for Kaggle)."""
    if not (on_kaggle() if kaggle is None else kaggle):
        return None
    from omegaconf import OmegaConf

    return str(OmegaConf.select(cfg, "kaggle.adapter_dtype", default=None) or "") or None


def checkpoint_root(run_dir: str | os.PathLike, scratch_dir: str | os.PathLike | None) -> Path:
    """Where a run's training checkpoints live: `<run_dir>/checkpoints`, except on Kaggle for a run folder inside
    /kaggle/working, where they go to `<scratch_dir>/<run folder relative to /kaggle/working>/checkpoints`
    (`kaggle.scratch_dir`, /kaggle/temp by default: disk that Kaggle does not keep and does not count against the
    20 GB of /kaggle/working). A stage stopped by its wall-clock budget copies its newest checkpoint back into
    `<run_dir>/checkpoints/<stage>` (`lab.train.checkpoints.keep_for_resume`); the next kernel's install cell puts it
    into the scratch folder again (kaggle_kernel/install_cell.py, RESUME)."""
    run = resolve_path(run_dir)
    if scratch_dir and on_kaggle():
        try:
            rel = run.relative_to(KAGGLE_WORKING)
        except ValueError:
            rel = None
        if rel is not None:
            return kaggle_path(scratch_dir) / rel / "checkpoints"
    return run / "checkpoints"


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
            with contextlib.suppress(LabError):
                tried.append(project_root() / p)
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
    if os.environ.get("KAGGLE_KERNEL_RUN_TYPE") or KAGGLE_INPUT.is_dir():
        found = sorted(p for p in {*KAGGLE_INPUT.glob(f"*/{name}"), *KAGGLE_INPUT.glob(f"*/*/{name}")} if p.is_file())
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
    for cfg_file in sorted(KAGGLE_INPUT.glob("**/config.json")):
        try:
            if json.loads(cfg_file.read_text()).get("model_type") == "nemotron_h":
                return cfg_file.parent
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
    if kaggle_model_dir() is not None:
        return
    if p.startswith((".", "/", "~")) or p.count("/") != 1:  # a path, not a Hub id
        raise LabError(f"{local}: model folder not found (model.path={p!r} is neither a folder nor a Hub id "
                       "'org/name')")
    if not hub_cache:
        return
    from huggingface_hub import try_to_load_from_cache

    if not isinstance(try_to_load_from_cache(p, "config.json"), str):
        raise LabError(f"model.path={p!r}: not a local folder, and the Hub model is not in the local cache "
                       "(nothing is downloaded at run time): download it beforehand (docs/real_model.md) "
                       "or pass its folder as model.path")
