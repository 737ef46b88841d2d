"""What a worker generates with, apart from how it coordinates: its engines, the prompts they
take, the tokenizer, and the K policy that picks each engine's K.

``Worker`` takes these as one ``Backend`` so that the loop around them (claims, leases,
heartbeats, commits, quarantine, stops) is the same code whatever generates. A run gets the
model's (``model_backend``). The fleet simulator (``scripts/fleet/``) passes one with a
stand-in engine that "generates" on a clock, made-up rows and no tokenizer, and so runs the
product's own worker loop by the thousand in one process: a change to the loop is a change
to what the simulator measures (and its test, ``tests/test_fleet.py``, fails on a broken
loop), not to a copy of it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from batchspec.engines import Engine, open_engine
from batchspec.io.checks import Preflight
from batchspec.io.inputs import PromptBuilder
from batchspec.io.layout import OutDir
from batchspec.models import load_tokenizer
from batchspec.spec import JobSpec
from batchspec.speculation.policy import KPolicy
from batchspec.units import UnitRequests, WorkUnit


class Prompts(Protocol):
    """A claimed unit's rows as the engine takes them (``io.inputs.PromptBuilder``)."""

    def build(self, unit: WorkUnit, positions: list[int] | None = None) -> UnitRequests: ...


@dataclass
class Backend:
    """The pieces of a worker that depend on what generates (see the module's docstring)."""

    open_engine: Callable[[JobSpec, int, Callable[[], bool]], Engine]
    """An engine for the job at K; ``stopped`` (the worker's stop) ends a start early."""
    prompts: Callable[[Engine], Prompts]
    """The prompt builder for an engine (prompts are cut to its context length)."""
    tokenizer: Any = None
    """The job's tokenizer (committed outputs are tokenized with it for suffix drafts)."""
    policy: Callable[[JobSpec, OutDir, str], KPolicy] = KPolicy
    """K per domain for the worker named: ``KPolicy``, or a subclass of it."""


def model_backend(spec: JobSpec, pre: Preflight) -> Backend:
    """The model's: ``engines.open_engine``, the job's prompts over its input, its tokenizer."""
    tokenizer = load_tokenizer(pre.tokenizer_dir, "model.tokenizer")

    def prompts(engine: Engine) -> PromptBuilder:
        s = spec.sampling
        return PromptBuilder(
            spec.input, tokenizer, engine.max_model_len, s.seed, pre.reader, spec.sampling
        )

    def start(spec: JobSpec, k: int, stopped: Callable[[], bool]) -> Engine:
        return open_engine(spec, k, stopped=stopped)

    return Backend(start, prompts, tokenizer)
