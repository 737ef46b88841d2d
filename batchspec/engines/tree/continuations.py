"""Draft trees from matched continuations, and several sources' trees merged into one.

A model-free drafter finds earlier occurrences of the context's suffix (in the row's own
context: ``ngram.py``; in the job's earlier outputs: ``suffix_index.py``) and proposes what
followed them. ``grow`` turns those occurrences into a trie ranked by how often each
continuation occurred, expanded best-first from a heap so that only the kept nodes and their
children are built: the work is bounded by the matches times the kept depth, never by the text
they were found in. Each node carries its share of the matches (an empirical path
probability), so trees from different sources compare on one scale, which is what ``merge``
ranks them by.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from batchspec.engines.tree.shape import DraftTree

Read = Callable[[int], "int | None"]
"""The token at a text position, or None where the text ends (or may not be read)."""


@dataclass
class Scored:
    """A draft trie (node 0 the root, topological, siblings best first) and each node's share
    of its source's matches: 1.0 at the root, never more than its parent's."""

    tokens: list[int]
    parents: list[int]
    scores: list[float]

    def tree(self) -> DraftTree:
        return DraftTree(self.tokens, self.parents)


def grow(
    root: int,
    starts: Sequence[int],
    read: Read,
    budget: int,
    max_depth: int,
    branching: Sequence[int] | None = None,
    paths: Iterable[tuple[int, ...]] | None = None,
) -> Scored:
    """The trie of the continuations starting at ``starts`` (text positions, ascending) under
    ``root``, at most ``budget`` draft nodes of depth <= ``max_depth``. Siblings rank by
    occurrence count, ties to the most recent occurrence; nodes are kept best-first by count,
    then shallower, then more recent (ancestor-closed: a child never occurred more often than
    its parent). ``branching`` caps children per depth (``branching[d]`` for a node at depth
    d; nothing deeper than its length); ``paths`` keeps only nodes whose rank path is listed
    (a static shape). No starts, or no budget: the root alone."""
    if branching is not None:
        max_depth = min(max_depth, len(branching))
    allowed = None if paths is None else set(paths)
    total = max(len(starts), 1)
    out = Scored([root], [-1], [1.0])
    heap: list[tuple[int, int, int, int, int, list[int], tuple[int, ...]]] = []
    _push(heap, read, 0, 0, (), list(starts), branching, allowed)
    while heap and len(out.tokens) <= budget:
        count, depth, _, tok, parent, group, path = heapq.heappop(heap)
        out.tokens.append(tok)
        out.parents.append(parent)
        out.scores.append(-count / total)
        if depth < max_depth:
            _push(heap, read, len(out.tokens) - 1, depth, path, group, branching, allowed)
    return out


def _push(
    heap: list,
    read: Read,
    node: int,
    depth: int,
    path: tuple[int, ...],
    starts: list[int],
    branching: Sequence[int] | None,
    allowed: set[tuple[int, ...]] | None,
) -> None:
    """Push the children of a kept node (``starts``: the continuations through it,
    ascending) that fit the shape, keyed by (-count, depth, -most recent start)."""
    groups: dict[int, list[int]] = {}
    for s in starts:
        tok = read(s + depth)
        if tok is not None:
            groups.setdefault(tok, []).append(s)
    ranked = sorted(groups.items(), key=lambda kv: (-len(kv[1]), -kv[1][-1]))
    for rank, (tok, group) in enumerate(ranked):
        if branching is not None and rank >= branching[depth]:
            break
        child = (*path, rank)
        if allowed is None or child in allowed:
            key = (-len(group), depth + 1, -group[-1])
            heapq.heappush(heap, (*key, tok, node, group, child))


def merge(
    sources: Sequence[Scored],
    budget: int,
    max_depth: int,
    branching: Sequence[int] | None = None,
    paths: Iterable[tuple[int, ...]] | None = None,
) -> DraftTree:
    """One tree from several sources' tries under one root: a token path the sources share is
    one node, scored by the highest share any source gives it; nodes are kept best-first by
    score within ``budget``, depth and shape as ``grow`` keeps them. Ties go to the shallower
    node, then to the earlier source (list the surest first). Scores never rise along a path
    in any source, so neither do their maxima, and every kept node's ancestors are kept."""
    if not sources or any(s.tokens[0] != sources[0].tokens[0] for s in sources):
        raise ValueError("merge needs one or more tries under the same root")
    if branching is not None:
        max_depth = min(max_depth, len(branching))
    allowed = None if paths is None else set(paths)
    # The union trie: children by token, each node's best score and first (source, node).
    kids: list[dict[int, int]] = [{}]
    best: list[tuple[float, int, int]] = [(1.0, 0, 0)]
    for order, src in enumerate(sources):
        where = [0] * len(src.tokens)
        for i in range(1, len(src.tokens)):
            up, tok = where[src.parents[i]], src.tokens[i]
            node = kids[up].get(tok)
            if node is None:
                node = kids[up][tok] = len(kids)
                kids.append({})
                best.append((src.scores[i], order, i))
            elif src.scores[i] > best[node][0]:
                best[node] = (src.scores[i], *best[node][1:])
            where[i] = node
    tokens, parents = [sources[0].tokens[0]], [-1]
    heap: list[tuple[float, int, int, int, int, int, int, tuple[int, ...]]] = []

    def push(node: int, kept: int, depth: int, path: tuple[int, ...]) -> None:
        ranked = sorted(kids[node].items(), key=lambda kv: (-best[kv[1]][0], *best[kv[1]][1:]))
        for rank, (tok, child) in enumerate(ranked):
            if branching is not None and rank >= branching[depth]:
                break
            named = (*path, rank)
            if allowed is None or named in allowed:
                score, order, index = best[child]
                heapq.heappush(heap, (-score, depth + 1, order, index, tok, child, kept, named))

    push(0, 0, 0, ())
    while heap and len(tokens) <= budget:
        _, depth, _, _, tok, node, kept, named = heapq.heappop(heap)
        tokens.append(tok)
        parents.append(kept)
        if depth < max_depth:
            push(node, len(tokens) - 1, depth, named)
    return DraftTree(tokens, parents)
