"""The per-domain report, read a batch of parts at a time, equals the table computed over all
rows at once (error rows, rows without speculation, a null domain included)."""

from __future__ import annotations

import random
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest

from batchspec.io.layout import OutDir
from batchspec.io.writer import PartWriter, output_schema
from batchspec.observe import report
from batchspec.spec.tree import VLLM
from batchspec.units import RowRequest, RowResult, SpecStats, UnitRequests, UnitResult, WorkUnit

SCHEMA = output_schema(pa.string(), {})
TIMING = {"queued": 0.0, "scheduled": 0.5, "first_token": 1.0, "last_token": 3.0}


def write_parts(out: OutDir, count: int) -> None:
    rng = random.Random(1)
    writer = PartWriter(out, SCHEMA)
    for u in range(count):
        domain = [None, "chat", "math"][u % 3]
        k = [0, 3][u % 2]
        unit = WorkUnit(0, "in.parquet", u * 10, u * 10 + 10, domain, 10)
        results = []
        for i in range(10):
            req = RowRequest(row=u * 10 + i, row_id=f"r{u}-{i}", domain=domain, passthrough={})
            if rng.random() < 0.2:
                results.append(RowResult(req, error="prompt is empty"))
                continue
            hist = [rng.randrange(4) for _ in range(k + 1)]
            steps = sum(hist)
            accepted = sum(j * c for j, c in enumerate(hist))
            spec = SpecStats(steps, steps * k, accepted, tuple(hist))
            n = rng.randrange(1, 50)
            results.append(RowResult(req, "t", 5, n, "stop", spec, TIMING))
        writer.commit(
            UnitResult(UnitRequests(unit, [r.request for r in results]), results, k, "ngram", VLLM)
        )


def all_at_once(out: OutDir) -> pl.DataFrame:
    """The report's table as the eager version computed it: every row in memory."""
    df = pl.concat([pl.read_parquet(p) for p in out.part_files()])
    ok = pl.col("error").is_null()
    return (
        df.group_by("domain")
        .agg(
            pl.len().alias("rows"),
            (~ok).sum().alias("errors"),
            pl.col("num_output_tokens").sum().alias("output_tokens"),
            pl.col("num_output_tokens").filter(ok).mean().alias("mean_output_tokens"),
            (pl.col("num_accepted_tokens").sum() / pl.col("num_draft_tokens").sum())
            .fill_nan(None)
            .alias("acceptance_rate"),
            (1 + pl.col("num_accepted_tokens").sum() / pl.col("num_spec_steps").sum())
            .fill_nan(None)
            .alias("mean_acceptance_length"),
            pl.col("num_speculative_tokens").drop_nulls().unique().sort().alias("k_used"),
            pl.col("spec_method").drop_nulls().unique().sort().alias("methods"),
            pl.col("output_tokens_per_s").median().alias("row_tokens_per_s"),
        )
        .sort("domain", nulls_last=True)
    )


@pytest.mark.parametrize("per_scan", [1, 4, 256])
def test_batched_report_equals_the_table_over_all_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, per_scan: int
) -> None:
    out = OutDir(tmp_path)
    write_parts(out, 9)
    monkeypatch.setattr(report, "PARTS_PER_SCAN", per_scan)
    got = report.domain_table(out)
    want = all_at_once(out)
    assert got.columns == want.columns or set(got.columns) == set(want.columns)
    for g, w in zip(got.to_dicts(), want.to_dicts(), strict=True):
        for key, value in w.items():
            assert g[key] == (pytest.approx(value) if isinstance(value, float) else value), key
    rows, _, text = report.domain_report(out)
    assert rows == 90 and text.splitlines()[1].startswith("chat")


def test_empty_output(tmp_path: Path) -> None:
    assert report.domain_table(OutDir(tmp_path)).is_empty()
    assert report.domain_report(OutDir(tmp_path))[::2] == (0, "(no rows committed)")
