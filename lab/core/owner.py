"""Who owns a path the lab is about to write: the one place that decides, before anything is written.

The lab writes only
- inside a run folder it made: a folder holding `RUN_MARKER` (`claim_run` makes it in a new or empty folder), where
  the nearest marker above the path is this run's own (run folders do not nest);
- to a path the user named as a command's output or in the config, when that path is new (absent or empty), or is
  a folder the lab made for the same command (`output_dir`'s marker);
and never over a file git tracks in the repository, into another run's folder, or into a folder holding files it did
not make, unless the user says so: `--force` on a command, `overwrite=true` in the config, named in each refusal.
Even then a folder the lab replaces whole keeps `lab.core.io.atomic_dir`'s rule (only one the lab made).

What it simplifies: a run's identity is its folder (the nearest marker above a path); a copied run folder is its own
run. Ownership is checked when a command or stage starts, not again at each file it writes.
"""

from __future__ import annotations

import errno
import json
import os
import shlex
import subprocess
import uuid
from pathlib import Path

from lab import LabError
from lab.core.io import MADE_MARKER, atomic_write_json, check_not_input, made_by_lab
from lab.core.paths import elsewhere, find_data_file, project_root, resolve_path

RUN_MARKER = ".lab-run"  # in every run folder the lab made: {"run_id", "run_name"}
LOCK_FILE = ".lock"  # a run folder's lock (lab.core.run.acquire_lock): a folder holding only it is still new
NAME_MAX = 255  # bytes in one path component on Linux, macOS and Windows file systems (os.pathconf PC_NAME_MAX)
SOURCE_FOLDERS = ("lab", "conf", "notebooks", "tests", "scripts", "bench", "docs", ".git")


def run_of(path: str | os.PathLike) -> Path | None:
    """The run folder `path` lies in (itself included): the nearest folder above it holding `RUN_MARKER`, or None."""
    p = Path(path).resolve()
    return next((d for d in (p, *p.parents) if (d / RUN_MARKER).is_file()), None)


def tracked(path: str | os.PathLike) -> list[str]:
    """The files git tracks at or under `path` (relative to the project root); [] outside the repository, or where
    it is no git checkout (an installed wheel)."""
    p, root = Path(path).resolve(), project_root()
    if not p.is_relative_to(root):
        return []
    try:
        out = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--", str(p.relative_to(root)) or "."],
                             capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return []
    return [f for f in out.stdout.decode(errors="replace").split("\0") if f] if out.returncode == 0 else []


def _name_problem(p: Path) -> str | None:
    long = next((part for part in p.parts if len(part.encode()) > NAME_MAX), None)
    return None if long is None else (f"the folder name {long[:40]}... is {len(long.encode())} bytes long, over the "
                                      f"{NAME_MAX} a file system allows; choose a shorter name")


def _empty(p: Path) -> bool:
    return p.is_dir() and not p.is_symlink() and not any(p.iterdir())


def run_dir_problems(cfg) -> list[str]:
    """Why `cfg`'s run folder (or split folder) may never be written, found at compose before anything is touched
    (`lab.core.config.validate`): it holds the repository (`run_dir=.`), lies inside one of its source folders, holds
    the data file it reads (`run_dir=.` or `data.split_dir=data` would write the split over data/train.csv), or has
    a folder name too long for the file system."""
    from omegaconf import OmegaConf

    problems = []
    run = resolve_path(cfg.run_dir).resolve()
    root = project_root()
    # as the user set it: run_name=NAME alone gives the default run_dir outputs/NAME, a key they never typed
    named = (f"run_name={cfg.run_name!r} (run_dir {cfg.run_dir!r})" if str(cfg.run_dir) == f"outputs/{cfg.run_name}"
             else f"run_dir={cfg.run_dir!r}")
    if root.is_relative_to(run):
        problems.append(f"{named} ({run}) holds the lab's own sources ({root}): the stages would "
                        "write their folders, notebooks and split among them; choose a folder of its own, e.g. "
                        "run_dir=outputs/NAME (or run_name=NAME)")
    elif inside := next((root / f for f in SOURCE_FOLDERS if run.is_relative_to(root / f)), None):
        problems.append(f"{named} ({run}) is inside the repository's {inside.name}/ folder; choose a "
                        "folder of its own, e.g. run_dir=outputs/NAME (or run_name=NAME)")
    if why := _name_problem(run):
        problems.append(f"{named}: {why}")
    if cfg.data.source == "competition" and not elsewhere(cfg.data.path or ""):
        try:
            data = find_data_file(cfg.data.path).resolve()
        except LabError:
            data = None  # no file yet: the data stage says where it looked
        split = resolve_path(cfg.data.split_dir).resolve()
        for key, folder in (("run_dir", run), ("data.split_dir", split)):
            if data is not None and data.is_relative_to(folder):
                problems.append(f"{named if key == 'run_dir' else f'{key}={OmegaConf.select(cfg, key)!r}'} "
                                f"({folder}) holds the data file it reads "
                                f"({data}): the split would be written over it; choose a folder of its own, e.g. "
                                "run_dir=outputs/NAME")
                break
    return problems


def _writable(folder: Path) -> None:
    if folder.is_dir() and not os.access(folder, os.W_OK | os.X_OK):
        raise LabError(f"{folder}: this folder is read-only for you (its permissions), so nothing was written: make it "
                       "writable (chmod u+w) or choose another folder")


def claim_run(run_dir: str | os.PathLike, run_name: str | None = None, overwrite: bool = False,
              made_for_it: tuple[str, ...] = (), write: bool = True) -> Path:
    """Make `run_dir` this command's run folder, or refuse before anything is written: it must be a run folder the lab
    made (`RUN_MARKER`), or new or empty (the marker is written then). A folder holding files the lab did not make
    (a project folder with its own data/ and notebooks/) is refused unless `overwrite` (`overwrite=true`): then it is
    taken over, and the stages write their files into it. A run inside another run's folder, or a folder holding
    another run, is refused always: run folders do not nest. `made_for_it`: names in the folder that the calling
    command made for this run (Hydra's `.hydra/` and `job.log` in a sweep's job folder). `write=False`: check only,
    write no marker (a stage checks its other paths before anything is made). Returns the resolved folder."""
    run = resolve_path(run_dir).resolve()
    if why := _name_problem(run):
        raise LabError(f"run_dir {run}: {why} (nothing was written)")
    if (outer := run_of(run.parent)) is not None:
        raise LabError(f"run_dir {run} lies inside the run folder {outer} (it holds {RUN_MARKER}): run folders do not "
                       "nest, and that run's stages would read or delete this one; choose a folder outside it, "
                       "e.g. run_dir=outputs/NAME (nothing was written)")
    if run.is_dir() and (inner := next((m.parent for m in _markers_below(run)), None)) is not None:
        raise LabError(f"run_dir {run} holds the run folder {inner}: run folders do not nest; choose a folder of its "
                       "own, e.g. run_dir=outputs/NAME (nothing was written)")
    if (run / RUN_MARKER).is_file():
        _writable(run)
        return run
    if run.exists() and not (run.is_dir() and {p.name for p in run.iterdir()} <= {LOCK_FILE, *made_for_it}):
        if not run.is_dir():
            raise LabError(f"run_dir {run} is a file, not a folder; choose another run_dir (nothing was written)")
        if not overwrite:
            have = ", ".join(sorted(p.name for p in run.iterdir())[:5])
            raise LabError(f"run_dir {run} holds files the lab did not make ({have}) and no {RUN_MARKER} marker: the "
                           "stages would write their folders, split and notebooks among them, so nothing was written; "
                           "choose a new folder (run_dir=outputs/NAME), or pass overwrite=true to make this folder a "
                           "run folder and let the stages write over files of the same names")
        if files := tracked(run):
            raise LabError(f"run_dir {run} holds files git tracks ({', '.join(files[:3])}): a run never writes over "
                           "the repository, overwrite=true or not; choose a folder of its own (nothing was written)")
    existing = next((d for d in (run, *run.parents) if d.exists()), run)
    _writable(existing)
    if not write:
        return run
    try:
        run.mkdir(parents=True, exist_ok=True)
        atomic_write_json(run / RUN_MARKER, {"run_id": uuid.uuid4().hex, "run_name": run_name,
                                             "made_by": "lab.core.owner.claim_run: this folder is a lab run folder"})
    except (OSError, LabError) as e:
        raise LabError(f"run_dir {run}: cannot be written ({getattr(e, 'strerror', None) or e}); make it writable "
                       "or choose another folder (nothing was written)") from None
    return run


def _markers_below(folder: Path, depth: int = 3):
    """`RUN_MARKER` files up to `depth` folders below `folder` (not its own)."""
    for d in range(1, depth + 1):
        yield from folder.glob("/".join(["*"] * d) + "/" + RUN_MARKER)


def check_run_folder(run_dir: str | os.PathLike, what: str, force: bool = False) -> Path:
    """A command that writes into an existing run folder (`summary`): `run_dir` must be one the lab made (its
    `RUN_MARKER`), unless `force`, which takes it over (marker written)."""
    run = resolve_path(run_dir).resolve()
    if not run.is_dir():
        raise LabError(f"{run}: run directory not found")
    if (run / RUN_MARKER).is_file():
        _writable(run)
        return run
    if not force:
        raise LabError(f"{run}: not a run folder the lab made (no {RUN_MARKER} marker); {what} would be written into "
                       "it, so nothing was written: pass a run folder, e.g. outputs/demo, or --force to write there "
                       "anyway")
    return claim_run(run, overwrite=True)


def config_output(cfg, key: str, path: str | os.PathLike | None = None) -> Path:
    """A path of the config that a stage writes (`key`: sft.adapter_dir, data.split_dir, model.path), checked: inside
    this run's folder (`cfg.run_dir`, nearest marker) it may be written; anywhere else (another run's folder, a
    folder of the user's, the repository) only when new or empty, unless `overwrite=true`. `path`: the path when it
    is derived from the key (the drills adapter beside sft.adapter_dir)."""
    from omegaconf import OmegaConf

    p = resolve_path(path if path is not None else OmegaConf.select(cfg, key)).resolve()
    run = resolve_path(cfg.run_dir).resolve()
    owner = run_of(p)
    if owner == run or not (p.exists() or p.is_symlink()) or _empty(p):
        if owner not in (None, run) and not OmegaConf.select(cfg, "overwrite", default=False):
            raise LabError(f"{key}={p} lies inside another run's folder {owner}: that run's stages own it, and its "
                           "later stages would no longer be current; point it into this run "
                           f"({run}) or a new folder, or pass overwrite=true (nothing was written)")
        if why := _name_problem(p):
            raise LabError(f"{key}={p}: {why} (nothing was written)")
        return p
    if OmegaConf.select(cfg, "overwrite", default=False):
        if files := tracked(p):
            raise LabError(f"{key}={p} holds files git tracks ({', '.join(files[:3])}): the lab never writes over the "
                           "repository; choose another path (nothing was written)")
        return p
    where = f"inside another run's folder {owner}" if owner is not None else f"outside this run's folder {run}"
    kind = "a folder the lab made" if made_by_lab(p) else "a file" if p.is_file() else "a folder the lab did not make"
    raise LabError(f"{key}={p} already exists ({kind}, {where}): the lab writes there only when it is new; point it "
                   f"at a new path, or pass overwrite=true to replace it (nothing was written)")


# The paths of the config each stage writes besides its own folder (`Stage` checks them with `config_output`).
STAGE_WRITES = {"01_explore": ("data.split_dir",), "02_sft": ("sft.adapter_dir",), "03_grpo": ("grpo.adapter_dir",)}


def check_stage_outputs(cfg, stage: str) -> None:
    """Every path `stage` writes outside its own folder (`STAGE_WRITES`, the drills adapter beside sft.adapter_dir, a
    tiny model still to be built at model.path) through `config_output`."""
    from omegaconf import OmegaConf

    for key in STAGE_WRITES.get(stage, ()):
        config_output(cfg, key)
    if stage == "02_sft" and "drills" in (OmegaConf.select(cfg, "sft.phases", default=None) or []):
        config_output(cfg, "sft.adapter_dir (its drills_adapter)",
                      resolve_path(cfg.sft.adapter_dir).parent / "drills_adapter")
    if cfg.model.build_tiny and not (resolve_path(cfg.model.path) / "config.json").is_file():
        config_output(cfg, "model.path")


def output_file(path: str | os.PathLike, command: str, force: bool = False, inputs=(), what: str = "output") -> Path:
    """A file a command writes where the user named it (`command`: how to name it in the refusal, e.g. `estimate
    --json`). Refused when it is one of the command's `inputs` (always), or, unless `force`, when it exists, is a file
    git tracks, or lies inside a run folder (that run's stages own it). Returns the resolved path."""
    p = resolve_out(path)
    check_not_input(p, *inputs, what=what)
    if p.is_dir():
        raise LabError(f"{path}: the {what} of `{command}` is a folder; name a file (nothing was written)")
    if why := _name_problem(p):
        raise LabError(f"{path}: {why} (nothing was written)")
    if not force:
        if tracked(p):
            raise LabError(f"{path}: the {what} of `{command}` would replace a file git tracks in the repository; "
                           "choose another path, or pass --force to replace it (nothing was written)")
        if p.exists() or p.is_symlink():
            raise LabError(f"{path}: the {what} of `{command}` already exists; the lab writes only a new file there, "
                           "so nothing was written: choose another path, or pass --force to replace it")
        if (owner := run_of(p.parent)) is not None:
            raise LabError(f"{path}: the {what} of `{command}` lies inside the run folder {owner}, which that run's "
                           "stages own; choose a path outside it, or pass --force (nothing was written)")
    _writable(next((d for d in p.parents if d.exists()), p.parent))
    return p


def output_dir(path: str | os.PathLike, command: str, force: bool = False) -> Path:
    """A folder a command fills (`kaggle build --out`, `kaggle dataset --out`, a sweep's folder): it must be new or
    empty, or a folder the lab made for the same `command` (its `MADE_MARKER` names the command); refused, unless
    `force`, when it holds anything else, holds files git tracks, or lies inside a run folder. The folder is made and
    marked; returns it resolved."""
    p = resolve_out(path)
    if why := _name_problem(p):
        raise LabError(f"{path}: {why} (nothing was written)")
    if p.exists() and not p.is_dir():
        raise LabError(f"{path}: the folder of `{command}` is a file; name a folder (nothing was written)")
    mine = _made_for(p) == command
    if not force:
        if files := tracked(p):
            raise LabError(f"{path}: the folder of `{command}` holds files git tracks ({', '.join(files[:3])}); the "
                           "lab never writes over the repository: choose another folder, or pass --force "
                           "(nothing was written)")
        if (owner := run_of(p)) is not None:
            raise LabError(f"{path}: the folder of `{command}` lies inside the run folder {owner}, which that run's "
                           "stages own; choose a folder outside it, or pass --force (nothing was written)")
        if p.exists() and not mine and not _empty(p):
            made = _made_for(p)
            kind = f"made by the lab for `{made}`" if made else f"holding files the lab did not make (no {MADE_MARKER})"
            raise LabError(f"{path}: the folder of `{command}` already exists, {kind}; the lab fills only a new folder "
                           "or its own from the same command, so nothing was written: choose another folder, or pass "
                           "--force to write into it")
    _writable(next((d for d in (p, *p.parents) if d.exists()), p))
    try:
        p.mkdir(parents=True, exist_ok=True)
        if not mine:
            atomic_write_json(p / MADE_MARKER, {"command": command, "made_by": "lab.core.owner.output_dir"})
    except OSError as e:
        raise LabError(f"{path}: cannot be written ({e.strerror or e}); choose another folder") from None
    return p


def _made_for(folder: Path) -> str | None:
    """The command `output_dir` marked `folder` for, or None (no marker, or `atomic_dir`'s plain one)."""
    try:
        return json.loads((folder / MADE_MARKER).read_text(encoding="utf-8")).get("command")
    except (OSError, ValueError, AttributeError):
        return None


def resolve_out(path: str | os.PathLike) -> Path:
    """A command's output path as the user typed it: relative to the working directory (unlike config paths)."""
    return Path(os.path.abspath(os.path.expanduser(str(path))))


def quote_command(*words) -> str:
    """A command line to print for pasting into a shell: every word quoted (`shlex.quote`), so a path holding
    `;` or spaces stays one word."""
    return " ".join(shlex.quote(str(w)) for w in words)


def os_error(e: OSError, where: str | os.PathLike) -> LabError:
    """An OSError while writing `where`, as one sentence."""
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return LabError(f"{where}: not writable ({e.strerror}); make it writable or choose another folder")
    if e.errno == errno.ENAMETOOLONG:
        return LabError(f"{where}: a name in this path is too long for the file system; choose a shorter one")
    return LabError(f"{where}: cannot be written ({e.strerror or e})")
