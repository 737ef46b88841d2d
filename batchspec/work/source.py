"""An engine's feed: the units of one engine (one K), claimed as its batch has room.

The claiming itself is ``work.claims``; this is what the worker loop hands its engine: units
claimed ahead (so no engine starts for units others hold), the units an engine crash left
(run again alone through the ``quarantine``), the rows finished per unit for the heartbeat
record, and, once nothing is left to run, whether to linger for units others hold.
"""

from __future__ import annotations

import time
from collections import deque

from batchspec.units import UnitRequests, UnitResult, WorkUnit
from batchspec.work.backend import Prompts
from batchspec.work.claims import Claims
from batchspec.work.quarantine import Quarantine
from batchspec.work.scheduler import Scheduler
from batchspec.work.stopping import StopFlag

POLL_S = 0.05
"""How long an idle engine waits before it asks its source for a unit again."""
LINGER_POLL_S = 1.0
"""The same, once the worker lingers for units others hold (nothing of its own is left)."""


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
        builder: Prompts,
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
        suspect = bool(self.claims.watch.suspects)
        if not self.claims.deferred and not suspect:
            return True
        # Others still hold units, or one we watch may be dead. We stay while the latter
        # (until our watch takes its units over, or it beats again); a lingerer also waits
        # ``linger_s`` for units handed back or abandoned (only once nothing else is left
        # to run: the scheduler is empty).
        if self._linger_since is None:
            self._linger_since = time.monotonic()
        if self.scheduler:
            return True
        if suspect:
            return False
        linger = self.linger_s if self.claims.lingers() else 0.0
        return time.monotonic() - self._linger_since >= linger

    def wait(self) -> None:
        time.sleep(LINGER_POLL_S if self._linger_since is not None else POLL_S)

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
