"""CUDA graphs of the target's verify forwards (plain decode steps are verifies of one node).

On a GPU an eager forward is bound by kernel launches, not by reading the weights: a 7B shape
on an H200 ran ~2,800 launches a step at ~5 us each, 16.1 ms where the weights take ~3.5
(docs/benchmarks.md). A CUDA graph replays a step's kernels with one launch. A graph fixes
every shape and address, so a forward is captured per *bucket* (``Bucket``) and each step is
padded up to its bucket:

- batch: the rows are read as a window of cache slots 0..batch-1 (the cache read stays a view,
  as eager's consecutive slots are; a gather would copy every row's K/V each layer). A slot
  of the window the step does not use must be free: it is a pad row, attending only to
  itself, and what it writes lands in a free slot, which the next prefill overwrites;
- nodes: a row's nodes past its tree see only themselves (as ``shape.batch_layout`` pads);
  their KV is scratch behind the row's length, which nothing reads before it is rewritten;
- span: the keys read, max(cache length) + nodes rounded up to a power of two (at least
  ``SPAN_MIN``), so a step reads at most twice the KV it needs.

One row whose window holds rows outside the step (a prompt prefilled beside the rows in
flight, the last row of a batch draining in a high slot) is read by its slot instead: a
*gather* bucket of batch 1, whose cache read copies the row's K/V (an index_select a layer,
~0.3 GB for a 7B shape at 512 keys: ~0.1 ms on an H100). Prefill takes such buckets too, up
to ``MAX_PREFILL`` nodes: eager, a 36-token prompt cost ~45 ms of launches on an H200 where
its weights take ~5, and at batch 8 every row in flight waits for it.

Powers of two bound the graphs to a few dozen per engine, captured when a bucket is first
met (a warm-up forward and a capture, tens of ms). A step no bucket fits (several rows beside
a window slot in use by a row outside the step, more nodes than ``MAX_NODES`` or, for one row,
``MAX_PREFILL``, the cache too short for the padded tree) runs eagerly. Everything a graph
reads comes through static buffers: one of integers (tokens, positions, lengths, the output's
row order, the slots read) and one of mask bits, copied in before each replay; graphs share
one memory pool, and the logits come out through a buffer per (batch, nodes) outside it.
With ``capture=False`` the same padded forward runs eagerly on the static buffers, on any
device: tests check it on the CPU.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from batchspec.engines.tree.cache import Step
from batchspec.engines.tree.eager import eager_forward

if TYPE_CHECKING:
    from batchspec.engines.tree.forward import Forward
    from batchspec.engines.tree.model import TreeModel

SPAN_MIN = 128
"""The shortest key span a graph reads: shorter contexts cost little to over-read."""
MAX_NODES = 64
"""The largest node bucket captured for several rows; bigger trees run eagerly."""
MAX_PREFILL = 512
"""The largest node bucket of one row: a prefill chunk (``model.PREFILL_CHUNK``)."""


@dataclass(frozen=True)
class Bucket:
    """The shapes one graph is captured for."""

    batch: int
    """Rows: the window of cache slots 0..batch-1 (one row, by its slot, if ``gather``)."""
    nodes: int
    span: int
    """Cache positions the attention reads."""
    gather: bool = False
    """One row read by its slot (index_select), not as a window of slots from 0."""


def power_of_two(n: int) -> int:
    """The smallest power of two >= n (n >= 1)."""
    return 1 << (n - 1).bit_length()


def plan(
    slots: Sequence[int], nodes: int, lens: Sequence[int], max_batch: int, max_len: int
) -> Bucket | None:
    """The bucket a forward of ``nodes`` nodes in each of ``slots`` runs in, given every
    slot's cache length ``lens``; None when none fits (it runs eagerly)."""
    if nodes > (MAX_PREFILL if len(slots) == 1 else MAX_NODES):
        return None
    padded = power_of_two(nodes)
    need = max(lens[s] for s in slots) + padded
    if need > max_len:
        return None
    span = min(max(power_of_two(need), SPAN_MIN), max_len)
    batch = min(power_of_two(max(slots) + 1), max_batch)
    if not any(lens[s] for s in set(range(batch)) - set(slots)):
        return Bucket(batch, padded, span)
    # A pad row would overwrite a row that is not in this step: one row goes by its slot.
    return Bucket(1, padded, span, gather=True) if len(slots) == 1 else None


def pad(
    bucket: Bucket,
    slots: Sequence[int],
    tokens: torch.Tensor,
    positions: torch.Tensor,
    tree_mask: torch.Tensor,
    lens: Sequence[int],
) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's inputs laid out for ``bucket``, on the host: (ints, mask).

    ints: long [tokens (batch x nodes), positions (batch x nodes), lens (batch), order
    (batch), window (batch)]: row w of the first three is the bucket's row w, which reads and
    writes cache slot ``window[w]`` (w itself, or the step's slot in a gather bucket); ``order``
    lists the step's rows first (output row b is ``slots[b]``), then the pad rows. mask: bool
    [batch, nodes, nodes], each pad node seeing itself only. A pad node sits at its row's
    length (a pad row's is 0)."""
    n = tokens.shape[1]
    rows, width = bucket.batch, bucket.nodes
    window = list(slots) if bucket.gather else list(range(rows))
    taken = [window.index(s) for s in slots]
    index = torch.tensor(taken, dtype=torch.long)
    length = torch.tensor([lens[w] for w in window], dtype=torch.long)
    tok = torch.zeros(rows, width, dtype=torch.long)
    tok[index, :n] = tokens.to(torch.long)
    pos = length.unsqueeze(1).repeat(1, width)
    pos[index, :n] = positions.to(torch.long)
    mask = torch.eye(width, dtype=torch.bool).repeat(rows, 1, 1)
    mask[index, :n, :n] = tree_mask.to(torch.bool)
    rest = sorted(set(range(rows)) - set(taken))
    order = torch.tensor([*taken, *rest], dtype=torch.long)
    ends = torch.tensor(window, dtype=torch.long)
    return torch.cat([tok.view(-1), pos.view(-1), length, order, ends]), mask


@dataclass
class Captured:
    """One bucket's static buffers and how to run its forward on them."""

    ints: torch.Tensor
    mask: torch.Tensor
    out: torch.Tensor
    """Float32 logits [batch, nodes, vocab], rows in ``order``."""
    run: Callable[[], None]


class CudaGraphs:
    """The target's verify forwards by bucket: captured CUDA graphs (``capture``), else the
    same padded forward run eagerly (a check of the padding on any device)."""

    def __init__(self, model: TreeModel, capture: bool = True) -> None:
        self.model, self.capture = model, capture
        self.buckets: dict[Bucket, Captured] = {}
        self.outs: dict[tuple[int, int], torch.Tensor] = {}
        self.pool = torch.cuda.graph_pool_handle() if capture else None
        self.replays = self.eager = 0
        """Forwards served by a bucket, and forwards left to the eager path."""
        self.failed: str | None = None
        """Why capturing failed (every forward is eager from then on), else None."""

    def forward(self, fwd: Forward) -> torch.Tensor | None:
        """``TreeModel.verify``'s logits [B, N, vocab] by the step's bucket ([B, 1, vocab] of
        the last node with ``fwd.last_only``: a prefill chunk's); None: run it eagerly (no
        bucket fits, or capturing failed). Offsets and packing are the eager path's."""
        m, slots, tokens = self.model, fwd.slots, fwd.tokens
        bucket = plan(slots, tokens.shape[1], m.cache.lens, m.max_batch, m.max_len)
        if bucket is None or self.failed is not None:
            self.eager += 1
            return None
        host = (tokens.cpu(), fwd.positions.cpu(), fwd.tree_mask.cpu())
        ints, mask = pad(bucket, slots, *host, m.cache.lens)
        entry = self.buckets.get(bucket)
        if entry is None:
            entry = self._build(bucket, ints, mask)
            if entry is None:
                self.eager += 1
                return None
        entry.ints.copy_(ints)
        entry.mask.copy_(mask)
        entry.run()
        self.replays += 1
        b, n = tokens.shape
        return entry.out[:b, n - 1 if fwd.last_only else 0 : n].clone()

    def _build(self, bucket: Bucket, ints: torch.Tensor, mask: torch.Tensor) -> Captured | None:
        """A bucket's buffers (filled with this step's inputs) and, on a GPU, its graph:
        warmed up on a side stream, then captured (CUDA's recipe); None if capture fails."""
        dev = self.model.device
        key = (bucket.batch, bucket.nodes)
        if key not in self.outs:
            shape = (bucket.batch, bucket.nodes, self.model.vocab_size)
            self.outs[key] = torch.empty(shape, dtype=torch.float32, device=dev)
        s_ints, s_mask, out = ints.to(dev), mask.to(dev), self.outs[key]

        def run() -> None:
            self._forward(bucket, s_ints, s_mask, out)

        if not self.capture:
            entry = Captured(s_ints, s_mask, out, run)
            self.buckets[bucket] = entry
            return entry
        current = torch.cuda.current_stream()
        try:
            side = torch.cuda.Stream()
            side.wait_stream(current)
            with torch.cuda.stream(side):
                run()
            current.wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                run()
        except Exception as exc:  # whatever stops a capture, the eager path serves
            torch.cuda.set_stream(current)  # a failed capture_end leaves its stream current
            self.failed = f"{bucket}: {exc!r}"
            return None
        entry = Captured(s_ints, s_mask, out, graph.replay)
        self.buckets[bucket] = entry
        return entry

    def _forward(
        self, bucket: Bucket, ints: torch.Tensor, mask: torch.Tensor, out: torch.Tensor
    ) -> None:
        """The padded forward on the static buffers: what a graph holds."""
        rows, n = bucket.batch, bucket.nodes
        tokens, positions = ints[: rows * n].view(rows, n), ints[rows * n : 2 * rows * n]
        lens, order, slots = ints[2 * rows * n :].view(3, rows)
        arange = self.model.cache.arange
        window = slots if bucket.gather else arange[:rows]
        cols = lens.unsqueeze(1) + arange[:n]
        step = Step(window, lens, window.unsqueeze(1).expand(rows, n), cols, bucket.span,
                    None if bucket.gather else 0, torch.zeros_like(lens))  # fmt: skip
        logits = eager_forward(
            self.model, step, tokens, positions.view(rows, n), mask, additive=True
        )
        torch.index_select(logits, 0, order, out=out)
