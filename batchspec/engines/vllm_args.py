"""vLLM's arguments for a job: ``vllm.LLM`` keywords, ``speculative_config``, sampling.

One function per vLLM object, so that the engine and the benchmark against bare vLLM build
exactly the same engine from a spec.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psutil

from batchspec.models import resolve_model
from batchspec.spec import JobSpec
from batchspec.spec.sampling import SamplingSpec

CPU_MEMORY_FRACTION = 0.3
"""The CPU build reads gpu_memory_utilization as a fraction of host memory; vLLM's 0.92 does
not fit next to the rest of the process there. Used on CPU when the job's KV cache cannot be
sized from the model configs."""
KV_HEADROOM = 1.25
"""KV cache beyond max_num_seqs full-length sequences: blocks are allocated whole."""
MIN_KV_BYTES = 64 << 20


def on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def live_top_k(spec: JobSpec) -> int | None:
    """The K an adaptive job's vLLM engines are built with, to run any K up to it without a
    rebuild (``vllm_live_k``): the largest K the controller may choose. None where K is not
    chosen (a fixed K gets exactly the engine it asked for) or vLLM's own schedule is set, and
    under data parallelism, where vLLM disables the schedule K per unit rides on: there a K
    change is another engine, as it was before K per unit."""
    s = spec.speculative
    if not s.adaptive or s.method == "none" or s.k_by_batch_size is not None:
        return None
    if int(spec.model.engine_kwargs.get("data_parallel_size", 1)) > 1:
        return None
    top = max([*s.k_grid, s.num_speculative_tokens, *s.per_domain.values()])
    return top if top > 0 else None


def speculative_config(spec: JobSpec, k: int) -> dict[str, Any] | None:
    """vLLM's ``speculative_config`` for K drafts, or None for plain decoding. An adaptive
    job's engine is built at ``live_top_k`` with every batch size at K (K=0 included), which
    ``vllm_live_k`` changes while it runs."""
    s = spec.speculative
    top = live_top_k(spec)
    if s.method == "none" or (k == 0 and top is None):
        return None
    cfg: dict[str, Any] = {"method": s.method, "num_speculative_tokens": top or k}
    if s.model:
        cfg["model"] = str(
            resolve_model(s.model, "speculative.model", spec.resolve("."), auto_prepare=True)
        )
    if s.prompt_lookup_min is not None:
        cfg["prompt_lookup_min"] = s.prompt_lookup_min
    if s.prompt_lookup_max is not None:
        cfg["prompt_lookup_max"] = s.prompt_lookup_max
    if s.draft_tensor_parallel_size is not None:
        cfg["draft_tensor_parallel_size"] = s.draft_tensor_parallel_size
    if s.k_by_batch_size is not None:
        cfg["num_speculative_tokens_per_batch_size"] = [list(r) for r in s.k_by_batch_size]
    elif top is not None:
        cfg["num_speculative_tokens_per_batch_size"] = [[1, spec.model.max_num_seqs, min(k, top)]]
    cfg.update(s.extra)
    return cfg


def engine_kwargs(spec: JobSpec, k: int) -> dict[str, Any]:
    """Every ``vllm.LLM`` keyword for this job at K; the benchmark builds bare vLLM from it too."""
    m = spec.model
    kwargs: dict[str, Any] = {
        "model": str(resolve_model(m.model, "model.model", spec.resolve("."), auto_prepare=True)),
        "dtype": m.dtype,
        "tensor_parallel_size": m.tensor_parallel_size,
        "max_num_seqs": m.max_num_seqs,
        "enforce_eager": m.enforce_eager,
        "seed": m.seed,
        # Per-request timestamps (RequestOutput.metrics) are only kept with stats on; each
        # step's details price K (``vllm_steps``).
        "disable_log_stats": False,
        "enable_logging_iteration_details": True,
    }
    if m.tokenizer:
        kwargs["tokenizer"] = str(resolve_model(m.tokenizer, "model.tokenizer", spec.resolve(".")))
    if m.max_model_len is not None:
        kwargs["max_model_len"] = m.max_model_len
    cfg = speculative_config(spec, k)
    if m.gpu_memory_utilization is not None:
        kwargs["gpu_memory_utilization"] = m.gpu_memory_utilization
    elif on_cpu():
        dirs = [Path(kwargs["model"])] + ([Path(cfg["model"])] if cfg and "model" in cfg else [])
        kv_bytes = cpu_kv_cache_bytes(spec, dirs, cfg["num_speculative_tokens"] if cfg else 0)
        if kv_bytes is None:
            kwargs["gpu_memory_utilization"] = CPU_MEMORY_FRACTION
        else:
            kwargs["kv_cache_memory_bytes"] = kv_bytes
    if cfg is not None:
        kwargs["speculative_config"] = cfg
        # "detailed": each verify step's drafted and accepted counts, so that a short draft
        # accepted in full is not counted as a rejection (speculation.estimator.rejected_steps).
        kwargs["per_request_spec_decode_metrics"] = "detailed"
    kwargs.update(m.engine_kwargs)
    return kwargs


def sampling_params(
    spec: JobSpec,
    seed: int | None = None,
    logprobs: int | None = None,
    row: SamplingSpec | None = None,
    extra_args: dict[str, Any] | None = None,
) -> Any:
    """The job's ``SamplingParams`` (``row``: a row's own settings, ``sampling.columns``);
    ``logprobs``: the target's top log-probabilities at every generated position, at least
    as many as the job writes (``batchspec verify`` reads near-ties from them); ``extra_args``
    reach vLLM's engine core with the request (a row's K, ``vllm_live_k``)."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

    s = row or spec.sampling
    structured = s.structured()
    return SamplingParams(
        temperature=s.temperature,
        top_p=s.top_p,
        top_k=s.top_k if s.top_k > 0 else 0,
        max_tokens=s.max_tokens,
        min_tokens=s.min_tokens,
        repetition_penalty=s.repetition_penalty,
        frequency_penalty=s.frequency_penalty,
        presence_penalty=s.presence_penalty,
        stop=list(s.stop) or None,
        seed=seed,
        logprobs=s.logprobs_for(logprobs),
        prompt_logprobs=s.prompt_logprobs,
        structured_outputs=StructuredOutputsParams(**structured) if structured else None,
        output_kind=RequestOutputKind.FINAL_ONLY,
        extra_args=extra_args,
    )


def cpu_kv_cache_bytes(spec: JobSpec, model_dirs: list[Path], k: int) -> int | None:
    """KV cache for ``max_num_seqs`` sequences of ``max_model_len`` tokens (plus K drafts) in
    every attention layer of the target and its draft; None when a config does not say
    enough, or when that is more than the default share of the machine.

    On CPU vLLM allocates (and touches) its whole KV cache at start: the default fraction of
    host memory is gigabytes and ~10 s of engine start for a job that uses a fraction of it.
    Beyond what one batch can hold, more cache buys nothing: batchspec never queues more.
    """
    per_token = 0
    max_len = spec.model.max_model_len
    elem = 4 if spec.model.dtype in ("float32", "auto") else 2
    for path in model_dirs:
        try:
            cfg = json.loads((path / "config.json").read_text())
            # A speculators head (EAGLE-3) states its layer in transformer_layer_config.
            cfg = cfg.get("text_config") or cfg.get("transformer_layer_config") or cfg
            heads = cfg["num_attention_heads"]
            head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
            kv_heads = cfg.get("num_key_value_heads") or heads
            per_token += 2 * cfg["num_hidden_layers"] * kv_heads * head_dim * elem
        except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
            return None
        max_len = max_len or cfg.get("max_position_embeddings")
    if not max_len:
        return None
    tokens = spec.model.max_num_seqs * (max_len + k)
    wanted = max(int(tokens * per_token * KV_HEADROOM), MIN_KV_BYTES)
    # More than the default fraction of the machine: let vLLM fit what it can, as it would.
    return None if wanted > CPU_MEMORY_FRACTION * psutil.virtual_memory().total else wanted
