"""Tree attention over the static KV cache: the new nodes' K and V written as scratch behind
each row's committed prefix, then scaled-dot-product calls over the cache's live span.

Query heads are grouped by their KV head into the query-length axis ([B, kv_heads, group x
N, hd]), so grouped-query attention reads K and V once instead of repeating them per query
head; the boolean mask (``KVCache.mask``: prefix, ancestors, padding) is built once per
forward and shared by every layer. Every forward takes this path, eager or compiled
(``onerow``), so a tree node and a plainly decoded token attend by the same kernel.

One call over the whole batch pads every row to the widest tree and the longest context:
on the CPU, one row at K=4 among seven plain rows made every row attend as a 5-node tree
(attention 1.5 against 0.9 ms a layer at batch 8, 400 cached tokens; the products run over
the real nodes alone, ``packing``), and a short row reads as many cache positions as the
longest. So on the CPU a forward's rows are cut into contiguous runs (``runs``), each
attending in its own call at its own widest tree and longest context, where what the padding
would cost exceeds a call's overhead. On a GPU one call serves the batch: a captured graph
(``graphs``) needs the same calls every replay, and a launch costs more than the padding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import LlamaConfig

from batchspec.engines.tree.cache import KVCache, Step

CALL_US, KEY_US, NODE_KEY_US = 65.0, 0.25, 0.037
"""The CPU's attention cost (µs; fitted to a layer's attention inside batch-8 steps of the
embedded model, 1-8 nodes, 1-8 calls, 400 cached tokens): a call (its slices, reshapes and
output copy included), each cache position a row reads (K and V from memory), and each
further query node per position. ``runs`` weighs them; only their ratios
matter."""


@dataclass(frozen=True)
class Run:
    """Rows ``start:end`` of a forward attending in one call: their first ``nodes`` nodes
    over the first ``span`` cache positions, under ``mask`` [rows, 1, group x nodes, span]."""

    start: int
    end: int
    nodes: int
    span: int
    mask: torch.Tensor


class TreeAttention:
    """Attention of B rows x N nodes over ``cache``, one layer at a time."""

    def __init__(self, cfg: LlamaConfig, cache: KVCache, device: str) -> None:
        self.cache = cache
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.group = self.heads // self.kv_heads
        # On CUDA, PyTorch's default SDPA choice for a boolean mask is cuDNN, which builds a new
        # plan for every KV length: 1.2 ms of CPU per call, 50 ms a step for a 7B shape on an
        # H200 against 13.7 ms with memory-efficient attention (2026-11-30, B=1..8, N=1..16).
        self.backends = (
            None
            if str(device).startswith("cpu")
            else [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]
        )

    def runs(self, step: Step, mask: torch.Tensor, sizes: list[int] | None = None) -> list[Run]:
        """The calls a forward's attention makes, each layer alike: ``mask`` is the step's
        (``KVCache.mask``, boolean or additive), ``sizes`` each row's real nodes (None: all
        N). One run of every row on a GPU or where cutting would not pay (``partition``)."""
        b, n = step.rows.shape
        whole = [Run(0, b, n, step.span, mask)]
        if self.backends is not None or b == 1:
            return whole
        base = (step.lens + step.offsets).tolist()
        cuts = partition(base, sizes or [n] * b)
        if len(cuts) == 1 and cuts[0][2] == n and cuts[0][3] == step.span:
            return whole
        by_node = mask.view(b, self.group, n, step.span)
        return [
            Run(s, e, m, span, by_node[s:e, :, :m, :span].reshape(e - s, 1, -1, span))
            for s, e, m, span in cuts
        ]

    def __call__(
        self, index: int, qk: torch.Tensor, v: torch.Tensor, step: Step, runs: list[Run]
    ) -> torch.Tensor:
        """Write the nodes' K and V (``qk`` [B, N, heads + kv_heads, hd] after RoPE, ``v``),
        attend over the cache at layer ``index`` by ``runs``; the heads' outputs [B, N,
        heads * hd] (zeros past a run's nodes)."""
        b, n, _, hd = qk.shape
        self.cache.write(index, step, qk[:, :, self.heads :], v)
        if len(runs) == 1:
            return self._run(index, qk, step, runs[0])
        out = qk.new_zeros(b, n, self.heads * hd)
        for run in runs:
            out[run.start : run.end, : run.nodes] = self._run(index, qk, step, run)
        return out

    def _run(self, index: int, qk: torch.Tensor, step: Step, run: Run) -> torch.Tensor:
        """One call: the run's queries over its span; [rows, nodes, heads * hd]."""
        hd, kv_heads, group = qk.shape[3], self.kv_heads, self.group
        rows, n = run.end - run.start, run.nodes
        q = qk[run.start : run.end, :n, : self.heads]
        keys, values = self.cache.read(index, step, run.start, run.end, run.span)
        q = q.reshape(rows, n, kv_heads, group, hd).permute(0, 2, 3, 1, 4)
        q = q.reshape(rows, kv_heads, group * n, hd)
        if self.backends is None:
            o = F.scaled_dot_product_attention(q, keys, values, attn_mask=run.mask)
        else:
            with sdpa_kernel(self.backends):
                o = F.scaled_dot_product_attention(q, keys, values, attn_mask=run.mask)
        o = o.view(rows, kv_heads, group, n, hd).permute(0, 3, 1, 2, 4)
        return o.reshape(rows, n, self.heads * hd)


def partition(base: list[int], sizes: list[int]) -> list[tuple[int, int, int, int]]:
    """Contiguous runs ``(start, end, nodes, span)`` of rows whose new nodes sit behind
    ``base`` cache positions (committed and earlier scratch) and number ``sizes``: the cut
    that minimises the modelled cost (``CALL_US`` a run, and each row reading its run's span
    for its run's widest tree), by dynamic programming over where the last run starts.
    Quadratic in the batch, with a pure-Python inner step: ~1 ms at 64 rows."""
    b = len(base)
    best, cut = [0.0] + [math.inf] * b, [0] * (b + 1)
    for end in range(1, b + 1):
        widest = longest = 0
        for start in range(end - 1, -1, -1):
            widest, longest = max(widest, sizes[start]), max(longest, base[start])
            per_row = (longest + widest) * (KEY_US + NODE_KEY_US * (widest - 1))
            cost = best[start] + CALL_US + (end - start) * per_row
            if cost < best[end]:
                best[end], cut[end] = cost, start
    runs, end = [], b
    while end:
        start = cut[end]
        widest, longest = max(sizes[start:end]), max(base[start:end])
        runs.append((start, end, widest, longest + widest))
        end = start
    return runs[::-1]
