"""Processes fedbug starts: a child dies with the process that started it."""

from __future__ import annotations

import contextlib
import ctypes
import signal
import sys


def die_with_parent() -> None:  # pragma: no cover - runs in the child
    """Linux: this process gets SIGKILL when the process that started it dies, however it dies
    (``PR_SET_PDEATHSIG``); elsewhere nothing. Call it in the child (a worker's first step, or
    a ``preexec_fn`` between fork and exec)."""
    if sys.platform != "linux":
        return
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
