"""The engine interface: what the worker, ``tune`` and benchmarks need of any engine.

An engine is built for a job spec and one speculative setting (K drafts; 0 = plain decoding),
pulls units from a source as its batch has room, yields each unit's results as soon as its
last row finishes, and reports how long it took to start (the K controller weighs switching
engines against it). vLLM's adapter is one implementation; an engine of batchspec's own (draft
trees, say) is another, and plugs in through ``batchspec.engines.open_engine`` without the
worker knowing which it got.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from batchspec.spec.tree import EngineName
from batchspec.units import UnitRequests, UnitResult

if TYPE_CHECKING:
    from batchspec.engines.tree.profile import StepProfile


class UnitSource(Protocol):
    """Where an engine gets work: the worker's claim logic behind three calls."""

    def next_unit(self) -> UnitRequests | None:
        """A claimed unit ready to submit, or None when none can be had right now."""

    def exhausted(self) -> bool:
        """True when no unit will come any more (all done, or stopping)."""

    def wait(self) -> None:
        """Block briefly while units held by other workers may come free."""


class ListSource:
    """A fixed list of units for an engine: no claiming, no waiting. What drives an engine
    outside a run (``batchspec tune`` and ``verify``, benchmarks): every unit is there from
    the start."""

    def __init__(self, units: list[UnitRequests]):
        self.units = deque(units)

    def next_unit(self) -> UnitRequests | None:
        return self.units.popleft() if self.units else None

    def exhausted(self) -> bool:
        return not self.units

    def wait(self) -> None:
        return None


class Engine(Protocol):
    """An engine up and ready, for one speculative setting."""

    name: EngineName
    """Which engine it is (one of ``spec.tree.ENGINES``): recorded in every row it ran."""
    k: int
    """Speculative tokens per step it was built with; 0 = no speculation."""
    k_per_unit: bool
    """True when it decodes each unit at ``UnitRequests.k`` (rows of units at different K in
    one batch, no rebuild: the tree engine, and vLLM for an adaptive job, ``vllm_live_k``);
    False when K is fixed per engine (vLLM at a fixed K or on its own schedule)."""
    step_profile: StepProfile | None
    """Measured seconds per step by batch size and draft nodes (``tree.profile``): the K
    controller's cost side. None where no profile is kept (vLLM, whose K is fixed per engine)."""
    method: str
    """The speculative method in effect (``none`` when ``k`` is 0): recorded in every row."""
    build_s: float
    """Seconds its start took (measured, not assumed)."""
    max_model_len: int
    """Longest prompt plus output it can hold: longer prompts become error rows."""

    def run(self, source: UnitSource, should_abort: Callable[[], bool]) -> Iterator[UnitResult]:
        """Yield each unit's results as soon as its last row finishes.

        Pulls units from ``source`` while the batch has room; ends when the source is
        exhausted and nothing is in flight, or, dropping what is in flight, as soon as
        ``should_abort()`` turns true. A dead or failing engine raises ``EngineFailure``; the
        units in flight then belong to the caller again.
        """
        ...

    def close(self) -> None:
        """Stop the engine and free its memory before another one starts. A second call does
        nothing (a worker whose new engine's start failed still holds the closed one)."""


@runtime_checkable
class LearnsOutputs(Protocol):
    """An engine that may draft from the job's own outputs (the tree engine's suffix drafts):
    the worker hands it what other workers and earlier runs committed of a domain
    (``work/seeding.py``), which it cannot read itself (engines read no output directory)."""

    @property
    def learns_outputs(self) -> bool:
        """Whether this engine's drafts use them (else the worker reads nothing)."""

    def learn_outputs(self, domain: str | None, outputs: list[list[int]]) -> None:
        """Finished outputs of ``domain`` as token ids, oldest first."""


class EngineFailure(RuntimeError):
    """The engine died or failed a step; the units in flight must be retried elsewhere."""
