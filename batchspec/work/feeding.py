"""What the worker adds to a unit between the engine and the writer: each unit's K on an
engine that takes K per unit, and every finished row's replayed acceptance, within a budget.
"""

from __future__ import annotations

import time

from batchspec.engines import Engine
from batchspec.spec import JobSpec
from batchspec.speculation.replay import Replayer
from batchspec.units import RowResult, SpecStats, UnitRequests, UnitResult
from batchspec.work.scheduler import Scheduler
from batchspec.work.source import ClaimingSource

REPLAY_SHARE = 0.01
"""Replay (``speculation/replay.py``) may take at most this share of the worker's time since
its first engine came up; rows past it are not replayed (their replay columns stay null)."""


class Replays:
    """Replays committed rows at every K of the grid (``RowResult.replayed``), taking at
    most ``REPLAY_SHARE`` of the time since the first engine came up: on the tree engine
    the worker's thread is the engine's, so every replayed millisecond is one it waits."""

    def __init__(self, spec: JobSpec):
        self.spec = spec
        self.replayer: Replayer | None = None
        self.seconds = 0.0
        self.rows = 0
        self.checked = 0
        """Replayed rows whose real count at the K that ran is comparable (``check``)."""
        self.equal = 0
        """Of those, rows whose replay at that K equals the engine's own count."""
        self._up_at: float | None = None

    def engine_up(self, engine: Engine) -> None:
        """Replay for this engine: its drafting, the job's grid with every K that may run."""
        s = self.spec.speculative
        grid = sorted({*s.k_grid, engine.k, *s.per_domain.values()})
        self.replayer = Replayer(self.spec, engine.name, grid, engine.max_model_len)
        self.replayer.costs = getattr(engine, "draft_costs", None)
        self.replayer.learner = getattr(engine, "learner", None)
        if self._up_at is None:
            self._up_at = time.perf_counter()

    def learn(self, domain: str | None, outputs: list[list[int]]) -> None:
        """Outputs the engine learned from committed parts (``seeding``): replayed rows of
        the domain draft from them as the engine's did."""
        if self.replayer is not None:
            self.replayer.learn(domain, outputs)

    def replay(self, result: UnitResult) -> None:
        """The unit's rows replayed, in order, until the budget is spent."""
        replayer = self.replayer
        if replayer is None or not replayer.supported or self._up_at is None:
            return
        for r in result.results:
            started = time.perf_counter()
            if self.seconds > REPLAY_SHARE * (started - self._up_at):
                return
            each = replayer.each(r)
            if each is not None:
                self._keep(r, each, result.unit_requests.drafter)
                if r.replayed is not None:
                    self._check(r.replayed, r.spec, result.k, replayer.open_end)
                self.rows += 1
            self.seconds += time.perf_counter() - started

    def _keep(self, r: RowResult, each: dict[str, list[int]], drafter: str | None) -> None:
        """A row's replays: the replay of the drafter it ran (``replayed``: its columns,
        its check), and with ``speculative.drafters`` every drafter's (``replays``); beside
        each, the drafts it proposed at every K (what they cost a step)."""
        grid = self.replayer.grid if self.replayer is not None else []
        replays = {d: dict(zip(grid, accepted, strict=True)) for d, accepted in each.items()}
        ran = drafter or self.spec.speculative.method
        r.replayed = replays.get(ran)
        drafted = (self.replayer.drafted if self.replayer is not None else None) or {}
        r.replayed_drafted = drafted.get(ran)
        if self.spec.speculative.drafters is not None:
            r.replays = replays
            r.replays_drafted = drafted

    def _check(
        self, replayed: dict[int, int], spec: SpecStats | None, k: int, open_end: set[int]
    ) -> None:
        """Replay at the K that ran against the engine's own count: the run log's standing
        check that replay is exact (vLLM rows whose last draft outran the row's end are not
        comparable: vLLM counts past the end). Under a batch-size schedule a row's steps ran
        at several K: no single K's replay is comparable."""
        if self.spec.speculative.k_by_batch_size is not None:
            return
        if k > 0 and spec is not None and k in replayed and k not in open_end:
            self.checked += 1
            self.equal += replayed[k] == spec.accepted


class UnitKFeed:
    """The engine's feed when it takes K per unit: each unit at the K the plan gave it."""

    def __init__(self, source: ClaimingSource, scheduler: Scheduler):
        self.source, self.scheduler = source, scheduler

    def next_unit(self) -> UnitRequests | None:
        requests = self.source.next_unit()
        if requests is not None and requests.k is None:
            requests.k = self.scheduler.unit_k(requests.unit)
            requests.drafter = self.scheduler.unit_drafter(requests.unit)
        return requests

    def exhausted(self) -> bool:
        return self.source.exhausted()

    def wait(self) -> None:
        self.source.wait()
