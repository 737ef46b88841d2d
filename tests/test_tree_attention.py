"""Tree attention cut into runs of rows (``engines/tree/attention.py``): on the CPU a
forward's rows attend in contiguous runs, each at its own widest tree and longest context,
where the padding would cost more than a call; the logits are those of one call over the
whole padded batch."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from support.tiny_model import prefilled

from batchspec.engines.tree import attention, smallm
from batchspec.engines.tree.attention import CALL_US, KEY_US, NODE_KEY_US, partition
from batchspec.engines.tree.shape import DraftTree, batch_layout

PROMPTS = [[5, 9, 2, 7, 1, 3, 3, 8, 1], [3, 8], [4, 4, 6], [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2]]


def cost(base: list[int], sizes: list[int], runs: list[tuple[int, int, int, int]]) -> float:
    """The model ``partition`` minimises, written out: a call a run, each row reading its
    run's span for its run's widest tree."""
    total = 0.0
    for start, end, nodes, span in runs:
        assert nodes == max(sizes[start:end]) and span == max(base[start:end]) + nodes
        total += CALL_US + (end - start) * span * (KEY_US + NODE_KEY_US * (nodes - 1))
    return total


def every_cut(b: int):
    """Every way to cut rows 0..b-1 into contiguous runs, as (start, end) pairs."""
    for bits in itertools.product([False, True], repeat=b - 1):
        edges = [0, *(i + 1 for i, cut in enumerate(bits) if cut), b]
        yield list(itertools.pairwise(edges))


def test_partition_finds_the_cheapest_cut_of_every_one() -> None:
    """Against every cut of up to 7 rows (64 each), on random trees and contexts."""
    rng = random.Random(3)
    for _ in range(60):
        b = rng.randint(1, 7)
        base = [rng.choice([10, 200, 400, 900]) for _ in range(b)]
        sizes = [rng.choice([1, 1, 2, 5, 9]) for _ in range(b)]
        got = partition(base, sizes)
        assert [r[:2] for r in got] in list(every_cut(b))  # contiguous, covering every row
        best = min(
            cost(base, sizes, [(s, e, max(sizes[s:e]), max(base[s:e]) + max(sizes[s:e]))
                               for s, e in cut])
            for cut in every_cut(b)
        )  # fmt: skip
        assert math.isclose(cost(base, sizes, got), best)


def test_partition_keeps_like_rows_together_and_cuts_off_a_wide_tree_or_a_long_context() -> None:
    assert partition([400] * 8, [1] * 8) == [(0, 8, 1, 401)]
    assert partition([400] * 8, [5] * 8) == [(0, 8, 5, 405)]
    assert partition([400] * 8, [5] + [1] * 7) == [(0, 1, 5, 405), (1, 8, 1, 401)]
    assert partition([100, 100, 900, 900], [1] * 4) == [(0, 2, 1, 101), (2, 4, 1, 901)]
    assert partition([400, 401], [2, 1]) == [(0, 2, 2, 403)]  # a call costs more than that


class Calls:
    """``TreeAttention.runs``, recording the runs of every forward."""

    def __init__(self, runs) -> None:
        self.runs, self.made = runs, []

    def __call__(self, *args, **kwargs):
        self.made.append(self.runs(*args, **kwargs))
        return self.made[-1]


@pytest.mark.parametrize("c_forward", [True, False])
def test_a_verify_cut_into_runs_gives_one_calls_logits(
    c_forward: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four rows of 9, 2, 3 and 11 cached tokens, trees of 3, 1, 5 and 2 nodes, packed and
    padded: with calls free every row attends on its own, and every real node's logits are
    those of one call over the padded batch; so are the kept paths' next steps."""
    if c_forward and smallm.unsupported() is not None:
        pytest.skip(f"no small-row kernel here: {smallm.unsupported()}")
    trees = [
        DraftTree([4, 6, 11], [-1, 0, 0]),
        DraftTree([12], [-1]),
        DraftTree([13, 14, 15, 16, 17], [-1, 0, 1, 1, 0]),
        DraftTree([18, 19], [-1, 0]),
    ]
    logits = {}
    for free in (False, True):
        model = prefilled(PROMPTS)
        if not c_forward:
            model.few_rows = None
        if free:
            monkeypatch.setattr(attention, "CALL_US", 0.0)
        calls = Calls(model.attend.runs)
        model.attend.runs = calls
        batch = batch_layout(trees, model.cache_len[:4])
        args = ([0, 1, 2, 3], batch.tokens, batch.positions, batch.tree_mask)
        first = [model.verify(*args, sizes=sizes) for sizes in (batch.sizes, None)]
        assert [len(c) for c in calls.made] == ([4, 4] if free else [1, 1])
        for slot, path in enumerate([[0, 2], [0], [0, 1, 3], [0, 1]]):
            model.commit(slot, path)
        nxt = batch_layout([DraftTree([3, 5], [-1, 0])] * 4, model.cache_len[:4])
        second = model.verify([0, 1, 2, 3], nxt.tokens, nxt.positions, nxt.tree_mask)
        logits[free] = (*first, second)
    for one, cut in zip(logits[False], logits[True], strict=True):
        for b, tree in enumerate(trees):
            real = slice(0, min(tree.size, cut.shape[1]))
            assert (one[b, real] - cut[b, real]).abs().max().item() < 1e-5
