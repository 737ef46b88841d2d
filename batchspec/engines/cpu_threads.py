"""The CPU threads a worker's model computes with: its own cores, one thread each.

Both engines compute in a process that inherits the worker's libgomp (the tree engine in the
worker itself, vLLM in an engine core forked from it: ``vllm_fork``), and libgomp reads
``OMP_NUM_THREADS`` and ``OMP_PLACES`` once, when torch loads it. So the thread count and the
cores are set at run time, from the slice ``batchspec run --workers N`` hands each worker.
"""

from __future__ import annotations

import contextlib
import os

CPU_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
"""The core slice ``batchspec run --workers N`` gives each worker on CPU (vLLM's variable:
``0,1`` or ``0-3``; ``|`` separates tensor-parallel ranks, a one-process model takes the
first)."""


def bound_cpus() -> set[int] | None:
    """The cores of this worker's slice; None where it has none (``auto``, ``nobind``)."""
    bind = os.environ.get(CPU_BIND_ENV, "auto")
    if bind in ("auto", "nobind", ""):
        return None
    cpus: set[int] = set()
    for part in bind.split("|")[0].split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def thread_count() -> int:
    """One thread per core of the slice, else per core this process may use: more threads
    than cores (torch's default counts the machine's) made steps ~10x slower on a shared
    machine. Fewer where OMP_NUM_THREADS says so (as vLLM's in-process engine takes it)."""
    cpus = bound_cpus()
    if cpus is not None:
        return len(cpus)
    threads = len(os.sched_getaffinity(0))
    with contextlib.suppress(ValueError):
        threads = max(1, min(threads, int(os.environ.get("OMP_NUM_THREADS", threads))))
    return threads


def bind_cpus() -> int:
    """Run on this worker's cores only, so that workers sharing a machine do not contend,
    with a thread each (``thread_count``); returns that count."""
    import torch

    cpus = bound_cpus()
    if cpus is not None:
        os.sched_setaffinity(0, cpus)
    threads = thread_count()
    torch.set_num_threads(threads)
    return threads
