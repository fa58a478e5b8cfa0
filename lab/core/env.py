"""The lab's changes to the process environment, in one place.

Every variable the lab sets goes through `setenv` (or `scoped`, for the length of a block), called where the setting
is decided, so `git grep -nE "env[.](setenv|scoped)" lab/` lists them all. What is set is inherited by the processes
started afterwards (the stage kernels papermill starts, vLLM's engine), and a library that reads a variable when it
is imported needs it set before that import.
"""

from __future__ import annotations

import contextlib
import os


def setenv(values: dict[str, str], keep: bool = False) -> None:
    """Set each of `values` in `os.environ`; with `keep`, a variable already set keeps its value (the user's wins)."""
    for k, v in values.items():
        if not (keep and k in os.environ):
            os.environ[k] = str(v)


@contextlib.contextmanager
def scoped(values: dict[str, str], keep: bool = False):
    """`setenv(values, keep)` for the block; afterwards each of those variables is as it was (unset if it was)."""
    before = {k: os.environ.get(k) for k in values}
    setenv(values, keep)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def unset(names) -> None:
    """Remove each of `names` from `os.environ` (absent ones are skipped)."""
    for k in names:
        os.environ.pop(k, None)
