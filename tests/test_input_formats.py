"""Inputs that are not Parquet (issue 37): JSONL, OpenAI batch files and Hugging Face dataset
folders, detected by ``input.format: auto``, staged once into Parquet, validated, and their bad
lines turned into error rows naming the line or refused in one line. No engine starts: rows are
built with a stand-in tokenizer, the CLI runs in this process.

The saved-dataset fixtures are written the way ``datasets``' ``save_to_disk`` writes them
(Arrow IPC streams listed by ``state.json``; ``dataset_dict.json`` above the splits), with
pyarrow, so the suite needs no ``datasets``.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import PROMPTS, job_dict
from test_cli_errors import assert_user_error, cli

from batchspec.io.checks import preflight
from batchspec.io.inputs import PromptBuilder
from batchspec.spec.file import load_spec
from batchspec.spec.input import detect_format

ROWS = pq.read_table(PROMPTS).slice(0, 24).to_pylist()
"""The shipped prompts (id, messages, domain, source ...), the first 24."""


def write_jsonl(path: Path, records: list[Any]) -> Path:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "wt", encoding="utf-8") as fh:
        for r in records:
            fh.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return path


def chat_records() -> list[dict[str, Any]]:
    return [{k: r[k] for k in ("id", "messages", "domain", "source")} for r in ROWS]


def request(custom_id: str, body: dict[str, Any], url: str = "/v1/chat/completions") -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def requests() -> list[dict[str, Any]]:
    return [request(r["id"], {"messages": r["messages"], "max_tokens": 16}) for r in ROWS]


def save_to_disk(folder: Path, splits: dict[str, list[dict]]) -> Path:
    """A ``DatasetDict.save_to_disk`` folder, as ``datasets`` writes it."""
    folder.mkdir(parents=True)
    (folder / "dataset_dict.json").write_text(json.dumps({"splits": list(splits)}))
    for name, rows in splits.items():
        (folder / name).mkdir()
        table = pa.Table.from_pylist(rows)
        path = str(folder / name / "data-00000-of-00001.arrow")
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
            for batch in table.to_batches(max_chunksize=7):
                writer.write_batch(batch)
        state = {"_data_files": [{"filename": "data-00000-of-00001.arrow"}], "_split": name}
        (folder / name / "state.json").write_text(json.dumps(state))
        (folder / name / "dataset_info.json").write_text("{}")
    return folder


def hub_folder(folder: Path, suffix: str) -> Path:
    """A Hub-style folder: shards whose names say their split, and a card."""
    (folder / "data").mkdir(parents=True)
    (folder / "README.md").write_text("---\nlicense: mit\n---\n")
    records = chat_records()
    parts = {"train-00000-of-00002": records[:10], "train-00001-of-00002": records[10:20]}
    parts["test-00000-of-00001"] = records[20:]
    for name, rows in parts.items():
        if suffix == ".parquet":
            pq.write_table(pa.Table.from_pylist(rows), folder / "data" / f"{name}.parquet")
        else:
            write_jsonl(folder / "data" / f"{name}{suffix}", rows)
    return folder


def job_file(tmp: Path, inp: dict[str, Any], **sections: dict[str, Any]) -> Path:
    job = job_dict(tmp / "out", input=None, speculative={"method": "none"}, **sections)
    job["input"] = inp
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return path


CHAT = {"messages_column": "messages", "domain_column": "domain"}


def test_auto_detects_each_kind(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "a.jsonl", chat_records())
    write_jsonl(tmp_path / "b.jsonl", requests())
    write_jsonl(tmp_path / "c.jsonl.gz", requests())
    save_to_disk(tmp_path / "saved", {"train": chat_records()})
    hub_folder(tmp_path / "hub", ".parquet")
    found = {p: detect_format(p, tmp_path) for p in ("a.jsonl", "b.jsonl", "c.jsonl.gz", "saved")}
    assert found == {"a.jsonl": "jsonl", "b.jsonl": "openai-batch", "c.jsonl.gz": "openai-batch",
                     "saved": "hf"}  # fmt: skip
    assert detect_format(str(PROMPTS), tmp_path) == "parquet"
    assert detect_format("hub", tmp_path) == "parquet"  # a folder of Parquet, as before
    assert detect_format("hub", tmp_path, split=True) == "hf"
    assert detect_format("*.jsonl", tmp_path) == "jsonl"
    assert detect_format("missing.jsonl", tmp_path) is None


@pytest.mark.parametrize(
    "kind",
    ["jsonl", "jsonl-prompt", "openai-batch", "saved", "hub-parquet", "hub-jsonl", "saved-test"],
)
def test_validate_passes_for_each_kind(tmp_path: Path, kind: str) -> None:
    inp: dict[str, Any] = {"path": "in.jsonl", **CHAT}
    rows = 24
    if kind == "jsonl":
        write_jsonl(tmp_path / "in.jsonl", chat_records())
    elif kind == "jsonl-prompt":
        write_jsonl(tmp_path / "in.jsonl", [{"id": i, "text": f"Say {i}"} for i in range(30)])
        inp, rows = {"path": "in.jsonl", "prompt_column": "text"}, 30
    elif kind == "openai-batch":
        write_jsonl(tmp_path / "in.jsonl", requests())
        inp = {"path": "in.jsonl"}
    elif kind.startswith("saved"):
        save_to_disk(tmp_path / "ds", {"train": chat_records()[:20], "test": chat_records()[20:]})
        inp, rows = {"path": "ds", "format": "hf", **CHAT}, 20
        if kind == "saved-test":
            inp["split"], rows = "test", 4
    else:
        hub_folder(tmp_path / "ds", ".parquet" if kind == "hub-parquet" else ".jsonl")
        inp, rows = {"path": "ds", "format": "hf", **CHAT}, 20
    result = cli("validate", str(job_file(tmp_path, inp)))
    assert result.returncode == 0, result.stderr
    assert f" {rows} rows," in result.stdout, result.stdout


def build_rows(job: Path) -> dict[Any, Any]:
    """Every row of the job as the prompt builder makes it: id -> (error or token count)."""
    spec = load_spec(job)
    pre = preflight(spec)
    builder = PromptBuilder(spec.input, ChatTokenizer(), 4096, 0, pre.reader, spec.sampling)
    rows = {}
    for unit in pre.units:
        for r in builder.build(unit).rows:
            rows[r.row_id] = r
    return rows


class ChatTokenizer:
    """Stands in for a tokenizer with a chat template: a token per character."""

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": [ord(c) for c in text]}

    def apply_chat_template(self, messages: list[dict], **_: Any) -> str:
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"


def test_bad_jsonl_lines_become_error_rows_naming_the_line(tmp_path: Path) -> None:
    good = {"id": "g", "text": "hello", "k": 1, "max_new": 8}
    lines = [
        good,
        {"id": "null-prompt", "text": None, "k": 2},
        {"id": "number-prompt", "text": 5, "k": 3},
        {"id": "blank", "text": "   ", "k": 4},
        "",  # a blank line is skipped, as vLLM and datatrove skip them
        {"id": "bad-k", "text": "hi", "k": "x"},
        {"id": "bad-max", "text": "hi", "max_new": -3},
        {"id": "list-k", "text": "hi", "k": [1]},
    ]
    write_jsonl(tmp_path / "in.jsonl", lines)
    inp = {"path": "in.jsonl", "prompt_column": "text", "passthrough_columns": ["k"]}
    job = job_file(tmp_path, inp, sampling={"columns": {"max_tokens": "max_new"}})
    rows = build_rows(job)
    assert rows["g"].error is None and rows["g"].sampling.max_tokens == 8
    assert rows["null-prompt"].error == "line 2: prompt 'text' is missing"
    assert rows["number-prompt"].error == "line 3: prompt 'text' is not a string"
    assert rows["blank"].error == "line 4: prompt is empty"
    assert "max_new" in rows["bad-max"].error and rows["bad-max"].prompt_token_ids is None
    # A column's type comes from its first batch of lines: here text, with a list as JSON.
    assert [rows[k].passthrough["k"] for k in ("g", "bad-k", "list-k")] == ["1", "x", "[1]"]


def test_a_value_that_does_not_fit_its_column_makes_an_error_row(tmp_path: Path) -> None:
    lines = [{"id": i, "text": "hi", "k": i} for i in range(8200)]
    lines[8195]["k"] = "x"  # past the first batch of lines, which typed k as integers
    write_jsonl(tmp_path / "in.jsonl", lines)
    inp = {"path": "in.jsonl", "prompt_column": "text", "passthrough_columns": ["k"]}
    spec = load_spec(job_file(tmp_path, inp))
    table = pq.read_table(preflight(spec).files[0], columns=["k", "__error"]).slice(8190)
    assert table.column("__error").to_pylist()[5] == "line 8196: column 'k' holds 'x', not int64"
    assert table.column("k").to_pylist()[4:7] == [8194, None, 8196]


def test_openai_batch_requests_map_their_fields_and_refuse_the_rest(tmp_path: Path) -> None:
    chat = [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    lines = [
        request("ok", {"model": "builtin:smollm2-135m-instruct", "messages": chat,
                       "max_completion_tokens": 9, "max_tokens": 99, "temperature": 0.5,
                       "top_p": 0.9, "seed": 7, "stop": "END", "presence_penalty": 0.1,
                       "logprobs": True, "top_logprobs": 2, "user": "u",
                       "response_format": {"type": "json_schema",
                                           "json_schema": {"schema": {"type": "object"}}}}),
        request("done", {"prompt": "Once upon", "logprobs": 1}, "/v1/completions"),
        request("model", {"model": "gpt-4o", "messages": chat}),
        request("tools", {"messages": chat, "tools": []}),
        request("url", {"input": "x"}, "/v1/embeddings"),
        request("temp", {"messages": chat, "temperature": -1}),
        request("n", {"messages": chat, "n": 3}),
        request("image", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
        request("toplp", {"messages": chat, "top_logprobs": 2}),
    ]  # fmt: skip
    write_jsonl(tmp_path / "in.jsonl", lines)
    rows = build_rows(job_file(tmp_path, {"path": "in.jsonl"}))
    ok = rows["ok"]
    assert ok.error is None and ok.seed == 7 and ok.prompt_token_ids is not None
    s = ok.sampling
    assert (s.max_tokens, s.temperature, s.top_p, s.stop) == (9, 0.5, 0.9, ["END"])
    assert (s.presence_penalty, s.logprobs, s.json_schema) == (0.1, 2, {"type": "object"})
    assert ok.passthrough["url"] == "/v1/chat/completions"
    done = rows["done"]  # raw text: no chat template
    assert done.prompt_token_ids == [ord(c) for c in "Once upon"] and done.sampling.logprobs == 1
    errors = {k: r.error for k, r in rows.items() if r.error}
    assert errors == {
        "model": "line 3: body.model 'gpt-4o' is not this job's model "
        "(builtin:smollm2-135m-instruct)",
        "tools": "line 4: body.tools is not supported by batchspec",
        "url": "line 5: url '/v1/embeddings' is not served by batchspec "
        "(/v1/chat/completions, /v1/completions)",
        "temp": "line 6: body.temperature = -1: Input should be greater than or equal to 0",
        "n": "line 7: body.n = 3: every request runs with the job's n (1)",
        "image": "line 8: body.messages[0].content[0] is a 'image_url' part; only text parts "
        "are supported",
        "toplp": "line 9: body.top_logprobs needs body.logprobs: true",
    }


def test_structured_output_per_request_is_refused_on_the_tree_engine(tmp_path: Path) -> None:
    fmt = {"type": "json_object"}
    lines = [request("a", {"messages": [{"role": "user", "content": "x"}], "response_format": fmt})]
    write_jsonl(tmp_path / "in.jsonl", lines)
    job = job_file(tmp_path, {"path": "in.jsonl"})
    spec = load_spec(job, ["speculative.engine=tree", "speculative.method=ngram"])
    pre = preflight(spec)
    table = pq.read_table(pre.files[0])
    assert table.column("__error").to_pylist() == [
        "line 1: body.response_format: not supported on the tree engine; use vLLM"
    ]


def test_a_staged_copy_is_made_once_with_unit_sized_row_groups(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "in.jsonl", chat_records() * 1)
    job = job_file(tmp_path, {"path": "in.jsonl", **CHAT})
    first = preflight(load_spec(job))
    meta = pq.ParquetFile(first.files[0]).metadata
    assert [meta.row_group(g).num_rows for g in range(meta.num_row_groups)] == [8, 8, 8]
    mtime = first.files[0].stat().st_mtime_ns
    again = preflight(load_spec(job))
    assert again.files == first.files and first.files[0].stat().st_mtime_ns == mtime
    write_jsonl(tmp_path / "in.jsonl", chat_records()[:5])  # a changed input: a new copy
    assert preflight(load_spec(job)).num_rows == 5


REFUSED = [
    pytest.param(["not json"], {}, ["in.jsonl: line 1: not JSON"], id="not JSON"),
    pytest.param([[1, 2]], {}, ["in.jsonl: line 1: a list, not a JSON object"], id="not object"),
    pytest.param([{"text": "hi"}], {}, ["in.jsonl: line 1: no input.id_column 'id'"],
                 id="no id"),
    pytest.param([{"id": 1, "text": "a"}, {"id": "2", "text": "b"}], {},
                 ["line 2: the id '2' as input.id_column 'id'", "an integer as on the first"],
                 id="id type changes"),
    pytest.param([{"id": 1, "text": "a"}, {"id": 1, "text": "b"}], {},
                 ["in.jsonl: line 2: input.id_column 'id': id 1 repeats the id at",
                  "in.jsonl: line 1"], id="repeated id"),
    pytest.param([{"id": 1, "txt": "a"}], {},
                 ["input.prompt_column 'text' is in none of the first 1 lines (their keys: id, "
                  "txt)"], id="misnamed column"),
    pytest.param([], {}, ["in.jsonl: no rows (the file is empty)"], id="empty file"),
    pytest.param([request("a", {})], {"format": "openai-batch"},
                 ["input.prompt_column: an OpenAI batch file's columns are the format's"],
                 id="openai with prompt column"),
    pytest.param([{"method": "POST", "body": {}, "custom_id": 5}], {"prompt_column": None},
                 ["in.jsonl: line 1: custom_id 5 is not a string"], id="custom_id type"),
    pytest.param([request("a", {}), request("a", {})], {"prompt_column": None},
                 ["in.jsonl: line 2: input.id_column 'custom_id': id 'a' repeats"],
                 id="repeated custom_id"),
    pytest.param([{"id": 1, "text": "a"}], {"format": "hf", "split": "test"},
                 ["input.split: ", "in.jsonl is one file, not a dataset with splits"],
                 id="split of a file"),
]  # fmt: skip


@pytest.mark.parametrize(("lines", "change", "needles"), REFUSED)
def test_bad_input_files_are_refused_in_one_line(
    tmp_path: Path, lines: list, change: dict, needles: list[str]
) -> None:
    write_jsonl(tmp_path / "in.jsonl", lines)
    inp = {"path": "in.jsonl", "prompt_column": "text", **change}
    inp = {k: v for k, v in inp.items() if v is not None}
    result = cli("validate", str(job_file(tmp_path, inp)))
    assert_user_error(result, *needles)
    assert not (tmp_path / "out").exists()


def test_hf_split_choice_is_named(tmp_path: Path) -> None:
    save_to_disk(tmp_path / "ds", {"test": chat_records()[:4], "validation": chat_records()[4:8]})
    result = cli("validate", str(job_file(tmp_path, {"path": "ds", "format": "hf", **CHAT})))
    assert_user_error(result, "input.split:", "has the splits test, validation; name one")
    job = job_file(tmp_path, {"path": "ds", "format": "hf", "split": "dev", **CHAT})
    assert_user_error(cli("validate", str(job)), "'dev' is not a split of")
