"""The requests a vLLM engine has in flight, by unit, and how a finished request becomes a row.

Kept apart from the engine (``vllm_engine``) that feeds and steps vLLM: this is the bookkeeping
between vLLM's request ids and batchspec's units, and the one place vLLM's request outputs are
read.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from batchspec.engines.base import EngineFailure
from batchspec.units import RowRequest, RowResult, SpecStats, UnitRequests, UnitResult


def row_result(req: RowRequest, out: Any, k: int) -> RowResult:
    """A finished request as a row; ``k``: the K it ran at (0: no speculative counts, as on an
    engine built without speculation)."""
    comp = out.outputs[0]
    sdm = getattr(comp, "spec_decode_metrics", None) if k > 0 else None
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
        spec=SpecStats.from_vllm(_at_k(sdm.to_dict(), k)) if sdm is not None else None,
        timing=timing,
        token_ids=list(comp.token_ids),
        top_logprobs=_top_logprobs(comp.logprobs),
        prompt_logprobs=_top_logprobs(out.prompt_logprobs),
    )


def _at_k(metrics: dict[str, Any], k: int) -> dict[str, Any]:
    """vLLM's per-request metrics with the acceptance histogram cut to K + 1 entries: an
    engine built at a larger K than it ran (``vllm_live_k``) sizes it by the larger one, and
    no step drafted more than K."""
    hist = metrics.get("acceptance_histogram")
    if isinstance(hist, list) and len(hist) > k + 1 and not any(hist[k + 1 :]):
        metrics = {**metrics, "acceptance_histogram": hist[: k + 1]}
    return metrics


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
    k: int
    """The K its rows decode at."""
    left: int = 0


class Batch:
    """The requests one ``run`` has in flight: which unit and row each one belongs to, and
    the K each asked for."""

    def __init__(self, engine: Any):
        self.engine = engine
        self.inflight: dict[str, tuple[_Pending, int]] = {}
        self.open: list[_Pending] = []
        self.by_k: dict[int, int] = {}
        """Requests in flight per K."""

    def step_k(self) -> int:
        """The K of the engine's next step (``vllm_live_k``): the largest any request in
        flight asked for, else the engine's."""
        ks = [k for k, n in self.by_k.items() if n > 0]
        return max(ks) if ks else self.engine.k

    def mean_k(self) -> float | None:
        """The mean K the requests in flight asked for (None: none in flight)."""
        n = sum(self.by_k.values())
        return sum(k * c for k, c in self.by_k.items()) / n if n else None

    def add(self, unit: UnitRequests) -> None:
        """Submit a unit's rows; rows that failed before (or at) submission are done at once."""
        pending = _Pending(unit, [None] * len(unit.rows), self.engine.unit_k(unit))
        self.open.append(pending)
        for i, req in enumerate(unit.rows):
            if req.error is not None:
                pending.results[i] = RowResult(req, error=req.error)
                continue
            request_id = str(self.engine.next_request_id())
            try:
                self.engine.submit(request_id, req, pending.k)
            except Exception as exc:  # the engine's own validation rejected this row
                if not self.engine.alive():
                    raise EngineFailure(f"engine died: {exc}") from exc
                pending.results[i] = RowResult(req, error=f"rejected by engine: {exc}")
                continue
            self.inflight[request_id] = (pending, i)
            self.by_k[pending.k] = self.by_k.get(pending.k, 0) + 1
            pending.left += 1

    def collect(self, outputs: list[Any]) -> None:
        for out in outputs:
            if not out.finished:
                continue
            pending, index = self.inflight.pop(out.request_id)
            self.by_k[pending.k] -= 1
            row = pending.results[index] = row_result(pending.unit.rows[index], out, pending.k)
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
            yield UnitResult(p.unit, list(p.results), p.k, e.method_at(p.k), e.name)
