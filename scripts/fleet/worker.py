"""One simulated worker of ``sim.py``: ``work.worker.Worker``'s loop (prepare, claim, feed an
engine, commit) over the product's own objects, with ``standins.py``'s engine, rows and policy,
and claiming instrumented to count what the fleet's table reports."""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from typing import Any

import pyarrow as pa
from standins import EXECUTION, Rows, SimPolicy, SimSource, StandInEngine, Vanished

from batchspec.io.layout import OutDir
from batchspec.io.temps import clean_stale_temps
from batchspec.io.writer import Commit, PartWriter, output_schema
from batchspec.speculation.estimator import Observation
from batchspec.units import UnitResult, WorkUnit
from batchspec.work.claims import Claims, FailureLog
from batchspec.work.completion import completion
from batchspec.work.holders import Holder
from batchspec.work.indexes import striped
from batchspec.work.leases import Leases
from batchspec.work.live import LiveProgress
from batchspec.work.progress import ProgressLog
from batchspec.work.scheduler import Scheduler
from batchspec.work.stopping import StopFlag

_NULL = open(os.devnull, "w")  # noqa: SIM115 (the simulated workers' progress lines)


class CountingClaims(Claims):
    """``Claims`` with its outcomes recorded, in seconds since ``t0``: claims, conflicts (a
    claim attempt that found the lease held by a live worker) by what the claimant was doing
    (``walk``: met on its walk; ``last`` / ``linger``: a deferred unit looked at again before
    it leaves / while it lingers), units taken over as a dead worker's, and its watch's looks."""

    def __init__(self, *args: Any, t0: float, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.t0 = t0
        self.claimed: list[tuple[float, str]] = []
        self.conflicts: list[tuple[float, str]] = []
        self.kinds: Counter[str] = Counter()
        self.watched: set[str] = set()
        self.looks: list[float] = []
        self._revisiting: dict[str, str] = {}
        look, try_claim = self.watch.look, self.leases.try_claim

        def looked() -> None:
            at = self.watch._at
            look()
            if self.watch._at != at:
                self.looks.append(time.time() - self.t0)

        def counted(unit_id: str) -> bool:
            ok = try_claim(unit_id)
            if not ok:
                self.conflicts.append((time.time() - self.t0, unit_id))
                self.kinds[self._revisiting.get(unit_id, "walk")] += 1
            self._revisiting.pop(unit_id, None)
            return ok

        self.leases.after_beat = looked
        self.leases.try_claim = counted  # type: ignore[method-assign]

    def _revisit_due(self) -> None:
        super()._revisit_due()
        mode = "linger" if self.lingers() else "last"
        for u in self._again:
            self._revisiting.setdefault(u.unit_id, mode)

    def _take_over(self, unit_id: str, scheduler: Any) -> None:
        """Counted as claimed when handed to the engine, not when the watch leased it."""
        self.watched.add(unit_id)
        super()._take_over(unit_id, scheduler)
        if self.taken and self.taken[-1].unit_id == unit_id:
            self.claimed.append((time.time() - self.t0, unit_id))

    def claim(self, unit: WorkUnit) -> bool:
        ok = super().claim(unit)
        if ok:
            self.claimed.append((time.time() - self.t0, unit.unit_id))
        return ok


class SimWorker:
    """One worker: ``work.worker.Worker``'s loop over the product's objects, in a thread, under
    a host name of its own (judged by its heartbeat, never by a pid this process shares)."""

    def __init__(self, cfg: dict, name: str, units: list[WorkUnit], t0: float):
        speed, host = cfg["speed"], f"simhost-{name}"
        self.name, self.units, self.t0, self.speed = name, units, t0, speed
        self.out = OutDir(cfg["out"])
        timeout, beat = EXECUTION.lease_timeout_s / speed, EXECUTION.heartbeat_s / speed
        self.leases = Leases(self.out, name, timeout, beat, self._progress)
        me = self.leases.me
        self.leases.me = Holder(name, host, me.pid, me.pid_start, me.timeout_s)
        self.leases._payload = json.dumps(self.leases.me.__dict__).encode()
        self.failures = FailureLog(self.out, "sim")
        self.claims = CountingClaims(self.out, self.leases, self.failures, set(), t0=t0)
        self.policy = SimPolicy(self.out, name)
        self.writer = PartWriter(self.out, output_schema(pa.string(), {}))
        self.record = ProgressLog(self.out, name, "sim", self.leases)
        # As a Slurm array task logs it: a progress line every 30 simulated s.
        rows = len(units) * cfg["rows"]
        self.live = LiveProgress(self.record, self.out, rows, 0, "log", 30.0 / speed, _NULL)
        self.live.lead._payload = json.dumps({"host": host, "pid": 1}).encode()
        self.dead = threading.Event()
        self.slow = cfg["slow"] > 1 and name == "w00000"
        unit_s = cfg["unit_s"] * (cfg["slow"] if self.slow else 1.0)
        self.engine = StandInEngine(unit_s / speed, cfg["depth"], self.dead)
        self.source: SimSource | None = None
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)
        self.committed = self.discarded = 0
        self.killed_at: float | None = None
        self.held_at_kill: list[str] = []
        self.idle_at: float | None = None
        self.exit_code: int | None = None
        """What ``run`` would exit with when this worker ends (``work.completion``)."""
        self.error: str | None = None

    def _progress(self) -> dict[str, int]:
        return self.source.progress() if self.source is not None else {}

    def busy(self) -> bool:
        return bool(self.source is not None and self.source.open)

    def vanish(self) -> None:
        """Kill -9, simulated: heartbeats and records stop, nothing is released."""
        self.killed_at = time.time() - self.t0
        self.held_at_kill = sorted(self.leases.held)
        self.stop_now()

    def stop_now(self) -> None:
        self.dead.set()
        self.leases.heart.stopped.set()
        self.live._stop.set()

    def _main(self) -> None:
        try:
            self._run()
        except Vanished:
            return
        except Exception as exc:  # a broken simulation must not pass as a clean run
            self.error = f"{type(exc).__name__}: {exc}"
            raise
        self.leases.release_all()
        self.leases.stop()
        self.live.close()
        self.exit_code = int(completion(self.out).exit_code)

    def _run(self) -> None:
        # What prepare_run does at a worker's start: layout, stale temporaries, parts listed.
        self.out.choose_layout(len(self.units))
        clean_stale_temps(self.out)
        done = self.out.committed_units()
        todo = striped([u for u in self.units if u.unit_id not in done], self.name)
        scheduler = Scheduler(todo, self.policy, self.leases.live_workers)
        self.live.start()
        self.leases.start()
        SimSource.speed = self.speed
        while scheduler and not self.dead.is_set():
            k, first = scheduler.next_engine(0)
            claimed = first is not None and self.claims.claim(first)
            unit = first if claimed else self.claims.next(scheduler, k)
            if unit is None:
                break
            linger = EXECUTION.linger_s / self.speed
            self.source = SimSource(
                scheduler, self.claims, k, Rows(), StopFlag(30), linger, [unit], 3
            )
            self.record.watch(self.source.open_units, k)
            for result in self.engine.run(self.source, lambda: False):
                self._commit(result, self.source)
        self.idle_at = time.time() - self.t0

    def _commit(self, result: UnitResult, source: SimSource) -> None:
        """``Worker._commit``: the part, the failure record, progress, the shared stats."""
        uid = result.unit.unit_id
        outcome, _ = self.writer.commit(result)
        if outcome is Commit.DISCARDED:
            self.discarded += 1
            source.done(uid)
            return
        self.committed += 1
        self.failures.clear(uid)
        self.record.committed(result, None, close=lambda: source.done(uid))
        self.policy.observe(Observation.from_result(result, 16))

    def report(self) -> dict:
        c = self.claims
        keys = [
            "name",
            "committed",
            "discarded",
            "killed_at",
            "held_at_kill",
            "idle_at",
            "exit_code",
            "error",
        ]
        return {key: getattr(self, key) for key in keys} | {
            "claims": c.claimed,
            "conflicts": c.conflicts,
            "conflict_kinds": dict(c.kinds),
            "first_claim": c.claimed[0][0] if c.claimed else None,
            "watched": sorted(c.watched),
            "looks": c.looks,
            "lingers": c.lingers(),
        }
