"""Output rows and atomic part commits (no engine: results built by hand)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from conftest import SPECULATIVE_MEASURED

from batchspec.engine import RowResult, UnitResult
from batchspec.inputs import RowRequest, UnitRequests
from batchspec.planner import WorkUnit
from batchspec.writer import (
    RESULT_FIELDS,
    commit_part,
    committed_units,
    output_schema,
    part_path,
    unit_table,
)

UNIT = WorkUnit(0, "in.parquet", 0, 3, "code", 3)
SCHEMA = output_schema(pa.string(), {"source": pa.string()})
TIMING = {"queued": 10.0, "scheduled": 10.5, "first_token": 11.0, "last_token": 13.0}


def request(i: int, error: str | None = None) -> RowRequest:
    return RowRequest(
        row=i,
        row_id=f"r{i}",
        domain="code",
        passthrough={"source": "s"},
        prompt_token_ids=None if error else [1, 2, 3],
        error=error,
    )


def spec_metrics(hist: list[int], drafted: int) -> dict:
    steps = sum(hist)
    accepted = sum(j * c for j, c in enumerate(hist))
    return {
        "acceptance_histogram": hist,
        "num_spec_steps": steps,
        "num_accepted_draft_tokens": accepted,
        "num_draft_tokens": drafted,
    }


def table_for(results: list[RowResult], method: str = "ngram", k: int = 3) -> pa.Table:
    reqs = UnitRequests(UNIT, [r.request for r in results])
    return unit_table(UnitResult(reqs, results, k, method), SCHEMA)


def test_schema_order_and_types() -> None:
    names = SCHEMA.names
    assert names[:3] == ["id", "domain", "source"]
    assert names[3:] == [f.name for f in RESULT_FIELDS]
    assert SCHEMA.field("acceptance_histogram").type == pa.list_(pa.int32())


def test_speculative_row() -> None:
    r = RowResult(
        request(0),
        text="hi",
        num_prompt_tokens=3,
        num_output_tokens=9,
        finish_reason="stop",
        spec=spec_metrics([1, 0, 2, 1], 12),
        timing=TIMING,
    )
    row = table_for([r]).to_pylist()[0]
    assert row["num_accepted_tokens"] == 7 and row["num_draft_tokens"] == 12
    assert row["acceptance_rate"] == 7 / 12
    assert row["mean_acceptance_length"] == 1 + 7 / 4
    assert row["acceptance_histogram"] == [1, 0, 2, 1]
    assert (row["queue_s"], row["ttft_s"], row["decode_s"], row["e2e_s"]) == (0.5, 1.0, 2.0, 3.0)
    assert row["output_tokens_per_s"] == 9 / 2.5
    assert row["unit_id"] == UNIT.unit_id and row["error"] is None


def test_no_speculation_gives_nulls_not_zeros() -> None:
    r = RowResult(
        request(0),
        text="hi",
        num_prompt_tokens=3,
        num_output_tokens=9,
        finish_reason="length",
        spec=None,
        timing=TIMING,
    )
    row = table_for([r], method="none", k=0).to_pylist()[0]
    assert row["spec_method"] == "none" and row["num_speculative_tokens"] == 0
    for col in SPECULATIVE_MEASURED:
        assert row[col] is None, col


def test_nothing_drafted_gives_null_rate() -> None:
    r = RowResult(
        request(0),
        text="x",
        num_prompt_tokens=3,
        num_output_tokens=1,
        finish_reason="stop",
        spec=spec_metrics([0, 0, 0, 0], 0),
        timing=TIMING,
    )
    row = table_for([r]).to_pylist()[0]
    assert row["num_spec_steps"] == 0 and row["acceptance_rate"] is None
    assert row["mean_acceptance_length"] is None


def test_error_row_has_no_generation_columns() -> None:
    row = table_for(
        [RowResult(request(0, "prompt is empty"), error="prompt is empty")]
    ).to_pylist()[0]
    assert row["error"] == "prompt is empty" and row["id"] == "r0" and row["source"] == "s"
    assert row["generated_text"] is None and row["spec_method"] is None


def test_commit_first_wins_and_leaves_no_temp(tmp_path: Path) -> None:
    t1 = table_for([RowResult(request(0, "a"), error="a")])
    t2 = table_for([RowResult(request(0, "b"), error="b")])
    assert commit_part(tmp_path, UNIT.unit_id, t1) is True
    assert commit_part(tmp_path, UNIT.unit_id, t2) is False
    assert pq.read_table(part_path(tmp_path, UNIT.unit_id)).column("error").to_pylist() == ["a"]
    assert committed_units(tmp_path) == {UNIT.unit_id}
    assert [p.name for p in (tmp_path / "parts").iterdir()] == [f"{UNIT.unit_id}.parquet"]
