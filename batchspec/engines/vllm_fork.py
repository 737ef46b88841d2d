"""A worker's vLLM engine on the CPU: its engine core forked, and the model computed in it.

vLLM's CPU platform spawns every process and runs the model in a worker process of its own
beside the engine core (its ``mp`` executor), for OpenMP's sake: libgomp reads its thread
count and binding (``OMP_NUM_THREADS``, ``OMP_PLACES``) once, when torch loads it, so vLLM
sets them for the model's worker before that worker imports torch, and reserves a core for
the engine core, whose loop busy-polls the worker's replies. That costs each engine start two
imports of vLLM and torch (~10 s each here, over 30 s under load), and on this 2-core machine
the model computed on one core while the other polled.

For the engine a worker starts (``engine_core_forked``), the engine core is forked from the
worker instead, as vLLM's is on GPUs (it inherits the worker's imports), and where the model
is one process (tensor, pipeline and data parallel sizes 1) it computes in the engine core
(vLLM's ``uni`` executor): no process polls another. The forked core takes its threads and
cores at the fork (``cpu_threads.bind_cpus``: the worker's slice of
``VLLM_CPU_OMP_THREADS_BIND``, else every core it may use, one thread each). Measured on the
default job (K=3, 48 rows, batch 16, 2 cores, the same tokens): a start of 7-9 s against
20-24 s, and 106-117 output tokens/s against 64-67 for the forked core with a spawned model
worker. A larger world keeps vLLM's layout: its ranks are spawned from the forked core. The
processes forked are tethered as spawned ones are (``tether``).

Not where this process has run torch's parallel regions (libgomp is not fork-safe: a child
of a process whose pool ran deadlocks in its first parallel region); batchspec runs torch
itself only in the tree engine, which marks that (``parallel_compute_ran``). A user's
``VLLM_WORKER_MULTIPROC_METHOD=spawn`` or ``distributed_executor_backend: mp`` stands.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

from batchspec.engines.cpu_threads import bind_cpus

METHOD_ENV = "VLLM_WORKER_MULTIPROC_METHOD"
FORK_CORE_ENV = "BATCHSPEC_FORK_ENGINE_CORE"
"""Set while a worker starts its engine: the engine core forks, and spawns what it starts."""

_parallel_ran = False
_model_in_core = False
"""Whether the engine being started computes its model in its (forked) engine core: set by
the config check in the worker, read at the fork in the core."""


def parallel_compute_ran() -> None:
    """Note that this process has run (or is about to run) torch's parallel regions: its
    engines' processes spawn from now on."""
    global _parallel_ran
    _parallel_ran = True


@contextlib.contextmanager
def engine_core_forked() -> Iterator[None]:
    """Inside, a vLLM engine started by this process forks its engine core on the CPU (GPU
    platforms decide for themselves), unless torch's parallel regions ran here or spawn was
    asked for. The environment is restored afterwards."""
    saved = {key: os.environ.get(key) for key in (METHOD_ENV, FORK_CORE_ENV)}
    if not _parallel_ran and saved[METHOD_ENV] != "spawn":
        os.environ[FORK_CORE_ENV] = "1"
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def install() -> None:
    """The CPU platform's config check wrapped (while ``FORK_CORE_ENV`` is set, what it forces
    back to spawn becomes fork, and a one-process model runs in the engine core), and the
    at-fork hook that sets up a forked engine core. Once per process."""
    from vllm.platforms.cpu import CpuPlatform

    check = CpuPlatform.check_and_update_config
    if getattr(check, "__wrapped__", None):
        return

    def check_and_update_config(cls: type, vllm_config: Any) -> None:
        global _model_in_core
        parallel = vllm_config.parallel_config
        asked = parallel.distributed_executor_backend  # before vLLM's check forces "mp"
        check(vllm_config)
        _model_in_core = False
        if not os.environ.get(FORK_CORE_ENV):
            return
        os.environ[METHOD_ENV] = "fork"
        if asked in (None, "uni") and parallel.world_size * parallel.data_parallel_size == 1:
            parallel.distributed_executor_backend = "uni"
            _model_in_core = True

    check_and_update_config.__wrapped__ = check  # type: ignore[attr-defined]
    CpuPlatform.check_and_update_config = classmethod(check_and_update_config)  # type: ignore[method-assign,assignment]
    os.register_at_fork(after_in_child=_in_forked_engine_core)


def _in_forked_engine_core() -> None:
    """In a forked engine core: the model's threads on the worker's cores, or what it starts
    (the model's ranks) spawned."""
    if os.environ.pop(FORK_CORE_ENV, None):
        os.environ[METHOD_ENV] = "spawn"
        if _model_in_core:
            _numba_threads(bind_cpus())


def _numba_threads(count: int) -> None:
    """numba's OpenMP layer (vLLM's n-gram proposer) sets libgomp's thread count to its own,
    ``NUMBA_NUM_THREADS``, when it starts and after each proposal: by default the cores the
    process could use when numba was imported, here the worker's (two threads on one bound
    core ran 9 output tokens/s against 48). So it is told the core's count: in the
    environment (it reads it again at each compilation) and, where the worker imported it
    already, in its settings. Not where its threads run already (not in a worker)."""
    os.environ["NUMBA_NUM_THREADS"] = str(count)
    parallel = sys.modules.get("numba.np.ufunc.parallel")
    if parallel is not None and getattr(parallel, "_is_initialized", True):
        return  # started, or a numba whose settings this does not know
    if (config := sys.modules.get("numba.core.config")) is not None:
        config.reload_config()
    if parallel is not None:
        parallel.NUM_THREADS = count  # what its threads start with, read at its import
