"""Who takes a dead worker's units over when no walk reaches them.

Workers walk the plan from points of their own and look again at the units they found held
(``work.claims``). A worker killed mid-run holds the units at the head of its stretch: the
others walk up to them only when their own stretches are done, hours later in a long run (in
the fleet simulator at 32 units per worker, 600-1,000 s after the kill against a bound of
~350). So every worker also watches two others: the next ones among the workers with a
record in leases/, in the order of a hash of their names (the last watches the first), one
stat of each record every ``WATCH_S``, from its heartbeat thread. Once a record has not
changed for a lease timeout of the watcher's own clock (``work.heartbeat``), the watcher
takes its worker's units over (the record lists them; ``Leases.take_over``). Hashed, not by
name: a node that dies takes all its workers, whose names (host first) sort together, and
one watcher of all of them ran their units one per pull of its engine (at 1,000 workers, the
last 667 s after the kill against a bound of 470); in hash order each dead worker has
watchers of its own, most likely alive. Two stats per worker per ``WATCH_S``, whatever the
fleet's size.
"""

from __future__ import annotations

import hashlib
import json
import time

from batchspec.work.heartbeat import version
from batchspec.work.leases import Leases

WATCH_S = 30.0
"""How often a worker looks at the records of the workers it watches (at its next beat)."""
WATCHED = 2
"""Live workers each one watches: the next two in the ring, so that where two neighbours died
the second has been watched all along (a watch that starts at a record learns nothing from
its first look: it would wait a second lease timeout)."""
MAX_DEAD = 64
"""Records looked at in one look at most (dead or gone ones, then the live ones)."""


class Watch:
    """One worker's watch over the next ones (``Leases.ring``, from its count of workers),
    run by its heartbeat thread (``Leases.after_beat``): at a pace of its own, whatever the
    worker's engine is doing, so a dead worker's units wait at most a lease timeout and two
    looks, however long units take."""

    def __init__(self, leases: Leases):
        self.leases = leases
        self._at = time.monotonic()
        self.suspects: set[str] = set()
        """Watched workers silent for two heartbeats at the last look: maybe dead. Their
        watcher does not leave before it knows (``ClaimingSource.exhausted``): a watcher
        that starts over learns nothing from its first look, and waits a whole timeout."""
        leases.after_beat = self.look

    def look(self) -> None:
        """Look at the watched workers' records (at most every ``WATCH_S``): one silent for
        a lease timeout is dead, and its units are ours (``Leases.take_over``)."""
        leases = self.leases
        if time.monotonic() - self._at < WATCH_S:
            return
        self._at = time.monotonic()
        leases.live_workers()  # the ring, counted again now and then
        ring = sorted(leases.ring, key=ring_key)
        me = leases.me.worker
        live, suspects = 0, set()
        for _ in range(MAX_DEAD):
            if len(ring) < 2:
                break
            start = ring.index(me) + 1 if me in ring else 0
            other = ring[(start + live) % len(ring)]
            if live >= WATCHED or other == me:
                break
            try:
                seen = version(leases.out.progress(other))
            except FileNotFoundError:
                ring.remove(other)  # it ended, or another took its units over
                continue
            silent = leases.observer.silent_for(other, seen)
            if silent > leases.timeout_s and silent > _own_timeout(leases, other):
                leases.take_over(other)
                ring.remove(other)
                continue
            live += 1  # alive, or not yet watched silent for a timeout
            if silent > 2 * leases.heartbeat_s:
                suspects.add(other)
        self.suspects = suspects


def _own_timeout(leases: Leases, worker: str) -> float:
    """The lease timeout ``worker`` runs with, as its record says (a run of the same directory
    may set another): read only once its record was silent for ours, a rare look."""
    try:
        return float(json.loads(leases.out.progress(worker).read_bytes()).get("timeout_s", 0))
    except (OSError, ValueError, AttributeError, TypeError):
        return 0.0


def ring_key(worker: str) -> bytes:
    """A worker's place in the watch ring: a hash of its name, so that workers of one host
    (names that sort together) sit apart."""
    return hashlib.sha1(worker.encode()).digest()
