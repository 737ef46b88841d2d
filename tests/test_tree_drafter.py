"""Draft-model trees (``engines.tree.drafter``): EAGLE-2's growth on hand-made log-probabilities
with exact expected trees, shapes, and the batched drafter's cached forwards against drafting
from scratch (every node's children from a full forward over its whole context)."""

from __future__ import annotations

import math

import torch

from batchspec.engines.tree.drafter import Growth, ModelDrafter, shape_ranks
from batchspec.engines.tree.drafting import Ask
from batchspec.engines.tree.model import TreeModel

VOCAB = 6


def lp(*probs: float) -> torch.Tensor:
    """Log-probabilities of a toy vocabulary, the listed tokens first, the rest uniform."""
    rest = (1 - sum(probs)) / (VOCAB - len(probs))
    return torch.tensor([*probs, *[rest] * (VOCAB - len(probs))]).log()


def test_shape_ranks_follow_branching_paths_depth_and_budget() -> None:
    ranks = shape_ranks(budget=3, max_depth=2, branching=[4, 2, 2])
    assert (
        list(ranks(())) == [0, 1, 2] and list(ranks((0,))) == [0, 1] and list(ranks((0, 1))) == []
    )
    listed = shape_ranks(budget=8, max_depth=8, paths=[(0,), (2,), (0, 0), (2, 1)])
    assert list(listed(())) == [0, 2] and list(listed((2,))) == [1] and list(listed((1,))) == []
    dynamic = shape_ranks(budget=2, max_depth=3)
    assert list(dynamic((0, 0))) == [0, 1] and list(dynamic((0, 0, 1))) == []


def test_growth_keeps_the_best_cumulative_nodes_and_expands_only_those() -> None:
    g = Growth(root=5, budget=3, ranks=shape_ranks(budget=3, max_depth=3))
    assert g.frontier == [0]
    g.expand(lp(0.5, 0.3, 0.1).unsqueeze(0))  # children of the root: 0 (.5), 1 (.3), 2 (.1)
    assert g.tokens == [5, 0, 1, 2] and g.frontier == [1, 2, 3]
    # Fed next, each behind the root's scratch position 0, which is its only ancestor.
    assert g.feed() == [(0, 1, [0]), (1, 1, [0]), (2, 1, [0])]
    assert g.fed == {0: 0, 1: 1, 2: 2, 3: 3}
    g.used += 3
    # Under token 0: 3 (.9) scores .45; under token 1: 4 (.5) scores .15; under 2: tiny.
    g.expand(torch.stack([lp(0.0, 0.0, 0.0, 0.9), lp(0.0, 0.0, 0.0, 0.0, 0.5), lp(0.4)]))
    # Kept: 0 (.5), 3|0 (.45), 1 (.3); dropped: 2 (.1) and every other child.
    assert sorted(g.kept) == g.kept and [g.tokens[n] for n in g.kept] == [5, 0, 1, 3]
    assert [g.tokens[n] for n in g.frontier] == [3]
    tree = g.tree()  # nodes by score: 0 (.5), 3 under it (.45), 1 (.3)
    assert tree.tokens == [5, 0, 3, 1] and tree.parents == [-1, 0, 1, 0]
    assert math.isclose(g.scores[g.kept[-1]], math.log(0.5 * 0.9), rel_tol=1e-6)
    # The frontier node's children all score below the three kept: growth stops.
    g.expand(lp(0.2, 0.2, 0.2).unsqueeze(0))
    assert g.frontier == [] and g.tree().tokens == [5, 0, 3, 1]


def test_a_chain_shape_grows_one_node_per_depth() -> None:
    g = Growth(root=1, budget=3, ranks=shape_ranks(budget=3, max_depth=3, branching=[1, 1, 1]))
    for tok in (2, 3, 4):
        g.expand(lp(*([0.0] * tok), 0.9).unsqueeze(0))
    assert g.frontier == [] and g.tree().tokens == [1, 2, 3, 4]
    assert g.tree().parents == [-1, 0, 1, 2]


def tiny_model() -> TreeModel:
    config = {
        "hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 64, "vocab_size": 40,
        "max_position_embeddings": 128, "initializer_range": 0.5,
    }  # fmt: skip
    return TreeModel.random(config, torch.float32, "cpu", max_batch=3, max_len=64)


def scratch_tree(draft: TreeModel, context: list[int], budget: int, depth: int) -> tuple:
    """The tree grown with every node's children from a full forward over its context (slot
    2 as scratch), as (tokens, parents)."""
    g = Growth(context[-1], budget, shape_ranks(budget, depth))
    while g.frontier:
        rows = []
        for node in g.frontier:
            path = []
            while node > 0:
                path.append(g.tokens[node])
                node = g.parents[node]
            rows.append(torch.log_softmax(draft.prefill(2, context + path[::-1]), dim=-1))
        g.expand(torch.stack(rows))
    tree = g.tree()
    return tree.tokens, tree.parents


def test_the_batched_cached_drafter_grows_what_drafting_from_scratch_grows() -> None:
    target = tiny_model()
    draft = target.layers_only([0, 2], max_batch=3, max_len=64)
    drafter = ModelDrafter(draft, vocab_size=40)
    prompts = [[3, 7, 11, 2, 9], [4, 4, 8]]
    contexts = [list(p) for p in prompts]
    for slot, prompt in enumerate(prompts):
        drafter.start(slot, prompt)
    fresh = [[21], [33]]  # each row's first token, chosen by the target
    for step in range(3):
        for slot in range(2):
            contexts[slot] += fresh[slot]
            drafter.extend(slot, fresh[slot])
        trees = drafter.draft([Ask(slot, 4, 3) for slot in range(2)])
        for slot, tree in enumerate(trees):
            assert draft.cache_len[slot] == len(contexts[slot]), step
            assert (tree.tokens, tree.parents) == scratch_tree(draft, contexts[slot], 4, 3)
            # The target "accepts" the first child (if any) and adds a bonus token.
            kids = tree.children(0)
            fresh[slot] = ([tree.tokens[kids[0]]] if kids else []) + [(step * 7 + slot) % 40]
    # A row asked for no node feeds nothing: its fresh tokens wait for its next draft.
    drafter.extend(0, fresh[0])
    contexts[0] += fresh[0]
    (empty,) = drafter.draft([Ask(0, 0, 3)])
    assert empty.tokens == [fresh[0][-1]] and draft.cache_len[0] == len(contexts[0]) - len(fresh[0])
    (tree,) = drafter.draft([Ask(0, 4, 3)])
    assert draft.cache_len[0] == len(contexts[0])
    assert (tree.tokens, tree.parents) == scratch_tree(draft, contexts[0], 4, 3)
