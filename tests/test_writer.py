"""Output rows and atomic part commits (no engine: results built by hand)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from conftest import SPECULATIVE_MEASURED

from batchspec.io.layout import OutDir
from batchspec.io.writer import RESULT_FIELDS, Commit, PartWriter, output_schema, unit_table
from batchspec.spec.tree import TREE, VLLM, EngineName
from batchspec.units import RowRequest, RowResult, SpecStats, UnitRequests, UnitResult, WorkUnit

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


def spec_metrics(hist: list[int], drafted: int) -> SpecStats:
    accepted = sum(j * c for j, c in enumerate(hist))
    return SpecStats(sum(hist), drafted, accepted, tuple(hist))


def generated(text: str, output_tokens: int, finish: str, spec: SpecStats | None) -> RowResult:
    """Row 0 as an engine returns it: a 3-token prompt, generated with ``TIMING``."""
    return RowResult(
        request(0),
        text=text,
        num_prompt_tokens=3,
        num_output_tokens=output_tokens,
        finish_reason=finish,
        spec=spec,
        timing=TIMING,
    )


def result_of(
    results: list[RowResult], method: str = "ngram", k: int = 3, engine: EngineName = VLLM
) -> UnitResult:
    requests = UnitRequests(UNIT, [r.request for r in results])
    return UnitResult(requests, results, k, method, engine)


def table_for(
    results: list[RowResult], method: str = "ngram", k: int = 3, engine: EngineName = VLLM
) -> pa.Table:
    return unit_table(result_of(results, method, k, engine), SCHEMA)


def test_schema_order_and_types() -> None:
    names = SCHEMA.names
    assert names[:3] == ["id", "domain", "source"]
    assert names[3:] == [f.name for f in RESULT_FIELDS]
    assert SCHEMA.field("acceptance_histogram").type == pa.list_(pa.int32())


def test_speculative_row() -> None:
    r = generated("hi", 9, "stop", spec_metrics([1, 0, 2, 1], 12))
    row = table_for([r]).to_pylist()[0]
    assert row["num_accepted_tokens"] == 7 and row["num_draft_tokens"] == 12
    assert row["acceptance_rate"] == 7 / 12
    assert row["mean_acceptance_length"] == 1 + 7 / 4
    assert row["acceptance_histogram"] == [1, 0, 2, 1]
    assert (row["queue_s"], row["ttft_s"], row["decode_s"], row["e2e_s"]) == (0.5, 1.0, 2.0, 3.0)
    assert row["output_tokens_per_s"] == 9 / 2.5
    assert row["unit_id"] == UNIT.unit_id and row["error"] is None
    assert row["engine"] == VLLM


def test_no_speculation_gives_nulls_not_zeros() -> None:
    r = generated("hi", 9, "length", None)
    row = table_for([r], method="none", k=0, engine=TREE).to_pylist()[0]
    assert row["spec_method"] == "none" and row["num_speculative_tokens"] == 0
    assert row["engine"] == TREE
    for col in SPECULATIVE_MEASURED:
        assert row[col] is None, col


def test_nothing_drafted_gives_null_rate() -> None:
    r = generated("x", 1, "stop", spec_metrics([0, 0, 0, 0], 0))
    row = table_for([r]).to_pylist()[0]
    assert row["num_spec_steps"] == 0 and row["acceptance_rate"] is None
    assert row["mean_acceptance_length"] is None


def test_error_row_has_no_generation_columns() -> None:
    row = table_for(
        [RowResult(request(0, "prompt is empty"), error="prompt is empty")]
    ).to_pylist()[0]
    assert row["error"] == "prompt is empty" and row["id"] == "r0" and row["source"] == "s"
    assert row["generated_text"] is None and row["spec_method"] is None


def test_engine_column_names_the_engine_of_every_row_it_saw() -> None:
    """Rows an engine generated or rejected (or died on) name it; a row whose prompt failed
    before any engine has a null engine, not the unit's."""
    made = RowResult(request(0), text="hi", num_prompt_tokens=3, num_output_tokens=1)
    rejected = RowResult(request(1), error="rejected by engine: too many tokens")
    before = RowResult(request(2, "prompt is empty"), error="prompt is empty")
    rows = table_for([made, rejected, before], method="ngram-tree", engine=TREE).to_pylist()
    assert [r["engine"] for r in rows] == [TREE, TREE, None]
    assert SCHEMA.field("engine").type == pa.string()


def test_commit_first_wins_and_leaves_no_temp(tmp_path: Path) -> None:
    out = OutDir(tmp_path)
    writer = PartWriter(out, SCHEMA)
    first, _ = writer.commit(result_of([RowResult(request(0, "a"), error="a")]))
    second, _ = writer.commit(result_of([RowResult(request(0, "b"), error="b")]))
    assert (first, second) == (Commit.COMMITTED, Commit.DISCARDED)
    assert pq.read_table(out.part(UNIT.unit_id)).column("error").to_pylist() == ["a"]
    assert out.committed_units() == {UNIT.unit_id} and out.rows_committed() == 1
    assert [p.name for p in (tmp_path / "parts").iterdir()] == [f"{UNIT.unit_id}.parquet"]


def test_retry_of_error_rows_replaces_them_in_place_and_keeps_the_old_part(
    tmp_path: Path,
) -> None:
    out = OutDir(tmp_path)
    writer = PartWriter(out, SCHEMA)
    ok = RowResult(request(1), text="fine", num_prompt_tokens=3, num_output_tokens=1)
    writer.commit(
        result_of(
            [RowResult(request(0, "x"), error="x"), ok, RowResult(request(2, "y"), error="y")]
        )
    )
    retried = UnitRequests(UNIT, [request(0), request(2)], positions=[0, 2])
    again = [RowResult(r, text=f"new{r.row}", num_output_tokens=2) for r in retried.rows]
    outcome, _ = writer.commit(UnitResult(retried, again, 3, "ngram", VLLM))
    assert outcome is Commit.REPLACED
    rows = pq.read_table(out.part(UNIT.unit_id)).to_pylist()
    assert [r["generated_text"] for r in rows] == ["new0", "fine", "new2"]
    assert [r["error"] for r in rows] == [None, None, None]
    (old,) = out.history.iterdir()
    assert pq.read_table(old).column("error").to_pylist() == ["x", None, "y"]
