"""What a worker knows of the others' units without asking the filesystem unit by unit.

At a thousand workers on one shared filesystem, what each claim costs the metadata server is
what matters (``docs/fleet.md``). A worker learns which units are done from one listing of a
directory of parts (``DoneIndex``: ~1,000 consecutive units in a fanned-out parts/), and which
are held from one listing of leases/ (``HeldIndex``), each trusted a while; and the workers
of a fleet start at different points of the plan (``striped``). A listing that is out of
date costs a few operations (a claim attempt, a stat under the lease), never a duplicate:
what is committed is decided under the lease, by the part itself. Failure records
(``FailureLog``) are known the same way, from a listing of ``failed/``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
import uuid
from pathlib import Path

from batchspec.io.layout import LEASE_SUFFIX, OutDir, unit_ids_in
from batchspec.units import WorkUnit

LIST_S = 120.0
"""A listing of a directory of parts (or of failure records) is trusted this long; a unit
committed since is caught under its lease (one stat), so staleness costs a few operations,
never a duplicate."""


def striped(units: list[WorkUnit], worker: str) -> list[WorkUnit]:
    """The plan rotated to start at a point hashed from the worker's name: a fleet's workers
    start spread over the plan, each walking a stretch of its own, instead of all racing for
    the first units (the order within a domain is otherwise kept)."""
    if not units:
        return units
    start = int(hashlib.sha1(worker.encode()).hexdigest()[:12], 16) % len(units)
    return units[start:] + units[:start]


HELD_S = 30.0
"""A listing of leases/ is trusted this long: a unit it shows held is passed over without a
claim attempt (and looked at again later); one taken since it was listed costs a conflict."""


class Listing:
    """The unit ids of one folder's ``<unit_id><suffix>`` files as last listed, listed again
    once the listing is ``ttl`` seconds old: what a worker trusts instead of a file operation
    per unit. A listing that fails (a bad moment of the filesystem) leaves the last one
    standing, tried again at the next look."""

    def __init__(self, folder: Path, suffix: str, ttl: float):
        self.folder, self.suffix, self.ttl = folder, suffix, ttl
        self.at = -float("inf")
        self.names: set[str] = set()

    def current(self) -> set[str]:
        if time.monotonic() - self.at >= self.ttl:
            try:
                self.names = unit_ids_in(self.folder, self.suffix)
            except OSError:
                return self.names
            self.at = time.monotonic()
        return self.names

    def age(self) -> float:
        return time.monotonic() - self.at

    def expire(self) -> None:
        """Listed again at the next look."""
        self.at = -float("inf")


class HeldIndex:
    """Which units other workers hold, from one listing of leases/ every ``HELD_S``."""

    def __init__(self, out: OutDir):
        self.leases = Listing(out.leases, LEASE_SUFFIX, HELD_S)

    def held(self, unit_id: str) -> bool:
        return unit_id in self.leases.current()

    def fresh(self, max_age: float) -> None:
        """List again at the next look if the listing is older than ``max_age``."""
        if self.leases.age() > max_age:
            self.leases.expire()

    def stale(self) -> None:
        """A unit the listing showed free was held: list again at the next look, unless the
        listing is younger than a tenth of ``HELD_S`` (a walk over units taken since lists
        once or twice, not per unit; a fleet's end, every few seconds at most)."""
        self.fresh(HELD_S / 10)


class DoneIndex:
    """Which units are committed, from listings of their directories of parts, each trusted
    for ``LIST_S``: one listing covers ~1,000 consecutive units in a fanned-out parts/."""

    def __init__(self, out: OutDir):
        self.out = out
        self._listed: dict[Path, tuple[float, set[str]]] = {}

    def done(self, unit_id: str) -> bool:
        folder = self.out.part_dir(unit_id)
        at, names = self._listed.get(folder, (-float("inf"), set()))
        if unit_id in names:
            return True
        if time.monotonic() - at >= LIST_S:
            try:
                names = self.out.parts_in(folder)
            except OSError:  # a bad moment of the filesystem: "not known done", listed
                return False  # again at the next look; the claim's check decides
            self._listed[folder] = (time.monotonic(), names)
        return unit_id in names

    def recheck(self, unit_id: str) -> bool:
        """Whether a unit is committed, its directory listed again unless the listing is
        younger than an eighth of ``LIST_S``: asked of a unit leases/ no longer lists (most
        likely committed since). At a fleet's end every worker that passed a unit asks at
        once; a claim attempt each to find out raced the others' (at 1,000 simulated
        workers, ~26,000 conflicts for 8 claims)."""
        if self.done(unit_id):
            return True
        folder, at, names = self._aged(unit_id)
        self._listed[folder] = (at, names)
        return self.done(unit_id)

    def stale(self, unit_id: str) -> None:
        """A unit its listing showed undone was committed: its directory is listed again at
        the next look, unless the listing is younger than an eighth of ``LIST_S`` (a walk
        over units committed since, such as the stretch left to a worker ahead, then lists
        once instead of paying a claim attempt per unit: lease, stat, unlink)."""
        folder, at, names = self._aged(unit_id)
        self._listed[folder] = (at, names | {unit_id})

    def _aged(self, unit_id: str) -> tuple[Path, float, set[str]]:
        """The listing of a unit's directory, its time set to never (listed again at the next
        look) unless it is younger than an eighth of ``LIST_S``."""
        folder = self.out.part_dir(unit_id)
        at, names = self._listed.get(folder, (-float("inf"), set()))
        return folder, (at if time.monotonic() - at <= LIST_S / 8 else -float("inf")), names


class FailureLog:
    """``failed/<unit_id>.json``: units given up after repeated engine failures.

    Within one run (``run_id``) a failed unit is skipped; a later run retries it, and its
    record goes once the unit commits.
    """

    def __init__(self, out: OutDir, run: str):
        self.out = out
        self.run = run
        self._listed = Listing(out.failed, ".json", LIST_S)
        """Unit ids with a failure record."""

    def _recorded(self, unit_id: str) -> bool:
        return unit_id in self._listed.current()

    def record(self, unit: WorkUnit, attempts: int, error: str) -> None:
        self.out.failed.mkdir(parents=True, exist_ok=True)
        data = {
            "unit_id": unit.unit_id,
            "run_id": self.run,
            "attempts": attempts,
            "error": error,
            "rows": unit.num_rows,
            "time": time.time(),
        }
        tmp = self.out.failed / f".{unit.unit_id}.{uuid.uuid4().hex[:8]}"
        tmp.write_text(json.dumps(data) + "\n")
        os.replace(tmp, self.out.failure(unit.unit_id))
        self._listed.names.add(unit.unit_id)

    def failed_in_this_run(self, unit_id: str) -> bool:
        """A failure record of this run (another worker's is seen within ``LIST_S``)."""
        if not self._recorded(unit_id):
            return False
        try:
            return json.loads(self.out.failure(unit_id).read_text())["run_id"] == self.run
        except (FileNotFoundError, ValueError, KeyError):
            return False

    def clear(self, unit_id: str) -> None:
        """Remove a unit's record once it committed (one listed, or written meanwhile: a
        record left behind counts for nothing once the unit's part is there)."""
        if not self._recorded(unit_id):
            return
        self._listed.names.discard(unit_id)
        with contextlib.suppress(FileNotFoundError):
            self.out.failure(unit_id).unlink()
