"""The built-in draft model (``builtin:smollm2-135m-draft``) that vLLM's ``draft_model``
speculation runs with: a genuinely smaller copy of the embedded target (its first layers, its
LM head) that tokenizes exactly as the target does, the same bytes every time. vLLM running
it, with ``verify`` passing and a planted bias failing, is in ``tests/test_vllm_methods.py``
(``--full``)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from safetensors import safe_open

from batchspec.errors import UserError
from batchspec.models import resolve_model
from batchspec.models_cut import CUTS, cut_layers

CUT = CUTS["smollm2-135m-draft"]


def weights(model: Path) -> dict[str, tuple[int, ...]]:
    with safe_open(str(model / "model.safetensors"), framework="pt") as fh:
        return {name: tuple(fh.get_slice(name).get_shape()) for name in fh.keys()}  # noqa: SIM118


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_draft_is_the_targets_first_layers_with_its_tokenizer(tmp_path: Path) -> None:
    target = resolve_model(f"builtin:{CUT.base}", "model.model", auto_prepare=True)
    draft = resolve_model(f"builtin:{CUT.name}", "speculative.model", auto_prepare=True)
    config = json.loads((draft / "config.json").read_text())
    full = json.loads((target / "config.json").read_text())
    assert config["num_hidden_layers"] == CUT.layers < full["num_hidden_layers"]
    assert {k: v for k, v in config.items() if k != "num_hidden_layers"} == {
        k: v for k, v in full.items() if k != "num_hidden_layers"
    }
    kept, every = weights(draft), weights(target)
    assert kept == {n: s for n, s in every.items() if not n.startswith("model.layers.")
                    or int(n.split(".")[2]) < CUT.layers}  # fmt: skip
    assert f"model.layers.{CUT.layers - 1}.mlp.down_proj.weight" in kept
    size = (draft / "model.safetensors").stat().st_size
    assert size < 0.65 * (target / "model.safetensors").stat().st_size
    # The tokenizer and chat template are the target's own files (validate also compares
    # the loaded tokenizers, io/checks.py compare_tokenizers).
    files = {p.name for p in target.iterdir()} - {"model.safetensors", "config.json"}
    assert {p.name for p in draft.iterdir()} - {"model.safetensors", "config.json"} == files
    for name in files - {"batchspec-prepared.json"}:
        assert digest(draft / name) == digest(target / name), name
    assert json.loads((draft / "batchspec-prepared.json").read_text())["layers"] == CUT.layers
    # Deterministic: cut again, the same bytes as the prepared built-in.
    cut_layers(target, tmp_path / "again", CUT.layers)
    for name in ("model.safetensors", "config.json"):
        assert digest(tmp_path / "again" / name) == digest(draft / name)
    assert not list((tmp_path / "again").glob("batchspec-*"))  # the base's marker stays


def test_a_cut_must_leave_fewer_layers_than_the_model_has(tmp_path: Path) -> None:
    target = resolve_model(f"builtin:{CUT.base}", "model.model", auto_prepare=True)
    layers = json.loads((target / "config.json").read_text())["num_hidden_layers"]
    for bad in (0, layers):
        with pytest.raises(UserError, match=f"cannot cut {target.name} to {bad} layers"):
            cut_layers(target, tmp_path / str(bad), bad)
