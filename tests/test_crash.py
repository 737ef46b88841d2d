"""Engine failures on real vLLM: units retried on a new engine, failed after max attempts,
retried by the next run (faults injected with BATCHSPEC_INJECT_ENGINE_CRASH)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, run_logs

sys.path.insert(0, str(ROOT / "scripts"))
from bench_resume import check_output, resume_job

pytestmark = pytest.mark.engine


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
    assert run_logs(out)[-1]["engine_failures"] >= 2
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
    assert run_logs(out)[-1]["engine_failures"] == 1
    assert "1 engine failures recovered" in recovering.stdout
    assert not list((out / "failed").glob("*.json"))
    check_output(out, ids)
