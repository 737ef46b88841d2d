"""The vLLM adapter: one engine per (method, K), fed continuously across unit boundaries.

``LLM.generate`` on one unit at a time would drain the running batch at every unit's tail (the
batch shrinks to the last slow rows). Instead the adapter keeps the engine's queue topped up
through ``LLMEngine.add_request``/``step`` and hands a unit back as soon as its last row
finishes, while the next units' rows are already running.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import psutil

from batchspec.inputs import RowRequest, UnitRequests
from batchspec.models import resolve_model
from batchspec.spec import JobSpec

# The CPU build takes gpu_memory_utilization as a fraction of host memory; vLLM's 0.92 default
# does not fit next to the rest of the process there.
CPU_MEMORY_FRACTION = 0.3


def on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def speculative_config(spec: JobSpec, k: int) -> dict[str, Any] | None:
    """vLLM's ``speculative_config`` for K drafts, or None for plain decoding."""
    s = spec.speculative
    if s.method == "none" or k == 0:
        return None
    cfg: dict[str, Any] = {"method": s.method, "num_speculative_tokens": k}
    if s.model:
        cfg["model"] = str(
            resolve_model(s.model, "speculative.model", spec.resolve("."), auto_prepare=True)
        )
    if s.prompt_lookup_min is not None:
        cfg["prompt_lookup_min"] = s.prompt_lookup_min
    if s.prompt_lookup_max is not None:
        cfg["prompt_lookup_max"] = s.prompt_lookup_max
    if s.draft_tensor_parallel_size is not None:
        cfg["draft_tensor_parallel_size"] = s.draft_tensor_parallel_size
    cfg.update(s.extra)
    return cfg


def engine_kwargs(spec: JobSpec, k: int) -> dict[str, Any]:
    """Every ``vllm.LLM`` keyword for this job at K; the benchmark builds bare vLLM from it too."""
    m = spec.model
    kwargs: dict[str, Any] = {
        "model": str(resolve_model(m.model, "model.model", spec.resolve("."), auto_prepare=True)),
        "dtype": m.dtype,
        "tensor_parallel_size": m.tensor_parallel_size,
        "max_num_seqs": m.max_num_seqs,
        "enforce_eager": m.enforce_eager,
        "seed": m.seed,
        # Per-request timestamps (RequestOutput.metrics) are only kept with stats on.
        "disable_log_stats": False,
    }
    if m.tokenizer:
        kwargs["tokenizer"] = str(resolve_model(m.tokenizer, "model.tokenizer", spec.resolve(".")))
    if m.max_model_len is not None:
        kwargs["max_model_len"] = m.max_model_len
    if m.gpu_memory_utilization is not None:
        kwargs["gpu_memory_utilization"] = m.gpu_memory_utilization
    elif on_cpu():
        kwargs["gpu_memory_utilization"] = CPU_MEMORY_FRACTION
    cfg = speculative_config(spec, k)
    if cfg is not None:
        kwargs["speculative_config"] = cfg
        kwargs["per_request_spec_decode_metrics"] = "summary"
    kwargs.update(m.engine_kwargs)
    return kwargs


def sampling_params(spec: JobSpec, seed: int | None = None) -> Any:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    s = spec.sampling
    return SamplingParams(
        temperature=s.temperature,
        top_p=s.top_p,
        top_k=s.top_k if s.top_k > 0 else 0,
        max_tokens=s.max_tokens,
        stop=list(s.stop) or None,
        seed=seed,
        output_kind=RequestOutputKind.FINAL_ONLY,
    )


@dataclass
class RowResult:
    """What the engine produced for one row; ``error`` set means nothing was generated."""

    request: RowRequest
    text: str | None = None
    num_prompt_tokens: int | None = None
    num_output_tokens: int | None = None
    finish_reason: str | None = None
    spec: dict[str, Any] | None = None
    """vLLM's per-request speculative metrics (``RequestSpecDecodeMetrics.to_dict``)."""
    timing: dict[str, float] | None = None
    """Engine-core timestamps: queued, scheduled, first_token, last_token (monotonic s)."""
    error: str | None = None


@dataclass
class UnitResult:
    unit_requests: UnitRequests
    results: list[RowResult]
    k: int
    method: str


@dataclass
class _Pending:
    unit: UnitRequests
    results: list[RowResult | None]
    left: int = 0


class UnitSource(Protocol):
    """Where the engine loop gets work: the runner's claim logic behind three calls."""

    def next_unit(self) -> UnitRequests | None:
        """A claimed unit ready to submit, or None when none can be had right now."""

    def exhausted(self) -> bool:
        """True when no unit will come any more (all done, or stopping)."""

    def wait(self) -> None:
        """Block briefly while units held by other workers may come free."""


class EngineFailure(RuntimeError):
    """The engine died or failed a step; the units in flight must be retried elsewhere."""


# Fault injection for tests, off unless set: BATCHSPEC_INJECT_ENGINE_CRASH=STEP[:COUNT] kills
# the engine's processes (SIGKILL) at its STEP-th step, for the first COUNT engines this
# process builds (default 1), exactly as an out-of-memory kill or a driver fault would.
INJECT_ENV = "BATCHSPEC_INJECT_ENGINE_CRASH"
_injected = 0


def _maybe_inject_crash(step: int) -> None:
    global _injected
    raw = os.environ.get(INJECT_ENV)
    if not raw:
        return
    at, _, count = raw.partition(":")
    if step != int(at) or _injected >= int(count or 1):
        return
    _injected += 1
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            child.send_signal(signal.SIGKILL)


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
        spec=sdm.to_dict() if sdm is not None else None,
        timing=timing,
    )


class Engine:
    """A ``vllm.LLM`` for one (method, K), with a continuous feeding loop.

    vLLM fixes K when the engine is built, so a different K means another Engine; the runner
    groups units by K to build as few as possible.
    """

    def __init__(self, spec: JobSpec, k: int):
        from vllm import LLM

        self.spec = spec
        self.k = k
        self.method = "none" if speculative_config(spec, k) is None else spec.speculative.method
        started = time.perf_counter()
        before = {p.pid for p in psutil.Process().children()}
        self.llm = LLM(**engine_kwargs(spec, k))
        self.build_s = time.perf_counter() - started
        self.engine = self.llm.llm_engine
        self._procs = [p for p in psutil.Process().children() if p.pid not in before]
        self._watchdog_stop = threading.Event()
        threading.Thread(target=self._watchdog, name="engine-watchdog", daemon=True).start()
        self.max_model_len: int = self.engine.model_config.max_model_len
        # Feed the next unit as soon as a slot of the batch frees up: the batch stays full
        # (the new rows are scheduled at the very next step) while as few units as possible
        # are open at once, which is what a crash loses.
        self.low_water = spec.model.max_num_seqs
        self._next_id = 0
        self._steps = 0
        self._params = sampling_params(spec)

    def run(self, source: UnitSource, should_abort: Callable[[], bool]) -> Iterator[UnitResult]:
        """Yield each unit's results as soon as its last row finishes.

        Pulls units from ``source`` whenever fewer than ``low_water`` requests are unfinished;
        ends when the source is exhausted and nothing is in flight, or, aborting what is in
        flight, as soon as ``should_abort()`` turns true. An engine failure propagates as
        ``EngineFailure``; the caller owns the units that were in flight.
        """
        inflight: dict[str, tuple[_Pending, int]] = {}
        open_units: list[_Pending] = []

        def submit(pending: _Pending, index: int, req: RowRequest) -> None:
            request_id = str(self._next_id)
            self._next_id += 1
            try:
                self.engine.add_request(
                    request_id,
                    {"prompt_token_ids": req.prompt_token_ids},
                    self._params if req.seed is None else sampling_params(self.spec, req.seed),
                )
            except Exception as exc:  # the engine's own validation rejected this row
                if not self._alive():
                    raise EngineFailure(f"engine died: {exc}") from exc
                pending.results[index] = RowResult(req, error=f"rejected by engine: {exc}")
                return
            inflight[request_id] = (pending, index)
            pending.left += 1

        def feed() -> None:
            while self.engine.get_num_unfinished_requests() < self.low_water:
                unit = source.next_unit()
                if unit is None:
                    return
                pending = _Pending(unit, [None] * len(unit.rows))
                open_units.append(pending)
                for i, req in enumerate(unit.rows):
                    if req.error is not None:
                        pending.results[i] = RowResult(req, error=req.error)
                    else:
                        submit(pending, i, req)

        def finished() -> Iterator[UnitResult]:
            # Any unit whose rows are all back, in whatever order they finish: committing
            # early is what bounds the work lost to a crash.
            done = [p for p in open_units if p.left == 0]
            for p in done:
                open_units.remove(p)
                yield UnitResult(p.unit, list(p.results), self.k, self.method)

        try:
            while not should_abort():
                feed()
                yield from finished()
                if not inflight:
                    if source.exhausted():
                        return
                    source.wait()
                    continue
                self._steps += 1
                _maybe_inject_crash(self._steps)
                try:
                    outputs = self.engine.step()
                except Exception as exc:
                    raise EngineFailure(f"engine step failed: {exc!r}") from exc
                for out in outputs:
                    if not out.finished:
                        continue
                    pending, index = inflight.pop(out.request_id)
                    pending.results[index] = _row_result(pending.unit.rows[index], out)
                    pending.left -= 1
                    pending.unit.finished += 1
        finally:
            # Stopped early (abort, failure, consumer gone): drop what is still running.
            if inflight and self._alive():
                with contextlib.suppress(Exception):
                    self.engine.abort_request(list(inflight))

    def _alive(self) -> bool:
        resources = getattr(getattr(self.engine, "engine_core", None), "resources", None)
        if getattr(resources, "engine_dead", False):
            return False
        for proc in self._procs:
            try:
                if proc.status() == psutil.STATUS_ZOMBIE:
                    return False
            except psutil.NoSuchProcess:
                return False
        return True

    def _watchdog(self) -> None:
        """Wake a ``step()`` blocked on a dead engine.

        vLLM 0.32's client notices a dead engine-core process but leaves a caller blocked in
        ``get_output`` waiting forever; putting the error into the output queue is how vLLM
        itself forwards errors to that caller.
        """
        from vllm.v1.engine.exceptions import EngineDeadError

        while not self._watchdog_stop.wait(0.5):
            if not self._alive():
                queue = getattr(self.engine.engine_core, "outputs_queue", None)
                if queue is not None:
                    queue.put_nowait(EngineDeadError())
                return

    def close(self) -> None:
        """Stop the engine's processes and free its memory before another engine starts."""
        self._watchdog_stop.set()
        engine_core = getattr(self.engine, "engine_core", None)
        if engine_core is not None and hasattr(engine_core, "shutdown"):
            with contextlib.suppress(Exception):  # a dead engine may fail its shutdown
                engine_core.shutdown()
        del self.llm, self.engine
        gc.collect()
