"""One simulated worker of ``sim.py``: the product's coordination code, a stand-in engine.

The loop mirrors ``work.worker.Worker`` (``run``, ``_run_group``, ``_drive``, ``_commit``) with
the same objects; what differs is marked: the engine (``StandInEngine``: each unit "generates"
for ``unit_s`` simulated seconds, ``depth`` units at once), the prompt builder (rows made up,
no input read) and the K policy (``SimPolicy``: K fixed at 0, measurements shared as the
adaptive policy shares them).
"""

from __future__ import annotations

import inspect
import json
import math
import os
import threading
import time
from typing import Any

import pyarrow as pa

from batchspec.io.layout import OutDir
from batchspec.io.temps import clean_stale_temps
from batchspec.io.writer import Commit, PartWriter, output_schema
from batchspec.speculation import policy as policy_mod
from batchspec.speculation import shared as shared_mod
from batchspec.speculation.estimator import Observation
from batchspec.speculation.policy import Decision
from batchspec.speculation.shared import SharedStats
from batchspec.units import RowRequest, RowResult, UnitRequests, UnitResult, WorkUnit
from batchspec.work import claims as claims_mod
from batchspec.work import leases as leases_mod
from batchspec.work import live as live_mod
from batchspec.work import progress as progress_mod
from batchspec.work import scheduler as scheduler_mod
from batchspec.work.claims import Claims, FailureLog
from batchspec.work.completion import completion
from batchspec.work.holders import Holder
from batchspec.work.leases import Leases
from batchspec.work.live import LiveProgress
from batchspec.work.progress import ProgressLog
from batchspec.work.scheduler import Scheduler
from batchspec.work.source import ClaimingSource
from batchspec.work.stopping import StopFlag

try:
    from batchspec.work import indexes as indexes_mod
except ImportError:  # a version before the fleet work (the table's "before")
    indexes_mod = None
try:
    from batchspec.work import watch as watch_mod
except ImportError:  # a version before the watch
    watch_mod = None

_PERIODS = [
    (scheduler_mod, "COUNT_WORKERS_S"),
    (shared_mod, "FILE_S"),
    (shared_mod, "FINISHED_S"),
    (claims_mod, "REVISIT_S"),
    (claims_mod, "LIST_S"),
    (claims_mod, "HELD_S"),
    (indexes_mod, "LIST_S"),
    (indexes_mod, "HELD_S"),
    (policy_mod, "REFRESH_S"),
    (progress_mod, "SAMPLE_S"),
    (live_mod, "SAMPLE_S"),
    (live_mod, "SILENT_S"),
    (leases_mod, "COUNT_S"),
    (watch_mod, "WATCH_S"),
    (live_mod, "LEAD_S"),
]
"""The product's periods (those this version has), divided by the simulation's speed (the
display's refresh, ``live.REFRESH_S``, touches no file and is left alone)."""


RECORD_IS_HEARTBEAT = "leases" in inspect.signature(ProgressLog).parameters
"""The progress record is the heartbeat record (earlier versions wrote both)."""


def scale_periods(speed: float) -> None:
    for module, name in _PERIODS:
        if hasattr(module, name):
            setattr(module, name, getattr(module, name) / speed)
    # The display's refresh touches no file (since the record is the heartbeat's, not even
    # through the record's writes): the (scaled) sample period is enough to read the others
    # and log on time, and spares a thousand threads' wakeups. Earlier versions wrote the
    # record from this loop: a quarter of the period kept those writes on time.
    writes = not RECORD_IS_HEARTBEAT
    live_mod.REFRESH_S = max(live_mod.REFRESH_S, live_mod.SAMPLE_S / (4 if writes else 1))


def plan(units: int, rows: int) -> list[WorkUnit]:
    """The fleet's work: ``units`` units of ``rows`` rows of one made-up input file."""
    return [WorkUnit(0, "sim.parquet", i * rows, (i + 1) * rows, None, rows) for i in range(units)]


_NULL = open(os.devnull, "w")  # noqa: SIM115 (the simulated workers' progress lines)


class Vanished(Exception):
    """The simulated worker was killed: it stops at once, releasing nothing."""


class SimPolicy:
    """Stand-in K policy: K 0 for every domain; shares observations as ``KPolicy`` does (one
    line per committed unit, the others' new lines read every ``REFRESH_S``)."""

    version = (0, None)
    per_unit = False

    def __init__(self, out: OutDir, worker: str):
        self.shared = SharedStats(out, worker)
        self._read_at = -math.inf

    def refresh(self) -> None:
        pace = getattr(self.shared, "pace_s", lambda period: period)  # as KPolicy.refresh
        if time.monotonic() - self._read_at >= pace(policy_mod.REFRESH_S):
            self._read_at = time.monotonic()
            getattr(self.shared, "read_paced", self.shared.read_new)()  # as KPolicy.refresh

    def decide(self, rows: dict, engine_k: int | None, workers: int = 1) -> Decision:
        return Decision(dict.fromkeys(rows, 0), None)

    def taken(self, domain: Any, explored: bool = False) -> None:
        pass

    def explores(self, domain: Any, planned: int, k: int) -> bool:
        return False

    def observe(self, ob: Observation) -> None:
        self.shared.append(ob)
        if not hasattr(self.shared, "pace_s"):  # earlier versions read again after a commit
            self._read_at = -math.inf


class Rows:
    """Stand-in prompt builder: a unit's rows, made up (ids unique across the run)."""

    def build(self, unit: WorkUnit, positions: list[int] | None = None) -> UnitRequests:
        rows = [
            RowRequest(r, f"{unit.unit_id}:{r}", unit.domain, {}, [1, 2, 3])
            for r in range(unit.start, unit.stop)
        ]
        return UnitRequests(unit, rows)


class SimSource(ClaimingSource):
    """The real claiming source; only its idle wait is scaled to simulated time."""

    speed = 1.0
    trace: list | None = None

    def wait(self) -> None:
        time.sleep((1.0 if self._linger_since is not None else 0.05) / self.speed)

    def exhausted(self) -> bool:
        done = super().exhausted()
        if not done and self._linger_since is not None and self.trace is not None:
            self.trace.append((time.time(), bool(self.scheduler), self.claims.lingers()))
        return done


class StandInEngine:
    """Holds up to ``depth`` units, each done ``unit_s`` after it was taken."""

    k = 0
    method = "none"
    name = "vllm"

    def __init__(self, unit_s: float, depth: int, dead: threading.Event):
        self.unit_s, self.depth, self.dead = unit_s, depth, dead

    def run(self, source: ClaimingSource, abort: Any) -> Any:
        inflight: list[tuple[float, UnitRequests]] = []
        while not abort():
            while len(inflight) < self.depth:
                unit = source.next_unit()
                if unit is None:
                    break
                inflight.append((time.monotonic() + self.unit_s, unit))
            if not inflight:
                if source.exhausted():
                    return
                source.wait()
                continue
            inflight.sort(key=lambda x: x[0])
            due, req = inflight[0]
            # One wakeup per unit (a thousand workers polling every 50 ms starved the
            # machine's two cores: the fleet's clock, not the protocol, set the pace).
            if self.dead.wait(max(due - time.monotonic(), 0)):
                raise Vanished
            inflight.pop(0)
            req.finished = len(req.rows)
            results = [RowResult(r, "x", 3, 1, "length", timing=None) for r in req.rows]
            yield UnitResult(req, results, 0, "none", "vllm")


class CountingClaims(Claims):
    """``Claims`` with its outcomes recorded: claims (with their time) and conflicts (a claim
    attempt that found the lease held by a live worker)."""

    def __init__(self, *args: Any, t0: float, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.t0 = t0
        self.claimed: list[tuple[float, str]] = []
        self.conflicts = 0
        self.conflict_times: list[float] = []
        self.conflict_units: list[str] = []
        self.conflict_revisits = 0
        """Conflicts on units looked at again (``_revisit_due``), not met on the walk."""
        self.conflict_kinds: dict[str, int] = {}
        """Conflicts by what the claimant was doing: ``walk`` (met on its walk), or a look
        again at a deferred unit on its ``last`` look before it leaves, or while it
        ``linger``s."""
        self._revisiting: dict[str, str] = {}
        self.watched: set[str] = set()
        """Units taken over as a dead worker's (``Watch``, or its other units)."""
        self.looks: list[tuple[float, str | None, int]] = []
        """Each look of our watch: when, the worker it watches after it, how many it found."""
        look = self.watch.look

        def looked() -> None:
            at, before = self.watch._at, len(self.leases.orphans)
            look()
            if self.watch._at != at:
                ring, me = self.leases.ring, self.leases.me.worker
                nxt = ring[(ring.index(me) + 1) % len(ring)] if me in ring else None
                found = len(self.leases.orphans) - before
                self.looks.append((time.time() - self.t0, nxt, found))

        self.leases.after_beat = looked

        try_claim = self.leases.try_claim

        def counted(unit_id: str) -> bool:
            ok = try_claim(unit_id)
            if not ok:
                self.conflicts += 1
                self.conflict_times.append(time.time() - self.t0)
                self.conflict_units.append(unit_id)
                self.conflict_revisits += unit_id in self._revisiting
                kind = self._revisiting.get(unit_id, "walk")
                self.conflict_kinds[kind] = self.conflict_kinds.get(kind, 0) + 1
            self._revisiting.pop(unit_id, None)
            return ok

        self.leases.try_claim = counted  # type: ignore[method-assign]

    def _revisit_due(self) -> None:
        super()._revisit_due()
        mode = "linger" if self.lingers() else "last"
        for u in self._again:
            self._revisiting.setdefault(u.unit_id, mode)

    def _take_over(self, unit_id: str, scheduler: Any) -> None:
        """A dead worker's unit, leased by our watch (or with another of its units) and now
        handed to our engine: counted as claimed when handed, not when leased."""
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
    """One worker: ``work.worker.Worker``'s loop over the product's objects, in a thread."""

    def __init__(self, cfg: dict, name: str, host: str, units: list[WorkUnit], t0: float):
        speed = cfg["speed"]
        self.cfg, self.name, self.t0, self.speed = cfg, name, t0, speed
        self.out = OutDir(cfg["out"])
        self.leases = Leases(
            self.out,
            name,
            cfg["lease_timeout_s"] / speed,
            cfg["heartbeat_s"] / speed,
            self._progress,
        )
        # A host of its own: judged by its heartbeat, never by a pid this process shares.
        me = self.leases.me
        self.leases.me = Holder(name, host, me.pid, me.pid_start, me.timeout_s)
        self.leases._payload = json.dumps(self.leases.me.__dict__).encode()
        self.failures = FailureLog(self.out, "sim")
        self.claims = CountingClaims(self.out, self.leases, self.failures, set(), t0=t0)
        self.policy = SimPolicy(self.out, name)
        self.units = units
        self.scheduler: Scheduler | None = None
        self.writer = PartWriter(self.out, output_schema(pa.string(), {}))
        if RECORD_IS_HEARTBEAT:
            self.record = ProgressLog(self.out, name, "sim", self.leases)
        else:
            self.record = ProgressLog(self.out, name, "sim")
        total = len(units) * cfg["rows"]
        # As an array task of Slurm logs it: a progress line every 30 s (simulated).
        self.live = LiveProgress(self.record, self.out, total, 0, "log", 30.0 / speed, _NULL)
        lead = getattr(self.live, "lead", None)
        if lead is not None:  # its lock names the simulated host, as on a cluster
            lead._payload = json.dumps({"host": host, "pid": 1}).encode()
        self.dead = threading.Event()
        self.slow = cfg.get("slow", 1.0) > 1 and name == "w00000"
        unit_s = cfg["unit_s"] * (cfg["slow"] if self.slow else 1.0)
        self.engine = StandInEngine(unit_s / speed, cfg["depth"], self.dead)
        self.exit_code: int | None = None
        """What ``run`` would exit with when this worker ends (``work.completion``)."""
        self.source: SimSource | None = None
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)
        self.committed = self.discarded = 0
        self.killed_at: float | None = None
        self.held_at_kill: list[str] = []
        self.idle_at: float | None = None
        self.error: str | None = None
        self.trace: list = []

    def _progress(self) -> dict[str, int]:
        return self.source.progress() if self.source is not None else {}

    def start(self) -> None:
        self.thread.start()

    def alive(self) -> bool:
        return self.thread.is_alive()

    def busy(self) -> bool:
        return bool(self.source is not None and self.source.open)

    def vanish(self) -> None:
        """Kill -9, simulated: heartbeats and records stop, nothing is released."""
        self.killed_at = time.time() - self.t0
        self.held_at_kill = sorted(self.leases.held)
        self.leases.heart.stopped.set()
        self.live._stop.set()
        self.dead.set()

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

    def _prepare(self) -> None:
        """What ``prepare.prepare_run`` does with the output directory at a worker's start:
        its layout, stale temporaries, the listing of committed parts."""
        choose = getattr(self.out, "choose_layout", None)
        if choose is not None:
            choose(len(self.units))
        clean_stale_temps(self.out)
        done = self.out.committed_units()
        todo = [u for u in self.units if u.unit_id not in done]
        stripe = getattr(indexes_mod, "striped", lambda units, worker: units)
        self.scheduler = Scheduler(stripe(todo, self.name), self.policy, self.leases.live_workers)

    def _run(self) -> None:
        self._prepare()
        self.live.start()
        self.leases.start()
        while self.scheduler and not self.dead.is_set():
            k, first = self.scheduler.next_engine(0)
            claimed = first is not None and self.claims.claim(first)
            unit = first if claimed else self.claims.next(self.scheduler, k)
            if unit is None:
                break
            SimSource.speed = self.speed
            self.source = SimSource(
                self.scheduler,
                self.claims,
                k,
                Rows(),
                StopFlag(30.0),
                self.cfg["linger_s"] / self.speed,
                [unit],
                3,
            )
            self.source.trace = self.trace
            self.record.watch(self.source.open_units, k)
            for result in self.engine.run(self.source, lambda: False):
                self._commit(result)
        self.idle_at = time.time() - self.t0

    def _commit(self, result: UnitResult) -> None:
        """``Worker._commit``: the part, the failure record, progress, the shared stats."""
        assert self.source is not None
        uid = result.unit.unit_id
        outcome, _ = self.writer.commit(result)
        if outcome is Commit.DISCARDED:
            self.discarded += 1
            self.source.done(uid)
            return
        self.committed += 1
        self.failures.clear(uid)
        source = self.source
        self.record.committed(result, None, close=lambda: source.done(uid))
        self.policy.observe(Observation.from_result(result, 16))

    def report(self) -> dict:
        claimed = self.claims.claimed
        return {
            "name": self.name,
            "committed": self.committed,
            "discarded": self.discarded,
            "claimed": len(claimed),
            "claims": claimed,
            "conflicts": self.claims.conflicts,
            "conflict_times": self.claims.conflict_times,
            "conflict_units": self.claims.conflict_units,
            "conflict_revisits": self.claims.conflict_revisits,
            "conflict_kinds": self.claims.conflict_kinds,
            "first_claim": claimed[0][0] if claimed else None,
            "killed_at": self.killed_at,
            "held_at_kill": self.held_at_kill,
            "watched": sorted(self.claims.watched),
            "looks": self.claims.looks,
            "idle_at": self.idle_at,
            "exit_code": self.exit_code,
            "error": self.error,
            "trace": [(round((t - self.t0) * self.speed), a, b) for t, a, b in self.trace[-5:]],
            "lingers": getattr(self.claims, "lingers", lambda: None)(),
            "live_count": self.leases._counted[1] if hasattr(self.leases, "_counted") else None,
        }
