"""Atomic writes: every file or folder a later stage or a rerun trusts is written to a temporary name beside it and
renamed into place, so a reader never sees half of one; under a distributed launch only the main process writes.

What it simplifies: the temporary name lives beside the target (a rename is atomic within one file system only);
the file is fsynced, its folder is not.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from lab import LabError


def _beside(path: Path, make, mode: int, **kw):
    """`make` (tempfile.mkstemp or mkdtemp) beside `path`, its folder made if missing, then given the permissions a
    plain `open` / `mkdir` would give (`mode` less the umask: tempfile's 0600/0700 are unreadable to a shared team
    folder); a folder that cannot be written to is a LabError naming it."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        made = make(dir=path.parent, prefix=f".{path.name}.", **kw)
    except OSError as e:
        raise LabError(f"{path}: cannot write here ({e.strerror or e})") from None
    umask = os.umask(0o022)
    os.umask(umask)
    os.chmod(made[1] if isinstance(made, tuple) else made, mode & ~umask)
    return made


def is_main_process() -> bool:
    """False on the ranks > 0 of a distributed launch (torchrun / accelerate set RANK); True otherwise."""
    return os.environ.get("RANK", "0") == "0"


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, suffix: str = ".tmp"):
    """Yield a temporary file's path beside `path` (`_beside`: the user's normal permissions) to write; when the
    block ends without an error it is renamed to `path` (readers never see half a file), else it is removed. The
    one atomic file writer: text, JSON, CSV, PNG figures, the Kaggle source tarball and submission.zip use it.
    Under a distributed launch only the main process writes: on the other ranks (RANK > 0) the temporary file
    is removed instead of renamed, so the ranks of scripts/train_*.py run the same code and one writes."""
    path = Path(path)
    fd, tmp = _beside(path, tempfile.mkstemp, 0o666, suffix=suffix)
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


MADE_MARKER = ".lab-made"  # in every folder atomic_dir made: the lab may replace that folder, and only such a folder


def made_by_lab(path: str | os.PathLike) -> bool:
    """Whether `path` is a folder `atomic_dir` made (it holds the `MADE_MARKER` file)."""
    return (Path(path) / MADE_MARKER).is_file()


def check_replaceable(path: str | os.PathLike, what: str = "folder") -> None:
    """A LabError unless `path` is absent, an empty folder, or a folder the lab made (`made_by_lab`): the lab never
    deletes a folder it did not make (a half-downloaded model, the user's notes, an adapter from elsewhere)."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return
    if path.is_dir() and not path.is_symlink() and (made_by_lab(path) or not any(path.iterdir())):
        return
    kind = "a file" if path.is_file() else "a link" if path.is_symlink() else "a folder the lab did not make"
    raise LabError(f"{path}: the {what} would be written here, but this is {kind} (no {MADE_MARKER} marker); the lab "
                   "replaces only what it made, so nothing was changed: move it away, or point the setting at "
                   "another path")


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike, what: str = "folder"):
    """Yield a temporary folder beside `path`; on success it replaces `path` whole, on error it is removed.

    Model and adapter folders are written this way, so a killed run never leaves a half-saved one. The folder gets
    the `MADE_MARKER` file; an existing `path` is replaced only when it is empty or has that marker, else a LabError
    names it before anything is written (`check_replaceable`)."""
    path = Path(path)
    check_replaceable(path, what)
    tmp = Path(_beside(path, tempfile.mkdtemp, 0o777))
    try:
        yield tmp
        (tmp / MADE_MARKER).write_text("made by the lab (lab.core.io.atomic_dir): the lab may replace this folder\n",
                                       encoding="utf-8")
        _readable_like_siblings(tmp)
        if path.exists():
            check_replaceable(path, what)  # unchanged since the start, still the lab's
            shutil.rmtree(path)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _readable_like_siblings(folder: Path) -> None:
    """Every file in `folder` at least as readable as a plain `open` would make it (0666 less the umask): safetensors
    0.8 writes its files 0600 (a temporary file renamed), which a shared team folder could not read beside 0644
    siblings."""
    umask = os.umask(0o022)
    os.umask(umask)
    for f in folder.rglob("*"):
        if f.is_file() and not f.is_symlink():
            os.chmod(f, (f.stat().st_mode & 0o7777) | (0o666 & ~umask))


def check_not_input(out: str | os.PathLike, *inputs: str | os.PathLike | None, what: str = "output") -> None:
    """A LabError when the output path `out` is one of the command's `inputs` (the same file, through a link too) or
    lies inside one of them (an input folder): no command writes over what it reads. None inputs are skipped."""
    o = Path(out).expanduser().resolve()
    for i in inputs:
        if i is None or str(i) == "":
            continue
        p = Path(i).expanduser().resolve()
        same = o == p or (o.exists() and p.exists() and os.path.samefile(o, p))
        if same or (p.is_dir() and o.is_relative_to(p)):
            where = "is" if same else "lies inside"
            raise LabError(f"{out}: the {what} {where} {i}, which this command reads; it would be written over, so "
                           "nothing was written: choose another output path")


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")


def atomic_write_csv(path: str | os.PathLike, df) -> Path:
    """CSV without the index; every field quoted when any text holds a lone '\\r' (pandas leaves those unquoted)."""
    has_cr = any(df[c].astype(str).str.contains("\r", regex=False).any() for c in df.columns)
    return atomic_write_text(path, df.to_csv(index=False, quoting=csv.QUOTE_ALL if has_cr else csv.QUOTE_MINIMAL))


def _json_default(o):
    if isinstance(o, (np.integer, np.floating)):
        return o.item()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def read_json(path: str | os.PathLike, kind: type | None = None) -> Any:
    """The JSON in `path`; a LabError naming the file when it is missing, unreadable, not JSON, or (with `kind`, e.g.
    dict) not a value of that type (`null` or `[]` where an object belongs)."""
    path = Path(path)
    if not path.is_file():
        raise LabError(f"{path}: file not found")
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:  # JSONDecodeError, or UnicodeDecodeError
        raise LabError(f"{path}: not valid JSON ({e})") from None
    except OSError as e:
        raise LabError(f"{path}: cannot be read ({e.strerror or e})") from None
    if kind is not None and not isinstance(value, kind):
        want = {dict: "an object ({...})", list: "a list ([...])"}.get(kind, kind.__name__)
        raise LabError(f"{path}: holds {json.dumps(value)[:40]}, not {want}: damaged or hand-edited; rerun what "
                       "wrote it")
    return value
