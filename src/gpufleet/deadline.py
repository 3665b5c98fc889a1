"""A wall-clock deadline for work gpufleet does not control (Ansible's templating).

In the main thread a timer signal interrupts the work even inside one slow expression;
elsewhere :meth:`Deadline.check` between steps is the bound.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any


class DeadlineExceeded(BaseException):
    """Not an Exception: code that swallows errors (``strict: false``) must not swallow it."""


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds
        self.expired = False

    def check(self) -> None:
        if self.expired or time.monotonic() > self.end:
            self.expired = True
            raise DeadlineExceeded(self.seconds)

    def _on_alarm(self, signum: int, frame: FrameType | None) -> None:
        self.expired = True
        raise DeadlineExceeded(self.seconds)


@contextmanager
def deadline(seconds: float) -> Iterator[Deadline]:
    """``with deadline(30) as d: ... d.check() ...``; raises :class:`DeadlineExceeded`."""
    limit = Deadline(seconds)
    if threading.current_thread() is not threading.main_thread():
        yield limit
        return
    previous: Any = signal.signal(signal.SIGALRM, limit._on_alarm)
    old_timer = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield limit
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if old_timer[0]:
            signal.setitimer(signal.ITIMER_REAL, *old_timer)
