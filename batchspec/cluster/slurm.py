"""Slurm: a run as an ordinary array job, each array task one worker of the same run.

The tasks need nothing from each other or from a coordinator: they share the output
directory (leases, atomic parts), so any task may die, be preempted and requeued, or be
cancelled and resubmitted, and the run still ends with every row exactly once. The sbatch
script (``cluster.sbatch``) is written into the output directory, readable and
re-submittable by hand; a finisher job after the array gives the run's verdict as its exit
code, for pipelines that chain on it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from batchspec.cluster.sbatch import SubmitOptions, render_finisher, render_script, time_limit_s
from batchspec.errors import UserError
from batchspec.io.layout import OutDir

__all__ = [
    "SubmitOptions",
    "render_finisher",
    "render_script",
    "slurm_cmd",
    "submit",
    "submit_finisher",
    "submitted_jobs",
    "task_states",
    "time_limit_s",
]


def slurm_cmd(name: str) -> str:
    """The path of a Slurm client command, or a UserError where Slurm is not installed."""
    path = shutil.which(name)
    if path is None:
        raise UserError(f"{name} not found: batchspec slurm needs the Slurm client commands")
    return path


def _sbatch(out: OutDir, script: str, name: str, *options: str) -> tuple[Path, str]:
    """Write ``script`` as ``OUT/slurm/<name>`` and sbatch it with ``options``; returns the
    script's path and the job id."""
    sbatch = slurm_cmd("sbatch")  # before anything is written
    out.slurm.mkdir(parents=True, exist_ok=True)
    path = out.slurm / name
    path.write_text(script)
    path.chmod(0o755)
    result = subprocess.run(
        [sbatch, "--parsable", *options, str(path)], capture_output=True, text=True
    )
    if result.returncode != 0:
        said = " / ".join((result.stderr or result.stdout).strip().splitlines())
        raise UserError(f"sbatch refused {path}: {said}")
    job_id = result.stdout.strip().split(";")[0]
    if not job_id.isdigit():  # it goes into a --dependency and a record
        raise UserError(f"sbatch submitted {path} but printed no job id: {result.stdout!r}")
    return path, job_id


def _record(out: OutDir, entry: dict[str, Any]) -> None:
    """One line of ``OUT/slurm/jobs.jsonl``: what ``slurm status`` asks Slurm about."""
    with open(out.slurm_jobs, "a") as fh:
        fh.write(json.dumps(entry | {"time": time.time()}) + "\n")


def submit(script: str, out: OutDir, opts: SubmitOptions) -> str:
    """Write the array's script into OUT/slurm/, sbatch it, record the job; returns its id."""
    stamp = time.strftime("%Y%m%dT%H%M%S")
    path, job_id = _sbatch(out, script, f"submit-{stamp}.sbatch")
    _record(out, {"job_id": job_id, "script": str(path), "tasks": opts.tasks, "role": "array"})
    return job_id


def submit_finisher(script: str, out: OutDir, array_id: str) -> str:
    """Submit the finisher (``sbatch.render_finisher``) to start once every task of
    ``array_id`` has ended, however it ended (``afterany``); record it; returns its id."""
    stamp = time.strftime("%Y%m%dT%H%M%S")
    path, job_id = _sbatch(
        out, script, f"submit-{stamp}-finisher.sbatch", f"--dependency=afterany:{array_id}"
    )
    _record(
        out,
        {"job_id": job_id, "script": str(path), "tasks": 1, "role": "finisher", "after": array_id},
    )
    return job_id


def submitted_jobs(out: OutDir) -> list[dict[str, Any]]:
    """The jobs ``submit`` recorded (``role``: ``array``, or ``finisher`` with ``after``, the
    array it follows); a damaged record is refused, naming the file and line."""
    path = out.slurm_jobs
    if not path.exists():
        return []
    jobs = []
    for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            job = json.loads(line)
            jobs.append(
                {"role": "array", **job, "job_id": str(job["job_id"]), "tasks": int(job["tasks"])}
            )
        except (ValueError, TypeError, KeyError) as exc:
            raise UserError(f"{path}: line {n} is not a job record ({exc})") from None
    return jobs


def task_states(job_id: str) -> dict[str, str]:
    """State per array task: from squeue while queued or running, else from sacct if any."""
    states: dict[str, str] = {}
    env = dict(os.environ)
    squeue = shutil.which("squeue")
    if squeue:
        out = subprocess.run(
            [squeue, "-h", "-r", "-j", job_id, "-o", "%i %T"],
            capture_output=True,
            text=True,
            env=env,
        )
        for line in out.stdout.splitlines():
            task, _, state = line.strip().partition(" ")
            if task:
                states[task] = state
    sacct = shutil.which("sacct")
    if sacct:
        out = subprocess.run(
            [sacct, "-n", "-X", "-P", "-j", job_id, "-o", "JobID,State"],
            capture_output=True,
            text=True,
            env=env,
        )
        if out.returncode == 0:
            for line in out.stdout.splitlines():
                task, _, state = line.strip().partition("|")
                if task and task not in states:
                    states[task] = state.split()[0] if state else state
    return states
