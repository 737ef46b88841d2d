"""A job checked against its models' configs (``config.json``), before any engine starts.

vLLM reads these configs only when it builds an engine, a minute into a run (~45 s here), and
refuses then: a context longer than the model's positions, more GPUs than its heads divide
into, ``mtp`` on a model without MTP layers, a full model given as an EAGLE head. Each rule
here is vLLM's, read from the same keys, so ``validate`` refuses what the engine would, in one
line naming the key, without importing vLLM or torch.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

from batchspec.errors import UserError
from batchspec.spec import JobSpec
from batchspec.spec.tree import TREE

POSITION_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
"""Where a config states its positions: vLLM takes the smallest of these (``config.model``)."""
ROPE_PRESCALED = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")
"""RoPE types whose positions above are already scaled: vLLM applies no ``factor`` to them."""
MTP_COUNT_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_modules")
"""Config keys that count a model's MTP layers (vLLM's ``SpeculativeConfig.hf_config_override``)."""
MTP_FAMILIES = frozenset(
    {
        "longcat_flash",
        "step3p5",
        "step3p7",
        "gemma4_assistant",
        "gemma4_unified_assistant",
        "minimax_m3_vl",
        "MiMoV2ForCausalLM",
        "MiMoV2OmniForCausalLM",
        "MiMoV2FlashForCausalLM",
        "Step3p5ForCausalLM",
        "Step3p7ForConditionalGeneration",
        "MiniMaxM3SparseForConditionalGeneration",
    }
)
"""Model types and architectures vLLM gives an MTP layer without a count key in the config."""
MAX_HEAD_LAYERS = 2
"""An EAGLE head is a decoder layer or two over the target's features; a config of more layers
that names no EAGLE architecture is a full model."""


def read_config(model_dir: Path) -> dict[str, Any]:
    """A model directory's ``config.json``, ``{}`` when unreadable (``resolve_model`` has
    checked that it exists; what vLLM makes of a broken one is vLLM's to say)."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def _text(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's part of a config (a multimodal config nests it)."""
    text = config.get("text_config")
    return text if isinstance(text, dict) else config


def model_positions(model_dir: Path, tokenizer_dir: Path) -> tuple[int, str] | None:
    """The longest context vLLM lets the model take, and the config key that says so; None
    when the config does not say (vLLM then assumes 2048 and warns)."""
    config = read_config(model_dir)
    text = _text(config)
    found = [(v, k) for k in POSITION_KEYS if isinstance(v := text.get(k), int | float) and v > 0]
    if not found:
        return None
    length, key = min(found)
    if isinstance(text.get("model_max_length"), int | float) and text["model_max_length"] > 0:
        length, key = text["model_max_length"], "model_max_length"  # Command-R: it rules
    tok_max = read_config_file(tokenizer_dir / "tokenizer_config.json").get("model_max_length")
    if isinstance(tok_max, int | float) and 0 < tok_max < length:
        length, key = tok_max, "model_max_length in tokenizer_config.json"
    length *= _rope_factor(text, str(config.get("model_type", "")))
    return int(length), key


def read_config_file(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``; ``{}`` when missing or not an object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _rope_factor(text: dict[str, Any], model_type: str) -> float:
    """RoPE scaling's factor on the stated positions, as vLLM applies it (Gemma 3 states them
    scaled already)."""
    rope = text.get("rope_parameters") or text.get("rope_scaling")
    if not isinstance(rope, dict) or "gemma3" in model_type:
        return 1.0
    layers = [r for r in rope.values() if isinstance(r, dict)] or [rope]  # per layer type
    factor = 1.0
    for params in layers:
        kind = params.get("rope_type") or params.get("type")
        if kind not in ROPE_PRESCALED and isinstance(params.get("factor"), int | float):
            factor = float(params["factor"])
    return factor


def check_context(spec: JobSpec, model_dir: Path, tokenizer_dir: Path) -> None:
    """``model.max_model_len`` within the model's positions (unless vLLM is told to allow
    more), and room for a prompt beside ``sampling.max_tokens`` in the context used."""
    positions = model_positions(model_dir, tokenizer_dir)
    if positions is None:
        return
    length, key = positions
    wanted = spec.model.max_model_len
    allowed = os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "0").lower() in ("1", "true")
    if wanted is not None and wanted > length and not allowed:
        raise UserError(
            f"model.max_model_len: {wanted} is more than the {length} positions of "
            f"{model_dir.name} ({key} in its config)"
        )
    if wanted is None and spec.sampling.max_tokens >= length:
        raise UserError(
            f"sampling.max_tokens: {spec.sampling.max_tokens} leaves no room for a prompt in "
            f"the {length} positions of {model_dir.name}"
        )


def vllm_cpu_build() -> bool:
    """Whether vLLM's CPU build is installed, decided as vLLM decides (its platform plugin:
    ``VLLM_TARGET_DEVICE=cpu``, a ``+cpu`` version, the ``vllm-cpu`` package, macOS), without
    importing it."""
    if os.environ.get("VLLM_TARGET_DEVICE") == "cpu" or sys.platform == "darwin":
        return True
    try:
        return "cpu" in importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def numa_nodes() -> list[int]:
    """The memory (NUMA) nodes this process may use, as vLLM's CPU build counts them."""
    nodes: list[int] = []
    try:
        with open("/proc/self/status") as fh:
            line = next((x for x in fh if x.startswith("Mems_allowed_list:")), "")
    except OSError:
        return [0]
    for part in filter(None, line.partition(":")[2].strip().split(",")):
        first, _, last = part.partition("-")
        nodes += range(int(first), int(last or first) + 1)
    visible = os.environ.get("CPU_VISIBLE_MEMORY_NODES", "")
    if visible:
        nodes = [n for n in map(int, visible.split(",")) if n in nodes]
    return nodes or [0]


def check_parallel(spec: JobSpec, model_dir: Path) -> None:
    """``model.tensor_parallel_size`` as vLLM takes it: a divisor of the attention heads; on
    its CPU build, one rank per NUMA node unless ``VLLM_CPU_OMP_THREADS_BIND`` binds them."""
    tp = spec.model.tensor_parallel_size
    if tp == 1 or spec.speculative.engine == TREE:
        return
    heads = _text(read_config(model_dir)).get("num_attention_heads")
    if isinstance(heads, int) and heads % tp:
        raise UserError(
            f"model.tensor_parallel_size: {tp} does not divide the {heads} attention heads "
            f"of {model_dir.name}"
        )
    problem = cpu_ranks_problem(tp) if vllm_cpu_build() else None
    if problem:
        raise UserError(f"model.tensor_parallel_size: {tp} ranks on vLLM's CPU build {problem}")


def cpu_ranks_problem(tp: int) -> str | None:
    """Why vLLM's CPU build would not start ``tp`` ranks here, or None: it binds each rank to
    a NUMA node of its own, or to a core list of its own in ``VLLM_CPU_OMP_THREADS_BIND``
    (lists joined by ``|``; ``run --workers`` sets them so)."""
    bind = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto")
    if bind == "nobind":
        return None
    if bind != "auto":
        lists = len(bind.split("|"))
        if lists == tp:
            return None
        return f"need a core list each; VLLM_CPU_OMP_THREADS_BIND gives {lists}"
    nodes = numa_nodes()
    if len(nodes) >= tp:
        return None
    return (
        f"need a NUMA node each, and this machine has {len(nodes)} (or a core list each in "
        "VLLM_CPU_OMP_THREADS_BIND, joined by '|'); set it to 1 here"
    )


def has_mtp_layers(config: dict[str, Any]) -> bool:
    """Whether vLLM finds MTP layers in a model of this config: a count key above 0 (in the
    config, its text part or its ``mtp_config``), an MTP model type, or a family that has one
    by default."""
    for part in (config, _text(config), config.get("mtp_config")):
        if isinstance(part, dict):
            counts = [part.get(k) for k in MTP_COUNT_KEYS]
            if any(isinstance(n, int) and n > 0 for n in counts):
                return True
    names = {str(config.get("model_type", ""))} | set(config.get("architectures") or [])
    return bool(names & MTP_FAMILIES) or any(n.endswith("_mtp") or "MTP" in n for n in names)


def is_eagle_head(config: dict[str, Any]) -> bool:
    """Whether a config describes an EAGLE head rather than a whole model: the speculators
    format, an EAGLE architecture or model type, or a decoder of at most two layers."""
    if config.get("speculators_model_type"):
        return True
    names = [str(config.get("model_type", "")), *map(str, config.get("architectures") or [])]
    if any("eagle" in n.lower() for n in names):
        return True
    layers = _text(config).get("num_hidden_layers")
    return isinstance(layers, int) and layers <= MAX_HEAD_LAYERS


def check_draft(spec: JobSpec, target: Path, draft: Path | None) -> None:
    """``mtp`` needs MTP layers (in the draft, else the target); ``eagle`` and ``eagle3`` a
    head, not a model (the tree engine: a head in the speculators format); ``suffix`` on vLLM
    the Arctic Inference package, which vLLM imports only when its engine starts."""
    s = spec.speculative
    arctic = s.method == "suffix" and s.engine != TREE
    if arctic and importlib.util.find_spec("arctic_inference") is None:
        raise UserError(
            "speculative.method: suffix needs Arctic Inference, which is not installed here "
            "(bash scripts/setup_suffix.sh builds it)"
        )
    if s.method == "mtp":
        where = draft or target
        if not has_mtp_layers(read_config(where)):
            keys = ", ".join(MTP_COUNT_KEYS)
            raise UserError(
                f"speculative.method: mtp needs a model with MTP layers; the config of "
                f"{where.name} declares none ({keys})"
            )
    if s.method not in ("eagle", "eagle3") or draft is None:
        return
    config = read_config(draft)
    if draft.resolve() == target.resolve() or not is_eagle_head(config):
        arch = ", ".join(config.get("architectures") or ["no architecture"])
        layers = _text(config).get("num_hidden_layers", "?")
        raise UserError(
            f"speculative.model: {draft.name} is a full model ({arch}, {layers} layers), not "
            f"an {s.method} head"
            + (" (batchspec distill trains one)" if s.method == "eagle3" else "")
        )
    if s.engine == TREE and config.get("speculators_model_type") != "eagle3":
        raise UserError(
            f"speculative.model: {draft.name} is not in the speculators eagle3 format the "
            "tree engine reads (batchspec distill writes one)"
        )
    if s.method == "eagle" and is_eagle3_head(config):
        raise UserError(
            f"speculative.model: {draft.name} is an EAGLE-3 head: use method eagle3 (under "
            "eagle vLLM feeds it the last layer's state instead of its feature layers, "
            "and it drafts badly)"
        )


def is_eagle3_head(config: dict[str, Any]) -> bool:
    """Whether a head is EAGLE-3's (speculators ``eagle3``, or an ``Eagle3`` architecture):
    vLLM 0.32 runs one under ``method: eagle`` without complaint, drafting from the wrong
    hidden state (8 of 534 drafts accepted where ``eagle3`` accepted 34 of 456)."""
    if config.get("speculators_model_type") == "eagle3":
        return True
    return any("eagle3" in str(a).lower() for a in config.get("architectures") or [])
