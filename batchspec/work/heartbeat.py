"""Heartbeats that never compare two hosts' clocks: a record that changes, watched by a clock
of the watcher's own.

Each worker rewrites one record, ``leases/<worker>.progress.json``, every ``heartbeat_s``
(``Heartbeat``). Whether a worker is alive is decided by whoever watches that record, with
nothing but its own monotonic clock (``Observer``): the record is silent when its version
(inode, modification time and size, as the filesystem reports them: compared only with the
same record's earlier versions, never with anyone's "now") has not changed for
``lease_timeout_s`` of the watcher's time. No host's clock is compared with another's, or
with the file server's, so clock skew cannot make a live worker look dead.

What remains assumed: clocks *run* at about the same rate everywhere (an hour of one is an
hour of another, to a few percent), and the file server shows a rewritten record to other
clients within a small part of the timeout (NFS attribute caches: ``actimeo`` seconds,
60 at most by default, against a 300 s timeout).

A beat that fails (ESTALE, EIO: a shared filesystem's bad moment) is tried again, after 0.5,
1, 2 ... s up to ``heartbeat_s``; a worker that has not beaten for half a lease timeout
stops claiming (``on_lost``): its leases may be taken over soon, and it says why and exits
non-zero rather than work on as if it held them.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Hashable
from pathlib import Path


def version(path: Path) -> tuple[int, int, int] | None:
    """A file's version: (inode, mtime in ns, size); None if it is missing. A record is
    replaced whole at every beat (a new inode), so any beat changes it."""
    st = os.stat(path)
    return st.st_ino, st.st_mtime_ns, st.st_size


class Observer:
    """What this process has seen of other workers' heartbeats, on its own monotonic clock."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[Hashable, float]] = {}

    def silent_for(self, key: str, seen: Hashable) -> float:
        """Seconds (of this process's clock) since ``key`` was first seen as ``seen``: 0 at a
        first look or after a change, so nothing is stale before it was watched a timeout."""
        now = time.monotonic()
        last = self._seen.get(key)
        if last is None or last[0] != seen:
            self._seen[key] = (seen, now)
            return 0.0
        return now - last[1]


class Heartbeat:
    """The thread that rewrites a worker's record every ``period_s``, surviving errors."""

    def __init__(self, write: Callable[[], object], period_s: float, lost_after_s: float):
        self._write = write
        self.period_s = period_s
        self.lost_after_s = lost_after_s
        self.last_ok = time.monotonic()
        """When a beat last succeeded (or the heartbeat was made), on this process's clock."""
        self.lost: str | None = None
        """Why beating failed for ``lost_after_s``; None while it works."""
        self.on_lost: Callable[[str], None] | None = None
        self.stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def beat_now(self) -> bool:
        """Write the record once; False (the error counted towards ``lost``) when the
        filesystem refused."""
        try:
            self._write()
        except OSError as exc:
            self._failed(exc)
            return False
        self.last_ok = time.monotonic()
        return True

    def _failed(self, exc: OSError) -> None:
        silent = time.monotonic() - self.last_ok
        print(f"batchspec: heartbeat failed ({exc}); last beat {silent:.0f} s ago", file=sys.stderr)
        if self.lost is None and silent >= self.lost_after_s:
            self.lost = (
                f"the heartbeat record could not be written for {silent:.0f} s (last error: "
                f"{exc}): stopped claiming, since other workers may take its units over"
            )
            if self.on_lost is not None:
                self.on_lost(self.lost)

    def start(self, tick: Callable[[], bool]) -> None:
        """Beat (``tick``: True when it wrote) every ``period_s`` after the last good beat; a
        failed one again after a growing pause. Any write of the record counts as a beat."""

        def loop() -> None:
            backoff = 0.5
            while True:
                due = self.last_ok + self.period_s - time.monotonic()
                if due > 0:  # (a commit's write may have beaten meanwhile: due again)
                    if self.stopped.wait(due):
                        return
                    continue
                if tick():
                    backoff = 0.5
                elif self.stopped.wait(min(backoff, self.period_s)):
                    return
                else:
                    backoff *= 2

        self._thread = threading.Thread(target=loop, name="lease-heartbeat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.stopped.set()
        if self._thread is not None:
            self._thread.join()
