"""After an engine crash: the units it had in flight, rerun alone and bisected down to the row
that kills the engine.

A crash with several units in flight does not say which of them caused it, and retrying them
together would charge a poison row's crashes to every unit near it. So the units in flight
become suspects: each runs alone; a group of rows that crashes alone is split in halves, each
run alone, down to single rows. A row that crashes the engine on its own becomes an error row
and every other row completes.

Crashes that narrow the search (the rows in flight are a strict part of those in flight at
the previous crash) are expected and free. Any other crash (the engine died on rows it had not
died on before: a transient fault, or one that hits whatever runs) counts an attempt against
each unit in flight, and a unit out of attempts (``execution.max_unit_attempts``) is given up
for this run. A poison row costs about log2(unit rows) engine starts, once.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from batchspec.spec.tree import EngineName
from batchspec.units import RowResult, UnitRequests, UnitResult


@dataclass
class Suspect:
    """A unit under bisection: its rows as claimed, groups left to run, results so far."""

    base: UnitRequests
    todo: deque[list[int]] = field(default_factory=deque)
    """Groups of row indices (into ``base.rows``) still to run, each alone."""
    done: dict[int, RowResult] = field(default_factory=dict)


class Quarantine:
    """The suspects of one worker's engine at one K, and what runs next: one group, alone."""

    def __init__(self, max_attempts: int):
        self.max_attempts = max_attempts
        self.attempts: dict[str, int] = {}
        """Crashes that counted against each unit (the narrowing ones do not)."""
        self.suspects: dict[str, Suspect] = {}
        self._running: dict[str, list[int]] = {}
        self._last: frozenset[tuple[str, int]] | None = None
        """(unit, file row) in flight at the last crash."""

    def __bool__(self) -> bool:
        return bool(self.suspects)

    def owns(self, unit_id: str) -> bool:
        """Whether the engine is running a group of this suspect."""
        return unit_id in self._running

    def crashed(self, inflight: dict[str, UnitRequests], error: str) -> list[str]:
        """The engine died with these requests in flight (per unit): they become suspects,
        split when they ran alone. Returns the units out of attempts (no longer suspects)."""
        rows = frozenset((uid, r.row) for uid, req in inflight.items() for r in req.rows)
        narrowing = self._last is not None and rows < self._last
        self._last = rows
        alone = len(inflight) == 1
        given_up = []
        for uid, requests in inflight.items():
            suspect = self.suspects.setdefault(uid, Suspect(requests))
            group = self._running.pop(uid, None) or list(range(len(requests.rows)))
            if not narrowing:
                self.attempts[uid] = self.attempts.get(uid, 0) + 1
                if self.attempts[uid] >= self.max_attempts:
                    del self.suspects[uid]
                    given_up.append(uid)
                    continue
            if not alone:
                suspect.todo.appendleft(group)
            elif len(group) > 1:
                half = len(group) // 2
                suspect.todo.extendleft([group[half:], group[:half]])
            else:
                row = suspect.base.rows[group[0]]
                message = f"the engine dies on this row (run alone, it crashed: {error})"
                suspect.done[group[0]] = RowResult(row, error=message)
        return given_up

    def next_group(self) -> UnitRequests | None:
        """The next group to run, alone: None while one is running or when none is left."""
        if self._running:
            return None
        for uid, suspect in self.suspects.items():
            if suspect.todo:
                group = suspect.todo.popleft()
                self._running[uid] = group
                return UnitRequests(suspect.base.unit, [suspect.base.rows[i] for i in group])
        return None

    def finished(self, result: UnitResult) -> UnitResult | None:
        """A group ran through: keep its rows; returns the unit's whole result once complete."""
        uid = result.unit.unit_id
        suspect = self.suspects[uid]
        for i, r in zip(self._running.pop(uid), result.results, strict=True):
            suspect.done[i] = r
        return self._whole(uid, result.k, result.method, result.engine)

    def completed(self, k: int, method: str, engine: EngineName) -> list[UnitResult]:
        """Units whose last rows were just resolved as error rows (by ``crashed``), from the
        engine that crashed (its name goes into every row's ``engine`` column)."""
        return [r for uid in list(self.suspects) if (r := self._whole(uid, k, method, engine))]

    def drop(self) -> list[str]:
        """Forget every suspect (stopping): their unit ids, to hand back."""
        dropped = list(self.suspects)
        self.suspects.clear()
        self._running.clear()
        return dropped

    def _whole(self, uid: str, k: int, method: str, engine: EngineName) -> UnitResult | None:
        suspect = self.suspects[uid]
        base = suspect.base
        if suspect.todo or uid in self._running or len(suspect.done) < len(base.rows):
            return None
        del self.suspects[uid]
        whole = UnitRequests(base.unit, base.rows, len(base.rows), base.positions)
        rows = [suspect.done[i] for i in range(len(base.rows))]
        return UnitResult(whole, rows, k, method, engine)
