"""Claiming work: which unit a worker takes next, through leases and failure records.

A worker walks the plan, skips what is committed or failed in this run, claims the rest by
lease, and comes back now and then to units other workers held (a holder that stops hands them
back; a dead one's lease goes stale). Units an engine failure interrupted come back first.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from batchspec.inputs import PromptBuilder, UnitRequests
from batchspec.leases import Leases
from batchspec.planner import WorkUnit
from batchspec.writer import part_error_positions, part_path

FAILED_DIR = "failed"
REVISIT_S = 2.0
"""How often a worker looks again at units other workers held."""


class Stopping(Protocol):
    """What the source needs of the worker's stop flag: once set, claim nothing more."""

    @property
    def stopping(self) -> bool: ...


class FailureLog:
    """``failed/<unit_id>.json``: units given up after repeated engine failures.

    Within one run (``run_id``) a failed unit is skipped; a later run retries it, and its
    record goes once the unit commits.
    """

    def __init__(self, out_dir: Path, run: str):
        self.dir = out_dir / FAILED_DIR
        self.run = run

    def record(self, unit: WorkUnit, attempts: int, error: str) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        data = {
            "unit_id": unit.unit_id,
            "run_id": self.run,
            "attempts": attempts,
            "error": error,
            "rows": unit.num_rows,
            "time": time.time(),
        }
        tmp = self.dir / f".{unit.unit_id}.{uuid.uuid4().hex[:8]}"
        tmp.write_text(json.dumps(data) + "\n")
        os.replace(tmp, self.dir / f"{unit.unit_id}.json")

    def failed_in_this_run(self, unit_id: str) -> bool:
        try:
            return json.loads((self.dir / f"{unit_id}.json").read_text())["run_id"] == self.run
        except (FileNotFoundError, ValueError, KeyError):
            return False

    def clear(self, unit_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.dir / f"{unit_id}.json").unlink()


class ClaimingSource:
    """The engine's unit source for one K: claims units through leases as the engine needs them.

    Units held by live workers are passed over (they will commit them); units handed back after
    an engine failure come first.
    """

    def __init__(
        self,
        units: list[WorkUnit],
        out_dir: Path,
        leases: Leases,
        failures: FailureLog,
        stop: Stopping,
        more: Callable[[], list[WorkUnit]] = list,
        linger_s: Callable[[], float] = float,
    ):
        self.pending: deque[WorkUnit] = deque(units)
        self.more = more
        """Asked for further units whenever ``pending`` runs dry (the runner plans per unit)."""
        self.retry: deque[WorkUnit] = deque()
        self.deferred: list[WorkUnit] = []
        """Units held by other workers when we came by: looked at again later."""
        self._revisited = time.monotonic()
        self.linger_s = linger_s
        """How long to wait on units others hold once nothing else is left (0: do not)."""
        self._linger_since: float | None = None
        self.error_rows: set[str] = set()
        """Committed units whose error rows are to be generated again (--retry-errors)."""
        self.out_dir = out_dir
        self.leases = leases
        self.failures = failures
        self.builder: PromptBuilder | None = None
        """Set once the engine is up: the length check needs its max_model_len."""
        self.stop = stop
        self.open: dict[str, UnitRequests] = {}
        """Units claimed and handed to the engine, not yet committed or given up."""

    def _claim_next(self) -> WorkUnit | None:
        while True:
            while self.pending:
                unit = self.pending.popleft()
                claimed = self._try(unit)
                if claimed is not None:
                    return claimed
            extra = self.more()
            if extra:
                self.pending.extend(extra)
                continue
            # Units other workers held: look again now and then, since a holder that stops
            # (a signal, a crash) hands them back or lets its lease go stale.
            if not self.deferred or time.monotonic() - self._revisited < REVISIT_S:
                return None
            self.pending.extend(self.deferred)
            self.deferred.clear()
            self._revisited = time.monotonic()

    def _try(self, unit: WorkUnit) -> WorkUnit | None:
        """Claim ``unit`` if it still needs work and nobody live holds it."""
        uid = unit.unit_id
        retrying = uid in self.error_rows
        if self.failures.failed_in_this_run(uid):
            return None
        if not retrying and part_path(self.out_dir, uid).exists():
            return None
        if not self.leases.try_claim(uid):
            self.deferred.append(unit)  # a live worker holds it
            return None
        # Checked again under the lease: another worker may have finished it meanwhile.
        done = (
            not part_error_positions(self.out_dir, uid)
            if retrying
            else part_path(self.out_dir, uid).exists()
        )
        if done:
            self.leases.release(uid)
            return None
        return unit

    def has_work(self) -> bool:
        """Claim ahead (without building) so no engine starts for units others hold."""
        if self.retry:
            return True
        unit = self._claim_next()
        if unit is None:
            return False
        self.retry.appendleft(unit)
        return True

    def next_unit(self) -> UnitRequests | None:
        if self.stop.stopping:
            return None
        unit = self.retry.popleft() if self.retry else self._claim_next()
        if unit is None:
            return None
        assert self.builder is not None
        positions = None
        if unit.unit_id in self.error_rows:
            positions = part_error_positions(self.out_dir, unit.unit_id)
        requests = self.builder.build(unit, positions)
        self.open[unit.unit_id] = requests
        return requests

    def exhausted(self) -> bool:
        if self.stop.stopping:
            return True
        if self.pending or self.retry:
            return False
        # Last look at the units others held before this engine goes idle.
        self._revisited = 0.0
        unit = self._claim_next()
        if unit is not None:
            self.retry.append(unit)
            return False
        if not self.deferred:
            return True
        # Others still hold units: wait a while, to take over any they hand back or abandon.
        if self._linger_since is None:
            self._linger_since = time.monotonic()
        return time.monotonic() - self._linger_since >= self.linger_s()

    def lingering(self) -> bool:
        return self._linger_since is not None

    def wait(self) -> None:
        time.sleep(1.0 if self.lingering() else 0.05)

    def release_unstarted(self) -> None:
        """Hand back units claimed ahead but not yet given to the engine (on a stop)."""
        for unit in list(self.retry):
            if unit.unit_id not in self.open:
                self.leases.release(unit.unit_id)

    def done(self, unit_id: str) -> None:
        self.open.pop(unit_id, None)
        self.leases.release(unit_id)
