"""Stopping on a signal: stop claiming, finish units in flight by a deadline, hand back the rest;
a second signal quits at once."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator

from batchspec.engines.procs import StartAborted, abort_start, kill_children
from batchspec.engines.quiet import terminal

REPEAT_S = 1.0
"""A signal within this long of the first is the same stop: a signal to the whole process group
reaches a worker directly and again through the ``--workers`` launcher that forwards it."""


class StopFlag:
    """Set by SIGTERM/SIGINT: stop claiming, finish or abandon in-flight units by a deadline.

    The engine's processes do not see these signals (``engines.procs``): it keeps running the
    units in flight until the worker closes it. An engine that is still starting has none: its
    start ends at once (``StartAborted`` out of the worker's ``open_engine``). A second signal
    (a second Ctrl-C) quits at once: the engine is killed, and the leases left behind are
    taken over by the next run at once on this host (their holder is gone), or after the
    lease timeout elsewhere.
    """

    def __init__(self, grace_s: float):
        self.grace_s = grace_s
        self.deadline: float | None = None
        self.signal: int | None = None
        self._first = 0.0
        self.tripped = threading.Event()
        """Set with the deadline: wakes threads that act on a stop (not the signal handler)."""

    def trip(self, signum: int, _frame: object = None) -> None:
        now = time.monotonic()
        if self.deadline is None:
            self.signal = signum
            self._first = now
            self.deadline = now + self.grace_s
            self.tripped.set()
            print(
                f"batchspec: {signal.Signals(signum).name}: finishing the units in flight "
                f"(up to {self.grace_s:g} s); signal again to quit at once",
                file=terminal(),
                flush=True,
            )
            abort_start()  # an engine that is starting has nothing in flight: ended now
        elif now - self._first >= REPEAT_S:
            self.quit_now(signum)

    def halt(self, reason: str) -> None:
        """Stop as on a signal, for a reason of the worker's own (its heartbeat is lost): no
        more claims, the units in flight finished by the deadline or handed back."""
        if self.deadline is None:
            self.deadline = time.monotonic() + self.grace_s
            self.tripped.set()
            print(f"batchspec: {reason}", file=terminal(), flush=True)

    @staticmethod
    def quit_now(signum: int) -> None:
        """Kill this process's children (the engine; not the resource tracker, which then
        removes its shared memory: ``kill_children``) and exit, skipping every cleanup."""
        print("batchspec: second signal: quitting now", file=terminal(), flush=True)
        kill_children()
        os._exit(128 + signum)

    @property
    def stopping(self) -> bool:
        return self.deadline is not None

    def expired(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopFlag]:
        """Handle SIGTERM/SIGINT while inside (main thread only; elsewhere a no-op). A start
        that a stop ended (``StartAborted``) ends the inside as the stop would have."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        old = {s: signal.signal(s, self.trip) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield self
        except StartAborted:
            pass
        finally:
            # After a stop, the handler stays for the clean-up that follows (the engine's
            # close, the leases handed back): a second signal then still quits at once with
            # 128 + its number, where the old handler would end the process some other way.
            if not self.stopping:
                for s, handler in old.items():
                    signal.signal(s, handler)
