"""Leases: how workers that share only a filesystem agree on who generates which unit.

A worker claims a unit by creating ``leases/<unit_id>.lease`` with O_EXCL (atomic on local
filesystems and NFSv3+), and removes it once the unit's part is committed or given up. Its
heartbeat is one record per worker, ``leases/<worker>.progress.json``, rewritten every
``heartbeat_s`` (and at each commit, which counts as a beat): one write per beat however many
units it holds, not a touch of every lease. The same record is the worker's progress record
(``work.progress``): one periodic write per worker, not two (docs/fleet.md). A lease is
stale, and may be taken over, when neither it nor its holder's record changed for longer than
the timeout, or at once when its holder ran on this host and that process is gone (a local
rerun after kill -9 need not wait out the timeout). When a worker stops, or another takes a
dead holder's lease over, the record moves to ``progress/`` (kept: its counts stay in the
sums), so the records left in ``leases/`` count the live workers (one listing, no read).

Leases keep workers from doing the same work; they are not what makes output exactly-once.
That is the part commit (link to the final name, first wins), so the rare race in which two
workers both take over one stale lease costs duplicate work, never a duplicate row.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from batchspec.io.layout import HEARTBEAT_SUFFIX, LEASE_SUFFIX, OutDir
from batchspec.io.temps import create_exclusive, move_file

COUNT_S = 300.0
"""Live workers are counted (one listing of leases/) at most this often."""


def _process_start(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def _process_state(pid: int) -> tuple[bool, float | None]:
    """(alive, start time) of a process of this host; the start time is None where it
    cannot be read (another user's process, /proc mounted with hidepid)."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False, None
        return True, proc.create_time()
    except psutil.ZombieProcess:
        return False, None
    except psutil.AccessDenied:
        return True, None
    except psutil.NoSuchProcess:
        pass
    # /proc may hide processes of other users (hidepid): the kernel still tells.
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False, None
    except PermissionError:
        return True, None
    return True, None


@dataclass(frozen=True)
class Holder:
    """Who holds a lease: enough to tell a live holder from a dead one on the same host."""

    worker: str
    host: str
    pid: int
    pid_start: float | None

    @classmethod
    def me(cls, worker: str) -> Holder:
        pid = os.getpid()
        return cls(worker, socket.gethostname(), pid, _process_start(pid))

    def is_dead_here(self) -> bool:
        """True when this holder ran on this host and its process no longer exists (or its
        pid now belongs to a younger process). A process that cannot be inspected counts as
        alive: its lease then goes stale by the heartbeat timeout only."""
        if self.host != socket.gethostname():
            return False
        alive, start = _process_state(self.pid)
        if not alive:
            return True
        return start is not None and self.pid_start is not None and abs(start - self.pid_start) > 1


@dataclass(frozen=True)
class LeaseInfo:
    unit_id: str
    holder: Holder | None
    age_s: float


class LeaseDir:
    """The leases of one output directory, read-only: for status and for claimants."""

    def __init__(self, out: OutDir, timeout_s: float):
        self.out = out
        self.dir = out.leases
        self.timeout_s = timeout_s

    def path(self, unit_id: str) -> Path:
        return self.out.lease(unit_id)

    def read(self, unit_id: str) -> LeaseInfo | None:
        """The lease on a unit, or None if there is none."""
        path = self.path(unit_id)
        try:
            age = time.time() - path.stat().st_mtime
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            holder = Holder(**json.loads(raw))
        except (ValueError, TypeError):
            holder = None  # a lease being written right now, or torn by a crash
        return LeaseInfo(unit_id, holder, age)

    def heartbeat_age(self, worker: str) -> float | None:
        """Seconds since a worker's heartbeat record changed; None if it has none."""
        try:
            return time.time() - self.out.progress(worker).stat().st_mtime
        except FileNotFoundError:
            return None

    def age(self, info: LeaseInfo) -> float:
        """Seconds since the lease or its holder's heartbeat record last changed."""
        if info.holder is None or info.age_s <= self.timeout_s:
            return info.age_s
        beat = self.heartbeat_age(info.holder.worker)
        return info.age_s if beat is None else min(info.age_s, beat)

    def is_stale(self, info: LeaseInfo) -> bool:
        if info.holder is not None and info.holder.is_dead_here():
            return True
        return self.age(info) > self.timeout_s

    def all(self) -> list[LeaseInfo]:
        """Every lease in the directory (for status reports)."""
        infos = []
        for path in self.dir.glob(f"*{LEASE_SUFFIX}") if self.dir.is_dir() else []:
            info = self.read(path.name[: -len(LEASE_SUFFIX)])
            if info is not None:
                infos.append(LeaseInfo(info.unit_id, info.holder, self.age(info)))
        return infos

    def live_holders(self) -> set[str]:
        """Workers holding a lease that is not stale: the run's live workers, as far as the
        output directory shows (a worker between units may hold none for a moment)."""
        return {
            i.holder.worker for i in self.all() if i.holder is not None and not self.is_stale(i)
        }


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
        self.me = Holder.me(worker)
        self.heartbeat_s = heartbeat_s
        self._held: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._payload = json.dumps(self.me.__dict__).encode()
        self.progress = progress
        """Rows finished per held unit, written beside the leases at every heartbeat."""
        self.record: Callable[[], dict] | None = None
        """The rest of the heartbeat record: this worker's progress record
        (``ProgressLog.snapshot``, which sets it), so that one write is both."""
        self.progress_path = out.progress(worker)
        self._writing = threading.Lock()
        """Beats come from the heartbeat thread and from commits: one writes at a time."""
        self._beat_at = time.time()
        """When this worker last beat (or started): leases are checked again after a gap."""
        self._counted: tuple[float, int] = (-float("inf"), 1)
        self.orphans: list[str] = []
        """The other units of dead holders whose leases we took over: ours to take over
        too (``work.watch``)."""
        self.ring: list[str] = []
        """The workers with a record in leases/ at the last count (``work.watch`` orders it)."""
        self.held_age = 0.0
        """Heartbeat age of the live lease the last failed ``try_claim`` found: it cannot go
        stale for ``timeout_s`` minus that (when a claimant need not look again sooner)."""

    def _create(self, unit_id: str) -> bool:
        if not create_exclusive(self.path(unit_id), self._payload):
            return False
        with self._lock:
            self._held.add(unit_id)
        return True

    def try_claim(self, unit_id: str) -> bool:
        """Claim a unit that nobody holds, or whose holder is gone; False if it is held."""
        if self._create(unit_id):
            return True
        info = self.read(unit_id)
        if info is None:
            return self._create(unit_id)
        dead = info.holder is not None and info.holder.is_dead_here()
        if not dead:
            self.held_age = self.age(info)
            if self.held_age <= self.timeout_s:
                return False
        # Re-read just before removing, so that a lease renewed or retaken meanwhile survives.
        again = self.read(unit_id)
        if again is None or again.holder != info.holder or again.age_s < info.age_s - 1:
            return False
        with contextlib.suppress(FileNotFoundError):
            self.path(unit_id).unlink()
        if info.holder is not None and info.holder.worker != self.me.worker:
            # Its holder is gone: its record leaves leases/ (it counted a live worker), and
            # its other units are ours to take over too.
            self.orphans += [u for u in self.retire(info.holder.worker) if u != unit_id]
        return self._create(unit_id)

    def retire(self, worker: str) -> list[str]:
        """Move a dead worker's record to ``progress/``, where its counts stay in the sums (a
        bare heartbeat of an older batchspec is removed); returns the units it held."""
        path = self.out.progress(worker)
        try:
            record = json.loads(path.read_bytes())
            units, full = list(record.get("units", {})), "version" in record
        except FileNotFoundError:
            return []  # retired by another taker, who takes its units over
        except (ValueError, AttributeError):
            units, full = [], False
        if full and move_file(path, self.out.progress_record(worker)):
            return units
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return units

    def release(self, unit_id: str) -> None:
        """Drop our lease (after commit, or when giving the unit up). While our heartbeat is
        fresh nobody can have taken a lease we hold over: it goes without a read."""
        with self._lock:
            ours = unit_id in self._held
            self._held.discard(unit_id)
        if ours and time.time() - self._beat_at < self.timeout_s / 2:
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
        if time.monotonic() - at >= COUNT_S:
            try:
                names = os.listdir(self.dir)
            except FileNotFoundError:
                names = []
            workers = {n[: -len(HEARTBEAT_SUFFIX)] for n in names if n.endswith(HEARTBEAT_SUFFIX)}
            count = len(workers | {self.me.worker})
            self._counted = (time.monotonic(), count)
            self.ring = sorted(workers | {self.me.worker})
        return count

    @property
    def held(self) -> set[str]:
        with self._lock:
            return set(self._held)

    def beat(self) -> dict | None:
        """Rewrite our record (every lease's heartbeat at once, and our progress); returns
        what it wrote, None once stopped. After a gap of half the timeout or more (a stall, a
        suspended process), nobody counted on our record: a lease taken over meanwhile is
        forgotten."""
        with self._writing:
            if self._stop.is_set():
                return None  # stopped (or, in the fleet simulator, killed): no more beats
            now = time.time()
            if now - self._beat_at >= self.timeout_s / 2:
                for unit_id in self.held:
                    info = self.read(unit_id)
                    if info is None or info.holder != self.me:
                        with self._lock:
                            self._held.discard(unit_id)
            data = self.record() if self.record is not None else {}
            units = self.progress() if self.progress is not None else {}
            data |= {"worker": self.me.worker, "time": now, "beat_s": self.heartbeat_s}
            data["units"] = units
            tmp = self.progress_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(data))
            os.replace(tmp, self.progress_path)
            self._beat_at = now
            return data

    def start(self) -> None:
        """Beat now, then every ``heartbeat_s`` after the last beat: a commit's write is a
        beat too, so with units longer than a heartbeat it replaces a periodic one."""
        self.beat()

        def loop() -> None:
            while True:
                due = self._beat_at + self.heartbeat_s - time.time()
                if due > 0:
                    if self._stop.wait(due):
                        return
                    continue
                if self.beat() is None:
                    return

        self._thread = threading.Thread(target=loop, name="lease-heartbeat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """No more beats; our record leaves leases/ (we no longer count as live): to
        ``progress/``, kept, while it carries our progress (``ProgressLog.end`` writes the
        final one there), else removed."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.record is not None and move_file(
            self.progress_path, self.out.progress_record(self.me.worker)
        ):
            return
        with contextlib.suppress(FileNotFoundError):
            self.progress_path.unlink()
