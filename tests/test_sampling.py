"""The sampling keys of a synthetic-data job without an engine: n samples per prompt (rows,
seeds, export's order and id check), per-row settings from columns, the one-line refusals,
vLLM's SamplingParams, and the logprobs column."""

from __future__ import annotations

import json
import sys
import time
import types
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
import yaml

from batchspec.errors import UserError
from batchspec.io.inputs import PromptBuilder, check_columns, row_seed
from batchspec.io.layout import OutDir
from batchspec.io.manifest import Manifest, input_fingerprint
from batchspec.io.planner import plan_units
from batchspec.io.writer import logprob_lists, output_schema, unit_table
from batchspec.observe.export import export_dataset
from batchspec.spec import InputSpec
from batchspec.spec.file import load_spec
from batchspec.spec.sampling import SamplingSpec
from batchspec.spec.tree import VLLM
from batchspec.units import RowResult, UnitResult


class CharTokenizer:
    """One token per character: these tests are about rows, not text."""

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": [ord(c) for c in text]}


def make_input(path: Path, rows: int, **columns: list[Any]) -> Path:
    domains = ["a", "b"]
    table = {
        "id": [f"r{i}" for i in range(rows)],
        "domain": [domains[(i * 5 // 3) % 2] for i in range(rows)],
        "prompt": [f"prompt {i}" for i in range(rows)],
        **columns,
    }
    pq.write_table(pa.table(table), path)
    return path


RAW = InputSpec(path="x", prompt_column="prompt", domain_column="domain", apply_chat_template=False)
FLAT = RAW.model_copy(update={"domain_column": None})


def test_n_samples_are_consecutive_rows_with_seeds_of_their_own(tmp_path: Path) -> None:
    f = make_input(tmp_path / "in.parquet", 9)
    unit = plan_units([f], 8, "domain")[0]
    one = PromptBuilder(RAW, CharTokenizer(), 100, 7).build(unit)
    three = PromptBuilder(RAW, CharTokenizer(), 100, 7, sampling=SamplingSpec(n=3)).build(unit)
    assert len(three.rows) == 3 * len(one.rows)
    assert [r.sample_index for r in three.rows] == [0, 1, 2] * len(one.rows)
    assert [r.row_id for r in three.rows] == [r.row_id for r in one.rows for _ in range(3)]
    # Sample 0 keeps the row's seed (n=1 runs are unchanged); every sample has its own.
    assert [r.seed for r in three.rows[::3]] == [r.seed for r in one.rows]
    assert len({r.seed for r in three.rows}) == len(three.rows)
    assert three.rows[4].seed == row_seed(7, 0, three.rows[4].row, 1)


def test_per_row_settings_come_from_columns_and_bad_values_are_error_rows(
    tmp_path: Path,
) -> None:
    budget = [5.0, None, 0.0, 7.0, 9.0, 11.5]
    temp = [0.5, 1.0, 1.0, -1.0, None, 2]
    f = make_input(tmp_path / "in.parquet", 6, budget=budget, temp=temp)
    sampling = SamplingSpec(n=2, columns={"max_tokens": "budget", "temperature": "temp"})
    units = plan_units([f], 6, None)
    rows = PromptBuilder(FLAT, CharTokenizer(), 100, None, sampling=sampling).build(units[0]).rows
    by_id = {r.row_id: r for r in rows if r.sample_index == 1}
    assert by_id["r0"].sampling.max_tokens == 5 and by_id["r0"].sampling.temperature == 0.5
    assert by_id["r1"].sampling is None or by_id["r1"].sampling.max_tokens == 256
    assert by_id["r4"].sampling.max_tokens == 9 and by_id["r4"].sampling.temperature == 0.0
    assert "column 'budget' (sampling.max_tokens) = 11.5" in by_id["r5"].error
    # Out of range: an error row naming the column, for each of its samples; no crash.
    assert "column 'budget' (sampling.max_tokens) = 0" in by_id["r2"].error  # whole floats: ints
    assert "column 'temp' (sampling.temperature) = -1.0" in by_id["r3"].error
    assert sum(r.error is not None for r in rows) == 6
    assert all(r.prompt_token_ids is None for r in rows if r.error)


def test_setting_columns_must_exist_and_hold_numbers(tmp_path: Path) -> None:
    f = make_input(tmp_path / "in.parquet", 3, budget=["a", "b", "c"])
    with pytest.raises(UserError, match=r"sampling.columns.max_tokens 'nope' is not a column"):
        check_columns([f], RAW, SamplingSpec(columns={"max_tokens": "nope"}))
    with pytest.raises(UserError, match=r"sampling.columns.max_tokens: column 'budget' must"):
        check_columns([f], RAW, SamplingSpec(columns={"max_tokens": "budget"}))


def write_job(tmp_path: Path, **sampling: Any) -> Path:
    job = {
        "input": {"path": "in.parquet", "prompt_column": "prompt"},
        "output": {"dir": "out"},
        "model": {"model": "builtin:smollm2-135m-instruct"},
        "speculative": {"method": "ngram", "engine": "tree"},
        "sampling": sampling,
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


@pytest.mark.parametrize(
    "sampling",
    [
        {"min_tokens": 3, "stop": ["END"]},
        {"prompt_logprobs": 2},
        {"json_schema": {"type": "object"}},
        {"columns": {"min_tokens": "m"}, "stop": ["END"]},
    ],
)
def test_what_the_tree_engine_does_not_apply_is_refused_naming_the_key(
    tmp_path: Path, sampling: dict[str, Any]
) -> None:
    with pytest.raises(UserError) as exc:
        load_spec(write_job(tmp_path, **sampling), [])
    msg = str(exc.value)
    key = "min_tokens" if "stop" in sampling else next(iter(sampling))
    assert "\n" not in msg and f"sampling.{key}" in msg and "tree" in msg
    # The same keys on vLLM are taken.
    load_spec(write_job(tmp_path, **sampling), ["speculative.engine=vllm"])


def test_bad_sampling_keys_are_one_line_errors(tmp_path: Path) -> None:
    job = write_job(tmp_path)
    for sets, needle in [
        (["sampling.n=0"], "sampling.n"),
        (["sampling.columns={tempo: x}"], "'tempo' is not a per-row setting"),
        (["sampling.json_schema={type: objekt}"], "not a valid JSON schema"),
        (["sampling.logprobs=21"], "sampling.logprobs"),
        (["sampling.regex=a", "sampling.choice=[b]"], "at most one of"),
        (["sampling.min_tokens=9", "sampling.max_tokens=8"], "min_tokens 9 > max_tokens 8"),
    ]:
        with pytest.raises(UserError) as exc:
            load_spec(job, ["speculative.engine=vllm", *sets])
        assert needle in str(exc.value) and "\n" not in str(exc.value)


class Params:
    """Stands in for vLLM's ``SamplingParams`` and ``StructuredOutputsParams`` (importing vLLM
    costs ~20 s of a loaded CI machine): keeps the keywords it is given. That vLLM takes them
    is what the engine runs show (test_e2e: n, logprobs; verify and synth_extract: penalties,
    min_tokens, json_schema)."""

    def __init__(self, **kwargs: Any) -> None:
        self.__dict__.update(kwargs)


def test_vllm_sampling_params_carry_every_key(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("vllm.sampling_params")
    fake.SamplingParams = fake.StructuredOutputsParams = Params  # type: ignore[attr-defined]
    fake.RequestOutputKind = types.SimpleNamespace(FINAL_ONLY="final")  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", fake)
    from batchspec.engines.vllm_args import sampling_params

    spec = load_spec(
        Path(__file__).parents[1] / "jobs" / "synth_data.yaml",
        [
            "sampling.min_tokens=3",
            "sampling.repetition_penalty=1.1",
            "sampling.frequency_penalty=0.4",
            "sampling.presence_penalty=0.2",
            "sampling.logprobs=2",
            "sampling.prompt_logprobs=1",
            "sampling.json_schema={type: object, properties: {a: {type: integer}}}",
        ],
    )
    p = sampling_params(spec, seed=5)
    assert (p.min_tokens, p.repetition_penalty, p.frequency_penalty) == (3, 1.1, 0.4)
    assert (p.presence_penalty, p.logprobs, p.prompt_logprobs, p.seed) == (0.2, 2, 1, 5)
    assert json.loads(p.structured_outputs.json)["properties"]["a"] == {"type": "integer"}
    assert sampling_params(spec, logprobs=5).logprobs == 5  # verify's 5 when it asks more
    row = spec.sampling.for_row({"max_tokens": 9, "temperature": 0.5})[0]
    assert (
        sampling_params(spec, row=row).max_tokens,
        sampling_params(spec, row=row).temperature,
    ) == (9, 0.5)
    plain = load_spec(Path(__file__).parents[1] / "jobs" / "synth_data.yaml", [])
    p = sampling_params(plain)
    assert p.logprobs is None and p.structured_outputs is None and p.min_tokens == 0


def test_logprobs_column_puts_the_generated_token_first_then_the_best() -> None:
    tops = [{3: -0.1, 7: -2.5, 1: -3.0}, {4: -0.7, 9: -0.2}]
    got = logprob_lists(tops, [7, 4])
    assert [[d["token_id"] for d in pos] for pos in got] == [[7, 3, 1], [4, 9]]
    assert got[0][0]["logprob"] == -2.5


def test_written_rows_carry_sample_index_and_logprobs(tmp_path: Path) -> None:
    f = make_input(tmp_path / "in.parquet", 2)
    unit = plan_units([f], 2, None)[0]
    reqs = PromptBuilder(FLAT, CharTokenizer(), 100, 1, sampling=SamplingSpec(n=2)).build(unit)
    results = [
        RowResult(r, text="x", num_output_tokens=1, token_ids=[5], top_logprobs=[{5: -0.5}])
        for r in reqs.rows
    ]
    table = unit_table(UnitResult(reqs, results, 0, "none", VLLM), output_schema(pa.string(), {}))
    assert table.column("sample_index").to_pylist() == [0, 1, 0, 1]
    assert table.column("logprobs")[0].as_py() == [[{"token_id": 5, "logprob": -0.5}]]
    assert table.column("prompt_logprobs").null_count == 4


def n_sample_run(tmp: Path, rows: int, n: int) -> OutDir:
    """An input with interleaved domains and every unit committed with n samples per row."""
    inp = make_input(tmp / "in.parquet", rows)
    domains = pq.read_table(inp).column("domain").to_pylist()
    out = OutDir(tmp / "out")
    units = plan_units([inp], 4, "domain")
    manifest = Manifest("h", input_fingerprint([inp]), None, len(units), rows, time.time(), "0")
    out.parts.mkdir(parents=True)
    out.manifest.write_text(json.dumps(manifest.__dict__))
    spec = {
        "input": {"id_column": "id", "prompt_column": "prompt", "domain_column": "domain"},
        "output": {"unit_rows": 4},
        "model": {"model": "m", "dtype": "float32", "max_num_seqs": 4},
        "speculative": {"method": "ngram", "num_speculative_tokens": 3},
        "sampling": {"temperature": 1.0, "max_tokens": 8, "n": n},
    }
    record = {"spec": spec, "base_dir": str(tmp), "input_files": [str(inp)], "limit": None}
    out.job_record.write_text(json.dumps(record))
    schema = output_schema(pa.string(), {})
    for u in units:
        part = [
            {"id": f"r{i}", "domain": u.domain, "unit_id": u.unit_id, "sample_index": j}
            | {"generated_text": f"{i}.{j}", "engine": "vllm", "spec_method": "none"}
            for i in range(u.start, u.stop)
            if domains[i] == u.domain
            for j in range(n)
        ]
        pq.write_table(pa.Table.from_pylist(part, schema), out.part(u.unit_id))
    return out


def test_export_writes_each_prompts_samples_together_in_input_order(tmp_path: Path) -> None:
    out = n_sample_run(tmp_path, 10, 3)
    r = export_dataset(out, tmp_path / "ds")
    got = pads.dataset(tmp_path / "ds" / "data", format="parquet").to_table()
    assert got.column("id").to_pylist() == [f"r{i}" for i in range(10) for _ in range(3)]
    assert got.column("sample_index").to_pylist() == [0, 1, 2] * 10
    assert got.column("generated_text").to_pylist() == [
        f"{i}.{j}" for i in range(10) for j in range(3)
    ]
    assert got.column("prompt").to_pylist() == [f"prompt {i}" for i in range(10) for _ in range(3)]
    assert r.rows == 30 and r.missing_rows == 0


def test_export_counts_each_id_n_times_and_refuses_a_wrong_sample(tmp_path: Path) -> None:
    out = n_sample_run(tmp_path, 10, 2)
    part = next(p for p in out.part_files() if pq.read_metadata(p).num_rows >= 4)
    table = pq.read_table(part)
    samples = table.column("sample_index").to_pylist()
    samples[1] = 0  # a prompt's sample 0 twice, its sample 1 gone
    at = table.schema.get_field_index("sample_index")
    pq.write_table(table.set_column(at, "sample_index", pa.array(samples, pa.int32())), part)
    with pytest.raises(UserError, match=r"sample_index 0 where sample 1 of 2 belongs"):
        export_dataset(out, tmp_path / "ds")
    pq.write_table(table.slice(0, table.num_rows - 1), part)
    with pytest.raises(UserError, match=r"x 2 sample\(s\)"):
        export_dataset(out, tmp_path / "ds2")
