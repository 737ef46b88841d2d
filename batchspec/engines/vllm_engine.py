"""The vLLM adapter: one engine per (method, K), fed continuously across unit boundaries.

``LLM.generate`` on one unit at a time would drain the running batch at every unit's tail (the
batch shrinks to the last slow rows). Instead the adapter keeps the engine's queue topped up
through ``LLMEngine.add_request``/``step`` and hands a unit back as soon as its last row
finishes, while the next units' rows are already running.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psutil

from batchspec.engines import faults
from batchspec.engines.base import EngineFailure, UnitSource
from batchspec.engines.planted import maybe_plant_bias
from batchspec.engines.procs import (
    ENGINE_ENV,
    ask_to_close,
    kill_tree,
    new_children,
    spawned_children_bound,
    stop_signals_blocked,
)
from batchspec.engines.vllm_args import engine_kwargs, sampling_params, speculative_config
from batchspec.engines.vllm_step_feed import job_step_costs, watch_steps
from batchspec.spec import JobSpec
from batchspec.spec_tree import VLLM, EngineName
from batchspec.units import RowRequest, RowResult, SpecStats, UnitRequests, UnitResult

CLOSE_S = 60.0
"""Seconds vLLM waits for the engine's processes to exit before it kills them: a clean exit
took 0.4-2.1 s on a quiet 2-core machine, 1.5-4.5 s under heavy load beside it; the wait
ends as soon as they are gone, and a kill is for an engine that hangs. (Closes of more than
15 s under load, killed with a semaphore and shared memory left behind, then this whole minute
in CI, were an engine core deadlocked in vLLM's SIGTERM handler run twice, reproduced here;
``procs._on_close_signal`` runs it once.)"""
KILL_S = 0.5
"""The same for processes that cannot exit cleanly (batchspec's plugin not loaded in them:
``VLLM_PLUGINS`` without it), which SIGTERM does not reach."""
STARTUP_POLL_MS = 500
"""How often vLLM's start wakes while it waits for its engine core's handshake (its own
period: 10 s). The worker's stop handler runs only when its main thread wakes, and a stop
during a start ends the start (``procs.abort_start``): with vLLM's period, 12.5 s to stop a
start under load, most of it asleep in that wait."""


def _row_result(req: RowRequest, out: Any) -> RowResult:
    comp = out.outputs[0]
    sdm = getattr(comp, "spec_decode_metrics", None)
    m = out.metrics
    timing = None
    if m is not None and getattr(m, "queued_ts", 0):
        timing = {
            "queued": m.queued_ts,
            "scheduled": m.scheduled_ts,
            "first_token": m.first_token_ts,
            "last_token": m.last_token_ts,
        }
    return RowResult(
        request=req,
        text=comp.text,
        num_prompt_tokens=len(out.prompt_token_ids or req.prompt_token_ids or []),
        num_output_tokens=len(comp.token_ids),
        finish_reason=str(comp.finish_reason) if comp.finish_reason is not None else None,
        spec=SpecStats.from_vllm(sdm.to_dict()) if sdm is not None else None,
        timing=timing,
        token_ids=list(comp.token_ids),
        top_logprobs=_top_logprobs(comp.logprobs),
        prompt_logprobs=_top_logprobs(out.prompt_logprobs),
    )


def _top_logprobs(logprobs: Any) -> list[dict[int, float]] | None:
    """vLLM's per-position ``{token: Logprob}`` as plain ``{token: logprob}`` (None unasked;
    a prompt's first position, which has none, as an empty mapping)."""
    if logprobs is None:
        return None
    return [{t: lp.logprob for t, lp in (pos or {}).items()} for pos in logprobs]


@dataclass
class _Pending:
    unit: UnitRequests
    results: list[RowResult | None]
    left: int = 0


class _Batch:
    """The requests one ``run`` has in flight: which unit and row each one belongs to."""

    def __init__(self, engine: VllmEngine):
        self.engine = engine
        self.inflight: dict[str, tuple[_Pending, int]] = {}
        self.open: list[_Pending] = []

    def add(self, unit: UnitRequests) -> None:
        """Submit a unit's rows; rows that failed before (or at) submission are done at once."""
        pending = _Pending(unit, [None] * len(unit.rows))
        self.open.append(pending)
        for i, req in enumerate(unit.rows):
            if req.error is not None:
                pending.results[i] = RowResult(req, error=req.error)
                continue
            request_id = str(self.engine.next_request_id())
            try:
                self.engine.submit(request_id, req)
            except Exception as exc:  # the engine's own validation rejected this row
                if not self.engine.alive():
                    raise EngineFailure(f"engine died: {exc}") from exc
                pending.results[i] = RowResult(req, error=f"rejected by engine: {exc}")
                continue
            self.inflight[request_id] = (pending, i)
            pending.left += 1

    def collect(self, outputs: list[Any]) -> None:
        for out in outputs:
            if not out.finished:
                continue
            pending, index = self.inflight.pop(out.request_id)
            row = pending.results[index] = _row_result(pending.unit.rows[index], out)
            pending.left -= 1
            pending.unit.finished += 1
            pending.unit.finished_tokens += row.num_output_tokens or 0

    def finished(self) -> Iterator[UnitResult]:
        """Any unit whose rows are all back, in whatever order they finish: committing early
        is what bounds the work lost to a crash."""
        done = [p for p in self.open if p.left == 0]
        for p in done:
            self.open.remove(p)
            e = self.engine
            yield UnitResult(p.unit, list(p.results), e.k, e.method, e.name)


class VllmEngine:
    """A ``vllm.LLM`` for one (method, K), with a continuous feeding loop (``base.Engine``).

    vLLM fixes K when the engine is built, so a different K means another engine; the
    scheduler keeps an engine while the plan gives it units, to build as few as possible.
    """

    name: EngineName = VLLM
    k_per_unit = False
    step_profile = None

    def __init__(self, spec: JobSpec, k: int, logprobs: int | None = None):
        from vllm import LLM
        from vllm.v1.engine import utils as engine_utils

        engine_utils.STARTUP_POLL_PERIOD_MS = STARTUP_POLL_MS  # read at each wait

        self.spec = spec
        self.k = k
        self.method = "none" if speculative_config(spec, k) is None else spec.speculative.method
        maybe_plant_bias()
        started = time.perf_counter()
        os.environ[ENGINE_ENV] = str(os.getpid())  # its processes die with this one (procs)
        with stop_signals_blocked(), spawned_children_bound():
            before = {p.pid for p in psutil.Process().children()}
            self.llm = LLM(**engine_kwargs(spec, k))
        self.build_s = time.perf_counter() - started
        self.engine = self.llm.llm_engine
        # Its details of every step would be a log line each (vLLM's default logger).
        logging.getLogger("vllm.v1.metrics.loggers").setLevel(logging.WARNING)
        self.step_profile = job_step_costs(spec)
        """Step costs fitted from this engine's steps (and the process's earlier engines')."""
        watch_steps(self.engine.engine_core, self.step_profile, k)
        self.procs = new_children(before)
        """The engine's processes (none when vLLM runs in this process)."""
        self.stall_s = spec.execution.engine_stall_s
        self._step_since: float | None = None
        self._stalled = False
        self._poisoned = False
        self._watchdog_stop = threading.Event()
        threading.Thread(target=self._watchdog, name="engine-watchdog", daemon=True).start()
        self.max_model_len: int = self.engine.model_config.max_model_len
        # Feed the next unit as soon as a slot of the batch frees up: the batch stays full
        # (the new rows are scheduled at the very next step) while as few units as possible
        # are open at once, which is what a crash loses.
        self.low_water = spec.model.max_num_seqs
        self._next_id = 0
        self._steps = 0
        self.logprobs = logprobs
        self._params = sampling_params(spec, logprobs=logprobs)

    def run(self, source: UnitSource, should_abort: Callable[[], bool]) -> Iterator[UnitResult]:
        """``base.Engine.run``: units are pulled whenever fewer than ``low_water`` requests
        are unfinished."""
        batch = _Batch(self)
        try:
            while not should_abort():
                while self.engine.get_num_unfinished_requests() < self.low_water:
                    unit = source.next_unit()
                    if unit is None:
                        break
                    batch.add(unit)
                yield from batch.finished()
                if not batch.inflight:
                    if source.exhausted():
                        return
                    source.wait()
                    continue
                batch.collect(self._step())
        finally:
            # Stopped early (abort, failure, consumer gone): drop what is still running.
            if batch.inflight and self.alive():
                with contextlib.suppress(Exception):
                    self.engine.abort_request(list(batch.inflight))

    def _step(self) -> list[Any]:
        """One engine step, timed for the stall watchdog."""
        self._steps += 1
        faults.maybe_inject(self._steps, self.procs, self._poisoned)
        self._step_since = time.monotonic()
        try:
            return self.engine.step()
        except Exception as exc:
            if self._stalled:
                raise EngineFailure(
                    f"engine stalled: no output for {self.stall_s:g} s "
                    "(execution.engine_stall_s); killed"
                ) from exc
            raise EngineFailure(f"engine step failed: {exc!r}") from exc
        finally:
            self._step_since = None

    def submit(self, request_id: str, req: RowRequest) -> None:
        """Hand one row to vLLM; raises what vLLM raises when it rejects the row."""
        self._poisoned = self._poisoned or faults.is_poison(req.row_id)
        params = self._params
        if req.seed is not None or req.sampling is not None:
            params = sampling_params(self.spec, req.seed, self.logprobs, req.sampling)
        self.engine.add_request(request_id, {"prompt_token_ids": req.prompt_token_ids}, params)

    def next_request_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    def alive(self) -> bool:
        resources = getattr(getattr(self.engine, "engine_core", None), "resources", None)
        if getattr(resources, "engine_dead", False):
            return False
        for proc in self.procs:
            try:
                if proc.status() == psutil.STATUS_ZOMBIE:
                    return False
            except psutil.NoSuchProcess:
                return False
        return True

    def _watchdog(self) -> None:
        """Kill an engine that stalls, and wake a ``step()`` blocked on a dead engine.

        A step that gives no output for ``engine_stall_s`` (a wedged driver or collective
        call) kills the engine's processes: the worker then retries its units as after a
        crash. vLLM 0.32's client notices a dead engine-core process but leaves a caller
        blocked in ``get_output`` waiting forever; putting the error into the output queue
        is how vLLM itself forwards errors to that caller. An engine running inside this
        process (no child processes) cannot be killed: its stalls go unnoticed.
        """
        from vllm.v1.engine.exceptions import EngineDeadError

        while not self._watchdog_stop.wait(0.5):
            since = self._step_since
            if self.procs and since is not None and time.monotonic() - since > self.stall_s:
                self._stalled = True
                kill_tree(self.procs)
            if not self.alive():
                queue = getattr(self.engine.engine_core, "outputs_queue", None)
                if queue is not None:
                    queue.put_nowait(EngineDeadError())
                return

    def close(self) -> None:
        """Stop the engine's processes and free its memory before another engine starts.

        Its processes block SIGTERM (``engines.procs``): asked to close first, the engine core
        runs vLLM's shutdown, and they exit cleanly (the executor's workers, shared memory and
        semaphores released) instead of being killed after the grace period. A dead engine's
        processes are gone already. Closed already: nothing to do.
        """
        if not hasattr(self, "llm"):
            return
        self.step_profile.save()
        self._watchdog_stop.set()
        engine_core = getattr(self.engine, "engine_core", None)
        if engine_core is not None and hasattr(engine_core, "shutdown"):
            timeout = CLOSE_S if ask_to_close(self.procs) else KILL_S
            with contextlib.suppress(Exception):  # a dead engine may fail its shutdown
                engine_core.shutdown(timeout=timeout)
        del self.llm, self.engine
        gc.collect()
