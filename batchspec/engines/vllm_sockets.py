"""vLLM's IPC sockets in a folder of the worker's own, removed when the worker is gone.

vLLM's processes talk over ZeroMQ sockets it names ``<VLLM_RPC_BASE_PATH>/<uuid>`` (the
system's temporary folder by default), five to seven per engine start, and it removes none of
them: a day of this project's tests left ~3,000 in ``/tmp``, and a node that runs Slurm tasks
for weeks, each restarting engines after crashes and K changes, would gather many more.

So each worker process points vLLM at ``<tmp>/batchspec-ipc-<host>-<pid>`` (``use``; the host as
a hash, since a socket's path may not exceed 107 bytes) before its first engine, and removes
that folder when it exits; the file vLLM's workers meet in to set up torch.distributed
(``file_store_init_method``: one per engine start, never removed either, 165 in ``/tmp`` after a
day of tests) goes there too. The name holds for the process's whole life, because vLLM's engine
core, when it runs in this process, caches its environment after the first start. A worker
killed with -9 cannot remove its folder: the next worker on the same host removes every such
folder whose process is gone (``sweep``). A user's own ``VLLM_RPC_BASE_PATH`` stands, and is
never cleaned; so does vLLM's default where the temporary folder's path is so long that a
socket's path in a folder of ours would not fit.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import tempfile
import uuid
import zlib
from pathlib import Path

from batchspec.io.temps import pid_alive

ENV = "VLLM_RPC_BASE_PATH"
PREFIX = "batchspec-ipc-"
"""Folders this module made start with this, then ``<host>-<pid>``."""
SOCKET_PATH_MAX = 107
"""The longest path a Unix socket may have (``sockaddr_un.sun_path``, less its NUL)."""
NAME_LEN = 36
"""The length of vLLM's socket names in the folder (a UUID)."""

_made: tuple[int, Path] | None = None
"""(pid, folder) of the folder this process made: a forked child makes its own."""


def _host() -> str:
    """This host, short: a hash of its name (a cluster's host names run to 30 characters)."""
    return f"{zlib.crc32(socket.gethostname().encode()):08x}"


def folder(pid: int) -> Path:
    """The socket folder of worker ``pid`` on this host."""
    return Path(tempfile.gettempdir()) / f"{PREFIX}{_host()}-{pid}"


def use() -> None:
    """Point this process's vLLM engines at a socket folder of its own (once per process;
    none where the user chose one), and remove left-behind folders of dead workers."""
    global _made
    pid = os.getpid()
    if (_made is not None and _made[0] == pid) or (ENV in os.environ and _theirs()):
        return
    sweep()
    path = folder(pid)
    if len(os.fsencode(path)) + 1 + NAME_LEN > SOCKET_PATH_MAX:
        return
    path.mkdir(mode=0o700, exist_ok=True)
    os.environ[ENV] = str(path)
    _made = (pid, path)
    atexit.register(_remove, pid, path)


def file_store_init_method() -> str:
    """vLLM's ``get_file_store_init_method`` (patched into its executors by ``vllm_fixes``):
    the rendezvous file in this worker's folder where it has one, else, as vLLM has it, in
    the temporary folder."""
    base = os.environ.get(ENV)
    if base is None or _theirs():
        base = tempfile.gettempdir()
    return f"file://{base}/vllm_dist_{uuid.uuid4().hex}"


def _remove(pid: int, path: Path) -> None:
    """At exit, by the process that made it (a forked child inherits the exit hook)."""
    if os.getpid() == pid:
        shutil.rmtree(path, ignore_errors=True)


def _theirs() -> bool:
    """Whether ``VLLM_RPC_BASE_PATH`` was set by someone other than this module (a child
    worker inherits its parent's folder in its environment, and makes its own)."""
    given = Path(os.environ[ENV])
    return not given.name.startswith(f"{PREFIX}{_host()}-")


def sweep() -> list[Path]:
    """Remove the socket folders of this host's workers that are gone; the ones removed.
    A folder whose pid is alive is left, whoever runs under that pid now."""
    removed = []
    tag = f"{PREFIX}{_host()}-"
    for path in Path(tempfile.gettempdir()).glob(f"{tag}*"):
        pid = path.name[len(tag) :]
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed
