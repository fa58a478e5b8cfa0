"""What a person sees while a stage runs: plain progress lines, known-harmless library warnings said once.

`Progress` prints one plain line at most every `EVERY_S` seconds (and at the end), e.g.
`SFT step 12/150 (8%) | loss 1.234 | 0:01:10 elapsed, ETA 0:13:20`. Plain lines, not a redrawn bar: papermill
logs each stream message of the kernel as it arrives (papermill/clientwrap.py, `log_output_message`), so a tqdm
bar that redraws itself with '\\r' shows only its first frame in `make demo`'s console, and transformers' notebook
bar shows as `<IPython.core.display.HTML object>`; a line shows the same in a terminal, a log file and Jupyter.
SFT and GRPO print their steps with it (`lab.train.callbacks.TrainProgress`), generation counts puzzles with it
(`lab.model.generate`).

`quiet_known_warnings()` (run when a stage opens, `lab.core.run.Stage`) turns library messages that are expected in
this lab into one explanatory note each, shown once per process:
- transformers' "`...` is falling back to its reference PyTorch implementation" (one line per Mamba-2 kernel at
  every model load; transformers/integrations/hub_kernels.py) where causal_conv1d / mamba_ssm are not installed;
- TRL's "All reward functions returned None ..." (trl/trainer/grpo_trainer.py, `_calculate_rewards`) with the whole
  puzzle, which is what `grpo.mask_truncated_completions=true` asks for: a completion cut at the budget gets no
  reward (lab.train.rewards), and the lab's own guard (lab.train.grpo) warns when a whole step had nothing to score.
The Jupyter kernel's "running over TCP without encryption" warning (ipykernel/kernelapp.py; the kernel papermill
starts listens on localhost) is silenced where papermill starts the kernel (`lab.runs.pipeline.execute_stage`).

What it simplifies: one interval for every progress line; the ETA is the mean rate since this run (re)started.
"""

from __future__ import annotations

import logging
import time

EVERY_S = 10.0  # seconds between two progress lines


def _clock(seconds: float) -> str:
    s = int(max(seconds, 0))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class Progress:
    """A counter that prints `<desc> n/total <unit> (pct) | info | elapsed, ETA` at its first update, then at most
    every `every_s` seconds, and once more at `close()` if the last count was not printed. `enabled=False`:
    silent."""

    def __init__(self, desc: str, total: int, unit: str = "", initial: int = 0, enabled: bool = True,
                 every_s: float = EVERY_S):
        self.desc, self.total, self.unit, self.enabled, self.every_s = desc, int(total), unit, enabled, every_s
        self.n = self.initial = int(initial)
        self.info: dict[str, str] = {}
        self.t0 = time.time()
        self.last_print: float | None = None
        self.printed_n: int | None = None

    def update(self, k: int = 1, **info) -> None:
        self.set(self.n + int(k), **info)

    def set(self, n: int, **info) -> None:
        self.n = int(n)
        self.info.update({k: str(v) for k, v in info.items()})
        now = time.time()
        if self.printed_n != self.n and (self.last_print is None or now - self.last_print >= self.every_s
                                         or self.n >= self.total):
            self._print(now)

    def line(self, now: float | None = None) -> str:
        elapsed = (now or time.time()) - self.t0
        pct = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        parts = [f"{self.desc} {self.n}/{self.total}{' ' + self.unit if self.unit else ''}{pct}"]
        parts += [f"{k} {v}" for k, v in self.info.items()]
        done, left = self.n - self.initial, self.total - self.n
        eta = f", ETA {_clock(elapsed / done * left)}" if done > 0 and left > 0 else ""
        parts.append(f"{_clock(elapsed)} elapsed{eta}")
        return " | ".join(parts)

    def _print(self, now: float) -> None:
        self.last_print, self.printed_n = now, self.n
        if self.enabled:
            print(self.line(now), flush=True)

    def close(self) -> None:
        if self.printed_n != self.n:
            self._print(time.time())


# logger name, a piece of the message, the note shown (once) in its place
KNOWN_WARNINGS = (
    ("transformers.integrations.hub_kernels", "is falling back to its reference PyTorch implementation",
     "note: the Mamba-2 layers run on transformers' PyTorch reference path (causal_conv1d / mamba_ssm not "
     "installed): correct, and expected on CPU, but much slower on a GPU, where the GPU extra should provide them "
     "(this note replaces transformers' one line per kernel)"),
    ("trl.trainer.grpo_trainer", "All reward functions returned None",
     "note: TRL reports a completion whose every reward is None: with grpo.mask_truncated_completions=true a "
     "completion cut at the budget is left out of the loss on purpose (lab.train.rewards); further such messages are "
     "not shown, and the lab warns itself when a whole step had nothing to score"),
)


class _SayOnce(logging.Filter):
    def __init__(self, piece: str, note: str):
        super().__init__()
        self.piece, self.note, self.said = piece, note, False

    def filter(self, record: logging.LogRecord) -> bool:
        if self.piece not in record.getMessage():
            return True
        if self.said:
            return False
        self.said = True
        record.msg, record.args = self.note, ()
        return True


def quiet_known_warnings() -> None:
    """Put the `KNOWN_WARNINGS` filters on their loggers (once per process; calling again changes nothing)."""
    for name, piece, note in KNOWN_WARNINGS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _SayOnce) and f.piece == piece for f in logger.filters):
            logger.addFilter(_SayOnce(piece, note))
