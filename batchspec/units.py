"""What flows through the pipeline: a work unit, its rows as engine requests, the engine's results.

Plain data with no behaviour beyond naming, so that every layer (io, engines, speculation, work)
can import it without importing each other: the planner makes ``WorkUnit``s, the prompt builder
turns one into ``UnitRequests``, an engine returns a ``UnitResult``, the writer and the K
controller read it.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class WorkUnit:
    """Rows ``[start, stop)`` of input file ``file_index`` whose domain is ``domain``.

    ``num_rows`` counts only the rows of that domain. ``domain`` is None when the input has no
    domain column, and also for rows whose domain cell is null.
    """

    file_index: int
    path: str
    start: int
    stop: int
    domain: str | None
    num_rows: int

    @property
    def unit_id(self) -> str:
        base = f"f{self.file_index:04d}-r{self.start:010d}-{self.stop:010d}"
        if self.domain is None:
            return base
        # A readable slug plus a hash: two domains that slug alike still get distinct ids.
        slug = re.sub(r"[^a-z0-9]+", "_", self.domain.lower()).strip("_")[:24] or "d"
        digest = hashlib.sha1(self.domain.encode()).hexdigest()[:6]
        return f"{base}-{slug}-{digest}"


@dataclass
class RowRequest:
    """One input row, ready for the engine (``prompt_token_ids``) or already failed (``error``)."""

    row: int
    """Row number in its input file: with the unit it locates the row exactly."""
    row_id: Any
    domain: str | None
    passthrough: dict[str, Any]
    prompt_token_ids: list[int] | None = None
    error: str | None = None
    seed: int | None = None


@dataclass
class UnitRequests:
    """A unit and its rows, in input order."""

    unit: WorkUnit
    rows: list[RowRequest] = field(default_factory=list)
    finished: int = 0
    """Rows the engine has finished so far (progress shown in leases and status)."""
    positions: list[int] | None = None
    """For a retry of error rows: where ``rows`` sit in the unit's committed part."""
    finished_tokens: int = 0
    """Output tokens of the ``finished`` rows (live progress: tokens/s before the unit commits;
    an engine that does not count them shows tokens as units commit)."""


@dataclass
class RowResult:
    """What the engine produced for one row; ``error`` set means nothing was generated."""

    request: RowRequest
    text: str | None = None
    num_prompt_tokens: int | None = None
    num_output_tokens: int | None = None
    finish_reason: str | None = None
    spec: dict[str, Any] | None = None
    """Per-request speculative metrics, vLLM's names (``RequestSpecDecodeMetrics.to_dict``):
    num_spec_steps, num_draft_tokens, num_accepted_draft_tokens, acceptance_histogram."""
    timing: dict[str, float] | None = None
    """Engine timestamps of one monotonic clock: queued, scheduled, first_token, last_token."""
    error: str | None = None
    token_ids: list[int] | None = None
    """The generated token ids (``batchspec verify`` compares them; the writer keeps text)."""
    top_logprobs: list[dict[int, float]] | None = None
    """Per generated position, the target's top log-probabilities by token id; only when the
    engine was opened with ``logprobs`` (``batchspec verify``)."""

    @property
    def running_s(self) -> float | None:
        """Seconds from first scheduled to last token: the row's decoding time."""
        if self.timing is None:
            return None
        return self.timing["last_token"] - self.timing["scheduled"]


@dataclass
class UnitResult:
    """Every row of a unit, back from an engine that ran it with ``method`` at K = ``k``."""

    unit_requests: UnitRequests
    results: list[RowResult]
    k: int
    method: str

    @property
    def unit(self) -> WorkUnit:
        return self.unit_requests.unit
