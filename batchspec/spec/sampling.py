"""The job's ``sampling`` section (vLLM's ``SamplingParams``), in a module of its own: the
keys a synthetic-data job asks of sampling (n samples, per-row settings, penalties, logprobs,
structured output) and the checks that keep each lossless under speculation.

Every key here is in the spec hash: each changes the rows (their number, their distribution,
or their columns). A setting an engine cannot apply losslessly under speculation is refused
here, before any engine starts (``check_engine``), never run silently wrong.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import Field, ValidationError, field_validator, model_validator

from batchspec.spec.base import _Section, _shown
from batchspec.spec.keys import no_empty_stop

COLUMN_SETTINGS = (
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_tokens",
    "repetition_penalty",
    "frequency_penalty",
    "presence_penalty",
)
"""Settings a row may take from a column of its own (``sampling.columns``)."""
TREE_UNSUPPORTED = (
    "prompt_logprobs",
    "json_schema",
    "regex",
    "choice",
)
"""Keys the tree engine does not apply (yet), as job settings or per-row columns: refused with
it, naming the key, rather than ignored (its acceptance is lossless only against the
distribution it samples from)."""
MAX_SEED = 2**63 - 1
"""``sampling.seed`` at most (and at least 0): rows' seeds are 63-bit hashes of it, and vLLM
reads a seed of -1 as none, so a negative seed would not mean what it says there."""
MAX_LOGPROBS = 20
"""vLLM's default ``max_logprobs``: more would need an engine keyword."""


class SamplingSpec(_Section):
    """Sampling parameters (vLLM's `SamplingParams`)."""

    temperature: float = Field(0.0, ge=0, description="0 = greedy")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus cut: 1 = none")
    top_k: int = Field(-1, ge=-1, description="top-k cut: -1 = none")
    max_tokens: int = Field(256, ge=1, description="new tokens per row, at most")
    stop: list[str] = Field(default_factory=list, description="stop strings")
    seed: int | None = Field(
        None,
        ge=0,
        le=MAX_SEED,
        description="per-row seed base (0 to 2^63-1): row *i* of file *f* samples with a seed "
        "derived from (seed, f, i), so a row's sample does not depend on its batch; none = "
        "unseeded",
    )
    n: int = Field(
        1,
        ge=1,
        le=1024,
        description="samples per prompt: each its own output row, told apart by "
        "`sample_index` 0..n-1, with a seed of its own (sample 0 keeps the row's seed); "
        "export writes a prompt's samples together, in input order",
    )
    columns: dict[str, str] = Field(
        default_factory=dict,
        description="per-row settings from input columns, e.g. `{max_tokens: max_new, "
        "temperature: temp}`: a row's non-null value overrides the job's for that row, a "
        "value out of range makes it an error row naming the column; settings: "
        + ", ".join(f"`{s}`" for s in COLUMN_SETTINGS),
    )
    min_tokens: int = Field(
        0, ge=0, description="new tokens before EOS or a stop string may end a row (vLLM's)"
    )
    repetition_penalty: float = Field(
        1.0,
        gt=0,
        description="vLLM's: logits of tokens in the prompt or output divided (positive) or "
        "multiplied (negative) by it; 1 = none",
    )
    frequency_penalty: float = Field(
        0.0,
        ge=-2,
        le=2,
        description="vLLM's: subtracted from a token's logit once per time it was generated",
    )
    presence_penalty: float = Field(
        0.0, ge=-2, le=2, description="vLLM's: subtracted from the logit of any generated token"
    )
    logprobs: int | None = Field(
        None,
        ge=0,
        le=MAX_LOGPROBS,
        description="write the column `logprobs`: per generated token its top-k (token id, "
        "log-probability) and the chosen token's, from the target's raw logits (before "
        "penalties and temperature, as vLLM reports them)",
        json_schema_extra=_shown("none"),
    )
    prompt_logprobs: int | None = Field(
        None,
        ge=0,
        le=MAX_LOGPROBS,
        description="write the column `prompt_logprobs`: the same per prompt token (vLLM only)",
        json_schema_extra=_shown("none"),
    )
    json_schema: dict[str, Any] | None = Field(
        None,
        description="structured output: every row's text is JSON valid against this schema "
        "(vLLM's structured outputs, xgrammar; vLLM only); a row cut off by `max_tokens` "
        "before the JSON closes has `finish_reason` `length`",
        json_schema_extra=_shown("none"),
    )
    regex: str | None = Field(
        None, description="structured output: text matching this regular expression (vLLM only)"
    )
    choice: list[str] | None = Field(
        None, description="structured output: text one of these strings (vLLM only)"
    )

    _stops = field_validator("stop")(no_empty_stop)

    @field_validator("columns")
    @classmethod
    def _known_settings(cls, v: dict[str, str]) -> dict[str, str]:
        for key, col in v.items():
            if key not in COLUMN_SETTINGS:
                raise ValueError(f"{key!r} is not a per-row setting (one of {COLUMN_SETTINGS})")
            if not isinstance(col, str) or not col:
                raise ValueError(f"{key}: a column name, not {col!r}")
        return v

    @field_validator("json_schema")
    @classmethod
    def _schema_is_valid(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None:
            try:
                import jsonschema  # comes with vLLM; without it, vLLM's own check remains
            except ImportError:
                return v
            try:
                jsonschema.Draft202012Validator.check_schema(v)
            except jsonschema.SchemaError as exc:
                raise ValueError(f"not a valid JSON schema: {exc.message}") from None
        return v

    @field_validator("regex")
    @classmethod
    def _regex_compiles(cls, v: str | None) -> str | None:
        # vLLM compiles it (xgrammar, a narrower dialect) only with the first request; Python's
        # parser finds the syntax errors without importing it (xgrammar imports torch).
        if v is not None:
            if "\x00" in v:
                raise ValueError("a regular expression may not hold a NUL character")
            try:
                re.compile(v)
            except re.error as exc:
                raise ValueError(f"not a valid regular expression ({exc})") from None
        return v

    @field_validator("choice")
    @classmethod
    def _some_choice(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and not v:
            raise ValueError("an empty list allows no text at all; list the choices")
        return v

    @model_validator(mode="after")
    def _one_structure(self) -> SamplingSpec:
        given = [k for k in ("json_schema", "regex", "choice") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"set at most one of json_schema, regex, choice (got {given})")
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens {self.min_tokens} > max_tokens {self.max_tokens}")
        return self

    def structured(self) -> dict[str, Any] | None:
        """vLLM's ``StructuredOutputsParams`` keywords, or None without structured output."""
        if self.json_schema is not None:
            return {"json": json.dumps(self.json_schema)}
        if self.regex is not None:
            return {"regex": self.regex}
        if self.choice is not None:
            return {"choice": list(self.choice)}
        return None

    def logprobs_for(self, asked: int | None) -> int | None:
        """Top log-probabilities an engine returns: those ``asked`` (``verify``) or the job
        writes (``logprobs``), whichever is more; None when neither wants any."""
        if asked is None or self.logprobs is None:
            return self.logprobs if asked is None else asked
        return max(asked, self.logprobs)

    def for_row(self, values: dict[str, Any]) -> tuple[SamplingSpec | None, str | None]:
        """This section with a row's column values (``columns``) in place of the job's
        (nulls keep the job's): the row's settings, or an error naming the column."""
        given = {k: _whole(k, v) for k, v in values.items() if v is not None}
        if not given:
            return self, None
        try:
            # The schema is the job's and already checked: not again for every row.
            checked = self.model_validate({**self.model_dump(exclude={"json_schema"}), **given})
            return checked.model_copy(update={"json_schema": self.json_schema}), None
        except ValidationError as exc:
            err = exc.errors()[0]
            key = str(err["loc"][0]) if err["loc"] else next(iter(given))
            col = self.columns.get(key, key)
            value = given.get(key)
            return None, f"column {col!r} (sampling.{key}) = {value!r}: {err['msg']}"


def _whole(key: str, value: Any) -> Any:
    """A whole float as an int for an integer setting: a float column (one that had nulls
    in pandas) holds ``64.0`` for ``max_tokens: 64``."""
    whole = isinstance(value, float) and value.is_integer()
    return int(value) if whole and key in ("max_tokens", "top_k", "min_tokens") else value


def check_engine(sampling: SamplingSpec, engine: str) -> None:
    """Refuse, in one line naming the key, a sampling key the job's engine would not apply
    losslessly: the tree engine's acceptance is lossless only against the distribution it
    samples from, so a setting it does not apply is an error, not a silent difference."""
    if engine == "vllm":
        return
    if sampling.stop and (sampling.min_tokens or "min_tokens" in sampling.columns):
        # vLLM looks for stop strings only after min_tokens; the tree engine's stops do not.
        raise ValueError(
            f"sampling.min_tokens with sampling.stop is not supported on the tree engine "
            f"(speculative.engine {engine}); use speculative.engine vllm"
        )
    defaults = SamplingSpec()
    for key in TREE_UNSUPPORTED:
        if key in sampling.columns:
            key = f"columns.{key}"
        elif getattr(sampling, key) == getattr(defaults, key):
            continue
        raise ValueError(
            f"sampling.{key} is not supported on the tree engine (speculative.engine "
            f"{engine}); use speculative.engine vllm"
        )
