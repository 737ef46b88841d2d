"""Several workers on one output directory, on real vLLM: they share the units, stop cleanly on
a signal to the whole process group, and never commit one twice."""

from __future__ import annotations

import signal
from pathlib import Path

import polars as pl
import pytest
from conftest import run_cli, run_logs, signal_group
from support.runs import check_output, resume_job

pytestmark = pytest.mark.engine


def test_two_workers_share_units_stop_on_a_group_signal_and_never_commit_one_twice(
    tmp_path: Path, full: bool
) -> None:
    """~110 s alone, four engine starts: runs with ``--full`` (the suite's time budget). By
    default the same claiming is proven by the Slurm array's two tasks on one directory
    (``test_slurm``), the simulated fleet's twelve workers under kills (``test_fleet``), and
    the stop on a group signal by one worker's (``test_interrupts``)."""
    if not full:
        pytest.skip("two workers, four engine starts: runs with --full")
    job, ids = resume_job(tmp_path, rows=48, unit_rows=4, max_tokens=16)
    out = tmp_path / "out"
    # Ctrl-C reaches the launcher and both workers (and, but for their blocked signals, the
    # engines): the workers finish their units in flight and exit 0; so does the launcher.
    args = [str(job), "--workers", "2", "--set", "execution.shutdown_grace_s=30"]
    stopped, _ = signal_group(args, out, [signal.SIGINT])
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    logs = run_logs(out)
    assert len(logs) == 2 and all(log["stopped_by_signal"] for log in logs)
    assert sum(log["units_abandoned"] for log in logs) == 0, logs
    assert not list((out / "leases").glob("*.lease"))
    assert 0 < len(list((out / "parts").glob("*.parquet"))) < logs[0]["units_total"]

    result = run_cli("run", str(job), "--workers", "2", "--no-progress")
    assert result.returncode == 0, result.stderr[-3000:]
    check_output(out, ids)
    logs = run_logs(out)
    assert len(logs) == 4 and len({log["worker"] for log in logs}) == 4
    assert all(log["units_committed"] > 0 for log in logs[2:]), "one worker did all the work"
    units = len(list((out / "parts").glob("*.parquet")))
    assert sum(log["units_committed"] for log in logs) == units
    df = pl.read_parquet(out / "parts" / "*.parquet")
    assert df["unit_id"].n_unique() == units
