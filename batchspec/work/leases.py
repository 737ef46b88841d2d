"""Leases: how workers that share only a filesystem agree on who generates which unit.

A worker claims a unit by creating ``leases/<unit_id>.lease`` with O_EXCL (atomic on local
filesystems and NFSv3+), and removes it once the unit's part is committed or given up. Its
heartbeat is one record per worker, ``leases/<worker>.progress.json``, rewritten every
``heartbeat_s`` (and at each commit, which counts as a beat): one write per beat however many
units it holds, not a touch of every lease. The same record is the worker's progress record
(``work.progress``): one periodic write per worker, not two (docs/fleet.md). A lease is
stale, and may be taken over, when its holder's record has not changed for ``timeout_s`` of
the claimant's own clock (``work.heartbeat``: no two hosts' clocks are ever compared), or at
once when its holder ran on this host and that process is gone (a local rerun after kill -9
need not wait out the timeout). When a worker stops, or another takes a dead holder's lease
over, the record moves to ``progress/`` (kept: its counts stay in the sums), so the records
left in ``leases/`` count the live workers (one listing, no read).

Leases keep workers from doing the same work; they are not what makes output exactly-once.
That is the part commit (link to the final name, first wins), so the rare race in which two
workers both take over one stale lease costs duplicate work, never a duplicate row.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from batchspec.io.layout import HEARTBEAT_SUFFIX, LEASE_SUFFIX, OutDir
from batchspec.io.temps import create_exclusive, move_file
from batchspec.work.heartbeat import Heartbeat, Observer, version
from batchspec.work.holders import Holder

COUNT_S = 300.0
"""Live workers are counted (one listing of leases/) at most this often."""


@dataclass(frozen=True)
class LeaseInfo:
    unit_id: str
    holder: Holder | None
    version: tuple[int, int, int]
    """The lease file's own version (``heartbeat.version``): a lease retaken meanwhile differs."""
    age_s: float
    """Seconds since the lease was written, by this host's clock against the file server's:
    shown by ``status``, never used to decide anything (hosts' clocks may disagree)."""


class LeaseDir:
    """The leases of one output directory, read-only: for status and for claimants. Whether a
    holder is silent is what this object has watched (``Observer``), so one made for a single
    look (``status``) finds no lease stale except a dead process's on this host."""

    def __init__(self, out: OutDir, timeout_s: float):
        self.out = out
        self.dir = out.leases
        self.timeout_s = timeout_s
        self.observer = Observer()

    def path(self, unit_id: str) -> Path:
        return self.out.lease(unit_id)

    def read(self, unit_id: str) -> LeaseInfo | None:
        """The lease on a unit, or None if there is none."""
        path = self.path(unit_id)
        try:
            st = path.stat()
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            holder = Holder(**json.loads(raw))
        except (ValueError, TypeError):
            holder = None  # a lease being written right now, or torn by a crash
        seen = (st.st_ino, st.st_mtime_ns, st.st_size)
        return LeaseInfo(unit_id, holder, seen, time.time() - st.st_mtime)

    def silence(self, info: LeaseInfo) -> float:
        """Seconds this process has watched the lease's holder stay silent: its record
        unchanged (or missing: ended, retired, or never beat), or, for a lease that names no
        holder, the lease itself unchanged."""
        if info.holder is None:
            return self.observer.silent_for(f"lease:{info.unit_id}", info.version)
        return self.silence_of(info.holder.worker)

    def silence_of(self, worker: str) -> float:
        """Seconds this process has watched ``worker``'s record stay as it is; infinite once
        the record has moved to ``progress/`` (its worker ended, or was found dead and
        retired). A record found in neither place (not yet written, or a stale negative
        lookup of an NFS client) is watched like one that does not change."""
        try:
            seen = version(self.out.progress(worker))
        except FileNotFoundError:
            if self.out.progress_record(worker).exists():
                return float("inf")
            seen = None
        return self.observer.silent_for(worker, seen)

    def is_stale(self, info: LeaseInfo) -> bool:
        if info.holder is not None and info.holder.is_dead_here():
            return True
        timeout = max(self.timeout_s, info.holder.timeout_s if info.holder else 0.0)
        return self.silence(info) > timeout

    def all(self) -> list[LeaseInfo]:
        """Every lease in the directory (for status reports)."""
        infos = []
        for path in self.dir.glob(f"*{LEASE_SUFFIX}") if self.dir.is_dir() else []:
            info = self.read(path.name[: -len(LEASE_SUFFIX)])
            if info is not None:
                infos.append(info)
        return infos


class Leases(LeaseDir):
    """This worker's leases in one output directory, with a heartbeat thread."""

    def __init__(
        self,
        out: OutDir,
        worker: str,
        timeout_s: float,
        heartbeat_s: float,
        progress: Callable[[], dict[str, int]] | None = None,
    ):
        super().__init__(out, timeout_s)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.me = Holder.me(worker, timeout_s)
        self.heartbeat_s = heartbeat_s
        self._held: set[str] = set()
        self._lock = threading.Lock()
        self._payload = json.dumps(self.me.__dict__).encode()
        self.progress = progress
        """Rows finished per held unit, written beside the leases at every heartbeat."""
        self.record: Callable[[], dict] | None = None
        """The rest of the heartbeat record: this worker's progress record
        (``ProgressLog.snapshot``, which sets it), so that one write is both."""
        self.progress_path = out.progress(worker)
        self._writing = threading.Lock()
        """Beats come from the heartbeat thread and from commits: one writes at a time."""
        self.heart = Heartbeat(self._write, heartbeat_s, timeout_s / 2)
        self._written: dict | None = None
        self._beats = 0
        self._counted: tuple[float, int] = (-float("inf"), 1)
        """When to count the live workers next, and the last count."""
        self.orphans: deque[str] = deque()
        """Units of dead workers whose leases we took over (``take_over``): ours to run, as
        our engine pulls units (the heartbeat thread's watch adds, the worker takes)."""
        self.after_beat: Callable[[], None] | None = None
        """Run by the heartbeat thread after each beat: the watch over others (``Watch``)."""
        self._claiming = threading.RLock()
        """Claims come from the worker and from the heartbeat thread's watch: one at a time."""
        self.ring: list[str] = []
        """The workers with a record in leases/ at the last count (``work.watch`` orders it)."""
        self.wait_s = 0.0
        """How long the live lease the last failed ``try_claim`` found cannot go stale, by
        this process's watch of its holder (a claimant need not look again sooner)."""

    def _create(self, unit_id: str) -> bool:
        if not create_exclusive(self.path(unit_id), self._payload):
            return False
        with self._lock:
            self._held.add(unit_id)
        return True

    def try_claim(self, unit_id: str) -> bool:
        """Claim a unit that nobody holds, or whose holder is gone; False if it is held."""
        with self._claiming:
            return self._try_claim(unit_id)

    def _try_claim(self, unit_id: str) -> bool:
        if self._create(unit_id):
            return True
        info = self.read(unit_id)
        if info is None:
            return self._create(unit_id)
        if info.holder is None or not info.holder.is_dead_here():
            timeout = max(self.timeout_s, info.holder.timeout_s if info.holder else 0.0)
            silent = self.silence(info)
            self.wait_s = timeout - silent
            if silent <= timeout:
                return False
        # Re-read just before removing, so that a lease retaken meanwhile survives.
        again = self.read(unit_id)
        if again is None or again.version != info.version:
            return False
        with contextlib.suppress(FileNotFoundError):
            self.path(unit_id).unlink()
        taken = self._create(unit_id)
        if info.holder is not None and info.holder.worker != self.me.worker:
            self.take_over(info.holder.worker)  # its other units are ours too
        return taken

    def take_over(self, worker: str) -> None:
        """A dead worker's units: its record moves to ``progress/`` (it no longer counts as
        live, its counts stay in the sums, and its leases are free at once for everyone:
        ``silence_of``), and we claim every unit it listed, for our engine (``orphans``)."""
        with self._claiming:
            for unit_id in self.retire(worker):
                if unit_id not in self.held and self._try_claim(unit_id):
                    self.orphans.append(unit_id)

    def retire(self, worker: str) -> list[str]:
        """Move a dead worker's record to ``progress/`` (where ``read_records`` skips a bare
        heartbeat of an older batchspec); returns the units it held, none if another taker
        moved it first (that one takes them over)."""
        path = self.out.progress(worker)
        try:
            record = json.loads(path.read_bytes())
            units = list(record.get("units", {}))
        except FileNotFoundError:
            return []
        except (ValueError, AttributeError):
            units = []
        return units if move_file(path, self.out.progress_record(worker)) else []

    def release(self, unit_id: str) -> None:
        """Drop our lease (after commit, or when giving the unit up). While our heartbeat is
        fresh (a good beat within half the timeout, by our own clock), nobody can have
        watched our record silent for a timeout: it goes without a read."""
        with self._lock:
            ours = unit_id in self._held
            self._held.discard(unit_id)
        if ours and time.monotonic() - self.heart.last_ok < self.timeout_s / 2:
            with contextlib.suppress(FileNotFoundError):
                self.path(unit_id).unlink()
            return
        info = self.read(unit_id)
        if info is not None and info.holder == self.me:
            with contextlib.suppress(FileNotFoundError):
                self.path(unit_id).unlink()

    def release_all(self) -> None:
        with self._lock:
            held = list(self._held)
        for unit_id in held:
            self.release(unit_id)

    def live_workers(self) -> int:
        """Live workers of the run, this one included: their heartbeat records, from one
        listing of leases/ (no file read), at most every ``COUNT_S``."""
        at, count = self._counted
        if time.monotonic() >= at:
            try:
                names = os.listdir(self.dir)
            except OSError:
                names = []  # missing, or a bad moment of the filesystem: counted next time
            workers = {n[: -len(HEARTBEAT_SUFFIX)] for n in names if n.endswith(HEARTBEAT_SUFFIX)}
            count = len(workers | {self.me.worker})
            # Counted again in COUNT_S; the first time, soon: a fleet starts together, and
            # workers that were not yet there go unwatched until the next count.
            again = COUNT_S if at > -float("inf") else 2 * self.heartbeat_s
            self._counted = (time.monotonic() + again, count)
            self.ring = sorted(workers | {self.me.worker})
        return count

    @property
    def held(self) -> set[str]:
        with self._lock:
            return set(self._held)

    def beat(self) -> dict | None:
        """Rewrite our record (every lease's heartbeat at once, and our progress); returns
        what it wrote, None once stopped or when the filesystem refused (``Heartbeat``)."""
        with self._writing:
            if self.heart.stopped.is_set():
                return None  # stopped (or, in the fleet simulator, killed): no more beats
            return self._written if self.heart.beat_now() else None

    def _write(self) -> None:
        """One beat. After a gap of half the timeout or more (a stall, a suspended process,
        failed beats), others may have watched us silent: a lease taken over is forgotten."""
        if time.monotonic() - self.heart.last_ok >= self.timeout_s / 2:
            for unit_id in self.held:
                info = self.read(unit_id)
                if info is None or info.holder != self.me:
                    with self._lock:
                        self._held.discard(unit_id)
        data = self.record() if self.record is not None else {}
        # Every lease we hold, claimed ahead or not yet handed to the engine included: a
        # watcher takes over what the record lists, nothing more.
        units = dict.fromkeys(self.held, 0) | (self.progress() if self.progress else {})
        self._beats += 1
        data |= {"worker": self.me.worker, "time": time.time(), "beat": self._beats}
        data |= {"beat_s": self.heartbeat_s, "timeout_s": self.timeout_s, "units": units}
        tmp = self.progress_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self.progress_path)
        self._written = data

    def start(self) -> None:
        """Beat now, then every ``heartbeat_s`` after the last beat: a commit's write is a
        beat too, so with units longer than a heartbeat it replaces a periodic one."""
        self.beat()
        self.heart.start(self._tick)

    def _tick(self) -> bool:
        """The heartbeat thread's beat, then its watch over others (a failed look is looked
        at again next time: it is only work saved)."""
        if self.beat() is None:
            return False
        if self.after_beat is not None:
            try:
                self.after_beat()
            except OSError as exc:
                print(f"batchspec: the watch over other workers failed ({exc})", file=sys.stderr)
        return True

    def stop(self) -> None:
        """No more beats; our record leaves leases/ (we no longer count as live): to
        ``progress/``, kept, while it carries our progress (``ProgressLog.end`` writes the
        final one there), else removed."""
        self.heart.stop()
        with self._writing:  # a commit's beat under way ends first; none starts after
            if self.record is not None and move_file(
                self.progress_path, self.out.progress_record(self.me.worker)
            ):
                return
            with contextlib.suppress(FileNotFoundError):
                self.progress_path.unlink()
