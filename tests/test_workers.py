"""Several workers on one output directory, on real vLLM: they share the units and never
commit one twice."""

from __future__ import annotations

import sys
from pathlib import Path

import polars as pl
import pytest
from conftest import ROOT, run_cli, run_logs

sys.path.insert(0, str(ROOT / "scripts"))
from bench_resume import check_output, resume_job

pytestmark = pytest.mark.engine


def test_two_workers_share_units_and_never_commit_one_twice(tmp_path: Path) -> None:
    job, ids = resume_job(tmp_path, rows=48, unit_rows=4, max_tokens=16)
    result = run_cli("run", str(job), "--workers", "2", "--no-progress")
    assert result.returncode == 0, result.stderr[-3000:]
    out = tmp_path / "out"
    check_output(out, ids)
    logs = run_logs(out)
    assert len(logs) == 2 and len({log["worker"] for log in logs}) == 2
    assert all(log["units_committed"] > 0 for log in logs), "one worker did all the work"
    units = len(list((out / "parts").glob("*.parquet")))
    assert sum(log["units_committed"] for log in logs) == units
    df = pl.read_parquet(out / "parts" / "*.parquet")
    assert df["unit_id"].n_unique() == units
