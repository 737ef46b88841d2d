"""An engine's processes tethered to the worker that started them: they die with it, and
close when it asks.

Dying: an engine process dies with the process that started it (``PR_SET_PDEATHSIG``), since
a worker killed outright (the OOM killer, ``kill -9``) can stop nothing, and its engine would
poll on, holding the GPU's memory, with SIGTERM blocked (``procs``). Closing: the worker sends
``CLOSE_SIGNAL``, on which the engine core runs vLLM's own shutdown (the handler vLLM
installed for SIGTERM) instead of being killed after its grace period.

vLLM starts its engine core and the model's workers with ``multiprocessing``, by fork or by
spawn, and both are tethered from their first moment, while the engine starts
(``engine_children_tethered``):
- a forked child is armed by an at-fork hook, before any of vLLM's code runs in it. Forking
  is what vLLM does on GPUs (where CUDA is not yet initialised in the worker) and what
  batchspec asks for on the CPU (``vllm_fixes``): the child inherits the worker's imports,
  where a spawned one spends ~10 s importing vLLM and torch again (twice per engine on the
  CPU: the engine core, then its model's worker). The at-fork hook is also the only place
  a forked child can be armed: vLLM's plugins, loaded in the worker already, do not run
  again there.
- a spawned child runs its parent's main module first, by the name recorded in
  ``__main__.__spec__``; for these children that name is ``batchspec.engines.spawned``,
  which binds the child to its parent as it is imported, and vLLM's plugin hook arms it
  (``arm_engine_process``) once vLLM has imported itself there.
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
from collections.abc import Iterator
from types import FrameType

import psutil

from batchspec.engines.procs import STOP_SIGNALS

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


_tethering = False
"""Whether processes forked now are an engine's: true in a worker while its engine starts,
and in the engine's processes for good (inherited), for the processes they fork in turn."""
_forking_pid: int | None = None
"""The pid of the process that forked last, noted before the fork (``_before_fork``): a
forked child's parent, even if that parent is gone by the time the child looks."""
_hooks_registered = False


def _before_fork() -> None:
    global _forking_pid
    _forking_pid = os.getpid()


def _register_hooks() -> None:
    """The at-fork hooks, once per process (a forked child inherits its parent's)."""
    global _hooks_registered
    if not _hooks_registered:
        os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
        _hooks_registered = True


def _after_fork_in_child() -> None:
    """A forked child's first step: an engine's process is armed at once."""
    if _tethering and _forking_pid is not None and os.environ.get(ENGINE_ENV):
        _arm(_forking_pid)


@contextlib.contextmanager
def engine_children_tethered() -> Iterator[None]:
    """While an engine starts: every process started meanwhile, forked or spawned (vLLM's
    engine core, and through it the model's workers), dies with its parent from its first
    moment and closes on request.

    An engine core caught by its worker's ``kill -9`` before it was armed outlived it (seen
    when spawned processes were armed only by vLLM's plugin hook, seconds in: still there 25 s
    later, with the resource tracker it held)."""
    global _tethering
    _register_hooks()
    main = sys.modules["__main__"]
    saved = getattr(main, "__spec__", None)
    main.__spec__ = importlib.util.find_spec("batchspec.engines.spawned")
    parent = os.environ.get(SPAWN_PARENT_ENV)
    os.environ[SPAWN_PARENT_ENV] = str(os.getpid())
    _tethering = True
    try:
        yield
    finally:
        _tethering = False
        main.__spec__ = saved
        if parent is None:
            os.environ.pop(SPAWN_PARENT_ENV, None)
        else:
            os.environ[SPAWN_PARENT_ENV] = parent


def arm_spawned_child() -> None:
    """``engine_children_tethered``'s first step in a spawned child, when ``ENGINE_ENV``
    names another process (a worker, above this one). The parent is the pid the spawning
    process recorded (``SPAWN_PARENT_ENV``), not ``getppid()``: a parent killed before this
    child's Python started has already handed it to another, and the child must die now, not
    with that one (seen in CI: an engine core still alive after its worker's kill -9 at
    start-up). The child then records itself for the processes it spawns (vLLM's engine core
    starts the model's workers)."""
    worker = os.environ.get(ENGINE_ENV)
    if worker and worker != str(os.getpid()):
        parent = os.environ.get(SPAWN_PARENT_ENV)
        die_with_parent(int(parent) if parent else os.getppid())
        os.environ[SPAWN_PARENT_ENV] = str(os.getpid())


def arm_engine_process() -> None:
    """In a process that vLLM spawned for a worker's engine (vLLM's plugin hook): die with the
    process that started it, and let ``CLOSE_SIGNAL`` open the way for vLLM's own shutdown.
    The process that started this one is ``multiprocessing.parent_process()``, known from the
    start (the other processes vLLM runs, e.g. to inspect a model class, are waited for)."""
    parent = multiprocessing.parent_process()
    if os.environ.get(ENGINE_ENV) and parent is not None and parent.pid is not None:
        _arm(parent.pid)


_engine_core = False
"""Whether this engine process is the one the worker started (vLLM's engine core)."""
_armed_pid: int | None = None
"""The process armed (a forked child inherits its parent's globals, this one included)."""
_closing = False
"""Whether this engine process was asked to close (``CLOSE_SIGNAL``)."""


def _arm(parent: int) -> None:
    """Tether this engine process to ``parent``: die with it, close on request. Once: a
    forked process whose worker had not loaded vLLM's plugins would be armed again by them."""
    global _engine_core, _armed_pid, _tethering
    if _armed_pid == os.getpid():
        return
    _armed_pid = os.getpid()
    die_with_parent(parent)
    _engine_core = str(parent) == os.environ.get(ENGINE_ENV)
    _tethering = True  # what it forks is the engine's too (the engine core's model workers)
    os.environ[SPAWN_PARENT_ENV] = str(os.getpid())  # and what it spawns (``spawned``)
    _register_hooks()
    if threading.current_thread() is threading.main_thread():
        signal.signal(CLOSE_SIGNAL, _on_close_signal)
    atexit.register(_leave_to_exit)


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
    the process prints there is what its log is read for. (A forked process leaves by
    ``os._exit``, without this or the final collection.)"""
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
