"""The whole job: its sections put together, the checks that span sections, where its paths
point, and the content hash an output directory is bound to."""

from __future__ import annotations

import glob
import hashlib
import json
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from batchspec.errors import UserError
from batchspec.spec.base import _Section
from batchspec.spec.execution import ExecutionSpec
from batchspec.spec.input import JSONL_SUFFIXES, InputSpec, with_format
from batchspec.spec.keys import OUTPUT_NEUTRAL, ROW_SEEDS, not_blank, room_for_a_prompt, safe_name
from batchspec.spec.model import ModelSpec
from batchspec.spec.sampling import SamplingSpec, check_engine
from batchspec.spec.speculative import SpeculativeSpec
from batchspec.spec.tree import TREE


class OutputSpec(_Section):
    """Where results go."""

    dir: str = Field(description="output directory (created); relative to the spec file")
    _dir = field_validator("dir")(not_blank)
    unit_rows: int = Field(
        256, ge=1, le=1_000_000, description="rows per work unit: the granule of commit and resume"
    )


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
