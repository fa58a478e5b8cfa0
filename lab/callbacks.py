"""Trainer callbacks that SFT (`lab.sft`) and GRPO (`lab.grpo`) share.

What it simplifies:
1. One callback for both trainers: the gradient snapshot of `lab.lora.GradientCheck` at the first optimiser step,
   and the wall-clock budget (`sft.wall_clock_budget_min`, `grpo.wall_clock_budget_min`): once it is spent, save a
   checkpoint and stop cleanly (checked after every optimiser step).
2. `trainer_callbacks` is the one place a trainer gets its lab callbacks from (tests add a callback by wrapping it).
"""

from __future__ import annotations

import time

from transformers import TrainerCallback


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


def trainer_callbacks(check, budget_min: float) -> list:
    """[LabCallback] for a trainer: `check` is a `lab.lora.GradientCheck` or None, `budget_min` 0 for no budget."""
    return [LabCallback(check, budget_min)]
