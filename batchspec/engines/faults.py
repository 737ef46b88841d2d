"""Fault injection for tests, off unless set: what an out-of-memory kill, a driver fault, a
wedged collective or a row that crashes the engine would do, on demand.

- ``BATCHSPEC_INJECT_ENGINE_CRASH=STEP[:COUNT]``: SIGKILL the engine's processes at its STEP-th
  step, for the first COUNT engines this process builds (default 1).
- ``BATCHSPEC_INJECT_ENGINE_HANG=STEP[:COUNT]``: SIGSTOP them instead: alive, never answering.
- ``BATCHSPEC_INJECT_POISON_ROW=ID[,ID...]``: SIGKILL them at the first step after a row with
  one of these ids (``input.id_column``, as text) was submitted, every time.
"""

from __future__ import annotations

import os
import signal

import psutil

from batchspec.engines.procs import kill_tree

CRASH_ENV = "BATCHSPEC_INJECT_ENGINE_CRASH"
HANG_ENV = "BATCHSPEC_INJECT_ENGINE_HANG"
POISON_ENV = "BATCHSPEC_INJECT_POISON_ROW"
_fired: dict[str, int] = {}
"""Engines of this process that each step fault has hit so far."""


def _step_fault(env: str, step: int) -> bool:
    raw = os.environ.get(env)
    if not raw:
        return False
    at, _, count = raw.partition(":")
    if step != int(at) or _fired.get(env, 0) >= int(count or 1):
        return False
    _fired[env] = _fired.get(env, 0) + 1
    return True


def is_poison(row_id: object) -> bool:
    raw = os.environ.get(POISON_ENV)
    return bool(raw) and str(row_id) in raw.split(",")


def maybe_inject(step: int, procs: list[psutil.Process], poisoned: bool) -> None:
    """Before the engine's ``step``-th step: hang or crash it if a fault is due."""
    if _step_fault(HANG_ENV, step):
        for proc in procs:
            for p in [proc, *proc.children(recursive=True)]:
                p.send_signal(signal.SIGSTOP)
    elif poisoned or _step_fault(CRASH_ENV, step):
        kill_tree(procs)
