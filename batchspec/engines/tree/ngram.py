"""N-gram draft trees: every continuation of the context's longest repeated suffix, merged
into a trie ranked by how often each continuation occurred. Drafts cost no model forward, which
is what pays on a CPU; a tree offers the target several continuations where a chain offers one.

The index is incremental: appending a token records the n-grams that end just before it, in
O(max_n) dictionary updates, so drafting never rescans the context (rows can be 100k tokens
long). A draft reads only the ``max_matches`` most recent occurrences of the matched suffix.

``NgramDrafter`` is the engine's drafter (``drafting.Drafter``): one index per row in flight.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from batchspec.engines.tree.continuations import Scored, grow
from batchspec.engines.tree.drafting import Ask
from batchspec.engines.tree.shape import DraftTree


class NgramIndex:
    """One row's context and its n-gram occurrences, for drafting trees from it."""

    def __init__(self, min_n: int = 1, max_n: int = 3, max_matches: int = 64) -> None:
        if not 1 <= min_n <= max_n or max_matches < 1:
            raise ValueError(f"need 1 <= min_n <= max_n and max_matches >= 1: {min_n}, {max_n}")
        self.min_n, self.max_n, self.max_matches = min_n, max_n, max_matches
        self.tokens: list[int] = []
        self._starts: dict[tuple[int, ...], list[int]] = {}
        """n-gram -> positions where a continuation of an earlier occurrence starts, ascending;
        trimmed to the recent ones so a frequent n-gram's list stays bounded."""

    def extend(self, tokens: Iterable[int]) -> None:
        """Append the prompt or newly accepted tokens."""
        ctx, starts = self.tokens, self._starts
        for tok in tokens:
            ctx.append(int(tok))
            t = len(ctx) - 1
            # The n-grams ending just before t now have a continuation, starting at t.
            for n in range(self.min_n, min(self.max_n, t) + 1):
                found = starts.setdefault(tuple(ctx[t - n : t]), [])
                found.append(t)
                if len(found) > 2 * self.max_matches:
                    del found[: self.max_matches]

    def matches(self) -> list[int]:
        """Start positions of the continuations of the longest suffix (max_n down to min_n
        tokens) that occurred before, most recent last; empty when none did."""
        ctx = self.tokens
        for n in range(min(self.max_n, len(ctx)), self.min_n - 1, -1):
            found = self._starts.get(tuple(ctx[len(ctx) - n :]))
            if found:
                return found[-self.max_matches :]
        return []

    def draft(self, *shape: Any, **named: Any) -> DraftTree:
        """``scored``'s tree: ``draft_probs`` is None, the draft is deterministic."""
        return self.scored(*shape, **named).tree()

    def scored(
        self,
        budget: int,
        max_depth: int,
        branching: Sequence[int] | None = None,
        paths: Iterable[tuple[int, ...]] | None = None,
    ) -> Scored:
        """A tree rooted at the context's last token with at most ``budget`` draft nodes of
        depth <= ``max_depth``, from the trie of the matched continuations ranked by count
        (``continuations.grow``, which also says how the shape applies), with each node's
        share of the matches (what ``merge`` ranks by). No match, or no budget: the root alone."""
        if not self.tokens:
            raise ValueError("cannot draft from an empty context")
        ctx = self.tokens
        end = len(ctx)

        def read(pos: int) -> int | None:
            return ctx[pos] if pos < end else None

        return grow(ctx[-1], self.matches(), read, budget, max_depth, branching, paths)


class NgramDrafter:
    """``drafting.Drafter`` from each row's own context: its prompt and what it generated."""

    def __init__(self, min_n: int = 1, max_n: int = 3) -> None:
        self.min_n, self.max_n = min_n, max_n
        self.rows: dict[int, NgramIndex] = {}

    def start(self, slot: int, prompt: Sequence[int], twin: int | None = None) -> None:
        self.rows[slot] = NgramIndex(self.min_n, self.max_n)
        self.rows[slot].extend(prompt)

    def extend(self, slot: int, tokens: Sequence[int]) -> None:
        self.rows[slot].extend(tokens)

    def draft(self, asks: Sequence[Ask]) -> list[DraftTree]:
        return [self.rows[a.slot].draft(a.budget, a.depth, a.branching, a.paths) for a in asks]

    def release(self, slot: int) -> None:
        self.rows.pop(slot, None)
