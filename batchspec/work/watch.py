"""Who takes a dead worker's units over when no walk reaches them.

Workers walk the plan from points of their own and look again at the units they found held
(``work.claims``). A worker killed mid-run holds the units at the head of its stretch: the
others walk up to them only when their own stretches are done, hours later in a long run (in
the fleet simulator at 32 units per worker, 600-1,000 s after the kill against a bound of
~350). So every worker also watches one other: the next one among the workers with a record
in leases/, in the order of a hash of their names (the last watches the first), one stat of
its record every ``WATCH_S``. Once that record is older than the lease timeout, the watcher
takes its units over (the record lists them), retires the record, and looks at the next one
at once. Hashed, not by name: a node that dies takes all its workers, whose names (host
first) sort together, and one watcher of all of them ran their units one per pull of its
engine (at 1,000 workers, the last 667 s after the kill against a bound of 470); in hash
order each dead worker has a watcher of its own, most likely alive. One stat per worker per
``WATCH_S`` while the one it watches lives, whatever the fleet's size.
"""

from __future__ import annotations

import hashlib
import time

from batchspec.work.leases import Leases

WATCH_S = 30.0
"""How often a worker looks at the record of the worker it watches."""
MAX_DEAD = 64
"""Records looked at in one look at most (dead or gone ones, then the live one)."""


class Watch:
    """One worker's watch over the next one (``Leases.ring``, from its count of workers)."""

    def __init__(self, leases: Leases):
        self.leases = leases
        self._at = time.monotonic()

    def orphans(self) -> list[str]:
        """Units of dead workers to take over now: the others of a dead holder whose lease
        we took over, and those of the worker we watch, once its record went stale."""
        leases = self.leases
        found, leases.orphans = leases.orphans, []
        ring = leases.ring
        if time.monotonic() - self._at < WATCH_S or len(ring) < 2:
            return found
        self._at = time.monotonic()
        ring.sort(key=ring_key)  # in place: the dead are removed from the count's list below
        me = leases.me.worker
        for _ in range(MAX_DEAD):
            if len(ring) < 2:
                break
            other = ring[(ring.index(me) + 1) % len(ring)] if me in ring else ring[0]
            try:
                if time.time() - leases.out.progress(other).stat().st_mtime <= leases.timeout_s:
                    break
            except FileNotFoundError:
                pass  # it ended, or another took its units over: the next one
            else:
                found += leases.retire(other)
            ring.remove(other)
        return found


def ring_key(worker: str) -> bytes:
    """A worker's place in the watch ring: a hash of its name, so that workers of one host
    (names that sort together) sit apart."""
    return hashlib.sha1(worker.encode()).digest()
