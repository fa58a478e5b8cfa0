"""Trainer callbacks that SFT (`lab.sft`) and GRPO (`lab.grpo`) share.

What it simplifies:
1. One callback for both trainers: the gradient snapshot of `lab.lora.GradientCheck` at the first optimiser step,
   and the wall-clock budget (`sft.wall_clock_budget_min`, `grpo.wall_clock_budget_min`): once it is spent, save a
   checkpoint and stop cleanly (checked after every optimiser step).
2. Step progress as plain lines (`TrainProgress`, `lab.console.Progress`): step/total, the latest loss (SFT) or
   reward (GRPO), elapsed time and ETA, readable in Jupyter and in papermill's log alike.
3. `trainer_callbacks` is the one place a trainer gets its lab callbacks from (tests add a callback by wrapping it).
"""

from __future__ import annotations

import time

from transformers import TrainerCallback

from lab.console import EVERY_S, Progress


class LabCallback(TrainerCallback):
    """Gradient snapshot at the first optimiser step; wall-clock budget: save and stop."""

    def __init__(self, check=None, budget_min: float = 0.0):
        self.check = check
        self.budget_min = budget_min
        self.t0 = time.time()
        self.stopped_by_budget = False

    def on_train_begin(self, args, state, control, **kw):
        self.t0 = time.time()

    def on_pre_optimizer_step(self, args, state, control, **kw):
        if self.check is not None:
            self.check.record_grads()

    def on_step_end(self, args, state, control, **kw):
        budget = self.budget_min
        if budget and (time.time() - self.t0) / 60 >= budget and state.global_step < state.max_steps:
            print(f"wall-clock budget of {budget} min reached at step {state.global_step}: saving and stopping")
            control.should_save = True
            control.should_training_stop = True
            self.stopped_by_budget = True
        return control


class TrainProgress(TrainerCallback):
    """`SFT step 12/150 (8%) | loss 1.234 | ...` (GRPO: `reward`) on the main process, every `EVERY_S` seconds;
    the trainer's name comes from its arguments' class (SFTConfig, GRPOConfig). A resumed run counts from its
    checkpoint's step."""

    KEYS = ("loss", "reward")

    def __init__(self, every_s: float = EVERY_S):
        self.every_s = every_s
        self.bar: Progress | None = None
        self.info: dict[str, str] = {}

    def on_train_begin(self, args, state, control, **kw):
        cls = type(args).__name__  # SFTConfig, GRPOConfig; plain TrainingArguments: "train"
        name = cls.removesuffix("Config") if cls.endswith("Config") and cls != "Config" else "train"
        self.bar = Progress(f"{name} step", state.max_steps, initial=state.global_step,
                            enabled=state.is_world_process_zero, every_s=self.every_s)

    def on_log(self, args, state, control, logs=None, **kw):
        for k in self.KEYS:
            if logs and isinstance(logs.get(k), (int, float)):
                self.info[k] = f"{logs[k]:.4g}"
        if self.bar is not None and state.global_step > self.bar.initial:
            self.bar.set(state.global_step, **self.info)

    def on_step_end(self, args, state, control, **kw):
        # a step that logs is printed by on_log, which comes after (transformers' DefaultFlowCallback, first in the
        # list, has set should_log by now), so the line carries this step's loss or reward
        if self.bar is not None and not control.should_log:
            self.bar.set(state.global_step, **self.info)

    def on_train_end(self, args, state, control, **kw):
        if self.bar is not None:
            self.bar.info.update(self.info)
            self.bar.close()


def trainer_callbacks(check, budget_min: float) -> list:
    """[LabCallback, TrainProgress] for a trainer: `check` is a `lab.lora.GradientCheck` or None, `budget_min` 0 for
    no budget. The trainer's own progress bar is removed (`lab.trl_cpu.use_text_progress`): TrainProgress prints."""
    return [LabCallback(check, budget_min), TrainProgress()]
