"""Stopping on a signal: stop claiming, finish units in flight by a deadline, hand back the rest."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator


class StopFlag:
    """Set by SIGTERM/SIGINT: stop claiming, finish or abandon in-flight units by a deadline."""

    def __init__(self, grace_s: float):
        self.grace_s = grace_s
        self.deadline: float | None = None
        self.signal: int | None = None
        self.tripped = threading.Event()
        """Set with the deadline: wakes threads that act on a stop (not the signal handler)."""

    def trip(self, signum: int, _frame: object = None) -> None:
        if self.deadline is None:
            self.signal = signum
            self.deadline = time.monotonic() + self.grace_s
            self.tripped.set()

    @property
    def stopping(self) -> bool:
        return self.deadline is not None

    def expired(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopFlag]:
        """Handle SIGTERM/SIGINT while inside (main thread only; elsewhere a no-op)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        old = {s: signal.signal(s, self.trip) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield self
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)
