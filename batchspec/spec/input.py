"""The job's ``input`` section, and which kind of input ``input.path`` names.

batchspec reads Parquet; the inputs users arrive with are also JSONL prompt sets, OpenAI batch
files (what ``vllm run-batch`` reads) and Hugging Face datasets. ``input.format`` says which;
``auto`` (the default) decides once, when the spec is read (``detect_format``: by extension,
and for ``.jsonl`` by its first line), so that every later step, the spec hash, the job record
and every worker see one concrete format. An OpenAI batch file's columns are fixed by the
format (``OPENAI_BATCH``): the spec names none of them.
"""

from __future__ import annotations

import glob
import gzip
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from batchspec.spec.base import _Section, _shown
from batchspec.spec.keys import listed_once

InputFormat = Literal["auto", "parquet", "jsonl", "openai-batch", "hf"]
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".jsonl.gz", ".ndjson.gz")
"""Files read as JSON lines (``.gz``: gzip-compressed, streamed)."""
HF_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")
"""Files ``datasets``' ``save_to_disk`` writes: a folder holding one is a saved dataset."""
OPENAI_BATCH = {"id_column": "custom_id", "messages_column": "messages", "prompt_column": None}
"""The columns an OpenAI batch file is staged into (``io/openai_batch.py``): the id is the
request's ``custom_id``, a chat request's messages are ``messages``; a completions request's
raw text is ``prompt`` and its ``url`` says which; both pass through to every output row."""
OPENAI_PASSTHROUGH = ["url", "prompt"]


class InputSpec(_Section):
    """Where the prompts come from and which columns mean what."""

    path: str = Field(
        description="Parquet file, directory (all `*.parquet` below it) or glob; a JSONL or "
        "OpenAI batch file (or a directory or glob of them); a Hugging Face dataset folder; "
        "relative to the spec file"
    )
    format: InputFormat = Field(
        "auto",
        description="`parquet`, `jsonl` (one JSON object per line, with the columns named "
        "below), `openai-batch` (requests as `vllm run-batch` reads them: the columns are "
        "the format's), `hf` (a `save_to_disk` folder or a Hub-style folder of Parquet or "
        "JSONL shards) or `auto`: by extension, by the first line of a `.jsonl` file, `hf` "
        "for a folder `save_to_disk` wrote; see *Inputs and outputs*",
    )
    split: str | None = Field(
        None,
        description="`hf`: the split to read",
        json_schema_extra=_shown("`train`, or the dataset's only split"),
    )
    id_column: str = Field("id", description="unique row id, copied to the output's `id`")
    prompt_column: str | None = Field(
        None,
        description="prompt text (set this or `messages_column`)",
        json_schema_extra=_shown("–"),
    )
    messages_column: str | None = Field(
        None,
        description="OpenAI-style chat: a list of `{role, content}` structs",
        json_schema_extra=_shown("–"),
    )
    apply_chat_template: bool = Field(
        True,
        description="wrap `prompt_column` text as one user turn and apply the model's chat "
        "template (an instruct model expects it); `false` sends the raw text",
    )
    system_prompt: str | None = Field(None, description="system turn prepended to chats without")
    domain_column: str | None = Field(
        None,
        description="the row's domain: units are single-domain and speculation is set per domain",
    )
    passthrough_columns: list[str] = Field(
        default_factory=list, description="input columns copied to every output row"
    )

    _once = field_validator("passthrough_columns")(listed_once)

    @model_validator(mode="before")
    @classmethod
    def _openai_columns(cls, data: Any) -> Any:
        """An OpenAI batch file's columns are the format's: filled in, never chosen."""
        if not isinstance(data, dict) or data.get("format") != "openai-batch":
            return data
        data = dict(data)
        for key, value in OPENAI_BATCH.items():
            if data.get(key, value) != value:
                raise ValueError(
                    f"input.{key}: an OpenAI batch file's columns are the format's "
                    f"(custom_id, the bodies' messages or prompt); leave {key} unset"
                )
            data[key] = value
        given = data.get("passthrough_columns") or []
        if isinstance(given, list):
            data["passthrough_columns"] = [*OPENAI_PASSTHROUGH] + [
                c for c in given if c not in OPENAI_PASSTHROUGH
            ]
        return data

    @model_validator(mode="after")
    def _one_prompt_source(self) -> InputSpec:
        if self.format == "openai-batch":
            return self
        if (self.prompt_column is None) == (self.messages_column is None):
            raise ValueError(
                "set exactly one of prompt_column and messages_column (an OpenAI batch file "
                "needs neither: input.format openai-batch)"
            )
        if self.split is not None and self.format != "hf":
            raise ValueError(f"input.split: only for input.format hf, not {self.format}")
        return self


def with_format(data: Any) -> Any:
    """A job's raw data with ``input.format: auto`` replaced by the detected format (left as
    it is where the path cannot be looked at: the checks before a run then say why)."""
    if not isinstance(data, dict) or not isinstance(data.get("input"), dict):
        return data
    inp = data["input"]
    if inp.get("format", "auto") != "auto" or not isinstance(inp.get("path"), str):
        return data
    base = Path(str(data.get("base_dir") or "."))
    found = detect_format(inp["path"], base, inp.get("split") is not None)
    if found is None:
        return data
    return {**data, "input": {**inp, "format": found}}


def detect_format(raw: str, base: Path, split: bool = False) -> str | None:
    """The format ``auto`` means for ``raw``: ``hf`` for a folder ``save_to_disk`` wrote (or
    any folder when a split is named), JSON lines by extension (``openai-batch`` when the
    first line is a request: ``custom_id`` and ``body``), else ``parquet``; None when the path
    is not there to look at."""
    path = Path(raw).expanduser()
    path = path if path.is_absolute() else base / path
    if any(ch in raw for ch in "*?["):
        files = sorted(Path(f) for f in glob.glob(str(path), recursive=True))
        if not raw.endswith(JSONL_SUFFIXES):
            return "parquet"
        return _lines_format(files[0]) if files else None
    if path.is_dir():
        if split or any((path / m).is_file() for m in HF_MARKERS):
            return "hf"
        if next(path.rglob("*.parquet"), None) is not None:
            return "parquet"
        jsonl = sorted(p for s in JSONL_SUFFIXES for p in path.rglob(f"*{s}"))
        return _lines_format(jsonl[0]) if jsonl else None
    if not path.is_file():
        return None
    if path.name.endswith(JSONL_SUFFIXES):
        return _lines_format(path)
    return "hf" if path.suffix == ".arrow" else "parquet"


def _lines_format(path: Path) -> str:
    """``openai-batch`` when the first non-blank line is a request object, else ``jsonl``
    (a first line that is not JSON is reported, naming it, when the file is staged)."""
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rb") as fh:
            for raw in fh:
                if raw.strip():
                    first = json.loads(raw)
                    break
            else:
                return "jsonl"
    except (OSError, ValueError, EOFError):
        return "jsonl"
    request = isinstance(first, dict) and "custom_id" in first and "body" in first
    return "openai-batch" if request else "jsonl"
