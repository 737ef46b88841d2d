"""Who is running and what they did: run ids, worker names, per-invocation logs and their sum.

A run is one invocation of ``batchspec run`` with all its workers (local processes or Slurm
array tasks). Each worker writes one JSON log under ``runs/`` when it ends; the launcher and
reports add them up. The whole run's state is in the output directory, not in these logs.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from batchspec.engines.tether import die_with_parent
from batchspec.io.layout import OutDir
from batchspec.io.temps import temp_name
from batchspec.spec import JobSpec

RUN_ID_ENV = "BATCHSPEC_RUN_ID"
WORKER_ENV = "BATCHSPEC_WORKER_INDEX"
LAUNCHER_ENV = "BATCHSPEC_LAUNCHER_PID"
"""Set by the ``--workers N`` launcher for its workers: its pid."""

_SUMMED = (
    "units_committed",
    "units_discarded",
    "units_failed",
    "units_abandoned",
    "engine_failures",
    "rows",
    "error_rows",
    "output_tokens",
    "engine_builds",
)
"""RunStats counters that add up across workers (times overlap: the longest is taken)."""


def error_cause(error: str) -> str:
    """An error row's cause without its particulars (numbers, quoted values), so that rows
    failing for one reason count together."""
    first = error.splitlines()[0] if error else "error"
    first = re.sub(r"'[^']*'|\"[^\"]*\"", "'...'", first)
    return re.sub(r"\d+(\.\d+)?", "N", first)[:120]


def run_id() -> str:
    """Identity of one invocation (all its workers): failed units are skipped within it only.

    The launcher passes its own to its workers; a Slurm array's tasks share the array job's;
    otherwise one is made and kept in the environment, so it holds for the whole process.
    """
    if not os.environ.get(RUN_ID_ENV):
        slurm = os.environ.get("SLURM_ARRAY_JOB_ID") or os.environ.get("SLURM_JOB_ID")
        os.environ[RUN_ID_ENV] = f"slurm-{slurm}" if slurm else uuid.uuid4().hex[:12]
    return os.environ[RUN_ID_ENV]


def worker_name() -> str:
    """Unique per worker process: host, pid, Slurm array task and local worker index."""
    parts = [socket.gethostname(), str(os.getpid())]
    if os.environ.get("SLURM_ARRAY_TASK_ID"):
        parts.append(f"t{os.environ['SLURM_ARRAY_TASK_ID']}")
    if os.environ.get(WORKER_ENV):
        parts.append(f"w{os.environ[WORKER_ENV]}")
    return "-".join(parts)


def bind_to_launcher() -> None:
    """A worker of the ``--workers N`` launcher dies with it (its engine then dies with the
    worker): a launcher killed outright would otherwise leave its workers running unseen.
    Taken out of the environment, so that nothing this worker starts inherits it."""
    launcher = os.environ.pop(LAUNCHER_ENV, None)
    if launcher:
        die_with_parent(int(launcher))


@dataclass
class RunStats:
    """What one worker invocation did (the whole run's state is in the output directory)."""

    out_dir: str
    run_id: str
    worker: str
    units_total: int
    units_skipped: int = 0
    units_committed: int = 0
    units_discarded: int = 0
    units_failed: int = 0
    units_abandoned: int = 0
    engine_failures: int = 0
    rows: int = 0
    error_rows: int = 0
    output_tokens: int = 0
    engine_build_s: float = 0.0
    stage_s: float = 0.0
    """Staging input files with large row groups (``io.staging``), once per output dir."""
    engine_close_s: float = 0.0
    generate_s: float = 0.0
    wall_s: float = 0.0
    stopped_by_signal: bool = False
    engine_builds: int = 0
    engines: list[dict[str, Any]] = field(default_factory=list)
    """One record per stretch of work on one engine (an engine may serve several groups)."""
    error_causes: dict[str, int] = field(default_factory=dict)
    """This invocation's error rows by cause (``error_cause``): the summary names the leading
    ones, so that "4 errors" comes with its reason."""
    heartbeat_lost: str | None = None
    """Why this worker stopped claiming: its heartbeat record could not be written for half a
    lease's lifetime (its leases may be taken over); None while it could."""

    def count_errors(self, errors: list[str]) -> None:
        for error in errors:
            cause = error_cause(error)
            self.error_causes[cause] = self.error_causes.get(cause, 0) + 1

    @property
    def output_tokens_per_s(self) -> float | None:
        return self.output_tokens / self.generate_s if self.generate_s > 0 else None


def write_run_log(out: OutDir, stats: RunStats) -> None:
    """One JSON file per worker invocation under runs/: what it did, for reports and debugging."""
    out.runs.mkdir(parents=True, exist_ok=True)
    name = f"{time.strftime('%Y%m%dT%H%M%S')}-{stats.worker}.json"
    data = asdict(stats) | {"output_tokens_per_s": stats.output_tokens_per_s}
    (out.runs / name).write_text(json.dumps(data, indent=2) + "\n")


def write_job_record(out: OutDir, spec: JobSpec, files: list[Path], limit: int | None) -> None:
    """``OUT/job.json``: the spec as this run read it (with its folder, for relative paths),
    the input files and the limit, so that ``batchspec export`` can find the input order and
    describe the job without the spec file. Rewritten by every run (the manifest ensures they
    agree on everything that shapes the rows)."""
    data = {
        "spec": spec.model_dump(mode="json"),
        "base_dir": spec.base_dir,
        "input_files": [str(f) for f in files],
        "limit": limit,
        "time": time.time(),
    }
    tmp = temp_name(out.job_record)
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, out.job_record)


def run_logs(out: OutDir) -> list[dict[str, Any]]:
    """Every worker invocation's log, oldest first."""
    if not out.runs.is_dir():
        return []
    return [json.loads(p.read_text()) for p in sorted(out.runs.glob("*.json"))]


def sum_runs(out: OutDir, run: str, wall_s: float) -> RunStats:
    """The workers' run logs of one run, summed (parallel times: the longest)."""
    total = RunStats(str(out), run, "launcher", 0)
    for d in run_logs(out):
        if d.get("run_id") != run:
            continue
        for name in _SUMMED:
            setattr(total, name, getattr(total, name) + d[name])
        total.engine_build_s = max(total.engine_build_s, d["engine_build_s"])
        total.generate_s = max(total.generate_s, d["generate_s"])
        total.stage_s = max(total.stage_s, d.get("stage_s", 0.0))
        total.stopped_by_signal |= d["stopped_by_signal"]
        for cause, n in d.get("error_causes", {}).items():
            total.error_causes[cause] = total.error_causes.get(cause, 0) + n
        total.heartbeat_lost = total.heartbeat_lost or d.get("heartbeat_lost")
        total.engines += d["engines"]
    total.wall_s = wall_s
    return total
