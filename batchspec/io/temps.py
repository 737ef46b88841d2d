"""Temporaries and locks in the output directory: written whole, then renamed; cleaned once dead.

Everything a worker writes for others to read (parts, the manifest, staged inputs) is written
under a temporary name first (``layout.temp_name``: the writer's host and pid are in the name)
and renamed into place. A worker killed with -9 leaves its temporaries behind; they are removed
by the next run, but only when their writer is provably gone (same host, pid dead) or they have
not changed for longer than a lease timeout: a live writer's temporary is never touched.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from pathlib import Path

from batchspec.io.layout import OutDir, host_tag, on_this_host, temp_owner


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists here (one we may not signal still exists)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def fsync_dir(path: Path) -> None:
    """Make a rename or link in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def create_exclusive(path: Path, payload: bytes) -> bool:
    """Create ``path`` holding ``payload`` unless it exists (O_EXCL: one creator wins, also
    across hosts on NFSv3+); False when it existed."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    try:
        os.write(fd, payload)
    finally:
        os.close(fd)
    return True


def move_file(src: Path, dst: Path) -> bool:
    """Rename ``src`` to ``dst``, making ``dst``'s directory only if it is missing (no mkdir
    per move: on a shared filesystem each is a metadata operation); False if ``src`` is gone."""
    for _ in range(2):
        try:
            os.replace(src, dst)
            return True
        except FileNotFoundError:
            if not src.exists():
                return False
            dst.parent.mkdir(parents=True, exist_ok=True)
    return False


def is_abandoned(path: Path, max_age_s: float) -> bool:
    """A temporary whose writer died on this host, or that nobody touched for ``max_age_s``."""
    owner = temp_owner(path)
    if owner is None:
        return False
    host, pid = owner
    if on_this_host(host) and not pid_alive(pid):
        return True
    try:
        return time.time() - path.stat().st_mtime > max_age_s
    except FileNotFoundError:
        return False


def clean_stale_temps(out: OutDir, max_age_s: float) -> int:
    """Remove temporaries left by dead writers (see ``is_abandoned``); returns how many."""
    removed = 0
    for folder in out.temp_dirs():
        if not folder.is_dir():
            continue
        for path in folder.iterdir():
            if not is_abandoned(path, max_age_s):
                continue
            with contextlib.suppress(FileNotFoundError):
                if path.is_dir():
                    shutil.rmtree(path)
                else:
                    path.unlink()
                removed += 1
    return removed


class FileLock:
    """A lock file created with O_EXCL, naming its holder; taken over once its holder is dead
    on this host or stopped refreshing it for ``stale_s``.

    Used where a lock only saves duplicate work or serializes a check-then-act; the rare race
    of two takers of one stale lock is harmless wherever it is used.
    """

    def __init__(self, path: Path, stale_s: float):
        self.path = path
        self.stale_s = stale_s
        self._payload = json.dumps({"host": host_tag(), "pid": os.getpid()}).encode()

    def try_acquire(self) -> bool:
        """Take the lock if it is free or its holder is gone; False while someone holds it."""
        if self._create():
            return True
        if not self._stale():
            return False
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        return self._create()

    def _create(self) -> bool:
        return create_exclusive(self.path, self._payload)

    def _stale(self) -> bool:
        try:
            age = time.time() - self.path.stat().st_mtime
            holder = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            return True
        except ValueError:
            holder = None  # being written right now, or torn by a crash: judged by age
        if age > self.stale_s:
            return True
        if isinstance(holder, dict) and on_this_host(str(holder.get("host"))):
            return not pid_alive(int(holder.get("pid", -1)))
        return False

    def refresh(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.utime(self.path)

    def release(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
