"""An engine's processes: shielded from the job's stop signals, killed as one tree.

vLLM runs its engine core (and tensor-parallel workers) in child processes of the worker, in
the worker's process group, and they shut down on SIGINT/SIGTERM. A Ctrl-C, ``kill -TERM
-PGID`` or a plain ``scancel`` reaches the whole group: the engine would die under the units
the worker was told to finish. So the engine's processes start with SIGINT and SIGTERM blocked
(a blocked signal stays pending; the mask survives fork and exec, and vLLM only installs
handlers): the worker alone decides when its engine stops, and still kills it outright
(SIGKILL, which cannot be blocked) when it must.

Two ends of an engine's life follow from that. Closing: the worker sends ``CLOSE_SIGNAL``,
on which the engine core runs vLLM's own shutdown (the handler vLLM installed for SIGTERM: the
busy loop ends, the executor's workers and shared memory are released) instead of being killed
after its grace period; SIGINT and SIGTERM stay blocked to the end. Dying: an engine process
dies with the process that started it (``PR_SET_PDEATHSIG``), since a worker killed outright
(the OOM killer, ``kill -9``) can stop nothing, and its engine would poll on, holding the GPU's
memory, with SIGTERM blocked. ``vllm_fixes.register`` arms both in every engine process of a
worker's engine. And a start: a stop signal while an engine starts ends the start at once
(``abortable_start``): nothing is in flight in an engine that is not up yet.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import gc
import importlib.util
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from types import FrameType

import psutil

STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}
CLOSE_SIGNAL = signal.SIGUSR2
"""Sent by the worker to its engine's processes when it closes the engine (neither vLLM nor
torch uses it)."""
ENGINE_ENV = "BATCHSPEC_ENGINE"
"""Set by a worker to its pid before it starts an engine: the processes vLLM starts then are
a batchspec engine's (vLLM run by anything else, e.g. a benchmark against bare vLLM, is left
alone), and the one the worker started itself is the engine core."""
PR_SET_PDEATHSIG = 1
SPAWN_PARENT_ENV = "BATCHSPEC_SPAWN_PARENT"
"""The pid of the process spawning an engine's processes, recorded for them to check at their
first instruction (``arm_spawned_child``)."""


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


def die_with_parent(parent: int) -> None:
    """SIGKILL this process when its parent ``parent`` dies, or now if it already has.

    The kernel sends the signal when the thread that started this process exits: a worker
    starts its engine (and the launcher its workers) from its main thread, which lives as
    long as the process. A parent that died before the call has already handed this process
    to another (``getppid`` changed), and no signal would ever come. Linux only.
    """
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)


@contextlib.contextmanager
def spawned_children_bound() -> Iterator[None]:
    """While an engine starts: every process ``multiprocessing`` spawns meanwhile (vLLM's
    engine core, and through it the model's workers) dies with its parent from its first
    moment.

    vLLM's plugin hook arms an engine process (``arm_engine_process``) only after vLLM has
    imported itself there, seconds in: an engine core caught in that window by its worker's
    ``kill -9`` outlived it (still there 25 s later, with the resource tracker it held). A
    spawned child runs its parent's main module before anything else, by the name recorded
    in ``__main__.__spec__``; for these children that name is ``batchspec.engines.spawned``,
    which binds the child to its parent as it is imported.
    """
    main = sys.modules["__main__"]
    saved = getattr(main, "__spec__", None)
    main.__spec__ = importlib.util.find_spec("batchspec.engines.spawned")
    parent = os.environ.get(SPAWN_PARENT_ENV)
    os.environ[SPAWN_PARENT_ENV] = str(os.getpid())
    try:
        yield
    finally:
        main.__spec__ = saved
        if parent is None:
            os.environ.pop(SPAWN_PARENT_ENV, None)
        else:
            os.environ[SPAWN_PARENT_ENV] = parent


def arm_spawned_child() -> None:
    """``spawned_children_bound``'s first step in a child, when ``ENGINE_ENV`` names another
    process (a worker, above this one). The parent is the pid the spawning process recorded
    (``SPAWN_PARENT_ENV``), not ``getppid()``: a parent killed before this child's Python
    started has already handed it to another, and the child must die now, not with that one
    (seen in CI: an engine core still alive after its worker's kill -9 at start-up). The
    child then records itself for the processes it spawns (vLLM's engine core starts the
    model's workers)."""
    worker = os.environ.get(ENGINE_ENV)
    if worker and worker != str(os.getpid()):
        parent = os.environ.get(SPAWN_PARENT_ENV)
        die_with_parent(int(parent) if parent else os.getppid())
        os.environ[SPAWN_PARENT_ENV] = str(os.getpid())


def arm_engine_process() -> None:
    """In a process that vLLM started for a worker's engine: die with the process that
    started it, and let ``CLOSE_SIGNAL`` open the way for vLLM's own shutdown.

    vLLM starts its engine core and its model's workers with ``multiprocessing`` (spawn), so
    the process that started this one is ``multiprocessing.parent_process()``, known from the
    start (the other processes vLLM runs, e.g. to inspect a model class, are waited for).
    """
    global _engine_core
    parent = multiprocessing.parent_process()
    worker = os.environ.get(ENGINE_ENV)
    if not worker or parent is None or parent.pid is None:
        return
    die_with_parent(parent.pid)
    _engine_core = str(parent.pid) == worker
    if threading.current_thread() is threading.main_thread():
        signal.signal(CLOSE_SIGNAL, _on_close_signal)
    atexit.register(_leave_to_exit)


_engine_core = False
"""Whether this engine process is the one the worker started (vLLM's engine core)."""
_closing = False
"""Whether this engine process was asked to close (``CLOSE_SIGNAL``)."""


def _on_close_signal(_signum: int, frame: FrameType | None) -> None:
    """``CLOSE_SIGNAL``'s handler. In the engine core: run vLLM's SIGTERM handler, once (it
    records the request and wakes the busy loop, which then shuts the engine down), and pass
    the request on to its own processes, the model's workers. Those only take note: the engine
    core's shutdown stops them through their pipes, and a SIGTERM let through there would end
    one in the middle of that, leaking its shared memory (seen here once).

    SIGINT and SIGTERM stay blocked: what is pending (a stop signal to the whole group) and
    what follows (the SIGTERM of vLLM's shutdown, which the worker sends right after this
    request) is never delivered. vLLM 0.32's handler is not reentrant: it sets a
    ``threading.Event``, and a second SIGTERM handled while the first was inside ``set``
    deadlocked the engine core on the event's lock (its stacks, taken under load: the
    handler inside ``Event.set`` inside the handler). Letting the stop signals through here,
    as this did before, delivered the pending one and then vLLM's own, often back to back:
    the engine never exited, and its worker waited ``CLOSE_S`` (60 s) to kill it (a group
    SIGTERM that took 67 s to stop a run in CI; leaked shared memory after such kills)."""
    global _closing
    if _closing:  # asked again: the shutdown is under way
        return
    _closing = True
    if not _engine_core:
        return
    handler = signal.getsignal(signal.SIGTERM)
    if callable(handler):
        handler(signal.SIGTERM, frame)
    else:  # vLLM's handler not installed (cannot happen once it is up): the default kill
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    ask_to_close(psutil.Process().children())


def _leave_to_exit() -> None:
    """At the exit of an engine process that was asked to close, after vLLM's shutdown: what
    is left is reclaimed by the exit, so the interpreter's final garbage collection is spared
    the scan of it (vLLM does the same on ROCm). It scanned the ~600k objects vLLM imports for
    1.5-2.4 s per process here, and closing an engine waits for two exits in a row (the
    engine core waits for its model's workers). Not on other exits (a failed start): what
    the process prints there is what its log is read for."""
    if not _closing:
        return
    gc.freeze()
    print(
        "batchspec: engine process closing; its objects are left to the exit (gc.freeze), "
        "which bindings that count objects at exit (nanobind) may report as leaked",
        file=sys.stderr,
        flush=True,
    )


def ask_to_close(procs: list[psutil.Process]) -> bool:
    """Send ``CLOSE_SIGNAL`` to those of ``procs`` that handle it (an engine process that
    has not armed it would die of it: its default action); whether any did."""
    asked = False
    for proc in procs:
        with contextlib.suppress(psutil.Error, OSError):
            if _signal_set(proc, "SigCgt") >> (CLOSE_SIGNAL - 1) & 1:
                proc.send_signal(CLOSE_SIGNAL)
                asked = True
    return asked


def _signal_set(proc: psutil.Process, field: str) -> int:
    """A signal set of ``proc`` from Linux's /proc (``SigBlk``, ``SigCgt``...), as a bit mask."""
    with open(f"/proc/{proc.pid}/status") as fh:
        return next(int(line.split()[1], 16) for line in fh if line.startswith(f"{field}:"))


def blocks_stop_signals(proc: psutil.Process) -> bool:
    """Whether SIGINT and SIGTERM are blocked in ``proc`` (Linux /proc; for tests and checks)."""
    mask = _signal_set(proc, "SigBlk")
    return all(mask >> (s - 1) & 1 for s in STOP_SIGNALS)
