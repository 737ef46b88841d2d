"""Reading a work unit's rows from Parquet and turning each into token ids for the engine.

Rows are checked one by one: a null or empty prompt, malformed chat messages or a prompt that
does not fit the context become an error row here, before the engine sees them, so one bad row
never stops a unit. The chat template is applied here (not inside vLLM) because the token count
is needed for the length check and for the output's num_prompt_tokens anyway.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from batchspec.errors import UserError
from batchspec.io.convert import ERROR, SETTINGS, STAGED_EXTRA
from batchspec.io.reader import UnitReader, required_columns
from batchspec.spec import InputSpec
from batchspec.spec.sampling import SamplingSpec
from batchspec.units import RowRequest, UnitRequests, WorkUnit

CHAT_ROLES = frozenset({"system", "user", "assistant", "tool", "developer"})


def row_seed(seed: int, file_index: int, row: int, sample: int = 0) -> int:
    """A row's sampling seed: a 63-bit hash of (seed, file, row), and of the sample's index
    for a prompt's samples after its first (``sampling.n``; sample 0 keeps the row's seed).

    A hash, not ``seed + row``: with a sum, seed s row i+1 would sample exactly like seed s+1
    row i, so two runs with neighbouring seeds would share all but one of their samples.
    """
    key = f"{seed}:{file_index}:{row}" + (f":{sample}" if sample else "")
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def check_columns(
    files: list[Path], spec: InputSpec, sampling: SamplingSpec | None = None
) -> dict[str, pa.DataType]:
    """Every needed column present in every file with one type; returns the types."""
    wanted = required_columns(spec, sampling)
    types: dict[str, pa.DataType] = {}
    for path in files:
        try:
            schema = pq.read_schema(path)
        except (OSError, pa.ArrowException) as exc:
            raise UserError(f"{path}: not a readable Parquet file ({exc})") from None
        for col in wanted:
            if col not in schema.names:
                field_name = _field_of(spec, col, sampling)
                raise UserError(f"{path}: {field_name} {col!r} is not a column of the file")
            typ = schema.field(col).type
            if col in types and types[col] != typ:
                raise UserError(
                    f"{path}: column {col!r} has type {typ}, but {types[col]} in earlier files"
                )
            types[col] = typ
    prompt_col = spec.prompt_column or spec.messages_column
    prompt_type = types[prompt_col]
    if spec.prompt_column and not (
        pa.types.is_string(prompt_type) or pa.types.is_large_string(prompt_type)
    ):
        raise UserError(f"input.prompt_column {prompt_col!r} must hold strings, not {prompt_type}")
    if spec.messages_column and not _is_chat(prompt_type):
        raise UserError(
            f"{files[0]}: input.messages_column {prompt_col!r} must hold lists of "
            f"{{role: string, content: string}} structs, not {prompt_type}"
        )
    for key, col in (sampling.columns if sampling is not None else {}).items():
        typ = types[col]
        if not (pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_null(typ)):
            raise UserError(f"sampling.columns.{key}: column {col!r} must hold numbers, not {typ}")
    return types


def _is_chat(typ: pa.DataType) -> bool:
    """A list of structs with string ``role`` and ``content`` (other fields may come along)."""
    if not (pa.types.is_list(typ) or pa.types.is_large_list(typ)):
        return False
    item = typ.value_type
    if not pa.types.is_struct(item):
        return False
    names = [item.field(i).name for i in range(item.num_fields)]
    text = (pa.types.is_string, pa.types.is_large_string)
    return all(
        key in names and any(ok(item.field(key).type) for ok in text) for key in ("role", "content")
    )


def _field_of(spec: InputSpec, col: str, sampling: SamplingSpec | None = None) -> str:
    for name in ("id_column", "prompt_column", "messages_column", "domain_column"):
        if getattr(spec, name) == col:
            return f"input.{name}"
    for key, named in (sampling.columns if sampling is not None else {}).items():
        if named == col:
            return f"sampling.columns.{key}"
    return "input.passthrough_columns entry"


def messages_error(messages: Any) -> str | None:
    """Why ``messages`` cannot be a chat prompt, or None (shared with JSONL staging)."""
    if not isinstance(messages, list) or not messages:
        return "messages is not a non-empty list"
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            return f"messages[{i}] is not a {{role, content}} mapping"
        role, content = msg.get("role"), msg.get("content")
        if role not in CHAT_ROLES:
            return f"messages[{i}].role {role!r} is not one of {sorted(CHAT_ROLES)}"
        if not isinstance(content, str):
            return f"messages[{i}].content is not a string"
    if messages[-1]["role"] == "assistant":
        return "messages end with an assistant turn: nothing to answer"
    if not any(m["content"].strip() for m in messages if m["role"] == "user"):
        return "messages have no non-empty user turn"
    return None


class PromptBuilder:
    """Turns a unit's rows into token ids with the target's tokenizer and chat template; with
    ``sampling``, each row into its ``n`` samples (one request each, row by row, sample by
    sample) with the row's settings from its columns (``sampling.columns``)."""

    def __init__(
        self,
        spec: InputSpec,
        tokenizer: Any,
        max_model_len: int,
        seed: int | None,
        reader: UnitReader | None = None,
        sampling: SamplingSpec | None = None,
    ):
        self.spec = spec
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.seed = seed
        self.sampling = sampling
        self.reader = reader or UnitReader(spec, sampling=sampling)
        """Where units' rows come from: a run passes one that reads staged copies."""
        self.columns = required_columns(spec, sampling)
        self._settings: dict[Any, tuple[SamplingSpec | None, int | None, str | None]] = {}

    def _encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        if self.spec.system_prompt is not None and messages[0]["role"] != "system":
            messages = [{"role": "system", "content": self.spec.system_prompt}, *messages]
        text = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )
        # The template already holds the special tokens it wants.
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def encode(self, value: Any) -> tuple[list[int] | None, str | None]:
        spec = self.spec
        if spec.messages_column:
            err = messages_error(value)
            if err:
                return None, err
            messages = [{"role": m["role"], "content": m["content"]} for m in value]
            return self._encode_chat(messages), None
        if value is None:
            return None, "prompt is null"
        if not isinstance(value, str) or not value.strip():
            return None, "prompt is empty"
        if spec.apply_chat_template:
            return self._encode_chat([{"role": "user", "content": value}]), None
        return self.tokenizer(value)["input_ids"], None

    def build(self, unit: WorkUnit, positions: list[int] | None = None) -> UnitRequests:
        """The unit's rows as requests; with ``positions``, only the rows at those positions."""
        spec = self.spec
        table = self.reader.read(unit)
        extra = [c for c in STAGED_EXTRA if c in table.column_names]
        data = {name: table.column(name).to_pylist() for name in [*self.columns, "__row", *extra]}
        out = UnitRequests(unit)
        for i, row in enumerate(data["__row"]):
            ids, error = self._prompt_ids(data, i)
            settings, own_seed, bad = self._row_sampling(data, i)
            for j in range(self.sampling.n if self.sampling is not None else 1):
                seed = None if self.seed is None else row_seed(self.seed, unit.file_index, row, j)
                if own_seed is not None:  # a request's seed: its samples' whatever its place
                    seed = own_seed if j == 0 else row_seed(own_seed, 0, 0, j)
                out.rows.append(
                    RowRequest(
                        row=row,
                        row_id=data[spec.id_column][i],
                        domain=unit.domain,
                        passthrough={c: data[c][i] for c in spec.passthrough_columns},
                        prompt_token_ids=None if error or bad else ids,
                        error=error or bad,
                        seed=seed,
                        sample_index=j,
                        sampling=settings,
                    )
                )
        if positions is not None:
            out.rows = [out.rows[i] for i in positions]
            out.positions = positions
        return out

    def _prompt_ids(self, data: dict[str, list], i: int) -> tuple[list[int] | None, str | None]:
        """Row ``i``'s prompt as token ids, or its error: found when it was staged (naming its
        line), or here. An OpenAI completions request's prompt is raw text (no template)."""
        staged = data.get(ERROR)
        if staged is not None and staged[i] is not None:
            return None, staged[i]
        value = data[self.spec.prompt_column or self.spec.messages_column][i]
        raw = self.spec.format == "openai-batch" and value is None
        try:
            if raw:
                ids, error = self.tokenizer(data["prompt"][i])["input_ids"], None
            else:
                ids, error = self.encode(value)
        except Exception as exc:  # a template or tokenizer failure is this row's problem
            ids, error = None, f"prompt could not be encoded: {exc}"
        # Longer than the context cannot run at all; the engine's own, finer checks (room
        # for one output token, vocabulary) still apply at submission.
        if ids is not None and len(ids) > self.max_model_len:
            return None, f"prompt has {len(ids)} tokens; max_model_len is {self.max_model_len}"
        return ids, error

    def _row_sampling(
        self, data: dict[str, list], i: int
    ) -> tuple[SamplingSpec | None, int | None, str | None]:
        """Row ``i``'s settings where its columns (or its request's body) set some (None: the
        job's), its own seed (a request's), or its error."""
        if self.sampling is None:
            return None, None, None
        requests = data.get(SETTINGS)
        if requests is not None and requests[i] is not None:
            from batchspec.io.openai_batch import request_settings

            if requests[i] not in self._settings:
                self._settings[requests[i]] = request_settings(self.sampling, requests[i])
            return self._settings[requests[i]]
        if not self.sampling.columns:
            return None, None, None
        values = {key: data[col][i] for key, col in self.sampling.columns.items()}
        key = tuple(values.items())
        if key not in self._settings:  # rows share few distinct values: check each once
            settings, error = self.sampling.for_row(values)
            self._settings[key] = (None if settings is self.sampling else settings), None, error
        return self._settings[key]
