"""Stage lineage: what each stage consumed and produced, as content hashes, and whether a finished stage is current.

A stage (`lab.core.run.Stage`) records in its `manifest.json`:
- `inputs`: the content hash of everything it read from the run: the split folder (`lab.data.dataset.prepare`), and every
  path it took from an earlier stage through `lab.core.run.stage_output` / `stage_input` (an upstream adapter, an
  upstream predictions file, or a whole upstream stage folder), keyed by the path relative to the run folder;
- `outputs`: the content hash of every file it wrote into its own folder (manifest.json aside).

`problems(run_dir, stage)` compares both with what is on disk now: an output that differs is a hand-edit (or a
damaged file); an input that differs means an upstream stage was rerun (or edited) after this one read it; an
upstream stage with problems makes every stage that read it stale too. `lab.core.run.stage_output` / `stage_input`
refuse to read a stage with problems (a LabError), and `lab.runs.pipeline.summary` marks it.

It is also the lab's one home for "what a rerun may trust": `files` (the files of a folder that count),
`content_hash` (the one file hasher: lineage, `lab.model.generate`'s cache keys, `lab.train.checkpoints`' model
fingerprint), `diff` (what changed between a recorded key and the current one: resumed checkpoints, the tiny model's
recipe), and `seal` / `check_seal` (a record, written atomically beside the files it vouches for, of what made them
and their content hashes: the greedy evaluation cache, the token-count cache, a checkpoint's lab_complete.json, a
sweep job's done.json). Nothing is trusted that its seal or its
manifest does not vouch for: a missing, unreadable or unfinished manifest makes a stage not current.

What it simplifies:
1. `content_hash` is memoised per process by path, size and modification time; a file over 1 GiB contributes its
   size and its first and last 64 MiB. This module imports nothing from the lab but `lab.core.io` (which imports
   nothing back), so `lab.core.run` (Stage, stage_output) can use it without an import cycle.
2. A seal or a manifest vouches for content, not for who wrote it: a hand edit that rewrites a file and its record
   consistently is not caught (a damaged or partly edited one is).
3. Files added to a finished stage folder are not flagged, only files changed or removed.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

_OPEN: list = []  # the stage this process has open (lab.core.run.Stage), to which `consumed` records its inputs


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


def opened(stage) -> None:
    _OPEN[:] = [stage]


def closed(stage) -> None:
    if _OPEN and _OPEN[0] is stage:
        _OPEN.clear()


def consumed(path) -> None:
    """Record `path`'s content hash as an input of the open stage (none open, or a path in its own folder: nothing to
    do)."""
    if not _OPEN:
        return
    stage = _OPEN[0]
    p = Path(path).resolve()
    if p.exists() and not any(p.is_relative_to(own.resolve()) for own in (stage.dir, stage.final)):
        stage.manifest.setdefault("inputs", {})[key(stage.run_dir, p)] = content_hash(p)
        if (stage.dir / "manifest.json").is_file():  # the running stage's manifest says what it read so far: a rerun
            from lab.core.io import atomic_write_json  # after a failure compares it (lab.core.run.Stage)

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
