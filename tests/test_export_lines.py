"""``batchspec export --format jsonl|openai-batch`` (issue 37): the rows in input order with the
Parquet export's id checks, one JSON object per row, or one OpenAI batch response per prompt.
On a synthetic run (``test_observe_units.synthetic_run``): no engine starts."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from click.testing import CliRunner
from test_observe_units import exported, synthetic_run

from batchspec.cli import main
from batchspec.observe.export import export_dataset
from batchspec.observe.export_lines import _Responses, export_lines


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_jsonl_holds_the_datasets_rows_in_input_order(tmp_path: Path) -> None:
    out = synthetic_run(tmp_path)
    export_dataset(out, tmp_path / "ds")
    want = exported(tmp_path / "ds").to_pylist()
    r = export_lines(out, tmp_path / "rows.jsonl", "jsonl")
    got = read_lines(tmp_path / "rows.jsonl")
    assert (r.lines, r.rows) == (30, 30) and [g["id"] for g in got] == [
        f"r{i:05d}" for i in range(30)
    ]
    assert got == want
    dropped = export_lines(out, tmp_path / "ok.jsonl", "jsonl", include_errors=False)
    assert dropped.lines == 30 - dropped.error_rows and dropped.error_rows == 3
    assert not any(g["error"] for g in read_lines(tmp_path / "ok.jsonl"))


def test_openai_batch_has_a_response_or_an_error_per_prompt(tmp_path: Path) -> None:
    out = synthetic_run(tmp_path)
    result = CliRunner().invoke(
        main, ["export", str(out), "--to", str(tmp_path / "r.jsonl"), "--format", "openai-batch"]
    )
    assert result.exit_code == 0, result.stderr
    lines = read_lines(tmp_path / "r.jsonl")
    assert [x["custom_id"] for x in lines] == [f"r{i:05d}" for i in range(30)]
    ok, bad = lines[0], lines[5]  # row 5 is an error row (every 11th from 5)
    body = ok["response"]["body"]
    assert ok["error"] is None and ok["response"]["status_code"] == 200
    assert body["object"] == "chat.completion" and body["model"] == "m"
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"]
    assert choice["batchspec"]["spec_method"] == "none" and body["usage"]["completion_tokens"] == 4
    assert bad["response"] == {"status_code": 400, "request_id": bad["response"]["request_id"],
                               "body": None}  # fmt: skip
    assert bad["error"]["message"] == "prompt is empty" and bad["error"]["code"] == 400


def test_a_repeated_id_is_refused_as_for_parquet(tmp_path: Path) -> None:
    out = synthetic_run(tmp_path)
    part = next(p for p in out.part_files() if pq.read_metadata(p).num_rows >= 2)
    table = pq.read_table(part)
    ids = table.column("id").to_pylist()
    ids[-1] = ids[0]
    pq.write_table(table.set_column(0, "id", pa.array(ids)), part)
    dest = tmp_path / "r.jsonl"
    result = CliRunner().invoke(main, ["export", str(out), "--to", str(dest), "--format", "jsonl"])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert part.name in result.stderr and not dest.exists()
    assert not list(tmp_path.glob(".r.jsonl.*"))  # the temporary file is gone too


def test_an_existing_file_is_refused(tmp_path: Path) -> None:
    out = synthetic_run(tmp_path)
    (tmp_path / "r.jsonl").write_text("keep\n")
    args = ["export", str(out), "--to", str(tmp_path / "r.jsonl"), "--format", "jsonl"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and "exists" in result.stderr
    assert (tmp_path / "r.jsonl").read_text() == "keep\n"


def test_samples_are_one_responses_choices_and_completions_have_text() -> None:
    job = {"spec": {"model": {"model": "m"}, "input": {"prompt_column": "p"}}}
    writer = _Responses(job, 2)
    rows = [
        {"id": 7, "url": "/v1/completions", "generated_text": t, "finish_reason": "stop",
         "num_prompt_tokens": 5, "num_output_tokens": 3, "logprobs": None, "error": None}
        for t in ("a", "b")
    ]  # fmt: skip
    line = writer.response(rows, None)
    body = line["response"]["body"]
    assert line["custom_id"] == "7" and body["object"] == "text_completion"
    assert [c["text"] for c in body["choices"]] == ["a", "b"]
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11}
    error = writer.response(rows, "line 3: body.tools is not supported by batchspec")
    assert error["error"]["param"] == "tools" and error["response"]["status_code"] == 400
