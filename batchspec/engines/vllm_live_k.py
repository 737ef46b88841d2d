"""K per request inside one vLLM engine: no rebuild to run a unit at another K, and rows of
units at different K in one batch, as on the tree engine.

vLLM fixes ``num_speculative_tokens`` when an engine is built, and a new engine costs a start
(20-130 s here, minutes for a large model on a GPU). But its scheduler already runs K per step:
with ``num_speculative_tokens_per_batch_size`` set it looks each step's K up in a table
(``Scheduler.dynamic_sd_lookup``), the proposer drafts that many tokens for every running
request, and each request verifies the drafts on its ``spec_token_ids``. Two small changes to
the engine core make K a property of the request (``SamplingParams.extra_args[KEY]``):

- before each step is scheduled, the table is set to the largest K among the requests in the
  engine (the proposer drafts no more than some request will verify; K=0 when none asks);
- when a step's drafts come back, each request keeps the first K of them (with asynchronous
  scheduling: its placeholders for them), so it verifies exactly K drafts whatever the others
  ask. A chain's first K drafts are what a K-draft proposer would have drafted (n-gram: the
  continuation after the same match; a draft model or EAGLE: the same autoregressive chain),
  and rejection sampling is exact at every K, so each row is what an engine built at its K
  makes, token for token and in its counts.

A request without a K of its own runs at the engine's (``set_k``, the K it was built to start
at). A step at K=0 drafts nothing: vLLM's n-gram proposer is not even called then. These
changes are installed by :func:`install`, which batchspec's vLLM plugin runs in every engine
process; the engine is built at the largest K the job may choose (``vllm_args.live_top_k``).
"""

from __future__ import annotations

import functools
from typing import Any

KEY = "batchspec_k"
"""A request's K, in its ``SamplingParams.extra_args``."""
METHOD = "batchspec_set_k"
"""The utility on vLLM's ``EngineCore`` that sets the engine's K (``set_k``)."""


def install() -> None:
    """Patch vLLM's engine core and schedulers in this process (idempotent)."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.spec_decode.ngram_proposer import NgramProposer

    if hasattr(EngineCore, METHOD):
        return
    setattr(EngineCore, METHOD, _set_k)
    NgramProposer.propose = _nothing_at_k0(NgramProposer.propose)
    Scheduler.schedule = _per_request_k(Scheduler.schedule)
    Scheduler.update_draft_token_ids = _trimmed(Scheduler.update_draft_token_ids)
    AsyncScheduler._update_after_schedule = _trimmed_placeholders(
        AsyncScheduler._update_after_schedule
    )


def request_k(request: Any, default: int) -> int:
    """The K a request of vLLM's scheduler asked for, else ``default``."""
    extra = getattr(request.sampling_params, "extra_args", None)
    k = extra.get(KEY) if extra else None
    return default if k is None else int(k)


def _set_k(self: Any, k: int) -> int:
    """On the engine core: the K of requests without one (capped at the engine's K); the K
    set, or -1 where the engine cannot run K per step (built without a schedule, or with data
    parallelism, which disables it)."""
    scheduler = self.scheduler
    if getattr(scheduler, "dynamic_sd_lookup", None) is None:
        return -1
    scheduler.batchspec_k = max(0, min(int(k), scheduler.num_spec_tokens))
    return scheduler.batchspec_k


def _nothing_at_k0(propose: Any) -> Any:
    """vLLM's n-gram proposer asked for no drafts returns none without searching: it would
    still run its numba kernel (threads of its own beside the model's) for every request."""

    @functools.wraps(propose)
    def wrapped(
        self: Any, num_speculative_tokens: int, sampled_token_ids: Any, *args: Any, **kw: Any
    ) -> Any:
        if num_speculative_tokens == 0:
            return [[] for _ in sampled_token_ids]
        return propose(self, num_speculative_tokens, sampled_token_ids, *args, **kw)

    return wrapped


def _per_request_k(schedule: Any) -> Any:
    @functools.wraps(schedule)
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        lookup = getattr(self, "dynamic_sd_lookup", None)
        default = getattr(self, "batchspec_k", None)
        if lookup is not None and default is not None:
            k = max((request_k(r, default) for r in self.requests.values()), default=default)
            k = min(k, self.num_spec_tokens)
            if lookup[-1] != k or lookup[1] != k:
                self.dynamic_sd_lookup = [k] * len(lookup)
        return schedule(self, *args, **kwargs)

    return wrapped


def _keep_own_k(scheduler: Any, req_ids: Any) -> None:
    """Each of these requests' drafts (or placeholders for them) cut to its own K, on an
    engine whose K batchspec set (``batchspec_k``; any other engine is left alone)."""
    default = getattr(scheduler, "batchspec_k", None)
    if default is None:
        return
    for req_id in req_ids:
        request = scheduler.requests.get(req_id)
        if request is not None and request.spec_token_ids:
            k = request_k(request, default)
            if len(request.spec_token_ids) > k:
                request.spec_token_ids = request.spec_token_ids[:k]


def _trimmed(update: Any) -> Any:
    """After the step's drafts reach their requests (synchronous scheduling)."""

    @functools.wraps(update)
    def wrapped(self: Any, draft_token_ids: Any) -> None:
        update(self, draft_token_ids)
        _keep_own_k(self, draft_token_ids.req_ids)

    return wrapped


def _trimmed_placeholders(update: Any) -> Any:
    """After the asynchronous scheduler gives each scheduled request placeholders for the
    next step's drafts (the drafts are then cut to the placeholders' length by vLLM)."""

    @functools.wraps(update)
    def wrapped(self: Any, scheduler_output: Any) -> None:
        update(self, scheduler_output)
        _keep_own_k(self, scheduler_output.num_scheduled_tokens)

    return wrapped


def set_k(client: Any, k: int) -> int:
    """Set the K of requests without one in the engine behind ``client`` (vLLM's engine-core
    client, in this process or another); returns the K set, -1 if the engine cannot."""
    core = getattr(client, "engine_core", None)
    if core is not None and hasattr(core, "scheduler"):  # in this process (InprocClient)
        return _set_k(core, k)
    return int(client.call_utility(METHOD, k))
