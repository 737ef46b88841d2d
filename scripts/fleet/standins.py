"""The stand-ins of the fleet simulator (``sim.py``) and the clock it runs on.

Only what a simulation of coordination cannot run for real is stood in for, as the worker's
``work.backend.Backend``: the engine (``StandInEngine``: a unit "generates" for ``unit_s``
simulated seconds, ``depth`` units at once), the prompt builder (rows made up) and the K
policy (``SimPolicy``: the product's at K 0, measurements shared as an adaptive one shares
them). The job (``job``) has production's execution periods divided by the speed, like every
period of the product (``scale_periods``). ``SWITCHES`` turn off claiming mechanisms that only
save work (``--off``), so that one run measures what each buys.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from batchspec.spec import JobSpec
from batchspec.spec.execution import ExecutionSpec
from batchspec.speculation import policy as policy_mod
from batchspec.speculation import shared as shared_mod
from batchspec.speculation.estimator import Observation
from batchspec.speculation.policy import KPolicy
from batchspec.units import RowRequest, RowResult, UnitRequests, UnitResult, WorkUnit
from batchspec.work import claims as claims_mod
from batchspec.work import indexes as indexes_mod
from batchspec.work import leases as leases_mod
from batchspec.work import live as live_mod
from batchspec.work import progress as progress_mod
from batchspec.work import scheduler as scheduler_mod
from batchspec.work import source as source_mod
from batchspec.work import watch as watch_mod
from batchspec.work.backend import Backend
from batchspec.work.claims import Claims

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
    source_mod: ["POLL_S", "LINGER_POLL_S"],
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


def job(out: str, speed: float) -> JobSpec:
    """The fleet's job: K 0 on a batch of 16, production's lease timeout, heartbeat, linger
    and shutdown grace divided by ``speed``; its input is never read (``Rows``)."""
    ex = ExecutionSpec()
    keys = ("lease_timeout_s", "heartbeat_s", "linger_s", "shutdown_grace_s")
    execution = {key: getattr(ex, key) / speed for key in keys}
    return JobSpec.model_validate(
        {
            "input": {"path": "sim.parquet", "prompt_column": "prompt"},
            "output": {"dir": out},
            "model": {"model": "sim", "max_num_seqs": 16},
            "speculative": {"method": "none"},
            "execution": execution,
        }
    )


def backend(unit_s: float, depth: int, dead: threading.Event) -> Backend:
    """A simulated worker's engines, rows and policy (``dead``: it was killed)."""
    engine = StandInEngine(unit_s, depth, dead)
    return Backend(lambda spec, k, stopped: engine, lambda engine: Rows(), policy=SimPolicy)


class SimPolicy(KPolicy):
    """The product's policy (K 0: the job does not speculate), sharing one line per committed
    unit and reading the others' as an adaptive one does (``KPolicy.refresh``)."""

    def refresh(self) -> None:
        if time.monotonic() - self._read_at >= self.shared.pace_s(policy_mod.REFRESH_S):
            self._read_at = time.monotonic()
            self.shared.read_paced()

    def observe(self, ob: Observation) -> None:
        self.shared.append(ob)


class Rows:
    """A unit's rows, made up (ids unique across the run)."""

    def build(self, unit: WorkUnit, positions: list[int] | None = None) -> UnitRequests:
        ids = range(unit.start, unit.stop)
        rows = [RowRequest(r, f"{unit.unit_id}:{r}", unit.domain, {}, [1, 2, 3]) for r in ids]
        return UnitRequests(unit, rows)


class StandInEngine:
    """Holds up to ``depth`` units, each done ``unit_s`` after it was taken. Once ``dead`` is
    set (a kill) it never returns: its worker's thread stands still, as a killed process."""

    k, method, name, build_s, max_model_len, k_per_unit = 0, "none", "vllm", 0.0, 2048, False

    def __init__(self, unit_s: float, depth: int, dead: threading.Event):
        self.unit_s, self.depth, self.dead = unit_s, depth, dead

    def close(self) -> None:
        pass

    def run(self, source: Any, abort: Any) -> Any:
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
                threading.Event().wait()  # killed: never again
            req.finished = len(req.rows)
            results = [RowResult(r, "x", 3, 1, "length", timing=None) for r in req.rows]
            yield UnitResult(req, results, 0, "none", "vllm")
