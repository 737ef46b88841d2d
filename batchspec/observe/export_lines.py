"""``batchspec export --format jsonl|openai-batch``: the committed output as one JSON lines file.

The rows come as the Parquet export takes them (``ordering.ordered_chunks``: input order, every
input id checked against the parts, row for row); only the writing differs. ``jsonl`` writes
one object per output row with the dataset's columns. ``openai-batch`` writes one response per
input row, as ``vllm run-batch`` and OpenAI's batch API write them (``custom_id``, ``response``
with ``status_code`` and a ``chat.completion`` or ``text_completion`` body, ``usage``; an error
row as ``error``), a prompt's ``n`` samples as its choices; batchspec's per-row measurements
(speculation, acceptance, timing) ride in each choice under ``batchspec``, a field OpenAI's
clients ignore. The file is written beside DEST, fsynced and renamed into place: it exists
whole or not at all.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pyarrow as pa

from batchspec.errors import UserError
from batchspec.io.layout import OutDir
from batchspec.io.temps import temp_name
from batchspec.observe.columns import DEFAULT, TIMINGS, kept_for, span
from batchspec.observe.ordering import dataset_columns, ordered_chunks
from batchspec.observe.record import check_finished, load_job_record, planned_units
from batchspec.observe.shards import check_dest

LINE_FORMATS = ("jsonl", "openai-batch")
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
MEASURED = ("sample_index", "domain", *span("engine", "acceptance_histogram"), *TIMINGS, "unit_id")
"""A row's columns carried in an OpenAI response's ``batchspec`` field."""


@dataclass
class LinesResult:
    dest: Path
    lines: int = 0
    rows: int = 0
    error_rows: int = 0


def export_lines(
    out: OutDir,
    dest: Path,
    fmt: str,
    include_errors: bool = True,
    allow_unfinished: bool = False,
    prompts: bool = True,
    replace: bool = False,
    columns: str = DEFAULT,
) -> LinesResult:
    """Write the run's rows to the file ``dest`` in ``fmt`` (see the module's docstring);
    ``replace``: an existing file is replaced (``run-batch``, as ``vllm run-batch`` does);
    ``columns``: the ``--columns`` of a ``jsonl`` file (a response's shape is OpenAI's)."""
    if fmt == "openai-batch" and columns != DEFAULT:
        raise UserError("--columns: an openai-batch file has the responses' own fields")
    if not (replace and dest.is_file()):
        check_dest(dest)
    job = load_job_record(out)
    units = planned_units(out, job)
    check_finished(out, units, allow_unfinished)
    cols = dataset_columns(job, [Path(f) for f in job["input_files"]], prompts)
    names = kept_for(out, job, cols.schema, columns).schema.names
    result = LinesResult(dest)
    writer = _Responses(job, cols.n) if fmt == "openai-batch" else None
    with _atomic(dest) as fh:
        for rows in ordered_chunks(out, units, cols):
            for line in _lines(rows, writer, include_errors, result, names):
                fh.write(line + "\n")
                result.lines += 1
    return result


@contextlib.contextmanager
def _atomic(dest: Path) -> Iterator[IO[str]]:
    """A text file written beside ``dest``, fsynced and renamed to it, or removed on failure."""
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp_name(dest)
        fh = open(tmp, "w", encoding="utf-8")  # noqa: SIM115  (closed below)
    except OSError as exc:
        raise UserError(f"{dest}: cannot be written ({exc.strerror})") from None
    try:
        with fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, dest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def _lines(
    rows: pa.Table,
    writer: _Responses | None,
    include_errors: bool,
    result: LinesResult,
    names: list[str],
) -> Iterator[str]:
    """One chunk's lines: a row each, of the columns ``names`` (``jsonl``), or a response per
    prompt (``writer``)."""
    records = rows.to_pylist()
    result.rows += len(records)
    result.error_rows += sum(r["error"] is not None for r in records)
    if writer is None:
        for r in records:
            if include_errors or r["error"] is None:
                yield json.dumps({n: r[n] for n in names}, ensure_ascii=False, default=str)
        return
    n = writer.n
    for i in range(0, len(records), n):
        samples = records[i : i + n]
        failed = next((r["error"] for r in samples if r["error"] is not None), None)
        if include_errors or failed is None:
            yield json.dumps(writer.response(samples, failed), ensure_ascii=False)


class _Responses:
    """OpenAI batch output lines for one job: its model's name, its tokenizer for log
    probabilities (loaded only if a row has some)."""

    def __init__(self, job: dict[str, Any], n: int):
        spec = job["spec"]
        self.n = n
        self.model = spec["model"]["model"]
        self.base = Path(job.get("base_dir") or ".")
        self.model_spec = spec["model"]
        inp = spec["input"]
        templated = inp.get("messages_column") or inp.get("apply_chat_template", True)
        self.default_url = CHAT if templated else COMPLETIONS
        self.created = int(time.time())
        self._tokenizer: Any = None

    def response(self, samples: list[dict[str, Any]], error: str | None) -> dict[str, Any]:
        """The line for one prompt's samples (``error``: the first sample's error, if any)."""
        first = samples[0]
        custom_id = str(first["id"])
        digest = hashlib.sha1(custom_id.encode()).hexdigest()[:24]
        line: dict[str, Any] = {"id": f"batch_req_{digest}", "custom_id": custom_id}
        if error is not None:
            param = re.search(r"body\.([A-Za-z_]+)", error)
            line["response"] = {"status_code": 400, "request_id": f"req_{digest}", "body": None}
            line["error"] = {
                "message": error,
                "type": "BadRequestError",
                "param": param.group(1) if param else None,
                "code": 400,
            }
            return line
        url = first.get("url") or self.default_url
        body = self._body(samples, url, digest)
        line["response"] = {"status_code": 200, "request_id": f"req_{digest}", "body": body}
        line["error"] = None
        return line

    def _body(self, samples: list[dict[str, Any]], url: str, digest: str) -> dict[str, Any]:
        chat = url == CHAT
        choices = []
        for j, r in enumerate(samples):
            choice: dict[str, Any] = {"index": j}
            text = r["generated_text"] or ""
            if chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            choice["logprobs"] = self._logprobs(r["logprobs"], chat)
            choice["finish_reason"] = r["finish_reason"]
            choice["batchspec"] = {k: r.get(k) for k in MEASURED}
            choices.append(choice)
        prompt = samples[0]["num_prompt_tokens"] or 0
        completion = sum(r["num_output_tokens"] or 0 for r in samples)
        return {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{digest}",
            "object": "chat.completion" if chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            },
        }

    def _logprobs(self, positions: list[list[dict]] | None, chat: bool) -> dict | None:
        """The row's ``logprobs`` column in OpenAI's shape: chat's ``content`` list, or
        completions' parallel lists. A position holds the chosen token, then the others of
        the engine's top k (k entries when the chosen is among the top k, k + 1 when not):
        k is the fewest a position holds, and a position's top k its best k of all."""
        if not positions:
            return None
        tok = self.tokenizer()
        k = min(len(pos) for pos in positions)
        entries = []
        for pos in positions:
            best = sorted(pos, key=lambda c: -c["logprob"])[:k]
            entries.append((self._token(tok, pos[0]), pos[0]["logprob"], best))
        if chat:
            content = [
                {
                    "token": t,
                    "logprob": lp,
                    "bytes": list(t.encode()),
                    "top_logprobs": [
                        {
                            "token": (s := self._token(tok, c)),
                            "logprob": c["logprob"],
                            "bytes": list(s.encode()),
                        }
                        for c in top
                    ],
                }
                for t, lp, top in entries
            ]
            return {"content": content}
        offsets, at = [], 0
        for t, _, _ in entries:
            offsets.append(at)
            at += len(t)
        return {
            "tokens": [t for t, _, _ in entries],
            "token_logprobs": [lp for _, lp, _ in entries],
            "top_logprobs": [
                {self._token(tok, c): c["logprob"] for c in top} for _, _, top in entries
            ],
            "text_offset": offsets,
        }

    @staticmethod
    def _token(tok: Any, cell: dict[str, Any]) -> str:
        return tok.decode([cell["token_id"]])

    def tokenizer(self) -> Any:
        """The job's tokenizer, loaded on first use (only rows with log probabilities)."""
        if self._tokenizer is None:
            from batchspec.models import load_tokenizer, resolve_model

            ref = self.model_spec.get("tokenizer") or self.model
            path = resolve_model(ref, "model.tokenizer", self.base)
            self._tokenizer = load_tokenizer(path, "model.tokenizer")
        return self._tokenizer
