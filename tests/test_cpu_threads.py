"""The threads a forked vLLM engine core computes with on the CPU (``engines.vllm_fork``,
``engines.cpu_threads``): what only the speed showed when it was wrong."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

NUMBA_IN_A_FORKED_CORE = """
import numba
import numba.np.ufunc.parallel as parallel  # imported by the worker, as vLLM's n-gram proposer is
from batchspec.engines.vllm_fork import _numba_threads

before = parallel.NUM_THREADS
_numba_threads(1)  # what the forked core does, with its slice's count
parallel._launch_threads()  # what numba does at the first proposal
print(before, numba.get_num_threads())
"""


def test_numba_starts_with_the_cores_thread_count_not_the_machines() -> None:
    """numba reads its thread count (every core) when the worker imports it; its OpenMP layer
    then sets libgomp's count to it whenever its threads start, so a core bound to one CPU ran
    two threads on it (9 output tok/s against 48). Telling it only through the environment
    or numba's config leaves the count its import read: 2 threads here."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 cores: with one, numba's own count is already 1")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_NUM_THREADS"}
    out = subprocess.run(
        [sys.executable, "-c", NUMBA_IN_A_FORKED_CORE],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    before, threads = map(int, out.stdout.split())
    assert before >= 2 and threads == 1, out.stdout
