"""What a person sees while a stage runs: one progress line, training as a live table or that line, known-harmless
library notes as one line each, a refusal as one sentence.

`Progress` counts steps (`SFT step 12/150 (8%) | loss 1.234 | 0:01:10 elapsed, ETA 0:13:20`): in a notebook kernel
one display line redrawn in place, whose last state is what the saved notebook keeps; elsewhere a plain line at most
every `EVERY_S` seconds, also written to the runner's console when it sets `LAB_PROGRESS_ECHO`. SFT, GRPO,
generation and the solvers count with it. `live_progress()` says where the Trainer's own live table is wanted
instead (a notebook open in Jupyter); `show_figure(fig)` draws a figure inline. `quiet_known_warnings()` (run when
a stage opens) turns library messages expected in this lab into one plain note each, once per process;
`quiet_progress_bars()` turns off the libraries' tqdm bars, which freeze at their first frame in a saved notebook.
The ETA is the mean rate since this run (re)started. Which messages, and the library source behind each behaviour:
docs/internals.md, lab.core.console.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import time

from lab import LabError

EVERY_S = 10.0  # seconds between two plain progress lines
LIVE_EVERY_S = 1.0  # seconds between two redraws of the line in a notebook
ECHO_ENV = "LAB_PROGRESS_ECHO"  # set by a stage runner that shows its kernels' output on its console


def _clock(seconds: float) -> str:
    s = int(max(seconds, 0))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class Progress:
    """A counter shown as `<desc> n/total <unit> (pct) | info | elapsed, ETA`: in a notebook kernel one line redrawn in
    place (at most every `LIVE_EVERY_S` seconds, and at `close()`), elsewhere a plain line at its first update, then at
    most every `every_s` seconds, and once more at `close()` if the last count was not printed. `enabled=False`:
    silent."""

    def __init__(self, desc: str, total: int, unit: str = "", initial: int = 0, enabled: bool = True,
                 every_s: float = EVERY_S):
        self.desc, self.total, self.unit, self.enabled, self.every_s = desc, int(total), unit, enabled, every_s
        self.n = self.initial = int(initial)
        self.info: dict[str, str] = {}
        self.t0 = time.time()
        self.last_print: float | None = None
        self.printed_n: int | None = None
        self.live = enabled and in_kernel()
        self._handle = None  # the notebook's display line
        self._shown: tuple[float, int] | None = None  # (when, count) of its last redraw

    def update(self, k: int = 1, **info) -> None:
        self.set(self.n + int(k), **info)

    def set(self, n: int, **info) -> None:
        self.n = int(n)
        self.info.update({k: str(v) for k, v in info.items()})
        now = time.time()
        if self.live and (self._shown is None or now - self._shown[0] >= LIVE_EVERY_S or self.n >= self.total):
            self._redraw(now)
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

    def _redraw(self, now: float) -> None:
        from IPython.display import display

        self._shown = (now, self.n)
        data = {"text/plain": self.line(now)}
        if self._handle is None:
            self._handle = display(data, raw=True, display_id=True)
        else:
            self._handle.update(data, raw=True)

    def _print(self, now: float) -> None:
        first, self.last_print, self.printed_n = self.last_print is None, now, self.n
        if not self.enabled:
            return
        if not self.live:
            print(self.line(now), flush=True)
        elif os.environ.get(ECHO_ENV) and not first:  # papermill's log already shows the display line's first state
            _echo(self.line(now))

    def close(self) -> None:
        now = time.time()
        if self.live and (self._shown is None or self._shown[1] != self.n):
            self._redraw(now)
        if self.printed_n != self.n:
            self._print(now)


def _echo(line: str) -> None:
    """`line` to this process's own stderr, bypassing a kernel's capture of it into the notebook: ipykernel keeps
    the stream it redirected as `_original_stdstream_copy` (ipykernel/iostream.py, `OutStream`); without that
    capture the process's stderr is `sys.__stderr__`."""
    fd = getattr(sys.stderr, "_original_stdstream_copy", None)
    with contextlib.suppress(OSError, AttributeError, ValueError):
        os.write(sys.__stderr__.fileno() if fd is None else fd, (line + "\n").encode())


def in_kernel() -> bool:
    """True inside an IPython kernel (Jupyter, papermill, VS Code), where rich output (HTML, PNG) can be displayed;
    the same test transformers makes (transformers/utils/import_utils.py, `is_in_notebook`: `IPKernelApp` in the
    shell's config)."""
    ipython = sys.modules.get("IPython")
    try:
        shell = ipython.get_ipython() if ipython is not None else None
        return shell is not None and "IPKernelApp" in shell.config
    except (AttributeError, TypeError):
        return False


def live_progress() -> bool:
    """Whether training shows the Trainer's live table (transformers' `NotebookProgressCallback`) instead of plain
    lines: `LAB_PROGRESS=live` or `LAB_PROGRESS=plain` decides when set; otherwise live only in a kernel that a
    Jupyter server started. jupyter_server gives the kernels it starts `JPY_SESSION_NAME` (the notebook's path,
    jupyter_server/services/sessions/sessionmanager.py); papermill starts its kernel through jupyter_client alone,
    without it, so a headless run (`python -m lab demo`, a sweep, papermill's own command line) prints plain lines,
    which its log shows as they come (an HTML table shows there as `<IPython.core.display.HTML object>`). A papermill
    run started from inside a Jupyter kernel inherits that kernel's environment: set `LAB_PROGRESS=plain` there."""
    mode = os.environ.get("LAB_PROGRESS", "").strip().lower()
    if mode in ("live", "plain"):
        return mode == "live"
    return in_kernel() and bool(os.environ.get("JPY_SESSION_NAME"))


def show_figure(fig) -> None:
    """Draw a matplotlib Figure (lab.core.plots) inline in a notebook, rendered as PNG at the DPI its PNG file has;
    outside a kernel nothing is drawn. Rendered here rather than left to IPython's figure formatter, which exists
    only under the inline back-end (ipykernel sets it only when MPLBACKEND is unset; the Makefile sets Agg)."""
    if not in_kernel():
        return
    from IPython.display import Image, display
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from lab.core.plots import DPI

    if fig.canvas is None or not hasattr(fig.canvas, "print_png"):
        FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    display(Image(data=buf.getvalue(), format="png"))


# logger name, a piece of the message, the one-line note printed (once) in its place
KNOWN_WARNINGS = (
    ("transformers.integrations.hub_kernels", "is falling back to its reference PyTorch implementation",
     "note: Mamba-2 runs on transformers' PyTorch reference path (causal_conv1d / mamba_ssm not installed): "
     "expected on CPU, slow on a GPU"),
    ("trl.trainer.grpo_trainer", "All reward functions returned None",
     "note: completions cut at the budget get no reward (grpo.mask_truncated_completions=true); TRL's further "
     "messages about them are not shown"),
)


class _SayOnce(logging.Filter):
    """Drops the records holding `piece`; the first one prints `note` on stdout instead (a plain line, where a
    logger's stderr shows as a red box in a notebook)."""

    def __init__(self, piece: str, note: str):
        super().__init__()
        self.piece, self.note, self.said = piece, note, False

    def filter(self, record: logging.LogRecord) -> bool:
        if self.piece not in record.getMessage():
            return True
        if not self.said:
            self.said = True
            print(self.note, flush=True)
        return False


def quiet_known_warnings() -> None:
    """Put the `KNOWN_WARNINGS` filters on their loggers (once per process; calling again changes nothing)."""
    for name, piece, note in KNOWN_WARNINGS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _SayOnce) and f.piece == piece for f in logger.filters):
            logger.addFilter(_SayOnce(piece, note))


def quiet_progress_bars() -> None:
    """Turn off the tqdm bars of transformers (e.g. "Loading weights"), datasets (TRL's map and filter passes over
    the training set) and huggingface_hub: a redrawn bar freezes at its first frame in a saved notebook and in
    papermill's log. The lab's own `Progress` counts what takes long."""
    os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] = "1"
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    with contextlib.suppress(ImportError):
        from datasets.utils import logging as ds_logging

        ds_logging.disable_progress_bar()


# ---- every error a sentence -----------------------------------------------------------------------------------

DEBUG_ENV = "LAB_DEBUG"  # LAB_DEBUG=1 (or --debug on the command line): tracebacks instead of one-line errors
INSTALL_HINTS = {"vllm": "pip install -e '.[gpu]' on a GPU machine, or `make test-vllm` for vLLM's CPU build",
                 "unsloth": "pip install -e '.[gpu]'", "mamba_ssm": "scripts/build_mamba_wheels.sh",
                 "causal_conv1d": "scripts/build_mamba_wheels.sh"}


def debugging() -> bool:
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def error_sentence(e: BaseException) -> str:
    """One line for an exception that is not the lab's own (a LabError is its message): the file it concerns and
    what to do. The classes a hostile probe reached: Ctrl-C, OS errors (permission, a folder or missing file where a
    file was expected, a name too long, a full disk), safetensors' refusals, a dead notebook kernel, a package not
    installed; anything else is named as unexpected."""
    import errno

    name = type(e).__name__
    where = getattr(e, "filename", None)
    if isinstance(e, KeyboardInterrupt):
        return ("interrupted (Ctrl-C): what finished is kept; a stage that was running left its previous result as it "
                "was (its attempt is set aside); run the same command again to go on")
    if isinstance(e, ModuleNotFoundError):
        top = (e.name or "").split(".")[0]
        return (f"the Python package {top!r} is not installed in this environment "
                f"({INSTALL_HINTS.get(top, f'pip install {top}')})")
    if isinstance(e, PermissionError):
        return f"{where}: permission denied: make it writable for you, or choose another path (run_name=, --out)"
    if isinstance(e, IsADirectoryError):
        return f"{where}: is a folder, where a file was expected: pass a file path"
    if isinstance(e, NotADirectoryError):
        return f"{where}: a part of this path is a file, where a folder was expected"
    if isinstance(e, FileNotFoundError):
        return f"{where}: not found"
    if isinstance(e, OSError) and e.errno == errno.ENAMETOOLONG:
        return f"{where}: a name in this path is too long for the file system: use a shorter run_name or path"
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"{where or 'a file'}: the disk is full (or over quota): free space, or write elsewhere"
    if isinstance(e, OSError):
        return f"{where or 'a file'}: {e.strerror or e}"
    if name == "SafetensorError":
        return f"a .safetensors file cannot be read ({e}): it is truncated or damaged; copy or save it again"
    if name == "DeadKernelError":
        return ("a notebook's kernel died (most often killed by the system for lack of memory): lower the batch "
                "sizes, or run on a machine with more memory")
    return f"unexpected {name}: {e} (most likely a bug in the lab: please report it with the traceback)"


def report_error(e: BaseException) -> int:
    """Print `error_sentence` (a LabError: its message) on stderr with where the traceback is; the exit status."""
    text = str(e) if isinstance(e, LabError) else error_sentence(e)
    hint = "" if isinstance(e, LabError) else f"\n(the traceback: rerun with --debug or {DEBUG_ENV}=1)"
    print(f"error: {text}{hint}", file=sys.stderr)
    return 130 if isinstance(e, KeyboardInterrupt) else 2
