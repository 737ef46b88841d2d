"""The daemons' lifecycle: :class:`Cluster` starts munged, slurmctld and slurmd from its own
directory and stops them, and everything they started, by pid (see the package docstring)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType

from . import procs
from .base import MARKER_ENV, PARTITION, PORT_CLASH, ClusterError, tail, which
from .client import SlurmClient
from .config import Sockets, free_ports, prepare_dirs, short_hostname, write_conf
from .install import missing_commands


class Cluster(SlurmClient):
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
        self.log_dir = self.dir / "log"
        super().__init__(self.dir / "etc" / "slurm.conf", self.log_dir / "jobcomp.txt")
        self.min_job_age = min_job_age
        self.kill_wait = kill_wait
        self.cred_expire = cred_expire
        self.startup_timeout = startup_timeout
        self.extra_conf = list(extra_conf)
        self.task_plugin = task_plugin
        self.keep_dir = keep_dir
        self.node = short_hostname()
        self.partition = PARTITION
        self._record_path = self.dir / "cluster.json"
        self._children: dict[str, subprocess.Popen[bytes]] = {}
        self._sockets: Sockets | None = None
        self.ctld_port = 0
        self.slurmd_port = 0
        self.startup_seconds = 0.0  # how long the last start() took
        self._started = False

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
        missing = missing_commands()
        if missing:
            raise ClusterError(f"Slurm commands missing: {missing}; call ensure_installed()")
        self.dir.mkdir(parents=True, exist_ok=True)
        self._stop_leftovers()
        t0 = time.monotonic()
        last: ClusterError | None = None
        for _attempt in range(3):
            self._sockets = prepare_dirs(self.dir, self.node)
            self.ctld_port, self.slurmd_port = free_ports(2)
            write_conf(self, self._sockets)
            try:
                self._start_daemons()
                self._wait_node_idle(t0 + self.startup_timeout)
            except BaseException as e:
                port_clash = PORT_CLASH in self.log_tails()
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
        if self._sockets is not None and self._sockets.short_dir is not None:
            shutil.rmtree(self._sockets.short_dir, ignore_errors=True)
        self._sockets = None
        if self._owns_dir and not self.keep_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def log_tails(self, lines: int = 20) -> str:
        """The last lines of each daemon's log, for error messages."""
        parts = []
        for path in sorted(self.log_dir.glob("*")):
            if path.is_file() and path != self.jobcomp_path:
                try:
                    text = path.read_text(errors="replace")
                except OSError:
                    continue
                parts.append(f"--- {path.name} ---\n{tail(text, lines)}")
        return "\n".join(parts)

    def status(self) -> dict[str, int | None]:
        """{daemon: pid if running else None} for this directory's daemons."""
        return self._alive_daemons()

    # -- starting ----------------------------------------------------------------------

    def _start_daemons(self) -> None:
        assert self._sockets is not None
        d, conf, munge = self.dir, str(self.conf_path), self._sockets.munge_socket
        commands = {
            "munged": [
                which("munged") or "munged",
                "--foreground",
                "--force",  # accept a tmp dir whose ancestors others cannot traverse
                f"--socket={munge}",
                f"--key-file={d / 'munge' / 'munge.key'}",
                f"--pid-file={d / 'munge' / 'munged.pid'}",
                f"--seed-file={d / 'munge' / 'munged.seed'}",
                f"--log-file={self.log_dir / 'munged.log'}",
            ],
            "slurmctld": [which("slurmctld") or "slurmctld", "-D", "-i", "-f", conf],
            "slurmd": [which("slurmd") or "slurmd", "-D", "-f", conf, "-N", self.node],
        }
        env = self.env
        env[MARKER_ENV] = str(self.dir)  # inherited by slurmstepd: found and killed on stop
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
                self._wait_for(munge.exists, "munged socket", 10.0)

    def _write_record(self) -> None:
        """``cluster.json``: what a later process (``stop`` from the CLI) needs to stop it."""
        assert self._sockets is not None
        short_dir = self._sockets.short_dir
        record = {
            "pids": {name: p.pid for name, p in self._children.items()},
            "conf": str(self.conf_path),
            "munge_socket": str(self._sockets.munge_socket),
            "short_dir": str(short_dir) if short_dir else None,
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
            command = procs.cmdline(pid)
            ok = procs.alive(pid) and name in command and str(self.dir) in command
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
                if PORT_CLASH in (self.log_dir / name).read_text(errors="replace"):
                    raise ClusterError(f"{name}: {PORT_CLASH}\n{self.log_tails()}")

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

    # -- stopping ----------------------------------------------------------------------

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
        helpers = procs.descendants([ctld], procs.parents()) if ctld else set()  # slurmscriptd
        keep = daemons | helpers
        procs.kill_strays(marker, exclude=keep)
        # Then the daemons one by one: slurmd reports the killed jobs' ends to slurmctld before
        # it exits (with slurmctld gone it would retry for MessageTimeout), and both talk to
        # munged until they exit.
        for name in ("slurmd", "slurmctld", "munged"):
            pid = alive.get(name)
            if pid:
                procs.terminate([pid], timeout)
            if name == "slurmd":
                procs.kill_strays(marker, exclude=keep)  # steps it was still starting
        procs.kill_strays(marker)  # anything left, slurmctld's helpers included
        for proc in self._children.values():
            with contextlib.suppress(Exception):
                proc.wait(timeout=1)
        self._children.clear()
        short_dir = self._read_record().get("short_dir")
        if isinstance(short_dir, str) and short_dir:
            shutil.rmtree(short_dir, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            self._record_path.unlink()
        for pid_file in (self.dir / "run").glob("*.pid"):
            pid_file.unlink(missing_ok=True)
