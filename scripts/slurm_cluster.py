"""A real one-node Slurm cluster on this machine, for tests and for trying Slurm mode by hand.

Why: batchspec's Slurm mode leans on behaviour that no double reproduces faithfully — array
tasks and their environment, ``--signal`` lead time before the time limit, ``scancel`` and
``--requeue`` semantics, output file patterns. This module runs the genuine daemons (Debian's
``slurm-wlm`` and ``munge``) so those paths can be exercised end to end, on a laptop or CI box,
without systemd and without touching the system's own Slurm configuration.

How: :class:`Cluster` owns one directory. In it, it writes ``slurm.conf`` (node = this host,
CPUs and memory read from the machine, free TCP ports, partition ``debug``), a fresh munge key,
and places every socket, pid file, log, spool and state directory. It starts ``munged``
(own key and socket), ``slurmctld`` and ``slurmd`` in the foreground as its own children, each
in a new session so a terminal's Ctrl-C does not reach them, and waits until ``sinfo`` reports
the node idle. :attr:`Cluster.env` is the environment to give Slurm clients (``sbatch``,
``squeue``, ``scancel``, ``sinfo``, ...): it carries ``SLURM_CONF``. :meth:`Cluster.stop`
cancels jobs, stops the daemons by pid (SIGTERM, then SIGKILL), then kills whatever the
daemons left behind (``slurmstepd`` and job processes, found by a marker variable in the
daemons' environment and by parentage), so nothing outlives it. It is idempotent, and a new
``start()`` in the same directory first stops whatever a crashed earlier run left there.

Slurm behaviour seen with this harness (Slurm 22.05.8, Debian 12, as root):

- ``sacct`` has no data: accounting needs slurmdbd and a database, so it is off
  (``accounting_storage/none``). Finished jobs are recorded by ``jobcomp/filetxt`` in
  ``log/jobcomp.txt`` instead, which :meth:`Cluster.wait_for_jobs` reads.
- ``squeue`` (even ``squeue -j ID``) hides finished jobs; ``squeue -t all`` shows them until
  slurmctld's purge pass drops them, a few seconds (~7 s) after they end (``MinJobAge=2``).
- Time limits and ``--signal`` lead times are checked on slurmctld's 30-second tick: a job
  is killed up to ~30 s after its limit, and ``--signal=SIG@N`` arrives once at most N+30 s
  remain, i.e. 30 to 60 s early for N=30 (with ``--time=1`` that is right after the start).
- ``--signal=B:SIG@N`` signals only the batch shell (not ``srun`` steps, nor the shell's
  children); plain ``--signal=SIG@N`` signals only ``srun`` steps, never the batch shell or
  its other children. Either way slurmstepd writes "*** JOB n ON node CANCELLED AT ... ***"
  to the job's stderr although the job goes on. Bash runs a trap only once its foreground
  child exits: wait on a background child to react at once.
- A requeued job waits ``cred_expire`` seconds (10 here, 120 by default) before it may run.
- Submission to start takes about 2 s; :meth:`Cluster.start` takes about 1 s.

Command line::

    python scripts/slurm_cluster.py start --dir /tmp/slurm   # prints export SLURM_CONF=...
    python scripts/slurm_cluster.py status --dir /tmp/slurm
    python scripts/slurm_cluster.py stop --dir /tmp/slurm
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import TracebackType

REQUIRED_COMMANDS = ("sbatch", "squeue", "scancel", "sinfo", "slurmctld", "slurmd", "munged")
PACKAGES = ("slurm-wlm", "munge")
MARKER_ENV = "BATCHSPEC_SLURM_CLUSTER"
PARTITION = "debug"
# States after which a job (or array task) will not run again by itself.
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
# Client variables a surrounding Slurm job (or a user's shell) may carry; they would steer our
# clients away from this cluster or change their defaults, so the cluster's env drops them.
_CLIENT_PREFIXES = (
    "SLURM_",
    "SBATCH_",
    "SALLOC_",
    "SRUN_",
    "SQUEUE_",
    "SINFO_",
    "SCANCEL_",
    "SACCT_",
)
_PORT_CLASH = "Address already in use"
_SUN_PATH_MAX = 100  # AF_UNIX socket paths are limited to 108 bytes; keep a margin.


class ClusterError(RuntimeError):
    """The cluster could not be started or queried."""


def _missing_commands() -> list[str]:
    return [name for name in REQUIRED_COMMANDS if _which(name) is None]


def _which(name: str) -> str | None:
    # Daemons live in /usr/sbin, which a non-login PATH may lack.
    path = os.environ.get("PATH", os.defpath) + os.pathsep + "/usr/sbin:/sbin"
    return shutil.which(name, path=path)


def ensure_installed() -> None:
    """Install Debian's ``slurm-wlm`` and ``munge`` if any Slurm or munge command is missing.

    Runs ``apt-get install`` (and ``apt-get update`` only if that first install fails). Raises
    :class:`RuntimeError` with the reason when the commands are missing and cannot be installed
    (not root, no apt-get, no package index).
    """
    missing = _missing_commands()
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
            raise RuntimeError(f"{why}; apt-get update failed:\n{_tail(update.stdout, 20)}")
        result = _run_quiet(install, env)
        if result.returncode != 0:
            raise RuntimeError(f"{why}; apt-get install failed:\n{_tail(result.stdout, 20)}")
    missing = _missing_commands()
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


def _tail(text: str, lines: int) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _free_ports(count: int) -> list[int]:
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


def _real_memory_mb() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    raise ClusterError("no MemTotal in /proc/meminfo")


def _short_hostname() -> str:
    return socket.gethostname().split(".")[0]


# --- processes ---------------------------------------------------------------------------


def _proc_state(pid: int) -> str | None:
    """The kernel's one-letter state of ``pid``, or None when it no longer exists."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # "pid (comm) S ppid ..." — comm may contain spaces and parentheses.
    return stat.rsplit(")", 1)[1].split()[0]


def _alive(pid: int) -> bool:
    state = _proc_state(pid)
    return state is not None and state not in ("Z", "X")


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _parents() -> dict[int, int]:
    """pid -> ppid for every process visible in /proc."""
    out: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            out[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return out


def _has_marker(pid: int, marker: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return marker in f.read().split(b"\0")
    except OSError:
        return False


def _descendants(roots: Iterable[int], parents: dict[int, int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    stack = list(roots)
    while stack:
        pid = stack.pop()
        for child in children.get(pid, ()):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _reap(pid: int) -> None:
    """Collect ``pid`` if it is a finished child of this process (no zombie left behind)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _wait_gone(pids: Iterable[int], timeout: float) -> set[int]:
    """Wait until none of ``pids`` is alive; return those still alive at the timeout."""
    pending = set(pids)
    deadline = time.monotonic() + timeout
    while True:
        for pid in list(pending):
            _reap(pid)
            if not _alive(pid):
                pending.discard(pid)
        if not pending or time.monotonic() >= deadline:
            return pending
        time.sleep(0.05)


def _terminate(pids: Sequence[int], timeout: float) -> None:
    """SIGTERM, wait up to ``timeout``, then SIGKILL whatever is left, and wait for it."""
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    left = _wait_gone(pids, timeout)
    for pid in left:
        _signal(pid, signal.SIGKILL)
    left = _wait_gone(left, 5.0)
    if left:
        raise ClusterError(f"processes survived SIGKILL: {sorted(left)}")


# --- the cluster -------------------------------------------------------------------------


class Cluster:
    """A one-node Slurm cluster (munged, slurmctld, slurmd) living in one directory.

    ``Cluster(directory)`` uses (and creates) ``directory``; ``Cluster()`` makes a temporary
    one and removes it on :meth:`stop` unless ``keep_dir`` is true. Use it as a context
    manager, or call :meth:`start` and :meth:`stop`. Each start begins with empty Slurm
    state (job ids restart at 1).

    Args:
        directory: where configuration, munge key and socket, logs, spool and state live.
        min_job_age: ``MinJobAge``: seconds a finished job stays in slurmctld's memory.
        kill_wait: ``KillWait``: seconds between SIGTERM and SIGKILL at a time limit or
            ``scancel`` (Slurm's default, 30, as on real clusters).
        cred_expire: ``AuthInfo=cred_expire``: also how long a requeued job waits before it
            may start again (Slurm's default is 120 s).
        startup_timeout: seconds :meth:`start` waits for the node to be idle.
        extra_conf: more ``slurm.conf`` lines, placed before the node and partition lines.
        keep_dir: keep a temporary directory (logs) after :meth:`stop`.
        task_plugin: ``TaskPlugin``: ``task/affinity`` (default) binds each task to the CPUs
            Slurm allocated it, as production clusters do, so tasks on one node do not all
            compute on the same cores; ``task/none`` leaves them unbound.

    Attributes: ``dir``, ``conf_path``, ``log_dir``, ``jobcomp_path``, ``node``,
    ``partition``, ``ctld_port``, ``slurmd_port``, ``startup_seconds``, and :attr:`env`.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        *,
        min_job_age: int = 2,
        kill_wait: int = 30,
        cred_expire: int = 10,
        startup_timeout: float = 60.0,
        extra_conf: Sequence[str] = (),
        keep_dir: bool = False,
        task_plugin: str = "task/affinity",
    ) -> None:
        self._owns_dir = directory is None
        if directory is None:
            directory = tempfile.mkdtemp(prefix="batchspec-slurm-")
            os.chmod(directory, 0o755)  # munged wants its socket's ancestors traversable
        self.dir = Path(directory).resolve()
        self.min_job_age = min_job_age
        self.kill_wait = kill_wait
        self.cred_expire = cred_expire
        self.startup_timeout = startup_timeout
        self.extra_conf = list(extra_conf)
        self.task_plugin = task_plugin
        self.keep_dir = keep_dir
        self.node = _short_hostname()
        self.partition = PARTITION
        self.conf_path = self.dir / "etc" / "slurm.conf"
        self.log_dir = self.dir / "log"
        self.jobcomp_path = self.log_dir / "jobcomp.txt"
        self._record_path = self.dir / "cluster.json"
        self._children: dict[str, subprocess.Popen[bytes]] = {}
        self._munge_socket: Path | None = None
        # Unix sockets (munged's, slurmstepd's in the spool) need short paths: a directory too
        # long for them gets a short one in /tmp for those, removed on stop.
        self._short_dir: Path | None = None
        self._spool_dir = self.dir / "spool"
        self.ctld_port = 0
        self.slurmd_port = 0
        self.startup_seconds = 0.0  # how long the last start() took
        self._started = False

    # -- public ------------------------------------------------------------------------

    @property
    def env(self) -> dict[str, str]:
        """A full environment for Slurm client commands (and the jobs they submit)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(_CLIENT_PREFIXES)}
        env["SLURM_CONF"] = str(self.conf_path)
        return env

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> Cluster:
        """Write the configuration, start the daemons, and wait until the node is idle."""
        if self._started:
            return self
        missing = _missing_commands()
        if missing:
            raise ClusterError(f"Slurm commands missing: {missing}; call ensure_installed()")
        self.dir.mkdir(parents=True, exist_ok=True)
        self._stop_leftovers()
        t0 = time.monotonic()
        last: ClusterError | None = None
        for _attempt in range(3):
            self._prepare_dirs()
            self.ctld_port, self.slurmd_port = _free_ports(2)
            self._write_conf()
            try:
                self._start_daemons()
                self._wait_node_idle(t0 + self.startup_timeout)
            except BaseException as e:
                port_clash = _PORT_CLASH in self.log_tails()
                self._stop_processes(timeout=2.0)  # slurmd would wait for a dead slurmctld
                if not (port_clash and isinstance(e, ClusterError)):
                    self.stop()  # an owned directory goes; the error carries the logs
                    raise
                last = e  # another program took a port between choosing and binding it
                continue
            self._started = True
            self.startup_seconds = time.monotonic() - t0
            return self
        self.stop()
        assert last is not None
        raise last

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel jobs, stop every daemon and what they left running. Safe to call twice."""
        if self._record_path.exists() or self._children:
            if self._alive_daemons().get("slurmctld"):
                with contextlib.suppress(Exception):
                    self.cancel_all(wait=2.0)  # give jobs their SIGTERM first
            self._stop_processes(timeout)
        self._started = False
        if self._short_dir is not None:
            shutil.rmtree(self._short_dir, ignore_errors=True)
            self._short_dir = None
        if self._owns_dir and not self.keep_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

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

    def log_tails(self, lines: int = 20) -> str:
        """The last lines of each daemon's log, for error messages."""
        parts = []
        for path in sorted(self.log_dir.glob("*")):
            if path.is_file() and path != self.jobcomp_path:
                try:
                    text = path.read_text(errors="replace")
                except OSError:
                    continue
                parts.append(f"--- {path.name} ---\n{_tail(text, lines)}")
        return "\n".join(parts)

    def status(self) -> dict[str, int | None]:
        """{daemon: pid if running else None} for this directory's daemons."""
        return self._alive_daemons()

    # -- internals ---------------------------------------------------------------------

    def _prepare_dirs(self) -> None:
        for sub in ("state", "spool", "run", "log"):
            path = self.dir / sub
            shutil.rmtree(path, ignore_errors=True)  # fresh state: no jobs from a past run
            path.mkdir(parents=True)
        (self.dir / "etc").mkdir(exist_ok=True)
        munge_dir = self.dir / "munge"
        shutil.rmtree(munge_dir, ignore_errors=True)
        munge_dir.mkdir(mode=0o755)
        os.chmod(munge_dir, 0o755)  # munged insists others may traverse its socket's dir
        socket_path = munge_dir / "munge.sock"
        self._spool_dir = self.dir / "spool"
        # slurmstepd listens on SPOOL/NODE_JOBID.STEPID; the longest such name:
        step_socket = self._spool_dir / f"{self.node}_4294967294.4294967294"
        if max(len(str(socket_path)), len(str(step_socket))) > _SUN_PATH_MAX:
            self._short_dir = Path(tempfile.mkdtemp(prefix="bs-slurm-"))
            os.chmod(self._short_dir, 0o755)
            socket_path = self._short_dir / "munge.sock"
            self._spool_dir = self._short_dir / "spool"
            self._spool_dir.mkdir()
        self._munge_socket = socket_path
        key = munge_dir / "munge.key"
        with open(key, "wb") as f:
            f.write(os.urandom(128))
        os.chmod(key, 0o400)

    def _write_conf(self) -> None:
        d = self.dir
        user = pwd.getpwuid(os.geteuid()).pw_name
        lines = [
            "# Written by batchspec scripts/slurm_cluster.py: a one-node test cluster.",
            "ClusterName=batchspec",
            f"SlurmctldHost={self.node}(127.0.0.1)",
            f"SlurmUser={user}",
            f"SlurmdUser={user}",
            f"SlurmctldPort={self.ctld_port}",
            f"SlurmdPort={self.slurmd_port}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            # cred_expire is also how long a requeued job waits before it may start again
            # (Slurm's default, 120 s, would slow requeue tests down).
            f"AuthInfo=socket={self._munge_socket},cred_expire={self.cred_expire}",
            f"StateSaveLocation={d / 'state'}",
            f"SlurmdSpoolDir={self._spool_dir}",
            f"SlurmctldPidFile={d / 'run' / 'slurmctld.pid'}",
            f"SlurmdPidFile={d / 'run' / 'slurmd.pid'}",
            f"SlurmctldLogFile={self.log_dir / 'slurmctld.log'}",
            f"SlurmdLogFile={self.log_dir / 'slurmd.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            f"PlugStackConfig={d / 'etc' / 'plugstack.conf'}",
            "ProctrackType=proctrack/linuxproc",
            f"TaskPlugin={self.task_plugin}",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/backfill",
            "SwitchType=switch/none",
            "MpiDefault=none",
            "ReturnToService=2",
            f"MinJobAge={self.min_job_age}",
            f"KillWait={self.kill_wait}",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/filetxt",
            f"JobCompLoc={self.jobcomp_path}",
            "MailProg=/bin/true",
            # Trust the CPU/memory figures below over slurmd's own topology detection, so a
            # laptop with hyperthreads is not drained for a mismatch.
            "SlurmdParameters=config_overrides",
            *self.extra_conf,
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} "
            f"RealMemory={_real_memory_mb()} State=UNKNOWN",
            f"PartitionName={self.partition} Nodes={self.node} Default=YES MaxTime=INFINITE "
            "State=UP",
        ]
        self.conf_path.write_text("\n".join(lines) + "\n")
        (d / "etc" / "plugstack.conf").write_text("")
        # cgroup.conf is read only by cgroup plugins, which this configuration does not load;
        # an empty one keeps any stray lookup away from /etc/slurm.
        (d / "etc" / "cgroup.conf").write_text("")

    def _daemon_env(self) -> dict[str, str]:
        env = self.env
        env[MARKER_ENV] = str(self.dir)  # inherited by slurmstepd: found and killed on stop
        return env

    def _start_daemons(self) -> None:
        assert self._munge_socket is not None
        d = self.dir
        conf = str(self.conf_path)
        commands = {
            "munged": [
                _which("munged") or "munged",
                "--foreground",
                "--force",  # accept a tmp dir whose ancestors others cannot traverse
                f"--socket={self._munge_socket}",
                f"--key-file={d / 'munge' / 'munge.key'}",
                f"--pid-file={d / 'munge' / 'munged.pid'}",
                f"--seed-file={d / 'munge' / 'munged.seed'}",
                f"--log-file={self.log_dir / 'munged.log'}",
            ],
            "slurmctld": [_which("slurmctld") or "slurmctld", "-D", "-i", "-f", conf],
            "slurmd": [_which("slurmd") or "slurmd", "-D", "-f", conf, "-N", self.node],
        }
        env = self._daemon_env()
        for name, cmd in commands.items():
            with open(self.log_dir / f"{name}.out", "wb") as out:  # the child keeps its copy
                proc = subprocess.Popen(
                    cmd,
                    env=env,
                    cwd=d,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # no terminal signals; survives the CLI's exit
                )
            self._children[name] = proc
            self._write_record()
            if name == "munged":
                self._wait_for(
                    lambda: self._munge_socket is not None and self._munge_socket.exists(),
                    "munged socket",
                    10.0,
                )

    def _write_record(self) -> None:
        record = {
            "pids": {name: p.pid for name, p in self._children.items()},
            "conf": str(self.conf_path),
            "munge_socket": str(self._munge_socket),
            "short_dir": str(self._short_dir) if self._short_dir else None,
            "ports": [self.ctld_port, self.slurmd_port],
        }
        self._record_path.write_text(json.dumps(record, indent=1))

    def _read_record(self) -> dict[str, object]:
        try:
            data = json.loads(self._record_path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _alive_daemons(self) -> dict[str, int | None]:
        """Daemons of this directory still running, checked by pid *and* command line."""
        pids = self._read_record().get("pids", {})
        out: dict[str, int | None] = {}
        if not isinstance(pids, dict):
            return out
        for name, pid in pids.items():
            proc = self._children.get(name)
            if proc is not None:
                proc.poll()
            ok = _alive(pid) and name in _cmdline(pid) and str(self.dir) in _cmdline(pid)
            out[name] = pid if ok else None
        return out

    def _check_children(self) -> None:
        for name, proc in self._children.items():
            if proc.poll() is not None:
                raise ClusterError(
                    f"{name} exited with {proc.returncode} during startup\n{self.log_tails()}"
                )
        for name in ("slurmctld.log", "slurmd.log"):
            # Give up on this attempt at the first sign of a taken port.
            with contextlib.suppress(OSError):
                if _PORT_CLASH in (self.log_dir / name).read_text(errors="replace"):
                    raise ClusterError(f"{name}: {_PORT_CLASH}\n{self.log_tails()}")

    def _wait_for(self, ready: Callable[[], bool], what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            self._check_children()
            if time.monotonic() >= deadline:
                raise ClusterError(f"timed out waiting for {what}\n{self.log_tails()}")
            time.sleep(0.1)

    def _wait_node_idle(self, deadline: float) -> None:
        state = ""
        while True:
            self._check_children()
            returncode, state = self._sinfo_watching_daemons()
            if returncode == 0 and state.rstrip("*") == "idle":
                return
            if time.monotonic() >= deadline:
                raise ClusterError(
                    f"node {self.node} not idle after {self.startup_timeout:.0f}s "
                    f"(sinfo: {state!r})\n{self.log_tails()}"
                )
            time.sleep(0.25)

    def _sinfo_watching_daemons(self) -> tuple[int, str]:
        """The node's state from sinfo, abandoned as soon as a daemon dies.

        sinfo retries an unreachable slurmctld for MessageTimeout (10 s); a slurmctld that
        exits at once (its port was taken) must not cost that.
        """
        cmd = ["sinfo", "-h", "-N", "-n", self.node, "-o", "%T"]
        with subprocess.Popen(
            cmd,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        ) as proc:
            try:
                while proc.poll() is None:
                    self._check_children()
                    time.sleep(0.05)
            finally:
                if proc.poll() is None:
                    proc.kill()
            assert proc.stdout is not None
            return proc.wait(), proc.stdout.read().strip()

    def _stop_leftovers(self) -> None:
        """Stop daemons a previous, unstopped run left in this directory."""
        if self._record_path.exists():
            self._stop_processes()

    def _stop_processes(self, timeout: float = 10.0) -> None:
        alive = self._alive_daemons()
        marker = f"{MARKER_ENV}={self.dir}".encode()
        daemons = {pid for pid in alive.values() if pid}
        # Jobs first, hard: slurmstepd and job processes are detached from slurmd (their parent
        # is init), so nothing else would end them, and a slurmd asked to stop while steps are
        # still being killed waits for them (KillWait) before it exits.
        ctld = alive.get("slurmctld")
        helpers = _descendants([ctld], _parents()) if ctld else set()  # slurmscriptd
        keep = daemons | helpers
        self._kill_strays(marker, exclude=keep)
        # Then the daemons one by one: slurmd reports the killed jobs' ends to slurmctld before
        # it exits (with slurmctld gone it would retry for MessageTimeout), and both talk to
        # munged until they exit.
        for name in ("slurmd", "slurmctld", "munged"):
            pid = alive.get(name)
            if pid:
                _terminate([pid], timeout)
            if name == "slurmd":
                self._kill_strays(marker, exclude=keep)  # steps it was still starting
        self._kill_strays(marker)  # anything left, slurmctld's helpers included
        for proc in self._children.values():
            with contextlib.suppress(Exception):
                proc.wait(timeout=1)
        self._children.clear()
        record = self._read_record()
        short_dir = record.get("short_dir")
        if isinstance(short_dir, str) and short_dir:
            shutil.rmtree(short_dir, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            self._record_path.unlink()
        for pid_file in (self.dir / "run").glob("*.pid"):
            pid_file.unlink(missing_ok=True)

    def _kill_strays(self, marker: bytes, exclude: set[int] | None = None) -> None:
        """SIGKILL what the daemons spawned, sweeping again in case something forked meanwhile."""
        for _ in range(5):
            strays = self._strays(marker, exclude)
            if not strays:
                return
            for pid in strays:
                _signal(pid, signal.SIGKILL)
            _wait_gone(strays, 5.0)

    def _strays(self, marker: bytes, exclude: set[int] | None = None) -> set[int]:
        """Live processes the daemons spawned (slurmstepd, job tasks) and their descendants."""
        parents = _parents()
        me = os.getpid()
        ancestors = set()
        pid = me
        while pid > 1 and pid not in ancestors:
            ancestors.add(pid)
            pid = parents.get(pid, 1)
        marked = {p for p in parents if p not in ancestors and _alive(p) and _has_marker(p, marker)}
        found = (marked | _descendants(marked, parents)) - ancestors - (exclude or set())
        # munged carries the marker too, but is stopped last, on its own.
        return {p for p in found if _alive(p) and "munged" not in _cmdline(p)}


def _job_sort_key(job: str) -> tuple[int, int]:
    head, _, task = job.partition("_")
    return (int(head) if head.isdigit() else 0, int(task) if task.isdigit() else -1)


# --- command line ------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (
        ("start", "start a cluster and leave it running"),
        ("stop", "stop the cluster in DIR"),
        ("status", "show the daemons of the cluster in DIR"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("--dir", default="/tmp/batchspec-slurm", help="cluster directory")
    start = sub.choices["start"]
    start.add_argument("--no-install", action="store_true", help="do not apt-get install")
    start.add_argument("--timeout", type=float, default=60.0, help="startup timeout (s)")
    args = parser.parse_args(argv)

    cluster = Cluster(args.dir, startup_timeout=getattr(args, "timeout", 60.0), keep_dir=True)
    if args.command == "start":
        try:
            if not args.no_install:
                ensure_installed()
            cluster.start()
        except (RuntimeError, OSError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        pids = ", ".join(f"{k} {v}" for k, v in cluster.status().items())
        print(f"# one-node Slurm cluster up in {cluster.startup_seconds:.1f}s ({pids})")
        print(f"# stop it with: python3 {sys.argv[0]} stop --dir {cluster.dir}")
        print(f"export SLURM_CONF={cluster.conf_path}")
        return 0
    if args.command == "stop":
        cluster.stop()
        print(f"stopped the cluster in {cluster.dir}")
        return 0
    status = cluster.status()
    for name, pid in status.items():
        print(f"{name}: {'running, pid ' + str(pid) if pid else 'not running'}")
    if not status:
        print(f"no cluster in {cluster.dir}")
    return 0 if status and all(status.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
