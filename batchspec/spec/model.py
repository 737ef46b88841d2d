"""The ``model`` section: the target model and the engine settings that serve it, with vLLM's
own names (``max_model_len``, ``max_num_seqs`` ...), so that a vLLM user reads it without a
glossary; ``engine_kwargs`` are checked against vLLM's names here, before any engine starts."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from batchspec.spec.base import _Section, _shown
from batchspec.spec.keys import ENGINE_KEYS_SET, known_to_vllm, not_set_by_batchspec

MAX_NUM_SEQS = 16_384
"""``model.max_num_seqs`` at most: beyond what any engine batches usefully (vLLM's defaults are
256 to 1024), and engines size buffers by it (the tree engine its KV cache)."""


class ModelSpec(_Section):
    """The target model and the engine that serves it (arguments of `vllm.LLM`)."""

    model: str = Field(
        description="target: a Hugging Face model directory, or `builtin:smollm2-135m-instruct`"
    )
    tokenizer: str | None = Field(
        None, description="tokenizer directory", json_schema_extra=_shown("the model's")
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="weights and activations: `auto`, `float32`, `bfloat16`, `float16`"
    )
    max_model_len: int | None = Field(
        None,
        ge=16,
        description="context length (prompt + output); longer prompts become error rows",
        json_schema_extra=_shown("the model's"),
    )
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs per engine")
    max_num_seqs: int = Field(
        64,
        ge=1,
        le=MAX_NUM_SEQS,
        description="batch size: sequences decoded together (at most 16384)",
    )
    gpu_memory_utilization: float | None = Field(
        None,
        gt=0,
        le=1,
        description="memory fraction for weights and KV cache (on CPU: of host memory); unset "
        "on CPU, the KV cache holds `max_num_seqs` full-length sequences (a faster start)",
        json_schema_extra=_shown("vLLM's; sized to the job on CPU"),
    )
    enforce_eager: bool = Field(
        False, description="no graph capture / compilation: faster start, slower steps"
    )
    seed: int = Field(0, ge=0, le=2**32 - 1, description="engine seed")
    engine_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="any other `vllm.LLM` keyword, passed through (in the spec hash: "
        "quantization or revision change outputs); not one that batchspec sets; names and "
        "`quantization` values are checked against vLLM's",
    )

    @field_validator("engine_kwargs")
    @classmethod
    def _not_ours(cls, v: dict[str, Any]) -> dict[str, Any]:
        return known_to_vllm(not_set_by_batchspec(v, ENGINE_KEYS_SET))
