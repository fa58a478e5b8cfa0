"""Stage lineage: what each stage consumed and produced, as content hashes, and whether a finished stage is current.

A stage's `manifest.json` records `inputs` (the content hash of everything it read from the run: the split, and every
path taken from an earlier stage through `lab.core.run.stage_output` / `stage_input`) and `outputs` (every file it
wrote). `problems(run_dir, stage)` compares both with the disk: an edited output, or an input changed by a rerun
upstream, makes the stage not current, and `stage_output` refuses to read it.

It is also the lab's one home for what a rerun may trust: `content_hash` (the one file hasher), `model_hash` and
`lora_checksum` (the weights a generation comes from), `diff` (what changed between two keys), and `seal` /
`check_seal` (a record, written after the files it vouches for, of what made them and their hashes).
The one piece of process state is the stage open in this process (`opened`, `closed`, `open_stage`), to which
`consumed` records an input; docs/internals.md says what this simplifies.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

_HASHES: dict[tuple, str] = {}
_WHOLE = 1 << 30  # files up to 1 GiB are hashed whole
_PART = 64 << 20  # of larger ones, the first and last 64 MiB


def files(folder: str | Path, skip: tuple[str, ...] = ()) -> dict[str, Path]:
    """{relative posix name: path} of every file under `folder`, in sorted order; hidden files and folders, and
    files named in `skip`, left out."""
    folder = Path(folder)
    found = ((p.relative_to(folder), p) for p in sorted(folder.rglob("*")) if p.is_file() and p.name not in skip)
    return {rel.as_posix(): p for rel, p in found if not any(part.startswith(".") for part in rel.parts)}


def diff(old, new, prefix: str = "") -> list[str]:
    """`key: old -> new` for every leaf that differs between two nested dicts (a key absent on one side: <absent>)."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [line for k in sorted(set(old) | set(new), key=str)
                for line in diff(old.get(k, "<absent>"), new.get(k, "<absent>"), f"{prefix}{k}.")]
    return [] if json.dumps(old, sort_keys=True) == json.dumps(new, sort_keys=True) \
        else [f"{prefix[:-1]}: {old!r} -> {new!r}"]


def content_hash(path: str | Path) -> str:
    """sha256 over a file, or over a folder's `files` (relative names, sizes and each file's sha256, in sorted
    order); files over 1 GiB contribute their first and last 64 MiB. Memoised per process by path, size and
    modification time."""
    path = Path(path)
    h = hashlib.sha256()
    for f in ([path] if path.is_file() else files(path).values()):
        st = f.stat()
        memo = (str(f.resolve()), st.st_size, st.st_mtime_ns)
        if memo not in _HASHES:
            with open(f, "rb") as fd:
                if st.st_size <= _WHOLE:
                    fh = hashlib.file_digest(fd, "sha256")
                else:
                    fh = hashlib.sha256(fd.read(_PART))
                    fd.seek(st.st_size - _PART)
                    fh.update(fd.read(_PART))
            _HASHES[memo] = fh.hexdigest()
        h.update(f"{f.relative_to(path) if f != path else f.name}\0{st.st_size}\0{_HASHES[memo]}\n".encode())
    return h.hexdigest()


def model_hash(path: str) -> str:
    """A local model folder's `content_hash`; for a Hub id, the commit of its snapshot in the local Hub cache."""
    if os.path.isdir(path):
        return content_hash(path)
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(path, "config.json")
    return f"hub:{Path(found).parent.name}" if isinstance(found, str) else f"hub:{path}"


def lora_checksum(model, trainable: bool = False) -> str:
    """sha256 over an in-memory model's LoRA tensors (names containing `lora_`; with `trainable`, the tensors that
    require grad instead), names and bytes, on CPU: tells two adapters apart exactly."""
    import torch

    h = hashlib.sha256()
    for n, p in model.named_parameters():
        if (p.requires_grad if trainable else "lora_" in n):
            h.update(n.encode())
            h.update(p.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def key(run_dir: Path, path: Path) -> str:
    """How a path is named in a manifest: relative to the run folder when inside it, else absolute."""
    try:
        return Path(path).resolve().relative_to(Path(run_dir).resolve()).as_posix()
    except ValueError:
        return str(Path(path).resolve())


def stage_of(k: str) -> str | None:
    """The stage folder a manifest key lies in (`02_sft/adapter` -> `02_sft`), or None."""
    first = k.split("/", 1)[0]
    return first if re.fullmatch(r"\d\d_\w+", first) else None


# ---- the stage open in this process: `lab.core.run.Stage` opens and closes it, `consumed` records into it --------

_open_stage = None  # the one `lab.core.run.Stage` open in this process, or None


def opened(stage) -> None:
    """Make `stage` the stage open in this process (`lab.core.run.Stage` when it starts)."""
    global _open_stage
    _open_stage = stage


def closed(stage) -> None:
    """No stage open any more, if `stage` was the open one (`Stage.finish`, or a test's failed attempt)."""
    global _open_stage
    if _open_stage is stage:
        _open_stage = None


def open_stage():
    """The stage open in this process (`opened`), or None."""
    return _open_stage


def consumed(path) -> None:
    """Record `path` as an input of the stage open in this process (`record_input`); none open: nothing to do."""
    if _open_stage is not None:
        record_input(_open_stage, path)


def record_input(stage, path) -> None:
    """Add `path`'s content hash to `stage`'s manifest inputs (a path in its own folder: nothing to do) and rewrite
    the running manifest, so a rerun after a failure can compare what the attempt read (`lab.core.run.Stage`)."""
    p = Path(path).resolve()
    if p.exists() and not any(p.is_relative_to(own.resolve()) for own in (stage.dir, stage.final)):
        stage.manifest.setdefault("inputs", {})[key(stage.run_dir, p)] = content_hash(p)
        if (stage.dir / "manifest.json").is_file():
            from lab.core.io import atomic_write_json

            atomic_write_json(stage.dir / "manifest.json", stage.manifest)


def outputs(folder: Path) -> dict[str, str]:
    """{relative path: content hash} of every file in a stage folder except manifest.json and hidden files."""
    return {k: content_hash(p) for k, p in files(folder, skip=("manifest.json",)).items()}


class Unsealed(Exception):
    """`check_seal`'s refusal: why the sealed files cannot be trusted (the caller makes them again or refuses)."""


def seal(record: str | Path, key: dict, paths) -> None:
    """Write `record` (JSON, atomically): `key` (what made the files) and the content hash of each of `paths`, named
    relative to the record's folder. Written after the files: a record present means they were complete."""
    from lab.core.io import atomic_write_json

    record = Path(record)
    base = record.parent.resolve()
    atomic_write_json(record, {"key": key, "sha256": {Path(p).resolve().relative_to(base).as_posix(): content_hash(p)
                                                     for p in paths}})


def check_seal(record: str | Path, key: dict | None = None) -> dict:
    """The `key` and {name: content hash} that `record` (`seal`) vouches for, after checking that it is readable,
    was made with `key` (None: any key) and that every file it names is still there with that hash; `Unsealed`
    naming the first problem otherwise."""
    record = Path(record)
    try:
        data = json.loads(record.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise Unsealed(f"{record}: missing") from None
    except (OSError, ValueError) as e:
        raise Unsealed(f"{record}: unreadable ({type(e).__name__})") from None
    if not (isinstance(data, dict) and isinstance(data.get("sha256"), dict)):
        raise Unsealed(f"{record}: not a seal (no content hashes)")
    if key is not None and json.dumps(data.get("key"), sort_keys=True) != json.dumps(key, sort_keys=True):
        changed = diff(data.get("key"), key)
        raise Unsealed(f"{record}: made with other settings ({'; '.join(changed[:3]) or 'another key'})")
    for name, h in data["sha256"].items():
        p = record.parent / name
        if not p.is_file():
            raise Unsealed(f"{p}: missing, though {record.name} vouches for it")
        if content_hash(p) != h:
            raise Unsealed(f"{p}: changed since {record.name} sealed it (hand-edited or damaged)")
    return data


def _manifest(d: Path) -> dict | None:
    try:
        m = json.loads((d / "manifest.json").read_text(encoding="utf-8"))
        return m if isinstance(m, dict) else None
    except (OSError, ValueError):
        return None


def problems(run_dir: Path, name: str, memo: dict | None = None) -> list[str]:
    """Why the finished stage `name` of `run_dir` is no longer what its manifest recorded (empty: it is current)."""
    memo = {} if memo is None else memo
    if name in memo:
        return memo[name]
    memo[name] = []  # a cycle (never written by the lab) ends here
    run_dir = Path(run_dir)
    man = _manifest(run_dir / name)
    if man is None or man.get("status") != "finished" or not isinstance(man.get("outputs"), dict):
        why = ("missing or unreadable" if man is None else f"status {man.get('status')!r}, not finished"
               if man.get("status") != "finished" else "without the hashes of its outputs")
        memo[name] = [f"{name}: {run_dir / name / 'manifest.json'} is {why}, so nothing in {name} can be checked; "
                      f"rerun {name}"]
        return memo[name]
    out = []
    recorded, now = man["outputs"], outputs(run_dir / name)
    edited = [k for k in sorted(recorded) if now.get(k) != recorded[k]]
    if edited:
        out.append(f"{name}: {', '.join(edited[:5])}{' ...' if len(edited) > 5 else ''} changed or removed after "
                   f"the stage finished ({man.get('end_time')}): hand-edited or damaged; rerun {name}")
    changed: dict[str, list[str]] = {}  # upstream stage (or the input itself) -> what changed there
    read_from: set[str] = set()
    for k, h in sorted(man.get("inputs", {}).items(), key=lambda kv: (stage_of(kv[0]) == kv[0], kv[0])):
        p, up = run_dir / k, stage_of(k)  # an absolute key (outside the run) stays itself and lies in no stage
        what = f"all of {k}" if up == k else k
        if not p.exists():
            changed.setdefault(up or k, []).append(f"{what} (now missing)")
        elif content_hash(p) != h:
            changed.setdefault(up or k, []).append(what)
        elif up and up != name:
            read_from.add(up)
    for src, what in changed.items():
        m = _manifest(run_dir / src) if stage_of(src) == src else None
        why = f": {src} was rerun or edited after it (finished at {m.get('end_time')})" if m else ""
        out.append(f"{name} read {', '.join(what)}, which changed since{why}; rerun {name}")
    for up in sorted(read_from - set(changed)):
        if problems(run_dir, up, memo):
            out.append(f"{name} read {up}, which is not current itself; rerun {up}, then {name}")
    memo[name] = out
    return out
