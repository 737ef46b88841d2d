"""One simulated worker of ``sim.py``: the product's own ``work.worker.Worker`` in a thread, on
``standins.py``'s backend (engine, rows, policy; ``work.backend``), its claiming instrumented to
count what the fleet's table reports."""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
from standins import backend

from batchspec.io.checks import Preflight
from batchspec.io.layout import OutDir
from batchspec.io.temps import clean_stale_temps
from batchspec.spec import JobSpec
from batchspec.units import WorkUnit
from batchspec.work.claims import Claims
from batchspec.work.completion import completion
from batchspec.work.runlog import RunStats
from batchspec.work.worker import Worker

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
        self.retired: list[tuple[float, str]] = []
        """Units of a dead worker its watcher took over, when (before the engine got them)."""
        self._revisiting: dict[str, str] = {}
        look, try_claim, retire = self.watch.look, self.leases.try_claim, self.leases.retire

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

        def retired(worker: str) -> list[str]:
            units = retire(worker)
            self.retired += [(time.time() - self.t0, u) for u in units]
            return units

        self.leases.after_beat = looked
        self.leases.try_claim = counted  # type: ignore[method-assign]
        self.leases.retire = retired  # type: ignore[method-assign]

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
    """One worker: the product's ``Worker`` run in a thread, named ``name``. A kill freezes it
    where it stands (``StandInEngine``), as kill -9 would: nothing of its runs again, nothing
    is released, and others judge it by its silence (its process lives on: ``sim.py``)."""

    def __init__(self, cfg: dict, spec: JobSpec, units: list[WorkUnit], name: str, t0: float):
        self.cfg, self.spec, self.units, self.name, self.t0 = cfg, spec, units, name, t0
        self.dead = threading.Event()
        self.slow = cfg["slow"] > 1 and name == "w00000"
        self.worker: Worker | None = None
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)
        self.killed_at: float | None = None
        self.held_at_kill: list[str] = []
        self.idle_at: float | None = None
        self.exit_code: int | None = None
        """What ``run`` would exit with when this worker ends (``work.completion``)."""
        self.error: str | None = None

    def running(self) -> bool:
        """Its thread runs and it was not killed (a killed one's thread stands still)."""
        return self.thread.is_alive() and self.killed_at is None

    def busy(self) -> bool:
        source = self.worker._source if self.worker is not None else None
        return bool(source is not None and source.open)

    def vanish(self) -> None:
        """Kill -9, simulated: heartbeats and records stop, nothing is released."""
        assert self.worker is not None
        self.killed_at = time.time() - self.t0
        self.held_at_kill = sorted(self.worker.leases.held)
        self.stop_now()

    def stop_now(self) -> None:
        self.dead.set()
        if self.worker is not None:
            self.worker.leases.heart.stopped.set()
            if self.worker.live is not None:
                self.worker.live._stop.set()

    def _main(self) -> None:
        try:
            self._run()
        except Exception as exc:  # a broken simulation must not pass as a clean run
            self.error = f"{type(exc).__name__}: {exc}"
            raise
        self.idle_at = time.time() - self.t0
        self.exit_code = int(completion(OutDir(self.cfg["out"])).exit_code)

    def _run(self) -> None:
        """What ``run_job`` does: the start of ``prepare_run`` (layout, stale temporaries,
        parts listed; the input is made up), then the worker, its claims counted."""
        out, cfg = OutDir(self.cfg["out"]), self.cfg
        out.choose_layout(len(self.units))
        clean_stale_temps(out)
        done = out.committed_units()
        todo = [u for u in self.units if u.unit_id not in done]
        stats = RunStats(
            str(out.root), "sim", self.name, len(self.units), len(self.units) - len(todo)
        )
        # No files, model or reader: the backend's rows are made up, it loads no tokenizer.
        pre = Preflight([], {"id": pa.string()}, self.units, Path(), Path(), None, None, [])  # type: ignore[arg-type]
        unit_s = cfg["unit_s"] * (cfg["slow"] if self.slow else 1.0) / cfg["speed"]
        parts = backend(unit_s, cfg["depth"], self.dead)
        self.worker = w = Worker(self.spec, pre, todo, set(), stats, parts)
        w.claims = CountingClaims(out, w.leases, w.failures, set(), t0=self.t0)
        w.run("log", 30.0 / cfg["speed"], _NULL)  # as a Slurm array task logs it

    def report(self) -> dict:
        keys = ["name", "killed_at", "held_at_kill", "idle_at", "exit_code", "error"]
        mine = {key: getattr(self, key) for key in keys}
        if self.worker is None:  # it failed before its worker was made (``error`` says why)
            none: dict[str, Any] = dict(committed=0, discarded=0, first_claim=None, lingers=0)
            return (
                mine
                | none
                | dict(claims=[], conflicts=[], conflict_kinds={}, watched=[], looks=[], retired=[])
            )
        c, stats = self.worker.claims, self.worker.stats
        assert isinstance(c, CountingClaims)
        return mine | {
            "committed": stats.units_committed,
            "discarded": stats.units_discarded,
            "claims": c.claimed,
            "conflicts": c.conflicts,
            "conflict_kinds": dict(c.kinds),
            "first_claim": c.claimed[0][0] if c.claimed else None,
            "watched": sorted(c.watched),
            "looks": c.looks,
            "retired": c.retired,
            "lingers": c.lingers(),
        }
