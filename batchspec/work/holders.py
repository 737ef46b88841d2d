"""Who holds a lease, and whether that process still lives: the one question about another
worker that a look at this host can answer at once, with no clock (``work.leases``)."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import psutil


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
    timeout_s: float = 0.0
    """The holder's own lease timeout: a claimant waits the longer of its own and this (runs
    of one directory may set ``lease_timeout_s`` apart); 0 in leases of older versions."""

    @classmethod
    def me(cls, worker: str, timeout_s: float = 0.0) -> Holder:
        pid = os.getpid()
        return cls(worker, socket.gethostname(), pid, _process_start(pid), timeout_s)

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
