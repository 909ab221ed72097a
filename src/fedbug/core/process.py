"""Processes fedbug starts: a child dies with the process that started it."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from collections.abc import Iterator


def die_with_parent() -> None:  # pragma: no cover - runs in the child
    """Linux: this process gets SIGKILL when the process that started it dies, however it dies
    (``PR_SET_PDEATHSIG``); elsewhere nothing. Call it in the child (a worker's first step, or
    a ``preexec_fn`` between fork and exec)."""
    if sys.platform != "linux":
        return
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@contextlib.contextmanager
def environment_variable(name: str, value: str | None) -> Iterator[None]:
    """``name`` set to ``value`` (left as it is where ``value`` is None) inside the block, so
    the processes started meanwhile inherit it; as it was after the block."""
    before = os.environ.get(name)
    if value is not None:
        os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before
