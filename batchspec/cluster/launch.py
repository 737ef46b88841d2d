"""Local launcher: ``batchspec run JOB --workers N`` starts N worker processes on this node.

Each worker is an ordinary ``batchspec run`` process; they cooperate through the output
directory alone (leases, atomic parts), exactly as Slurm array tasks on many nodes do, so the
launcher only splits the GPUs, forwards signals, shows progress and sums up.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid

from batchspec.engines.cpu_threads import CPU_BIND_ENV
from batchspec.errors import UserError
from batchspec.io.layout import OutDir
from batchspec.work.completion import Exit
from batchspec.work.live import LiveProgress
from batchspec.work.runlog import (
    LAUNCHER_ENV,
    RUN_ID_ENV,
    WORKER_ENV,
    RunStats,
    run_id,
    sum_runs,
)


def visible_gpus() -> list[str]:
    """GPU ids this process may use: CUDA_VISIBLE_DEVICES (as Slurm sets it), else nvidia-smi."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g for g in env.split(",") if g.strip() not in ("", "-1")]
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [str(i) for i, line in enumerate(out.stdout.splitlines()) if line.startswith("GPU ")]


def gpu_slices(workers: int, tp: int, gpus: list[str]) -> list[str | None]:
    """CUDA_VISIBLE_DEVICES per worker: ``tp`` GPUs each; None everywhere on a CPU node."""
    if not gpus:
        return [None] * workers
    if workers * tp > len(gpus):
        raise UserError(
            f"--workers {workers} with model.tensor_parallel_size {tp} needs {workers * tp} "
            f"GPUs; {len(gpus)} are visible ({','.join(gpus)})"
        )
    return [",".join(gpus[i * tp : (i + 1) * tp]) for i in range(workers)]


def cpu_slices(workers: int, tp: int, cpus: list[int]) -> list[str | None]:
    """``VLLM_CPU_OMP_THREADS_BIND`` per worker on a CPU node: disjoint cores for each.

    vLLM's CPU build binds every engine's threads to the cores of the first NUMA node it may
    use, so N engines on one node would all compute on the same cores (measured here: two
    workers on 2 cores ran at 35 output tokens/s each, bound apart at 67 and 72). Each worker
    gets its own slice, one bind list per tensor-parallel rank. A one-rank model computes in
    its engine core (``engines.vllm_fork``; the tree engine in the worker), on its whole
    slice; with several ranks each rank's last core is left to the engine core, whose loop
    polls the ranks, as vLLM itself reserves it. None everywhere when there are fewer cores
    than ranks: vLLM then decides.
    """
    ranks = workers * tp
    if len(cpus) < ranks:
        return [None] * workers
    per = len(cpus) // ranks
    groups = [cpus[r * per : (r + 1) * per] for r in range(ranks)]
    binds = [",".join(map(str, g[:-1] if len(g) > 1 and tp > 1 else g)) for g in groups]
    return ["|".join(binds[w * tp : (w + 1) * tp]) for w in range(workers)]


def _worker_env(i: int, run: str, gpus: str | None, cpus: str | None) -> dict[str, str]:
    # The workers die with the launcher (``runlog.bind_to_launcher``).
    env = dict(os.environ, **{RUN_ID_ENV: run, WORKER_ENV: str(i), LAUNCHER_ENV: str(os.getpid())})
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpus
    if cpus is not None:
        env[CPU_BIND_ENV] = cpus
    return env


def launch(
    worker_args: list[str],
    workers: int,
    tp: int,
    out: OutDir,
    units_total: int,
    units_todo: int,
    total_rows: int,
    progress: bool,
    log_every: float = 30.0,
) -> RunStats:
    """Start the workers, wait for all of them, and return their stats summed."""
    gpus = visible_gpus()
    slices = gpu_slices(workers, tp, gpus)
    cpus: list[str | None] = [None] * workers
    if not gpus and os.environ.get(CPU_BIND_ENV, "auto") == "auto":
        cpus = cpu_slices(workers, tp, sorted(os.sched_getaffinity(0)))
    run = run_id() if os.environ.get(RUN_ID_ENV) else f"local-{uuid.uuid4().hex[:12]}"
    started = time.perf_counter()
    cmd = [sys.executable, "-m", "batchspec", "run", *worker_args, "--no-progress"]
    procs = [
        subprocess.Popen(
            cmd, env=_worker_env(i, run, slices[i], cpus[i]), stdout=subprocess.DEVNULL
        )
        for i in range(workers)
    ]

    def forward(signum: int, _frame: object) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    # The workers' progress records, added up (O(workers) a refresh, no listing of parts).
    before = out.rows_committed()
    mode = LiveProgress.mode_for(progress)
    live = LiveProgress(None, out, before + total_rows, before, mode, log_every)
    live.start()
    try:
        while any(p.poll() is None for p in procs):
            time.sleep(1.0)
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        live.close()
    # A worker's 3, 4 or 5 is its verdict on the plan when it left (``work.completion``),
    # not a failure of its own: the launcher's verdict is taken once all have ended.
    verdicts = {Exit.DONE, Exit.UNITS_FAILED, Exit.ROWS_FAILED, Exit.INCOMPLETE}
    failed = [(i, p.returncode) for i, p in enumerate(procs) if p.returncode not in verdicts]
    stats = sum_runs(out, run, time.perf_counter() - started)
    stats.units_total = units_total
    stats.units_skipped = units_total - units_todo
    if failed:
        codes = ", ".join(f"worker {i}: exit {rc}" for i, rc in failed)
        raise WorkerError(f"{len(failed)} of {workers} workers failed ({codes})", stats)
    return stats


class WorkerError(RuntimeError):
    def __init__(self, message: str, stats: RunStats):
        super().__init__(message)
        self.stats = stats
