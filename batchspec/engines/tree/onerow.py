"""One-row decoding on the CPU (plain decoding at batch 1) as inductor-generated kernels, where
the C forward (``fewrows``) is not built (no AVX2, not x86): that one serves single rows faster
(0.75x this step's time here, docs/trees.md) with nothing to compile.

At batch 1 a decode step is ~120 matrix-vector products and ~600 small ops around them. MKL's
matrix-vector kernel read the weights at ~17 GB/s here, half of what the machine streams, and
every small op costs a dispatch. So the step's work between the attention calls is compiled
(``torch.compile``, inductor's C++ backend) in two regions per layer, with every product
written as a reduction (``(W * x).sum(-1)``), which inductor turns into a kernel that reads W
once:

- ``pre``: RMSNorm, the fused q/k/v product and RoPE;
- ``post``: the attention output's product and residual, RMSNorm, the fused gate/up product,
  SiLU x up, the down product and residual;

and ``head`` (final RMSNorm and the output product). Attention itself (the KV cache write, the
CPU flash kernel) stays eager. Regions take tensors only, so each compiles once per shape, not
per layer; they are compiled at start (``OneRow.warm``), in the forwards' inference mode.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from batchspec.engines.tree.forward import Forward
    from batchspec.engines.tree.model import TreeModel

Fn = Callable[..., torch.Tensor]


def _norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm as transformers computes it (``ops.rms_norm``)."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def _pre(
    x: torch.Tensor,
    norm: torch.Tensor,
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
    heads: int,
    kv_heads: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [hidden] -> (q and k with RoPE [heads + kv_heads, head_dim], v [kv_heads, head_dim])."""
    h = _norm(x, norm, eps)
    out = (qkv * h).sum(-1).view(heads + 2 * kv_heads, -1)
    qk, v = out[: heads + kv_heads], out[heads + kv_heads :]
    hd = qk.shape[-1]
    return qk * cos + qk.roll(hd // 2, dims=-1) * sin, v


def _post(
    x: torch.Tensor,
    o: torch.Tensor,
    out_w: torch.Tensor,
    norm: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    """The rest of a layer after attention, for one row: x [hidden], o [heads * head_dim]."""
    x = x + (out_w * o).sum(-1)
    h = _norm(x, norm, eps)
    gu = (gate_up * h).sum(-1)
    gate, up = gu.chunk(2)
    act = torch.nn.functional.silu(gate) * up
    return x + (down * act).sum(-1)


def _head(x: torch.Tensor, norm: torch.Tensor, head: torch.Tensor, eps: float) -> torch.Tensor:
    return (head * _norm(x, norm, eps)).sum(-1).float()


class OneRow:
    """The compiled regions (``pre``, ``post``, ``head``), shared by every layer."""

    def __init__(self) -> None:
        self.pre: Fn = torch.compile(_pre, dynamic=False)
        self.post: Fn = torch.compile(_post, dynamic=False)
        self.head: Fn = torch.compile(_head, dynamic=False)

    def forward(self, model: TreeModel, fwd: Forward) -> torch.Tensor:
        """``model``'s forward of one row and one position (``TreeModel._forward``'s
        contract) by these regions, attention eager between them."""
        step = model.cache.step(fwd.slots, 1, fwd.offsets)
        runs = model.attend.runs(step, model.cache.mask(step, fwd.tree_mask, model.group))
        cfg, w = model.cfg, model.weights
        heads, kv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        cos, sin = model.rope[:, fwd.positions].reshape(2, 1, hd)
        x = w.embedding(fwd.tokens).view(-1)
        for i, layer in enumerate(w.layers):
            qk, v = self.pre(x, layer.attn_norm, layer.qkv.w, cos, sin, model.eps, heads, kv)
            o = model.attend(i, qk.view(1, 1, heads + kv, hd), v.view(1, 1, kv, hd), step, runs)
            rest = (layer.out.w, layer.mlp_norm, layer.gate_up.w, layer.down.w)
            x = self.post(x, o.view(-1), *rest, model.eps)
        return self.head(x, w.norm, w.head.w, model.eps).view(1, 1, -1)

    def warm(self, model: TreeModel) -> None:
        """Compile the regions now, as decoding calls them: in inference mode, on weights
        made outside it (dynamo's guards check the grad mode and each tensor's kind; a
        mismatch would compile them again mid-run)."""
        slot = model.cache.lens.index(0) if 0 in model.cache.lens else 0
        model.prefill(slot, [0])
        model.verify(
            [slot],
            torch.zeros(1, 1, dtype=torch.long),
            torch.ones(1, 1, dtype=torch.long),
            torch.ones(1, 1, 1, dtype=torch.bool),
        )
        model.release(slot)
