"""A cluster's directory and ``slurm.conf``: node = this host, its CPUs and memory, free TCP
ports, every socket, pid file, log, spool and state directory inside the cluster's own
directory, so that the system's Slurm configuration is never read or touched."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .base import ClusterError

if TYPE_CHECKING:
    from .cluster import Cluster

SUN_PATH_MAX = 100
"""AF_UNIX socket paths are limited to 108 bytes; keep a margin."""


@dataclass
class Sockets:
    """Where the Unix sockets go: in the cluster's directory, or, when its path is too long
    for them, in a short directory in /tmp (``short_dir``, removed on stop)."""

    munge_socket: Path
    spool_dir: Path
    """slurmd's spool, where slurmstepd listens."""
    short_dir: Path | None = None


def free_ports(count: int) -> list[int]:
    """Distinct TCP ports nothing listens on right now (the daemons bind them moments later)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def real_memory_mb() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    raise ClusterError("no MemTotal in /proc/meminfo")


def short_hostname() -> str:
    return socket.gethostname().split(".")[0]


def prepare_dirs(directory: Path, node: str) -> Sockets:
    """Fresh state, spool, run and log directories (no jobs from a past run) and a new munge
    key; returns where the sockets go."""
    for sub in ("state", "spool", "run", "log"):
        path = directory / sub
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
    (directory / "etc").mkdir(exist_ok=True)
    munge_dir = directory / "munge"
    shutil.rmtree(munge_dir, ignore_errors=True)
    munge_dir.mkdir(mode=0o755)
    os.chmod(munge_dir, 0o755)  # munged insists others may traverse its socket's dir
    sockets = Sockets(munge_dir / "munge.sock", directory / "spool")
    # slurmstepd listens on SPOOL/NODE_JOBID.STEPID; the longest such name:
    step_socket = sockets.spool_dir / f"{node}_4294967294.4294967294"
    if max(len(str(sockets.munge_socket)), len(str(step_socket))) > SUN_PATH_MAX:
        short = Path(tempfile.mkdtemp(prefix="bs-slurm-"))
        os.chmod(short, 0o755)
        sockets = Sockets(short / "munge.sock", short / "spool", short)
        sockets.spool_dir.mkdir()
    key = munge_dir / "munge.key"
    with open(key, "wb") as f:
        f.write(os.urandom(128))
    os.chmod(key, 0o400)
    return sockets


def write_conf(cluster: Cluster, sockets: Sockets) -> None:
    """``etc/slurm.conf`` (and the empty files it names) for ``cluster``'s settings."""
    d = cluster.dir
    user = pwd.getpwuid(os.geteuid()).pw_name
    lines = [
        "# Written by batchspec's tests/support/slurm: a one-node test cluster.",
        "ClusterName=batchspec",
        f"SlurmctldHost={cluster.node}(127.0.0.1)",
        f"SlurmUser={user}",
        f"SlurmdUser={user}",
        f"SlurmctldPort={cluster.ctld_port}",
        f"SlurmdPort={cluster.slurmd_port}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        # cred_expire is also how long a requeued job waits before it may start again
        # (Slurm's default, 120 s, would slow requeue tests down).
        f"AuthInfo=socket={sockets.munge_socket},cred_expire={cluster.cred_expire}",
        f"StateSaveLocation={d / 'state'}",
        f"SlurmdSpoolDir={sockets.spool_dir}",
        f"SlurmctldPidFile={d / 'run' / 'slurmctld.pid'}",
        f"SlurmdPidFile={d / 'run' / 'slurmd.pid'}",
        f"SlurmctldLogFile={cluster.log_dir / 'slurmctld.log'}",
        f"SlurmdLogFile={cluster.log_dir / 'slurmd.log'}",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        f"PlugStackConfig={d / 'etc' / 'plugstack.conf'}",
        "ProctrackType=proctrack/linuxproc",
        f"TaskPlugin={cluster.task_plugin}",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SchedulerType=sched/backfill",
        "SwitchType=switch/none",
        "MpiDefault=none",
        "ReturnToService=2",
        f"MinJobAge={cluster.min_job_age}",
        f"KillWait={cluster.kill_wait}",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/filetxt",
        f"JobCompLoc={cluster.jobcomp_path}",
        "MailProg=/bin/true",
        # Trust the CPU/memory figures below over slurmd's own topology detection, so a
        # laptop with hyperthreads is not drained for a mismatch.
        "SlurmdParameters=config_overrides",
        *cluster.extra_conf,
        f"NodeName={cluster.node} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} "
        f"RealMemory={real_memory_mb()} State=UNKNOWN",
        f"PartitionName={cluster.partition} Nodes={cluster.node} Default=YES MaxTime=INFINITE "
        "State=UP",
    ]
    cluster.conf_path.write_text("\n".join(lines) + "\n")
    (d / "etc" / "plugstack.conf").write_text("")
    # cgroup.conf is read only by cgroup plugins, which this configuration does not load;
    # an empty one keeps any stray lookup away from /etc/slurm.
    (d / "etc" / "cgroup.conf").write_text("")
