"""The ``speculative.tree`` section: draft trees, served by batchspec's own tree engine; and
the rules that tie the speculative section's keys together (engine, method, draft).

vLLM drafts chains only (it removed tree attention in 2026), so a job with a ``tree`` key runs
on ``engines/tree`` instead, with and without speculation, drafting with n-grams or with a draft
model (top-k children per node, one draft forward per depth). K keeps its meaning for the
controller, ``tune`` and ``per_domain``: the number of draft tokens verified per step, here the
tree's nodes below its root. The shape bounds where those nodes may go.
"""

from __future__ import annotations

from typing import Any, Final, Literal

from pydantic import Field, field_validator, model_validator

from batchspec.spec.base import _Section

VLLM: Final = "vllm"
"""vLLM's engine (``engines/vllm_engine``): chains, every speculative method, tensor
parallelism. The production engine, and the one a tie of ``engine: auto`` goes to."""
TREE: Final = "tree"
"""batchspec's own engine (``engines/tree``): draft trees, n-gram or draft-model drafts."""
AUTO: Final = "auto"
"""Not an engine: whichever of ``ENGINES`` ``batchspec tune`` measured faster at the job's
batch size (``speculation.route``)."""
ENGINES: Final = (VLLM, TREE)
"""The engines batchspec has: the one list of their names (``open_engine`` builds them,
``tune`` sweeps them, tuning files and shared measurements are keyed by them)."""
EngineName = Literal["vllm", "tree"]
"""One of ``ENGINES``, as a type (a tuning file's keys)."""
EngineChoice = Literal[EngineName, "auto"]
"""``speculative.engine``: one of ``ENGINES`` or ``AUTO`` (``tests/test_route.py`` checks that
these types and the names above agree)."""

MAX_TREE_NODES = 64
"""Draft nodes per step at most: one verify forward carries them all, per row."""


class TreeShape(_Section):
    """Where a tree's draft nodes may go; unset = a dynamic tree (the K best-ranked nodes)."""

    branching: list[int] | None = Field(
        None,
        description="children per node at each depth at most, e.g. `[4, 2, 2, 1]` (depth = "
        "its length): a static shape within which the K best-ranked nodes are drafted",
    )
    paths: list[list[int]] | None = Field(
        None,
        description="explicit node paths by child rank, as EAGLE/Medusa `choices`, e.g. "
        "`[[0], [1], [0, 0]]`; every prefix of a path must be listed",
    )
    max_depth: int = Field(8, ge=1, le=MAX_TREE_NODES, description="deepest draft node")

    @field_validator("branching")
    @classmethod
    def _branching(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (not v or any(b < 1 for b in v)):
            raise ValueError("branching must list one count >= 1 per depth")
        return v

    @field_validator("paths")
    @classmethod
    def _paths(cls, v: list[list[int]] | None) -> list[list[int]] | None:
        if v is None:
            return v
        if len(v) > MAX_TREE_NODES:
            raise ValueError(f"paths: {len(v)} nodes, at most {MAX_TREE_NODES}")
        known = {tuple(p) for p in v}
        for p in v:
            if not p or any(r < 0 for r in p):
                raise ValueError(f"paths: {p} is not a list of child ranks >= 0")
            if len(p) > 1 and tuple(p[:-1]) not in known:
                raise ValueError(f"paths: {p} needs its parent {p[:-1]} listed too")
        return v

    @model_validator(mode="after")
    def _one_shape(self) -> TreeShape:
        if self.branching is not None and self.paths is not None:
            raise ValueError("set branching or paths, not both")
        return self

    def depth(self) -> int:
        """How deep a draft may go under this shape."""
        if self.branching is not None:
            return min(self.max_depth, len(self.branching))
        if self.paths is not None:
            return min(self.max_depth, max(len(p) for p in self.paths))
        return self.max_depth


class TreeSpec(TreeShape):
    """Draft trees (batchspec's tree engine; n-gram or draft-model drafts): several candidates
    per position, all verified in one forward pass. K (`num_speculative_tokens`,
    `per_domain`, the controller's choice) is the number of draft nodes per step."""

    per_domain: dict[str, TreeShape] = Field(
        default_factory=dict, description="a shape per domain, e.g. `{code: {max_depth: 12}}`"
    )
    draft_layers: list[int] | None = Field(
        None,
        description="`draft_model` only: draft with just these decoder layers (0-based) of "
        "the draft model, or of the target itself when `speculative.model` is unset "
        "(self-speculation, as LayerSkip and Draft & Verify: no second model in memory)",
    )

    ngram_first: bool = Field(
        False,
        description="`draft_model` and `eagle3`: a row's tree from the context's n-grams when "
        "they continue its last tokens, from the model only when they do not (SuffixDecoding's "
        "hybrid); n-gram bounds from `prompt_lookup_min`/`max`",
    )

    @field_validator("draft_layers")
    @classmethod
    def _layers(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (not v or min(v) < 0 or len(set(v)) != len(v) or v != sorted(v)):
            raise ValueError("draft_layers must list distinct layer indices >= 0, ascending")
        return v

    def check_method(
        self, method: str, model: str | None, drafters: list[str] | None = None
    ) -> None:
        """The tree engine drafts with n-grams, n-grams and the job's earlier outputs
        (``suffix``), a draft model (``model``, else the target's own ``draft_layers``) or an
        EAGLE-3 head (``model``, ``batchspec distill``); other methods run on vLLM. The model
        keys may serve a model drafter among ``drafters`` (``speculative.drafters``)."""
        methods = {m.partition("+")[0] for m in (method, *(drafters or []))}
        if method not in ("ngram", "suffix", "draft_model", "eagle3", "none"):
            raise ValueError(
                f"tree: the tree engine drafts with ngram, suffix, draft_model or eagle3; method "
                f"{method} runs on vLLM, in chains (engine: vllm, no tree key)"
            )
        if method == "eagle3" and not model:
            raise ValueError("method eagle3 needs speculative.model (the head: batchspec distill)")
        if self.ngram_first and not methods & {"draft_model", "eagle3"}:
            raise ValueError("tree.ngram_first needs method draft_model or eagle3 (a model)")
        if self.draft_layers is not None and "draft_model" not in methods:
            raise ValueError("tree.draft_layers needs method draft_model")
        if method == "draft_model" and not (model or self.draft_layers):
            raise ValueError(
                "method draft_model needs speculative.model (the draft) or tree.draft_layers "
                "(the target's own layers)"
            )

    def shape_for(self, domain: str | None) -> TreeShape:
        """The shape a domain's rows are drafted with."""
        if domain is not None and domain in self.per_domain:
            return self.per_domain[domain]
        return self


def engine_defaults(data: Any) -> Any:
    """The speculative section's input with ``engine`` filled in: the tree engine with a
    ``tree`` key, vLLM without; and a ``tree`` key (a dynamic tree) for an engine that needs
    one."""
    if not isinstance(data, dict):
        return data
    data = dict(data)
    if data.get("engine") is None:
        data["engine"] = TREE if data.get("tree") is not None else VLLM
    if data["engine"] in (TREE, AUTO) and data.get("tree") is None:
        data["tree"] = {}
    return data


def engines_of(choice: str) -> tuple[str, ...]:
    """The engines a job with ``speculative.engine: choice`` may run on: both for ``AUTO``,
    else its own."""
    return ENGINES if choice == AUTO else (choice,)


def check_speculative(s: Any) -> Any:
    """Check the speculative section ``s`` as a whole: the engine against the method
    (``auto`` needs a method both engines serve the same way, since the run takes whichever
    ``batchspec tune`` measured faster), the draft, and the n-gram lookup bounds."""
    if s.engine == VLLM and s.tree is not None:
        # A tree the engine cannot draft would be dropped without a word.
        raise ValueError(
            "speculative.tree is set but speculative.engine is vllm, which drafts chains "
            "only: set engine to tree (or auto), or remove the tree key"
        )
    if s.engine == AUTO:
        if s.method not in ("ngram", "draft_model"):
            raise ValueError(
                f"engine auto compares ngram or draft_model speculation on both engines; "
                f"method {s.method} runs on one only (set engine to vllm or tree)"
            )
        if s.tree.draft_layers is not None or (s.method == "draft_model" and not s.model):
            raise ValueError(
                "engine auto needs a draft model both engines load (speculative.model); "
                "tree.draft_layers drafts on the tree engine only (set engine: tree)"
            )
    if s.engine != VLLM:
        s.tree.check_method(s.method, s.model, s.drafters)
    elif s.method in ("draft_model", "eagle", "eagle3") and not s.model:
        raise ValueError(f"method {s.method} needs speculative.model (the draft)")
    if s.k_by_batch_size is not None:
        check_schedule(s)
    ngrams = s.method in ("ngram", "suffix") or (s.tree is not None and s.tree.ngram_first)
    if ngrams and (s.prompt_lookup_min or 1) > (s.prompt_lookup_max or s.prompt_lookup_min or 1):
        raise ValueError("prompt_lookup_min must be <= prompt_lookup_max")
    return s


def check_schedule(s: Any) -> None:
    """A batch-size schedule is vLLM's own choice of K, in one engine: on vLLM, with a method,
    no controller and no K per domain beside it (its largest K is every domain's fixed K:
    ``SpeculativeSpec.fixed_k``)."""
    if s.method == "none" or s.engine != VLLM:
        raise ValueError(
            "speculative.k_by_batch_size is vLLM's schedule: it needs a method and engine: vllm"
        )
    if s.adaptive or s.per_domain:
        raise ValueError(
            "speculative.k_by_batch_size chooses K by batch size itself: set "
            "adaptive: false and leave per_domain out"
        )
