"""Engine failures on real vLLM (faults injected, ``engines.faults``), in one output directory:
units given up after max attempts are rerun by the next run, where an engine that stalls is
killed and its units retried, and a row that crashes the engine is bisected out as an error row
while every other row completes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import ROOT, run_logs
from support.runs import check_output, resume_job

pytestmark = pytest.mark.engine


def run(job: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "batchspec", "run", str(job), "--no-progress", *args]
    return subprocess.run(
        cmd, env={**os.environ, **env}, capture_output=True, text=True, timeout=900
    )


def one_domain_job(tmp: Path, rows: int, unit_rows: int) -> tuple[Path, list[str]]:
    """The default job over ``rows`` prompts of one domain: units of ``unit_rows`` rows."""
    table = pq.read_table(ROOT / "jobs" / "data" / "prompts.parquet")
    table = table.filter(pc.equal(table["domain"], "qa")).slice(0, rows)
    job, _ = resume_job(tmp, rows=rows, unit_rows=unit_rows, max_tokens=16)
    pq.write_table(table, tmp / "in.parquet")
    return job, table.column("id").to_pylist()


def test_failed_units_rerun_stalled_engine_killed_poison_row_bisected_out(tmp_path: Path) -> None:
    job, ids = one_domain_job(tmp_path, rows=4, unit_rows=2)
    spec = yaml.safe_load(job.read_text())
    # Long enough that a loaded machine's slow first step is not taken for the injected hang
    # (5 s killed a healthy engine under CI's load: a fourth, uninjected failure).
    spec["execution"]["engine_stall_s"] = 15
    job.write_text(yaml.safe_dump(spec))
    out = tmp_path / "out"
    # Every engine dies at its third step; one attempt per unit: both units fail at once.
    crashing = run(
        job, {"BATCHSPEC_INJECT_ENGINE_CRASH": "3:99"}, "--set", "execution.max_unit_attempts=1"
    )
    assert crashing.returncode == 3, crashing.stderr[-3000:]
    assert "units failed" in crashing.stdout
    failed = sorted((out / "failed").glob("*.json"))
    assert len(failed) == 2 and all(json.loads(f.read_text())["attempts"] == 1 for f in failed)
    assert not (out / "parts").exists()
    assert run_logs(out)[-1]["engine_failures"] == 1

    # The next run retries them. Its first engine hangs at its first step (both units in
    # flight) and is killed after engine_stall_s; then each unit runs alone: the first
    # commits, the second crashes (its last row is poison) and is bisected down to that row.
    poison = ids[3]
    env = {"BATCHSPEC_INJECT_ENGINE_HANG": "1", "BATCHSPEC_INJECT_POISON_ROW": str(poison)}
    result = run(job, env)
    assert result.returncode == 4, result.stderr[-3000:]  # complete; the poison row an error
    # The hang, the poison unit's crash and one more while bisecting it out.
    assert "3 engine failures recovered" in result.stdout, result.stdout[-2000:]
    assert not list((out / "failed").glob("*.json"))
    check_output(out, ids)
    df = pl.read_parquet(out / "parts" / "*.parquet")
    errors = df.filter(pl.col("error").is_not_null())
    assert errors["id"].to_list() == [poison]
    assert "the engine dies on this row" in errors["error"][0]
    assert df.filter(pl.col("error").is_null())["generated_text"].str.len_chars().min() > 0
    log = run_logs(out)[-1]
    failures = [e["failure"] for e in log["engines"] if "failure" in e]
    # The stall; the poison unit [2, 3] alone; row 3 alone.
    assert len(failures) == 3 and "stalled" in failures[0], failures
    assert log["units_failed"] == 0 and log["units_committed"] == 2
