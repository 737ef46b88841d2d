"""No process outlives the worker that started it: a worker killed alone (``kill -9 PID``, the
OOM killer) takes its vLLM engine with it, a launcher killed alone takes its workers; the
next run then completes every row exactly once. The existing kill trials kill the whole
process group, which would hide a survivor. (That an engine closed by its worker exits
cleanly, with nothing force-killed or leaked, test_interrupts checks on its graceful stop.)

The processes are bound with ``PR_SET_PDEATHSIG`` (``engines.procs``): a unit test of the
mechanism first (no engine), then the real process trees.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import IN_PROCESS_ENGINE, run_cli, small_job
from support.runs import check_output, committed, resume_job

from batchspec.engines.procs import CLOSE_SIGNAL, ENGINE_ENV, blocks_stop_signals

DEATH_S = 5.0
"""How soon the orphans must be gone (they die at once; reaping and exits take a moment)."""

SPAWNER = """
import multiprocessing, os, sys, time
from batchspec.engines.procs import ENGINE_ENV, arm_engine_process

def engine_process():
    arm_engine_process()
    time.sleep(120)

if __name__ == "__main__":
    if sys.argv[1:] == ["engine"]:
        os.environ[ENGINE_ENV] = str(os.getpid())  # as a worker does
    child = multiprocessing.get_context("spawn").Process(target=engine_process)
    child.start()
    print(child.pid, flush=True)
    time.sleep(120)
"""
"""A stand-in worker: starts one process as vLLM starts its engine core (spawn), which arms
itself as batchspec's plugin does in every engine process."""


def gone(procs: list[psutil.Process]) -> bool:
    """Whether all of them have exited (a zombie waiting for its new parent counts)."""
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                return False
    return True


def wait_gone(procs: list[psutil.Process], limit: float) -> float | None:
    """Seconds until all of them were gone, or None if some outlived ``limit``."""
    started = time.monotonic()
    while time.monotonic() - started < limit:
        if gone(procs):
            return time.monotonic() - started
        time.sleep(0.05)
    return None


def handles(pid: int, signum: int) -> bool:
    with open(f"/proc/{pid}/status") as fh:
        caught = next(int(line.split()[1], 16) for line in fh if line.startswith("SigCgt:"))
    return bool(caught >> (signum - 1) & 1)


def start_spawner(tmp_path: Path, engine: bool) -> tuple[subprocess.Popen, psutil.Process]:
    script = tmp_path / "spawner.py"
    script.write_text(SPAWNER)
    env = {k: v for k, v in os.environ.items() if k != ENGINE_ENV}
    parent = subprocess.Popen(
        [sys.executable, str(script), *(["engine"] if engine else [])],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert parent.stdout is not None
    child = psutil.Process(int(parent.stdout.readline()))
    for _ in range(200):  # until its import and arming are done
        if not engine or handles(child.pid, CLOSE_SIGNAL):
            break
        time.sleep(0.05)
    return parent, child


def test_an_engine_process_dies_with_its_parent(tmp_path: Path) -> None:
    parent, child = start_spawner(tmp_path, engine=True)
    try:
        assert handles(child.pid, CLOSE_SIGNAL)  # armed: the worker can ask it to close
        parent.kill()
        parent.wait()
        assert wait_gone([child], DEATH_S) is not None, "the engine process outlived its worker"
    finally:
        with contextlib.suppress(psutil.Error):
            child.kill()


def test_processes_of_other_vllm_users_are_left_alone(tmp_path: Path) -> None:
    # Without the worker's mark (vLLM run by a benchmark, say) the plugin arms nothing.
    parent, child = start_spawner(tmp_path, engine=False)
    try:
        time.sleep(1.0)  # the time the armed one took (0.3 s), and more
        assert not handles(child.pid, CLOSE_SIGNAL)
        parent.kill()
        parent.wait()
        assert wait_gone([child], 1.0) is None
    finally:
        with contextlib.suppress(psutil.Error):
            child.kill()


def test_a_parent_gone_before_the_binding_means_death_at_once() -> None:
    # The race: the parent died between the start and the prctl call, so this process was
    # handed to another (here: it names a parent that is not its own).
    code = "from batchspec.engines.procs import die_with_parent; die_with_parent(1); print('alive')"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == -signal.SIGKILL and "alive" not in result.stdout


def start_run(args: list[str]) -> subprocess.Popen:
    """``batchspec run ARGS`` in a session of its own (the test's safety net kills it whole)."""
    return subprocess.Popen(
        [sys.executable, "-m", "batchspec", "run", *args, "--no-progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def wait_for_commit(proc: subprocess.Popen, out: Path) -> None:
    deadline = time.monotonic() + 300
    while committed(out) == 0:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no unit committed in time"
        time.sleep(0.2)


def kill_alone(proc: subprocess.Popen) -> tuple[list[str], float | None, str]:
    """SIGKILL ``proc`` alone (not its group); its descendants' command lines as they were,
    the seconds from the kill until they were all gone (None: some outlived ``DEATH_S``),
    and what it had printed on stderr. Survivors are killed."""
    descendants = psutil.Process(proc.pid).children(recursive=True)
    names = [" ".join(p.cmdline()).strip() for p in descendants]
    try:
        proc.kill()
        proc.wait(timeout=30)  # not its pipes: its children may hold them
        seconds = wait_gone(descendants, DEATH_S)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    _, stderr = proc.communicate(timeout=30)
    return names, seconds, stderr


@pytest.mark.engine
def test_vllm_engine_dies_with_its_worker_then_a_quiet_rerun_is_exactly_once(
    tmp_path: Path,
) -> None:
    job, ids = resume_job(tmp_path, rows=24, unit_rows=4, max_tokens=16)
    out = tmp_path / "out"
    worker = start_run([str(job)])
    wait_for_commit(worker, out)
    # SIGTERM is blocked in its engine's processes (the job's stop signals are the worker's
    # to act on): only SIGKILL, which the kernel sends at the worker's death, stops them.
    engine = psutil.Process(worker.pid).children(recursive=True)
    assert all(blocks_stop_signals(p) for p in engine if p.cmdline()[0].startswith("VLLM::"))
    names, seconds, stderr = kill_alone(worker)
    assert {"VLLM::EngineCore", "VLLM::Worker"} <= set(names), names
    assert seconds is not None, f"processes outlived their worker: {names}"
    print(f"{names} gone {seconds:.2f} s after the worker's kill")
    # Until then, its engine's start and steps printed nothing on the terminal: vLLM's
    # output (worker, engine core, model worker) is in the worker's log.
    assert stderr == "", stderr[-3000:]
    (log,) = (out / "runs").glob("*.log")
    assert "EngineCore pid=" in log.read_text() and "VllmWorker" in log.read_text()

    # The rerun (its engine in its own process: a cheap start) takes over the dead worker's
    # leases at once and commits every row once.
    result = run_cli("run", str(job), "--no-progress", env=IN_PROCESS_ENGINE)
    assert result.returncode == 0, result.stderr[-3000:]
    check_output(out, ids)
    assert result.stderr == "" and result.stdout.startswith("output: "), result.stderr[-3000:]


@pytest.mark.engine
def test_workers_die_with_their_launcher(tmp_path: Path) -> None:
    # On the tree engine (in the worker's process: a cheap start); vLLM's processes die with
    # their worker as the test above shows.
    # Work for a minute: killed at the first commit, unbound workers would outlive DEATH_S.
    tree = {"tree": {"max_depth": 2}, "num_speculative_tokens": 2, "adaptive": False}
    job = small_job(tmp_path, 12, speculative=tree, sampling={"max_tokens": 16})
    launcher = start_run([str(job), "--workers", "2"])
    wait_for_commit(launcher, tmp_path / "out")
    names, seconds, _ = kill_alone(launcher)
    assert sum(" -m batchspec run " in name for name in names) == 2, names
    assert seconds is not None, f"processes outlived their launcher: {names}"
    print(f"{names} gone {seconds:.2f} s after the launcher's kill")
