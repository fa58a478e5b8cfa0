"""Test helper: mark a hand-made stage folder finished, as `lab.core.run.Stage.finish` would (a manifest with the
content hash of every file in it), so that the lab reads it as a finished, current stage."""

from __future__ import annotations

from pathlib import Path

from lab.core import lineage
from lab.core.io import atomic_write_json


def mark_finished(stage_dir: Path, **manifest) -> Path:
    """Write `stage_dir`/manifest.json: status finished, the outputs' content hashes, `manifest`'s extra fields."""
    return atomic_write_json(Path(stage_dir) / "manifest.json",
                             {"stage": Path(stage_dir).name, "status": "finished", "end_time": "now", "inputs": {},
                              **manifest, "outputs": lineage.outputs(Path(stage_dir))})
