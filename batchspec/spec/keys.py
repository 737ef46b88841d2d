"""Spec keys with a rule of their own: which ones leave outputs unchanged (not hashed), which
vLLM keywords batchspec sets itself (not to be passed through), and value checks that vLLM
would otherwise make only once an engine is up."""

from __future__ import annotations

import difflib
import re
from typing import Any

from batchspec.spec.vllm_names import LLM_KEYWORDS, QUANTIZATION_METHODS, VLLM_VERSION

OUTPUT_NEUTRAL: frozenset[str] = frozenset(
    {
        "name",
        "input.format",
        "input.split",
        "output.dir",
        "model.tensor_parallel_size",
        "model.max_num_seqs",
        "model.gpu_memory_utilization",
        "model.enforce_eager",
        "speculative.method",
        "speculative.model",
        "speculative.num_speculative_tokens",
        "speculative.prompt_lookup_min",
        "speculative.prompt_lookup_max",
        "speculative.draft_tensor_parallel_size",
        "speculative.per_domain",
        "speculative.k_by_batch_size",
        "speculative.adaptive",
        "speculative.k_grid",
        "speculative.explore",
        "speculative.tree",
        "speculative.drafters",
        "speculative.suffix",
        "speculative.engine",
        "execution",
    }
)
"""Spec keys (or whole sections) that change how fast rows are generated, never which rows, so
they are left out of the content hash and may change between runs into one output directory:
where output goes, batch size and parallelism, and all of speculation and which engine serves
it (lossless: each keeps the target's output distribution; every row records the method and K
it ran with). Every other key is hashed, so a new key binds the output directory unless it is
added here, with its reason. ``input.format`` and ``input.split`` say how to find and read the
input, and what they select is bound already: by the input's fingerprint in the manifest (the
files read) and by the columns the format implies, which are hashed; left out, a job written
before they existed keeps its hash."""


ENGINE_KEYS_SET = {
    "model": "use model.model",
    "tokenizer": "use model.tokenizer",
    "dtype": "use model.dtype",
    "max_model_len": "use model.max_model_len",
    "tensor_parallel_size": "use model.tensor_parallel_size",
    "max_num_seqs": "use model.max_num_seqs",
    "gpu_memory_utilization": "use model.gpu_memory_utilization",
    "enforce_eager": "use model.enforce_eager",
    "seed": "use model.seed",
    "speculative_config": "use the speculative section",
    "per_request_spec_decode_metrics": "always on with speculation (per-row acceptance)",
    "disable_log_stats": "always False (per-row timing needs the engine's stats)",
}
"""``vllm.LLM`` keywords batchspec sets from the spec: an ``engine_kwargs`` entry would silently
override them (and, for the last two, make the per-row metrics vanish)."""
SPECULATIVE_KEYS_SET = {
    "method": "use speculative.method",
    "num_speculative_tokens": "use speculative.num_speculative_tokens (or per_domain, adaptive)",
    "model": "use speculative.model",
    "prompt_lookup_min": "use speculative.prompt_lookup_min",
    "prompt_lookup_max": "use speculative.prompt_lookup_max",
    "draft_tensor_parallel_size": "use speculative.draft_tensor_parallel_size",
    "num_speculative_tokens_per_batch_size": "use speculative.k_by_batch_size",
}
"""``speculative_config`` keys batchspec sets from the speculative section."""

ROW_SEEDS = "blake2b(seed:file:row)"
"""How per-row seeds are derived from ``sampling.seed`` (``io.inputs.row_seed``): hashed with
seeded specs, so that a changed derivation never mixes into an existing output directory."""


def not_set_by_batchspec(given: dict[str, Any], owned: dict[str, str]) -> dict[str, Any]:
    """``given`` as it is, or a ValueError naming its first key that batchspec sets itself."""
    for key in given:
        if key in owned:
            raise ValueError(f"{key!r} is set by batchspec: {owned[key]}")
    return given


def listed_once(names: list[str]) -> list[str]:
    """``names`` as they are, or a ValueError naming the first one listed twice."""
    twice = [n for i, n in enumerate(names) if n in names[:i]]
    if twice:
        raise ValueError(f"{twice[0]!r} is listed twice")
    return names


def no_empty_stop(stops: list[str]) -> list[str]:
    """An empty stop string matches at once: vLLM refuses it when the first request arrives."""
    if "" in stops:
        raise ValueError("an empty stop string would end every row before its first token")
    return stops


def k_per_domain(ks: dict[str, int]) -> dict[str, int]:
    """``speculative.per_domain``: every K in 0..64."""
    for domain, k in ks.items():
        if not 0 <= k <= 64:
            raise ValueError(f"K for domain {domain!r} must be in 0..64, got {k}")
    return ks


def checked_k_grid(ks: list[int]) -> list[int]:
    """``speculative.k_grid``, sorted and without repeats: K in 0..64, at least one."""
    if not ks or any(not 0 <= k <= 64 for k in ks):
        raise ValueError("k_grid must be a non-empty list of K in 0..64")
    return sorted(set(ks))


def checked_schedule(ranges: list[list[int]] | None) -> list[list[int]] | None:
    """``speculative.k_by_batch_size``: ranges ``(from, to, K)``, inclusive, sorted, not
    overlapping, the first from batch 1, K in 0..64 and at least one K above 0 (vLLM's own
    rules, checked here rather than at the engine's start a minute later)."""
    if ranges is None:
        return None
    if not ranges:
        raise ValueError("k_by_batch_size: give at least one [from, to, K] range, or leave it out")
    if any(len(r) != 3 for r in ranges):
        raise ValueError("k_by_batch_size: each range is [from, to, K], three integers")
    ranges = sorted(ranges)
    if ranges[0][0] != 1:
        raise ValueError("k_by_batch_size: the first range must start at batch size 1")
    for (lo, hi, k), prev in zip(ranges, [None, *ranges[:-1]], strict=True):
        if not 1 <= lo <= hi or not 0 <= k <= 64:
            raise ValueError(
                f"k_by_batch_size: [{lo}, {hi}, {k}] needs 1 <= from <= to, K in 0..64"
            )
        if prev is not None and lo <= prev[1]:
            raise ValueError(f"k_by_batch_size: [{lo}, {hi}, {k}] overlaps {list(prev)}")
    if max(k for _, _, k in ranges) == 0:
        raise ValueError("k_by_batch_size: every K is 0; for no speculation set method: none")
    return ranges


def known_to_vllm(given: dict[str, Any]) -> dict[str, Any]:
    """``model.engine_kwargs`` as given, or a ValueError naming its first key that ``vllm.LLM``
    does not take, or a ``quantization`` vLLM does not know: vLLM refuses either only once its
    engine starts, a minute later (``vllm_names``: the names, without importing vLLM)."""
    for key in given:
        if key not in LLM_KEYWORDS:
            near = difflib.get_close_matches(key, LLM_KEYWORDS, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise ValueError(f"{key!r} is not a vllm.LLM keyword (vLLM {VLLM_VERSION}){hint}")
    method = given.get("quantization")
    if method is not None and method not in QUANTIZATION_METHODS:
        near = difflib.get_close_matches(str(method), QUANTIZATION_METHODS, n=3)
        hint = f" (close: {', '.join(near)})" if near else ""
        raise ValueError(f"quantization {method!r} is not one of vLLM's quantization methods{hint}")
    return given


def room_for_a_prompt(max_tokens: int, max_model_len: int | None) -> None:
    """A ValueError when ``max_tokens`` fills the whole context: no prompt would fit, every
    row would be an error row (a model's own length is checked against its config in
    ``io.model_checks``)."""
    if max_model_len is not None and max_tokens >= max_model_len:
        raise ValueError(
            f"sampling.max_tokens: {max_tokens} leaves no room for a prompt in "
            f"model.max_model_len {max_model_len}"
        )


NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
MAX_NAME = 64
"""A job name becomes a Slurm job name (an ``#SBATCH`` line) and may name files: letters,
digits, ``.``, ``_``, ``+`` and ``-`` (``cluster.sbatch.WORD``), starting with a letter or digit
(no path, no newline)."""


def safe_name(name: str | None) -> str | None:
    """``name`` as it is, or a ValueError saying what makes it unsafe as a file or job name."""
    if name is None:
        return name
    if len(name) > MAX_NAME:
        raise ValueError(f"at most {MAX_NAME} characters, got {len(name)}")
    if not NAME.fullmatch(name):
        raise ValueError(
            "letters, digits, '.', '_', '+' and '-' only, starting with a letter or digit (it "
            "names the Slurm job and files)"
        )
    return name


def not_blank(path: str) -> str:
    """An empty path would mean the spec file's own folder: never what was meant."""
    if not path.strip():
        raise ValueError("empty; name the directory")
    return path
