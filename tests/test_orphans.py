"""No process outlives the process that started it: a launcher killed alone takes its workers
with it, and an engine process dies with its worker (``PR_SET_PDEATHSIG``, ``engines.procs``):
unit tests of the mechanism (no engine), then a real launcher's process tree. A real vLLM
worker killed alone (``kill -9 PID``, the OOM killer) is in ``tests/test_interrupts.py``, whose
kill trials kill the worker's process alone and count the processes that outlive it.
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
from conftest import small_job
from support.runs import committed

from batchspec.engines.tether import CLOSE_SIGNAL, ENGINE_ENV

DEATH_S = 5.0
"""How soon the orphans must be gone (they die at once; reaping and exits take a moment)."""

SPAWNER = """
import multiprocessing, os, sys, time
from batchspec.engines.tether import ENGINE_ENV, arm_engine_process

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

FORKER = """
import multiprocessing, os, sys, time
from pathlib import Path
from batchspec.engines.tether import ENGINE_ENV, engine_children_tethered

def note(name, pid):  # a file each: the processes share no pipe to write into at once
    Path(sys.argv[2], name + ".tmp").write_text(str(pid))
    os.rename(Path(sys.argv[2], name + ".tmp"), Path(sys.argv[2], name))

def engine_core(method):
    # vLLM's plugins are not loaded again in a forked process: nothing here arms it, and
    # the model's worker it starts in turn must be tethered as well.
    child = multiprocessing.get_context(method).Process(target=time.sleep, args=(120,))
    child.start()
    note("model_worker", child.pid)
    time.sleep(120)

if __name__ == "__main__":
    os.environ[ENGINE_ENV] = str(os.getpid())  # as a worker does
    with engine_children_tethered():
        core = multiprocessing.get_context("fork").Process(target=engine_core, args=sys.argv[1:2])
        core.start()
    note("core", core.pid)
    time.sleep(120)
"""
"""A stand-in worker whose engine core forks (vLLM on GPUs, and batchspec's on the CPU), then
starts its model's worker after the start, by fork (vLLM's tensor-parallel workers on GPUs)
or by spawn (on the CPU: ``vllm_fork``)."""


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


@pytest.mark.parametrize("model_worker_by", ["fork", "spawn"])
def test_a_forked_engine_core_and_its_model_worker_die_with_their_parents(
    tmp_path: Path, model_worker_by: str
) -> None:
    script = tmp_path / "forker.py"
    script.write_text(FORKER)
    worker = subprocess.Popen([sys.executable, str(script), model_worker_by, str(tmp_path)])
    noted = [tmp_path / "core", tmp_path / "model_worker"]
    deadline = time.monotonic() + 60
    while not all(p.exists() for p in noted):
        assert worker.poll() is None and time.monotonic() < deadline, "no engine started"
        time.sleep(0.05)
    core, model_worker = (psutil.Process(int(p.read_text())) for p in noted)
    try:
        assert model_worker.ppid() == core.pid and core.ppid() == worker.pid
        # a forked process is armed by the fork itself: no import and no plugin in between
        assert handles(core.pid, CLOSE_SIGNAL)
        assert handles(model_worker.pid, CLOSE_SIGNAL) == (model_worker_by == "fork")
        time.sleep(1.0)  # a spawned one has bound itself by now (0.3 s), to the right parent
        assert not gone([model_worker]), "the model's worker died of a wrong binding"
        core.kill()  # the model's worker dies with the engine core that started it
        assert wait_gone([model_worker], DEATH_S) is not None, "outlived its engine core"
        assert worker.poll() is None  # the worker is not the engine's
    finally:
        worker.kill()
        worker.wait()
        for proc in (core, model_worker):
            with contextlib.suppress(psutil.Error):
                proc.kill()


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
    code = "from batchspec.engines.tether import die_with_parent as d; d(1); print('alive')"
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
def test_workers_die_with_their_launcher(tmp_path: Path) -> None:
    # On the tree engine (in the worker's process: a cheap start); vLLM's processes die with
    # their worker as tests/test_interrupts.py's kills of the worker alone show.
    # Work for a minute: killed at the first commit, unbound workers would outlive DEATH_S.
    tree = {"tree": {"max_depth": 2}, "num_speculative_tokens": 2, "adaptive": False}
    job = small_job(tmp_path, 12, speculative=tree, sampling={"max_tokens": 16})
    launcher = start_run([str(job), "--workers", "2"])
    wait_for_commit(launcher, tmp_path / "out")
    names, seconds, _ = kill_alone(launcher)
    assert sum(" -m batchspec run " in name for name in names) == 2, names
    assert seconds is not None, f"processes outlived their launcher: {names}"
    print(f"{names} gone {seconds:.2f} s after the launcher's kill")
