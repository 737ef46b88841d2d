"""Temporaries and locks in the output directory: written whole, then renamed; cleaned once dead.

Everything a worker writes for others to read (parts, the manifest, staged inputs) is written
under a dot-named temporary beside its final name first (``temp_name``: the writer's host and
pid are in the name, so that one left behind by a kill can be told from one still in use) and
renamed into place. A worker killed with -9 leaves its temporaries behind; they are removed
by the next run on the same host, once their writer is provably gone (its pid dead): a live
writer's temporary is never touched, however long it pauses.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import re
import shutil
import socket
import time
import uuid
from pathlib import Path

from batchspec.errors import UserError
from batchspec.io.layout import OutDir

TEMP_SUFFIX = ".tmp"
"""How a temporary's name ends (it starts with a dot: readers listing a folder skip it)."""


def host_tag() -> str:
    """This host's name as it appears in temporary names (no dots: names split on them)."""
    return re.sub(r"[^A-Za-z0-9-]+", "-", socket.gethostname()) or "host"


def temp_name(final: Path) -> Path:
    """A fresh temporary beside ``final``: ``.<name>.<host>.<pid>.<random>.tmp``."""
    token = f"{host_tag()}.{os.getpid()}.{uuid.uuid4().hex[:12]}"
    return final.parent / f".{final.name}.{token}{TEMP_SUFFIX}"


def temp_owner(path: Path) -> tuple[str, int] | None:
    """(host, pid) of the process that made a temporary named by ``temp_name``."""
    if not (path.name.startswith(".") and path.name.endswith(TEMP_SUFFIX)):
        return None
    parts = path.name[: -len(TEMP_SUFFIX)].rsplit(".", 3)
    if len(parts) != 4 or not parts[2].isdigit():
        return None
    return parts[1], int(parts[2])


def on_this_host(host: str) -> bool:
    """Whether a host named in a temporary (or a lock) is this one: only there can its
    writer's pid be checked."""
    return host == host_tag()


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


_NO_HARD_LINKS = (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP)
"""What ``link`` fails with on a filesystem without hard links (some FUSE and object-store
mounts)."""
_RENAME_NOREPLACE = 1
_AT_FDCWD = -100


def link_new(src: Path, dst: Path) -> bool:
    """Put ``src`` at ``dst`` unless ``dst`` exists, atomically: the first of any number of
    committers, on any host, wins. A hard link, or where the filesystem has none,
    ``renameat2(RENAME_NOREPLACE)`` (Linux 3.15+, glibc 2.28+; ext4, xfs, btrfs, tmpfs...);
    False when ``dst`` existed. A filesystem with neither cannot commit safely: OSError."""
    try:
        os.link(src, dst)
        return True
    except FileExistsError:
        return False
    except OSError as exc:
        if exc.errno not in _NO_HARD_LINKS:
            raise
    libc = ctypes.CDLL(None, use_errno=True)
    rename2 = getattr(libc, "renameat2", None)
    if rename2 is None:
        raise OSError(errno.ENOTSUP, "no hard links, and no renameat2 in this C library")
    if rename2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE) == 0:
        return True
    err = ctypes.get_errno()
    if err == errno.EEXIST:
        return False
    raise OSError(err, f"no hard links, and no atomic rename without replace: {os.strerror(err)}")


def check_commits(folder: Path) -> None:
    """Refuse, before any work, an output directory where ``link_new`` cannot commit (two
    committers of one unit could both "win" there): one line, exit 2."""
    probe = folder / f".commit-probe.{host_tag()}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    target = probe.with_name(probe.name + ".linked")
    try:
        probe.write_bytes(b"")
        link_new(probe, target)
    except OSError as exc:
        raise UserError(
            f"{folder}: this filesystem cannot commit parts atomically ({exc.strerror or exc}); "
            "write the output to a filesystem with hard links (local disks, NFS, Lustre, GPFS)"
        ) from None
    finally:
        for path in (probe, target):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


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


def is_abandoned(path: Path) -> bool:
    """A temporary whose writer died on this host. One of another host is left alone, however
    old it looks: only that host can tell whether its writer still runs (a clock of ours
    against the file server's cannot), and a dot-named temporary is never read; it goes
    when a run on its own host finds its writer gone."""
    owner = temp_owner(path)
    if owner is None:
        return False
    host, pid = owner
    return on_this_host(host) and not pid_alive(pid)


def clean_stale_temps(out: OutDir) -> int:
    """Remove temporaries left by dead writers (see ``is_abandoned``); returns how many."""
    removed = 0
    for folder in out.temp_dirs():
        if not folder.is_dir():
            continue
        for path in folder.iterdir():
            if not is_abandoned(path):
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
    on this host, or once the lock has not changed (its holder refreshes it) for ``stale_s``
    of the taker's own clock: no two hosts' clocks are compared (``work.heartbeat``).

    Used where a lock only saves duplicate work or serializes a check-then-act; the rare race
    of two takers of one stale lock is harmless wherever it is used.
    """

    def __init__(self, path: Path, stale_s: float):
        self.path = path
        self.stale_s = stale_s
        self._payload = json.dumps({"host": host_tag(), "pid": os.getpid()}).encode()
        self._seen: tuple[object, float] | None = None
        """The lock's version when first seen as it is, and when (``time.monotonic``)."""

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
        if not create_exclusive(self.path, self._payload):
            return False
        self._seen = None
        return True

    def _stale(self) -> bool:
        try:
            st = self.path.stat()
            holder = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            return True
        except ValueError:
            holder = None  # being written right now, or torn by a crash: judged by silence
        here = isinstance(holder, dict) and on_this_host(str(holder.get("host")))
        if here and not pid_alive(int(holder.get("pid", -1))):
            return True
        seen, now = (st.st_ino, st.st_mtime_ns, st.st_size), time.monotonic()
        if self._seen is None or self._seen[0] != seen:
            self._seen = (seen, now)
        return now - self._seen[1] > self.stale_s

    def refresh(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.utime(self.path)

    def release(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
