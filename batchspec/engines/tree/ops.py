"""The small element-wise ops a decoder layer runs between its matrix products, in one place.

Why a module of their own: on a GPU each of them is several kernels (RMSNorm alone is eight in
bfloat16), and a batch-1 step is bound by how many kernels it runs, not by the weights. The
model calls them through its ``ops`` (``self.ops.rms_norm(...)``): ``EAGER``, the reference
the tests compare against, or ``fused()``, each compiled by inductor into one kernel, which a
model on a GPU takes with its CUDA graphs (on an H200, 7B shape, batch 1, on graphs: 6.61 ->
5.26 ms a step, 1,086 -> 471 kernels; docs/trees.md). On the CPU they do not pay (a 5-node
verify of the 135M model: 98 ms compiled against 84 as written), so the CPU keeps them as
written; its batch-1 path (``onerow.py``) compiles regions of its own.
"""

from __future__ import annotations

from functools import cache
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama's RMSNorm as transformers computes it (in float32, then the weight in the input's
    dtype); float64 stays float64, so a float64 model is a rounding-free reference for the
    tests. Written out because ``F.rms_norm`` took ~60 us a call on this CPU at one row, 3.7
    ms of a 45 ms decode step over its 61 calls; these four ops made decoding ~7% faster."""
    xf = x if x.dtype == torch.float64 else x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def add_rms_norm(
    x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual ``x + delta`` and its RMSNorm: one kernel when fused."""
    x = x + delta
    return x, rms_norm(x, weight, eps)


def rope(qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of queries and keys [.., heads, head_dim] in the half-split layout
    (``sin`` carries the rotation's sign)."""
    return qk * cos + qk.roll(qk.shape[-1] // 2, dims=-1) * sin


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) x up of the fused gate-and-up product's two halves."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


NAMES = ("rms_norm", "add_rms_norm", "rope", "silu_mul")
EAGER = SimpleNamespace(**{name: globals()[name] for name in NAMES})
"""The ops as written: what the CPU and the tests run."""


@cache
def fused(backend: Any = "inductor") -> SimpleNamespace:
    """Every op compiled by ``backend`` (one set per process and backend, shared by its models;
    the tests count compilations with a backend of their own). Each is called on its inputs
    flattened to [tokens, ...], so that one dimension alone varies with the step's rows and
    nodes and compiles as dynamic: two compilations an op (one token, and any number), where
    [rows, nodes, ...] shapes hit dynamo's limit of 8 recompilations on the tree engine's
    buckets and fell back to eager. Compilation happens on an op's first call of a shape, so a
    CUDA graph must be warmed up before its capture (``graphs.py`` is)."""
    c = {name: torch.compile(getattr(EAGER, name), dynamic=True, backend=backend) for name in NAMES}

    def norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return c["rms_norm"](x.flatten(0, -2), weight, eps).view(x.shape)

    def add_norm(
        x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        s, h = c["add_rms_norm"](x.flatten(0, -2), delta.flatten(0, -2), weight, eps)
        return s.view(x.shape), h.view(x.shape)

    def rotate(qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """``qk`` [rows, nodes, heads, head_dim], ``cos``/``sin`` [rows, nodes, 1, head_dim]."""
        return c["rope"](qk.flatten(0, 1), cos.flatten(0, 1), sin.flatten(0, 1)).view(qk.shape)

    def gated(gate_up: torch.Tensor) -> torch.Tensor:
        return c["silu_mul"](gate_up.flatten(0, -2)).view(*gate_up.shape[:-1], -1)

    return SimpleNamespace(rms_norm=norm, add_rms_norm=add_norm, rope=rotate, silu_mul=gated)
