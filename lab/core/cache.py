"""Content-keyed caches: a result kept under the key of what made it, reused only while that key still holds.

Two forms. A sealed file (`entry` names it by the key's digest; `store` writes it atomically, then its seal;
`load` trusts it only when the seal holds the same key and the file's content hash, `lineage.check_seal`): the
greedy evaluations and the estimate's counts. A keyed log (JSON lines, the key first; `read_log`, `write_log`,
`append_log`), appended to as results come so a killed run keeps what it finished: the sample tables.
Anything the key does not vouch for is made again, with a note saying why.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from lab.core import lineage
from lab.core.io import atomic_write_text


def digest(key: dict, n: int = 16) -> str:
    """The first `n` hex digits of the sha256 of `key` as sorted JSON (values JSON cannot hold: their str)."""
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:n]


def entry(folder: str | Path, key: dict, prefix: str = "", suffix: str = ".json", n: int = 16) -> Path:
    """Where the result made with `key` is kept: `<folder>/<prefix><digest><suffix>`."""
    return Path(folder) / f"{prefix}{digest(key, n)}{suffix}"


def seal_of(path: str | Path) -> Path:
    """The seal beside a cached file: `x.csv` -> `x.seal.json`."""
    return Path(path).with_suffix(".seal.json")


def load(path: str | Path, key: dict, what: str) -> Path | None:
    """`path` when its seal vouches for it under `key`, else None; a note names why when a file or seal was there
    but is not trusted (`what`: the cache's name in it)."""
    path = Path(path)
    try:
        lineage.check_seal(seal_of(path), json.loads(json.dumps(key, default=str)))
    except lineage.Unsealed as e:
        if path.exists() or seal_of(path).exists():
            print(f"note: {what} cache not reused: {e}; making it again", flush=True)
        return None
    return path


def store(path: str | Path, key: dict) -> Path:
    """Seal `path`, already written in full (atomically), as made with `key`; the seal last, so a seal present means
    the file was complete."""
    lineage.seal(seal_of(path), json.loads(json.dumps(key, default=str)), [path])
    return Path(path)


def read_log(path: str | Path, key: dict, what: str) -> tuple[list[dict], bool]:
    """(records, clean) of a keyed log: its records when its first line is `{"key": key}` (a line cut short by a kill
    is left out), none when it is missing or was made with another key (a note names the keys that differ; `what`
    says what happens instead). `clean`: the file holds exactly that key line and those records."""
    path = Path(path)
    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    if not lines:
        return [], False
    head = _parse(lines[0])
    old = head.get("key") if isinstance(head, dict) else None
    if old != key:
        changed = sorted(k for k in set(old) | set(key) if old.get(k) != key.get(k)) if isinstance(old, dict) else []
        print(f"note: {path}: made with other settings ({', '.join(changed) if changed else 'no key line'}); "
              f"its {len(lines) - 1} line(s) are not reused, {what}", flush=True)
        return [], False
    records = [r for r in map(_parse, lines[1:]) if r is not None]
    return records, len(records) == len(lines) - 1


def write_log(path: str | Path, key: dict, records: list[dict]) -> None:
    """Rewrite a keyed log atomically: the key line, then `records`."""
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in [{"key": key}, *records]))


def append_log(path: str | Path, records: list[dict]) -> None:
    """Append `records` to a keyed log (each a whole line: a kill cuts at most the last one short)."""
    with open(path, "a", encoding="utf-8") as f:
        f.write("".join(json.dumps(r) + "\n" for r in records))


def _parse(line: str):
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return None
