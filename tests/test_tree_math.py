"""The draft-tree engine's pure logic: shapes, masks, positions and n-gram drafts (acceptance:
``test_tree_accept.py``)."""

from __future__ import annotations

import random

import pytest
import torch

from batchspec.engines.tree.ngram import NgramIndex
from batchspec.engines.tree.shape import (
    DraftTree,
    ancestor_mask,
    batch_layout,
    paths_to_parents,
    shape_paths,
    top_budget,
    validate_paths,
)

T, F = True, False


def test_ancestor_mask_depths_and_positions() -> None:
    tree = DraftTree([9, 4, 5, 6, 7, 8], [-1, 0, 0, 1, 1, 3])
    assert tree.depths() == [0, 1, 1, 2, 2, 3]
    assert tree.children(1) == [3, 4] and tree.children(5) == []
    assert tree.path_to(5) == [0, 1, 3, 5]
    expected = [
        [T, F, F, F, F, F],
        [T, T, F, F, F, F],
        [T, F, T, F, F, F],
        [T, T, F, T, F, F],
        [T, T, F, F, T, F],
        [T, T, F, T, F, T],
    ]
    assert torch.equal(ancestor_mask(tree.parents), torch.tensor(expected))
    batch = batch_layout([tree], [7])
    assert batch.positions.tolist() == [[7, 8, 8, 9, 9, 10]]
    assert torch.equal(batch.tree_mask[0], torch.tensor(expected))


def test_a_chain_is_a_causal_mask() -> None:
    assert torch.equal(ancestor_mask([-1, 0, 1, 2]), torch.ones(4, 4, dtype=torch.bool).tril())


def test_batch_layout_pads_exactly() -> None:
    wide, small = DraftTree([5, 6, 7], [-1, 0, 0]), DraftTree([1, 2], [-1, 0])
    batch = batch_layout([wide, small], [10, 3])
    assert batch.tokens.tolist() == [[5, 6, 7], [1, 2, 0]]
    assert batch.positions.tolist() == [[10, 11, 11], [3, 4, 3]]
    assert batch.valid.tolist() == [[T, T, T], [T, T, F]]
    assert batch.tree_mask.tolist() == [
        [[T, F, F], [T, T, F], [T, F, T]],
        [[T, F, F], [T, T, F], [F, F, T]],
    ]
    assert batch.sizes == [3, 2]
    assert batch.tokens.dtype == batch.positions.dtype == torch.long


def test_tree_structure_is_validated() -> None:
    with pytest.raises(ValueError, match="earlier node"):
        DraftTree([1, 2, 3], [-1, 2, 0])
    with pytest.raises(ValueError, match="root"):
        DraftTree([1, 2], [0, 0])
    with pytest.raises(ValueError, match="draft_probs"):
        DraftTree([1, 2], [-1, 0], torch.zeros(3, 4))


def test_shape_paths_and_parents() -> None:
    paths = shape_paths([2, 2])
    assert paths == [(0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1)]
    assert paths_to_parents(paths) == [-1, 0, 0, 1, 1, 2, 2]
    assert len(shape_paths([4, 2, 2, 1])) == 4 + 8 + 16 + 16
    with pytest.raises(ValueError, match="positive"):
        shape_paths([2, 0])


def test_validate_paths() -> None:
    assert validate_paths([[0, 0], [1], [0]], 3) == [(0,), (1,), (0, 0)]
    assert validate_paths([[1], [1, 2]], 2) == [(1,), (1, 2)]
    for paths, message in [
        ([[0], [1, 0]], r"parent \[1\] is missing"),
        ([[0], [0]], "listed twice"),
        ([[0], [1], [2]], "more than the bound 2"),
        ([[]], "non-empty"),
        ([[-1]], ">= 0"),
    ]:
        with pytest.raises(ValueError, match=message):
            validate_paths(paths, 2)


def test_top_budget_keeps_the_most_probable_nodes() -> None:
    # root; a (0.6), b (0.3); a's children c (0.3), d (0.2); b's child e (0.3): e ties c.
    tokens = [0, 10, 11, 12, 13, 14]
    parents = [-1, 0, 0, 1, 1, 2]
    scores = [1.0, 0.6, 0.3, 0.3, 0.2, 0.3]
    tree = top_budget(tokens, parents, scores, 4)
    # b (depth 1) wins the tie at 0.3 over c and e (depth 2); c before e by index.
    assert tree.tokens == [0, 10, 11, 12, 14]
    assert tree.parents == [-1, 0, 0, 1, 2]
    assert tree.draft_probs is None
    assert top_budget(tokens, parents, scores, 0).tokens == [0]
    assert top_budget(tokens, parents, scores, 99).size == 6
    with pytest.raises(ValueError, match="must not increase"):
        top_budget(tokens, parents, [1.0, 0.2, 0.3, 0.3, 0.2, 0.3], 3)


CTX = [1, 2, 3, 1, 2, 4, 1, 2, 3, 9, 1, 2]
"""(1, 2) occurred three times before the end, continued by 3 1 | 4 1 | 3 9."""


def ngram(tokens: list[int], min_n: int = 1, max_n: int = 2, **kw: int) -> NgramIndex:
    index = NgramIndex(min_n, max_n, **kw)
    index.extend(tokens)
    return index


def test_ngram_trie_ranks_by_count_then_recency() -> None:
    index = ngram(CTX)
    tree = index.draft(budget=8, max_depth=2)
    # 3 (twice) first; then the count-1 nodes, shallow first, recent first.
    assert tree.tokens == [2, 3, 4, 9, 1, 1]
    assert tree.parents == [-1, 0, 0, 1, 2, 1]
    assert tree.draft_probs is None
    assert index.draft(budget=3, max_depth=2).tokens == [2, 3, 4, 9]
    assert index.draft(budget=8, max_depth=1).tokens == [2, 3, 4]
    capped = index.draft(budget=8, max_depth=5, branching=[1, 2])
    assert (capped.tokens, capped.parents) == ([2, 3, 9, 1], [-1, 0, 1, 1])
    shaped = index.draft(budget=8, max_depth=2, paths=[(0,), (0, 0)])
    assert (shaped.tokens, shaped.parents) == ([2, 3, 9], [-1, 0, 1])
    second = index.draft(budget=8, max_depth=2, paths=[(1,), (1, 0)])
    assert (second.tokens, second.parents) == ([2, 4, 1], [-1, 0, 1])


def test_ngram_prefers_the_longest_suffix_and_handles_no_match() -> None:
    # (9, 1, 2) occurred once (continued by 7); (1, 2) also occurs elsewhere (continued by 3).
    index = ngram([9, 1, 2, 7, 5, 1, 2, 3, 9, 1, 2], max_n=3)
    assert index.draft(budget=4, max_depth=1).tokens == [2, 7]
    assert ngram([5, 6, 7]).draft(budget=4, max_depth=3).tokens == [7]
    assert ngram(CTX).draft(budget=0, max_depth=3).tokens == [2]
    with pytest.raises(ValueError, match="empty context"):
        NgramIndex().draft(4, 4)


def test_ngram_incremental_equals_from_scratch() -> None:
    rng = random.Random(3)
    tokens = [rng.randrange(6) for _ in range(3000)]
    grown = NgramIndex(1, 3, max_matches=8)
    at, checks = 0, 0
    while at < len(tokens):
        step = rng.randrange(1, 9)
        grown.extend(tokens[at : at + step])
        at += step
        if at > 250 * checks:
            checks += 1
            whole = ngram(tokens[:at], 1, 3, max_matches=8)
            got, want = grown.draft(10, 4, [3, 2, 2]), whole.draft(10, 4, [3, 2, 2])
            assert (got.tokens, got.parents) == (want.tokens, want.parents)
            assert got.size > 1 or at < 20
    assert grown._starts == ngram(tokens, 1, 3, max_matches=8)._starts


def reference_draft(index: NgramIndex, budget: int, max_depth: int, branching, paths):
    """The n-gram draft by its definition: the whole trie of the matched continuations, every
    node ranked, the best ``budget`` kept (what the heap-driven draft must reproduce)."""
    ctx, starts = index.tokens, index.matches()
    nodes: dict[tuple[int, ...], list[int]] = {}  # token path -> starts through it
    for s in starts:
        for d in range(1, min(max_depth, len(ctx) - s) + 1):
            nodes.setdefault(tuple(ctx[s : s + d]), []).append(s)
    key = {p: (-len(v), len(p), -max(v)) for p, v in nodes.items()}
    rank: dict[tuple[int, ...], tuple[int, ...]] = {(): ()}
    for p in sorted(nodes, key=lambda p: (len(p), key[p])):
        siblings = sorted((q for q in nodes if q[:-1] == p[:-1]), key=key.__getitem__)
        rank[p] = (*rank[p[:-1]], siblings.index(p))
    fits = [
        p
        for p in nodes
        if (branching is None or all(r < branching[i] for i, r in enumerate(rank[p])))
        and (paths is None or all(rank[p][:i] in paths for i in range(1, len(p) + 1)))
    ]
    kept = sorted(fits, key=key.__getitem__)[:budget]
    index_of = {(): 0, **{p: i for i, p in enumerate(kept, 1)}}
    return [ctx[-1]] + [p[-1] for p in kept], [-1] + [index_of[p[:-1]] for p in kept]


def test_ngram_draft_matches_its_definition() -> None:
    rng = random.Random(9)
    for trial in range(40):
        index = ngram([rng.randrange(3 + trial % 5) for _ in range(rng.randrange(5, 300))], 1, 3)
        budget, depth = rng.randrange(0, 20), rng.randrange(1, 6)
        branching = [rng.randrange(1, 4) for _ in range(depth)] if trial % 3 == 1 else None
        paths = {(0,), (1,), (0, 1), (1, 0), (0, 1, 0)} if trial % 3 == 2 else None
        tree = index.draft(budget, depth, branching, paths)
        want = reference_draft(index, budget, depth, branching, paths)
        assert (tree.tokens, tree.parents) == want


class CountingList(list):
    """A list that counts the elements read through indexing, to bound a draft's work."""

    reads = 0

    def __getitem__(self, key):  # type: ignore[no-untyped-def]
        got = super().__getitem__(key)
        CountingList.reads += len(got) if isinstance(key, slice) else 1
        return got


def test_ngram_draft_work_does_not_grow_with_the_context() -> None:
    rng = random.Random(5)
    index = ngram([rng.randrange(40) for _ in range(200_000)], 1, 3, max_matches=16)
    index.tokens = CountingList(index.tokens)
    CountingList.reads = 0
    tree = index.draft(budget=12, max_depth=6)
    assert 1 < tree.size <= 13
    # The suffix lookups (at most 3 + 2 + 1 tokens), the root, and 16 continuations of 6.
    assert CountingList.reads <= 6 + 1 + 16 * 6


class RecordingDrafter:
    """A model drafter's double (``NgramFirst``'s orchestration only): records what it is
    told and drafts the chain root -> 99 for every ask."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def start(self, slot: int, prompt, twin=None) -> None:
        self.calls.append(("start", slot, list(prompt)))

    def extend(self, slot: int, tokens) -> None:
        self.calls.append(("extend", slot, list(tokens)))

    def draft(self, asks) -> list[DraftTree]:
        self.calls.append(("draft", [a.slot for a in asks]))
        return [DraftTree([0, 99], [-1, 0]) for _ in asks]

    def release(self, slot: int) -> None:
        self.calls.append(("release", slot))


def test_ngram_first_drafts_from_the_trie_where_it_continues_else_from_the_model() -> None:
    """Slot 0's suffix (1, 2) occurred before: its tree is the n-gram drafter's, exactly; slot
    1's context never repeats: the model drafts it, alone in its call. Once slot 1's output
    repeats its prompt, the trie drafts it too and the model is not called. The model sees
    every start, extend and release (its state stays in step while it does not draft)."""
    from batchspec.engines.tree.drafting import Ask
    from batchspec.engines.tree.hybrid import NgramFirst
    from batchspec.engines.tree.ngram import NgramDrafter

    model, alone = RecordingDrafter(), NgramDrafter(1, 3)
    hybrid = NgramFirst(NgramDrafter(1, 3), model)
    prompts = {0: [1, 2, 3, 1, 2], 1: [5, 6, 7]}
    for slot, prompt in prompts.items():
        hybrid.start(slot, prompt)
        alone.start(slot, prompt)
    asks = [Ask(0, 4, 3), Ask(1, 4, 3)]
    trees = hybrid.draft(asks)
    assert trees[0] == alone.draft(asks[:1])[0] and trees[0].tokens[:2] == [2, 3]
    assert trees[1] == DraftTree([0, 99], [-1, 0])
    assert model.calls[-1] == ("draft", [1]) and hybrid.chosen == [1, 1]
    hybrid.extend(1, [5, 6])
    alone.extend(1, [5, 6])
    assert hybrid.draft(asks[1:]) == alone.draft(asks[1:]) and hybrid.chosen == [2, 1]
    hybrid.start(2, [4, 8, 4])  # one draft node from the trie is enough
    assert hybrid.draft([Ask(2, 1, 1)])[0].tokens == [4, 8] and hybrid.chosen == [3, 1]
    hybrid.release(0)
    assert model.calls == [
        ("start", 0, [1, 2, 3, 1, 2]), ("start", 1, [5, 6, 7]), ("draft", [1]),
        ("extend", 1, [5, 6]), ("start", 2, [4, 8, 4]), ("release", 0),
    ]  # fmt: skip
