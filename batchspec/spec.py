"""Job spec: the YAML a user writes, parsed into one validated dataclass per concern.

Every key is checked here, before anything expensive starts, so that a typo costs a one-line
error rather than an engine start. Where a key maps to a vLLM parameter it carries vLLM's name
(``max_model_len``, ``num_speculative_tokens``, ``prompt_lookup_min``, ``max_num_seqs`` ...), so
a vLLM user can read a spec without a glossary. Each field's description is the one place it
is documented: the README's job-spec reference is generated from them (``spec_docs``).
"""

from __future__ import annotations

import glob
import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from batchspec.errors import UserError
from batchspec.spec_base import _Section, _shown
from batchspec.spec_execution import ExecutionSpec
from batchspec.spec_input import JSONL_SUFFIXES, InputSpec, with_format
from batchspec.spec_keys import (
    ENGINE_KEYS_SET,
    OUTPUT_NEUTRAL,
    ROW_SEEDS,
    SPECULATIVE_KEYS_SET,
    checked_k_grid,
    checked_schedule,
    k_per_domain,
    known_to_vllm,
    not_blank,
    not_set_by_batchspec,
    room_for_a_prompt,
    safe_name,
)
from batchspec.spec_sampling import SamplingSpec, check_engine
from batchspec.spec_tree import (
    TREE,
    VLLM,
    EngineChoice,
    TreeSpec,
    check_speculative,
    engine_defaults,
)

MAX_NUM_SEQS = 16_384
"""``model.max_num_seqs`` at most: beyond what any engine batches usefully (vLLM's defaults are
256 to 1024), and engines size buffers by it (the tree engine its KV cache)."""

SpecMethod = Literal["none", "draft_model", "eagle", "eagle3", "ngram", "suffix", "mtp"]


class OutputSpec(_Section):
    """Where results go."""

    dir: str = Field(description="output directory (created); relative to the spec file")
    _dir = field_validator("dir")(not_blank)
    unit_rows: int = Field(
        256, ge=1, le=1_000_000, description="rows per work unit: the granule of commit and resume"
    )


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


class SpeculativeSpec(_Section):
    """Speculative decoding: vLLM's `speculative_config`, plus K per domain. With `adaptive`
    (the default) one engine serves every K: vLLM is built at the largest K of `k_grid` and
    each row decodes at its unit's K, rows of different K in one batch, as on the tree engine.
    A fixed K, or vLLM's own `k_by_batch_size`, gets exactly that engine, one per K."""

    method: SpecMethod = Field(
        "none", description="`none`, `draft_model`, `eagle`, `eagle3`, `ngram`, `suffix`, `mtp`"
    )
    model: str | None = Field(
        None,
        description="draft model / EAGLE head directory or `builtin:` name (needed by "
        "`draft_model`, `eagle`, `eagle3`)",
        json_schema_extra=_shown("–"),
    )
    num_speculative_tokens: int = Field(
        3,
        ge=0,
        le=64,
        description="K, tokens proposed per step; 0 turns speculation off; where the "
        "controller starts",
    )
    prompt_lookup_min: int | None = Field(
        None,
        ge=1,
        description="n-gram: shortest suffix matched against the context",
        json_schema_extra=_shown("vLLM's"),
    )
    prompt_lookup_max: int | None = Field(
        None,
        ge=1,
        description="n-gram: longest suffix matched against the context",
        json_schema_extra=_shown("vLLM's"),
    )
    draft_tensor_parallel_size: int | None = Field(
        None, ge=1, description="draft model tensor parallelism", json_schema_extra=_shown("vLLM's")
    )
    k_by_batch_size: list[list[int]] | None = Field(
        None,
        description="vLLM's own schedule of K by batch size (`num_speculative_tokens_per_"
        "batch_size`): `[from, to, K]` ranges, inclusive, the first from 1, K 0 allowed, e.g. "
        "`[[1, 4, 3], [5, 16, 0]]`; one engine runs it, built for its largest K (each row's "
        "`num_speculative_tokens`); needs `adaptive: false`, vLLM and no `per_domain`",
        json_schema_extra=_shown("–"),
    )
    per_domain: dict[str, int] = Field(
        default_factory=dict,
        description="K per domain, fixed, e.g. `{math: 0, code: 5}`; 0 = no speculation for "
        "that domain; the controller leaves these alone",
    )
    adaptive: bool = Field(
        True,
        description="pick K per domain (0 = off) from measured acceptance and step cost: a "
        "tuning file (`batchspec tune`) and the run's own units (see *Choosing K*)",
    )
    k_grid: list[int] = Field(
        default_factory=lambda: [0, 1, 2, 3, 5, 8],
        description="the K the controller and `tune` consider",
    )
    explore: float = Field(
        0.05,
        ge=0,
        le=1,
        description="how much measuring other K may cost: the share of a domain's units run "
        "at a neighbouring K when an engine with that K is up anyway, and the share of the "
        "remaining work's predicted time that two engine starts for trying a never-measured "
        "neighbouring K may take",
    )
    tree: TreeSpec | None = Field(
        None,
        description="draft trees instead of chains, on batchspec's own engine (see *Draft "
        "trees*); the keys are listed below",
    )
    engine: EngineChoice = Field(
        VLLM,
        description="`vllm` (chains), `tree` (batchspec's tree engine; a missing `tree` key "
        "means a dynamic tree) or `auto`: whichever `batchspec tune` measured faster at the "
        "job's batch size (ngram, or draft_model with `model`; see *Routing a job to the "
        "faster engine*)",
        json_schema_extra=_shown("`tree` with a `tree` key, else `vllm`"),
    )
    extra: dict[str, Any] = Field(
        default_factory=dict,
        description="further `speculative_config` keys, passed through; not one that batchspec "
        "sets (method, K, draft, lookup bounds, draft parallelism)",
    )

    @field_validator("extra")
    @classmethod
    def _not_set_here(cls, v: dict[str, Any]) -> dict[str, Any]:
        return not_set_by_batchspec(v, SPECULATIVE_KEYS_SET)

    _k_range = field_validator("per_domain")(k_per_domain)
    _schedule = field_validator("k_by_batch_size")(checked_schedule)
    _grid = field_validator("k_grid")(checked_k_grid)

    _engine = model_validator(mode="before")(engine_defaults)
    _checked = model_validator(mode="after")(check_speculative)

    def fixed_k(self, domain: str | None) -> int | None:
        """The K a domain runs at whatever was measured, or None when the K controller
        chooses it: 0 without a speculative method, the domain's ``per_domain`` K, or with
        ``adaptive: false`` the spec's K. The one place this rule lives: ``k_for``, the
        controller (``Controller(fixed=)``), ``KPolicy.decide`` and ``route`` ask it."""
        if self.method == "none":
            return 0
        if self.k_by_batch_size is not None:  # vLLM's schedule, in one engine at its top K
            return max(k for _, _, k in self.k_by_batch_size)
        if domain is not None and domain in self.per_domain:
            return self.per_domain[domain]
        return None if self.adaptive else self.num_speculative_tokens

    def k_for(self, domain: str | None) -> int:
        """The K a domain starts at: its fixed K, else where the controller starts."""
        fixed = self.fixed_k(domain)
        return self.num_speculative_tokens if fixed is None else fixed


class JobSpec(_Section):
    """A whole job. ``base_dir`` anchors the spec's relative paths (the spec file's folder)."""

    input: InputSpec
    output: OutputSpec
    model: ModelSpec
    speculative: SpeculativeSpec = Field(default_factory=SpeculativeSpec)
    sampling: SamplingSpec = Field(default_factory=SamplingSpec)
    execution: ExecutionSpec = Field(default_factory=ExecutionSpec)
    name: str | None = Field(
        None,
        description="job name, shown in reports and Slurm: letters, digits, `.`, `_`, `+`, "
        "`-`, at most 64",
    )
    base_dir: str = Field(".", exclude=True)

    _name = field_validator("name")(safe_name)
    _format = model_validator(mode="before")(with_format)

    @model_validator(mode="after")
    def _sampling_on_engine(self) -> JobSpec:
        check_engine(self.sampling, self.speculative.engine)
        if self.input.format == "openai-batch" and self.sampling.columns:
            raise ValueError(
                "sampling.columns: an OpenAI batch file's requests take their settings from "
                "their bodies"
            )
        room_for_a_prompt(self.sampling.max_tokens, self.model.max_model_len)
        if self.speculative.engine == TREE and self.model.tensor_parallel_size > 1:
            raise ValueError(
                "model.tensor_parallel_size > 1 needs vLLM; the tree engine runs on one device"
            )
        return self

    def resolve(self, path: str) -> Path:
        """A spec path made absolute against the spec file's folder."""
        p = Path(path).expanduser()
        return p if p.is_absolute() else (Path(self.base_dir) / p).resolve()

    @property
    def output_dir(self) -> Path:
        return self.resolve(self.output.dir)

    def input_files(self) -> list[Path]:
        """The files ``input.path`` names, sorted so that planning is deterministic: Parquet
        files, or for JSON lines formats the JSONL files; for ``hf``, the dataset's folder
        (``io/sources.py`` finds its files)."""
        raw = self.input.path
        p = self.resolve(raw)
        lines = self.input.format in ("jsonl", "openai-batch")
        kind = "JSONL" if lines else "Parquet"
        if self.input.format == "hf":
            files = [p] if p.exists() else []
            kind = "dataset"
        elif p.is_dir():
            found = (f for s in JSONL_SUFFIXES for f in p.rglob(f"*{s}")) if lines else None
            files = sorted(found) if found is not None else sorted(p.rglob("*.parquet"))
        elif any(ch in raw for ch in "*?["):
            files = sorted(Path(f) for f in glob.glob(str(p), recursive=True))
        else:
            files = [p] if p.exists() else []
        if not files:
            raise UserError(f"input.path: no {kind} file matches {raw!r} (looked at {p})")
        return files

    def content_hash(self) -> str:
        """Hash of every key that decides the rows and their distribution: all but
        ``OUTPUT_NEUTRAL``. An output directory is bound to it."""
        blob = json.dumps(self.hashed_content(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def hashed_content(self) -> dict[str, Any]:
        """What ``content_hash`` hashes, as JSON data: the manifest keeps it, so that a run
        refused for another spec can name the keys that differ."""
        exclude: dict[str, Any] = {}
        for dotted in OUTPUT_NEUTRAL:
            section, _, key = dotted.partition(".")
            if key:
                exclude.setdefault(section, {})[key] = True
            else:
                exclude[section] = True
        data = self.model_dump(mode="json", exclude=exclude)
        if self.sampling.seed is not None:
            # Rows sample with seeds derived from it: a new derivation is another sample, and
            # an output directory must not mix the two.
            data["sampling"]["row_seeds"] = ROW_SEEDS
        return data
