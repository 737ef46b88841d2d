"""An index of one domain's earlier outputs, for drafting from the whole job (SuffixDecoding).

A batch job writes thousands of rows per domain that share structure (the same JSON keys, the
same phrasing of an answer), so what earlier rows wrote after the context's last few tokens is
often what this row writes next. SuffixDecoding (arXiv 2411.04975) keeps a suffix tree over
earlier outputs; this index answers the same question, the longest suffix of the row's context
that occurred in an earlier output and what followed its occurrences, with less state per
token (a suffix tree in Python costs a node per token per depth):

- ``tokens``: the outputs, in the order they were added, each followed by a separator, in a
  ring that grows to ``max_tokens`` positions (4 bytes each): then the oldest are evicted as
  new ones arrive.
- ``_at``: every ``anchor``-gram of an output -> the positions that followed its occurrences,
  ascending (one 8-byte entry per token indexed); a sweep every ``max_tokens`` tokens drops
  evicted entries, so the state stays proportional to ``max_tokens``.

A draft looks up the context's last ``anchor`` tokens, takes the ``max_matches`` most recent
occurrences, extends each match backwards (up to ``max_match`` tokens) and keeps the
occurrences of the longest match, as a suffix tree's deepest matching node would. Its cost is
bounded by ``max_matches`` times (``max_match`` + the tree's depth), whatever the index holds.

Positions are absolute (counted since the index began), so a row can draft from the index as
it was when the row began (``view``: only positions below it): its drafts then depend only on
the rows indexed before it, which is what lets a finished row be replayed against the same
index (``drafting.replay``).
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Iterable, Sequence

from batchspec.spec.suffix import MAX_MATCH, MAX_MATCHES, MAX_TOKENS, MIN_MATCH

SEPARATOR = -1
"""Written after each output: no match runs back across it, no continuation runs past it."""


class SuffixIndex:
    """One domain's earlier outputs, bounded to ``max_tokens`` tokens, for drafting."""

    def __init__(
        self,
        max_tokens: int = MAX_TOKENS,
        anchor: int = MIN_MATCH,
        max_match: int = MAX_MATCH,
        max_matches: int = MAX_MATCHES,
    ) -> None:
        if max_tokens < 1 or not 1 <= anchor <= max_match or max_matches < 1:
            raise ValueError(
                "need max_tokens >= 1, 1 <= anchor <= max_match and max_matches >= 1: "
                f"{max_tokens}, {anchor}, {max_match}, {max_matches}"
            )
        self.max_tokens, self.anchor = max_tokens, anchor
        self.max_match, self.max_matches = max_match, max_matches
        self.tokens = array("i")
        """The ring: grows to ``max_tokens`` as outputs arrive (a small domain holds only its
        own tokens), then position p lives at p % max_tokens."""
        self.total = 0
        """Positions written since the index began (outputs and separators): the next one."""
        self._at: dict[tuple[int, ...], array] = {}
        self._swept = 0

    def add(self, output: Iterable[int]) -> None:
        """Index one finished output (its tokens, in order) and a separator after it."""
        size, a = self.max_tokens, self.anchor
        recent: list[int] = []
        for tok in output:
            if len(recent) >= a:
                self._at.setdefault(tuple(recent[-a:]), array("q")).append(self.total)
            self._put(int(tok))
            recent.append(int(tok))
            if len(recent) > 2 * a:
                del recent[:a]
        self._put(SEPARATOR)
        if self.total - self._swept >= size:
            self._sweep()

    def _put(self, tok: int) -> None:
        """Write the next position (``total``), over the oldest once the ring is full."""
        if len(self.tokens) < self.max_tokens:
            self.tokens.append(tok)
        else:
            self.tokens[self.total % self.max_tokens] = tok
        self.total += 1

    def _sweep(self) -> None:
        """Drop the entries whose anchor has been evicted (amortised: once per ring)."""
        live = self.total - self.max_tokens + self.anchor
        for key in list(self._at):
            found = self._at[key]
            cut = bisect.bisect_left(found, live)
            if cut == len(found):
                del self._at[key]
            elif cut:
                del found[:cut]
        self._swept = self.total

    def read(self, pos: int, view: int) -> int | None:
        """The token at ``pos`` as a row seeing positions below ``view`` reads it; None past
        its view, before the ring's oldest position, or at a separator."""
        if pos >= view or pos >= self.total or pos < self.total - self.max_tokens or pos < 0:
            return None
        tok = self.tokens[pos % self.max_tokens]
        return None if tok == SEPARATOR else tok

    def match(self, context: Sequence[int], view: int) -> tuple[int, list[int]]:
        """(length, continuation starts ascending) of the longest suffix of ``context`` (at
        least ``anchor`` tokens, at most ``max_match``) that occurred in an output below
        ``view``, among its anchor's ``max_matches`` most recent occurrences; (0, []) when
        none did."""
        a = self.anchor
        if len(context) < a:
            return 0, []
        found = self._at.get(tuple(context[-a:]))
        if not found:
            return 0, []
        hi = bisect.bisect_left(found, view)
        lo = max(hi - self.max_matches, 0)
        longest, starts = 0, []
        for p in found[lo:hi]:
            if self.read(p - a, view) is None:  # evicted (the sweep is lazy)
                continue
            n = a
            limit = min(self.max_match, len(context))
            while n < limit and self.read(p - n - 1, view) == context[-n - 1]:
                n += 1
            if n > longest:
                longest, starts = n, [p]
            elif n == longest:
                starts.append(p)
        return longest, starts
