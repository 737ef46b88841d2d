"""The tree engine's forward in PyTorch ops: every layer and the head over a forward's new
positions, for whatever ``fewrows`` (up to 64 rows in C on the CPU) and ``onerow`` (a compiled
single row) do not serve, and inside each captured CUDA graph (``graphs``). With a ``Packing``
the products run over the trees' real nodes alone and attention over runs of rows at each
run's widest tree (``attention``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from batchspec.engines.tree.attention import Run
from batchspec.engines.tree.cache import Step
from batchspec.engines.tree.packing import Packing
from batchspec.engines.tree.weights import Layer

if TYPE_CHECKING:
    from batchspec.engines.tree.model import TreeModel


def eager_forward(
    model: TreeModel,
    step: Step,
    tokens: torch.Tensor,
    positions: torch.Tensor,
    tree_mask: torch.Tensor,
    last_only: bool = False,
    additive: bool = False,
    packing: Packing | None = None,
) -> torch.Tensor:
    """Every layer and the head over ``step``'s new positions (their real nodes:
    ``packing``). ``additive``: the mask as 0/-inf in the model's dtype, made once per
    forward; the attention would otherwise turn the boolean mask into that in every
    layer (three kernels each on a GPU)."""
    mask = model.cache.mask(step, tree_mask, model.group)
    if additive:
        mask = torch.zeros_like(mask, dtype=model.dtype).masked_fill_(~mask, float("-inf"))
    runs = model.attend.runs(step, mask, None if packing is None else packing.sizes)
    cos, sin = model.rope[:, positions].unsqueeze(3)
    x = model.weights.embedding(tokens if packing is None else packing.pack(tokens))
    for i, layer in enumerate(model.weights.layers):
        model.tap(i, x, packing)
        x = _layer(model, i, layer, x, step, runs, cos, sin, packing)
    model.tap(len(model.weights.layers), x, packing)
    if last_only:
        x = x[:, -1:]
    x = model.ops.rms_norm(x, model.weights.norm, model.eps)
    logits = model.weights.head(x).float()
    return logits if packing is None else packing.unpack(logits)


def _layer(
    model: TreeModel,
    index: int,
    layer: Layer,
    x: torch.Tensor,
    step: Step,
    runs: list[Run],
    cos: torch.Tensor,
    sin: torch.Tensor,
    packing: Packing | None = None,
) -> torch.Tensor:
    """One decoder layer: attention of the new nodes over the cache (their KV written first;
    packed nodes attend in the padded layout, one call per run of ``runs``, their pads zeros:
    ``packing``) and the SiLU MLP, each behind an RMSNorm and a residual."""
    b, n = step.rows.shape
    heads, kv_heads = model.cfg.num_attention_heads, model.cfg.num_key_value_heads
    qkv = layer.qkv(model.ops.rms_norm(x, layer.attn_norm, model.eps))
    qkv = (qkv if packing is None else packing.unpack(qkv)).view(b, n, -1, model.cfg.head_dim)
    qk, v = qkv[:, :, : heads + kv_heads], qkv[:, :, heads + kv_heads :]
    o = model.attend(index, model.ops.rope(qk, cos, sin), v, step, runs)
    attended = layer.out(o if packing is None else packing.pack(o))
    x, h = model.ops.add_rms_norm(x, attended, layer.mlp_norm, model.eps)
    return x + layer.down(model.ops.silu_mul(layer.gate_up(h)))
