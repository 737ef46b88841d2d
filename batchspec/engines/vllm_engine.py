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
from typing import Any

import psutil

from batchspec.engines import faults, vllm_sockets
from batchspec.engines.base import EngineFailure, UnitSource
from batchspec.engines.planted import maybe_plant_bias
from batchspec.engines.procs import kill_tree, new_children, stop_signals_blocked
from batchspec.engines.tether import ENGINE_ENV, ask_to_close, engine_children_tethered
from batchspec.engines.vllm_args import engine_kwargs, live_top_k, sampling_params
from batchspec.engines.vllm_batch import Batch
from batchspec.engines.vllm_fork import engine_core_forked
from batchspec.engines.vllm_live_k import KEY, set_k
from batchspec.engines.vllm_step_feed import job_step_costs, watch_steps
from batchspec.spec import JobSpec
from batchspec.spec.tree import VLLM, EngineName
from batchspec.units import RowRequest, UnitRequests, UnitResult

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


class VllmEngine:
    """A ``vllm.LLM`` for one method, with a continuous feeding loop (``base.Engine``).

    vLLM fixes K when the engine is built. An adaptive job's engine is built at the largest K
    the controller may choose and takes K per unit (``k_per_unit``, ``vllm_live_k``): each
    row asks for its unit's K, rows at different K share the batch, nothing is rebuilt.
    Elsewhere (a fixed K, vLLM's own schedule) a different K means another engine, and the
    scheduler keeps an engine while the plan gives it units, to build as few as possible.
    """

    name: EngineName = VLLM
    step_profile = None

    def __init__(self, spec: JobSpec, k: int, logprobs: int | None = None):
        from vllm import LLM
        from vllm.v1.engine import utils as engine_utils

        engine_utils.STARTUP_POLL_PERIOD_MS = STARTUP_POLL_MS  # read at each wait

        self.spec = spec
        self.k = k
        self.top_k = live_top_k(spec)
        """The largest K a unit may ask for; None: the engine's own K only."""
        self.k_per_unit = self.top_k is not None
        self.method = self.method_at(k)
        maybe_plant_bias()
        vllm_sockets.use()  # its IPC sockets go with this process, not into /tmp for good
        started = time.perf_counter()
        os.environ[ENGINE_ENV] = str(os.getpid())  # its processes die with this one (procs)
        with stop_signals_blocked(), engine_children_tethered(), engine_core_forked():
            before = {p.pid for p in psutil.Process().children()}
            self.llm = LLM(**engine_kwargs(spec, k))
        self.build_s = time.perf_counter() - started
        self.engine = self.llm.llm_engine
        # Its details of every step would be a log line each (vLLM's default logger).
        logging.getLogger("vllm.v1.metrics.loggers").setLevel(logging.WARNING)
        if self.top_k is not None and set_k(self.engine.engine_core, k) < 0:
            self.close()
            raise EngineFailure("vLLM ignored the K schedule (data parallelism disables it)")
        self.step_profile = job_step_costs(spec)
        """Step costs fitted from this engine's steps (and the process's earlier engines')."""
        watch_steps(self.engine.engine_core, self.step_profile, self._step_k, self._mean_k)
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
        self._params: dict[int, Any] = {}
        """The job's sampling parameters per K asked (``submit``)."""
        self._batch: Batch | None = None
        """What the current ``run`` has in flight."""

    def method_at(self, k: int) -> str:
        """The method recorded for rows decoded at K = ``k``."""
        return "none" if k == 0 else self.spec.speculative.method

    def unit_k(self, unit: UnitRequests) -> int:
        """The K ``unit``'s rows decode at: its own where the engine takes K per unit, else
        the engine's."""
        return unit.k if unit.k is not None and self.k_per_unit else self.k

    def _step_k(self) -> int:
        """The K of the step the engine core runs next (``vllm_live_k``)."""
        return self._batch.step_k() if self._batch is not None else self.k

    def _mean_k(self) -> float | None:
        """The mean K its rows asked for, where rows ask for their own."""
        return self._batch.mean_k() if self._batch is not None and self.k_per_unit else None

    def run(self, source: UnitSource, should_abort: Callable[[], bool]) -> Iterator[UnitResult]:
        """``base.Engine.run``: units are pulled whenever fewer than ``low_water`` requests
        are unfinished, after the units the last step finished are handed over: the next
        unit's K is then chosen knowing them (a domain's first unit tells every K by replay)."""
        batch = self._batch = Batch(self)
        try:
            while not should_abort():
                yield from batch.finished()
                while self.engine.get_num_unfinished_requests() < self.low_water:
                    unit = source.next_unit()
                    if unit is None:
                        break
                    batch.add(unit)
                yield from batch.finished()  # rows that failed at submission
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

    def submit(self, request_id: str, req: RowRequest, k: int) -> None:
        """Hand one row to vLLM, to decode at K = ``k``; raises what vLLM raises when it
        rejects the row."""
        self._poisoned = self._poisoned or faults.is_poison(req.row_id)
        extra = {KEY: k} if self.k_per_unit else None
        if req.seed is not None or req.sampling is not None:
            params = sampling_params(self.spec, req.seed, self.logprobs, req.sampling, extra)
        else:
            if k not in self._params:
                self._params[k] = sampling_params(self.spec, None, self.logprobs, None, extra)
            params = self._params[k]
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
