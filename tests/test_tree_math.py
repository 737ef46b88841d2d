"""The draft-tree engine's pure logic: shapes, masks, positions, n-gram drafts and acceptance.

The sampler is checked exactly: on a toy vocabulary the target is a full conditional table,
every accept and reject branch is enumerated (and, for sampled drafts, every draw of the
tree), and the resulting distribution over the next tokens must equal the target's to 1e-12
in float64; broken rules must fail the same check.
"""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from batchspec.engines.tree.accept import (
    accept_greedy,
    accept_sampled,
    draw,
    exact_output_distribution,
    reject_step,
)
from batchspec.engines.tree.ngram import NgramIndex
from batchspec.engines.tree.shape import (
    DraftTree,
    ancestor_mask,
    batch_layout,
    compaction,
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


def test_compaction_moves_the_accepted_path_behind_the_prefix() -> None:
    assert compaction([2, 5, 6], 10) == ([12, 15, 16], [11, 12, 13])
    assert compaction([1, 2], 10) == ([], [])  # a chain's accepted prefix is already in place
    assert compaction([1, 4], 0) == ([4], [2])


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


def test_greedy_follows_the_argmax_and_breaks_ties_low() -> None:
    # root 0; children 1 (token 2), 2 (token 3); node 1's children 3 (token 1), 4 (token 3).
    tree = DraftTree([0, 2, 3, 1, 3], [-1, 0, 0, 1, 1])
    logits = torch.full((5, 4), -1.0)
    logits[0, 2] = 5.0  # root wants 2: node 1
    logits[1, 3] = 1.0  # node 1 wants 3: node 4
    logits[4, 1] = logits[4, 3] = 2.0  # tie at the leaf: bonus 1
    assert accept_greedy(tree, logits) == ([1, 4], 1)
    logits[1, 0] = 9.0  # node 1 wants 0: no child has it
    assert accept_greedy(tree, logits) == ([1], 0)
    logits[0, 1] = 9.0
    assert accept_greedy(tree, logits) == ([], 1)


Table = dict[tuple[int, ...], torch.Tensor]


def table(vocab: int, depth: int, seed: int) -> Table:
    """A full conditional distribution over the next token for every context of up to
    ``depth`` tokens, in float64, with one zero per row (so p(x) = 0 and q(x) = 0 occur)."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for n in range(depth + 1):
        for ctx in itertools.product(range(vocab), repeat=n):
            row = torch.rand(vocab, generator=gen, dtype=torch.float64) ** 2
            row[int(torch.randint(vocab, (1,), generator=gen))] = 0
            out[ctx] = row / row.sum()
    return out


def context(tokens: list[int], parents: list[int], node: int) -> tuple[int, ...]:
    """The draft tokens from the root (excluded) down to ``node``."""
    path = []
    while node > 0:
        path.append(tokens[node])
        node = parents[node]
    return tuple(path[::-1])


def rows(tokens: list[int], parents: list[int], tab: Table) -> torch.Tensor:
    return torch.stack([tab[context(tokens, parents, i)] for i in range(len(tokens))])


def continued(dist: dict[tuple[int, ...], float], target: Table, length: int):
    """The distribution of the first ``length`` tokens when decoding goes on from the target
    after the emitted ones (the next steps are lossless by the same argument)."""
    out: dict[tuple[int, ...], float] = {}
    stack = list(dist.items())
    while stack:
        seq, weight = stack.pop()
        if len(seq) >= length:
            out[seq[:length]] = out.get(seq[:length], 0.0) + weight
            continue
        for tok, pr in enumerate(target[seq].tolist()):
            if pr > 0:
                stack.append(((*seq, tok), weight * pr))
    return out


def distance(a: dict[tuple[int, ...], float], b: dict[tuple[int, ...], float]) -> float:
    return max(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


def random_tree(rng: random.Random, vocab: int, depth: int) -> tuple[list[int], list[int]]:
    """Distinct-token siblings, 0 to 3 per node, breadth first."""
    tokens, parents, depths = [0], [-1], [0]
    at = 0
    while at < len(tokens):
        if depths[at] < depth:
            for tok in rng.sample(range(vocab), rng.randrange(4)):
                tokens.append(tok)
                parents.append(at)
                depths.append(depths[at] + 1)
        at += 1
    return tokens, parents


def no_zeroing(p: torch.Tensor, q: torch.Tensor | None, x: int) -> tuple[float, torch.Tensor]:
    """A broken rule: a rejected token keeps its probability in the residual."""
    return reject_step(p, q, x)[0], p


def test_deterministic_drafts_are_lossless_exactly() -> None:
    vocab, depth = 5, 3
    target = table(vocab, depth, seed=1)
    want = continued({(): 1.0}, target, depth + 1)
    rng = random.Random(2)
    broken = []
    for _ in range(8):
        tokens, parents = random_tree(rng, vocab, depth)
        tree, probs = DraftTree(tokens, parents), rows(tokens, parents, target)
        dist = exact_output_distribution(tree, probs)
        first = torch.zeros(vocab, dtype=torch.float64)
        for seq, pr in dist.items():
            first[seq[0]] += pr
        assert torch.allclose(first, target[()], rtol=0, atol=1e-12)
        assert distance(continued(dist, target, depth + 1), want) < 1e-12
        bad = exact_output_distribution(tree, probs, step=no_zeroing)
        broken.append(distance(continued(bad, target, depth + 1), want))
    assert max(broken) > 1e-2  # the check can fail


def drawn_trees(shape: list[int], draft: Table, vocab: int, replacement: bool):
    """Every tree of this shape a draft model can sample, with its probability: siblings
    drawn from q(. | path) i.i.d. or without replacement, in draw order."""
    parents = paths_to_parents(shape_paths(shape))
    for drawn in itertools.product(range(vocab), repeat=len(parents) - 1):
        tokens, weight = [0, *drawn], 1.0
        for i in range(1, len(tokens)):
            q = draft[context(tokens, parents, parents[i])]
            before = [tokens[j] for j in range(1, i) if parents[j] == parents[i]]
            if replacement:
                weight *= float(q[tokens[i]])
            elif tokens[i] not in before:
                weight *= float(q[tokens[i]] / (1 - q[before].sum()))
            else:
                weight = 0.0
        if weight > 0:
            yield weight, tokens, parents


def sampled_mixture(shape, target, draft, vocab, replacement, draws, step=reject_step):
    """The exact output distribution averaged over every tree the draft can sample."""
    out: dict[tuple[int, ...], float] = {}
    total = 0.0
    for weight, tokens, parents in drawn_trees(shape, draft, vocab, draws):
        q = rows(tokens, parents, draft)
        tree = DraftTree(tokens, parents, q, with_replacement=replacement)
        total += weight
        for seq, pr in exact_output_distribution(tree, rows(tokens, parents, target), step).items():
            out[seq] = out.get(seq, 0.0) + weight * pr
    assert abs(total - 1) < 1e-12
    return continued(out, target, len(shape) + 1)


@pytest.mark.parametrize(("shape", "replacement"), [([2, 2], True), ([3, 1], False)])
def test_sampled_drafts_are_lossless_exactly(shape: list[int], replacement: bool) -> None:
    vocab = 4
    target, draft = table(vocab, len(shape), seed=7), table(vocab, len(shape), seed=8)
    want = continued({(): 1.0}, target, len(shape) + 1)
    got = sampled_mixture(shape, target, draft, vocab, replacement, replacement)
    assert distance(got, want) < 1e-12
    # The check can fail: without the residual update, or with the i.i.d. rule for siblings
    # drawn without replacement.
    bad = sampled_mixture(shape, target, draft, vocab, replacement, replacement, no_zeroing)
    assert distance(bad, want) > 1e-2
    if not replacement:
        wrong = sampled_mixture(shape, target, draft, vocab, True, replacement)
        assert distance(wrong, want) > 1e-3


def chi_square_p(samples: dict[tuple[int, ...], int], exact: dict[tuple[int, ...], float]) -> float:
    """Goodness of fit of sampled counts to an exact distribution; cells expected below 5
    counts are pooled."""
    n = sum(samples.values())
    if not set(samples) <= set(exact):
        return 0.0
    stat, cells, pooled_obs, pooled_exp = 0.0, 0, 0, 0.0
    for seq, pr in exact.items():
        obs, exp = samples.get(seq, 0), n * pr
        if exp < 5:
            pooled_obs, pooled_exp = pooled_obs + obs, pooled_exp + exp
        else:
            stat, cells = stat + (obs - exp) ** 2 / exp, cells + 1
    if pooled_exp > 0:
        stat, cells = stat + (pooled_obs - pooled_exp) ** 2 / pooled_exp, cells + 1
    dof = torch.tensor(cells - 1.0, dtype=torch.float64)
    return float(torch.special.gammaincc(dof / 2, torch.tensor(stat / 2, dtype=torch.float64)))


def sample_counts(tree: DraftTree, probs: torch.Tensor, n: int, step=reject_step):
    gen = torch.Generator().manual_seed(11)
    counts: dict[tuple[int, ...], int] = {}
    for _ in range(n):
        accepted, bonus = accept_sampled(tree, probs, gen, step)
        seq = (*[tree.tokens[i] for i in accepted], bonus)
        counts[seq] = counts.get(seq, 0) + 1
    return counts


@pytest.mark.parametrize("with_q", [False, True])
def test_the_sampler_draws_what_the_enumerator_counts(with_q: bool) -> None:
    """accept_sampled and exact_output_distribution are the same rule (and the check catches
    a planted bias): a Monte-Carlo smoke test with a fixed seed."""
    vocab = 5
    target, draft = table(vocab, 3, seed=1), table(vocab, 3, seed=8)
    parents = [-1, 0, 0, 0, 1, 1, 2, 4]
    tokens = [0] * len(parents)
    gen = torch.Generator().manual_seed(4)
    for node in range(len(parents)):  # children drawn without replacement, in draw order
        kids = [i for i, p in enumerate(parents) if p == node]
        if not kids:
            continue
        picks = torch.multinomial(draft[context(tokens, parents, node)], len(kids), generator=gen)
        for kid, tok in zip(kids, picks.tolist(), strict=True):
            tokens[kid] = tok
    q = rows(tokens, parents, draft) if with_q else None
    tree, probs = (
        DraftTree(tokens, parents, q, with_replacement=False),
        rows(tokens, parents, target),
    )
    exact = exact_output_distribution(tree, probs)
    assert chi_square_p(sample_counts(tree, probs, 3000), exact) > 1e-3
    assert chi_square_p(sample_counts(tree, probs, 3000, no_zeroing), exact) < 1e-6


def test_draw_never_picks_a_token_without_mass() -> None:
    gen = torch.Generator().manual_seed(0)
    assert {draw(torch.tensor([0.0, 0.0, 3.0, 0.0]), gen) for _ in range(200)} == {2}
    counts = [0, 0, 0, 0]
    for _ in range(4000):
        counts[draw(torch.tensor([1.0, 0.0, 3.0, 0.0]), gen)] += 1
    assert counts[1] == counts[3] == 0 and 900 < counts[0] < 1100
