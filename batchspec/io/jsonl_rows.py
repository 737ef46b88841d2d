"""JSON lines as rows of the job's columns, for staging (``io/convert.py``).

Each non-blank line is one JSON object, one row. Its id (``input.id_column``) is its identity:
a line that is not a JSON object, or has no id, or an id of another type than the first line's
(an integer or a string), is refused in one line naming the file and the line, since no output
row could say which input it answers (``vllm run-batch`` and OpenAI's batch API refuse such a
file too). Anything else wrong with a line (a prompt that is not text, malformed messages, a
value of the wrong type) makes it an error row whose error names the line, as a bad Parquet
row does.

Column types follow the values, as polars' and Ray Data's JSON readers infer them, but from
the first batch of lines only (``BATCH_ROWS``), so that memory stays bounded and every shard
has one schema: the prompt is a string; messages a list of ``{role, content}``; the domain a
string; any other column takes the type of its first batch's values (booleans, integers,
floats, strings; lists and objects as JSON text; a column null throughout the first batch is
text, or numbers for ``sampling.columns``). A later value that does not fit makes an error row.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from batchspec.errors import UserError
from batchspec.io.convert import ERROR, LINE
from batchspec.io.inputs import messages_error
from batchspec.spec import InputSpec

MESSAGES_TYPE = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
try:  # vLLM brings msgspec: several times faster than the standard library on long lines
    from msgspec import DecodeError as _DecodeError
    from msgspec.json import decode as _decode
except ImportError:  # pragma: no cover - without vLLM
    _decode, _DecodeError = json.loads, ValueError  # type: ignore[assignment]


def decode_line(path: Path, number: int, raw: bytes) -> dict[str, Any]:
    """A line's JSON object, or a UserError naming the file and line."""
    try:
        value = _decode(raw)
    except (_DecodeError, ValueError) as exc:
        raise UserError(f"{path}: line {number}: not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise UserError(f"{path}: line {number}: a {type(value).__name__}, not a JSON object")
    return value


def text_content(content: Any) -> tuple[str | None, str | None]:
    """A message's content as text: a string, or OpenAI's list of text parts joined by
    newlines (as vLLM joins them for a text model); else the reason it is not text."""
    if isinstance(content, str):
        return content, None
    if not isinstance(content, list):
        return None, "is not a string or a list of text parts"
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text" or not isinstance(part.get("text"), str):
            return None, f"[{j}] is a {kind!r} part; only text parts are supported"
        texts.append(part["text"])
    return "\n".join(texts), None


def chat_messages(value: Any) -> tuple[list[dict[str, str]] | None, str | None]:
    """Chat messages as ``{role, content}`` text, or why they cannot be (``messages...``)."""
    if isinstance(value, list):
        messages = []
        for i, msg in enumerate(value):
            if isinstance(msg, dict) and "content" in msg:
                text, why = text_content(msg["content"])
                if why is not None:
                    return None, f"messages[{i}].content{'' if why[0] == '[' else ' '}{why}"
                msg = {"role": msg.get("role"), "content": text}
            messages.append(msg)
        value = messages
    error = messages_error(value)
    return (None, error) if error else (value, None)


def _scalar_type(values: Iterable[Any], numbers: bool) -> pa.DataType:
    """A free column's type from its first values (see the module's docstring)."""
    seen = {type(v) for v in values if v is not None}
    if not seen:
        return pa.float64() if numbers else pa.string()
    if seen == {bool}:
        return pa.bool_()
    if seen <= {int}:
        return pa.int64()
    if seen <= {int, float}:
        return pa.float64()
    return pa.string()


def _fits(value: Any, typ: pa.DataType) -> tuple[Any, bool]:
    """``value`` as a cell of ``typ`` (lists and objects as JSON text in a text column)."""
    if value is None:
        return None, True
    if pa.types.is_string(typ):
        return (value, True) if isinstance(value, str) else (json.dumps(value), True)
    if isinstance(value, bool):
        return value, pa.types.is_boolean(typ)
    if pa.types.is_int64(typ):
        return value, isinstance(value, int)
    if pa.types.is_float64(typ):
        return value, isinstance(value, int | float)
    return value, False


class _Columns:
    """One file's column values, a batch at a time, and their types once the first batch is in."""

    def __init__(self, path: Path, spec: InputSpec, numbers: set[str], columns: list[str]):
        self.path = path
        self.spec = spec
        self.numbers = numbers
        self.columns = columns
        self.id_type: type | None = None
        fixed = (spec.id_column, spec.prompt_column, spec.messages_column, spec.domain_column)
        self.free = [c for c in columns if c not in fixed]
        """Columns typed by their values (pass-through, ``sampling.columns``)."""
        self.types: dict[str, pa.DataType] = {}
        self.keys: set[str] | None = set()
        """Keys of the first batch's lines: a column in none of them is a misnamed column."""

    def row(self, number: int, obj: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
        """The line's values of the job's columns, and its first problem (naming the line)."""
        spec, row = self.spec, {}
        if self.keys is not None:
            self.keys.update(obj)
        ident = obj.get(spec.id_column)
        kind = type(ident) if isinstance(ident, str | int) and not isinstance(ident, bool) else None
        self.id_type = self.id_type or kind
        if kind is None or kind is not self.id_type:
            what = "no" if ident is None else f"the id {ident!r} as"
            raise UserError(
                f"{self.path}: line {number}: {what} input.id_column {spec.id_column!r}; every "
                f"line needs one, {'an integer' if self.id_type is int else 'a string'} as on "
                "the first line"
            )
        row[spec.id_column], error = ident, None
        for col in self.columns:
            if col == spec.id_column:
                continue
            value, why = self._value(col, obj.get(col))
            row[col] = value
            error = error or (f"line {number}: {why}" if why else None)
        return row, error

    def _value(self, col: str, value: Any) -> tuple[Any, str | None]:
        spec = self.spec
        if col == spec.prompt_column:
            if isinstance(value, str):
                return (value, None) if value.strip() else (None, "prompt is empty")
            return None, f"prompt {col!r} is {'missing' if value is None else 'not a string'}"
        if col == spec.messages_column:
            return chat_messages(value)
        if col == spec.domain_column:
            ok = value is None or isinstance(value, str | int | float | bool)
            shown = value if value is None or isinstance(value, str) else json.dumps(value)
            return (shown, None) if ok else (None, f"domain {col!r} is not a single value")
        typ = self.types.get(col)
        if typ is None:
            return value, None  # the first batch: typed when it is complete
        cell, ok = _fits(value, typ)
        return (cell, None) if ok else (None, f"column {col!r} holds {value!r}, not {typ}")

    def table(
        self, rows: list[dict[str, Any]], errors: list[str | None], lines: list[int]
    ) -> pa.Table:
        """The batch as a table of the file's schema (typed from this batch if it is the first)."""
        if self.keys is not None:
            self._named_columns(len(rows))
        if len(self.types) < len(self.free):
            for col in self.free:
                self.types[col] = _scalar_type([r[col] for r in rows], col in self.numbers)
            self._retype(rows, errors, lines)
        data: dict[str, pa.Array] = {}
        for col in self.columns:
            values = [r[col] for r in rows]
            data[col] = pa.array(values, self._type(col))
        data[ERROR] = pa.array(errors, pa.string())
        data[LINE] = pa.array(lines, pa.int64())
        return pa.table(data)

    def _named_columns(self, lines: int) -> None:
        """A column of the job in none of the first lines is refused, naming its key (a
        typo would otherwise make every row an error row)."""
        assert self.keys is not None
        for col in self.columns:
            if col not in self.keys:
                have = ", ".join(sorted(self.keys)[:12])
                raise UserError(
                    f"{self.path}: {_field(self.spec, col)} {col!r} is in none of the first "
                    f"{lines} lines (their keys: {have})"
                )
        self.keys = None

    def _type(self, col: str) -> pa.DataType:
        if col == self.spec.id_column:
            return pa.int64() if self.id_type is int else pa.string()
        if col == self.spec.messages_column:
            return MESSAGES_TYPE
        return self.types.get(col, pa.string())  # the prompt and the domain: text

    def _retype(
        self, rows: list[dict[str, Any]], errors: list[str | None], lines: list[int]
    ) -> None:
        """The first batch's free values made to fit the types just inferred from them."""
        for i, row in enumerate(rows):
            for col in self.free:
                row[col], ok = _fits(row[col], self.types[col])
                if not ok:
                    errors[i] = errors[i] or f"line {lines[i]}: column {col!r} holds {row[col]!r}"
                    row[col] = None


def _field(spec: InputSpec, col: str) -> str:
    """The spec key that names ``col``."""
    for name in ("prompt_column", "messages_column", "domain_column"):
        if getattr(spec, name) == col:
            return f"input.{name}"
    return "input.passthrough_columns entry" if col in spec.passthrough_columns else "column"


def jsonl_batches(
    path: Path, lines: Iterator[tuple[int, bytes]], batch: int, how: Any
) -> Iterator[pa.Table]:
    """The file's rows as tables of about ``batch`` rows (``how``: ``convert.Staging``)."""
    cols = _Columns(path, how.spec, set(how.sampling.columns.values()), how.columns)
    rows: list[dict[str, Any]] = []
    errors: list[str | None] = []
    numbers: list[int] = []
    for number, raw in lines:
        row, error = cols.row(number, decode_line(path, number, raw))
        rows.append(row)
        errors.append(error)
        numbers.append(number)
        if len(rows) >= batch:
            yield cols.table(rows, errors, numbers)
            rows, errors, numbers = [], [], []
    if rows:
        yield cols.table(rows, errors, numbers)
