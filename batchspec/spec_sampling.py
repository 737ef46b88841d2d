"""The job's ``sampling`` section (vLLM's ``SamplingParams``), in a module of its own: the
keys a synthetic-data job asks of sampling (n samples, per-row settings, penalties, logprobs,
structured output) and the checks that keep each lossless under speculation live here."""

from __future__ import annotations

from pydantic import Field, field_validator

from batchspec.spec_base import _Section
from batchspec.spec_keys import no_empty_stop


class SamplingSpec(_Section):
    """Sampling parameters (vLLM's `SamplingParams`)."""

    temperature: float = Field(0.0, ge=0, description="0 = greedy")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus cut: 1 = none")
    top_k: int = Field(-1, ge=-1, description="top-k cut: -1 = none")
    max_tokens: int = Field(256, ge=1, description="new tokens per row, at most")
    stop: list[str] = Field(default_factory=list, description="stop strings")
    seed: int | None = Field(
        None,
        description="per-row seed base: row *i* of file *f* samples with a seed derived from "
        "(seed, f, i), so a row's sample does not depend on its batch; none = unseeded",
    )

    _stops = field_validator("stop")(no_empty_stop)
