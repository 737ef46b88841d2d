"""The tree engine's static KV cache: every slot's keys and values, allocated once.

gpt-fast's way: one tensor per K and V of shape [layers, max_batch, kv_heads, max_len, head_dim]
that never grows, and a length per slot. A verify step writes its nodes' KV as scratch just past
a slot's committed length (node i at cache_len + i), so rejected nodes cost nothing to drop:
``commit`` moves the kept path down to cache_len + depth for all layers in one copy and
advances the length; whatever lies beyond a slot's length is never attended to. Slots are
independent rows, so a finished row's slot is refilled without touching the others.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Step:
    """Where one forward pass of B rows x N nodes reads and writes the cache."""

    slots: torch.Tensor
    """Long [B]: the rows' slots."""
    lens: torch.Tensor
    """Long [B]: each slot's committed length (the nodes' prefix)."""
    rows: torch.Tensor
    """Long [B, N]: the slot of every new node (write index, dim 1 of the cache)."""
    cols: torch.Tensor
    """Long [B, N]: the cache position of every new node, cache_len + node index."""
    span: int
    """Cache positions the attention reads: max(cache_len) + N."""
    first: int | None
    """The first slot when the slots are consecutive (the cache is read as a view), else None
    (read through a gather, which copies)."""
    offsets: torch.Tensor
    """Long [B]: scratch positions already written behind each row's committed length by an
    earlier forward of the same step (a draft tree growing depth by depth); 0 for a verify."""


class KVCache:
    """Keys and values of ``max_batch`` slots of up to ``max_len`` positions each."""

    def __init__(
        self,
        layers: int,
        max_batch: int,
        kv_heads: int,
        max_len: int,
        head_dim: int,
        dtype: torch.dtype,
        device: str,
    ) -> None:
        shape = (layers, max_batch, kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.lens = [0] * max_batch
        self.max_len = max_len
        self.device = device
        self.arange = torch.arange(max_len, device=device)
        """0..max_len-1 on the device: positions and offsets without a per-step allocation."""

    def step(self, slots: list[int], nodes: int, offsets: list[int] | None = None) -> Step:
        """Index tensors for a forward of ``nodes`` new positions in each of ``slots``,
        written behind ``offsets`` scratch positions (None: none)."""
        if not slots or len(set(slots)) != len(slots):
            raise ValueError(f"slots must be distinct and non-empty: {slots}")
        lens = [self.lens[s] for s in slots]
        offsets = offsets or [0] * len(slots)
        span = max(lens) + max(offsets) + nodes
        if span > self.max_len:
            raise ValueError(f"cache full: {max(lens)} cached + {nodes} nodes > {self.max_len}")
        slot_t = torch.tensor(slots, device=self.device)
        lens_t = torch.tensor(lens, device=self.device)
        off_t = torch.tensor(offsets, device=self.device)
        cols = (lens_t + off_t).unsqueeze(1) + self.arange[:nodes]
        first = slots[0] if slots == list(range(slots[0], slots[0] + len(slots))) else None
        rows = slot_t.unsqueeze(1).expand(-1, nodes)
        return Step(slot_t, lens_t, rows, cols, span, first, off_t)

    def write(self, layer: int, step: Step, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the new nodes' keys and values, k and v [B, N, kv_heads, head_dim]."""
        self.k[layer][step.rows, :, step.cols] = k
        self.v[layer][step.rows, :, step.cols] = v

    def read(
        self, layer: int, step: Step, start: int = 0, end: int | None = None, span: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values [rows, kv_heads, span, head_dim] of the step's rows ``start:end``
        (all of them by default) over the first ``span`` positions (0: the step's)."""
        end = step.slots.numel() if end is None else end
        span = span or step.span
        k, v = self.k[layer, :, :, :span], self.v[layer, :, :, :span]
        if step.first is not None:
            window = slice(step.first + start, step.first + end)
            return k[window], v[window]
        slots = step.slots[start:end]
        return k.index_select(0, slots), v.index_select(0, slots)

    def mask(self, step: Step, tree_mask: torch.Tensor, group: int) -> torch.Tensor:
        """Bool [B, 1, group*N, span]: node i of row b sees the row's prefix [0, cache_len) and
        the scratch positions its ``tree_mask`` row allows, laid out for queries grouped by KV
        head (``group`` query heads per KV head, head-major, as the attention reshapes them).
        ``tree_mask`` [B, N, W]: column j is the row's scratch position cache_len + j; the new
        nodes are columns offset + 0..N-1 (W = N for a verify, whose nodes are all new).

        A node always sees itself, so no row is fully masked: a fully masked row would give a
        NaN output whose KV would then poison every row that reads it (0 x NaN is NaN).
        """
        b, n, w = tree_mask.shape
        seen = (step.lens.unsqueeze(1) + self.arange[:w]).unsqueeze(1).expand(b, n, w)
        own = step.offsets.unsqueeze(1) + self.arange[:n]
        allowed = tree_mask.scatter(2, own.unsqueeze(2), True)
        mask = self.arange[: step.span] < step.lens.view(b, 1, 1)
        mask = mask.expand(b, n, step.span).scatter(2, seen, allowed)
        return mask.unsqueeze(1).expand(b, group, n, step.span).reshape(b, 1, group * n, -1)

    def commit(self, slot: int, nodes: list[int]) -> None:
        """Keep the path ``nodes`` (node indices in depth order, root first) of the last
        verify: node ``nodes[d]`` moves from cache_len + nodes[d] to cache_len + d, in all
        layers at once, and the slot's length grows by len(nodes)."""
        base = self.lens[slot]
        if not nodes or nodes[0] != 0 or base + max(nodes) >= self.max_len:
            raise ValueError(f"slot {slot}: cannot commit nodes {nodes} at length {base}")
        moved = [d for d, node in enumerate(nodes) if node != d]
        if moved:
            src = torch.tensor([base + nodes[d] for d in moved], device=self.device)
            dst = torch.tensor([base + d for d in moved], device=self.device)
            for cache in (self.k, self.v):
                rows = cache[:, slot]
                rows.index_copy_(2, dst, rows.index_select(2, src))
        self.lens[slot] = base + len(nodes)

    def move(self, src: int, dst: int) -> None:
        """Move a row's committed KV to another (free) slot, in all layers at once, and free
        ``src``: lets an engine keep its rows in consecutive slots, which ``read`` serves as a
        view instead of a gather that copies every row's K/V in every layer."""
        n = self.lens[src]
        for cache in (self.k, self.v):
            cache[:, dst, :, :n] = cache[:, src, :, :n]
        self.lens[dst], self.lens[src] = n, 0

    def share_prefix(self, src: int, dst: int, n: int) -> None:
        """Copy the first ``n`` committed positions of ``src`` into the free slot ``dst``
        (identical prompts: one prefill, several rows)."""
        for cache in (self.k, self.v):
            cache[:, dst, :, :n] = cache[:, src, :, :n]
        self.lens[dst] = n

    def release(self, slot: int) -> None:
        """Free a slot for the next row: its length drops to 0 (its old KV is never read)."""
        self.lens[slot] = 0
