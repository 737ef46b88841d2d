"""Slurm array jobs against a real one-node cluster (slurm-wlm + munge, started by the tests).

Each array task is a worker of the same run; they meet only in the output directory.
The ``slurm_cluster`` fixture comes from tests/support/slurm/fixture.py (through conftest.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import CPU_BIND_ENV, ROOT
from support.runs import check_output, resume_job

from batchspec.work.completion import Exit

pytestmark = [pytest.mark.engine, pytest.mark.xdist_group("slurm")]


def batchspec(cluster, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    # Slurm binds each task to the cores it allocated (task/affinity) and vLLM binds within
    # them; a core list from the test worker (conftest) would point outside them.
    env = {k: v for k, v in cluster.env.items() if k != CPU_BIND_ENV}
    return subprocess.run(
        [sys.executable, "-m", "batchspec", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def submit(cluster, job: Path, tasks: int = 2) -> str:
    result = batchspec(
        cluster,
        "slurm",
        "submit",
        str(job),
        "--tasks",
        str(tasks),
        "--cpus-per-task",
        "1",
        "--signal-lead",
        "60",
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


def wait_for_commits(out: Path, n: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while len(list((out / "parts").glob("*.parquet")) if (out / "parts").is_dir() else []) < n:
        assert time.monotonic() < deadline, "no unit committed in time"
        time.sleep(0.5)


def logs(out: Path, job_id: str) -> dict[str, str]:
    return {p.stem: p.read_text() for p in (out / "slurm").glob(f"{job_id}_*.log")}


def finisher_of(out: Path, array_id: str) -> str:
    """The finisher job ``submit`` recorded after array ``array_id``."""
    records = [json.loads(x) for x in (out / "slurm" / "jobs.jsonl").read_text().splitlines()]
    (job_id,) = [r["job_id"] for r in records if r.get("after") == array_id]
    return job_id


def check_finisher(cluster, out: Path, array_id: str, state: str, verdict: str) -> None:
    """The finisher after ``array_id`` ends in ``state``, its log ending on ``verdict``."""
    finisher = finisher_of(out, array_id)
    assert cluster.wait_for_jobs(finisher, timeout=120) == {finisher: state}
    log = (out / "slurm" / f"{finisher}_finisher.log").read_text()
    assert log.strip().splitlines()[-1].startswith(verdict), log


def test_array_runs_survives_scancel_and_a_resubmit_completes_exactly_once(
    slurm_cluster, tmp_path: Path
) -> None:
    """A 2-task array, status while it runs, scancel, a resubmit that completes the input
    exactly once, status once complete, and a scheduled resubmit that does nothing; the
    finisher after each array fails while the run is incomplete and completes once it is."""
    job, ids = resume_job(tmp_path, rows=48, unit_rows=4, max_tokens=16)
    data = yaml.safe_load(job.read_text())
    data["execution"]["shutdown_grace_s"] = 2  # scancel signals the tasks: do not wait long
    job.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    first = submit(slurm_cluster, job)
    wait_for_commits(out, 1)
    running = batchspec(slurm_cluster, "slurm", "status", str(out))
    assert running.returncode == 0, running.stderr
    assert f"slurm job {first} (2 tasks)" in running.stdout
    wait_for_commits(out, 2)
    slurm_cluster.run(["scancel", first])
    states = slurm_cluster.wait_for_jobs(first, timeout=120)
    assert set(states.values()) == {"CANCELLED"}, states
    committed = len(list((out / "parts").glob("*.parquet")))
    assert committed < 12
    check_finisher(slurm_cluster, out, first, "FAILED", f"incomplete: {committed}/12 units")
    second = submit(slurm_cluster, job)
    states = slurm_cluster.wait_for_jobs(second, timeout=600)
    assert states == {f"{second}_0": "COMPLETED", f"{second}_1": "COMPLETED"}, states
    check_output(out, ids)
    task_logs = logs(out, second)
    assert len(task_logs) == 2
    assert all("exit 0" in text for text in task_logs.values()), task_logs
    check_finisher(slurm_cluster, out, second, "COMPLETED", "complete: 12/12 units committed")
    done = batchspec(slurm_cluster, "slurm", "status", str(out), "--require-complete")
    assert done.returncode == 0 and "12/12 done" in done.stdout, done.stdout
    assert f"slurm job {finisher_of(out, second)} finisher: " in done.stdout
    print(running.stdout, done.stdout, sep="\n")  # shown with -s: the status while running
    # A scheduled rerun of the finished job (cron, scrontab) does nothing and says so.
    again = batchspec(slurm_cluster, "slurm", "submit", str(job), "--tasks", "2")
    assert again.returncode == 0 and "nothing to do" in again.stdout


def test_early_warning_signal_stops_a_task_and_another_finishes_its_units(
    slurm_cluster, tmp_path: Path, full: bool
) -> None:
    """~50 s alone (~100 s before a lingering task saw units handed back within 5 s): runs
    with ``--full`` (the suite's time budget). The same stop path (a
    SIGTERM to one worker, its units handed back and finished by another) runs by default in
    test_interrupts.py and test_workers.py, without Slurm."""
    if not full:
        pytest.skip("about 50 s of Slurm: runs with --full")
    job, ids = resume_job(tmp_path, rows=64, unit_rows=4, max_tokens=24)
    data = yaml.safe_load(job.read_text())
    data["execution"]["shutdown_grace_s"] = 2
    job.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    job_id = submit(slurm_cluster, job)
    wait_for_commits(out, 2)
    # What --signal=B:TERM@lead delivers ahead of the time limit, sent now to task 0 only.
    slurm_cluster.run(["scancel", "--signal=TERM", "--batch", f"{job_id}_0"])
    states = slurm_cluster.wait_for_jobs(job_id, timeout=600)
    # Task 0 tells the truth: it left the run incomplete (exit 5, so Slurm says FAILED);
    # task 1, which finished it, exits 0, and so does the finisher.
    assert states == {f"{job_id}_0": "FAILED", f"{job_id}_1": "COMPLETED"}, states
    task0 = logs(out, job_id)[f"{job_id}_0"]
    assert "SIGTERM, stopping the worker" in task0
    assert "stopped by signal" in task0 and f"task 0 exit {Exit.INCOMPLETE}" in task0
    check_output(out, ids)  # task 1 took over what task 0 handed back
    assert not list((out / "leases").glob("*.lease"))
    check_finisher(slurm_cluster, out, job_id, "COMPLETED", "complete: 16/16 units committed")
