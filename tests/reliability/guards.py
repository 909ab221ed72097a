"""Guards the reliability drills share: a read that would block fails the test instead."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from typing import Any


class Blocked(BaseException):
    """A read that blocked (no ``except OSError`` or ``except Exception`` takes it)."""


@contextlib.contextmanager
def at_most(seconds: int) -> Iterator[None]:
    """Fail (not hang) where an in-process read blocks: SIGALRM interrupts it."""

    def late(signum: int, frame: Any) -> None:
        raise Blocked(f"blocked for {seconds} s")

    before = signal.signal(signal.SIGALRM, late)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)
