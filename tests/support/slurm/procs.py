"""The process table, read from /proc: waiting for processes, signalling them, and finding what
the daemons left running (slurmstepd and job tasks detach from slurmd: their parent is init,
so only the marker variable in their environment and their parentage lead to them)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable, Sequence

from .base import ClusterError


def proc_state(pid: int) -> str | None:
    """The kernel's one-letter state of ``pid``, or None when it no longer exists."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # "pid (comm) S ppid ..." — comm may contain spaces and parentheses.
    return stat.rsplit(")", 1)[1].split()[0]


def alive(pid: int) -> bool:
    state = proc_state(pid)
    return state is not None and state not in ("Z", "X")


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def parents() -> dict[int, int]:
    """pid -> ppid for every process visible in /proc."""
    out: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            out[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return out


def has_marker(pid: int, marker: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return marker in f.read().split(b"\0")
    except OSError:
        return False


def descendants(roots: Iterable[int], parent_of: dict[int, int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, ppid in parent_of.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    stack = list(roots)
    while stack:
        pid = stack.pop()
        for child in children.get(pid, ()):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def send(pid: int, sig: int) -> None:
    """Signal ``pid``; one that is gone (or not ours) is left alone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _reap(pid: int) -> None:
    """Collect ``pid`` if it is a finished child of this process (no zombie left behind)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def wait_gone(pids: Iterable[int], timeout: float) -> set[int]:
    """Wait until none of ``pids`` is alive; return those still alive at the timeout."""
    pending = set(pids)
    deadline = time.monotonic() + timeout
    while True:
        for pid in list(pending):
            _reap(pid)
            if not alive(pid):
                pending.discard(pid)
        if not pending or time.monotonic() >= deadline:
            return pending
        time.sleep(0.05)


def terminate(pids: Sequence[int], timeout: float) -> None:
    """SIGTERM, wait up to ``timeout``, then SIGKILL whatever is left, and wait for it."""
    for pid in pids:
        send(pid, signal.SIGTERM)
    left = wait_gone(pids, timeout)
    for pid in left:
        send(pid, signal.SIGKILL)
    left = wait_gone(left, 5.0)
    if left:
        raise ClusterError(f"processes survived SIGKILL: {sorted(left)}")


def kill_strays(marker: bytes, exclude: set[int] | None = None) -> None:
    """SIGKILL what the daemons spawned, sweeping again in case something forked meanwhile."""
    for _ in range(5):
        found = strays(marker, exclude)
        if not found:
            return
        for pid in found:
            send(pid, signal.SIGKILL)
        wait_gone(found, 5.0)


def strays(marker: bytes, exclude: set[int] | None = None) -> set[int]:
    """Live processes the daemons spawned (slurmstepd, job tasks) and their descendants; never
    this process or its ancestors (one started from a job of the cluster inherits the marker)."""
    parent_of = parents()
    ancestors = set()
    pid = os.getpid()
    while pid > 1 and pid not in ancestors:
        ancestors.add(pid)
        pid = parent_of.get(pid, 1)
    marked = {p for p in parent_of if p not in ancestors and alive(p) and has_marker(p, marker)}
    found = (marked | descendants(marked, parent_of)) - ancestors - (exclude or set())
    # munged carries the marker too, but is stopped last, on its own.
    return {p for p in found if alive(p) and "munged" not in cmdline(p)}
