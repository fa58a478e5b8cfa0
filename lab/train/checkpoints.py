"""Resumable training checkpoints, shared by SFT (`lab.train.sft`) and GRPO (`lab.train.grpo`): what a run may resume.

A run's checkpoint folder records the fingerprint of what produced it (a rerun with other settings starts afresh, or
refuses when asked to resume); a checkpoint counts only once sealed complete (`CompleteMarker`), so a crash or a full
disk mid-save never becomes a resume point; a full disk is a LabError naming the space one checkpoint needs; on Kaggle a
budget stop keeps the newest checkpoint for the next kernel. The details: docs/internals.md, lab.train.checkpoints.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
from pathlib import Path
from typing import Any, Iterable

from omegaconf import DictConfig, OmegaConf

from lab import LabError
from lab.core.io import atomic_write_json, is_main_process, read_json
from lab.core import lineage
from lab.core.lineage import diff, files, model_hash
from lab.model.models import model_path

RUN_RECORD = "lab_run.json"
COMPLETE = "lab_complete.json"


def fingerprint(cfg: DictConfig, group: str, free_keys: Iterable[str], **extra: Any) -> dict:
    """What must not change between a run and its resumption: `cfg[group]` without `free_keys`, the seed, the model's
    dtype and content hash (`lab.core.lineage.model_hash`; not its path: a run copied elsewhere, or the model moved,
    still resumes), and `extra` (what the stage adds)."""
    free = set(free_keys)
    g = {k: v for k, v in OmegaConf.to_container(cfg[group], resolve=True).items() if k not in free}
    return {group: g, "seed": cfg.seed, "dtype": cfg.model.dtype, "model_sha256": model_hash(model_path(cfg)), **extra}


def asked_to_resume(overrides: Iterable[str], key: str) -> bool:
    """True when the overrides set `key` (e.g. `sft.resume=true`) explicitly to true."""
    for o in overrides:
        k, _, v = o.lstrip("+").partition("=")
        if k.strip() == key and v.strip().lower() in ("true", "1", "yes", "on"):
            return True
    return False


def step_of(path: Path) -> int:
    m = re.fullmatch(r"checkpoint-(\d+)", path.name)
    return int(m.group(1)) if m else -1


def _checkpoints(out: Path) -> list[Path]:
    """The `checkpoint-N` folders in `out`, oldest first (transformers' own `sort_checkpoints`, trainer_utils.py)."""
    from transformers.trainer_utils import sort_checkpoints

    return [Path(p) for p in sort_checkpoints(str(out))] if out.is_dir() else []


# ---- completeness ----------------------------------------------------------------------------------

def mark_complete(ckpt: str | os.PathLike) -> Path:
    """Seal a fully written checkpoint folder with `lab_complete.json` (`lab.core.lineage.seal`: every file's content
    hash; files over 1 GiB by their size and first and last 64 MiB)."""
    lineage.seal(Path(ckpt) / COMPLETE, {"checkpoint": Path(ckpt).name}, files(ckpt, skip=(COMPLETE,)).values())
    return Path(ckpt) / COMPLETE


def incomplete(ckpt: Path) -> str | None:
    """Why `ckpt` is not a complete checkpoint (its seal missing, unreadable, or a file changed since), or None."""
    if not (ckpt / COMPLETE).is_file():
        return f"no {COMPLETE} (its save did not finish)"
    try:
        lineage.check_seal(ckpt / COMPLETE, {"checkpoint": ckpt.name})
    except lineage.Unsealed as e:
        return str(e)
    return None


def marker_callback():
    """A TrainerCallback that marks each checkpoint complete once the Trainer has written all of it."""
    from transformers import TrainerCallback
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    class CompleteMarker(TrainerCallback):
        def on_save(self, args, state, control, **kw):
            ckpt = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
            if state.is_world_process_zero and ckpt.is_dir():
                mark_complete(ckpt)

    return CompleteMarker()


# ---- the resume decision ---------------------------------------------------------------------------

def resume_point(out: Path, fp: dict, *, resume: bool, asked: bool, what: str, max_steps: int | None = None
                 ) -> tuple[Path | None, dict | None, list[str]]:
    """(checkpoint to resume or None, the run record to reuse or None, notes) for the checkpoint folder `out`
    (`_resume_point`). Under a distributed launch only the main process decides, and deletes; the other ranks
    receive its answer, so no rank deletes what another has just written (the run record of a fresh run)."""
    import torch.distributed as dist

    kw = dict(resume=resume, asked=asked, what=what, max_steps=max_steps)
    if not (dist.is_available() and dist.is_initialized()):
        return _resume_point(out, fp, **kw)
    box = [None]
    if is_main_process():
        try:
            box = [(_resume_point(out, fp, **kw), None)]
        except LabError as e:  # every rank raises it, none waits for a broadcast that never comes
            box = [(None, str(e))]
    dist.broadcast_object_list(box, src=0)
    answer, error = box[0]
    if error is not None:
        raise LabError(error)
    return answer


def _resume_point(out: Path, fp: dict, *, resume: bool, asked: bool, what: str, max_steps: int | None = None
                  ) -> tuple[Path | None, dict | None, list[str]]:
    """The decision of `resume_point`, made in this process.

    `resume=False`, no checkpoint, or none with a run record: the folder is deleted (a fresh run). A record whose
    fingerprint differs from `fp`: a LabError naming the changes when `asked` (the user asked to resume), else the
    folder is deleted with a note naming them. Incomplete checkpoints and those past `max_steps` are deleted with a
    note; the newest complete one left is resumed, with a note saying so. `what` names the config group."""
    notes: list[str] = []
    ckpts = _checkpoints(out) if resume else []  # resume=False: a fresh run; stale checkpoints are deleted
    record = read_json(out / RUN_RECORD, kind=dict) if ckpts and (out / RUN_RECORD).is_file() else None
    changed = diff(record.get("fingerprint", {}), fp) if record is not None else []
    if ckpts and record is None:
        notes.append(f"{out}: checkpoints without {RUN_RECORD} (an older lab version, or another tool) cannot be "
                     "matched to this configuration: discarded, training starts afresh")
    elif changed:
        differs = f"{out}: checkpoints were written by a different {what.upper()} configuration ({'; '.join(changed)})"
        if asked:
            raise LabError(f"{differs}; set {what}.resume=false to start over (deletes them), leave "
                           f"{what}.resume unset to start afresh with a note, or use another run_dir")
        notes.append(f"{differs}: discarded, training starts afresh")
    elif ckpts:
        for p in ckpts:
            why = incomplete(p)
            if why is not None:
                notes.append(f"{p.name} is incomplete ({why}): deleted")
            elif max_steps is not None and step_of(p) > max_steps:
                notes.append(f"{p.name} is past {what}.max_steps={max_steps}: deleted")
            else:
                continue
            shutil.rmtree(p, ignore_errors=True)
        from transformers.trainer_utils import get_last_checkpoint

        if (last := get_last_checkpoint(str(out))) is not None:  # the incomplete ones are gone: the newest is complete
            notes.append(f"resuming from {last} (the newest complete checkpoint)")
            return Path(last), record, notes
        notes.append(f"{out}: no complete checkpoint left: training starts afresh")
    shutil.rmtree(out, ignore_errors=True)
    return None, None, notes


def write_record(out: Path, record: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / RUN_RECORD, record)


# ---- a full disk -------------------------------------------------------------------------------------

def measured_checkpoint_bytes(out: Path) -> int | None:
    """The size on disk of the newest complete checkpoint in `out`; None when it holds none."""
    for p in reversed(_checkpoints(out)):
        if incomplete(p) is None:
            return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
    return None


def checkpoint_need(out: Path, cfg: DictConfig, model) -> int:
    """The space one more checkpoint in `out` needs: the newest complete one's size, else the projection for
    `model`'s trainable parameters and `gpu.optim` (`lab.plan.shapes.checkpoint_bytes`, as the Kaggle output plan)."""
    from lab.plan.shapes import checkpoint_bytes

    measured = measured_checkpoint_bytes(out)
    if measured is not None:
        return measured
    return checkpoint_bytes(cfg, sum(p.numel() for p in model.parameters() if p.requires_grad))[0]


def _mb(n: int) -> str:
    return f"{n / 2**20:,.1f} MB"


@contextlib.contextmanager
def disk_full_guard(folder: Path, need_bytes):
    """Turn a full disk while training or saving into `folder` into a LabError naming the folder and the space one
    checkpoint needs (`need_bytes`: a number or a function giving it, asked only when the disk is full)."""
    try:
        yield
    except (OSError, RuntimeError) as e:
        full = isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)
        if isinstance(e, OSError) and e.filename:
            folder = Path(e.filename).parent  # the folder the failed write was for
        try:  # of the nearest folder that exists
            free = shutil.disk_usage(next(p for p in (Path(folder), *Path(folder).parents) if p.exists())).free
        except (OSError, StopIteration):
            free = None
        need = need_bytes() if callable(need_bytes) else int(need_bytes)
        if not full and isinstance(e, RuntimeError) and free is not None and free < need:
            full = True  # torch.save's zip writer reports a failed write as a RuntimeError without errno
        if not full:
            raise
        left = f"{_mb(free)} free there" if free is not None else "free space unknown"
        raise LabError(f"{folder}: the disk is full ({e.strerror if isinstance(e, OSError) else e}); one checkpoint "
                       f"needs about {_mb(need)} ({left}). Free space or point run_dir elsewhere; the incomplete "
                       "checkpoint is skipped and a rerun resumes from the newest complete one") from None


# ---- Kaggle: the 12-hour run and the state a next kernel resumes from -------------------------------------------

KERNEL_START_ENV = "LAB_KERNEL_START"  # set by the kernel's install cell (kaggle_kernel/install_cell.py): time.time()


def wall_clock_budget(cfg: DictConfig, group: str) -> float:
    """The wall-clock budget in minutes of the `group` ('sft', 'grpo') trainer: `<group>.wall_clock_budget_min` when
    it is above 0; else, on Kaggle (`lab.core.paths.on_kaggle`), `kaggle.run_limit_h` hours minus
    `kaggle.budget_margin_min` minus what this kernel already ran (since its install cell, $LAB_KERNEL_START), said in
    one line; else 0 (no budget). A LabError when that leaves no time to train."""
    import time

    from lab.core.paths import on_kaggle

    own = float(cfg[group].wall_clock_budget_min)
    if own > 0 or not on_kaggle():
        return own
    k = cfg.kaggle
    try:
        ran = max(0.0, (time.time() - float(os.environ.get(KERNEL_START_ENV, "")))) / 60
    except ValueError:
        ran = 0.0
    budget = float(k.run_limit_h) * 60 - float(k.budget_margin_min) - ran
    if budget <= 1:
        raise LabError(f"{group}: no time left to train in this Kaggle run (kaggle.run_limit_h={k.run_limit_h} h - "
                       f"kaggle.budget_margin_min={k.budget_margin_min} min - {ran:.0f} min this kernel already ran); "
                       f"run the stage in a kernel of its own (`python -m lab kaggle build --chain ...`)")
    print(f"{group}: wall-clock budget {budget:.0f} min = kaggle.run_limit_h {k.run_limit_h:g} h - "
          f"kaggle.budget_margin_min {k.budget_margin_min:g} min - {ran:.0f} min this kernel already ran "
          f"({group}.wall_clock_budget_min=N sets it)", flush=True)
    return budget


def resume_note(metrics: dict, checkpoint_dir, keep_dir, stage: str, group: str) -> str | None:
    """After a wall-clock budget stop (`metrics["stopped_by_budget"]`), on the main process: the newest checkpoint
    kept where the next run finds it (`keep_for_resume`) and the note saying how to resume, printed; else None."""
    if not metrics.get("stopped_by_budget") or not is_main_process():
        return None
    note = keep_for_resume(checkpoint_dir, keep_dir, stage, group)
    print(f"NOTE: {note}", flush=True)
    return note


def keep_for_resume(checkpoint_dir: str | os.PathLike, keep_dir: str | os.PathLike, stage: str, group: str) -> str:
    """After a wall-clock budget stop: copy the newest complete checkpoint of `checkpoint_dir` (on Kaggle a scratch
    folder Kaggle does not keep) and its run record into `keep_dir` (`<run_dir>/checkpoints/<stage>` in
    /kaggle/working), replacing what an earlier stop kept there, and return the note that says how to resume.
    The checkpoint holds the fp32 adapter and the optimizer's state (`lab.plan.shapes.checkpoint_bytes`): the
    next kernel resumes at the same step with the same moments and schedule."""
    src, dst = Path(checkpoint_dir), Path(keep_dir)
    done = [p for p in _checkpoints(src) if incomplete(p) is None]
    if not done:
        return (f"{stage}: stopped by its wall-clock budget, but {src} holds no complete checkpoint: nothing kept to "
                "resume from (a next run starts afresh)")
    newest = done[-1]
    if src.resolve() == dst.resolve():
        return (f"{stage}: stopped by its wall-clock budget at step {step_of(newest)}; rerun it with the same run_dir "
                f"and {group}.resume=true (the default) to continue from {newest}")
    if True:
        tmp = dst.with_name(f".{dst.name}.partial")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(newest, tmp / newest.name)
        if (src / RUN_RECORD).is_file():
            shutil.copy2(src / RUN_RECORD, tmp / RUN_RECORD)
        shutil.rmtree(dst, ignore_errors=True)
        tmp.rename(dst)
    size = sum(f.stat().st_size for f in (dst / newest.name).rglob("*") if f.is_file())
    return (f"{stage}: stopped by its wall-clock budget at step {step_of(newest)}. Kept to resume: {dst / newest.name} "
            f"({size / 1e9:.2f} GB: the adapter and the optimizer state) and {RUN_RECORD}. To resume, build the same "
            f"stage with the same overrides and run name, attaching this kernel: python -m lab kaggle build --notebook "
            f"{stage} --run-name RUN --kernel-sources OWNER/THIS-KERNEL --title '... resumed' OVERRIDES, and push "
            f"it; its install cell copies checkpoints/{dst.name}/ into the scratch folder and {group}.resume=true "
            f"(the default) continues from step {step_of(newest)}")
