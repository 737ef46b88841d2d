"""The tree engine's target model: a lean Llama forward in plain PyTorch on the HF weights.

Why not transformers' own model: a draft-tree verify needs each row's nodes to attend to that
row's cached prefix plus an arbitrary ancestor mask, with rows of different cache lengths in
one batch, and plain decoding at batch 1 must come near the memory-bandwidth bound. Both want
a static, preallocated cache (``cache.KVCache``) and as little per-step work as possible:

- weights fused at load, and each matrix product run by the kernel that is fastest for its
  row count (``weights.Linear``): four products a layer;
- tree attention (``attention.TreeAttention``) groups query heads by their KV head, so K/V
  are read without repeating them, over only the first max(cache_len) + N cache positions,
  with one boolean mask built per forward, not per layer;
- on the CPU, a forward of up to 64 rows runs each layer's work between its attention calls
  as two calls into C (``fewrows``), plain steps at batch 1 included;
- RoPE tables are computed once for all positions; a node's angle comes from its ``position``
  (cache_len + depth), not from where its KV sits in the cache;
- on a GPU, verify forwards replay CUDA graphs captured per (batch, nodes, span) bucket
  (``graphs.py``), with the element-wise ops between the products compiled (``ops.py``):
  eager, a step is bound by its kernels, not by the weights (7B shape on an H200, batch 1:
  24.6 ms eager, 5.26 ms = 61% of the copy bandwidth on graphs).
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import torch
from transformers import LlamaConfig

from batchspec.engines.tree import ops
from batchspec.engines.tree.attention import TreeAttention
from batchspec.engines.tree.cache import KVCache
from batchspec.engines.tree.eager import eager_forward
from batchspec.engines.tree.fewrows import FewRows
from batchspec.engines.tree.forward import Forward
from batchspec.engines.tree.graphs import CudaGraphs
from batchspec.engines.tree.onerow import OneRow
from batchspec.engines.tree.packing import Packing
from batchspec.engines.tree.weights import (
    SMALL_ROWS,
    Weights,
    convert,
    llama_config,
    random_weights,
    read_weights,
    rope_tables,
)

PREFILL_CHUNK = 512
"""Prompt tokens per prefill forward: bounds the attention mask and activations of one pass."""
GRAPHS_ENV = "BATCHSPEC_CUDA_GRAPHS"
"""Set to 0 to keep a CUDA model's verify forwards eager (no graph capture)."""


class TreeModel:
    """A Llama-family causal LM with a static KV cache of ``max_batch`` slots x ``max_len``.

    ``prefill`` fills a slot with a prompt; ``verify`` runs B rows x N tree nodes in one
    forward (nothing committed); ``commit`` keeps one path of a row's last verify; ``release``
    frees a slot. Plain decoding is verify with N = 1 followed by commit([0]).

    It sets no thread count (process-wide state is the caller's). On the CPU the process wants
    THP_MEM_ALLOC_ENABLE=1 in its environment before torch is imported (huge pages for the
    weights: a plain batch-1 step ~5% faster here; the CLI sets it, ``cli._huge_pages``), and
    OMP_WAIT_POLICY=PASSIVE only where other processes share its cores (docs/trees.md says
    why and what each is worth).
    """

    def __init__(
        self, cfg: LlamaConfig, weights: Weights, device: str, max_batch: int, max_len: int
    ) -> None:
        self.cfg = cfg
        self.weights = weights
        self.dtype, self.device = weights.norm.dtype, device
        self.max_batch, self.max_len = max_batch, max_len
        self.vocab_size = cfg.vocab_size
        self.group = cfg.num_attention_heads // cfg.num_key_value_heads
        self.eps = cfg.rms_norm_eps
        self.rope = rope_tables(cfg, max_len, self.dtype, device)
        self.cache = KVCache(
            cfg.num_hidden_layers,
            max_batch,
            cfg.num_key_value_heads,
            max_len,
            cfg.head_dim,
            self.dtype,
            device,
        )
        self.attend = TreeAttention(cfg, self.cache, device)
        causal = torch.ones(PREFILL_CHUNK, PREFILL_CHUNK, dtype=torch.bool, device=device)
        self._causal = causal.tril()
        self.one_row: OneRow | None = None
        """Compiled one-row decoding, when taken (``use_one_row_kernel``)."""
        self.few_rows = FewRows.of(weights) if device == "cpu" else None
        self.packs = device == "cpu"
        """Verify forwards run their products over the trees' real nodes (``packing``): on
        the CPU, where a product costs its rows; on a GPU, at a verify's few rows, a product
        costs the weights' read whatever the rows, and packing would only add launches."""
        """Forwards of up to ``SMALL_ROWS`` rows in C (``fewrows``), where the kernel is built."""
        self.graphs: CudaGraphs | None = None
        """Verify forwards by captured CUDA graphs (``graphs.py``): on by default on a GPU."""
        self.ops = ops.EAGER
        """The element-wise ops between the products (``ops.py``): compiled with graphs."""
        if str(device).startswith("cuda") and os.environ.get(GRAPHS_ENV, "1") != "0":
            self.graphs, self.ops = CudaGraphs(self), ops.fused()

    @classmethod
    def load(
        cls, model_dir: Path, dtype: torch.dtype, device: str, max_batch: int, max_len: int
    ) -> TreeModel:
        """Read a HF Llama directory's config.json and safetensors weights."""
        config = json.loads((Path(model_dir) / "config.json").read_text())
        cfg = llama_config(config)
        weights = convert(cfg, read_weights(Path(model_dir)), dtype, device)
        return cls(cfg, weights, device, max_batch, max_len)

    @classmethod
    def random(
        cls,
        config: dict[str, Any],
        dtype: torch.dtype,
        device: str,
        max_batch: int,
        max_len: int,
    ) -> TreeModel:
        """Random weights of a given config: step cost does not depend on the values, so this
        measures models whose weights are not at hand (7B-class on a GPU)."""
        cfg = llama_config(config)
        weights = convert(cfg, random_weights(cfg, dtype, device), dtype, device)
        return cls(cfg, weights, device, max_batch, max_len)

    def layers_only(self, layers: list[int], max_batch: int, max_len: int) -> TreeModel:
        """A model of only ``layers`` of this one (self-speculation's draft: LayerSkip, Draft
        & Verify), sharing its weight tensors, with a cache of its own."""
        if not layers or max(layers) >= len(self.weights.layers):
            raise ValueError(f"layers {layers}: this model has {len(self.weights.layers)}")
        cfg = copy.deepcopy(self.cfg)
        cfg.num_hidden_layers = len(layers)
        w = self.weights
        kept = Weights([w.layers[i] for i in layers], w.norm, w.head, w.embed)
        draft = TreeModel(cfg, kept, self.device, max_batch, max_len)
        draft.one_row = self.one_row  # the same shapes: the same compiled regions
        return draft

    def use_one_row_kernel(self) -> bool:
        """Decode single rows (plain decoding at batch 1) by inductor-compiled regions
        (``onerow``) instead of eager ops on MKL's matrix-vector product; False where it does
        not apply (not float32 on the CPU) or does not compile (no C++ compiler), and the
        eager path stays.

        It costs a compile per region and shape at the start (seconds; inductor keeps them
        on disk for the next process), so the engine takes it at batch 1 only, where every
        step is one row; a batch of several rows has single rows only as it drains. Where
        the C forward is built (``few_rows``) it serves single rows instead (faster, nothing
        to compile: docs/trees.md) and this is False.
        """
        if self.device != "cpu" or self.dtype != torch.float32 or self.few_rows is not None:
            return False
        for lin in self.weights.linears():
            lin.keep_rows()
        self.one_row = OneRow()
        try:
            self.one_row.warm(self)
        except Exception:  # whatever stops inductor, the eager path serves
            self.one_row = None
            return False
        return True

    @property
    def cache_len(self) -> list[int]:
        """Committed length of every slot (a copy)."""
        return list(self.cache.lens)

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights one decode step reads (``Weights.step_bytes``)."""
        return self.weights.step_bytes()

    @torch.inference_mode()
    def prefill(self, slot: int, tokens: list[int]) -> torch.Tensor:
        """Write a prompt's KV into ``slot`` (its length becomes len(tokens)) and return the
        float32 logits [vocab] of the last position. Long prompts go in chunks."""
        if not tokens:
            raise ValueError("prefill needs at least one token")
        self.cache.lens[slot] = 0
        ids = torch.tensor(tokens, dtype=torch.long, device=self.device)
        logits = None
        for start in range(0, len(tokens), PREFILL_CHUNK):
            chunk = ids[start : start + PREFILL_CHUNK].unsqueeze(0)
            n = chunk.shape[1]
            positions = self.cache.arange[start : start + n].unsqueeze(0)
            mask = self._causal[:n, :n].unsqueeze(0)
            fwd = Forward([slot], chunk, positions, mask, last_only=True)
            # one replay on a GPU where eager launches every kernel of every layer
            logits = None if self.graphs is None else self.graphs.forward(fwd)
            if logits is None:
                logits = self._forward(fwd)
            self.cache.lens[slot] += n
        return logits[0, -1]

    @torch.inference_mode()
    def verify(
        self,
        slots: list[int],
        tokens: torch.Tensor,
        positions: torch.Tensor,
        tree_mask: torch.Tensor,
        offsets: list[int] | None = None,
        sizes: list[int] | None = None,
    ) -> torch.Tensor:
        """Logits float32 [B, N, vocab] of every node of B rows' trees in one forward.

        Row b's node i attends to slot ``slots[b]``'s committed prefix and to the nodes
        ``tree_mask[b, i]`` allows; its RoPE angle is ``positions[b, i]`` (cache_len + depth).
        The nodes' KV land at cache_len + i as scratch; cache lengths do not change until
        ``commit``. With ``offsets`` (a draft tree fed depth by depth), row b's nodes land at
        cache_len + offsets[b] + i instead, behind nodes an earlier forward wrote, and
        ``tree_mask`` [B, N, W] has a column per scratch position (``KVCache.mask``). With
        ``sizes`` (each row's tree's nodes, root included), the products run over those nodes
        alone (``packing``), and a row's logits past its tree are zeros.
        """
        b, n = tokens.shape
        w = n + (max(offsets) if offsets else 0)
        if len(slots) != b or positions.shape != (b, n) or tree_mask.shape != (b, n, w):
            raise ValueError(
                f"verify: {len(slots)} slots, tokens {tuple(tokens.shape)}, positions "
                f"{tuple(positions.shape)}, tree_mask {tuple(tree_mask.shape)} do not agree"
            )
        if self.graphs is not None and not offsets:
            logits = self.graphs.forward(Forward(slots, tokens, positions, tree_mask))
            if logits is not None:
                return logits
        dev = self.device
        tokens, positions, tree_mask = tokens.to(dev), positions.to(dev), tree_mask.to(dev)
        packing = Packing.of(sizes, n, dev) if self.packs else None
        return self._forward(Forward(slots, tokens, positions, tree_mask, offsets, packing=packing))

    def commit(self, slot: int, nodes: list[int]) -> None:
        """Keep the path ``nodes`` (root 0 first, depth order) of the slot's last verify."""
        self.cache.commit(slot, nodes)

    def release(self, slot: int) -> None:
        """Free ``slot`` for the next row; other slots are untouched."""
        self.cache.release(slot)

    def share_prefix(self, src: int, dst: int, n: int) -> None:
        """Start slot ``dst`` with the first ``n`` positions of ``src``'s cache."""
        self.cache.share_prefix(src, dst, n)

    def move(self, src: int, dst: int) -> None:
        """Move a row from slot ``src`` to the free slot ``dst`` (``KVCache.move``)."""
        self.cache.move(src, dst)

    def _forward(self, fwd: Forward) -> torch.Tensor:
        """Run the layers over [B, N] new positions (their real nodes: ``fwd.packing``);
        logits of all of them or the last one, by the fastest path that serves the shape."""
        rows = fwd.tokens.numel() if fwd.packing is None else fwd.packing.rows
        if self.few_rows is not None and rows <= SMALL_ROWS:
            return self.few_rows.forward(self, fwd)
        if self.one_row is not None and fwd.tokens.numel() == 1:
            return self.one_row.forward(self, fwd)
        step = self.cache.step(fwd.slots, fwd.tokens.shape[1], fwd.offsets)
        args = (fwd.tokens, fwd.positions, fwd.tree_mask, fwd.last_only)
        return eager_forward(self, step, *args, packing=fwd.packing)

    def tap(self, index: int, x: torch.Tensor, packing: Packing | None) -> None:
        """The residual stream [B, N, hidden] entering layer ``index`` (the layer count: the
        last layer's output, before the final norm), or its real nodes [T, hidden] with
        ``packing``, for a subclass that keeps some (``eagle_head.TappedModel``); the C
        forward updates ``x`` in place after this returns."""
