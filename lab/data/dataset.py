"""Loading, validating and splitting the competition's puzzle files; the data mix SFT trains on.

`load_puzzles` reads a file with every value kept byte for byte as a string (`01010001` keeps its zeros, `NA` stays
`NA`) and stops with a `LabError` naming the file, the row (spreadsheet numbering: the header is row 1) and the
problem; `split` makes a seeded held-out set stratified by category, written and re-read with content hashes
(`prepare`), so a later stage can prove it trains and evaluates on exactly the puzzles the split named. Why the
file is read with Python's `csv` and the other deliberate choices: docs/internals.md.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lab import LabError
from lab.core.io import atomic_write_csv, atomic_write_json, read_json
from lab.core.paths import find_data_file, resolve_path

REQUIRED = ("id", "prompt")
HASHED = ("id", "prompt", "answer")


def _bad_row(path: Path, i: int, problem: str) -> LabError:
    """The error for 0-based data row `i`: `<file>: row i+2<problem> (spreadsheet numbering, header = row 1)`."""
    return LabError(f"{path}: row {i + 2}{problem} (spreadsheet numbering, header = row 1)")


# ---- loading and validating ------------------------------------------------------------------

def _decode(path: Path) -> str:
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise LabError(f"{path}: not UTF-8 text: byte 0x{raw[e.start]:02x} at line {line} of the file "
                       f"(byte offset {e.start}); re-save it as UTF-8") from None
    if not text.strip():
        raise LabError(f"{path}: empty file (no header, no rows)")
    return text


def _records(path: Path, text: str) -> tuple[list[str], list[list[str]]]:
    csv.field_size_limit(max(csv.field_size_limit(), 2**31 - 1))
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        records = list(reader)
    except csv.Error as e:
        raise LabError(f"{path}: malformed CSV at line {reader.line_num} of the file: {e}") from None
    header = records[0]
    while len(records) > 1 and records[-1] == []:
        records.pop()
    return header, records[1:]


def load_puzzles(path: str | os.PathLike, allow_empty: bool = False) -> pd.DataFrame:
    """Columns `id, prompt[, answer]` plus any extra ones, every value the file's exact string.

    Errors (LabError) name the file, the row (spreadsheet numbering: header = row 1) and the
    problem: missing file, empty file, not UTF-8, malformed CSV, missing or duplicate column,
    no rows (unless `allow_empty`), a row with the wrong number of fields, an empty id/prompt/answer, a duplicate id.
    """
    p = Path(path)
    if not p.is_file():
        raise LabError(f"{p}: file not found" if not p.exists() else f"{p}: not a file")
    header, rows = _records(p, _decode(p))

    dup = sorted({c for c in header if header.count(c) > 1})
    if dup:
        raise LabError(f"{p}: duplicate column name(s) {dup} in the header")
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise LabError(f"{p}: missing column(s) {missing}; the header has {header}")
    if not rows and not allow_empty:
        raise LabError(f"{p}: no rows under the header")

    width = len(header)
    checks = [c for c in HASHED if c in header]
    col = {c: header.index(c) for c in checks}
    seen: dict[str, int] = {}
    for i, rec in enumerate(rows):
        if rec == []:
            raise _bad_row(p, i, " is a blank line")
        if len(rec) != width:
            raise _bad_row(p, i, f" has {len(rec)} field(s), the header has {width}")
        for c in checks:
            if not rec[col[c]].strip():
                raise _bad_row(p, i, f": empty {c}")
        ident = rec[col["id"]]
        if ident in seen:
            raise _bad_row(p, i, f": duplicate id {ident!r}, first seen in row {seen[ident] + 2}")
        seen[ident] = i
    return pd.DataFrame(rows, columns=header, dtype=str)


def add_categories(df: pd.DataFrame) -> pd.DataFrame:
    """A copy of `df` with `category` and `subtype` from `lab.puzzles.classify(prompt)`. A file's own `category` or
    `subtype` column that says otherwise is kept, as `category_in_file` / `subtype_in_file`, with a note (extra
    columns are kept: it is never silently replaced)."""
    from lab.puzzles.categories import classify

    if "prompt" not in df.columns:
        raise LabError(f"add_categories: no 'prompt' column (columns are {list(df.columns)})")
    pairs = [classify(p) for p in df["prompt"]]
    out = df.copy()
    for i, col in enumerate(("category", "subtype")):
        if col in df.columns and (differ := int((df[col].astype(str) != [str(p[i]) for p in pairs]).sum())):
            out[f"{col}_in_file"] = df[col]
            print(f"note: the file's own '{col}' column differs from the lab's classification in {differ} row(s): "
                  f"kept as '{col}_in_file'; '{col}' is the lab's (lab.puzzles.classify)", flush=True)
    out["category"] = pd.Series([str(c) for c, _ in pairs], index=df.index, dtype=str)
    out["subtype"] = pd.Series([str(s) for _, s in pairs], index=df.index, dtype=str)
    return out


# ---- splitting, hashing, saving --------------------------------------------------------------

def split(df: pd.DataFrame, val_fraction: float, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(train, val): seeded, stratified by `category` when present, independent of row order.

    Rows with the same prompt (exact duplicates under other ids) are one unit: they land on one side together, so a
    held-out prompt is never also trained on. Each category's units are put in order of their first id, shuffled
    with NumPy's PCG64 seeded by `seed` (categories in sorted order), and the first floor(n * val_fraction + 0.5) of
    its n units go to val, but at least one when val_fraction > 0 and the category has two units or more (a small
    file, 4 puzzles per category at 0.1, still gets a validation row of every category; `prepare` notes it). Without
    duplicates a unit is a row. Both parts keep the input's row order and get a fresh index. The seed and fraction
    are recorded in `train.attrs["split"]` for `save_split`.
    """
    if not 0.0 <= float(val_fraction) < 1.0:
        raise LabError(f"split: val_fraction must be in [0, 1), got {val_fraction}")
    if "id" not in df.columns:
        raise LabError(f"split: no 'id' column (columns are {list(df.columns)})")
    rng = np.random.default_rng(int(seed))
    if "category" in df.columns:
        groups = df.groupby("category", sort=True, dropna=False).indices
    else:
        groups = {None: np.arange(len(df))}
    is_val = np.zeros(len(df), dtype=bool)
    ids = df["id"].astype(str).to_numpy()
    prompts = df["prompt"].astype(str).to_numpy() if "prompt" in df.columns else None
    for _, pos in sorted(groups.items(), key=lambda kv: str(kv[0])):
        pos = np.asarray(pos)[np.argsort(ids[pos], kind="stable")]
        if prompts is None:
            units = [[p] for p in pos]
        else:  # rows of one prompt together, in order of their first id
            by_prompt: dict[str, list[int]] = {}
            for p in pos:
                by_prompt.setdefault(prompts[p], []).append(p)
            units = list(by_prompt.values())
        units = [units[i] for i in rng.permutation(len(units))]
        n_val = int(np.floor(len(units) * float(val_fraction) + 0.5))
        if n_val == 0 and float(val_fraction) > 0 and len(units) >= 2:
            n_val = 1
        for unit in units[:n_val]:
            is_val[unit] = True
    train = df[~is_val].reset_index(drop=True)
    val = df[is_val].reset_index(drop=True)
    info = {"seed": int(seed), "val_fraction": float(val_fraction)}
    train.attrs = {"split": info}
    val.attrs = {"split": info}
    return train, val


def rows_hash(df: pd.DataFrame) -> str:
    """sha256 over the id, prompt and answer columns (those present), row by row, in order (a table's rows, where
    `lab.core.lineage.content_hash` hashes files).

    Each value is fed as its UTF-8 bytes preceded by their length (8 bytes, big-endian), after
    the names of the columns hashed, so no two different tables can collide by shifting text.
    """
    cols = [c for c in HASHED if c in df.columns]
    h = hashlib.sha256()
    h.update(("\x1f".join(cols) + "\n").encode("utf-8"))
    for row in df[cols].itertuples(index=False, name=None):
        for v in row:
            b = str(v).encode("utf-8")
            h.update(len(b).to_bytes(8, "big"))
            h.update(b)
    return h.hexdigest()


def _per_category(train: pd.DataFrame, val: pd.DataFrame) -> dict[str, dict[str, int]]:
    both = pd.concat({"train": train, "val": val})  # the part is the index's first level
    if "category" not in both.columns:
        return {}
    table = pd.crosstab(both["category"], both.index.get_level_values(0))
    table = table.reindex(columns=["train", "val"], fill_value=0)
    return {str(c): {part: int(n) for part, n in row.items()} for c, row in table.iterrows()}


def save_split(train: pd.DataFrame, val: pd.DataFrame, folder: str | os.PathLike, *,
               seed: int | None = None, val_fraction: float | None = None, **extra: Any) -> dict:
    """Write train.csv, val.csv and split.json (counts, per-category counts, content hashes).

    `seed` / `val_fraction` default to what `split` recorded in `train.attrs`; extra keyword
    arguments are stored in split.json as given. Returns the split.json contents.
    """
    folder = Path(folder)
    recorded = train.attrs.get("split", {})
    info = {
        "seed": seed if seed is not None else recorded.get("seed"),
        "val_fraction": val_fraction if val_fraction is not None else recorded.get("val_fraction"),
        "n_train": len(train), "n_val": len(val),
        "train_hash": rows_hash(train), "val_hash": rows_hash(val),
        "per_category": _per_category(train, val),
        **extra,
    }
    atomic_write_csv(folder / "train.csv", train)
    atomic_write_csv(folder / "val.csv", val)
    atomic_write_json(folder / "split.json", info)
    return info


def load_split(folder: str | os.PathLike) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(train, val) read back from `save_split`'s folder, checked against split.json's hashes."""
    folder = Path(folder)
    info = read_json(folder / "split.json", kind=dict)
    out = []
    for part in ("train", "val"):
        df = load_puzzles(folder / f"{part}.csv", allow_empty=True)
        want, got = info.get(f"{part}_hash"), rows_hash(df)
        if want != got:
            raise LabError(f"{folder / f'{part}.csv'}: content hash {got[:12]}... differs from split.json's "
                           f"{str(want)[:12]}...; the file changed after the split was saved")
        if info.get(f"n_{part}") is not None and int(info[f"n_{part}"]) != len(df):
            raise LabError(f"{folder / f'{part}.csv'}: {len(df)} rows, split.json says {info[f'n_{part}']}")
        df.attrs = {"split": {k: info.get(k) for k in ("seed", "val_fraction")}}
        out.append(df)
    return out[0], out[1]


def category_problems(cfg) -> list[str]:
    """`data.categories` and the keys of `data.weights` / `data.trace_styles` / `data.difficulty` that name no category
    of `lab.puzzles.CATEGORIES` (the one list: a new category is one puzzles module and one TABLE line), and each key
    of `data.difficulty.<category>` that is not a knob of that category's generator (`lab.puzzles.generate.knobs`)."""
    from lab.core.schema import choice_problems
    from lab.puzzles.categories import CATEGORIES
    from lab.puzzles.generate import knob_problems

    d, known = cfg.data, tuple(CATEGORIES)
    difficulty = d.get("difficulty") or {}
    knobs = [p for c, given in difficulty.items() if c in known
             for p in (knob_problems(c, given, f"data.difficulty.{c}.") if isinstance(given, Mapping)
                       else [f"data.difficulty.{c}={given!r}: must be a mapping of knobs, e.g. {{n_examples: 4}}"])]
    return (choice_problems("data.categories", d.categories, known, "a category")
            + choice_problems("data.weights (its keys)", list(d.get("weights") or {}), known, "a category")
            + choice_problems("data.trace_styles (its keys)", list(d.get("trace_styles") or {}), known, "a category")
            + choice_problems("data.difficulty (its keys)", list(difficulty), known, "a category") + knobs)


def check_data_settings(cfg) -> None:
    """A LabError listing `category_problems` (nothing was run or changed): what a run's driver and each stage check
    right after composing the config, before any folder is touched."""
    if found := category_problems(cfg):
        raise LabError("; ".join(found) + " (nothing was run or changed)")


def prepare(cfg, need_answers: bool = True) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The run's (train, val) split: made once into `cfg.data.split_dir`, then read back hash-checked.

    Every stage scores against answers, so a file without an `answer` column is refused
    (`need_answers=False` is for a caller that never scores). A category too small for a validation
    row, and one held out only because `split` keeps one, is noted (printed and in split.json's `notes`).

    synthetic: `lab.puzzles.generate` per category (train with `seed`, val with another seed,
    val puzzles whose prompt also occurs in train removed); competition: the CSV found by
    `find_data_file(cfg.data.path)`, classified and split stratified by category. A split folder
    made with other data settings is an error, so two stages of one run can never disagree. split.json records the
    data file's content hash (`data_file_record`): a file changed since is an error naming the change, or a new
    split with `data.resplit=true`.
    """
    check_data_settings(cfg)  # before any file is read or written
    from omegaconf import OmegaConf

    from lab.core.lineage import consumed

    folder = resolve_path(cfg.data.split_dir)
    settings = {"seed": cfg.seed, **OmegaConf.to_container(cfg.data, resolve=True)}
    settings.pop("split_dir", None)
    settings.pop("resplit", None)  # what to do about a changed file, not what the split is made of
    settings = json.loads(json.dumps(settings))  # as it reads back from split.json
    source = data_file_record(cfg)
    fresh = not (folder / "split.json").is_file()
    if not fresh:
        info = read_json(folder / "split.json", kind=dict)
        made_with = info.get("settings")
        if made_with != settings:
            made_with = made_with if isinstance(made_with, dict) else {}
            changed = ", ".join(f"{k}={made_with.get(k)!r}, not {settings.get(k)!r}"
                                for k in sorted(set(made_with) | set(settings)) if made_with.get(k) != settings.get(k))
            raise LabError(f"{folder / 'split.json'}: this run's split was made with {changed}; use another run_name "
                           f"(a notebook: new_run = True in its parameters cell), or delete {folder}")
        fresh = _data_file_changed(info.get("data_file"), source, folder, bool(cfg.data.get("resplit", False)))
    if fresh:
        train, val, extra = _new_split(cfg, need_answers)
        if source is not None:
            extra["data_file"] = source
        save_split(train, val, folder, seed=cfg.seed, val_fraction=cfg.data.val_fraction, settings=settings, **extra)
    train, val = load_split(folder)
    if need_answers:
        _need_answers(train, folder / "train.csv")
    consumed(folder)  # the split's content hash: an input of the open stage (lab.core.lineage)
    return train, val


def data_file_record(cfg) -> dict | None:
    """{path, sha256, bytes} of the data file the split reads (competition data; None for generated puzzles): what
    split.json records, so a file changed in place is noticed on a rerun (its path alone would not change)."""
    if cfg.data.source != "competition":
        return None
    path = find_data_file(cfg.data.path)
    with open(path, "rb") as f:  # read whole every time (lineage's hash memo goes by size and mtime)
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    return {"path": str(path), "sha256": digest, "bytes": path.stat().st_size}


def _data_file_changed(made: dict | None, now: dict | None, folder: Path, resplit: bool) -> bool:
    """True when the split must be made again: the data file changed since split.json recorded it and
    `data.resplit=true`; a LabError naming the change when it changed without it."""
    if now is None:
        return False
    if made is None:
        print(f"note: {folder / 'split.json'}: made by an older version of the lab, without the data file's content "
              f"hash; {now['path']} is not compared with what it held then", flush=True)
        return False
    if made.get("sha256") == now["sha256"]:
        return False
    what = (f"{now['path']} changed since this run's split was made from {made.get('path')} "
            f"(sha256 {str(made.get('sha256'))[:12]}..., {made.get('bytes')} bytes -> {now['sha256'][:12]}..., "
            f"{now['bytes']} bytes)")
    if not resplit:
        raise LabError(f"{folder / 'split.json'}: {what}; the old split is not reused. Start a new run "
                       "(run_name=NEW) or make a new split in this one with data.resplit=true (its later stages then "
                       "count as out of date)")
    print(f"note: {what}; data.resplit=true: the split is made again", flush=True)
    return True


def _new_split(cfg, need_answers: bool) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """`prepare`'s (train, val) made from `cfg.data`, and what split.json records beside them (`notes`)."""
    d = cfg.data
    categories = list(d.categories) if d.categories else None
    if d.source == "synthetic":
        train = _generated(cfg, categories, d.n_train, cfg.seed)
        return train, _generated(cfg, categories, d.n_val, cfg.seed + 7919, exclude=train["prompt"]), {}
    if d.source != "competition":
        raise LabError(f"conf/data: source must be 'synthetic' or 'competition', not {d.source!r}")
    path = find_data_file(d.path)
    df = add_categories(load_puzzles(path))
    if need_answers:
        _need_answers(df, path)
    if categories:
        df = df[df["category"].isin(categories)].reset_index(drop=True)
        if df.empty:
            raise LabError(f"{path}: no puzzle of the categories {categories} (data.categories)")
    if d.get("synthetic_train", False):  # generated puzzles train; the whole real file validates
        train, val = synthetic_train_split(cfg, df, categories)
        notes = [f"{path}: synthetic_train: {len(train)} generated training puzzles; all {len(val)} real rows "
                 "held for validation"]
    else:
        train, val = split(df, d.val_fraction, cfg.seed)
        if d.n_val:
            val = sample_per_category(val, d.n_val, cfg.seed)
        if d.n_train:
            train = sample_per_category(train, d.n_train, cfg.seed)
        notes = _split_notes(df, val, d.val_fraction, path)
    notes += _repeat_notes(df, path)
    if val.empty:
        raise LabError(f"{path}: no validation rows: {len(df)} puzzle(s), val_fraction={d.val_fraction}; every "
                       "category needs two puzzles or more (one for training, one held out)")
    if train.empty:
        raise LabError(f"{path}: no training rows: {len(df)} puzzle(s), val_fraction={d.val_fraction} holds every "
                       "one out; lower data.val_fraction or pass a larger file")
    for n in notes:
        print(f"note: {n}", flush=True)
    extra = {"notes": notes, "repeated_prompts": int(df["prompt"].duplicated().sum())}
    return train, val, extra


def sample_per_category(df: pd.DataFrame, n: int, seed: int) -> pd.DataFrame:
    """`n` rows of `df` (all when it has no more), drawn with `seed` from every category in proportion to its size
    (largest remainders; each category keeps at least one row while `n` allows), in `df`'s row order: not the first
    `n` rows, which on a file sorted by category would be one category only."""
    n = int(n)
    if n >= len(df):
        return df.reset_index(drop=True)
    rng = np.random.default_rng(int(seed))
    cats = df["category"].astype(str) if "category" in df.columns else pd.Series("", index=df.index)
    sizes = cats.value_counts().sort_index()
    share = sizes / sizes.sum() * n
    take = np.floor(share).astype(int)
    if n >= len(sizes):
        take = take.clip(lower=1)
    left = n - int(take.sum())
    if left > 0:  # largest remainders first, ties by category name
        order = sorted(sizes.index, key=lambda c: (-(share[c] - np.floor(share[c])), c))
        for c in order:
            if left == 0:
                break
            if take[c] < sizes[c]:
                take[c] += 1
                left -= 1
    while int(take.sum()) > n:  # the at-least-one rule overshot: trim the largest
        take[take.idxmax()] -= 1
    keep = []
    for c in sizes.index:
        pos = np.flatnonzero((cats == c).to_numpy())
        keep += list(rng.choice(pos, size=int(min(take[c], len(pos))), replace=False))
    return df.iloc[sorted(keep)].reset_index(drop=True)


def _repeat_notes(df: pd.DataFrame, path) -> list[str]:
    """Repeated prompts in words: how many rows repeat another row's prompt (kept on one side of the split by
    `split`), the prompts given different answers (named by their ids), and prompts with Windows line ends
    (the competition's test prompts have none)."""
    notes = []
    if "prompt" not in df.columns:
        return notes
    repeats = int(df["prompt"].duplicated().sum())
    if repeats:
        notes.append(f"{path}: {repeats} row(s) repeat the prompt of another row under another id; each prompt's "
                     "rows stay on one side of the split (split.json: repeated_prompts)")
    if "answer" in df.columns and repeats:
        answers = df.groupby("prompt", sort=False)["answer"].nunique()
        for prompt in answers[answers > 1].index[:20]:
            rows = df[df["prompt"] == prompt]
            notes.append(f"{path}: one prompt has different answers: " +
                         ", ".join(f"id {i} -> {a!r}" for i, a in zip(rows["id"], rows["answer"])))
        if (answers > 1).sum() > 20:
            notes.append(f"{path}: {int((answers > 1).sum()) - 20} more prompt(s) with different answers")
    crlf = int(df["prompt"].str.contains("\r", regex=False).sum())
    if crlf:
        notes.append(f"{path}: {crlf} prompt(s) hold carriage returns (Windows line ends, kept as they are); the "
                     "competition's prompts have none, so these differ from what the model is scored on")
    return notes


def _need_answers(df: pd.DataFrame, path) -> None:
    if "answer" not in df.columns:
        raise LabError(f"{path}: no 'answer' column (columns are {list(df.columns)}): a file without answers, like "
                       "the competition's test.csv, cannot be trained on or scored; pass the training file "
                       "(data.path=...)")


def _split_notes(df: pd.DataFrame, val: pd.DataFrame, val_fraction: float, path) -> list[str]:
    """What a small file does to the split, in words: categories with no validation row, or with one only
    because `split` keeps at least one."""
    if "category" not in df.columns or val_fraction <= 0:
        return []
    notes = []
    for cat, n in sorted(df["category"].value_counts().items()):
        n_val = int((val["category"] == cat).sum()) if len(val) else 0
        if n_val == 0:
            notes.append(f"{path}: category {cat} has no validation row ({n} puzzle(s); data.n_val or "
                         "val_fraction left none): its accuracy is not measured")
        elif np.floor(n * val_fraction + 0.5) == 0:
            notes.append(f"{path}: category {cat} has {n} puzzle(s); val_fraction={val_fraction} would hold out "
                         "none, so one is held out")
    return notes


# ---- trace style and token counting (conf/data: trace_style, tokenizer_path) -------------------

TRACE_STYLES = ("compact", "derivation")


def trace_style(cfg) -> str:
    """`data.trace_style`: 'compact' (the rule, then applied) or 'derivation' (the search written out, every line
    checked by `python -m lab puzzles check`); the SFT and GRPO data builders and `05_errors` read it."""
    return _style("trace_style", cfg.data.get("trace_style", None) or "compact")


def _style(key: str, style: str) -> str:
    if style not in TRACE_STYLES:
        raise LabError(f"conf/data: {key}={style!r} must be one of {', '.join(TRACE_STYLES)}")
    return style


def _by_category(cfg, key: str) -> dict:
    """`data.<key>` as a dict ({} when unset), every key checked to be a category."""
    from lab.puzzles.categories import CATEGORIES

    per = dict(cfg.data.get(key, None) or {})
    for cat in per:
        if cat not in CATEGORIES:
            raise LabError(f"conf/data: {key} has {cat!r}, not a category (one of {', '.join(CATEGORIES)})")
    return per


def count_tokenizer(cfg, default=None):
    """What counts trace tokens: `data.tokenizer_path` (a local folder with tokenizer.json and tokenizer_config.json)
    when set, else `default` (the model's tokenizer). A set path that is not such a folder is a LabError."""
    path = cfg.data.get("tokenizer_path", None)
    if not path:
        return default
    p = resolve_path(str(path))
    if not (p / "tokenizer.json").is_file() or not (p / "tokenizer_config.json").is_file():
        raise LabError(f"conf/data: tokenizer_path={path}: no tokenizer.json and tokenizer_config.json in {p}")
    return str(p)


# ---- data mix (conf/data: weights, synthetic_train, trace_styles) ------------------------------

OVERSAMPLE_WARN = 3.0  # the top teams saw a category oversampled beyond about 3x overwrite the others


def category_weights(cfg) -> dict[str, float]:
    """`data.weights`: {category: weight} for the SFT examples (1 = as many as the data gives; the schema types each
    as a float); a weight below 0, or a category that does not exist, is a LabError; a weight above 3 is warned
    about (printed)."""
    weights = _by_category(cfg, "weights")
    for cat, w in weights.items():
        if not w >= 0:
            raise LabError(f"conf/data: weights.{cat}={w} must be >= 0")
        if w > OVERSAMPLE_WARN:
            print(f"WARNING: conf/data: weights.{cat}={w:g} oversamples {cat} beyond {OVERSAMPLE_WARN:g}x; "
                  "a category oversampled that far can overwrite the others", flush=True)
    return weights


def oversample(examples: pd.DataFrame, weights: dict[str, float], seed: int) -> pd.DataFrame:
    """The examples with each category's rows repeated `weight` times: the whole part as copies, the fractional part
    as a seeded sample of that share of the rows (weight 0 drops the category; categories not named keep weight 1).
    Rows keep their category order, copies follow their originals' block; nothing else changes."""
    if not weights:
        return examples
    if "category" not in examples.columns:
        raise LabError("data.weights: the examples have no 'category' column to weigh by")
    rng = np.random.default_rng(int(seed))
    parts = []
    for cat, g in examples.groupby("category", sort=False):
        w = float(weights.get(str(cat), 1.0))
        whole, frac = int(w), w - int(w)
        parts += [g] * whole
        k = int(np.floor(len(g) * frac + 0.5))
        if k:
            parts.append(g.iloc[np.sort(rng.choice(len(g), size=k, replace=False))])
    return pd.concat(parts, ignore_index=True) if parts else examples.iloc[:0]


def trace_styles(cfg) -> dict[str, str]:
    """{category: style} for every category: `data.trace_styles.<category>` where set, else `data.trace_style`.
    An unknown category or style is a LabError."""
    from lab.puzzles.categories import CATEGORIES

    default = trace_style(cfg)
    per = {cat: _style(f"trace_styles.{cat}", st) for cat, st in _by_category(cfg, "trace_styles").items()}
    return {c: per.get(c, default) for c in CATEGORIES}


def synthetic_train_split(cfg, real: pd.DataFrame, categories: list[str] | None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """`data.synthetic_train`: (train, val) with train = generated puzzles only (`n_train` per category, `difficulty`,
    seeded by `seed`) and val = the whole real file (`n_val` of its rows when set, drawn per category with the seed:
    `sample_per_category`): no real puzzle is trained on.
    Generated puzzles whose prompt occurs in the real file are dropped."""
    d = cfg.data
    if not d.n_train:
        raise LabError("conf/data: synthetic_train needs n_train (generated puzzles per category)")
    train = _generated(cfg, categories, d.n_train, cfg.seed, exclude=real["prompt"])
    val = sample_per_category(real, d.n_val, cfg.seed) if d.n_val else real.reset_index(drop=True)
    return train, val


def _generated(cfg, categories: list[str] | None, n: int, seed: int, exclude=()) -> pd.DataFrame:
    """`n` puzzles of each category (all when None) from `lab.puzzles.generate` with `data.difficulty`, seeded by
    `seed`; those whose prompt is in `exclude` dropped."""
    from lab.puzzles.categories import CATEGORIES
    from lab.puzzles.generate import generate

    difficulty = cfg.data.difficulty or {}
    df = pd.concat([generate(c, n, seed=seed, **dict(difficulty.get(c, {}))) for c in categories or CATEGORIES],
                   ignore_index=True)
    return df[~df["prompt"].isin(set(exclude))].reset_index(drop=True)
