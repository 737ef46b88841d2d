"""Shared test helpers: job specs on the project's prompt set, and the CLI as a subprocess.

End-to-end tests run the real ``batchspec`` command (real vLLM on the embedded model) in a
subprocess, exactly as a user would; only unit tests of orchestration logic use doubles.

The suite runs its files on parallel workers (pytest-xdist, ``--dist loadfile``), and the
engines each worker starts compute on cores of their own: vLLM's CPU build binds an engine's
threads to the first cores it may use, so the engines of two workers would otherwise compute
on the same core. ``--full`` runs the long trials in full (ten kill -9 trials, not four).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.slurm.fixture import slurm_cluster  # noqa: F401  (a real one-node Slurm cluster)

from batchspec.engines.cpu_threads import CPU_BIND_ENV

MAX_TEST_WORKERS = 4
"""More parallel engines than this would need more memory than a CI machine has."""

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ROOT / "jobs" / "data" / "prompts.parquet"
SPECULATIVE_MEASURED = (
    "num_spec_steps",
    "num_draft_tokens",
    "num_accepted_tokens",
    "acceptance_rate",
    "mean_acceptance_length",
    "acceptance_histogram",
)
"""The issue's columns measured by speculation: null, not zero, on rows generated without it."""
DOMAINS = ["chat", "code", "math", "qa", "summarization", "translation"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--full", action="store_true", help="run the long trials in full")


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """One worker per core (a third worker on 2 cores made the suite slower, 9.6 vs 8.2 min:
    vLLM's engine processes busy-wait on their queues)."""
    return max(1, min(len(os.sched_getaffinity(0)), MAX_TEST_WORKERS))


def pytest_configure(config: pytest.Config) -> None:
    """On an xdist worker, bind the compute threads of its engines to a share of the cores.

    Only the engines' threads are bound (vLLM's ``VLLM_CPU_OMP_THREADS_BIND``: a forked
    engine core and the tree engine take those cores, ``engines.cpu_threads``), not the test's
    processes: pinning a whole test to one core once put vLLM's busy-polling scheduler there
    too, which halved the speed of single-engine tests in a trial run.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    cpus = sorted(os.sched_getaffinity(0))
    if worker is None or count < 2 or len(cpus) < 2 or CPU_BIND_ENV in os.environ:
        return
    index = int(worker.removeprefix("gw"))
    per = max(1, len(cpus) // count)
    start = (index * per) % len(cpus)
    os.environ[CPU_BIND_ENV] = ",".join(map(str, cpus[start : start + per]))


LONGEST_FIRST = [
    "test_tune.py",
    "test_interrupts.py",
    "test_verify.py",
    "test_workers.py",
    "test_crash.py",
    "test_slurm.py",
    "test_adaptive.py",
    "test_e2e.py",
    "test_run_batch.py",
    "test_tree_engine.py",
    "test_observe_run.py",
    "test_orphans.py",
    "test_seeding_run.py",
]
"""The files that start engines, longest first (as measured): parallel workers take files in
collection order, and a long file taken last would leave the other worker idle. Order only."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """One torch thread for a module of matrices a few dozen rows wide: a second thread only
    waits (the suite runs a test file per core). Taken by ``pytestmark``, torch imported
    only then."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def full(request: pytest.FixtureRequest) -> bool:
    """Whether to run the long trials in full (``--full``)."""
    return bool(request.config.getoption("--full"))


def job_dict(out_dir: Path, **sections: dict[str, Any] | None) -> dict[str, Any]:
    """The shipped default job, made small and fast; sections override key by key."""
    job: dict[str, Any] = yaml.safe_load((ROOT / "jobs" / "synth_data.yaml").read_text())
    job["input"]["path"] = str(PROMPTS)
    job["output"] = {"dir": str(out_dir), "unit_rows": 8}
    job["model"].update(max_model_len=1024, max_num_seqs=8)
    job["sampling"]["max_tokens"] = 32
    for name, values in sections.items():
        if values is None:
            job.pop(name, None)
        else:
            job.setdefault(name, {}).update(values)
    return job


def small_job(tmp: Path, per_domain: int, **sections: dict[str, Any]) -> Path:
    """The default job over the first ``per_domain`` prompts of every domain, 4-row units."""
    import polars as pl

    df = pl.read_parquet(PROMPTS).group_by("domain", maintain_order=True).head(per_domain)
    df.sort("id").write_parquet(tmp / "in.parquet")
    job = job_dict(tmp / "out", input={"path": str(tmp / "in.parquet")}, **sections)
    job["output"]["unit_rows"] = 4
    return write_job(tmp / "job.yaml", job)


def write_job(path: Path, job: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return path


IN_PROCESS_ENGINE = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "OMP_NUM_THREADS": "1",
    CPU_BIND_ENV: "nobind",
}
"""vLLM's engine core and model in the CLI's own process: an engine start of ~7 s instead of
~10 s here (``scripts/bench/engine_start.py``), the same rows. The tests of what comes out
(rows, columns, K choices) use it; the tests of crashes, signals, several workers and Slurm
keep the layout production uses (the engine core in a process of its own). In the
CLI's process the model's threads are kept to one and not bound to a core: OpenMP threads of
parallel tests spinning on the same cores ran three times slower in a trial."""


def run_cli(
    *args: str, cwd: Path | None = None, timeout: float = 900, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``batchspec ARGS`` in a fresh interpreter, output captured; ``env`` added to ours."""
    full_env = dict(os.environ) | (env or {})
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    return subprocess.run(
        [sys.executable, "-m", "batchspec", *args],
        cwd=cwd or ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_logs(out: Path) -> list[dict[str, Any]]:
    """The run logs (``runs/*.json``) of an output directory, oldest first."""
    return [json.loads(p.read_text()) for p in sorted((out / "runs").glob("*.json"))]


@pytest.fixture
def job_file(tmp_path: Path):
    """Factory: write a job (with overrides) into tmp_path and return its path."""

    def make(name: str = "job.yaml", **sections: dict[str, Any]) -> Path:
        return write_job(tmp_path / name, job_dict(tmp_path / "out", **sections))

    return make


def signal_group(
    args: list[str],
    out: Path,
    signals: list[int],
    env: dict[str, str] | None = None,
    until: Callable[[int], bool] | None = None,
) -> tuple[subprocess.CompletedProcess, float]:
    """Run ``batchspec run ARGS`` in a process group of its own (as a shell job is), wait for
    its next commit (or, with a hang injected, for its engine to have units in flight; or
    until ``until(pid)`` holds), then send ``signals`` to the whole group, 1.5 s apart.
    Returns the finished process and the seconds from the last signal to its exit."""

    t0 = time.time()
    parts = len(list((out / "parts").glob("*.parquet")))

    def started() -> bool:
        if until is not None:
            return until(proc.pid)
        if "BATCHSPEC_INJECT_ENGINE_HANG" not in (env or {}):
            return len(list((out / "parts").glob("*.parquet"))) > parts
        # Hung: wait for its engine to be up, with units in flight (its progress record's
        # open units: its ``units`` lists every lease held, claimed ahead ones included).
        for path in (out / "leases").glob("*.progress.json"):
            with contextlib.suppress(OSError, ValueError):
                record = json.loads(path.read_text())
                if path.stat().st_mtime >= t0 and record.get("open", {}).get("units"):
                    return True
        return False

    cmd = [sys.executable, "-m", "batchspec", "run", *args, "--no-progress"]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )
    deadline = time.monotonic() + 300
    while not started():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the run did not start in time"
        time.sleep(0.2)
    for i, signum in enumerate(signals):
        time.sleep(1.5 if i else 0.0)
        os.killpg(proc.pid, signum)
    sent = time.monotonic()
    stdout, stderr = proc.communicate(timeout=120)
    seconds = time.monotonic() - sent
    # Nothing of the group (the engine's processes) may outlive the run (reaping takes a moment).
    for _ in range(50):
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("processes of the run's group outlived it")
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr), seconds
