"""Slurm's client commands against one cluster (``SLURM_CONF``), and the states of its jobs.

Without slurmdbd there is no ``sacct`` data, and ``squeue`` drops a job a few seconds after it
ends, so final states come from the ``jobcomp/filetxt`` record the cluster writes.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from .base import CLIENT_PREFIXES, FINAL_STATES, ClusterError


class SlurmClient:
    """Slurm commands for the cluster configured by ``conf_path``, whose finished jobs are
    recorded in ``jobcomp_path``."""

    def __init__(self, conf_path: Path, jobcomp_path: Path) -> None:
        self.conf_path = conf_path
        self.jobcomp_path = jobcomp_path

    @property
    def env(self) -> dict[str, str]:
        """A full environment for Slurm client commands (and the jobs they submit)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(CLIENT_PREFIXES)}
        env["SLURM_CONF"] = str(self.conf_path)
        return env

    def run(
        self, args: Sequence[str], *, check: bool = True, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command (``["squeue", ...]``) against this cluster."""
        result = subprocess.run(
            list(args),
            env=self.env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise ClusterError(
                f"{' '.join(args)} exited {result.returncode}: {result.stderr.strip()}"
            )
        return result

    def sbatch(self, *args: str) -> str:
        """Submit with ``sbatch --parsable ARGS``; return the job id (array job id for arrays)."""
        out = self.run(["sbatch", "--parsable", *args]).stdout.strip()
        return out.split(";")[0]

    def queue(self, job_id: str | None = None) -> dict[str, str]:
        """``squeue`` as {job id (``123`` or ``123_4``): state}, finished records included."""
        args = ["squeue", "-h", "-r", "-t", "all", "-o", "%i|%T"]
        if job_id is not None:
            args += ["-j", str(job_id)]
        result = self.run(args, check=False)
        if result.returncode != 0:
            if "Invalid job id" in result.stderr:
                return {}  # already purged
            raise ClusterError(f"squeue failed: {result.stderr.strip()}")
        states: dict[str, str] = {}
        for line in result.stdout.splitlines():
            if "|" in line:
                jid, state = line.strip().split("|", 1)
                states[jid] = state
        return states

    def cancel_all(self, wait: float = 0.0) -> None:
        """``scancel`` every unfinished job; with ``wait``, wait up to that long for them to end.

        Cancelled jobs get SIGTERM, and SIGKILL ``kill_wait`` seconds later if still running.
        """
        active = [j for j, s in self.queue().items() if s not in FINAL_STATES]
        ids = sorted({j.split("_")[0] for j in active})
        if ids:
            self.run(["scancel", *ids], check=False)
        deadline = time.monotonic() + wait
        while ids and time.monotonic() < deadline:
            if all(s in FINAL_STATES for s in self.queue().values()):
                return
            time.sleep(0.2)

    def sacct_available(self) -> bool:
        """Whether ``sacct`` can answer (it cannot without slurmdbd: accounting is off here)."""
        return self.run(["sacct", "-n", "-X", "-j", "1"], check=False).returncode == 0

    def wait_for_jobs(self, job_id: str | int, timeout: float = 300.0) -> dict[str, str]:
        """Wait until job ``job_id`` (every task of an array) has ended; return final states.

        Keys are ``"123"`` for a plain job and ``"123_4"`` for array tasks; values are Slurm
        states (``COMPLETED``, ``FAILED``, ``CANCELLED``, ``TIMEOUT``, ...). The states come from
        ``sacct`` when accounting is available, else from the jobcomp record, else from the
        last ``squeue`` poll. Raises :class:`TimeoutError` if the job is still active.
        """
        job = str(job_id)
        seen: dict[str, str] = {}
        deadline = time.monotonic() + timeout
        while True:
            states = self.queue(job)
            seen.update(states)
            if all(s in FINAL_STATES for s in states.values()):
                break  # every record final, or all purged already
            if time.monotonic() >= deadline:
                raise TimeoutError(f"job {job} still active after {timeout}s: {states}")
            time.sleep(0.5)
        final = self._sacct_states(job) or self.jobcomp_states(job)
        # squeue -r names pending tasks one by one; a "1_[0-3]" line is not a task.
        result = {k: v for k, v in seen.items() if "[" not in k}
        result.update(final)
        if job in result and any("_" in k for k in result):
            # An array: the bare id's record stands for tasks that never started (cancelled
            # while pending); it is the final state of such tasks squeue last saw pending.
            meta = result.pop(job)
            for key, state in result.items():
                if key not in final and state not in FINAL_STATES:
                    result[key] = meta
        return dict(sorted(result.items(), key=lambda kv: _job_sort_key(kv[0])))

    def _sacct_states(self, job: str) -> dict[str, str]:
        """Final states from sacct, or {} where accounting is off (the default here)."""
        result = self.run(["sacct", "-n", "-P", "-X", "-j", job, "-o", "JobID,State"], check=False)
        if result.returncode != 0:
            return {}
        states: dict[str, str] = {}
        for line in result.stdout.splitlines():
            jid, _, state = line.partition("|")
            if state and "[" not in jid:
                states[jid] = state.split()[0]  # "CANCELLED by 0" -> "CANCELLED"
        return states

    def jobcomp_states(self, job_id: str | int) -> dict[str, str]:
        """Final states of ``job_id`` (and its array tasks) from the jobcomp/filetxt record."""
        job = str(job_id)
        states: dict[str, str] = {}
        try:
            text = self.jobcomp_path.read_text(errors="replace")
        except FileNotFoundError:
            return states
        for line in text.splitlines():
            fields = dict(re.findall(r"(\w+)=(\S*)", line))
            array_job = fields.get("ArrayJobId")
            task = fields.get("ArrayTaskId")
            if array_job == job and task not in (None, "", "4294967294"):
                states[f"{job}_{task}"] = fields.get("JobState", "UNKNOWN")
            elif fields.get("JobId") == job:
                states[job] = fields.get("JobState", "UNKNOWN")
        return states


def _job_sort_key(job: str) -> tuple[int, int]:
    head, _, task = job.partition("_")
    return (int(head) if head.isdigit() else 0, int(task) if task.isdigit() else -1)
