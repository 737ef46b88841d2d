"""The stand-ins of the fleet simulator (``sim.py``) and the clock it runs on.

Only what a simulation of coordination cannot run for real is stood in for: the engine
(``StandInEngine``: a unit "generates" for ``unit_s`` simulated seconds, ``depth`` units at
once), the prompt builder (rows made up) and the K policy (``SimPolicy``: K 0, measurements
shared as ``KPolicy`` shares them). ``SWITCHES`` turn off claiming mechanisms that only save
work (``--off``), so that one run measures what each buys.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

from batchspec.io.layout import OutDir
from batchspec.spec.execution import ExecutionSpec
from batchspec.speculation import policy as policy_mod
from batchspec.speculation import shared as shared_mod
from batchspec.speculation.estimator import Observation
from batchspec.speculation.policy import Decision
from batchspec.speculation.shared import SharedStats
from batchspec.units import RowRequest, RowResult, UnitRequests, UnitResult, WorkUnit
from batchspec.work import claims as claims_mod
from batchspec.work import indexes as indexes_mod
from batchspec.work import leases as leases_mod
from batchspec.work import live as live_mod
from batchspec.work import progress as progress_mod
from batchspec.work import scheduler as scheduler_mod
from batchspec.work import watch as watch_mod
from batchspec.work.claims import Claims
from batchspec.work.source import ClaimingSource

PERIODS = {
    scheduler_mod: ["COUNT_WORKERS_S"],
    shared_mod: ["FILE_S", "FINISHED_S"],
    claims_mod: ["REVISIT_S", "LIST_S", "HELD_S"],
    indexes_mod: ["LIST_S", "HELD_S"],
    policy_mod: ["REFRESH_S"],
    progress_mod: ["SAMPLE_S"],
    live_mod: ["SAMPLE_S", "SILENT_S", "LEAD_S"],
    leases_mod: ["COUNT_S"],
    watch_mod: ["WATCH_S"],
}
"""The product's periods, divided by the simulation's speed (those a module has)."""

SWITCHES = {
    "watch": (watch_mod.Watch, "look", lambda self: None),
    "linger_all": (Claims, "lingers", lambda self: True),
    "linger_none": (Claims, "lingers", lambda self: False),
    "steal": (Claims, "_jump", lambda self, scheduler, k: None),
    "held": (indexes_mod.HeldIndex, "held", lambda self, unit_id: False),
}
"""``--off``: exactly once rests on the part commit alone, so each of these only saves work;
switched off, one run shows what it buys (no watch ring; every / no worker lingers; no work
stealing by halves; no listing of leases/, every unit met is tried)."""


def scale_periods(speed: float, off: list[str]) -> None:
    """Production's clocks divided by ``speed``, and the ``off`` mechanisms switched off."""
    for module, names in PERIODS.items():
        for name in names:
            if hasattr(module, name):
                setattr(module, name, getattr(module, name) / speed)
    # The display's refresh touches no file: the scaled sample period reads the others and
    # logs on time, and spares a thousand threads' wakeups.
    live_mod.REFRESH_S = max(live_mod.REFRESH_S, live_mod.SAMPLE_S)
    for name in off:
        cls, attr, stub = SWITCHES[name]
        setattr(cls, attr, stub)


def plan(units: int, rows: int) -> list[WorkUnit]:
    """The fleet's work: ``units`` units of ``rows`` rows of one made-up input file."""
    return [WorkUnit(0, "sim.parquet", i * rows, (i + 1) * rows, None, rows) for i in range(units)]


EXECUTION = ExecutionSpec()
"""Production's lease timeout, heartbeat and linger, divided by the speed like every period."""


class Vanished(Exception):
    """The simulated worker was killed: it stops at once, releasing nothing."""


class SimPolicy:
    """K 0 for every domain; one shared line per committed unit, the others' read as
    ``KPolicy.refresh`` reads them."""

    version, per_unit, adaptive = (0, None), False, False
    """``adaptive`` False: K fixed, no domain waits for its first unit (``Scheduler``)."""

    def __init__(self, out: OutDir, worker: str):
        self.shared = SharedStats(out, worker)
        self._read_at = -math.inf

    def refresh(self) -> None:
        if time.monotonic() - self._read_at >= self.shared.pace_s(policy_mod.REFRESH_S):
            self._read_at = time.monotonic()
            self.shared.read_paced()

    def decide(self, rows: dict, engine_k: int | None, workers: int = 1) -> Decision:
        return Decision(dict.fromkeys(rows, 0), None)

    def taken(self, domain: Any, explored: bool = False) -> None:
        pass

    def explores(self, domain: Any, planned: int, k: int) -> bool:
        return False

    def observe(self, ob: Observation) -> None:
        self.shared.append(ob)


class Rows:
    """A unit's rows, made up (ids unique across the run)."""

    def build(self, unit: WorkUnit, positions: list[int] | None = None) -> UnitRequests:
        ids = range(unit.start, unit.stop)
        rows = [RowRequest(r, f"{unit.unit_id}:{r}", unit.domain, {}, [1, 2, 3]) for r in ids]
        return UnitRequests(unit, rows)


class SimSource(ClaimingSource):
    """The real claiming source; only its idle wait runs on simulated time."""

    speed = 1.0

    def wait(self) -> None:
        time.sleep((1.0 if self._linger_since is not None else 0.05) / self.speed)


class StandInEngine:
    """Holds up to ``depth`` units, each done ``unit_s`` after it was taken."""

    k, method, name = 0, "none", "vllm"

    def __init__(self, unit_s: float, depth: int, dead: threading.Event):
        self.unit_s, self.depth, self.dead = unit_s, depth, dead

    def run(self, source: ClaimingSource, abort: Any) -> Any:
        inflight: list[tuple[float, UnitRequests]] = []
        while not abort():
            while len(inflight) < self.depth and (unit := source.next_unit()) is not None:
                inflight.append((time.monotonic() + self.unit_s, unit))
            if not inflight:
                if source.exhausted():
                    return
                source.wait()
                continue
            inflight.sort(key=lambda x: x[0])
            due, req = inflight.pop(0)
            # One wakeup per unit: a thousand workers polling every 50 ms starved two cores.
            if self.dead.wait(max(due - time.monotonic(), 0)):
                raise Vanished
            req.finished = len(req.rows)
            results = [RowResult(r, "x", 3, 1, "length", timing=None) for r in req.rows]
            yield UnitResult(req, results, 0, "none", "vllm")
