"""Draft trees from the context's n-grams where it repeats itself, from a model elsewhere.

On synthetic-data outputs of a small target the two drafters are right at different steps: an
n-gram trie drafts only where the row's suffix occurred before (about half the steps of the
default job's rows), and is then often right several tokens deep, at no forward's cost; a draft
model or EAGLE head drafts at every step, less well. Replayed on 40 held-out rows of the default
job at 8 nodes (docs/distill.md), tokens per target forward were 1.87 with n-gram trees alone
(a step without a match is a plain one), 1.52 with a distilled head alone and 2.26 with the
n-gram tree where the trie has one and the head's tree elsewhere; the engine ran 1.2x faster
than with the head alone (slower than n-gram trees alone while the head's own steps do not
pay). The same choice is SuffixDecoding's hybrid with a model drafter (Arctic Inference).

Both drafters see every row's tokens (``start``, ``extend``, ``release``), so the model's
state stays in step while the n-gram side drafts; the model drafts only the rows the trie has
no continuation for, in one batched call. Each tree comes whole from one drafter and is
verified by the one-hot rule like any other: the choice depends on committed tokens only.
"""

from __future__ import annotations

from collections.abc import Sequence

from batchspec.engines.tree.drafting import Ask, Drafter
from batchspec.engines.tree.ngram import NgramDrafter
from batchspec.engines.tree.shape import DraftTree


class NgramFirst:
    """A ``Drafter``: each row's n-gram tree when it has a draft node, else ``model``'s tree."""

    def __init__(self, ngram: NgramDrafter, model: Drafter) -> None:
        self.ngram, self.model = ngram, model
        self.chosen = [0, 0]
        """Trees drafted so far by the n-gram trie and by the model (tests check both drafted)."""

    def start(self, slot: int, prompt: Sequence[int], twin: int | None = None) -> None:
        self.ngram.start(slot, prompt, twin)
        self.model.start(slot, prompt, twin)

    def extend(self, slot: int, tokens: Sequence[int]) -> None:
        self.ngram.extend(slot, tokens)
        self.model.extend(slot, tokens)

    def draft(self, asks: Sequence[Ask]) -> list[DraftTree]:
        trees = self.ngram.draft(asks)
        rest = [i for i, tree in enumerate(trees) if tree.size <= 1]
        if rest:
            for i, tree in zip(rest, self.model.draft([asks[i] for i in rest]), strict=True):
                trees[i] = tree
        self.chosen[0] += len(trees) - len(rest)
        self.chosen[1] += len(rest)
        return trees

    def release(self, slot: int) -> None:
        self.ngram.release(slot)
        self.model.release(slot)
