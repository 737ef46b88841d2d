"""The ``speculative.suffix`` section: how the tree engine's suffix drafts index the job's
outputs (``engines/tree/suffix_index.py``, ``suffix.py``) and how much of what is already
committed each worker reads into them at start (``work/seeding.py``).

The defaults live here, not in the engine, so that the engine, the replay and the reference
page read one number. They are SuffixDecoding's (arXiv 2411.04975; Arctic Inference's
``suffix_max_spec_factor`` 1) where it has one, and the variants measured on the default job
otherwise (docs/trees.md).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from batchspec.spec.base import _Section

MAX_TOKENS = 1 << 20
"""Tokens indexed per domain before the oldest are evicted: about 15 MB of state per domain
once a million output tokens went through (docs/trees.md)."""
MAX_TOKENS_CAP = 1 << 26
"""The largest index a spec may ask for: ~1 GB of state per domain; more is a typo."""
READ_TOKENS = 1 << 17
"""Committed tokens read back per domain when an engine first meets it. Reading holds the
engine's batch while it tokenizes and indexes (~12 s per million tokens at load 8 here), and a
job of 100 domains pays it per domain at every worker start: a million tokens each would be
~20 minutes of every Slurm task's start. An eighth of the index gives a resumed run its
domain's recent outputs (the default job's whole output is ~64,000 tokens) in ~1.5 s."""
SPEC_FACTOR = 1.0
MIN_MATCH = 2
MAX_MATCH = 32
MAX_MATCHES = 64


class SuffixSpec(_Section):
    """Suffix drafts from the job's outputs (`method: suffix` on the tree engine): one index per
    domain of the outputs finished before a row, merged with the row's own n-gram trie (see
    *Draft trees*). On vLLM, suffix decoding takes Arctic Inference's keys through `extra`."""

    max_tokens: int = Field(
        MAX_TOKENS,
        ge=1,
        le=MAX_TOKENS_CAP,
        description="output tokens each domain's index holds (a ring: the oldest are evicted); "
        "about 15 MB per domain at the default 1,048,576; also the most a worker reads back "
        "from the domain's committed parts at start",
    )
    spec_factor: float = Field(
        SPEC_FACTOR,
        gt=0,
        le=16,
        description="draft nodes from the domain's outputs per token of the matched suffix "
        "(SuffixDecoding's `max_spec_factor`), within K",
    )
    min_match: int = Field(
        MIN_MATCH,
        ge=1,
        le=1024,
        description="the shortest suffix of a row's context that drafts from the domain's "
        "outputs (the index's key length)",
    )
    max_match: int = Field(
        MAX_MATCH,
        ge=1,
        le=1024,
        description="the longest suffix matched (a longer match drafts no differently)",
    )
    max_matches: int = Field(
        MAX_MATCHES,
        ge=1,
        le=4096,
        description="occurrences of a row's last `min_match` tokens looked at per draft, the "
        "most recent first: bounds a draft's time whatever the index holds",
    )
    read_tokens: int = Field(
        READ_TOKENS,
        ge=0,
        le=MAX_TOKENS_CAP,
        description="committed output tokens read back into each domain's index when a "
        "worker's engine first meets the domain (a resumed run, a second worker or Slurm "
        "task), newest first, within `max_tokens`; 0: none. The engine's batch waits while "
        "they are read (~12 s per million tokens on 2 busy cores)",
    )

    @model_validator(mode="after")
    def _match_bounds(self) -> SuffixSpec:
        if self.min_match > self.max_match:
            raise ValueError(
                f"min_match {self.min_match} is longer than max_match {self.max_match}"
            )
        return self


def check_suffix(s: Any) -> Any:
    """``speculative.suffix`` only where it does something: ``method: suffix``, or suffix
    among ``speculative.drafters``, on the tree engine (vLLM's suffix decoding is Arctic
    Inference's, with keys of its own)."""
    suffix = "suffix" in (s.drafters or [s.method])
    if s.suffix is not None and (not suffix or s.engine != "tree"):
        raise ValueError(
            "speculative.suffix needs method: suffix on the tree engine (engine: tree); "
            "vLLM's suffix decoding takes Arctic Inference's keys through speculative.extra"
        )
    return s
