"""How a stop signal reaches a worker's engine (``engines.procs``), without an engine: closing
runs vLLM's shutdown handler in the engine core once, however many stop signals are pending or
follow; a stop while an engine starts ends the start at once. The real engine's stops (a group
SIGTERM while generating, and during a start) are in ``tests/test_interrupts.py``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CLOSER = """
import multiprocessing, os, signal, sys, threading, time
import psutil
from batchspec.engines.procs import stop_signals_blocked
from batchspec.engines.tether import CLOSE_SIGNAL, ENGINE_ENV, arm_engine_process, ask_to_close

def engine_core():
    # vLLM's handler as it is: it sets a threading.Event, so a second run of it nested in the
    # first (a signal handled inside Event.set) can deadlock on the event's lock. This one
    # takes its time, so that a second SIGTERM let through would land inside it.
    runs, depth, done = [], [0], threading.Event()

    def handler(signum, frame):
        depth[0] += 1
        runs.append(depth[0])
        for _ in range(30):
            time.sleep(0.01)
        done.set()
        depth[0] -= 1

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    arm_engine_process()
    done.wait(10)
    time.sleep(1.0)  # where a later SIGTERM would be handled
    print("runs", runs, flush=True)

if __name__ == "__main__":
    os.environ[ENGINE_ENV] = str(os.getpid())  # as a worker does
    with stop_signals_blocked():
        child = multiprocessing.get_context("spawn").Process(target=engine_core)
        child.start()
    proc = psutil.Process(child.pid)
    for _ in range(200):  # until it is armed
        with open(f"/proc/{child.pid}/status") as fh:
            caught = next(int(l.split()[1], 16) for l in fh if l.startswith("SigCgt:"))
        if caught >> (CLOSE_SIGNAL - 1) & 1:
            break
        time.sleep(0.05)
    os.kill(child.pid, signal.SIGTERM)  # the stop signal to the whole group: pending there
    time.sleep(0.2)
    assert ask_to_close([proc])  # the worker closes its engine...
    time.sleep(0.1)
    os.kill(child.pid, signal.SIGTERM)  # ...and vLLM's shutdown follows with its SIGTERM
    child.join(15)
    print("exit", child.exitcode, flush=True)
"""
"""A stand-in worker and engine core: the engine's processes start with the stop signals
blocked, and arm themselves as batchspec's plugin does in every engine process."""

STARTER = """
import multiprocessing, os, signal, threading, time
from batchspec.engines.procs import StartAborted, abortable_start, stop_signals_blocked
from batchspec.work.stopping import StopFlag

def sleeper():
    time.sleep(60)

def send():
    sent.append(time.monotonic())
    os.kill(os.getpid(), signal.SIGTERM)

if __name__ == "__main__":
    try:
        with abortable_start(lambda: True):  # a stop just before: no start
            print("started after a stop", flush=True)
    except StartAborted:
        pass
    stop, sent = StopFlag(20), []
    threading.Timer(1.5, send).start()  # started before the block, as a worker's threads are
    with stop.installed(), stop_signals_blocked():
        try:
            with abortable_start(lambda: stop.stopping):  # a start: a process, a long wait
                child = multiprocessing.get_context("spawn").Process(target=sleeper)
                child.start()
                while not sent or time.monotonic() - sent[0] < 30:
                    time.sleep(0.05)
            print("the start ran to its end", flush=True)
        except StartAborted:
            child.join(5)
            print("aborted", round(time.monotonic() - sent[0], 2), child.exitcode, flush=True)
"""
"""A stand-in start in a worker's main thread, and a stop signal 1.5 s into it (delivered
to another thread: the main thread blocks it while the start's processes are spawned); first,
a start after a stop."""


def run_script(tmp_path: Path, text: str) -> str:
    script = tmp_path / "script.py"
    script.write_text(text)
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_closing_runs_the_engines_shutdown_handler_once(tmp_path: Path) -> None:
    # A group SIGTERM pending, then the close request, then vLLM's SIGTERM: one run of the
    # handler (letting the stop signals through ran it twice, the second inside the first).
    out = run_script(tmp_path, CLOSER)
    assert "runs [1]" in out and "exit 0" in out, out


def test_a_stop_ends_an_engine_start_at_once(tmp_path: Path) -> None:
    out = run_script(tmp_path, STARTER)
    assert out.startswith("aborted"), out
    seconds, exitcode = float(out.split()[1]), int(out.split()[2])
    assert seconds < 3.0 and exitcode == -9, out  # its process killed, not left to run


AFTER = """
import os, signal, time
from batchspec.work.stopping import REPEAT_S, StopFlag

stop = StopFlag(20)
with stop.installed():
    os.kill(os.getpid(), signal.SIGTERM)  # the first: a stop; the block ends as a run's does
print("stopped", stop.stopping, flush=True)
time.sleep(REPEAT_S + 0.2)  # the clean-up after the run (the engine's close, the leases)
os.kill(os.getpid(), signal.SIGINT)
time.sleep(5)
print("not quit", flush=True)
"""


def test_a_second_signal_during_the_clean_up_quits_at_once(tmp_path: Path) -> None:
    # The handler stays after a stop: a second signal while the run cleans up quits with 128 +
    # its number (the old handler, restored, ended the process with -2 there instead).
    script = tmp_path / "after.py"
    script.write_text(AFTER)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert result.returncode == 128 + 2 and "stopped True" in result.stdout, result
    assert "not quit" not in result.stdout and "quitting now" in result.stderr, result


CLOSE = """
import os, signal, sys
from batchspec.spec.file import load_spec
from batchspec.work import worker

close = worker.Worker._close


def close_under_a_stop(self, engine):
    os.kill(os.getpid(), signal.SIGTERM)  # a Slurm time limit landing on the last close
    close(self, engine)


worker.Worker._close = close_under_a_stop
worker.run_job(load_spec(sys.argv[1]), limit=1, progress=False)
print("stopped cleanly", flush=True)
"""


def test_a_stop_while_the_last_engine_closes_is_a_stop(tmp_path: Path) -> None:
    """After its last unit a worker closes its engine, releases its leases and reports: a
    SIGTERM there is a stop like any other (the handler stays through the clean-up), not the
    default death with -15 that leaves leases behind and no run log (tree engine, one row)."""
    from conftest import small_job

    job = small_job(tmp_path, 1, speculative={"engine": "tree"}, sampling={"max_tokens": 4})
    script = tmp_path / "close.py"
    script.write_text(CLOSE)
    cmd = [sys.executable, str(script), str(job)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "stopped cleanly" in result.stdout, result.stderr[-2000:]
    assert not list((tmp_path / "out" / "leases").glob("*.lease"))
