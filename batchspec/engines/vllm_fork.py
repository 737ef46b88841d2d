"""A worker's vLLM engine core forked on the CPU, where vLLM's platform forces spawn.

A spawned process imports vLLM and torch again before it does anything: ~10 s here, over
30 s under load, and vLLM's CPU build starts two per engine (the engine core, then the
model's worker). On GPUs vLLM forks its engine core (while CUDA is not initialised in the
worker); on the CPU its platform forces spawn for every process, for OpenMP's sake: libgomp
reads its thread count and binding (``OMP_NUM_THREADS``, ``OMP_PLACES``, which vLLM sets
for the model's worker as it starts it) once, when torch loads it, so a forked model worker
keeps its parent's threads, unbound (measured: 9 output tokens/s forked against 62 spawned,
the worker's threads on both cores beside the busy engine core). The engine core computes
nothing with OpenMP: forked, it inherits the worker's imports, and it still spawns the
model's worker. ``engine_core_forked`` arranges that for the engine a worker starts; the
processes forked are tethered as spawned ones are (``tether``).

Not where this process has run torch's parallel regions (libgomp is not fork-safe: a child
of a process whose pool ran deadlocks in its first parallel region); batchspec runs torch
itself only in the tree engine, which marks that (``parallel_compute_ran``). A user's
``VLLM_WORKER_MULTIPROC_METHOD=spawn`` stands.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

METHOD_ENV = "VLLM_WORKER_MULTIPROC_METHOD"
FORK_CORE_ENV = "BATCHSPEC_FORK_ENGINE_CORE"
"""Set while a worker starts its engine: the engine core forks, and spawns what it starts."""

_parallel_ran = False


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
    """The CPU platform's config check wrapped (what it forces back to spawn becomes fork while
    ``FORK_CORE_ENV`` is set), and the at-fork hook that makes a forked engine core spawn the
    model's worker again. Once per process."""
    from vllm.platforms.cpu import CpuPlatform

    check = CpuPlatform.check_and_update_config
    if getattr(check, "__wrapped__", None):
        return

    def check_and_update_config(cls: type, vllm_config: Any) -> None:
        check(vllm_config)
        if os.environ.get(FORK_CORE_ENV):
            os.environ[METHOD_ENV] = "fork"

    check_and_update_config.__wrapped__ = check  # type: ignore[attr-defined]
    CpuPlatform.check_and_update_config = classmethod(check_and_update_config)  # type: ignore[method-assign,assignment]
    os.register_at_fork(after_in_child=_spawn_from_engine_core)


def _spawn_from_engine_core() -> None:
    """In a forked engine core: what it starts (the model's worker) spawns."""
    if os.environ.pop(FORK_CORE_ENV, None):
        os.environ[METHOD_ENV] = "spawn"
