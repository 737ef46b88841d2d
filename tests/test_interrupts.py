"""Interrupted runs on real vLLM: kill -9 of the whole process group (engine included) at random
points, then SIGTERM, then a rerun: every row exactly once, no lease left behind.

One output directory serves both kinds of interruption: each costs an engine start (~20 s here).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, run_cli

sys.path.insert(0, str(ROOT / "scripts"))
from bench_resume import check_output, committed, kill_trials, resume_job

pytestmark = pytest.mark.engine

GRACE_S = 3


def sigterm_trial(job: Path, out: Path) -> tuple[int, int, float, subprocess.CompletedProcess]:
    """Start a run, SIGTERM it once it has committed a unit: (units before, units after,
    seconds from the signal to its exit, the finished process)."""
    before = committed(out)
    cmd = [sys.executable, "-m", "batchspec", "run", str(job), "--no-progress"]
    cmd += ["--set", f"execution.shutdown_grace_s={GRACE_S}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while committed(out) == before:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no unit committed in time"
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    stdout, stderr = proc.communicate(timeout=60)
    result = subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
    return before, committed(out), time.monotonic() - sent, result


def test_kill9_and_sigterm_then_rerun_is_exactly_once(tmp_path: Path, full: bool) -> None:
    # Every kill costs an engine start: four in the default suite, ten with --full. Seeds
    # picked so that both kinds of kill occur: 4 gives generating, generating, startup (6.6 s,
    # the engine half up), generating.
    n, seed = (10, 1234) if full else (4, 4)
    job, ids = resume_job(tmp_path, rows=96, unit_rows=4, max_tokens=16)
    out = tmp_path / "out"
    trials = kill_trials(job, out, trials=n, seed=seed, finish=False)
    assert len(trials) == n, f"the job finished before {n} kills: give it more work"
    assert {t.when for t in trials} == {"startup", "generating"}
    assert sum(t.committed_after > t.committed_before for t in trials) >= n // 2

    # SIGTERM: finish or hand back the units in flight within the grace time, exit 0, and
    # leave no lease or progress record (the killed workers' records stay: nobody removes them).
    killed = set((out / "leases").glob("*.progress.json"))
    before, after, seconds, term = sigterm_trial(job, out)
    assert term.returncode == 0, term.stderr[-3000:]
    assert seconds < GRACE_S + 20  # grace plus engine shutdown
    assert "stopped by signal" in term.stdout
    assert not list((out / "leases").glob("*.lease"))
    assert set((out / "leases").glob("*.progress.json")) == killed
    assert before < after < 24

    result = run_cli("run", str(job), "--no-progress")
    assert result.returncode == 0, result.stderr[-3000:]
    check_output(out, ids)
    assert not list((out / "leases").glob("*.lease"))
