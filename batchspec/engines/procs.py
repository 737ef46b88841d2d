"""An engine's processes: shielded from the job's stop signals, killed as one tree.

vLLM runs its engine core (and tensor-parallel workers) in child processes of the worker, in
the worker's process group, and they shut down on SIGINT/SIGTERM. A Ctrl-C, ``kill -TERM
-PGID`` or a plain ``scancel`` reaches the whole group: the engine would die under the units
the worker was told to finish. So the engine's processes start with SIGINT and SIGTERM blocked
(a blocked signal stays pending; the mask survives fork and exec, and vLLM only installs
handlers): the worker alone decides when its engine stops, and still kills it outright
(SIGKILL, which cannot be blocked) when it must.

How an engine's processes die with their worker and close when it asks is ``tether``'s.
And a start: a stop signal while an engine starts ends the start at once
(``abortable_start``): nothing is in flight in an engine that is not up yet.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator

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


class StartAborted(BaseException):
    """An engine's start ended by a stop signal (``abort_start``). A BaseException, as
    KeyboardInterrupt is: the start's own error handling (``except Exception``) lets it by."""


_starting: set[int] | None = None
"""While an engine starts (``abortable_start``): the pids of the children this process had
before; the others are the start's."""


@contextlib.contextmanager
def abortable_start(stopped: Callable[[], bool]) -> Iterator[None]:
    """Inside, an engine starts in the main thread. A stop signal meanwhile ends the start
    (``abort_start``), and so does ``stopped()`` true on entry (a stop just before).

    An engine that is starting has nothing in flight, so a stop has nothing to wait for; yet
    the start ran to its end (17 s here, over a minute under load, more for a large model)
    before the worker saw the stop and closed the engine unused. Only the main thread can be
    interrupted this way (it runs Python's signal handlers); elsewhere (tests, benchmarks)
    the start runs to its end.
    """
    global _starting
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _starting = {p.pid for p in psutil.Process().children()}
    try:
        if stopped():
            abort_start()
        yield
    finally:
        _starting = None


def abort_start() -> None:
    """From a stop signal's handler (so in the main thread): if an engine is starting, kill
    the processes it started and raise ``StartAborted`` wherever the start is.

    The handler runs when the main thread next runs Python code: at once in Python code,
    within a poll period while vLLM waits for its engine core's handshake (the stop signals
    are blocked in the main thread then, so nothing interrupts that wait: ``VllmEngine``
    shortens the period from 10 s to ``STARTUP_POLL_MS``). Killing first lets vLLM's clean-up
    on the way out find its processes gone instead of waiting for them. Killing alone (from
    another thread, say) would not do: vLLM's calls to its engine core after the handshake
    (``get_supported_tasks``) wait for the reply without a timeout."""
    global _starting
    before, _starting = _starting, None
    if before is None:
        return
    kill_children(spare=before)
    raise StartAborted


def kill_children(spare: set[int] | None = None) -> None:
    """SIGKILL this process's children and theirs, but those in ``spare`` and
    multiprocessing's resource tracker: the tracker is what removes the shared memory and
    semaphores the killed processes registered, once they are gone (killed with them, it
    left a semaphore and 420 MB in /dev/shm at each quit of the test job)."""
    from multiprocessing import resource_tracker

    tracker = getattr(resource_tracker._resource_tracker, "_pid", None)
    spare = (spare or set()) | {tracker}
    kill_tree([p for p in psutil.Process().children() if p.pid not in spare])
