"""Engines: one interface (``base.Engine``), one function to get an engine for a job and K.

Engines import only what they run on (vLLM, or torch and transformers) and that lazily, so
pre-flight checks, status and reports never load an inference stack.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from batchspec.engines.base import Engine, EngineFailure, ListSource, UnitSource
from batchspec.engines.procs import StartAborted, abortable_start
from batchspec.spec import JobSpec
from batchspec.spec.tree import AUTO, TREE

__all__ = ["Engine", "EngineFailure", "ListSource", "StartAborted", "UnitSource", "open_engine"]


def open_engine(
    spec: JobSpec, k: int, logprobs: int | None = None, stopped: Callable[[], bool] | None = None
) -> Engine:
    """Start the engine that serves ``spec`` with K speculative tokens (0: none); with
    ``logprobs``, its results carry the target's top log-probabilities per position.
    ``speculative.engine`` says which: batchspec's tree engine or vLLM (``auto`` is routed
    to one of them first, ``speculation.route``). With ``stopped`` (a worker's), a stop signal
    during the start, or ``stopped()`` true as it begins, ends it: ``StartAborted``
    (``procs.abortable_start``)."""
    engine = spec.speculative.engine
    if engine == AUTO:
        raise ValueError("speculative.engine auto: route the job first (speculation.route)")
    with abortable_start(stopped) if stopped is not None else contextlib.nullcontext():
        if engine == TREE:
            from batchspec.engines.tree.engine import TreeEngine

            return TreeEngine(spec, k, logprobs)
        from batchspec.engines.vllm_engine import VllmEngine

        return VllmEngine(spec, k, logprobs)
