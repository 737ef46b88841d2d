"""What flows through the pipeline: a work unit, its rows as engine requests, the engine's results.

Plain data with no behaviour beyond naming, so that every layer (io, engines, speculation, work)
can import it without importing each other: the planner makes ``WorkUnit``s, the prompt builder
turns one into ``UnitRequests``, an engine returns a ``UnitResult``, the writer and the K
controller read it.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from batchspec.spec.tree import EngineName


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
    domain_index: int | None = None
    """The domain's place among the plan's distinct domains, sorted (the planner fills it; a
    directory's manifest binds its input and ``--limit``, so the plan and its indexes are the
    same for every worker and rerun). With it, ids are unique by construction: one unit per
    domain per row range, one index per domain. None: the legacy id (below)."""

    @property
    def unit_id(self) -> str:
        """``f<file>-r<start>-<stop>``, then ``-d<domain index>-<slug>`` for a domain (the slug
        is decoration). A legacy id (``domain_index`` None: how output directories written
        before the index name their parts) is ``-<slug>-<24 bits of sha1>``: domains alike in
        their first 24 slug characters collide after a few thousand names, which is why a
        legacy plan is checked for repeated ids before it runs (``io/manifest.py``)."""
        base = f"f{self.file_index:04d}-r{self.start:010d}-{self.stop:010d}"
        if self.domain is None:
            return base
        slug, digest = _slug(self.domain)
        if self.domain_index is not None:
            return f"{base}-d{self.domain_index:04d}-{slug}"
        return f"{base}-{slug}-{digest}"


@functools.lru_cache(maxsize=1 << 16)
def _slug(domain: str) -> tuple[str, str]:
    """A domain's slug and legacy digest, once per domain: a plan asks for millions of ids of a
    few domains (a regex and a hash per id tripled the planning time)."""
    slug = re.sub(r"[^a-z0-9]+", "_", domain.lower()).strip("_")[:24] or "d"
    return slug, hashlib.sha1(domain.encode()).hexdigest()[:6]


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
    sample_index: int = 0
    """Which of the prompt's ``sampling.n`` samples this request is (its own row and seed)."""
    sampling: Any = None
    """The row's ``SamplingSpec`` where columns set some of it (``sampling.columns``); None:
    the job's."""


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
    k: int | None = None
    """The K (tree node budget; 0 = plain decoding) this unit's rows decode at, on an engine
    that takes K per unit (``Engine.k_per_unit``); None: the K the engine was built with."""
    drafter: str | None = None
    """The drafter its rows draft with (one of ``speculative.drafters``, the K controller's
    choice for the domain, on the tree engine); None: the job's ``speculative.method``."""


@dataclass(frozen=True)
class SpecStats:
    """A row's speculative counts, as every engine reports them: the one typed record the
    writer, the K model, live progress and ``verify`` read (by attribute; vLLM's key names are
    known only to ``from_vllm``).

    ``steps`` counts verify steps that checked at least one draft token, ``drafted`` the draft
    tokens verified (tree engine: tree nodes), ``accepted`` those accepted, ``histogram`` the
    steps by accepted count (index 0..K; tree engine: by accepted depth). The per-step tuples
    list each step's drafted and accepted tokens where the engine records them (vLLM's
    ``detailed`` metrics with at least one step, the tree engine always); None otherwise.
    """

    steps: int
    drafted: int
    accepted: int
    histogram: tuple[int, ...]
    per_step_drafted: tuple[int, ...] | None = None
    per_step_accepted: tuple[int, ...] | None = None

    @classmethod
    def from_vllm(cls, metrics: Mapping[str, Any]) -> SpecStats:
        """From vLLM's per-request metrics as ``RequestSpecDecodeMetrics.to_dict()`` gives them
        (the response payload: steadier than its fields). Its ``summary`` form has no per-step
        lists, and its ``detailed`` form leaves them out until a step drafted: both read as
        None then."""
        drafted, accepted = metrics.get("per_step_drafted"), metrics.get("per_step_accepted")
        steps_known = drafted is not None and accepted is not None
        return cls(
            steps=metrics["num_spec_steps"],
            drafted=metrics["num_draft_tokens"],
            accepted=metrics["num_accepted_draft_tokens"],
            histogram=tuple(metrics["acceptance_histogram"]),
            per_step_drafted=tuple(drafted) if steps_known else None,
            per_step_accepted=tuple(accepted) if steps_known else None,
        )

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted over drafted tokens; None when nothing was drafted (not a made-up 0)."""
        return self.accepted / self.drafted if self.drafted else None

    @property
    def mean_acceptance_length(self) -> float | None:
        """Tokens per verify step, the bonus token included; None without a step."""
        return 1.0 + self.accepted / self.steps if self.steps else None


@dataclass
class RowResult:
    """What the engine produced for one row; ``error`` set means nothing was generated.

    Designed for what comes next; each field below joins ``RESULT_FIELDS`` (``io/writer.py``)
    when an engine fills it, never as an always-null column, and parts written before it read
    it as nulls (``observe/scan.py`` ``conform``):

    - ``sample_index: int`` (output column ``sample_index``, int32): which of a prompt's n
      samples the row is, 0 for n=1. It joins the row's identity: export's id check and its
      input order compare (id, sample_index), and a unit's part holds its rows' samples in
      order (row by row, sample by sample).
    - ``top_logprobs`` (below), written as ``logprobs``: list<list<struct<token_id: int32,
      logprob: float32>>>, per generated position the target's top tokens with the chosen
      one's; null unless the job asks for logprobs.
    """

    request: RowRequest
    text: str | None = None
    num_prompt_tokens: int | None = None
    num_output_tokens: int | None = None
    finish_reason: str | None = None
    spec: SpecStats | None = None
    """Speculative counts; None when the engine ran without speculation."""
    timing: dict[str, float] | None = None
    """Engine timestamps of one monotonic clock: queued, scheduled, first_token, last_token."""
    error: str | None = None
    token_ids: list[int] | None = None
    """The generated token ids (``batchspec verify`` compares them; the writer keeps text)."""
    top_logprobs: list[dict[int, float]] | None = None
    """Per generated position, the target's top log-probabilities by token id; only when the
    engine was opened with ``logprobs`` (``batchspec verify``)."""
    prompt_logprobs: list[dict[int, float]] | None = None
    """The same per prompt position (``sampling.prompt_logprobs``; vLLM: none at the first)."""
    replayed: dict[int, int] | None = None
    """Per K of the job's grid, the draft tokens its drafter, replayed over this finished row,
    would have had accepted (``speculation/replay.py``; columns ``replayed_k`` and
    ``replayed_accepted``); None where the row was not replayed. With several drafters
    (``speculative.drafters``), the replay of the drafter the row ran."""
    replays: dict[str, dict[int, int]] | None = None
    """With ``speculative.drafters``, ``replayed`` for every drafter that replays exactly
    (n-gram and suffix trees), on the same row: what the K controller prices each with."""
    replayed_drafted: dict[int, int] | None = None
    """Per K of the grid, the drafts the replayed drafter proposed over the row: draft tokens
    of vLLM's n-gram chains, draft nodes of the tree engine's n-gram and suffix trees (K or
    fewer a step); None where not replayed. What the row's drafts would cost its steps, which
    the K controller prices per domain (``Controller.fill_cost``). Not an output column."""
    replays_drafted: dict[str, dict[int, int]] | None = None
    """With ``speculative.drafters``, ``replayed_drafted`` for every drafter in ``replays``."""
    suffix_view: int | None = None
    """The tree engine's suffix drafter: the position of the domain's index below which the
    row drafted (``drafting.Learner.view``), which its replay reads the same index below.
    None from other engines and drafters. Not an output column."""

    @property
    def running_s(self) -> float | None:
        """Seconds from first scheduled to last token: the row's decoding time."""
        if self.timing is None:
            return None
        return self.timing["last_token"] - self.timing["scheduled"]


@dataclass
class UnitResult:
    """Every row of a unit, back from engine ``engine`` that ran it with ``method`` at K = ``k``.

    ``engine`` (one of ``spec.tree.ENGINES``) is recorded in every row an engine saw, since
    with ``engine: auto`` a rerun may switch engines; None only where no engine is known."""

    unit_requests: UnitRequests
    results: list[RowResult]
    k: int
    method: str
    engine: EngineName | None

    @property
    def unit(self) -> WorkUnit:
        return self.unit_requests.unit
