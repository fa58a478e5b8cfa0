"""What a stage will leave in Kaggle's kept output folder (/kaggle/working, 20 GB) and in scratch, planned from the
config before the stage starts: `planned_output_bytes(cfg, stage)`, `check(cfg, stage)` (a stage on Kaggle prints the
plan and refuses one over `kaggle.output_limit_gb`), `stage_reads(cfg, stage)` (what a kernel copies back from the
kernel before it) and `python -m lab kaggle plan OVERRIDES`. Upper bounds from shapes, no file measured; each figure's
arithmetic: docs/internals.md, lab.plan.output_plan.
"""

from __future__ import annotations

import contextlib
import csv
import os

from omegaconf import DictConfig, OmegaConf

from lab import LabError
from lab.core.paths import adapter_dtype, find_data_file, on_kaggle, resolve_path
from lab.plan.shapes import checkpoint_bytes

GB = 10 ** 9
SMALL_FILES = 64 * 2 ** 20  # config, manifest, metrics, plots, logs of one stage
TEXT_BYTES_PER_TOKEN = 4  # a completion's text, about 4 characters a token (an upper bound for these puzzles)
COMPETITION_ROWS = 9500  # rows of the competition's train.csv, when the file is not here to count
TRAINING = {"02_sft": "sft", "03_grpo": "grpo"}


def trainable_params(cfg: DictConfig) -> int:
    """The configured LoRA's trainable parameters on the configured model (meta device: no weights read)."""
    from lab.plan.shapes import param_counts

    return param_counts(cfg)[1]


def adapter_bytes_per_param(cfg: DictConfig) -> tuple[int, str]:
    """(bytes per trainable parameter of a saved adapter on Kaggle, its dtype's name)."""
    import torch

    name = adapter_dtype(cfg, kaggle=True) or "float32"
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise LabError(f"kaggle.adapter_dtype={name!r} is not a torch dtype (bfloat16, float16, float32 or null)")
    return dtype.itemsize, {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(name, name)


def val_rows(cfg: DictConfig) -> tuple[int, str]:
    d = cfg.data
    if d.n_val:
        return int(d.n_val), "data.n_val"
    if d.source == "synthetic":
        return 0, "synthetic"
    rows, where = COMPETITION_ROWS, f"{COMPETITION_ROWS} rows assumed (the data file is not here)"
    with contextlib.suppress(LabError, OSError):
        path = find_data_file(d.path)
        with open(path, newline="", encoding="utf-8") as f:  # CSV records: a prompt spans several lines
            rows, where = max(sum(1 for _ in csv.reader(f)) - 1, 0), f"{path.name}'s rows"
    return int(rows * float(d.val_fraction)) + 1, f"val_fraction {d.val_fraction} of {rows} ({where})"


def data_bytes(cfg: DictConfig) -> int:
    """The split folder (train.csv, val.csv, split.json): about the data file's size."""
    if cfg.data.source == "synthetic":
        return 2 ** 20
    with contextlib.suppress(LabError, OSError):
        return find_data_file(cfg.data.path).stat().st_size + 2 ** 20
    return 64 * 2 ** 20


def _rel(cfg: DictConfig, path) -> str | None:
    """`path` relative to the run folder, or None when it lies outside it."""
    try:
        return os.path.relpath(resolve_path(str(path)), resolve_path(cfg.run_dir)).replace(os.sep, "/")
    except ValueError:
        return None


def _stage_folder_of(cfg: DictConfig, path) -> str | None:
    rel = _rel(cfg, path)
    return None if rel is None or rel.startswith("..") else rel.split("/")[0]


# the training stages a stage folder's own inputs come from: `lab.core.lineage.problems` checks a stage's inputs too,
# so a kernel copies back the chain below what it reads (the install cell skips a folder that is not there: a
# skipped 03_grpo)
UPSTREAM = {"02_sft": (), "03_grpo": ("02_sft",), "04_vote": ("02_sft", "03_grpo")}


def stage_reads(cfg: DictConfig, stage: str) -> list[str]:
    """The paths inside the run folder that `stage` reads from earlier stages: what a kernel copies back from the
    kernel before it (the split folder, the adapter's stage folder with its manifest and config, which
    `lab.core.lineage.stage_input` checks, and the stages below that one). 04_vote without `vote.adapter` votes with
    the latest finished training stage (`lab.recipes.vote.vote_adapter`): both are copied back where they exist."""
    if stage == "01_explore":
        return []  # it makes the split
    split = _stage_folder_of(cfg, cfg.data.split_dir)
    reads = [split] if split else []
    direct: list = []
    if stage == "03_grpo":
        direct = [_stage_folder_of(cfg, cfg.grpo.init_adapter)]
    elif stage == "04_vote":
        value = OmegaConf.select(cfg, "vote.adapter", default=None)
        direct = [_stage_folder_of(cfg, value)] if value else ["03_grpo"]
    elif stage == "05_errors":
        direct = ["04_vote", "02_sft"]  # the final predictions, and 02_sft's for the diff
    for folder in direct:
        for name in (*UPSTREAM.get(folder, ()), folder):
            if name and name not in reads:
                reads.append(name)
    return reads


def planned_output_bytes(cfg: DictConfig, stage: str, params: int | None = None) -> dict:
    """The plan of `stage` under `cfg`: {"working": {item: bytes}, "scratch": {item: bytes}, "limit": bytes,
    "lines": [the arithmetic, one line per item], "params": P}. `params`: P when known (else counted)."""
    gpu_stage = stage in ("02_sft", "03_grpo", "04_vote")
    P = 0 if stage == "01_explore" else params if params is not None else trainable_params(cfg)
    per_param, adapter_kind = adapter_bytes_per_param(cfg)
    adapter = per_param * P
    rows, rows_how = val_rows(cfg)
    tokens = int(cfg.infer.max_tokens)
    per_pass = rows * tokens * TEXT_BYTES_PER_TOKEN
    working: dict[str, int] = {}
    scratch: dict[str, int] = {}
    lines = [] if not P else [f"P = {P:,} trainable parameters ({', '.join(cfg.sft.lora.targets)}; r={cfg.sft.lora.r})"]
    if stage != "01_explore":
        lines.append(f"held-out rows = {rows:,} ({rows_how}); one evaluation pass <= rows x infer.max_tokens "
                     f"{tokens:,} x {TEXT_BYTES_PER_TOKEN} B = {_gb(per_pass)}")
    for name in stage_reads(cfg, stage):
        if name == _stage_folder_of(cfg, cfg.data.split_dir):
            working[f"copied back: {name}/ (the split)"] = data_bytes(cfg)
        elif name == "04_vote":
            working["copied back: 04_vote/ (predictions, samples)"] = (1 + 2 * int(cfg.vote.k)) * per_pass
        else:
            # the whole stage folder: lab.core.lineage.problems refuses a stage whose recorded outputs went missing
            working[f"copied back: {name}/ (its adapter, {adapter_kind}, + zip)"] = adapter + 2 * P
            lines.append(f"copied back {name}/ (whole: lineage checks every recorded output): adapter P x {per_param} B"
                         f" + zip P x 2 B = {_gb(adapter + 2 * P)}")
    if stage == "01_explore":
        working["01_explore/ + the split"] = data_bytes(cfg)
    elif stage in TRAINING:
        group = TRAINING[stage]
        ckpt, how = checkpoint_bytes(cfg, P)
        drills = stage == "02_sft" and "drills" in list(cfg.sft.stages)
        working[f"{stage}/adapter ({adapter_kind})"] = adapter
        if drills:
            working[f"{stage}/drills_adapter ({adapter_kind})"] = adapter
        working[f"{stage}/submission.zip (bf16)"] = 2 * P
        passes = 2 if stage == "02_sft" else 1
        working[f"{stage}/predictions ({passes} evaluation passes)"] = passes * per_pass
        kept = f"checkpoints/{stage}: the resumable state, kept when the budget stops the stage (one checkpoint)"
        working[kept] = ckpt
        keep = int(cfg.sft.save_total_limit) if group == "sft" else 2  # lab.train.grpo.grpo_args: save_total_limit=2
        scratch[f"checkpoints/{stage}: {keep} kept + 1 being written"] = (keep + 1) * ckpt
        if drills:
            scratch[f"checkpoints/{stage}_drills: {keep} kept + 1 being written"] = (keep + 1) * ckpt
        if stage == "03_grpo" and cfg.grpo.rollout_backend == "vllm":  # lab.train.rollouts keeps the last two rounds
            from lab.model.submission import pack_dtype

            b = 2 if pack_dtype(cfg) else 4  # the rounds' packed adapters: the model's half dtype, else fp32
            scratch["checkpoints/03_grpo/rollouts: the last 2 rounds' served adapters + one being packed"] = (
                (2 * b + 4 + 2 * b) * P)
            lines.append(f"rollouts: 2 kept rounds x served adapter P x {b} B (the model's {cfg.model.dtype}) + the "
                         f"round being packed (its fp32 PEFT folder P x 4 B, zip and served folder 2 x P x {b} B) = "
                         f"{_gb((4 * b + 4) * P)}")
        lines += [f"adapter = P x {per_param} B ({adapter_kind}, kaggle.adapter_dtype) = {_gb(adapter)}",
                  f"submission.zip = P x 2 B (bf16) = {_gb(2 * P)}",
                  f"one checkpoint = {how} = P x {ckpt / max(P, 1):.2f} B = {_gb(ckpt)}",
                  f"scratch: ({keep} kept ({group}.save_total_limit) + 1 being written) x {_gb(ckpt)} = "
                  f"{_gb((keep + 1) * ckpt)}"]
    elif stage == "04_vote":
        working["04_vote/ predictions + samples.jsonl + samples.csv"] = (1 + 2 * int(cfg.vote.k)) * per_pass
        lines.append(f"04_vote: (1 greedy + 2 x k={cfg.vote.k} samples) passes x {_gb(per_pass)}")
    working[f"{stage}/ config, manifest, metrics, plots, logs"] = SMALL_FILES
    limit = int(float(cfg.kaggle.output_limit_gb) * GB)
    return {"stage": stage, "working": working, "scratch": scratch, "limit": limit, "lines": lines, "params": P,
            "gpu": gpu_stage}


def _gb(n: float) -> str:
    return f"{n / GB:,.2f} GB"


def report(plan: dict) -> str:
    total, scratch = sum(plan["working"].values()), sum(plan["scratch"].values())
    out = [f"{plan['stage']}: planned /kaggle/working {_gb(total)} of {_gb(plan['limit'])} "
           f"({'fits' if total <= plan['limit'] else 'OVER THE LIMIT'}); scratch {_gb(scratch)}"]
    out += [f"  working  {_gb(b):>12}  {k}" for k, b in plan["working"].items()]
    out += [f"  scratch  {_gb(b):>12}  {k}" for k, b in plan["scratch"].items()]
    out += [f"  | {x}" for x in plan["lines"]]
    return "\n".join(out)


def check(cfg: DictConfig, stage: str, force: bool = False) -> dict | None:
    """On Kaggle (or with `force`): print the plan of `stage` and refuse (LabError) one over `kaggle.output_limit_gb`.
    Elsewhere: None, nothing printed."""
    if not (force or on_kaggle()):
        return None
    plan = planned_output_bytes(cfg, stage)
    print(report(plan), flush=True)
    total = sum(plan["working"].values())
    if total > plan["limit"]:
        raise LabError(f"{stage}: the planned output, {_gb(total)}, is over Kaggle's {_gb(plan['limit'])} "
                       "(kaggle.output_limit_gb): an 8-bit optimizer (gpu.optim=adamw_bnb_8bit) makes a checkpoint a "
                       "third as large, fewer LoRA targets or a lower rank shrink the adapter (nothing was run)")
    return plan
