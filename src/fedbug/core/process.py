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


#: the warning filter (``PYTHONWARNINGS``) multiprocessing's resource tracker starts with: a
#: process SIGKILLed with semaphores of a pool still open (a ``sweep --jobs`` parent) left the
#: tracker to remove them, and it printed "UserWarning: resource_tracker: There appear to be 9
#: leaked semaphore objects to clean up at shutdown" and its source line under the killed command
TRACKER_QUIET = "ignore::UserWarning:multiprocessing.resource_tracker"


def quiet_resource_tracker() -> None:
    """Start multiprocessing's resource tracker, where it is not running yet, with its warnings
    off (:data:`TRACKER_QUIET`): it still removes what a killed process left, without a
    traceback-like line after the command has died. Call it before the pool or queue whose
    semaphores it tracks; a tracker already running is left as it is. POSIX only (Windows has
    none)."""
    if sys.platform == "win32":
        return
    from multiprocessing import resource_tracker

    given = os.environ.get("PYTHONWARNINGS")
    with environment_variable(
        "PYTHONWARNINGS", f"{given},{TRACKER_QUIET}" if given else TRACKER_QUIET
    ):
        resource_tracker.ensure_running()
