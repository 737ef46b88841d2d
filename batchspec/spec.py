"""Job spec: the YAML a user writes, parsed into one validated dataclass per concern.

Every key is checked here, before anything expensive starts, so that a typo costs a one-line
error rather than an engine start. Where a key maps to a vLLM parameter it carries vLLM's name
(``max_model_len``, ``num_speculative_tokens``, ``prompt_lookup_min``, ``max_num_seqs`` ...), so
a vLLM user can read a spec without a glossary.
"""

from __future__ import annotations

import glob
import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from batchspec.errors import UserError

SpecMethod = Literal["none", "draft_model", "eagle", "eagle3", "ngram", "suffix", "mtp"]


class _Section(BaseModel):
    """Base for every section: unknown keys are errors, not silently ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class InputSpec(_Section):
    """Where the prompts come from and which columns mean what."""

    path: str = Field(description="Parquet file, directory or glob; relative to the spec file.")
    id_column: str = Field("id", description="Column with a unique id per row, copied to output.")
    prompt_column: str | None = Field(
        None, description="Column with the prompt text (exclusive with messages_column)."
    )
    messages_column: str | None = Field(
        None,
        description="Column with OpenAI-style chat messages: a list of {role, content} structs.",
    )
    apply_chat_template: bool = Field(
        True,
        description="Wrap prompt_column text as one user message and apply the model's chat "
        "template (an instruct model expects it); false sends the text as is.",
    )
    system_prompt: str | None = Field(
        None, description="System message prepended to every chat (prompt or messages rows)."
    )
    domain_column: str | None = Field(
        None, description="Column naming each row's domain; speculation is tuned per domain."
    )
    passthrough_columns: list[str] = Field(
        default_factory=list, description="Input columns copied unchanged to every output row."
    )

    @model_validator(mode="after")
    def _one_prompt_source(self) -> InputSpec:
        if (self.prompt_column is None) == (self.messages_column is None):
            raise ValueError("set exactly one of prompt_column and messages_column")
        return self


class OutputSpec(_Section):
    """Where results go."""

    dir: str = Field(description="Output directory (created); relative to the spec file.")
    unit_rows: int = Field(
        256,
        ge=1,
        le=1_000_000,
        description="Rows per work unit: the granule of commit and of resume.",
    )


class ModelSpec(_Section):
    """The target model and the engine that serves it (``vllm.LLM`` arguments)."""

    model: str = Field(
        description="Target model directory, or builtin:<name> for an embedded model."
    )
    tokenizer: str | None = Field(None, description="Tokenizer directory; default: the model's.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="Weights and activations dtype (vLLM's dtype)."
    )
    max_model_len: int | None = Field(
        None, ge=16, description="Context length (prompt + output); default: the model's."
    )
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs per engine (vLLM's).")
    max_num_seqs: int = Field(
        64, ge=1, description="Most sequences decoded together: the batch size (vLLM's)."
    )
    gpu_memory_utilization: float | None = Field(
        None,
        gt=0,
        le=1,
        description="Memory fraction for weights and KV cache; on CPU vLLM reads it as the "
        "fraction of host memory. Default: vLLM's on GPU, 0.3 on CPU.",
    )
    enforce_eager: bool = Field(
        False, description="Skip graph capture/compilation: faster start, slower steps."
    )
    seed: int = Field(0, description="Engine seed (vLLM's).")
    engine_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Any further vllm.LLM keyword, passed through unchanged.",
    )


class SpeculativeSpec(_Section):
    """Speculative decoding: vLLM's ``speculative_config`` plus per-domain K."""

    method: SpecMethod = Field("none", description="Speculation method; none turns it off.")
    model: str | None = Field(
        None,
        description="Draft model directory (draft_model, eagle, eagle3), or builtin:<name>.",
    )
    num_speculative_tokens: int = Field(
        3, ge=0, le=64, description="Tokens proposed per step (K); 0 turns speculation off."
    )
    prompt_lookup_min: int | None = Field(
        None, ge=1, description="n-gram: shortest suffix matched against the context."
    )
    prompt_lookup_max: int | None = Field(
        None, ge=1, description="n-gram: longest suffix matched against the context."
    )
    draft_tensor_parallel_size: int | None = Field(
        None, ge=1, description="Draft model tensor parallelism (vLLM's)."
    )
    per_domain: dict[str, int] = Field(
        default_factory=dict,
        description="K per domain, fixed: overrides num_speculative_tokens and the adaptive "
        "controller; 0 turns speculation off for that domain.",
    )
    adaptive: bool = Field(
        True,
        description="Pick K per domain (0 = no speculation) from measured acceptance and step "
        "cost: a tuning file (batchspec tune) and the run's own units. Starts from "
        "num_speculative_tokens until measurements say otherwise.",
    )
    k_grid: list[int] = Field(
        default_factory=lambda: [0, 1, 2, 3, 5, 8],
        description="K values the controller (and batchspec tune) considers.",
    )
    explore: float = Field(
        0.05,
        ge=0,
        le=1,
        description="How much measuring other K may cost: the share of a domain's units run "
        "at a neighbouring K when an engine with that K is up anyway, and the share of the "
        "remaining work's predicted time that the engine starts for trying an unmeasured "
        "neighbouring K may take.",
    )
    extra: dict[str, Any] = Field(
        default_factory=dict, description="Further speculative_config keys, passed through."
    )

    @field_validator("per_domain")
    @classmethod
    def _k_range(cls, v: dict[str, int]) -> dict[str, int]:
        for domain, k in v.items():
            if not 0 <= k <= 64:
                raise ValueError(f"K for domain {domain!r} must be in 0..64, got {k}")
        return v

    @field_validator("k_grid")
    @classmethod
    def _grid(cls, v: list[int]) -> list[int]:
        if not v or any(not 0 <= k <= 64 for k in v):
            raise ValueError("k_grid must be a non-empty list of K in 0..64")
        return sorted(set(v))

    @model_validator(mode="after")
    def _method_needs(self) -> SpeculativeSpec:
        if self.method in ("draft_model", "eagle", "eagle3") and not self.model:
            raise ValueError(f"method {self.method} needs speculative.model (the draft)")
        if self.method == "ngram":
            lo = self.prompt_lookup_min or 1
            hi = self.prompt_lookup_max or lo
            if lo > hi:
                raise ValueError("prompt_lookup_min must be <= prompt_lookup_max")
        return self

    def k_for(self, domain: str | None) -> int:
        """The K to use for a domain; 0 when speculation is off."""
        if self.method == "none":
            return 0
        if domain is not None and domain in self.per_domain:
            return self.per_domain[domain]
        return self.num_speculative_tokens


class SamplingSpec(_Section):
    """Sampling parameters (vLLM's SamplingParams names)."""

    temperature: float = Field(0.0, ge=0, description="0 means greedy.")
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(-1, ge=-1, description="-1 means no top-k cut.")
    max_tokens: int = Field(256, ge=1, description="Most new tokens per row.")
    stop: list[str] = Field(default_factory=list, description="Stop strings.")
    seed: int | None = Field(
        None, description="Per-request seed base: row i samples with seed + i (reproducible)."
    )


class ExecutionSpec(_Section):
    """How workers cooperate; none of it changes the output, so it is outside the spec hash."""

    lease_timeout_s: float = Field(
        300.0,
        gt=0,
        description="A lease not renewed for this long is taken over (the holder is presumed "
        "dead); holders on the same host are checked by process id at once.",
    )
    heartbeat_s: float = Field(20.0, gt=0, description="How often a worker renews its leases.")
    max_unit_attempts: int = Field(
        3, ge=1, description="Engine failures tolerated per unit before it is marked failed."
    )
    linger_s: float = Field(
        300.0,
        ge=0,
        description="After its own work, how long a worker waits on units other workers "
        "still hold, to take over any they hand back or abandon (an abandoned lease goes "
        "stale after lease_timeout_s). 0: exit as soon as nothing is claimable.",
    )
    shutdown_grace_s: float = Field(
        30.0,
        ge=0,
        description="On SIGTERM/SIGINT: how long to finish units in flight before abandoning "
        "them (keep it below Slurm's signal lead time).",
    )

    @model_validator(mode="after")
    def _beat_faster_than_timeout(self) -> ExecutionSpec:
        if self.heartbeat_s * 2 > self.lease_timeout_s:
            raise ValueError("heartbeat_s must be at most half of lease_timeout_s")
        return self


class JobSpec(_Section):
    """A whole job. ``base_dir`` anchors the spec's relative paths (the spec file's folder)."""

    input: InputSpec
    output: OutputSpec
    model: ModelSpec
    speculative: SpeculativeSpec = Field(default_factory=SpeculativeSpec)
    sampling: SamplingSpec = Field(default_factory=SamplingSpec)
    execution: ExecutionSpec = Field(default_factory=ExecutionSpec)
    name: str | None = Field(None, description="Job name shown in reports.")
    base_dir: str = Field(".", exclude=True)

    def resolve(self, path: str) -> Path:
        """A spec path made absolute against the spec file's folder."""
        p = Path(path).expanduser()
        return p if p.is_absolute() else (Path(self.base_dir) / p).resolve()

    @property
    def output_dir(self) -> Path:
        return self.resolve(self.output.dir)

    def input_files(self) -> list[Path]:
        """The input Parquet files, sorted so that planning is deterministic."""
        raw = self.input.path
        p = self.resolve(raw)
        if p.is_dir():
            files = sorted(p.rglob("*.parquet"))
        elif any(ch in raw for ch in "*?["):
            files = sorted(Path(f) for f in glob.glob(str(p), recursive=True))
        else:
            files = [p] if p.exists() else []
        if not files:
            raise UserError(f"input.path: no Parquet file matches {raw!r} (looked at {p})")
        return files

    def content_hash(self) -> str:
        """Hash of what decides the rows and their distribution; a run dir is tied to it.

        How fast they are generated is left out (speculation method and K, batch size, memory,
        graph capture, execution settings): speculative decoding does not change the target's
        output distribution, so K may change between runs, and within one as the controller
        tunes it. Every row records the method and K it was generated with.
        """
        data = self.model_dump(
            mode="json",
            include={
                "input": True,
                "output": {"unit_rows"},
                "model": {"model", "tokenizer", "dtype", "max_model_len", "seed"},
                "sampling": True,
            },
        )
        blob = json.dumps(data, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def _set_path(data: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = data
    for key in keys[:-1]:
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        if not isinstance(child, dict):
            raise UserError(f"--set {dotted}: {key!r} is not a section")
        node = child
    node[keys[-1]] = value


def parse_override(item: str) -> tuple[str, Any]:
    """``key.path=value`` with the value read as YAML (so 3 is an int, [a, b] a list)."""
    if "=" not in item:
        raise UserError(f"--set {item!r}: expected key.path=value")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key:
        raise UserError(f"--set {item!r}: empty key")
    try:
        return key, yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        problem = exc.__class__.__name__
        raise UserError(f"--set {key}: value is not valid YAML ({problem})") from None


def format_validation_error(exc: ValidationError, source: str) -> str:
    """One line per problem, field path first, the way a user would look it up."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        elif err["type"] == "missing":
            msg = "required key is missing"
        msg = msg.removeprefix("Value error, ")
        if "input" in err and err["type"] not in ("missing", "extra_forbidden"):
            shown = repr(err["input"])
            if len(shown) <= 60:
                msg += f" (got {shown})"
        parts.append(f"{loc}: {msg}")
    return f"{source}: " + "; ".join(parts)


def load_spec(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> JobSpec:
    """Read, override and validate a job spec; every failure is a one-line UserError."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise UserError(f"{path}: cannot read job spec ({exc.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or exc.__class__.__name__
        raise UserError(f"{path}: invalid YAML{where}: {problem}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: a job spec is a YAML mapping with input, output and model")
    for item in overrides:
        key, value = parse_override(item)
        _set_path(data, key, value)
    data.pop("base_dir", None)
    try:
        return JobSpec(**data, base_dir=str(path.resolve().parent))
    except ValidationError as exc:
        raise UserError(format_validation_error(exc, str(path))) from None
    except TypeError as exc:
        raise UserError(f"{path}: {exc}") from None
