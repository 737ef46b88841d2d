"""K changed inside a running vLLM engine: no rebuild to switch speculation up, down or off.

vLLM fixes ``num_speculative_tokens`` when an engine is built, and a new engine costs a start
(20-130 s here, minutes for a large model on a GPU). But its scheduler already runs K per step:
with ``num_speculative_tokens_per_batch_size`` set it looks each step's K up in a table by batch
size (``Scheduler.dynamic_sd_lookup``; the proposer drafts that many tokens for the next step,
the rejection sampler verifies what was drafted), and nothing else about the engine depends on
which K in ``0..num_speculative_tokens`` a step runs at. So an engine built at the grid's top K,
with a schedule, can be told another K at any time by replacing that table: the next step's
drafts are proposed at the new K, the step after verifies them. Output is unchanged by K
(rejection sampling is exact at every K; greedy rows are token-identical), so a switch costs one
utility call between two steps.

The call reaches the engine core through vLLM's own utility channel (``call_utility``, run by
the core between steps, so the table is never replaced mid-step); the method it calls is added
to ``EngineCore`` by :func:`install`, which batchspec's vLLM plugin runs in every engine process.
"""

from __future__ import annotations

from typing import Any

METHOD = "batchspec_set_k"
"""The utility's name on vLLM's ``EngineCore``."""


def install() -> None:
    """Give vLLM's ``EngineCore`` the utility :func:`set_k` calls (idempotent)."""
    from vllm.v1.engine.core import EngineCore

    if not hasattr(EngineCore, METHOD):
        setattr(EngineCore, METHOD, _set_k)


def _set_k(self: Any, k: int) -> int:
    """On the engine core: every batch size at ``k`` (capped at the engine's K); the K set, or
    -1 where the engine has no per-step K (built without a schedule or without speculation)."""
    scheduler = self.scheduler
    lookup = getattr(scheduler, "dynamic_sd_lookup", None)
    if lookup is None:
        return -1
    k = max(0, min(int(k), scheduler.num_spec_tokens))
    scheduler.dynamic_sd_lookup = [k] * len(lookup)
    return k


def set_k(client: Any, k: int) -> int:
    """Set the K of the engine behind ``client`` (vLLM's engine-core client, in this process or
    another); returns the K set, -1 if the engine cannot change it."""
    core = getattr(client, "engine_core", None)
    if core is not None and hasattr(core, "scheduler"):  # in this process (InprocClient)
        return _set_k(core, k)
    return int(client.call_utility(METHOD, k))
