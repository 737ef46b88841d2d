"""A verify forward over the nodes its trees hold, not B rows x the widest tree.

A batch's trees differ in size: rows at different K share a batch (the K controller gives
each unit its domain's K), and a model-free tree holds only as many nodes as its context
repeats. Padded to the widest (``shape.batch_layout``), one row at K=4 among seven plain
rows made every row's step a 5-node verify: 40 rows of products where 12 are real, 3.3x a
plain step at batch 8 on this CPU where 12 rows cost ~1.3x (docs/trees.md). The products, the
norms and the MLP do not care which row a node belongs to, so they run over the real nodes
alone, packed; only attention's inputs (cache writes, each row's prefix and ancestor mask)
keep the padded [B, N] layout, a pad node's K and V landing in scratch positions past its
row's tree, never committed, and its logits zeros the engine never looks at (it reads
``logits[b, : tree.size]``). Attention itself runs over contiguous runs of rows, each at its
own widest tree (``attention.TreeAttention.runs``), so a pad costs a query only inside a run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Packing:
    """Where a forward's real nodes sit in its padded [B, N] layout."""

    index: torch.Tensor
    """Long [T]: the flat position b·N + i of every real node, in row order."""
    batch: int
    nodes: int
    sizes: list[int]
    """Each row's real nodes, root included: attention cuts its calls by them
    (``attention.TreeAttention.runs``)."""

    @classmethod
    def of(cls, sizes: Sequence[int] | None, nodes: int, device: str) -> Packing | None:
        """The packing of rows whose trees hold ``sizes`` nodes (root included) of ``nodes``
        each; None where there is nothing to leave out (no sizes, or every row full)."""
        if sizes is None or all(s == nodes for s in sizes):
            return None
        if any(not 0 < s <= nodes for s in sizes):
            raise ValueError(f"tree sizes {list(sizes)} must lie in 1..{nodes}")
        flat = [b * nodes + i for b, size in enumerate(sizes) for i in range(size)]
        return cls(torch.tensor(flat, device=device), len(sizes), nodes, list(sizes))

    @property
    def rows(self) -> int:
        """Real nodes: the rows the products run over."""
        return self.index.numel()

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """The real nodes of ``x`` [B, N, ...], as [T, ...]."""
        return x.reshape(self.batch * self.nodes, *x.shape[2:]).index_select(0, self.index)

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """[T, ...] back to [B, N, ...], zeros where a row's tree has no node."""
        out = x.new_zeros(self.batch * self.nodes, *x.shape[1:])
        out.index_copy_(0, self.index, x)
        return out.view(self.batch, self.nodes, *x.shape[1:])
