"""Packed verify forwards (``engines/tree/packing.py``): rows whose trees differ in size run
their products over the real nodes alone, and give the logits, cache and taps the padded
forward gives, by the C forward (up to 24 real nodes) and by the eager layers (more)."""

from __future__ import annotations

import pytest
import torch
from support.tiny_model import TINY_TIED, prefilled

from batchspec.engines.tree import smallm
from batchspec.engines.tree.eagle_head import TappedModel
from batchspec.engines.tree.model import TreeModel
from batchspec.engines.tree.packing import Packing
from batchspec.engines.tree.shape import DraftTree, batch_layout
from batchspec.engines.tree.weights import SMALL_ROWS

CONFIG = TINY_TIED
PROMPTS = [[5, 9, 2, 7, 1], [3, 8], [4, 4, 6], [1], [7, 3, 9, 9], [2, 5], [6], [8, 1, 1]]


def chain(root: int, length: int) -> DraftTree:
    """A root and ``length`` draft nodes in a chain."""
    return DraftTree([root, *range(10, 10 + length)], list(range(-1, length)))


def model_with(rows: int) -> TreeModel:
    return prefilled(PROMPTS[:rows])


def both(model: TreeModel, trees: list[DraftTree]) -> tuple[torch.Tensor, torch.Tensor]:
    """The verify's logits packed and padded, on the same cache."""
    slots = list(range(len(trees)))
    batch = batch_layout(trees, model.cache_len[: len(trees)])
    args = (slots, batch.tokens, batch.positions, batch.tree_mask)
    return model.verify(*args, sizes=batch.sizes), model.verify(*args)


@pytest.mark.parametrize("c_forward", [True, False])
def test_a_packed_verify_gives_the_padded_ones_logits_and_cache(c_forward: bool) -> None:
    """Three rows' trees of 3, 1 and 5 nodes: 9 real of 15 padded. Every real node's logits
    as padded, a pad's zeros; the kept paths' KV as padded (the next step agrees too)."""
    model = model_with(3)
    if c_forward and smallm.unsupported() is not None:
        pytest.skip(f"no small-row kernel here: {smallm.unsupported()}")
    if not c_forward:
        model.few_rows = None
    trees = [
        DraftTree([4, 6, 11], [-1, 0, 0]),
        chain(12, 0),
        DraftTree([13, 14, 15, 16, 17], [-1, 0, 1, 1, 0]),
    ]
    packed, padded = both(model, trees)
    assert packed.shape == padded.shape == (3, 5, CONFIG["vocab_size"])
    for b, tree in enumerate(trees):
        real = slice(0, tree.size)
        assert (packed[b, real] - padded[b, real]).abs().max().item() < 1e-5
        assert not packed[b, tree.size :].any()  # pads: zeros, never read
    for slot, path in enumerate([[0, 2], [0], [0, 4]]):
        model.commit(slot, path)
    packed, padded = both(model, [chain(1, 2), chain(2, 2), chain(3, 1)])
    assert (packed[:, :2] - padded[:, :2]).abs().max().item() < 1e-5


def test_more_nodes_than_the_c_forward_takes_run_packed_through_the_eager_layers() -> None:
    """Eight rows, seven chains and a single root: more real nodes than ``SMALL_ROWS`` (so
    the eager layers), fewer than padded, against the padded forward with the C forward
    off."""
    model = model_with(8)
    n = SMALL_ROWS // 7 + 2
    sizes = [n, 1, n - 1, n, n, n, n, n]
    assert SMALL_ROWS < sum(sizes) < 8 * n
    trees = [chain(i + 1, size - 1) for i, size in enumerate(sizes)]
    calls = []
    if model.few_rows is not None:
        few = model.few_rows.forward
        model.few_rows.forward = lambda *a, **k: calls.append(1) or few(*a, **k)
    packed, _ = both(model, trees)
    model.few_rows = None
    _, padded = both(model, trees)
    assert not calls  # 26 real nodes: the eager layers
    for b, size in enumerate(sizes):
        assert (packed[b, :size] - padded[b, :size]).abs().max().item() < 1e-5


def test_taps_of_a_packed_forward_are_the_padded_ones_at_the_real_nodes() -> None:
    """EAGLE's target shows each layer's input as [B, N, hidden], packed or not."""
    model = TappedModel.of(model_with(2), [0, 1, 2])
    trees = [chain(4, 2), chain(5, 0)]
    batch = batch_layout(trees, model.cache_len[:2])
    args = ([0, 1], batch.tokens, batch.positions, batch.tree_mask)
    model.verify(*args, sizes=batch.sizes)
    packed = model.tapped
    model.verify(*args)
    assert packed.shape == model.tapped.shape == (2, 3, 3 * 64)
    assert (packed[0] - model.tapped[0]).abs().max().item() < 1e-5
    assert (packed[1, :1] - model.tapped[1, :1]).abs().max().item() < 1e-5


def test_packing_leaves_full_rows_alone_and_refuses_sizes_outside_the_layout() -> None:
    assert Packing.of(None, 3, "cpu") is None and Packing.of([3, 3], 3, "cpu") is None
    p = Packing.of([2, 1, 3], 3, "cpu")
    assert p is not None and p.rows == 6 and p.index.tolist() == [0, 1, 3, 6, 7, 8]
    x = torch.arange(9.0).view(3, 3)
    assert p.pack(x).tolist() == [0, 1, 3, 6, 7, 8]
    assert p.unpack(p.pack(x)).tolist() == [[0, 1, 0], [3, 0, 0], [6, 7, 8]]
    for bad in ([0, 3], [4, 1]):
        with pytest.raises(ValueError, match="tree sizes"):
            Packing.of(bad, 3, "cpu")
