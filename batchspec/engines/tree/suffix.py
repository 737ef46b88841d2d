"""``method: suffix`` on the tree engine: drafts from the whole job's outputs and the row's own
context, merged into one tree.

Two sources, as in SuffixDecoding (arXiv 2411.04975; Arctic Inference ships it for vLLM): the
row's own prompt and output (``ngram.NgramIndex``, the trie ``method: ngram`` drafts from) and
every output the engine finished earlier in the row's domain (``suffix_index.SuffixIndex``, one
per domain, fed each finished row at any K, and at a worker's first unit of the domain the
newest of its committed rows: ``work/seeding.py``). The domain's continuations are sized by how
long the match is (``spec_factor`` draft nodes per matched token, SuffixDecoding's
``max_spec_factor``; the index's sizes and the match are ``speculative.suffix``, ``SuffixSpec``):
a two-token match proposes little, a sentence-long one a whole subtree.
Both tries go through ``continuations.merge`` under the row's node budget and shape: a
continuation both sources propose is one node, ranked by the larger of its two shares.

A row drafts from the domain's index as it was at the row's first draft (its ``view``), never
from outputs finished while it decodes, so its drafts depend only on its own tokens and the
rows indexed before it: ``drafting.replay`` over a finished row, reading the engine's own
index below the row's view (``view``, ``pinned``), gives the engine's own counts whatever the
batch, however rows in flight finished around it. Drafts are deterministic, so the one-hot
rule verifies them losslessly whatever they propose.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import partial

from batchspec.engines.tree.continuations import grow, merge
from batchspec.engines.tree.drafting import Ask
from batchspec.engines.tree.ngram import NgramDrafter
from batchspec.engines.tree.shape import DraftTree
from batchspec.engines.tree.suffix_index import SuffixIndex
from batchspec.spec.suffix import SuffixSpec


class SuffixDrafter:
    """``drafting.Drafter`` and ``drafting.Learner``: each row's n-gram trie merged with its
    domain's earlier outputs."""

    def __init__(
        self,
        ngram: NgramDrafter,
        settings: SuffixSpec | None = None,
        indexes: dict[str | None, SuffixIndex] | None = None,
    ) -> None:
        self.ngram, self.settings = ngram, settings or SuffixSpec()
        self.indexes: dict[str | None, SuffixIndex] = {} if indexes is None else indexes
        """Per domain, its index; ``indexes``: another drafter's, read and never learned
        into (the replay reads the engine's, below each row's ``view``)."""
        self.views: dict[int, int] = {}
        """Per slot, the domain index's positions the row drafts from (those below it)."""
        self._pinned: int | None = None

    def index(self, domain: str | None) -> SuffixIndex:
        """The domain's index (made empty on first use)."""
        found = self.indexes.get(domain)
        if found is None:
            s = self.settings
            found = SuffixIndex(s.max_tokens, s.min_match, s.max_match, s.max_matches)
            self.indexes[domain] = found
        return found

    def start(self, slot: int, prompt: Sequence[int], twin: int | None = None) -> None:
        self.ngram.start(slot, prompt, twin)
        self.views.pop(slot, None)

    def extend(self, slot: int, tokens: Sequence[int]) -> None:
        self.ngram.extend(slot, tokens)

    def draft(self, asks: Sequence[Ask]) -> list[DraftTree]:
        return [self._draft(a) for a in asks]

    def _draft(self, ask: Ask) -> DraftTree:
        own = self.ngram.rows[ask.slot]
        shape = (ask.budget, ask.depth, ask.branching, ask.paths)
        index = self.index(ask.domain)
        view = self.views.setdefault(
            ask.slot, index.total if self._pinned is None else self._pinned
        )
        length, starts = index.match(own.tokens, view)
        if not starts:
            return own.draft(*shape)
        size = min(ask.budget, math.ceil(self.settings.spec_factor * length))
        theirs = grow(own.tokens[-1], starts, partial(index.read, view=view), size, *shape[1:])
        return merge([own.scored(*shape), theirs], *shape)

    def learn(self, domain: str | None, output: Sequence[int]) -> None:
        self.index(domain).add(output)

    def view(self, slot: int, domain: str | None) -> int:
        """``drafting.Learner.view``: the row's first draft's view, or where the index
        stands when it never drafted from it (its own output not in it yet)."""
        found = self.views.get(slot)
        return self.index(domain).total if found is None else found

    @contextmanager
    def pinned(self, view: int | None) -> Iterator[None]:
        """Rows that first draft inside read the index below ``view`` (None: below where it
        stands then): a finished row replayed as it drafted."""
        self._pinned = view
        try:
            yield
        finally:
            self._pinned = None

    def release(self, slot: int) -> None:
        self.ngram.release(slot)
        self.views.pop(slot, None)
