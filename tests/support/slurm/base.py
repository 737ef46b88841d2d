"""What every part of the test cluster shares: its error, names and Slurm's final states."""

from __future__ import annotations

import os
import shutil

MARKER_ENV = "BATCHSPEC_SLURM_CLUSTER"
"""Set in the daemons' environment (and so in slurmstepd's and the jobs'): how stop finds what
they left running."""
PARTITION = "debug"
FINAL_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "REVOKED",
        "SPECIAL_EXIT",
        "TIMEOUT",
    }
)
"""States after which a job (or array task) will not run again by itself."""
CLIENT_PREFIXES = (
    "SLURM_",
    "SBATCH_",
    "SALLOC_",
    "SRUN_",
    "SQUEUE_",
    "SINFO_",
    "SCANCEL_",
    "SACCT_",
)
"""Client variables a surrounding Slurm job (or a user's shell) may carry; they would steer our
clients away from this cluster or change their defaults, so the cluster's env drops them."""
PORT_CLASH = "Address already in use"


class ClusterError(RuntimeError):
    """The cluster could not be started or queried."""


def which(name: str) -> str | None:
    """The path of command ``name``; daemons live in /usr/sbin, which a non-login PATH may
    lack."""
    path = os.environ.get("PATH", os.defpath) + os.pathsep + "/usr/sbin:/sbin"
    return shutil.which(name, path=path)


def tail(text: str, lines: int) -> str:
    return "\n".join(text.splitlines()[-lines:])
