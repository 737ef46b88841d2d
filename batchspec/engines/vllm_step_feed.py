"""Where vLLM's step costs come from: every step of a job's engines, fed to one fit per
machine, model and engine settings (``vllm_steps.StepCosts``), kept under the user's cache."""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from batchspec.engines.vllm_steps import StepCosts
from batchspec.spec import JobSpec


def job_step_costs(spec: JobSpec) -> StepCosts:
    """The step costs of this job's vLLM engines on this machine: one per target model,
    dtype, method, draft, tensor parallelism, compilation (eager or not), thread count and
    whether the engine runs in its own process."""
    import torch

    from batchspec.engines.tree.profile import cache_root, machine
    from batchspec.engines.vllm_args import engine_kwargs, live_top_k

    kwargs = engine_kwargs(spec, 1)
    draft = (kwargs.get("speculative_config") or {}).get("model", "")
    parts = [
        machine(),
        str(kwargs["model"]),
        str(kwargs["dtype"]),
        spec.speculative.method,
        str(draft),
        f"tp={kwargs['tensor_parallel_size']}",
        f"eager={kwargs['enforce_eager']}",
        # An engine in the worker's process has the worker's own work in each period.
        f"mp={os.environ.get('VLLM_ENABLE_V1_MULTIPROCESSING', '1')}",
        # Built at the top K, run at any (vllm_live_k): K=0 still runs the proposer.
        f"live={live_top_k(spec)}",
        f"threads={torch.get_num_threads()}",
    ]
    return step_costs_for(parts, cache_root())


def watch_steps(
    core: Any,
    costs: StepCosts,
    k: Callable[[], int],
    mean_k: Callable[[], float | None] = lambda: None,
) -> None:
    """Feed every step an engine core reports to ``costs``: its period on the core's clock
    (``EngineCoreOutputs.timestamp``), what it scheduled (``iteration_details``), the K it ran
    at (``k()``) and, where rows ask for different K, the mean K they asked for (``mean_k()``:
    the drafts a full draft of each row would fill). Wraps the client's ``get_output``,
    through which every step's outputs pass, in either process."""
    inner = core.get_output
    last: list[float] = []

    def get_output() -> Any:
        outputs = inner()
        stats = getattr(outputs, "scheduler_stats", None)
        d = getattr(stats, "iteration_details", None)
        if d is None or d.is_dummy:
            return outputs
        try:
            if last:
                period = outputs.timestamp - last[0]
                rows, tokens = d.num_generation_requests, d.num_generation_tokens
                mean = mean_k()
                slots = None if mean is None else rows * mean
                costs.record(period, k(), rows, tokens, d.num_ctx_tokens, slots)
            last[:] = [outputs.timestamp]
        except Exception as exc:  # a measurement never fails a step: no more of them
            core.get_output = inner
            logging.getLogger(__name__).warning("step costs off: %r", exc)
        return outputs

    core.get_output = get_output


_shared: dict[str, StepCosts] = {}
_shared_lock = threading.Lock()


def step_costs_for(parts: list[str], root: Path | None) -> StepCosts:
    """The process's one ``StepCosts`` for this machine, model, dtype and method (every
    engine of a worker feeds and reads the same fit), its prior loaded from ``root``."""
    key = hashlib.sha1("\n".join(parts).encode()).hexdigest()[:16]
    with _shared_lock:
        if key not in _shared:
            path = None if root is None else root / f"vllm-steps-{key}.json"
            costs = _shared[key] = StepCosts(key, path)
            costs.load_prior()
        return _shared[key]
