"""Which unit a worker runs next, and at which K: one object decides both.

vLLM fixes K per engine, so the order of units is a plan of engines: the scheduler keeps the
current engine's batch full as long as the K policy plans units at its K (deciding again for
every unit, from the latest shared measurements), and says which K comes next when it stops
doing so. It owns the units this worker may still run; claiming them (leases) is
``claims``' business, and running them the engine's.

On an engine that takes K per unit (the tree engine) there is no engine plan: units come in
plan order, whatever their domain, each at its domain's planned K (``unit_k``).

Either way a domain's first unit goes out before its second while the controller has not
seen the domain (``_first_looks``): inputs usually come grouped by domain, and plan order
would otherwise fill a whole batch with one new domain's units, every one at the K chosen
before any of them committed.

The engine asks for a unit whenever its batch has room, which while the batch drains is every
engine step: a decision is made again only when something it depends on changed (a unit
taken, a new measurement, the engine's K, the number of live workers), and an answer "nothing
more at K" stands until then.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable

from batchspec.speculation.policy import Decision, KPolicy
from batchspec.units import WorkUnit

Domain = str | None

COUNT_WORKERS_S = 30.0
"""How often the live workers are counted (one read of every lease file): they change slowly."""


class Scheduler:
    """The units a worker may still run, one queue per domain in plan order, and the choice
    of the next one and its K.

    Rows left per domain are kept as units are taken, so a decision costs O(domains), not
    O(units), on plans of a hundred thousand units.
    """

    def __init__(
        self,
        units: list[WorkUnit],
        policy: KPolicy,
        live_workers: Callable[[], int] | None = None,
    ):
        self.policy = policy
        self.live_workers = live_workers
        """Workers of the run now (from the leases): this one runs about 1/N of the rows left."""
        self._workers = 1
        self._counted_at = -math.inf
        self._taken = 0
        self._decided: tuple[object, Decision] | None = None
        self._idle: object = None
        """The state in which ``next_unit`` last found nothing at its K."""
        self._queues: dict[Domain, deque[tuple[int, WorkUnit]]] = {}
        for i, u in enumerate(units):
            self._queues.setdefault(u.domain, deque()).append((i, u))
        self.rows = {d: sum(u.num_rows for _, u in q) for d, q in self._queues.items()}
        """Rows left per domain; only domains with units left."""
        self._unit_k: dict[str, int] = {}
        """The planned K of each unit taken and not yet asked for (``unit_k``)."""
        self._unit_drafter: dict[str, str] = {}
        """The same for the planned drafter (``speculative.drafters``; ``unit_drafter``)."""
        self._probes: set[str] = set()
        """Units taken to measure a K (the policy's probe): ``rechoose`` leaves their K."""
        self._started: set[Domain] = set()
        """Domains with a unit taken from this plan (run here, or claimed by another worker
        first): their first look at the domain is under way (``_first_looks``)."""

    def __bool__(self) -> bool:
        return bool(self._queues)

    def next_engine(self, engine_k: int | None) -> tuple[int, WorkUnit | None]:
        """The K of the next engine and its first unit.

        The current engine's K if the plan still runs units there, otherwise the planned K
        with the most rows left; where much work is left and a neighbouring K was never
        measured, first a single unit there (the policy's probe).
        """
        decision = self._decide(engine_k)
        if self.policy.per_unit and engine_k is not None:
            return engine_k, self._take_any(decision)
        if decision.probe is not None:
            domain, k = decision.probe
            self.policy.taken(domain, explored=True)
            probe = self._pop(domain, k)
            self._probes.add(probe.unit_id)
            return k, probe
        rows_by_k: dict[int, int] = {}
        for d, n in self.rows.items():
            rows_by_k[decision.plan[d]] = rows_by_k.get(decision.plan[d], 0) + n
        if engine_k is not None and engine_k in rows_by_k:
            k = engine_k
        else:
            k = max(rows_by_k, key=lambda x: (rows_by_k[x], -x))
        return k, self._take(k, decision.plan)

    def next_unit(self, k: int) -> WorkUnit | None:
        """For an engine at K that has room: the next unit to run there, or None when the
        plan runs nothing more at K (or wants a probe elsewhere first): time to switch."""
        if not self:
            return None
        decision = self._decide(k)
        if self.policy.per_unit:
            return self._take_any(decision)
        if self._idle == self._state(k):
            return None
        unit = None
        if decision.probe is None or decision.probe[1] == k:
            unit = self._take(k, decision.plan)
        if unit is None:
            self._idle = self._state(k)
        return unit

    def _state(self, engine_k: int | None) -> tuple[object, ...]:
        """Everything a decision depends on, besides the rows left (which change only when a
        unit is taken)."""
        return engine_k, self._taken, self._workers, self.policy.version

    def _decide(self, engine_k: int | None) -> Decision:
        """The policy's decision, made again only when its inputs changed."""
        self.policy.refresh()
        if self.live_workers is not None and time.monotonic() - self._counted_at >= COUNT_WORKERS_S:
            self._counted_at = time.monotonic()
            self._workers = max(1, self.live_workers())
        state = self._state(engine_k)
        if self._decided is None or self._decided[0] != state:
            self._decided = (state, self.policy.decide(self.rows, engine_k, self._workers))
        return self._decided[1]

    def _take(self, k: int, plan: dict[Domain, int]) -> WorkUnit | None:
        """The next unit to run at K, in plan order: planned there, or riding along to keep
        measuring K for its domain."""
        planned = [d for d in self.rows if plan[d] == k]
        riding = [d for d in self.rows if plan[d] != k and self.policy.explores(d, plan[d], k)]
        candidates = self._first_looks(planned + riding)
        if not candidates:
            return None
        # Of these domains, the one whose next unit comes first in the plan.
        domain = min(candidates, key=lambda d: self._queues[d][0][0])
        self.policy.taken(domain, explored=plan[domain] != k)
        return self._pop(domain, k)

    def _take_any(self, decision: Decision) -> WorkUnit | None:
        """The next unit in plan order, of any domain, at its domain's planned K and drafter
        (an engine that takes K per unit)."""
        if not self._queues:
            return None
        domain = min(self._first_looks(list(self._queues)), key=lambda d: self._queues[d][0][0])
        self.policy.taken(domain, explored=False)
        unit = self._pop(domain, decision.plan[domain])
        if domain in decision.drafters:
            self._unit_drafter[unit.unit_id] = decision.drafters[domain]
        return unit

    def _first_looks(self, domains: list[Domain]) -> list[Domain]:
        """Of ``domains``, those whose next unit may go now: a domain the controller has not
        seen (no unit of it committed, here or by another worker) and of which a unit was
        already taken waits while any other remains. Replay of that first unit's rows tells
        every K, so its second unit runs at the domain's own K rather than at the one chosen
        blind; meanwhile the other domains' units keep the batch full. Not where nothing is
        learned (speculation fixed)."""
        if not self.policy.adaptive:
            return domains
        ctl = self.policy.ctl
        ready = [
            d
            for d in domains
            if d not in self._started or ctl.seen(d) or ctl.fixed_k(d) is not None
        ]
        return ready or domains

    def take(self, unit_id: str) -> WorkUnit | None:
        """Take one unit out of the plan, wherever it is (a dead worker's unit this worker
        takes over: O(units), once per takeover); None if it is not in the plan."""
        for domain, queue in self._queues.items():
            for item in queue:
                if item[1].unit_id == unit_id:
                    queue.remove(item)
                    self.rows[domain] -= item[1].num_rows
                    if not queue:
                        del self._queues[domain], self.rows[domain]
                    return item[1]
        return None

    def rechoose(self, unit: WorkUnit) -> None:
        """A unit taken before its engine came up: the run's first, planned before any step
        cost priced K, so at the blind K of no costs (the spec's K; at batch 8 on this CPU, a
        step a third dearer than plain were nothing accepted). On an engine that takes K per
        unit its K and drafter are chosen again once the engine's costs are in; a probe keeps
        the K it went to measure."""
        policy, probe = self.policy, unit.unit_id in self._probes
        self._probes.discard(unit.unit_id)
        if policy.per_unit and policy.adaptive and not probe and unit.unit_id not in self._unit_k:
            self._unit_k[unit.unit_id], drafter = policy.choose(unit.domain)
            if drafter is not None:
                self._unit_drafter[unit.unit_id] = drafter

    def unit_k(self, unit: WorkUnit) -> int | None:
        """The K the plan gave ``unit`` when it was taken (None if unknown): what an engine
        that takes K per unit decodes its rows at."""
        return self._unit_k.pop(unit.unit_id, None)

    def unit_drafter(self, unit: WorkUnit) -> str | None:
        """The drafter the plan gave ``unit`` (None: the job's method)."""
        return self._unit_drafter.pop(unit.unit_id, None)

    def _pop(self, domain: Domain, k: int) -> WorkUnit:
        self._taken += 1
        self._started.add(domain)
        _, unit = self._queues[domain].popleft()
        if self.policy.per_unit:
            self._unit_k[unit.unit_id] = k
        self.rows[domain] -= unit.num_rows
        if not self._queues[domain]:
            del self._queues[domain], self.rows[domain]
        return unit
