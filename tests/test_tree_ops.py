"""The element-wise ops a GPU model compiles (``engines.tree.ops.fused``), checked on the CPU
through dynamo with a backend that runs the traced graph as it is (no inductor, so no
compiler's seconds): the model's logits through them equal to the ops as written at every
(rows, nodes) a step can take, and each op traced at most three times a dtype. On the H200
the ops as first written, on [rows, nodes, ...] shapes, hit dynamo's limit of 8
recompilations and fell back to eager for the buckets after it; inductor's kernels themselves
run in ``scripts/checks/device_graphs.py``."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from test_tree_loop import TINY

from batchspec.engines.tree import ops
from batchspec.engines.tree.model import TreeModel

pytestmark = pytest.mark.usefixtures("one_thread")

SHAPES = [(1, 1), (1, 5), (1, 16), (2, 1), (2, 3), (4, 8), (8, 1), (8, 16)]
"""(rows, nodes) of verify forwards: plain decoding, trees, a full batch."""


def test_compiled_ops_give_the_written_ops_logits_with_two_traces_a_shape_family():
    torch._dynamo.reset()
    traced: Counter[str] = Counter()

    def counting(gm: torch.fx.GraphModule, _inputs: list) -> object:
        args = [n.name for n in gm.graph.nodes if n.op == "placeholder" and "s" not in n.name[:1]]
        traced[",".join(args)] += 1  # an op by its tensor arguments' names
        return gm.forward

    torch.manual_seed(0)
    model = TreeModel.random(TINY, torch.float32, "cpu", 8, 96)
    model.prefill(0, torch.randint(5, model.vocab_size, (40,)).tolist())
    for slot in range(1, 8):
        model.share_prefix(0, slot, 40)
    gen = torch.Generator().manual_seed(1)
    steps = []
    for rows, nodes in SHAPES:
        tokens = torch.randint(5, model.vocab_size, (rows, nodes), generator=gen)
        positions = torch.arange(40, 40 + nodes).repeat(rows, 1)
        mask = torch.tril(torch.ones(nodes, nodes, dtype=torch.bool)).repeat(rows, 1, 1)
        steps.append((list(range(rows)), tokens, positions, mask))
    written = [model.verify(*step) for step in steps]
    model.ops = ops.fused(counting)
    prompt = torch.randint(5, model.vocab_size, (30,)).tolist()
    try:
        got = [model.verify(*step) for step in steps]
        model.release(7)
        model.prefill(7, prompt)  # a prefill reads only its last position's logits
    finally:
        torch._dynamo.reset()
    for (rows, nodes), a, b in zip(SHAPES, written, got, strict=True):
        assert torch.allclose(a, b, rtol=0, atol=1e-6), (rows, nodes)
    assert len(traced) == len(ops.NAMES) and max(traced.values()) <= 3, traced
