"""OpenAI batch requests (what ``vllm run-batch`` reads) as rows, for staging and for the prompt
builder.

A line is ``{custom_id, method, url, body}``. ``custom_id`` is its identity: a line that is not
a JSON object or has no string ``custom_id`` is refused, naming it (vLLM's run-batch stops on
such a line too). Everything else is judged per request, and a request batchspec cannot serve
as asked becomes an error row that names the line and the field: a ``url`` other than
``/v1/chat/completions`` and ``/v1/completions``, a ``model`` other than the job's, a body
field batchspec does not honour (``tools``, ``logit_bias``, ``stream: true`` ...), a setting
the job's engine cannot apply losslessly. The fields it honours become the row's own sampling
settings (``FIELDS``), checked against the job's ``sampling`` section when the row is built
(``request_settings``), so a value out of range names its field too.

Staged columns (``OPENAI_BATCH`` in ``spec/input.py``): ``custom_id``, ``url``, ``messages``
(chat), ``prompt`` (completions: raw text, no chat template, as vLLM's ``/v1/completions``),
the settings as JSON, the error, the line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
from pydantic import ValidationError

from batchspec.errors import UserError
from batchspec.io.convert import ERROR, LINE, SETTINGS
from batchspec.io.jsonl_rows import MESSAGES_TYPE, chat_messages, decode_line
from batchspec.spec.sampling import MAX_SEED, SamplingSpec

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
FIELDS = {
    "max_tokens": "max_tokens",
    "max_completion_tokens": "max_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_tokens": "min_tokens",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "repetition_penalty": "repetition_penalty",
    "seed": "seed",
    "stop": "stop",
    "n": "n",
}
"""Body fields taken as they are, and the ``sampling`` key each sets (vLLM's own extensions
``top_k``, ``min_tokens`` and ``repetition_penalty`` included); ``logprobs``,
``top_logprobs`` and ``response_format`` are translated (``_translated``)."""
IGNORED = {"model", "messages", "prompt", "user"}
"""Read elsewhere (model, messages, prompt) or meaning nothing to a batch (user)."""
SCHEMA = pa.schema(
    [
        ("custom_id", pa.string()),
        ("url", pa.string()),
        ("messages", MESSAGES_TYPE),
        ("prompt", pa.string()),
        (SETTINGS, pa.string()),
        (ERROR, pa.string()),
        (LINE, pa.int64()),
    ]
)


class Refused(ValueError):
    """A request batchspec cannot serve as asked; the message names the field."""


def request_batches(
    path: Path, lines: Iterator[tuple[int, bytes]], batch: int, how: Any
) -> Iterator[pa.Table]:
    """The file's requests as tables of ``SCHEMA`` (``how``: ``convert.Staging``)."""
    rows: list[dict[str, Any]] = []
    for number, raw in lines:
        obj = decode_line(path, number, raw)
        ident = obj.get("custom_id")
        if not isinstance(ident, str):
            what = "no custom_id" if ident is None else f"custom_id {ident!r} is not a string"
            raise UserError(f"{path}: line {number}: {what}; every request needs one")
        row: dict[str, Any] = {"custom_id": ident, "url": obj.get("url"), LINE: number}
        try:
            row.update(_request(obj, number, how.models, how.refused))
        except Refused as exc:
            row[ERROR] = f"line {number}: {exc}"
        rows.append(row)
        if len(rows) >= batch:
            yield pa.Table.from_pylist(rows, SCHEMA)
            rows = []
    if rows:
        yield pa.Table.from_pylist(rows, SCHEMA)


def _request(
    obj: dict[str, Any], number: int, models: list[str], refused: list[str]
) -> dict[str, Any]:
    """A request's staged columns, or ``Refused`` naming what cannot be served."""
    method, url, body = obj.get("method", "POST"), obj.get("url"), obj.get("body")
    if method != "POST":
        raise Refused(f"method {method!r}: only POST requests")
    if url not in (CHAT, COMPLETIONS):
        raise Refused(f"url {url!r} is not served by batchspec ({CHAT}, {COMPLETIONS})")
    if not isinstance(body, dict):
        raise Refused("body is not a JSON object")
    model = body.get("model")
    if model is not None and model not in models:
        raise Refused(f"body.model {model!r} is not this job's model ({models[0]})")
    if body.get("stream") not in (None, False):
        raise Refused("body.stream: a batch answers whole responses, not streams")
    row: dict[str, Any] = {}
    if url == CHAT:
        row["messages"], why = chat_messages(body.get("messages"))
        if why is not None:
            raise Refused(f"body.{why}")
    else:
        row["prompt"] = _prompt(body.get("prompt"))
    settings, fields = _settings(body, url)
    for key in refused:
        if key in settings:
            raise Refused(f"body.{fields[key]}: not supported on the tree engine; use vLLM")
    if settings:
        row[SETTINGS] = json.dumps({"settings": settings, "fields": fields, "line": number})
    return row


def _prompt(prompt: Any) -> str:
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise Refused("body.prompt: one string per request (not a list, nor token ids)")
    if not prompt.strip():
        raise Refused("body.prompt is empty")
    return prompt


def _settings(body: dict[str, Any], url: str) -> tuple[dict[str, Any], dict[str, str]]:
    """The body's sampling settings (``sampling`` keys) and the field each came from."""
    settings: dict[str, Any] = {}
    fields: dict[str, str] = {}
    for name, value in body.items():
        if name in IGNORED or name == "stream" or value is None:
            continue
        if name in FIELDS:
            key = FIELDS[name]
            if key in fields and name != "max_completion_tokens":
                continue  # max_completion_tokens wins over max_tokens, as in vLLM
            if key == "stop" and isinstance(value, str):
                value = [value]
            settings[key], fields[key] = value, name
        elif name not in ("logprobs", "top_logprobs", "response_format"):
            raise Refused(f"body.{name} is not supported by batchspec")
    for key, (value, name) in _translated(body, url).items():
        settings[key], fields[key] = value, name
    return settings, fields


def _translated(body: dict[str, Any], url: str) -> dict[str, tuple[Any, str]]:
    """``logprobs``/``top_logprobs`` and ``response_format`` as ``sampling`` keys."""
    out: dict[str, tuple[Any, str]] = {}
    logprobs, top = body.get("logprobs"), body.get("top_logprobs")
    if url == CHAT:
        if top is not None and logprobs is not True:
            raise Refused("body.top_logprobs needs body.logprobs: true")
        if logprobs is True:
            out["logprobs"] = (0 if top is None else top, "top_logprobs")
        elif logprobs not in (None, False):
            raise Refused(f"body.logprobs is {logprobs!r}; true or false")
    elif logprobs is not None:
        out["logprobs"] = (logprobs, "logprobs")
    fmt = body.get("response_format")
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if fmt is None or kind == "text":
        return out
    if kind == "json_object":
        out["json_schema"] = ({"type": "object"}, "response_format")
    elif kind == "json_schema":
        schema = (fmt.get("json_schema") or {}).get("schema")
        if not isinstance(schema, dict):
            raise Refused("body.response_format.json_schema.schema is not a JSON schema object")
        out["json_schema"] = (schema, "response_format")
    else:
        raise Refused(f"body.response_format type {kind!r}: text, json_object or json_schema")
    return out


def request_settings(
    job: SamplingSpec, staged: str
) -> tuple[SamplingSpec | None, int | None, str | None]:
    """A request's settings (staged JSON) over the job's: the row's ``SamplingSpec``, its own
    seed (or None), or an error naming the body field."""
    data = json.loads(staged)
    given, fields, line = data["settings"], data["fields"], f"line {data['line']}: "
    if given.get("n", job.n) != job.n:
        return (
            None,
            None,
            f"{line}body.n = {given['n']}: every request runs with the job's n ({job.n})",
        )
    seed = given.pop("seed", None)
    whole = isinstance(seed, int) and not isinstance(seed, bool)
    if seed is not None and not (whole and 0 <= seed <= MAX_SEED):
        return None, None, f"{line}body.seed = {seed!r}: an integer from 0 to 2^63-1"
    try:
        base = job.model_dump(exclude={"json_schema"})
        row = job.model_validate({**base, "json_schema": job.json_schema, **given})
    except ValidationError as exc:
        err = exc.errors()[0]
        key = str(err["loc"][0]) if err["loc"] else next(iter(given), "")
        value = given.get(key)
        msg = str(err["msg"]).removeprefix("Value error, ")
        return None, None, f"{line}body.{fields.get(key, key)} = {value!r}: {msg}"
    return row, seed, None
