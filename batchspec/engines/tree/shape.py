"""Draft trees: what a draft source proposes and the target verifies in one forward pass.

A tree is a list of nodes in topological order. Node 0 is the root: the last token already
chosen, whose KV is not in the cache yet; every other node is a draft token whose parent is an
earlier node. Siblings come in rank order (best first; for children sampled from a draft
model, the order they were drawn in), because the acceptance rules try them in that order. A
chain is the tree whose every node has one child, so chains and trees share all code here.

Static shapes follow Medusa/EAGLE "choices": a node is named by its rank path, (0,) the root's
best child, (0, 1) that child's second-best child. A dynamic tree (EAGLE-2) keeps the nodes with
the highest cumulative draft probability (``top_budget``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch


@dataclass
class DraftTree:
    """One row's draft tree. ``draft_probs`` [nodes, vocab] is the draft distribution each
    node's children were drawn from (row i = q(. | path to node i)), or None for children that
    were chosen deterministically (n-gram, top-k of a draft model, EAGLE-2's selection): those
    are verified with the one-hot rule, which is lossless for any choice that does not depend
    on the acceptance's random draws. ``with_replacement`` says how sampled children were drawn:
    i.i.d. from q (True) or one after another without replacement (False); it matters only
    with ``draft_probs`` (do not deduplicate i.i.d. draws: that changes how they were drawn;
    draw without replacement instead). Sampled siblings stay in draw order. Treat a tree as
    immutable: its child lists are computed once."""

    tokens: list[int]
    parents: list[int]
    draft_probs: torch.Tensor | None = None
    with_replacement: bool = True
    _kids: list[list[int]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if n == 0 or len(self.parents) != n or self.parents[0] != -1:
            raise ValueError(f"a tree needs a root with parent -1 and one parent per token: {self}")
        kids: list[list[int]] = [[] for _ in range(n)]
        for i in range(1, n):
            p = self.parents[i]
            if not 0 <= p < i:
                raise ValueError(f"node {i}: parent {p} must be an earlier node (topological)")
            kids[p].append(i)
        if self.draft_probs is not None and (
            self.draft_probs.dim() != 2 or self.draft_probs.shape[0] != n
        ):
            raise ValueError(
                f"draft_probs must be [{n}, vocab], got {tuple(self.draft_probs.shape)}"
            )
        self._kids = kids

    @property
    def size(self) -> int:
        """Nodes including the root: the number of positions the verify forward computes."""
        return len(self.tokens)

    def depths(self) -> list[int]:
        """Depth of every node (root 0); the position of node i is cache_len + depth."""
        out = [0] * len(self.parents)
        for i in range(1, len(out)):
            out[i] = out[self.parents[i]] + 1
        return out

    def children(self, i: int) -> list[int]:
        """Node i's children in rank order."""
        return self._kids[i]

    def first_path(self) -> list[int]:
        """First-ranked children from the root down to a leaf, root excluded (the planted
        bias's path, ``engines.planted``)."""
        path, node = [], 0
        while self._kids[node]:
            node = self._kids[node][0]
            path.append(node)
        return path

    def path_to(self, i: int) -> list[int]:
        """Node indices from the root down to i."""
        path = [i]
        while self.parents[path[-1]] >= 0:
            path.append(self.parents[path[-1]])
        return path[::-1]


@dataclass
class TreeBatch:
    """The verify forward's inputs for B rows, padded to N = the largest tree. The model
    attends, for row b, to its cached prefix [0, cache_len) and to the new nodes allowed by
    ``tree_mask[b]`` (node i sees j iff j is i or an ancestor of i)."""

    tokens: torch.Tensor
    """LongTensor [B, N], padded with 0."""
    positions: torch.Tensor
    """LongTensor [B, N]: cache_len + depth; padding nodes get cache_len."""
    tree_mask: torch.Tensor
    """Bool [B, N, N]; a padding node sees only itself and no node sees it."""
    valid: torch.Tensor
    """Bool [B, N]: False on padding nodes."""
    sizes: list[int]
    """Nodes per row, root included."""


def batch_layout(trees: list[DraftTree], cache_lens: list[int]) -> TreeBatch:
    """Pad B trees to one verify batch, on the host (the model moves it to its device in one
    copy per tensor). Ancestor masks are built for the whole batch at once by following parent
    pointers depth times (vectorised), not node by node."""
    if len(trees) != len(cache_lens) or not trees:
        raise ValueError(f"{len(trees)} trees for {len(cache_lens)} cache lengths")
    b, n, host = len(trees), max(t.size for t in trees), torch.device("cpu")
    tokens = torch.zeros(b, n, dtype=torch.long, device=host)
    positions = torch.tensor(cache_lens, dtype=torch.long, device=host)
    positions = positions.unsqueeze(1).repeat(1, n)
    # Every node's "parent" for the walk: the root and padding point at themselves.
    parents = torch.arange(n, device=host).repeat(b, 1)
    valid = torch.zeros(b, n, dtype=torch.bool, device=host)
    deepest = 0
    for row, tree in enumerate(trees):
        depths = tree.depths()
        deepest = max(deepest, max(depths))
        size = tree.size
        tokens[row, :size] = torch.tensor(tree.tokens, device=host)
        positions[row, :size] += torch.tensor(depths, device=host)
        parents[row, 1:size] = torch.tensor(tree.parents[1:], device=host)
        valid[row, :size] = True
    mask = torch.eye(n, dtype=torch.bool, device=host).repeat(b, 1, 1)
    up = parents
    for _ in range(deepest):
        mask.scatter_(2, up.unsqueeze(-1), True)
        up = parents.gather(1, up)
    return TreeBatch(tokens, positions, mask, valid, [t.size for t in trees])


def ancestor_mask(parents: list[int]) -> torch.Tensor:
    """Bool [N, N]: mask[i, j] is True iff j is i or an ancestor of i."""
    tree = DraftTree([0] * len(parents), list(parents))
    return batch_layout([tree], [0]).tree_mask[0]


def shape_paths(branching: Sequence[int]) -> list[tuple[int, ...]]:
    """Every rank path of the full tree with ``branching[d]`` children per node at depth d
    (root depth 0), by depth, then lexicographically: [2, 2] gives (0,), (1,), (0, 0), (0, 1),
    (1, 0), (1, 1)."""
    if not branching or any(int(b) != b or b < 1 for b in branching):
        raise ValueError(f"branching must be a non-empty list of positive integers: {branching}")
    out: list[tuple[int, ...]] = []
    level: list[tuple[int, ...]] = [()]
    for b in branching:
        level = [(*path, r) for path in level for r in range(int(b))]
        out.extend(level)
    return out


def validate_paths(paths: Sequence[Sequence[int]], max_nodes: int) -> list[tuple[int, ...]]:
    """Check explicit rank paths (Medusa/EAGLE "choices") and return them by depth, then
    lexicographically. Each path must be non-empty, of ranks >= 0 (rank r: the r-th best
    child), unique, with its parent path present, and the paths (the draft nodes, root not
    counted) at most ``max_nodes``. A missing better sibling is allowed, as in the job spec."""
    norm = [tuple(int(r) for r in p) for p in paths]
    seen = set(norm)
    if len(seen) != len(norm):
        raise ValueError("tree paths: a path is listed twice")
    if len(norm) > max_nodes:
        raise ValueError(f"tree paths: {len(norm)} nodes, more than the bound {max_nodes}")
    for path in norm:
        if not path or min(path) < 0:
            raise ValueError(f"tree path {list(path)}: must be a non-empty list of ranks >= 0")
        if len(path) > 1 and path[:-1] not in seen:
            raise ValueError(f"tree path {list(path)}: its parent {list(path[:-1])} is missing")
    return sorted(norm, key=lambda p: (len(p), p))


def paths_to_parents(paths: Sequence[tuple[int, ...]]) -> list[int]:
    """Parent array of the tree whose node i+1 is ``paths[i]`` (node 0 the root); ``paths``
    must be in topological order, as ``shape_paths`` and ``validate_paths`` return them."""
    index = {(): 0}
    parents = [-1]
    for i, path in enumerate(paths, 1):
        parents.append(index[path[:-1]])
        index[path] = i
    return parents


def select_budget(parents: list[int], scores: Sequence[float], budget: int) -> list[int]:
    """Indices of the root and the ``budget`` non-root nodes with the highest score, in the
    order they rank (which is topological). Scores (cumulative draft probabilities, or their
    logs) must not increase from parent to child; ties go to the shallower node, then to the
    lower index, so a kept node's ancestors are always kept."""
    vals = [float(s) for s in scores]
    depth = [0] * len(parents)
    for i in range(1, len(parents)):
        p = parents[i]
        depth[i] = depth[p] + 1
        if p > 0 and vals[i] > vals[p]:
            raise ValueError(
                f"node {i}'s score {vals[i]} exceeds its parent {p}'s {vals[p]}: scores must"
                " not increase along a path (use cumulative probabilities)"
            )
    ranked = sorted(range(1, len(parents)), key=lambda i: (-vals[i], depth[i], i))
    return [0, *ranked[: max(budget, 0)]]


def top_budget(
    tokens: list[int], parents: list[int], scores: Sequence[float], budget: int
) -> DraftTree:
    """EAGLE-2's re-ranking: keep the ``budget`` candidates with the highest cumulative draft
    probability (``select_budget``) as a tree re-indexed topologically, siblings best first.
    Its ``draft_probs`` is None: the selection is deterministic, so the one-hot rule verifies
    it losslessly (the min(1, p/q) rule would not)."""
    keep = select_budget(parents, scores, budget)
    new = {old: i for i, old in enumerate(keep)}
    return DraftTree([tokens[i] for i in keep], [-1] + [new[parents[i]] for i in keep[1:]])
