"""The ``speculative`` section: the method, K and its choice per domain (``fixed_k``: the one
rule for whether a domain's K is fixed), the engine that runs it, and draft trees (``tree``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from batchspec.spec.base import _Section, _shown
from batchspec.spec.drafters import TreeDrafter, check_drafters
from batchspec.spec.keys import (
    SPECULATIVE_KEYS_SET,
    checked_k_grid,
    checked_schedule,
    k_per_domain,
    not_set_by_batchspec,
)
from batchspec.spec.suffix import SuffixSpec, check_suffix
from batchspec.spec.tree import VLLM, EngineChoice, TreeSpec, check_speculative, engine_defaults

SpecMethod = Literal["none", "draft_model", "eagle", "eagle3", "ngram", "suffix", "mtp"]


class SpeculativeSpec(_Section):
    """Speculative decoding: vLLM's `speculative_config`, plus K per domain. With `adaptive`
    (the default) one engine serves every K: vLLM is built at the largest K of `k_grid` and
    each row decodes at its unit's K, rows of different K in one batch, as on the tree engine.
    A fixed K, or vLLM's own `k_by_batch_size`, gets exactly that engine, one per K."""

    method: SpecMethod = Field(
        "none", description="`none`, `draft_model`, `eagle`, `eagle3`, `ngram`, `suffix`, `mtp`"
    )
    model: str | None = Field(
        None,
        description="draft model / EAGLE head directory or `builtin:` name (needed by "
        "`draft_model`, `eagle`, `eagle3`)",
        json_schema_extra=_shown("–"),
    )
    num_speculative_tokens: int = Field(
        3,
        ge=0,
        le=64,
        description="K, tokens proposed per step; 0 turns speculation off; adaptive, the "
        "largest K a domain starts at before anything is measured (lower where a step there "
        "would cost over 2 % more than a plain one: docs/choosing-k.md)",
    )
    prompt_lookup_min: int | None = Field(
        None,
        ge=1,
        description="n-gram: shortest suffix matched against the context",
        json_schema_extra=_shown("vLLM's"),
    )
    prompt_lookup_max: int | None = Field(
        None,
        ge=1,
        description="n-gram: longest suffix matched against the context",
        json_schema_extra=_shown("vLLM's"),
    )
    draft_tensor_parallel_size: int | None = Field(
        None, ge=1, description="draft model tensor parallelism", json_schema_extra=_shown("vLLM's")
    )
    k_by_batch_size: list[list[int]] | None = Field(
        None,
        description="vLLM's own schedule of K by batch size (`num_speculative_tokens_per_"
        "batch_size`): `[from, to, K]` ranges, inclusive, the first from 1, K 0 allowed, e.g. "
        "`[[1, 4, 3], [5, 16, 0]]`; one engine runs it, built for its largest K (each row's "
        "`num_speculative_tokens`); needs `adaptive: false`, vLLM and no `per_domain`",
        json_schema_extra=_shown("–"),
    )
    per_domain: dict[str, int] = Field(
        default_factory=dict,
        description="K per domain, fixed, e.g. `{math: 0, code: 5}`; 0 = no speculation for "
        "that domain; the controller leaves these alone",
    )
    adaptive: bool = Field(
        True,
        description="pick K per domain (0 = off) from measured acceptance and step cost: a "
        "tuning file (`batchspec tune`) and the run's own units (see *Choosing K*)",
    )
    k_grid: list[int] = Field(
        default_factory=lambda: [0, 1, 2, 3, 5, 8],
        description="the K the controller and `tune` consider",
    )
    explore: float = Field(
        0.05,
        ge=0,
        le=1,
        description="how much measuring other K may cost: the share of a domain's units run "
        "at a neighbouring K when an engine with that K is up anyway, and the share of the "
        "remaining work's predicted time that two engine starts for trying a never-measured "
        "neighbouring K may take",
    )
    tree: TreeSpec | None = Field(
        None,
        description="draft trees instead of chains, on batchspec's own engine (see *Draft "
        "trees*); the keys are listed below",
    )
    suffix: SuffixSpec | None = Field(
        None,
        description="`method: suffix` on the tree engine: the index of the job's outputs "
        "(its size, the match) and reading committed parts into it; the keys are listed below",
    )
    drafters: list[TreeDrafter] | None = Field(
        None,
        description="the tree engine's drafters the K controller chooses among per domain, "
        "each with its K (K=0 included), e.g. `[ngram, suffix]`: one engine loads them all "
        "and each unit drafts with its domain's choice, priced from replayed tokens per step "
        "(`ngram`, `suffix`) or measured acceptance (`draft_model`, `eagle3`: one model at "
        "most, alone and/or with n-gram trees first as `eagle3+ngram`) and the profiled step "
        "plus each drafter's measured drafting time; `method` is where each domain starts; "
        "needs `engine: tree` and `adaptive` (see *Choosing K*)",
        json_schema_extra=_shown("`method` alone"),
    )
    engine: EngineChoice = Field(
        VLLM,
        description="`vllm` (chains), `tree` (batchspec's tree engine; a missing `tree` key "
        "means a dynamic tree) or `auto`: whichever `batchspec tune` measured faster at the "
        "job's batch size (ngram, or draft_model with `model`; see *Routing a job to the "
        "faster engine*)",
        json_schema_extra=_shown("`tree` with a `tree` key, else `vllm`"),
    )
    extra: dict[str, Any] = Field(
        default_factory=dict,
        description="further `speculative_config` keys, passed through; not one that batchspec "
        "sets (method, K, draft, lookup bounds, draft parallelism)",
    )

    @field_validator("extra")
    @classmethod
    def _not_set_here(cls, v: dict[str, Any]) -> dict[str, Any]:
        return not_set_by_batchspec(v, SPECULATIVE_KEYS_SET)

    _k_range = field_validator("per_domain")(k_per_domain)
    _schedule = field_validator("k_by_batch_size")(checked_schedule)
    _grid = field_validator("k_grid")(checked_k_grid)

    _engine = model_validator(mode="before")(engine_defaults)
    _checked = model_validator(mode="after")(check_speculative)
    _drafters = model_validator(mode="after")(check_drafters)
    _suffix = model_validator(mode="after")(check_suffix)

    def fixed_k(self, domain: str | None) -> int | None:
        """The K a domain runs at whatever was measured, or None when the K controller
        chooses it: 0 without a speculative method, the domain's ``per_domain`` K, or with
        ``adaptive: false`` the spec's K. The one place this rule lives: ``k_for``, the
        controller (``Controller(fixed=)``), ``KPolicy.decide`` and ``route`` ask it."""
        if self.method == "none":
            return 0
        if self.k_by_batch_size is not None:  # vLLM's schedule, in one engine at its top K
            return max(k for _, _, k in self.k_by_batch_size)
        if domain is not None and domain in self.per_domain:
            return self.per_domain[domain]
        return None if self.adaptive else self.num_speculative_tokens

    def k_for(self, domain: str | None) -> int:
        """The K a domain starts at: its fixed K, else where the controller starts."""
        fixed = self.fixed_k(domain)
        return self.num_speculative_tokens if fixed is None else fixed
