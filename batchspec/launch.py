"""Local launcher: ``batchspec run JOB --workers N`` starts N worker processes on this node.

Each worker is an ordinary ``batchspec run`` process; they cooperate through the output
directory alone (leases, atomic parts), exactly as Slurm array tasks on many nodes do, so the
launcher only splits the GPUs, forwards signals, shows progress and sums up.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pyarrow.parquet as pq
from tqdm import tqdm

from batchspec.errors import UserError
from batchspec.runner import RUN_ID_ENV, RUNS_DIR, WORKER_ENV, RunStats, run_id
from batchspec.writer import PARTS_DIR


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


class _PartCounter:
    """Rows committed so far, from part footers, reading each new part once."""

    def __init__(self, out_dir: Path):
        self.dir = out_dir / PARTS_DIR
        self.seen: dict[str, int] = {}

    def rows(self) -> int:
        for p in self.dir.glob("*.parquet") if self.dir.is_dir() else []:
            if p.name not in self.seen:
                try:
                    self.seen[p.name] = pq.ParquetFile(p).metadata.num_rows
                except OSError:
                    continue
        return sum(self.seen.values())


def launch(
    worker_args: list[str],
    workers: int,
    tp: int,
    out_dir: Path,
    units_total: int,
    units_todo: int,
    total_rows: int,
    progress: bool,
) -> RunStats:
    """Start the workers, wait for all of them, and return their stats summed."""
    slices = gpu_slices(workers, tp, visible_gpus())
    run = run_id() if os.environ.get(RUN_ID_ENV) else f"local-{uuid.uuid4().hex[:12]}"
    started = time.perf_counter()
    procs = []
    for i, gpus in enumerate(slices):
        env = dict(os.environ, **{RUN_ID_ENV: run, WORKER_ENV: str(i)})
        if gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpus
        cmd = [sys.executable, "-m", "batchspec", "run", *worker_args, "--no-progress"]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL))

    def forward(signum: int, _frame: object) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    counter = _PartCounter(out_dir)
    before = counter.rows()
    bar = tqdm(
        total=total_rows - before,
        unit="row",
        disable=not progress,
        dynamic_ncols=True,
        desc=f"generating ({workers} workers)",
    )
    try:
        while any(p.poll() is None for p in procs):
            time.sleep(1.0)
            bar.n = counter.rows() - before
            bar.refresh()
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        bar.n = counter.rows() - before
        bar.close()
    failed = [(i, p.returncode) for i, p in enumerate(procs) if p.returncode != 0]
    stats = _sum_runs(out_dir, run, time.perf_counter() - started)
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


def _sum_runs(out_dir: Path, run: str, wall_s: float) -> RunStats:
    """The workers' run logs of this run, summed (parallel times: the longest)."""
    logs = []
    for path in sorted((out_dir / RUNS_DIR).glob("*.json")):
        data = json.loads(path.read_text())
        if data.get("run_id") == run:
            logs.append(data)
    total = RunStats(str(out_dir), run, "launcher", 0)
    for d in logs:
        for name in (
            "units_committed",
            "units_discarded",
            "units_failed",
            "units_abandoned",
            "engine_failures",
            "rows",
            "error_rows",
            "output_tokens",
        ):
            setattr(total, name, getattr(total, name) + d[name])
        total.engine_build_s = max(total.engine_build_s, d["engine_build_s"])
        total.generate_s = max(total.generate_s, d["generate_s"])
        total.stopped_by_signal |= d["stopped_by_signal"]
        total.engines += d["engines"]
        total.engine_builds += d["engine_builds"]
    total.wall_s = wall_s
    return total
