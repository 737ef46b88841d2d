"""A smaller draft model cut from a prepared model: its first N decoder layers, its final norm
and its LM head, saved as an ordinary Hugging Face directory with the same tokenizer.

vLLM's ``draft_model`` speculation needs a second, smaller model that tokenizes exactly like
the target. No model hub is reachable here and no package ships a smaller Llama with
SmolLM2's tokenizer, so the draft is made from the target itself: a truncated copy is a real
separate model (its own weights, its own KV cache in vLLM) that is genuinely cheaper and
accepts far less than 100 % of its drafts, which is what a test of losslessness needs. The
cut reads and writes tensors only (no model class is built), so it takes seconds and gives
the same bytes every time.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from batchspec.errors import UserError

LAYER = re.compile(r"^(?:model\.)?layers\.(\d+)\.")
"""A decoder layer's weight name (Llama family); its index is what the cut compares."""
WEIGHT_FILES = ("*.safetensors", "*.safetensors.index.json", "*.bin", "*.bin.index.json")
"""What is rewritten rather than copied: the cut writes one ``model.safetensors``."""


@dataclass(frozen=True)
class DraftCut:
    """A built-in draft model: the first ``layers`` decoder layers of built-in ``base``."""

    name: str
    base: str
    layers: int
    description: str
    prepare_s: int
    """About how long preparing it takes once its base is prepared (2-core CPU)."""


CUTS: dict[str, DraftCut] = {
    c.name: c
    for c in [
        DraftCut(
            name="smollm2-135m-draft",
            base="smollm2-135m-instruct",
            layers=15,
            description="draft for smollm2-135m-instruct: its first 15 of 30 layers, final "
            "norm and LM head (81M parameters; the target's tokenizer)",
            prepare_s=5,
        )
    ]
}


def cut_layers(src: Path, dst: Path, layers: int) -> None:
    """Write into ``dst`` the model in ``src`` keeping decoder layers ``0..layers-1``.

    Every non-weight file (tokenizer, chat template, generation config) is copied as is, so
    the draft tokenizes exactly like its target (batchspec's own marker files are not: the
    cut gets its own); the config's layer count (and a per-layer ``layer_types`` list, where
    there is one) is cut to match the weights.
    """
    from safetensors.torch import save_file

    from batchspec.models import read_safetensors  # here: models imports this module

    config = json.loads((src / "config.json").read_text())
    total = config.get("num_hidden_layers")
    if not isinstance(total, int) or not 0 < layers < total:
        raise UserError(f"cannot cut {src.name} to {layers} layers: it has {total}")
    tensors = read_safetensors(
        src, keep=lambda name: (m := LAYER.match(name)) is None or int(m[1]) < layers
    )
    if not tensors:
        raise UserError(f"cannot cut {src.name}: no safetensors weights")
    dst.mkdir(parents=True, exist_ok=True)
    weights = [p for pattern in WEIGHT_FILES for p in src.glob(pattern)]
    for path in sorted(src.iterdir()):
        copied = path.name != "config.json" and not path.name.startswith("batchspec-")
        if path.is_file() and path not in weights and copied:
            shutil.copy2(path, dst / path.name)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    config["num_hidden_layers"] = layers
    if isinstance(config.get("layer_types"), list):
        config["layer_types"] = config["layer_types"][:layers]
    (dst / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
