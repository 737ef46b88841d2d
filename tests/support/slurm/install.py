"""Slurm and munge commands: found, or installed from Debian's packages (root, apt-get)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence

from .base import tail, which

REQUIRED_COMMANDS = ("sbatch", "squeue", "scancel", "sinfo", "slurmctld", "slurmd", "munged")
PACKAGES = ("slurm-wlm", "munge")


def missing_commands() -> list[str]:
    return [name for name in REQUIRED_COMMANDS if which(name) is None]


def ensure_installed() -> None:
    """Install Debian's ``slurm-wlm`` and ``munge`` if any Slurm or munge command is missing.

    Runs ``apt-get install`` (and ``apt-get update`` only if that first install fails). Raises
    :class:`RuntimeError` with the reason when the commands are missing and cannot be installed
    (not root, no apt-get, no package index).
    """
    missing = missing_commands()
    if not missing:
        return
    why = f"Slurm commands missing: {', '.join(missing)}"
    if shutil.which("apt-get") is None:
        raise RuntimeError(f"{why}; no apt-get to install {' '.join(PACKAGES)}")
    if os.geteuid() != 0:
        raise RuntimeError(f"{why}; installing {' '.join(PACKAGES)} needs root")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES]
    result = _run_quiet(install, env)
    if result.returncode != 0:
        update = _run_quiet(["apt-get", "update", "-q"], env)
        if update.returncode != 0:
            raise RuntimeError(f"{why}; apt-get update failed:\n{tail(update.stdout, 20)}")
        result = _run_quiet(install, env)
        if result.returncode != 0:
            raise RuntimeError(f"{why}; apt-get install failed:\n{tail(result.stdout, 20)}")
    missing = missing_commands()
    if missing:
        raise RuntimeError(f"installed {' '.join(PACKAGES)} but still missing: {missing}")


def _run_quiet(cmd: Sequence[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(cmd),
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
    )
