"""The tree engine's model weights: read from HF safetensors (or drawn at random) and laid out
for a fast forward.

q/k/v and gate/up are fused into one matrix each, so a layer runs four matrix products instead
of seven, and each product runs by the kernel that was fastest for its row count on this CPU
(``Linear``; figures from 2026-11-30: float32, one thread, all 30 layers' matrices of the
embedded model, best of 7). A tied embedding is kept once, as the output head; a token's
embedding is a column gather from it.
"""

from __future__ import annotations

from ctypes import CDLL
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from batchspec.engines.tree.smallm import Panels, small_kernel
from batchspec.errors import UserError
from batchspec.models import read_safetensors

STATIC_ROPE = {"default", "linear", "llama3", "yarn"}
"""RoPE variants whose angles depend on the position only (not on the sequence length)."""
SMALL_ROWS = 64
"""Up to this many rows a product runs by the small-row kernel (``smallm``), where it is
built. All the model's matrices, ms, kernel against oneDNN's packed product (2026-12-05, ABBA
in one process, one thread): 8 rows 41.7 / 82.8, 16 rows 71.8 / 108.3, 24 rows 99.2 / 129.6,
32 rows 124.1 / 156.9, 48 rows 182.0 / 204.1, 64 rows 250.9 / 282.5, 96 rows 368.8 / 391.8;
two threads: 24 rows 51.6 / 74.2, 48 rows 96.4 / 139.1, 64 rows 127.8 / 158.1, 96 rows 195.6
/ 216.0 (while the kernel streamed the weights once per 8 rows, oneDNN won from 40 rows). Up
to 64 rows takes a batch of 8 rows' 7-node trees, and a prefill of up to 64 tokens."""
MIN_PACKED_ROWS = 4
"""oneDNN's product of 2 rows took 1.35x the time of 4 rows here (all the model's matrices, CPU
time 47 vs 35 ms): fewer rows are padded with zeros up to this."""


class Linear:
    """``x @ W.T`` for one weight matrix W [out, in], by the fastest kernel for the row count.

    One row (plain decoding at batch 1), where the kernel below is not built, is MKL's
    matrix-vector product, whose speed depends on the layout: W stored [in, out] reads 1.5-2x
    faster when out >= in (q/k/v 4.2 vs 5.8 ms, gate/up 10.7 vs 18.9, head 5.1 vs 9.9), HF's
    [out, in] when in > out (down 6.9 vs 8.8).
    Several rows (tree verify, batches, prefill): MKL's GEMM is far from the memory bound at
    2-16 rows (4 rows 51 ms, 16 rows 76 ms), oneDNN on weights packed once for it is not (17
    and 34 ms), and the project's own kernel for a few rows less so (``smallm``). So on the CPU
    a matrix is kept packed for oneDNN (prefill, large batches) and in panels for the kernel (1
    to ``SMALL_ROWS`` rows), plain only where one of those is missing or for the output head
    (the tied embedding, distillation); elsewhere (CUDA) plain only.
    """

    def __init__(
        self, weight: torch.Tensor, pack: bool, kernel: CDLL | None = None, plain: bool = True
    ) -> None:
        out, inner = weight.shape
        self.bytes = weight.numel() * weight.element_size()
        """Bytes of the matrix: what a one-row product reads."""
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, None) if pack else None
        self.small = Panels(weight, kernel) if kernel and Panels.fits(weight) else None
        """The matrix in the small-row kernel's panels (None: oneDNN takes every row count)."""
        # With both kernels' copies, nothing reads the plain one unless asked (``plain``: the
        # tied embedding gathers from the head's): a third of the weights' memory.
        keep = plain or self.small is None or self.packed is None
        self.t = weight.t().contiguous() if keep and out >= inner else None
        """W.T [in, out] when that layout is the one kept, else None (``w`` is, or neither)."""
        self.w = weight if keep and self.t is None else None

    def keep_rows(self) -> None:
        """Keep W [out, in] (what ``onerow``'s compiled regions read), not W.T; from the
        panels where no plain copy was kept."""
        if self.t is not None:
            self.w, self.t = self.t.t().contiguous(), None
        elif self.w is None and self.small is not None:
            packed = self.small.packed  # [out / 8, in, 8]
            self.w = packed.transpose(1, 2).reshape(self.small.out, self.small.inner).contiguous()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if self.small is not None and rows <= SMALL_ROWS:
            return self.small(x)
        if self.packed is None or rows == 1:
            return x @ self.t if self.w is None else F.linear(x, self.w)
        if rows >= MIN_PACKED_ROWS:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, None, "none", [], "")
        flat = x.reshape(rows, -1)
        flat = torch.cat([flat, flat.new_zeros(MIN_PACKED_ROWS - rows, flat.shape[1])])
        out = torch.ops.mkldnn._linear_pointwise(flat, self.packed, None, "none", [], "")
        return out[:rows].reshape(*x.shape[:-1], -1)


@dataclass
class Layer:
    """One decoder layer's weights."""

    attn_norm: torch.Tensor
    qkv: Linear
    out: Linear
    mlp_norm: torch.Tensor
    gate_up: Linear
    down: Linear


@dataclass
class Weights:
    """All weights of a model, converted to the forward's dtype, device and layout."""

    layers: list[Layer]
    norm: torch.Tensor
    head: Linear
    """The output head; its plain [hidden, vocab] matrix is also the embedding table when
    ``embed`` is None."""
    embed: torch.Tensor | None
    """An untied input embedding [vocab, hidden], else None."""

    def embedding(self, tokens: torch.Tensor) -> torch.Tensor:
        """Input embeddings [*tokens.shape, hidden]; from the head's matrix when tied."""
        if self.embed is not None:
            return self.embed[tokens]
        if self.head.t is None:
            return self.head.w[tokens]
        flat = self.head.t.index_select(1, tokens.reshape(-1)).t()
        return flat.reshape(*tokens.shape, -1)

    def linears(self) -> list[Linear]:
        """Every matrix, the head last."""
        mats = [m for layer in self.layers for m in (layer.qkv, layer.out, layer.gate_up)]
        return mats + [layer.down for layer in self.layers] + [self.head]

    def step_bytes(self) -> int:
        """Bytes one decode step reads: every matrix and norm and the output head once; an
        untied input embedding is only gathered from, so it does not count."""
        norms = [self.norm] + [
            n for layer in self.layers for n in (layer.attn_norm, layer.mlp_norm)
        ]
        return sum(m.bytes for m in self.linears()) + sum(
            t.numel() * t.element_size() for t in norms
        )


def llama_config(config: dict[str, Any] | LlamaConfig) -> LlamaConfig:
    """A LlamaConfig from a config.json dict; refuses variants this forward does not compute."""
    cfg = config if isinstance(config, LlamaConfig) else LlamaConfig(**config)
    rope_type = (cfg.rope_parameters or {}).get("rope_type", "default")
    if getattr(cfg, "attention_bias", False) or getattr(cfg, "mlp_bias", False):
        raise UserError("tree engine: models with attention or MLP biases are not supported")
    if rope_type not in STATIC_ROPE:
        raise UserError(f"tree engine: RoPE type {rope_type!r} is not supported ({STATIC_ROPE})")
    if cfg.hidden_act != "silu":
        raise UserError(f"tree engine: activation {cfg.hidden_act!r} is not supported (silu)")
    return cfg


def rope_tables(cfg: LlamaConfig, max_len: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    """[2, max_len, head_dim]: cos, and sin with its first half negated, so that rotating x is
    x * cos + roll(x, half) * sin (HF's rotate_half without the cat). Angles are computed in
    float32 as transformers does, then cast."""
    rope_type = cfg.rope_parameters.get("rope_type", "default")
    if rope_type == "default":
        dim = cfg.head_dim
        theta = cfg.rope_parameters["rope_theta"]
        inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
        scale = 1.0
    else:
        inv_freq, scale = ROPE_INIT_FUNCTIONS[rope_type](cfg, None)
    angles = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq.float())
    cos, sin = angles.cos() * scale, angles.sin() * scale
    tables = torch.stack([torch.cat([cos, cos], -1), torch.cat([-sin, sin], -1)])
    return tables.to(device=device, dtype=dtype)


def read_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the directory's safetensors file(s), on the CPU as stored."""
    tensors = read_safetensors(model_dir)
    if not tensors:
        raise UserError(f"{model_dir}: no .safetensors weights (the tree engine reads only those)")
    return tensors


def random_weights(cfg: LlamaConfig, dtype: torch.dtype, device: str) -> dict[str, torch.Tensor]:
    """HF-named weights drawn like HF's init (normal, std initializer_range; norms 1)."""
    gen = torch.Generator(device=device).manual_seed(0)
    h, inter, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd

    def normal(*shape: int) -> torch.Tensor:
        w = torch.empty(shape, dtype=dtype, device=device)
        return w.normal_(0.0, cfg.initializer_range, generator=gen)

    out = {"model.embed_tokens.weight": normal(cfg.vocab_size, h)}
    out["model.norm.weight"] = torch.ones(h, dtype=dtype, device=device)
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = normal(cfg.vocab_size, h)
    shapes = {
        "self_attn.q_proj": (q, h),
        "self_attn.k_proj": (kv, h),
        "self_attn.v_proj": (kv, h),
        "self_attn.o_proj": (h, q),
        "mlp.gate_proj": (inter, h),
        "mlp.up_proj": (inter, h),
        "mlp.down_proj": (h, inter),
    }
    for i in range(cfg.num_hidden_layers):
        for name, shape in shapes.items():
            out[f"model.layers.{i}.{name}.weight"] = normal(*shape)
        for name in ("input_layernorm", "post_attention_layernorm"):
            out[f"model.layers.{i}.{name}.weight"] = torch.ones(h, dtype=dtype, device=device)
    return out


def convert(
    cfg: LlamaConfig, hf: dict[str, torch.Tensor], dtype: torch.dtype, device: str
) -> Weights:
    """Fuse HF-named weights into ``Linear``s; ``hf`` is emptied as it goes, so the HF copy of
    a tensor is freed as soon as its converted copy exists (peak memory ~ one model + a layer).
    """
    # oneDNN packs bfloat16 only on CPUs with native bf16 support (AVX-512 or AVX-NE-CONVERT);
    # elsewhere (AVX2-only CPUs) its reorder raises, and bf16 runs on the plain matrix.
    bf16 = dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    pack = (
        device == "cpu"
        and (dtype == torch.float32 or bf16)
        and torch.backends.mkldnn.is_available()
    )

    def take(name: str) -> torch.Tensor:
        return hf.pop(name).to(device=device, dtype=dtype)

    kernel = small_kernel() if pack and dtype == torch.float32 else None

    def fused(*names: str, plain: bool = False) -> Linear:
        return Linear(torch.cat([take(n) for n in names], 0), pack, kernel, plain)

    layers = []
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        layers.append(
            Layer(
                attn_norm=take(p + "input_layernorm.weight"),
                qkv=fused(*[p + f"self_attn.{x}_proj.weight" for x in "qkv"]),
                out=fused(p + "self_attn.o_proj.weight"),
                mlp_norm=take(p + "post_attention_layernorm.weight"),
                gate_up=fused(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"),
                down=fused(p + "mlp.down_proj.weight"),
            )
        )
    norm = take("model.norm.weight")
    tied = cfg.tie_word_embeddings or "lm_head.weight" not in hf
    if tied:
        return Weights(layers, norm, fused("model.embed_tokens.weight", plain=True), None)
    head = fused("lm_head.weight", plain=True)  # distill reads it (measure/distill.py)
    return Weights(layers, norm, head, take("model.embed_tokens.weight"))
