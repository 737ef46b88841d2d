"""One forward's inputs: what every path of the target's forward takes (the C forward of a few
rows, the compiled single row, the eager layers, a CUDA graph's bucket), so that a new input
is added once rather than to five signatures."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from batchspec.engines.tree.packing import Packing


@dataclass(frozen=True)
class Forward:
    """B rows x N new positions."""

    slots: list[int]
    """The rows' cache slots."""
    tokens: torch.Tensor
    """Long [B, N]."""
    positions: torch.Tensor
    """Long [B, N]: each node's RoPE angle (cache_len + depth)."""
    tree_mask: torch.Tensor
    """Bool [B, N, W]: which scratch positions each node sees (``KVCache.mask``)."""
    offsets: list[int] | None = None
    """Scratch positions already written behind each row (a draft tree fed depth by depth);
    None: none."""
    last_only: bool = False
    """Logits of the last position alone (a prefill chunk's)."""
    packing: Packing | None = None
    """The trees' real nodes, where the products run over them alone; None: all B x N."""
