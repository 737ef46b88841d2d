"""Forwards of a few rows on the CPU (a tree's nodes at batch 1, a small batch) with each
layer's work between the attention calls in two C calls.

The small-row kernel (``smallm``) made a verify's products cost what one row's do; what was
left was the ~20 eager ops a layer runs around them (RMSNorm, RoPE, the residuals, SiLU x up,
reshapes): ~600 a step, each a dispatch and a small allocation, ~15 ms of a ~50 ms step at one
thread, which the plain step (``onerow``) has compiled into its regions. Compiling them for N
rows did not pay (dynamo's guards and the products as custom ops cost more than the fusion
saved), nor did each op as a C call of its own (its wrapper cost what the op did;
docs/trees.md). So a layer is two calls into the kernel's library, as ``onerow`` has two
regions: ``layer_pre`` (RMSNorm, the q/k/v product, RoPE) and ``layer_post`` (the output
product and residual, RMSNorm, the gate/up product, SiLU x up, the down product and residual),
each over all the forward's rows at once, with the residual stream updated in place. Attention
(the cache write, the CPU flash kernel) stays as every other forward runs it
(``attention.TreeAttention``), so a node attends by the same kernel as a plain token.
"""

from __future__ import annotations

from ctypes import CDLL
from typing import TYPE_CHECKING

import torch

from batchspec.engines.tree.weights import Weights

if TYPE_CHECKING:
    from batchspec.engines.tree.forward import Forward
    from batchspec.engines.tree.model import TreeModel


class FewRows:
    """The C forward of up to ``SMALL_ROWS`` rows for one model's weights."""

    def __init__(self, weights: Weights, lib: CDLL) -> None:
        self.weights, self.lib = weights, lib
        # Each layer's weight addresses, checked once: weights do not move, and the hot loop
        # would otherwise check and look up six tensors a layer a forward.
        self.pre = [_ptrs(m.attn_norm, m.qkv.small.packed) for m in weights.layers]
        self.post = [
            _ptrs(m.out.small.packed, m.mlp_norm, m.gate_up.small.packed, m.down.small.packed)
            for m in weights.layers
        ]

    @classmethod
    def of(cls, weights: Weights) -> FewRows | None:
        """The C forward where every matrix is in the kernel's panels (float32 on a CPU
        where the kernel is built), else None."""
        panels = [m.small for m in weights.linears()]
        if not panels or any(p is None for p in panels):
            return None
        return cls(weights, panels[0].lib)

    def forward(self, model: TreeModel, fwd: Forward) -> torch.Tensor:
        """``model``'s forward of B rows x N positions (``TreeModel._forward``'s contract);
        with ``fwd.packing``, every product over the real nodes alone (``packing``)."""
        tokens, positions, packing = fwd.tokens, fwd.positions, fwd.packing
        b, n = tokens.shape
        cfg, w = model.cfg, self.weights
        heads, kv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        dim, inter = cfg.hidden_size, cfg.intermediate_size
        step = model.cache.step(fwd.slots, n, fwd.offsets)
        mask = model.cache.mask(step, fwd.tree_mask, model.group)
        runs = model.attend.runs(step, mask, None if packing is None else packing.sizes)
        if packing is not None:
            tokens, positions = packing.pack(tokens), packing.pack(positions)
        rows = tokens.numel()
        cos, sin = model.rope[:, positions].reshape(2, rows, hd).contiguous()
        x = torch.empty(rows, dim, dtype=torch.float32, device=model.device)  # its own memory:
        x.copy_(w.embedding(tokens).reshape(rows, dim))  # updated in place, read as rows
        h, qkv = x.new_empty(rows, dim), x.new_empty(rows, (heads + 2 * kv) * hd)
        gate_up, act = x.new_empty(rows, 2 * inter), x.new_empty(rows, inter)
        threads, eps, lib = torch.get_num_threads(), model.eps, self.lib
        px, pcos, psin, ph, pqkv, pgu, pact = _ptrs(x, cos, sin, h, qkv, gate_up, act)
        padded = qkv if packing is None else qkv.new_zeros(b * n, qkv.shape[1])  # pads: zeros
        split = padded.view(b, n, heads + 2 * kv, hd)
        for i in range(len(w.layers)):
            model.tap(i, x if packing else x.view(b, n, dim), packing)
            (norm, p_qkv), (p_out, mlp_norm, p_gu, p_down) = self.pre[i], self.post[i]
            lib.layer_pre(
                px, norm, eps, p_qkv, pcos, psin, ph, pqkv,
                rows, dim, heads + kv, heads + 2 * kv, hd, threads,
            )  # fmt: skip
            if packing is not None:
                padded.view(b * n, -1).index_copy_(0, packing.index, qkv)
            o = model.attend(i, split[:, :, : heads + kv], split[:, :, heads + kv :], step, runs)
            o = o.contiguous() if packing is None else packing.pack(o)  # held until the call
            (po,) = _ptrs(o)  # returns: C reads its address
            lib.layer_post(
                px, po, p_out, mlp_norm, eps, p_gu, p_down, ph, pgu, pact,
                rows, dim, heads * hd, inter, threads,
            )  # fmt: skip
        model.tap(len(w.layers), x if packing else x.view(b, n, dim), packing)
        if fwd.last_only:
            x = x[-1:]
        logits = w.head(model.ops.rms_norm(x, w.norm, eps)).float()
        if packing is not None:
            return packing.unpack(logits)
        return logits.view(b, -1 if fwd.last_only else n, cfg.vocab_size)


def _ptrs(*tensors: torch.Tensor) -> list[int]:
    """Data addresses for the C calls; every tensor float32 and contiguous, as C reads it."""
    for t in tensors:
        if t.dtype != torch.float32 or not t.is_contiguous():
            raise TypeError(
                f"few-row forward: {t.dtype} {tuple(t.shape)} is not contiguous float32"
            )
    return [t.data_ptr() for t in tensors]
