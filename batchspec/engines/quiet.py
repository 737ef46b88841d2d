"""Engines' output goes to the run's log file; the terminal keeps batchspec's own.

vLLM logs warnings in the worker and in each of its engine processes, Triton and torch print
notices, safetensors draws progress bars, C++ code writes to stderr directly: of the 59 lines
the default job printed, 37 were theirs. Engine processes inherit file descriptors 1 and 2
from the worker that starts them, so the redirection is made there, at the descriptor level,
for as long as a worker runs: what any of them writes, by any means, lands in the log.
batchspec's own output while it lasts (the progress bar, messages on signals) goes to
``terminal()``, a stream on the original stderr. ``BATCHSPEC_VERBOSE=1`` leaves every output
where it was. When an engine does not start, or the run fails, the log's errors (or last
lines) and its path are shown with the error, since the cause is usually there.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TextIO

from batchspec.errors import UserError

VERBOSE_ENV = "BATCHSPEC_VERBOSE"
TAIL_LINES = 12
MAX_ERRORS = 4
MAX_WIDTH = 400
_VLLM_PREFIX = re.compile(r"^\(\S+ pid=\d+\) [A-Z]+ \S+ \S+ \[[^\]]*\] ")
"""vLLM's prefix of a log record: ``(EngineCore pid=1) ERROR 11-30 22:28:14 [core.py:9] ``."""
_EXCEPTION = re.compile(r"^[\w.]*(Error|Exception|Interrupt)\w*: ")
"""The last line of a traceback: ``ValueError: ...``, ``torch.OutOfMemoryError: ...``."""

_terminal: TextIO | None = None
"""The stream on the terminal while engine output is redirected (None otherwise)."""
_log: Path | None = None
"""The log it goes to meanwhile."""


def verbose() -> bool:
    """Whether engines' output is shown live (``BATCHSPEC_VERBOSE`` set, and not to 0)."""
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


def terminal() -> TextIO:
    """Where batchspec's own messages go: the user's stderr, also while it is redirected."""
    return _terminal if _terminal is not None else sys.stderr


@contextlib.contextmanager
def engine_output(log: Path) -> Iterator[TextIO]:
    """Inside, descriptors 1 and 2 (and so every process started meanwhile) write to ``log``
    (appended); yields ``terminal()``. Nested or verbose: changes nothing."""
    global _terminal, _log
    if verbose() or _terminal is not None:
        yield terminal()
        return
    log.parent.mkdir(parents=True, exist_ok=True)
    _flush()
    saved = os.dup(1), os.dup(2)
    _terminal = os.fdopen(os.dup(2), "w", buffering=1, errors="replace")
    _log = log
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    try:
        yield _terminal
    except Exception as exc:
        if not isinstance(exc, UserError):  # a bug: its traceback follows
            _restore(saved)
            print(f"batchspec: {failure_report(log)}", file=sys.stderr, flush=True)
        raise
    finally:
        _restore(saved)


@contextlib.contextmanager
def results_output(log: Path) -> Iterator[Callable[[str], None]]:
    """For commands that print results while their engines run (``tune``, ``verify``): the
    engines' output goes to ``log`` as in a run; yields an echo to the original stdout, so
    their tables stay on stdout (pipeable) and off the log."""
    _flush()
    out = os.fdopen(os.dup(1), "w", buffering=1, errors="replace")
    try:
        with engine_output(log):
            yield lambda line: print(line, file=out, flush=True)
    finally:
        out.close()


def _restore(saved: tuple[int, int]) -> None:
    """Back to the original descriptors (once; a second call does nothing)."""
    global _terminal, _log
    if _terminal is None:
        return
    _flush()
    for target, fd in zip((1, 2), saved, strict=True):
        os.dup2(fd, target)
        os.close(fd)
    _terminal.close()
    _terminal = _log = None


def _flush() -> None:
    """Python's and C's buffers out to the descriptors they were written for."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(ValueError, OSError):
            stream.flush()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).fflush(None)


def log_size() -> int:
    """How much has been written to the log so far (0 when not redirected)."""
    with contextlib.suppress(OSError):
        return 0 if _log is None else _log.stat().st_size
    return 0


def failure_report(log: Path, since: int = 0) -> str:
    """What a failure shows of the log from offset ``since``: its exception messages (the
    root cause comes first: a model worker's error, then the engine core's that wraps it),
    else its last lines; and its path, for the rest."""
    try:
        with open(log, errors="replace") as fh:
            fh.seek(since)
            lines = [_VLLM_PREFIX.sub("", line.rstrip()) for line in fh if line.strip()]
    except OSError:
        return f"engine output: {log} (unreadable)"
    errors = list(dict.fromkeys(line for line in lines if _EXCEPTION.match(line)))
    shown = errors[:MAX_ERRORS] or lines[-TAIL_LINES:]
    what = "errors" if errors else f"last {len(shown)} lines"
    body = "".join(f"\n  {line[:MAX_WIDTH]}" for line in shown)
    return f"engine output: {log}; {what}:{body}"


class EngineStartError(UserError):
    """An engine that did not start: its cause as a short block (the exception, the log's
    errors and path), no traceback (it is in the log), exit code 1 as for any failure."""

    exit_code = 1

    def __init__(self, cause: BaseException, since: int):
        """``since``: the log's size when the engine started to start (``log_size``)."""
        message = f"the engine did not start: {type(cause).__name__}: {cause}"
        if _log is not None:
            message += "\n" + failure_report(_log, since)
        super().__init__(message)
