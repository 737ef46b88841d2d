"""``speculative.drafters``: the tree engine's drafters among which the K controller chooses
per domain, each with its K (``speculation/drafters.py``).

One engine loads every drafter listed once and each unit carries the drafter its rows draft
with, as it carries its K (``engines/tree/multi.py``), so a domain switches drafter without a
rebuild. ``speculative.method`` stays the drafter a domain starts with, and the one a fixed
K (``per_domain``, ``adaptive: false``) runs.
"""

from __future__ import annotations

from typing import Any, Final, Literal

TreeDrafter = Literal[
    "ngram", "suffix", "draft_model", "eagle3", "draft_model+ngram", "eagle3+ngram"
]
"""A drafter the tree engine can load beside others; ``+ngram``: the model drafter's trees
only where the row's n-grams have none (``tree.ngram_first`` as a drafter of its own)."""
MODEL_FREE: Final = ("ngram", "suffix")
"""Drafters with no model: replayed exactly on finished rows (``speculation/replay.py``)."""
MODEL_DRAFTERS: Final = ("draft_model", "eagle3")
"""Drafters with a model (``speculative.model``, or the target's ``tree.draft_layers``): one
at most, since the spec names one model (alone, and with n-gram trees first, ``+ngram``: the
model loaded once); priced from their own measured units."""


def check_drafters(s: Any) -> Any:
    """``speculative.drafters`` only where the controller can choose among them: the tree
    engine, adaptive K, the method among them, at most one model drafter, and its needs
    (``TreeSpec.check_method``: a model, or the target's layers)."""
    drafters = s.drafters
    if drafters is None:
        return s
    if s.engine != "tree":
        raise ValueError(
            "speculative.drafters needs engine: tree (the tree engine takes a drafter per "
            "unit; vLLM fixes one method per engine)"
        )
    if not s.adaptive:
        raise ValueError(
            "speculative.drafters is the K controller's choice: it needs adaptive: true "
            "(with adaptive: false every domain runs speculative.method)"
        )
    if len(set(drafters)) != len(drafters) or not drafters:
        raise ValueError("speculative.drafters must list distinct drafters")
    if s.method not in drafters:
        raise ValueError(
            f"speculative.method {s.method} (where each domain starts) must be one of "
            f"speculative.drafters {drafters}"
        )
    if s.tree.ngram_first:
        raise ValueError(
            "speculative.drafters: list draft_model+ngram or eagle3+ngram (n-gram trees first) "
            "instead of tree.ngram_first"
        )
    models = sorted({d.partition("+")[0] for d in drafters} & set(MODEL_DRAFTERS))
    if len(models) > 1:
        raise ValueError(
            f"speculative.drafters: {' and '.join(models)} both need speculative.model; "
            "list one model drafter at most"
        )
    for d in models:  # the n-gram drafters need nothing; the model drafter its model
        s.tree.check_method(d, s.model, drafters)
    return s
