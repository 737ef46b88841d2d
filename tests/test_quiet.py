"""What a run prints: batchspec's own lines on the terminal, everything its engines and their
libraries print (by Python, by C, by child processes) in the run's log (``engines.quiet``);
an engine that does not start is shown by its root cause and the log's path.

The redirection acts on the process's file descriptors, so each case runs in a fresh
interpreter, as a worker does. The engine tests (``test_orphans``) check the same on real
vLLM runs: a rerun's output holds batchspec's lines only.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from batchspec.engines.quiet import EngineStartError, failure_report
from batchspec.errors import UserError

SCRIPT = """
import os, subprocess, sys, warnings
from pathlib import Path
from batchspec.engines.quiet import engine_output, terminal

print("before", flush=True)
with engine_output(Path(sys.argv[1])) as term:
    print("library stdout")
    print("library stderr", file=sys.stderr)
    os.write(2, b"C stderr\\n")
    warnings.warn("a library's FutureWarning", FutureWarning)
    subprocess.run([sys.executable, "-c", "import sys; print('child out'); sys.exit(0)"])
    print("ours", file=term)
    print("ours, from a handler", file=terminal())
    if len(sys.argv) > 2:
        raise RuntimeError("a bug")
print("after", flush=True)
"""

LIBRARY_LINES = ["library stdout", "library stderr", "C stderr", "FutureWarning", "child out"]


def run_script(tmp_path: Path, *extra: str, env: dict[str, str] | None = None):
    log = tmp_path / "runs" / "w.log"
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(log), *extra],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )
    return result, log


def test_engine_output_goes_to_the_log_and_ours_to_the_terminal(tmp_path: Path) -> None:
    result, log = run_script(tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["before", "after"]
    assert result.stderr.splitlines() == ["ours", "ours, from a handler"]
    text = log.read_text()
    for line in LIBRARY_LINES:
        assert line in text, text


def test_verbose_shows_everything_live(tmp_path: Path) -> None:
    result, log = run_script(tmp_path, env={"BATCHSPEC_VERBOSE": "1"})
    assert result.returncode == 0, result.stderr
    shown = result.stdout + result.stderr
    for line in [*LIBRARY_LINES, "ours", "ours, from a handler", "after"]:
        assert line in shown, shown
    assert not log.exists()


def test_a_failure_shows_the_logs_errors_then_its_traceback(tmp_path: Path) -> None:
    result, log = run_script(tmp_path, "fail")
    assert result.returncode == 1
    report, _, traceback = result.stderr.partition("Traceback")
    assert f"\nbatchspec: engine output: {log}; last 5 lines:\n" in report
    assert "C stderr" in report and "RuntimeError: a bug" in traceback


# The log of an engine that failed to start (vLLM 0.32, model.gpu_memory_utilization 0.99 on
# CPU), cut down: the root cause is the model worker's, which the engine core wraps.
FAILED_START = """\
(EngineCore pid=28812) WARNING 11-30 23:04:24 [vllm.py:725] Model Runner V2 requires Triton
(VllmWorker-0 pid=28854) ERROR 11-30 23:04:28 [multiproc_executor.py:953] WorkerProc failed to start.
(VllmWorker-0 pid=28854) ERROR 11-30 23:04:28 [multiproc_executor.py:953] Traceback (most recent call last):
(VllmWorker-0 pid=28854) ERROR 11-30 23:04:28 [multiproc_executor.py:953]     raise ValueError(
(VllmWorker-0 pid=28854) ERROR 11-30 23:04:28 [multiproc_executor.py:953] ValueError: Available memory on node 0 (13.86/15.46 GiB) on startup is less than desired
(EngineCore pid=28812) ERROR 11-30 23:04:28 [core.py:1510] Exception: WorkerProc initialization failed due to an exception in a background process.
Process EngineCore:
Traceback (most recent call last):
  File "/x/vllm/v1/executor/multiproc_executor.py", line 815, in wait_for_ready
    raise e from None
Exception: WorkerProc initialization failed due to an exception in a background process.
"""  # noqa: E501


def test_failure_report_puts_the_root_cause_first(tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    log.write_text("ValueError: an earlier engine's, before this one started\n" + FAILED_START)
    since = len("ValueError: an earlier engine's, before this one started\n")
    lines = failure_report(log, since).splitlines()
    assert lines == [
        f"engine output: {log}; errors:",
        "  ValueError: Available memory on node 0 (13.86/15.46 GiB) on startup is less than "
        "desired",
        "  Exception: WorkerProc initialization failed due to an exception in a background "
        "process.",
    ]


def test_failure_report_without_an_exception_shows_the_last_lines(tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    log.write_text("".join(f"line {i}\n\n" for i in range(30)))
    lines = failure_report(log).splitlines()
    assert lines[0] == f"engine output: {log}; last 12 lines:"
    assert lines[1:] == [f"  line {i}" for i in range(18, 30)]


def test_an_engine_that_does_not_start_is_one_short_block_exit_1() -> None:
    error = EngineStartError(RuntimeError("Engine core initialization failed"), 0)
    assert isinstance(error, UserError) and error.exit_code == 1
    assert str(error) == "the engine did not start: RuntimeError: Engine core initialization failed"
