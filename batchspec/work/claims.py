"""Claiming work: which of the units a worker's scheduler offers it runs.

**What makes exactly once, and what only saves work.** A unit's rows are in the output when,
and only when, its part is linked under its final name, and that link fails when the name
exists: at most one copy of a unit is ever committed, and a late or duplicate copy is dropped
(``io.writer``); unit ids are unique in a plan (``io.planner``) and the parts layout is the
manifest's (``io.layout``), so one unit has one name. Everything else, here and in
``work.leases`` and ``work.watch``, only keeps workers from doing the same work twice and
makes sure somebody does each unit: a lease is a claim, not a lock, and a mistaken takeover
(a holder that was alive after all) costs a unit's work, never a row.

So the rules below are judged by what they save, measured by ``scripts/fleet/sim.py`` at 16
to 1,000 workers (``docs/fleet.md``: each one switched off in turn): workers walk the plan
from points of their own (``striped``); they learn what is done and what is held from
listings (``DoneIndex``, ``HeldIndex``), not a file operation per unit; a worker that runs
into a unit another holds jumps to the middle of what is left (work stealing by halves); the
units it found held are looked at again once its walk is done, a few at a time, when they
could be free (committed, handed back, or their holder silent for a lease timeout); dead
workers' units are taken over by their watchers (``work.watch``), who do not leave while
one they watch may be dead; and a few workers of a fleet linger at the end for units handed
back.
"""

from __future__ import annotations

import hashlib
import time
from collections import deque

from batchspec.io.layout import OutDir
from batchspec.io.writer import part_error_positions
from batchspec.units import UnitRequests, WorkUnit
from batchspec.work.backend import Prompts
from batchspec.work.indexes import HELD_S, DoneIndex, FailureLog, HeldIndex
from batchspec.work.leases import Leases
from batchspec.work.scheduler import Scheduler
from batchspec.work.watch import Watch

REVISIT_S = 2.0
"""How often a worker whose walk is done looks again at units other workers held."""
REVISIT_UNITS = 8
"""Units held by others looked at again per visit (the rest wait their turn)."""
LINGERERS = 8
"""Workers of a fleet that wait at the end for units others hold (``Claims.lingers``)."""
LINGER_LIST_S = 5.0
"""How old a lingerer's listing of leases/ may be when it looks again (``HELD_S`` for the
others): a unit committed or handed back is seen within seconds, for ~8 listings of leases/
a fleet every 5 s (64 simulated workers: 37.6-38.4 fs operations a unit, 37.3-38.7 before)."""


class Claims:
    """One worker's claiming: which offered units it may run, and the ones others held."""

    def __init__(self, out: OutDir, leases: Leases, failures: FailureLog, error_rows: set[str]):
        self.out = out
        self.leases = leases
        self.failures = failures
        self.error_rows = error_rows
        """Committed units whose error rows are to be generated again (--retry-errors)."""
        self.deferred: deque[WorkUnit] = deque()
        """Units held by other workers when we came by: looked at again later, oldest first."""
        self._again: deque[WorkUnit] = deque()
        """Deferred units due for another try."""
        self.taken: deque[WorkUnit] = deque()
        """Dead workers' units leased for us (``Leases.take_over``), not yet handed out."""
        self.skipped: deque[WorkUnit] = deque()
        """Units left to a worker that walks ahead of us (``_jump``), taken once the plan is."""
        self._not_before: dict[str, float] = {}
        """Per deferred unit: when its holder could have been silent for a lease timeout."""
        self._revisited = time.monotonic()
        self._crowded = -float("inf")
        """When we last ran into others' units (done or held): only then is leases/ listed."""
        self._fleet = 1
        """The most live workers counted so far (``lingers``: at a fleet's end, fewer)."""
        self.done = DoneIndex(out)
        self.held = HeldIndex(out)
        self.watch = Watch(leases)

    def next(self, scheduler: Scheduler, k: int, revisit_now: bool = False) -> WorkUnit | None:
        """The next unit to run at K that this worker could claim, or None for now;
        ``revisit_now``: a last look at the units others held (not sooner than every half
        ``REVISIT_S``) before the engine goes idle."""
        if revisit_now and time.monotonic() - self._revisited >= REVISIT_S / 2:
            self._revisited = -float("inf")
        while True:
            while self.leases.orphans:
                self._take_over(self.leases.orphans.popleft(), scheduler)
            if self.taken:
                return self.taken.popleft()
            walked = not self._again
            unit = self._again.popleft() if self._again else scheduler.next_unit(k)
            if unit is None and self.skipped:
                unit, walked = self.skipped.popleft(), False
            if unit is not None:
                held = len(self.deferred)
                if self.claim(unit):
                    return unit
                if walked and len(self.deferred) > held:
                    self._jump(scheduler, k)
                continue
            if not self.deferred or time.monotonic() - self._revisited < REVISIT_S:
                return None
            self._revisit_due()

    def claim(self, unit: WorkUnit) -> bool:
        """Claim ``unit`` if it still needs work and nobody live holds it."""
        uid = unit.unit_id
        if self.failures.failed_in_this_run(uid):
            return False
        if uid not in self.error_rows and self.done.done(uid):
            self._crowded = time.monotonic()
            return False
        crowded = time.monotonic() - self._crowded < 2 * HELD_S
        if crowded and uid not in self._not_before and self.held.held(uid):
            self._defer(unit, self.leases.timeout_s)  # listed as held: no attempt now
            return False
        if not self.leases.try_claim(uid):
            self._crowded = time.monotonic()
            self.held.stale()
            self._defer(unit, self.leases.wait_s)
            return False
        self._forget(uid)
        if not self._still_needed(unit):
            self.leases.release(uid)
            return False
        return True

    def _defer(self, unit: WorkUnit, wait_s: float) -> None:
        """Look at a unit another holds again once its holder could be silent for a lease
        timeout (sooner once leases/ no longer lists it: committed, or handed back)."""
        self.deferred.append(unit)
        self._not_before[unit.unit_id] = time.monotonic() + max(wait_s, REVISIT_S)

    def _forget(self, unit_id: str) -> None:
        self._not_before.pop(unit_id, None)

    def _still_needed(self, unit: WorkUnit) -> bool:
        """Checked under our lease: another worker may have finished the unit meanwhile."""
        uid = unit.unit_id
        if self.failures.failed_in_this_run(uid):
            return False
        if uid in self.error_rows:
            return bool(part_error_positions(self.out, uid))
        if self.out.is_committed(uid):
            self.done.stale(uid)
            return False
        return True

    def _take_over(self, unit_id: str, scheduler: Scheduler) -> None:
        """A dead worker's unit, already leased for us (``Leases.take_over``), wherever it is
        in our plan: to ``taken``, handed out one per pull of our engine (its lease goes
        back if it is not ours to run: committed, failed, or not in our plan)."""
        for queue in (self.deferred, self._again, self.skipped):
            unit = next((u for u in queue if u.unit_id == unit_id), None)
            if unit is not None:
                queue.remove(unit)
                break
        else:
            unit = scheduler.take(unit_id)
        self._forget(unit_id)
        if unit is not None and self._still_needed(unit):
            self.taken.append(unit)
        else:
            self.leases.release(unit_id)

    def _jump(self, scheduler: Scheduler, k: int) -> None:
        """Walking the plan, we ran into a unit a live worker holds: it walks on from there,
        so we leave it half of what is left (to ``skipped``: looked at once the rest is done,
        when the done ones cost no more than a listing) and go on from the middle."""
        rows = sum(scheduler.rows.values()) / 2
        while rows > 0:
            unit = scheduler.next_unit(k)
            if unit is None:
                break
            self.skipped.append(unit)
            rows -= unit.num_rows

    def _revisit_due(self) -> None:
        """Our walk done: up to ``REVISIT_UNITS`` deferred units that could be free now, to
        ``_again``; the others keep their turn. Free now: gone from leases/ (looked up in a
        new listing of parts first, ``DoneIndex.recheck``: at a fleet's end every worker that
        passed a unit asks at once), or, for a lingerer, its holder could have been silent
        for a timeout."""
        now = self._revisited = time.monotonic()
        lingering = self.lingers()
        if lingering:
            # Its own work done, a lingerer waits on what leases/ says now: a listing trusted
            # for HELD_S kept a two-task array idle ~30 s at its end.
            self.held.fresh(LINGER_LIST_S)
        for _ in range(len(self.deferred)):
            unit = self.deferred.popleft()
            uid = unit.unit_id
            # A worker on its way out leaves units whose holder may be dead to the watchers
            # and lingerers (at 1,000 workers their last looks made 14,000 conflicts).
            could_be_stale = lingering and self._not_before.get(uid, 0) <= now
            if len(self._again) >= REVISIT_UNITS or not (could_be_stale or not self.held.held(uid)):
                self.deferred.append(unit)
            elif self.done.done(uid) or (not could_be_stale and self.done.recheck(uid)):
                self._forget(uid)  # committed since: dropped at no turn's cost
            else:
                self._again.append(unit)

    def lingers(self) -> bool:
        """Whether this worker, its own work done, waits on units others hold: about
        ``LINGERERS`` of a fleet do, by name (a lingering GPU idles: a few suffice)."""
        self._fleet = max(self._fleet, self.leases.live_workers())
        share = max(1, self._fleet // LINGERERS)
        digest = hashlib.sha1(self.leases.me.worker.encode()).hexdigest()
        return int(digest[:8], 16) % share == 0

    def requests(self, unit: WorkUnit, builder: Prompts) -> UnitRequests:
        """A claimed unit's rows for the engine (only its error rows, when retrying those)."""
        positions = None
        if unit.unit_id in self.error_rows:
            positions = part_error_positions(self.out, unit.unit_id)
        return builder.build(unit, positions)
