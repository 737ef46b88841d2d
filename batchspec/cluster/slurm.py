"""Slurm: a run as an ordinary array job, each array task one worker of the same run.

The tasks need nothing from each other or from a coordinator: they share the output
directory (leases, atomic parts), so any task may die, be preempted and requeued, or be
cancelled and resubmitted, and the run still ends with every row exactly once. The sbatch
script is written into the output directory, readable and re-submittable by hand.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from batchspec.errors import UserError
from batchspec.io.layout import OutDir


@dataclass
class SubmitOptions:
    """What the user asked of Slurm (``batchspec slurm submit`` options)."""

    tasks: int = 1
    gpus_per_task: int = 0
    cpus_per_task: int | None = None
    partition: str | None = None
    time: str | None = None
    account: str | None = None
    job_name: str | None = None
    signal_lead_s: int = 120
    """Seconds before the time limit at which the early-warning SIGTERM reaches the task."""
    extra: list[str] = field(default_factory=list)
    """Further sbatch options, written as they are."""


def render_script(
    job: Path, out: OutDir, run_args: list[str], opts: SubmitOptions, workers_per_task: int
) -> str:
    """The sbatch script: an array of workers of one run."""
    # No terminal in a task: its log gets a progress line every --log-every seconds.
    cmd = [sys.executable, "-m", "batchspec", "run", str(job), "--output", str(out), *run_args]
    if workers_per_task > 1:
        cmd += ["--workers", str(workers_per_task)]
    lines = [
        *_sbatch_options(opts, out.slurm),
        "",
        "# Written by `batchspec slurm submit`; submit again by hand with: sbatch <this file>",
        "set -u",
        'export BATCHSPEC_RUN_ID="slurm-${SLURM_ARRAY_JOB_ID:-$SLURM_JOB_ID}"',
        'echo "batchspec task ${SLURM_ARRAY_TASK_ID:-0} of job ${SLURM_ARRAY_JOB_ID:-} '
        'on $(hostname) gpus=${CUDA_VISIBLE_DEVICES:-none} start $(date -Is)"',
        f"{shlex.join(cmd)} &",
        "worker=$!",
        "trap 'echo \"batchspec: SIGTERM, stopping the worker\"; kill -TERM $worker' TERM",
        "wait $worker",
        "rc=$?",
        # wait returns early when the trap fires: wait again for the worker's own exit code.
        "if kill -0 $worker 2>/dev/null; then wait $worker; rc=$?; fi",
        'echo "batchspec task ${SLURM_ARRAY_TASK_ID:-0} exit $rc $(date -Is)"',
        "exit $rc",
        "",
    ]
    return "\n".join(lines)


def _sbatch_options(opts: SubmitOptions, log_dir: Path) -> list[str]:
    """The script's header: the array, its logs, requeue, the early-warning signal."""
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={opts.job_name or 'batchspec'}",
        f"#SBATCH --array=0-{opts.tasks - 1}",
        f"#SBATCH --output={log_dir}/%A_%a.log",
        "#SBATCH --open-mode=append",
        # Requeued after node failure or preemption; the run resumes from its parts.
        "#SBATCH --requeue",
        # Early warning to the batch shell, which hands it to the worker: it stops claiming,
        # finishes or hands back its units, and exits 0 before the limit kills it.
        f"#SBATCH --signal=B:TERM@{opts.signal_lead_s}",
    ]
    if opts.gpus_per_task:
        lines.append(f"#SBATCH --gres=gpu:{opts.gpus_per_task}")
    if opts.cpus_per_task:
        lines.append(f"#SBATCH --cpus-per-task={opts.cpus_per_task}")
    for flag, value in (
        ("partition", opts.partition),
        ("time", opts.time),
        ("account", opts.account),
    ):
        if value:
            lines.append(f"#SBATCH --{flag}={value}")
    lines += [f"#SBATCH {shlex.quote(x) if ' ' in x else x}" for x in opts.extra]
    return lines


TIME_FORMAT = re.compile(r"(?:(\d+)-(\d+)(?::(\d+)(?::(\d+))?)?|(\d+)(?::(\d+)(?::(\d+))?)?)")
"""Slurm's ``--time``: ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``."""


def time_limit_s(text: str) -> int | None:
    """Seconds of a Slurm ``--time`` value; None for no limit (``UNLIMITED``, ``INFINITE``,
    0); ValueError for anything Slurm would refuse at submission."""
    if text.strip().upper() in ("UNLIMITED", "INFINITE"):
        return None
    m = TIME_FORMAT.fullmatch(text.strip())
    if m is None:
        raise ValueError(
            f"{text!r} is not a Slurm time (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, "
            "UNLIMITED)"
        )
    d, h, dm, ds, a, b, c = (int(x) if x else 0 for x in m.groups())
    if m.group(1) is not None:
        seconds = ((d * 24 + h) * 60 + dm) * 60 + ds
    elif m.group(7) is not None:
        seconds = (a * 60 + b) * 60 + c  # HH:MM:SS
    else:
        seconds = a * 60 + b  # MM or MM:SS
    return seconds or None


def slurm_cmd(name: str) -> str:
    """The path of a Slurm client command, or a UserError where Slurm is not installed."""
    path = shutil.which(name)
    if path is None:
        raise UserError(f"{name} not found: batchspec slurm needs the Slurm client commands")
    return path


def submit(script: str, out: OutDir, opts: SubmitOptions) -> str:
    """Write the script into OUT/slurm/, sbatch it, record the job; returns the job id."""
    sbatch = slurm_cmd("sbatch")  # before anything is written
    log_dir = out.slurm
    log_dir.mkdir(parents=True, exist_ok=True)
    path = log_dir / f"submit-{time.strftime('%Y%m%dT%H%M%S')}.sbatch"
    path.write_text(script)
    path.chmod(0o755)
    result = subprocess.run([sbatch, "--parsable", str(path)], capture_output=True, text=True)
    if result.returncode != 0:
        said = " / ".join((result.stderr or result.stdout).strip().splitlines())
        raise UserError(f"sbatch refused {path}: {said}")
    job_id = result.stdout.strip().split(";")[0]
    with open(out.slurm_jobs, "a") as fh:
        fh.write(
            json.dumps(
                {"job_id": job_id, "script": str(path), "tasks": opts.tasks, "time": time.time()}
            )
            + "\n"
        )
    return job_id


def submitted_jobs(out: OutDir) -> list[dict]:
    path = out.slurm_jobs
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


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
