"""Resumable execution on real vLLM: kill -9, SIGTERM, engine crashes, several workers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
import yaml
from conftest import ROOT, run_cli

sys.path.insert(0, str(ROOT / "scripts"))
from bench_resume import check_output, kill_trials, resume_job

pytestmark = pytest.mark.engine


def _logs(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((out / "runs").glob("*.json"))]


def test_kill9_at_random_points_then_rerun_is_exactly_once(tmp_path: Path) -> None:
    job, ids = resume_job(tmp_path, rows=96, unit_rows=4, max_tokens=16)
    trials = kill_trials(job, tmp_path / "out", trials=10, seed=1234)
    assert len(trials) == 10, "the job finished before ten kills: give it more work"
    assert {t.when for t in trials} == {"startup", "generating"}
    assert sum(t.committed_after > t.committed_before for t in trials) >= 5
    check_output(tmp_path / "out", ids)
    assert not list((tmp_path / "out" / "leases").glob("*.lease"))


def _wait_for_commit(out: Path, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not list((out / "parts").glob("*.parquet")) if (out / "parts").is_dir() else True:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no unit committed in time"
        time.sleep(0.2)


def test_sigterm_exits_cleanly_and_releases_leases(tmp_path: Path) -> None:
    job, ids = resume_job(tmp_path, rows=64, unit_rows=4, max_tokens=32)
    data = yaml.safe_load(job.read_text())
    data["execution"]["shutdown_grace_s"] = 3
    job.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "batchspec", "run", str(job), "--no-progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _wait_for_commit(out, proc)
    proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr[-3000:]
    assert time.monotonic() - sent < 3 + 20  # grace plus engine shutdown
    assert "stopped by signal" in stdout
    assert not list((out / "leases").glob("*.lease"))
    assert not list((out / "leases").glob("*.progress.json"))
    done = len(list((out / "parts").glob("*.parquet")))
    assert 0 < done < 16
    result = run_cli("run", str(job), "--no-progress")
    assert result.returncode == 0, result.stderr[-3000:]
    check_output(out, ids)


def test_engine_crash_retried_then_failed_units_rerun(tmp_path: Path) -> None:
    job, ids = resume_job(tmp_path, rows=8, unit_rows=4, max_tokens=16)
    out = tmp_path / "out"
    env = dict(os.environ, BATCHSPEC_INJECT_ENGINE_CRASH="3:99")
    # Every engine dies at its third step: after max_unit_attempts the units are failed.
    crashing = subprocess.run(
        [
            sys.executable,
            "-m",
            "batchspec",
            "run",
            str(job),
            "--no-progress",
            "--set",
            "execution.max_unit_attempts=2",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert crashing.returncode == 3, crashing.stderr[-3000:]
    assert "units failed" in crashing.stdout
    failed = sorted(p.name for p in (out / "failed").glob("*.json"))
    assert failed and all(
        json.loads((out / "failed" / f).read_text())["attempts"] == 2 for f in failed
    )
    assert len(failed) == 2  # both units: no engine survives its third step
    assert not (out / "parts").exists()
    assert _logs(out)[-1]["engine_failures"] >= 2
    # The next run retries the failed units; its first engine crashes once and is rebuilt.
    env["BATCHSPEC_INJECT_ENGINE_CRASH"] = "3:1"
    recovering = subprocess.run(
        [sys.executable, "-m", "batchspec", "run", str(job), "--no-progress"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert recovering.returncode == 0, recovering.stderr[-3000:]
    assert _logs(out)[-1]["engine_failures"] == 1
    assert "1 engine failures recovered" in recovering.stdout
    assert not list((out / "failed").glob("*.json"))
    check_output(out, ids)


def test_two_workers_share_units_and_never_commit_one_twice(tmp_path: Path) -> None:
    job, ids = resume_job(tmp_path, rows=48, unit_rows=4, max_tokens=16)
    result = run_cli("run", str(job), "--workers", "2", "--no-progress")
    assert result.returncode == 0, result.stderr[-3000:]
    out = tmp_path / "out"
    check_output(out, ids)
    logs = _logs(out)
    assert len(logs) == 2 and len({log["worker"] for log in logs}) == 2
    assert all(log["units_committed"] > 0 for log in logs), "one worker did all the work"
    units = len(list((out / "parts").glob("*.parquet")))
    assert sum(log["units_committed"] for log in logs) == units
    df = pl.read_parquet(out / "parts" / "*.parquet")
    assert df["unit_id"].n_unique() == units
