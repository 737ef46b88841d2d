"""Suffix drafts (``method: suffix`` on the tree engine): the domain index's matches and trees
on hand-built outputs, the merge with the row's own trie, the row's frozen view, the bounds on
memory and on a draft's work, and replay against the engine's own counts."""

from __future__ import annotations

import random

from batchspec.engines.tree.continuations import Scored, grow, merge
from batchspec.engines.tree.drafting import Ask, Learner, replay
from batchspec.engines.tree.ngram import NgramDrafter
from batchspec.engines.tree.suffix import SuffixDrafter
from batchspec.engines.tree.suffix_index import SuffixIndex
from batchspec.spec.suffix import SuffixSpec
from batchspec.spec.tree import TreeShape

OUTPUTS = [[1, 2, 3, 4, 5], [9, 2, 3, 4, 7], [1, 2, 3, 6]]
"""At positions 0-4, 6-10 and 12-15, a separator after each (5, 11, 16)."""


def index_of(outputs: list[list[int]], **kw: int) -> SuffixIndex:
    index = SuffixIndex(**{"max_tokens": 64, "anchor": 2, "max_match": 8, **kw})
    for out in outputs:
        index.add(out)
    return index


def test_the_longest_match_among_earlier_outputs_and_its_continuations() -> None:
    index = index_of(OUTPUTS)
    assert index.total == len(index.tokens) == 17  # the ring grows to max_tokens as needed
    # (2, 3) occurred three times; (1, 2, 3) twice, never across an output's start.
    assert index.match([0, 1, 2, 3], view=index.total) == (3, [3, 15])
    assert index.match([0, 9, 2, 3], view=index.total) == (3, [9])
    assert index.match([5, 2, 3], view=index.total) == (2, [3, 9, 15])
    assert index.match([2, 8], view=index.total) == (0, [])
    assert index.match([3], view=index.total) == (0, [])  # shorter than the anchor
    # A row that began before the third output was indexed sees only the first two.
    assert index.match([0, 1, 2, 3], view=12) == (3, [3])


def test_grow_ranks_continuations_by_count_and_stops_at_an_outputs_end() -> None:
    index = index_of([*OUTPUTS, [7, 2, 3, 6, 8]])
    length, starts = index.match([5, 2, 3], view=index.total)
    assert (length, starts) == (2, [3, 9, 15, 20])

    def read(p: int) -> int | None:
        return index.read(p, index.total)

    got = grow(3, starts, read, budget=8, max_depth=3)
    # 6 twice (the most recent at 20), then 4 twice; 8 after 6 once, 5 and 7 after 4 once;
    # the first 6 ends its output (a separator), so no continuation runs on into the next row.
    assert got.tokens == [3, 6, 4, 8, 7, 5]
    assert got.parents == [-1, 0, 0, 1, 2, 2]
    assert got.scores == [1.0, 0.5, 0.5, 0.25, 0.25, 0.25]
    assert grow(3, starts, read, budget=8, max_depth=1).tokens == [3, 6, 4]
    assert grow(3, starts, read, budget=8, max_depth=3, branching=[1, 1]).tokens == [3, 6, 8]


def test_merge_unites_shared_paths_and_ranks_by_the_larger_share() -> None:
    own = Scored([7, 1, 2, 3], [-1, 0, 1, 0], [1.0, 0.5, 0.5, 0.5])
    job = Scored([7, 3, 4, 1], [-1, 0, 1, 0], [1.0, 0.9, 0.9, 0.1])
    tree = merge([own, job], budget=3, max_depth=4)
    assert (tree.tokens, tree.parents) == ([7, 3, 4, 1], [-1, 0, 1, 0])
    tree = merge([own, job], budget=8, max_depth=4)
    assert (tree.tokens, tree.parents) == ([7, 3, 4, 1, 2], [-1, 0, 1, 0, 3])
    tree = merge([own, job], budget=8, max_depth=4, branching=[1, 1])
    assert (tree.tokens, tree.parents) == ([7, 3, 4], [-1, 0, 1])
    tree = merge([own, job], budget=8, max_depth=4, paths=[(0,), (1,), (1, 0)])
    assert (tree.tokens, tree.parents) == ([7, 3, 1, 2], [-1, 0, 0, 2])
    # Equal shares: the earlier source's node ranks first.
    tie = Scored([7, 5], [-1, 0], [1.0, 0.5])
    assert merge([tie, own], budget=1, max_depth=1).tokens == [7, 5]
    assert merge([own, tie], budget=1, max_depth=1).tokens == [7, 1]


def ask(budget: int = 8, depth: int = 4, domain: str | None = "a") -> Ask:
    return Ask(0, budget, depth, domain=domain)


def test_the_drafter_merges_the_rows_trie_with_its_domains_outputs() -> None:
    drafter = SuffixDrafter(NgramDrafter(1, 2))
    assert isinstance(drafter, Learner) and not isinstance(NgramDrafter(), Learner)
    for out in OUTPUTS:
        drafter.learn("a", out)
    drafter.learn("b", [1, 2, 3, 99, 98])
    # The row's own context repeats 3 once: the chain 0 8 1 2 (share 1). The domain's match
    # (1, 2, 3) has length 3, so at most 3 of its nodes: 6, 4 and 5 under 4 (shares 1/2).
    drafter.start(0, [3, 0, 8, 1, 2])
    drafter.extend(0, [3])
    tree = drafter.draft([ask()])[0]
    assert (tree.tokens, tree.parents) == ([3, 0, 8, 1, 2, 6, 4, 5], [-1, 0, 1, 2, 3, 0, 0, 6])
    (small,) = drafter.draft([ask(budget=5, depth=2)])
    assert (small.tokens, small.parents) == ([3, 0, 8, 6, 4, 5], [-1, 0, 1, 0, 0, 4])
    (other,) = drafter.draft([Ask(0, 8, 4, domain="b")])
    assert other.tokens[:2] == [3, 0] and 99 in other.tokens
    # No domain match: the row's own tree alone, as method ngram drafts it.
    (none,) = drafter.draft([ask(domain="c")])
    assert none.tokens == [3, 0, 8, 1, 2]
    drafter.release(0)


def test_match_length_sizes_the_domains_share_of_the_tree() -> None:
    drafter = SuffixDrafter(NgramDrafter(1, 2), SuffixSpec(spec_factor=0.5))
    drafter.learn("a", [1, 2, 3, 4, 5, 6])
    drafter.start(0, [0, 1, 2])
    drafter.extend(0, [3])
    # Match (1, 2, 3): length 3, 0.5 nodes per token -> 2 nodes of the continuation 4 5 6.
    assert drafter.draft([ask()])[0].tokens == [3, 4, 5]


def test_a_row_drafts_from_the_index_as_it_was_at_its_first_draft() -> None:
    drafter = SuffixDrafter(NgramDrafter(1, 2))
    drafter.learn("a", [1, 2, 3, 4])
    drafter.start(0, [0, 1, 2])
    drafter.extend(0, [3])
    before = drafter.draft([ask()])[0].tokens
    drafter.learn("a", [1, 2, 3, 7])  # another row finished while this one decodes
    assert drafter.draft([ask()])[0].tokens == before == [3, 4]
    drafter.release(0)
    drafter.start(0, [0, 1, 2])
    drafter.extend(0, [3])
    assert drafter.draft([ask()])[0].tokens == [3, 7, 4]


def test_state_stays_bounded_as_outputs_stream_through() -> None:
    rng = random.Random(3)
    index = SuffixIndex(max_tokens=1000, anchor=2)
    first = [rng.randrange(50) for _ in range(40)]
    index.add(first)
    for _ in range(500):  # 20,500 tokens through a 1,000-token index
        index.add([rng.randrange(50) for _ in range(40)])
        entries = sum(len(found) for found in index._at.values())
        assert entries <= 2 * index.max_tokens
    assert len(index.tokens) == 1000 and index.total == 501 * 41
    # The first output was evicted: it is never matched nor read.
    assert all(p >= index.total - index.max_tokens for p in index.match(first, index.total)[1])
    assert all(index.read(p, index.total) is None for p in range(41))


class CountingIndex(SuffixIndex):
    reads = 0

    def read(self, pos: int, view: int) -> int | None:
        CountingIndex.reads += 1
        return super().read(pos, view)


def test_a_drafts_work_does_not_grow_with_the_index() -> None:
    rng = random.Random(5)
    drafter = SuffixDrafter(NgramDrafter(1, 3))
    drafter.indexes["a"] = CountingIndex(max_tokens=1 << 18, max_matches=16)
    for _ in range(2000):  # 100,000 tokens of a 6-token alphabet: every anchor frequent
        drafter.learn("a", [rng.randrange(6) for _ in range(50)])
    drafter.start(0, [rng.randrange(6) for _ in range(40)])
    CountingIndex.reads = 0
    tree = drafter.draft([Ask(0, 12, 6, domain="a")])[0]
    assert 1 < tree.size <= 13
    # 16 occurrences: each its anchor's check and a backward match of at most 32, then the
    # continuations of at most 16 starts at each of 6 depths.
    assert CountingIndex.reads <= 16 * (1 + 32) + 16 * 6


def test_replay_drafts_from_the_earlier_rows_step_by_step() -> None:
    shape = TreeShape(max_depth=4)
    earlier = [[5, 6, 7, 8, 5, 6, 9, 1], [5, 6, 7, 8, 2, 2]]
    prompt, out = [4, 4, 5], [6, 7, 8, 5, 6, 9, 3]
    replayed = SuffixDrafter(NgramDrafter(1, 2))
    for row in earlier:
        replayed.learn("a", row)
    got = replay(replayed, prompt, out, 4, shape, 64, domain="a")
    alone = replay(NgramDrafter(1, 2), prompt, out, 4, shape, 64)
    # Step 1, context 4 4 5 6: no own match; (5, 6) three times in the domain (length 2, so 2
    # nodes): 7 8 (twice) accepted, bonus 5. Step 2, context ... 6 7 8 5: own chain 6 7 8 5,
    # the domain's (5 6 7 8 5) -> 6 9 1; merged 6 -> {7 -> 8, 9}: 6 9 accepted, bonus 3.
    assert (got.nodes, got.accepted) == ([2, 4], [2, 2])
    assert alone.accepted == [1]
