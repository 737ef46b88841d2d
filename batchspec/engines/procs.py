"""An engine's processes: shielded from the job's stop signals, killed as one tree.

vLLM runs its engine core (and tensor-parallel workers) in child processes of the worker, in
the worker's process group, and they shut down on SIGINT/SIGTERM. A Ctrl-C, ``kill -TERM
-PGID`` or a plain ``scancel`` reaches the whole group: the engine would die under the units
the worker was told to finish. So the engine's processes start with SIGINT and SIGTERM blocked
(a blocked signal stays pending; the mask survives fork and exec, and vLLM only installs
handlers): the worker alone decides when its engine stops, and still kills it outright
(SIGKILL, which cannot be blocked) when it must.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

import psutil

STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


@contextlib.contextmanager
def stop_signals_blocked() -> Iterator[None]:
    """Processes started inside inherit SIGINT and SIGTERM blocked.

    Blocks them in the calling thread only; the process's other threads still take them, and
    a signal that arrives while only this thread could take it is delivered when the block
    ends. multiprocessing's resource tracker unblocks both in its parent when it first starts,
    so it is started beforehand (also so that it is not taken for one of the engine's
    processes started inside).
    """
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    if threading.current_thread() is not threading.main_thread():
        yield  # a worker thread (tests, benchmarks) does not own the process's signals
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def new_children(before: set[int]) -> list[psutil.Process]:
    """This process's children that are not in ``before`` (pids)."""
    return [p for p in psutil.Process().children() if p.pid not in before]


def kill_tree(procs: list[psutil.Process]) -> None:
    """SIGKILL these processes and all their descendants (dead ones are skipped)."""
    victims: list[psutil.Process] = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            victims.extend(proc.children(recursive=True))
        victims.append(proc)
    for proc in victims:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGKILL)


def blocks_stop_signals(proc: psutil.Process) -> bool:
    """Whether SIGINT and SIGTERM are blocked in ``proc`` (Linux /proc; for tests and checks)."""
    with open(f"/proc/{proc.pid}/status") as fh:
        mask = next(int(line.split()[1], 16) for line in fh if line.startswith("SigBlk:"))
    return all(mask >> (s - 1) & 1 for s in STOP_SIGNALS)
