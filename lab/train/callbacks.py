"""Trainer callbacks: those SFT (`lab.train.sft`) and GRPO (`lab.train.grpo`) share, and GRPO's guard rails.

What it simplifies:
1. One callback for both trainers: the gradient snapshot of `lab.model.lora.GradientCheck` at the first optimiser step,
   and the wall-clock budget (`sft.wall_clock_budget_min`, `grpo.wall_clock_budget_min`): once it is spent, save a
   checkpoint and stop cleanly (checked after every optimiser step).
2. Step progress: in a notebook open in Jupyter, the Trainer's own live table (transformers'
   `NotebookProgressCallback`); elsewhere (papermill, scripts, terminals: `lab.core.console.live_progress`) plain
   lines (`TrainProgress`, `lab.core.console.Progress`): step/total, the latest loss (SFT) or reward (GRPO),
   elapsed time and ETA, readable in papermill's log as they come.
3. `trainer_callbacks` is the one place a trainer gets its lab callbacks from (tests add a callback by wrapping it);
   `use_text_progress` takes the trainer's own progress bar off where the plain lines print.
4. GRPO: `GroupSpread` wraps the correctness reward to see flat groups, `GuardRails` warns on steps that teach little.
"""

from __future__ import annotations

import time
import warnings

from transformers import TrainerCallback

from lab.core.console import EVERY_S, Progress, live_progress


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

    KEYS = ("loss", "reward", "rollout/switch_s", "rollout/sample_s")  # rollout/*: vLLM rollouts, lab.train.rollouts

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
    """[LabCallback, TrainProgress] for a trainer: `check` is a `lab.model.lora.GradientCheck` or None, `budget_min`
    0 for no budget. TrainProgress prints; the caller takes the trainer's own bar off with `use_text_progress`. In a
    notebook open in Jupyter (`lab.core.console.live_progress`) [LabCallback] alone: the Trainer's live table shows
    the steps."""
    return [LabCallback(check, budget_min), *([] if live_progress() else [TrainProgress()])]


def use_text_progress(trainer) -> None:
    """Take transformers' progress bar off the trainer where `TrainProgress` prints plain lines; in a notebook open
    in Jupyter (`lab.core.console.live_progress`) the bar stays: there it is the live table.

    Inside a Jupyter kernel the Trainer draws an HTML widget, which a headless papermill run shows as
    `<IPython.core.display.HTML object>` and never updates; its text bar (tqdm, redrawn with '\\r') shows only its
    first frame in papermill's log. A line every few seconds shows in both places (lab.core.console). The bar taken
    off is the one the Trainer added, `DEFAULT_PROGRESS_CALLBACK` (transformers/trainer.py: the notebook bar under a
    notebook, else `ProgressCallback`).
    """
    from transformers.trainer import DEFAULT_PROGRESS_CALLBACK

    if not live_progress():
        trainer.remove_callback(DEFAULT_PROGRESS_CALLBACK)


class GroupSpread:
    """Wraps one reward function (TRL still sees its name) and records, per call, the share of groups
    (consecutive runs of `group` completions, as TRL orders them) whose scored samples all got the same
    value. On correctness this is the share of prompts that teach nothing: all right or all wrong. TRL's
    `frac_reward_zero_std` is measured on the weighted total, where a small format reward can vary while
    correctness does not, and so hides exactly this."""

    def __init__(self, func, group: int):
        self.func, self.group = func, int(group)
        self.__name__ = self.__qualname__ = func.__name__
        self.shares: list[float] = []

    def __call__(self, *args, **kwargs):
        rewards = self.func(*args, **kwargs)
        groups = [rewards[i:i + self.group] for i in range(0, len(rewards), self.group)]
        flat = [len({r for r in g if r is not None}) <= 1 for g in groups]
        self.shares.append(sum(flat) / len(flat) if flat else 1.0)
        return rewards


class GuardRails(TrainerCallback):
    """GRPO: warns (and records in `warnings`) when truncation or zero-variance groups dominate a step (on the total
    reward, and on correctness alone when `spread` tracks it), or when no completion of a step could be scored;
    the shares are `grpo.truncation_warn_share` and `grpo.zero_variance_warn_share` (`g` is the `grpo` node)."""

    def __init__(self, g, spread: GroupSpread | None = None):
        self.trunc, self.zero_var, self.spread = g.truncation_warn_share, g.zero_variance_warn_share, spread
        self.warnings: list[str] = []

    def on_log(self, args, state, control, logs=None, **kw):
        logs = logs or {}
        if "completions/mean_length" not in logs:  # not a training step's log (e.g. the final summary)
            return
        clipped, zero = logs.get("completions/clipped_ratio"), logs.get("frac_reward_zero_std")
        step, trunc, zero_var, spread = state.global_step, self.trunc, self.zero_var, self.spread
        if clipped is not None and clipped > trunc:
            self._warn(f"step {step}: {clipped:.0%} of completions hit max_completion_length "
                       f"(grpo.truncation_warn_share={trunc})")
        if zero is not None and zero > zero_var:
            self._warn(f"step {step}: {zero:.0%} of groups have zero reward variance, no learning signal "
                       f"(grpo.zero_variance_warn_share={zero_var})")
        flat = spread.shares[-1] if spread is not None and spread.shares else None
        if flat is not None and flat > zero_var:
            self._warn(f"step {step}: in {flat:.0%} of groups every sample is equally right or wrong: no "
                       f"correctness signal, whatever the other rewards do (grpo.zero_variance_warn_share={zero_var})")
        if logs.get("reward") is None:
            self._warn(f"step {step}: no completion could be scored (every reward None, e.g. all truncated "
                       "under mask_truncated_completions): this step taught nothing")

    def _warn(self, msg):
        self.warnings.append(msg)
        warnings.warn(msg, stacklevel=2)
