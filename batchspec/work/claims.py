"""Claiming work: units taken through leases and failure records, and fed to an engine.

A worker takes the units its scheduler offers, skips what is committed or failed in this run,
claims the rest by lease, and comes back now and then to units other workers held (a holder
that stops hands them back; a dead one's lease goes stale). Units an engine failure
interrupted come back first.

At a thousand workers on one shared filesystem, what each claim costs its metadata server is
what matters (``docs/fleet.md``): workers walk the plan from different points (``striped``),
so they do not all race for the same first units and then trail each other; a worker learns
which units are done from one listing of a directory of parts (``DoneIndex``: ~1,000 units
in a fanned-out directory), not a stat per unit; and it looks again at units others hold a
few at a time, not all of them every second while it waits at the end. A worker that runs
into a unit another holds jumps to the middle of what is left instead of trailing the holder
(work stealing by halves: a conflict or two per stretch of free units).
"""

from __future__ import annotations

import hashlib
import time
from collections import deque

from batchspec.io.inputs import PromptBuilder
from batchspec.io.layout import OutDir
from batchspec.io.writer import part_error_positions
from batchspec.units import UnitRequests, UnitResult, WorkUnit
from batchspec.work.indexes import HELD_S, DoneIndex, FailureLog, HeldIndex
from batchspec.work.leases import Leases
from batchspec.work.quarantine import Quarantine
from batchspec.work.scheduler import Scheduler
from batchspec.work.stopping import StopFlag
from batchspec.work.watch import Watch

REVISIT_S = 2.0
"""How often a worker looks again at units other workers held."""
REVISIT_UNITS = 8
"""Units held by others looked at again per visit (the rest wait their turn)."""
LINGERERS = 8
"""Workers of a fleet that wait at the end for units others hold (``Claims.lingers``)."""


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
        self.taken: deque[WorkUnit] = deque()
        """Dead workers' units we took over (leased), not yet handed out."""
        self._revisited = time.monotonic()
        self.skipped: deque[WorkUnit] = deque()
        """Units left to a worker that walks ahead of us (``_jump``), taken once the plan is."""
        self._not_before: dict[str, float] = {}
        """Per deferred unit: when looking again could find it free."""
        self._unaged: set[str] = set()
        """Deferred units only seen held in a listing (their leases' age unknown)."""
        self.done = DoneIndex(out)
        self.held = HeldIndex(out)
        self.watch = Watch(leases)
        self._crowded = -float("inf")
        """When we last ran into others' units (done or held): only then is leases/ listed."""
        self._fleet = 1
        """The most live workers counted so far (``lingers``)."""
        self._looked = time.monotonic()
        """When we last looked again at deferred units while our walk still gave units."""

    def next(self, scheduler: Scheduler, k: int, revisit_now: bool = False) -> WorkUnit | None:
        """The next unit to run at K that this worker could claim, or None for now."""
        self._fleet = max(self._fleet, self.leases.live_workers())
        if revisit_now and time.monotonic() - self._revisited >= REVISIT_S / 2:
            self._revisited = -float("inf")  # a last look: not sooner than half the period
        walking = bool(scheduler) or bool(self.skipped)
        if walking and self.deferred and time.monotonic() - self._looked >= REVISIT_S:
            # Before the walk, the units whose leases could be stale by now: a dead holder's
            # units wait for a look, not for the end of every walk that passed them.
            self._looked = time.monotonic()
            self._revisit_due(walking=True)
        while True:
            # Dead workers' units (no walk reaches them): looked for per unit walked.
            for uid in self.watch.orphans():
                self._take_over(uid, scheduler)
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
            # Units other workers held: look again now and then, a few at a time, since a
            # holder that stops (a signal, a crash) hands them back or lets its lease go stale.
            if not self.deferred or time.monotonic() - self._revisited < REVISIT_S:
                return None
            self._revisit_due()

    def _take_over(self, unit_id: str, scheduler: Scheduler) -> None:
        """Claim a dead worker's unit (``Watch``) wherever it is in our plan, at once (its
        lease is stale): to ``taken``, run as our engine pulls units, one per pull."""
        for queue in (self.deferred, self.skipped):
            unit = next((u for u in queue if u.unit_id == unit_id), None)
            if unit is not None:
                queue.remove(unit)
                break
        else:
            unit = scheduler.take(unit_id)
        if unit is not None:
            self._not_before[unit_id] = 0.0  # tried now, even if a listing shows it held
            if self.claim(unit):
                self.taken.append(unit)

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

    def _revisit_due(self, walking: bool = False) -> None:
        """Up to ``REVISIT_UNITS`` deferred units whose leases could be free by now, to
        ``_again``; the others keep their turn. ``walking``: our walk still gives units, and
        only the units whose leases could be stale by now are looked at (those gone from
        leases/, mostly committed, wait for the end of the walk, when its listings know).

        Who tries what (each rule removed thousands of conflicts at a 1,000-worker fleet's
        end): a unit gone from leases/ is looked up in a new listing of its parts first
        (``DoneIndex.recheck``: every worker that passed it asks at once). In a
        fleet of 16 or more, a unit only seen held in a listing is never tried, and a worker
        about to leave (not lingering) tries no unit whose lease could be stale: a dead
        holder's units are its watcher's (``Watch``), every one listed in its record. In a
        smaller fleet every worker lingers and tries them (finding a dead pid at once)."""
        now = time.monotonic()
        if not walking:
            self._revisited = now
        small = self._fleet < 2 * LINGERERS  # every worker lingers (``lingers``)
        ages = small or walking or self.lingers()  # tries units whose leases could be stale
        for _ in range(len(self.deferred)):
            unit = self.deferred.popleft()
            uid = unit.unit_id
            # Due: its lease could be stale by now, or it is gone from leases/ (committed,
            # or handed back by a holder that stopped).
            could_be_stale = self._not_before.get(uid, 0) <= now
            could_be_stale &= ages and (small or uid not in self._unaged)
            due = could_be_stale or (not walking and not self.held.held(uid))
            if len(self._again) >= REVISIT_UNITS or not due:
                self.deferred.append(unit)
            elif self.done.done(uid) or (not could_be_stale and self.done.recheck(uid)):
                # Committed since (gone from leases/): dropped, at no turn's cost.
                self._not_before.pop(uid, None)
                self._unaged.discard(uid)
            else:
                self._again.append(unit)

    def claim(self, unit: WorkUnit) -> bool:
        """Claim ``unit`` if it still needs work and nobody live holds it."""
        uid = unit.unit_id
        retrying = uid in self.error_rows
        if self.failures.failed_in_this_run(uid):
            return False
        if not retrying and self.done.done(uid):
            self._crowded = time.monotonic()
            return False
        crowded = time.monotonic() - self._crowded < 2 * HELD_S
        if crowded and self.held.held(uid) and uid not in self._not_before:
            # Listed as held: looked at later, with no claim attempt now.
            self.deferred.append(unit)
            wait = min(HELD_S, self.leases.timeout_s / 4)
            self._not_before[uid] = time.monotonic() + max(wait, REVISIT_S)
            self._unaged.add(uid)
            return False
        self._unaged.discard(uid)
        if not self.leases.try_claim(uid):
            self.deferred.append(unit)  # a live worker holds it
            self._crowded = time.monotonic()
            self.held.stale()
            # Tried again when its lease could first go stale (sooner once leases/ no
            # longer lists it: a holder that stops hands it back).
            wait = self.leases.timeout_s - self.leases.held_age
            self._not_before[uid] = time.monotonic() + max(wait, REVISIT_S)
            return False
        self._not_before.pop(uid, None)
        # Checked again under the lease: another worker may have finished it meanwhile.
        done = not part_error_positions(self.out, uid) if retrying else self.out.is_committed(uid)
        if done:
            self.leases.release(uid)
            self.done.stale(uid)
            return False
        return True

    def lingers(self) -> bool:
        """Whether this worker, its own work done, waits on units others hold: about
        ``LINGERERS`` of a fleet (the most workers counted while it ran) do, by name."""
        share = max(1, self._fleet // LINGERERS)
        digest = hashlib.sha1(self.leases.me.worker.encode()).hexdigest()
        return int(digest[:8], 16) % share == 0

    def requests(self, unit: WorkUnit, builder: PromptBuilder) -> UnitRequests:
        """A claimed unit's rows for the engine (only its error rows, when retrying those)."""
        positions = None
        if unit.unit_id in self.error_rows:
            positions = part_error_positions(self.out, unit.unit_id)
        return builder.build(unit, positions)


class ClaimingSource:
    """The units of one engine (one K): claimed as the engine's batch has room.

    After an engine crash the units it had in flight go to the ``quarantine`` and nothing else
    is fed until it is empty: its groups run one at a time, alone (``crashed``, ``finished``).
    ``abandon`` hands a unit back to other workers; ``done`` once a unit is committed.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        claims: Claims,
        k: int,
        builder: PromptBuilder,
        stop: StopFlag,
        linger_s: float,
        first: list[WorkUnit],
        max_attempts: int,
    ):
        self.scheduler = scheduler
        self.claims = claims
        self.k = k
        self.builder = builder
        self.stop = stop
        self.linger_s = linger_s
        """How long to wait on units others hold once nothing else is left (0: do not)."""
        self.ready: deque[WorkUnit] = deque(first)
        """Claimed units not yet given to the engine: claimed ahead, or requeued."""
        self.open: dict[str, UnitRequests] = {}
        """Units (or a suspect's group) handed to the engine, not yet back or given up."""
        self.quarantine = Quarantine(max_attempts)
        self._linger_since: float | None = None

    def has_work(self) -> bool:
        """Claim ahead (without building) so no engine starts for units others hold."""
        if self.ready or self.quarantine:
            return True
        unit = self.claims.next(self.scheduler, self.k)
        if unit is None:
            return False
        self.ready.append(unit)
        return True

    def next_unit(self) -> UnitRequests | None:
        if self.stop.stopping:
            return None
        if self.quarantine:
            group = self.quarantine.next_group()
            if group is not None:
                self.open[group.unit.unit_id] = group
            return group
        unit = self.ready.popleft() if self.ready else self.claims.next(self.scheduler, self.k)
        if unit is None:
            return None
        requests = self.claims.requests(unit, self.builder)
        self.open[unit.unit_id] = requests
        return requests

    def exhausted(self) -> bool:
        if self.stop.stopping:
            return True
        if self.ready or self.quarantine:
            return False
        # Last look at the units others held before this engine goes idle.
        unit = self.claims.next(self.scheduler, self.k, revisit_now=True)
        if unit is not None:
            self.ready.append(unit)
            return False
        if not self.claims.deferred:
            return True
        # Others still hold units: wait a while, to take over any they hand back or abandon;
        # only once nothing else is left to run (the scheduler is empty).
        if self._linger_since is None:
            self._linger_since = time.monotonic()
        linger = 0.0 if self.scheduler or not self.claims.lingers() else self.linger_s
        return time.monotonic() - self._linger_since >= linger

    def wait(self) -> None:
        time.sleep(1.0 if self._linger_since is not None else 0.05)

    def open_units(self) -> list[UnitRequests]:
        """The units handed to the engine and not yet back (live progress reads their rows)."""
        return list(self.open.values())

    def progress(self) -> dict[str, int]:
        """Rows finished per unit we hold, for the heartbeat record, which is also the list a
        watcher takes over if we die: open units, and at 0 those claimed ahead or taken over,
        and the suspects of a crash."""
        held = dict.fromkeys([u.unit_id for u in [*self.ready, *self.claims.taken]], 0)
        held |= dict.fromkeys(list(self.quarantine.suspects), 0)
        return held | {uid: r.finished for uid, r in list(self.open.items())}

    def crashed(self, error: str) -> list[UnitRequests]:
        """The engine died: what it had in flight goes to the quarantine. Returns the units
        out of attempts, still leased: the caller records them as failed, then abandons them."""
        given_up = self.quarantine.crashed(self.open, error)
        failed = [self.open[uid] for uid in given_up]
        self.open.clear()  # the rest are suspects now, still under our lease
        return failed

    def finished(self, result: UnitResult) -> UnitResult | None:
        """A unit came back from the engine: its result to commit, or None for a suspect's
        group while the rest of its unit has still to run."""
        uid = result.unit.unit_id
        if not self.quarantine.owns(uid):
            return result
        del self.open[uid]
        return self.quarantine.finished(result)

    def abandon(self, unit_id: str) -> None:
        """Give a unit up: its lease goes, so another worker (or run) takes it."""
        self.open.pop(unit_id, None)
        self.claims.leases.release(unit_id)

    def abandon_all(self) -> int:
        """Hand back every open or quarantined unit (stopping); returns how many."""
        uids = set(self.open) | set(self.quarantine.drop())
        for uid in uids:
            self.abandon(uid)
        return len(uids)

    def release_unstarted(self) -> None:
        """Hand back units claimed ahead or taken over, not yet given to the engine (a stop)."""
        for unit in [*self.ready, *self.claims.taken]:
            if unit.unit_id not in self.open:
                self.claims.leases.release(unit.unit_id)

    def done(self, unit_id: str) -> None:
        self.open.pop(unit_id, None)
        self.claims.leases.release(unit_id)
