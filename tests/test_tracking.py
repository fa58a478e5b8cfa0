"""Live tracking through TRL's `report_to`: the config key is checked, and with `tensorboard` the SFT and GRPO
stages write event files (offline) holding the loss, every reward function's mean, the zero-variance and
truncation shares and the gradient norm, read back here with TensorBoard's own reader."""

from __future__ import annotations

import math
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
pytest.importorskip("tensorboard")

from lab.core import config  # noqa: E402
from lab.train import grpo, sft
from lab.model import lora, models
from lab import LabError
from lab.core.run import tracking_args  # noqa: E402
from lab.core.run import Stage
from lab.puzzles import generate  # noqa: E402
from train_steps import grpo_train, sft_train  # noqa: E402


def scalars(folder) -> dict[str, list[float]]:
    """Every scalar tag in the TensorBoard event files under `folder`, with its values in step order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, list[float]] = {}
    for events in sorted(folder.rglob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events.parent))
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, []).extend(e.value for e in acc.Scalars(tag))
    return out


def test_report_to_is_checked_and_off_by_default(tmp_path):
    assert tracking_args(config.compose([f"run_dir={tmp_path}"]), "02_sft") == {"report_to": "none"}
    with pytest.raises(LabError, match="report_to='neptune' is not one of none, tensorboard, wandb, mlflow"):
        tracking_args(config.compose([f"run_dir={tmp_path}", "report_to=neptune"]), "02_sft")
    cfg = config.compose([f"run_dir={tmp_path}", "run_name=r1", "report_to=tensorboard"])
    assert tracking_args(cfg, "03_grpo") == {"report_to": "tensorboard", "run_name": "r1/03_grpo"}
    assert os.environ["TENSORBOARD_LOGGING_DIR"] == str(tmp_path / "tensorboard" / "03_grpo")


@pytest.mark.slow  # real SFT and GRPO training steps: seconds (the fast lane stays short)
def test_tensorboard_receives_the_sft_loss_and_the_grpo_reward_curves(tmp_path, monkeypatch):
    monkeypatch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)
    from lab.core import owner

    owner.claim_run(tmp_path)  # a run folder, as a stage makes it, before the tiny model is built into it
    puzzles = generate("numeral_system", 6, 0)
    common = [f"run_dir={tmp_path}", f"model.path={tmp_path / 'base_model'}", "report_to=tensorboard"]
    cfg = config.compose([*common, "sft.batch_size=2", "sft.logging_steps=1", "sft.max_steps=2", "sft.save_steps=10"])
    model, tok = models.load(cfg)
    m, _, _, _ = sft_train(cfg, Stage("02_sft", cfg=cfg), puzzles, model, tok)
    got = scalars(tmp_path / "tensorboard" / "02_sft")
    assert len(got["train/loss"]) == m["steps"] == 2 and all(math.isfinite(v) for v in got["train/loss"])

    cfg = config.compose([*common, "grpo.n_prompts=4", "grpo.pass_rate_k=2", "grpo.drop_threshold=1.0",
                          "grpo.drop_unsolved=false", "grpo.num_generations=2", "grpo.prompts_per_step=2",
                          "infer.max_tokens=8", "grpo.max_steps=2", "grpo.save_steps=10", "grpo.logging_steps=1",
                          "grpo.gradient_checkpointing=false", "grpo.mask_truncated_completions=false",
                          "grpo.gradient_check=false"])
    stage = Stage("03_grpo", cfg=cfg)
    model, tok = models.load(cfg)
    pm, _ = lora.attach_lora(cfg, model)
    m, _, log = grpo_train(cfg, stage, puzzles, pm, tok)
    got = scalars(tmp_path / "tensorboard" / "03_grpo")
    for name in m["rewards_per_step"]:  # every reward function's mean, as the lab's own train_log.csv has it
        assert got[f"train/rewards/{name}/mean"] == pytest.approx(m["rewards_per_step"][name]["mean"], abs=1e-4), name
    assert got["train/reward"] == pytest.approx(m["reward_per_step"], abs=1e-4)
    assert got["train/frac_reward_zero_std"] == pytest.approx(m["zero_variance_share_per_step"], abs=1e-4)
    assert got["train/completions/clipped_ratio"] == pytest.approx(m["truncated_share_per_step"], abs=1e-4)
    assert got["train/grad_norm"] == pytest.approx(m["grad_norm_per_step"], abs=1e-4)


def test_a_tracker_that_is_not_installed_is_named_when_the_stage_opens(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(LabError, match=r"report_to=wandb but wandb is not installed \(pip install wandb\)"):
        Stage("99_test", [f"run_dir={tmp_path}", "report_to=wandb"])
    with pytest.raises(LabError, match="report_to='tensorbord'"):
        Stage("99_test", [f"run_dir={tmp_path}", "report_to=tensorbord"])
