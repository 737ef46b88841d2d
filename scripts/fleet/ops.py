"""Filesystem operations counted by kind, for the fleet simulator (``sim.py``).

Every ``os`` call that costs a shared filesystem a metadata operation (open/create, stat,
readdir, link, rename, unlink, mkdir, utime, fsync) is wrapped in this process and counted
when its path lies under the output directory. ``pathlib`` and ``open`` go through these
functions, so the product's own code is counted as it runs, unchanged. What pyarrow's C++ code
opens is not seen here: the simulator counts a part's own write as the ``open`` of its temporary
(Python opens it and hands pyarrow the handle).
"""

from __future__ import annotations

import builtins
import io
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

_PATH_CALLS = {
    "open": ("open", "os.open"),
    "stat": ("os.stat", "os.lstat"),
    "readdir": ("os.scandir", "os.listdir"),
    "link": ("os.link",),
    "rename": ("os.rename", "os.replace"),
    "unlink": ("os.unlink", "os.remove", "os.rmdir"),
    "mkdir": ("os.mkdir",),
    "utime": ("os.utime",),
}


class OpCounter:
    """Counts by kind, and by second of the run (for the steady-state rate)."""

    def __init__(self, root: str, t0: float):
        self.root = os.path.realpath(root)
        self.t0 = t0
        self.kinds: Counter[str] = Counter()
        self.per_second: Counter[int] = Counter()
        self.entries = 0
        """Directory entries returned by readdir calls (what large listings cost)."""
        self._lock = threading.Lock()
        self.sites: Counter[str] | None = Counter() if os.environ.get("SIM_FLEET_SITES") else None
        """With SIM_FLEET_SITES set: counts by kind and the product's function that called."""

    def add(self, kind: str, n: int = 1) -> None:
        with self._lock:
            self.kinds[kind] += n
            self.per_second[int(time.time() - self.t0)] += n
            if self.sites is not None:
                self.sites[f"{kind} {_site()}"] += n

    def mine(self, path: Any) -> bool:
        if isinstance(path, int):
            return False
        try:
            text = os.fsdecode(os.fspath(path))
        except TypeError:
            return False
        return os.path.abspath(text).startswith(self.root)

    def install(self) -> None:
        """Wrap the calls in this process (the simulator's workers run in it)."""
        for kind, names in _PATH_CALLS.items():
            for name in names:
                module, attr = (os, name[3:]) if name.startswith("os.") else (builtins, name)
                original = getattr(module, attr)
                wrapped = self._wrap(kind, original, attr == "scandir")
                setattr(module, attr, wrapped)
                if name == "open":
                    io.open = wrapped
        fsync = os.fsync

        def counted_fsync(fd: int) -> None:
            self.add("fsync")
            fsync(fd)

        os.fsync = counted_fsync

    def _wrap(self, kind: str, original: Callable, scandir: bool) -> Callable:
        counter = self

        def call(path: Any = ".", *args: Any, **kwargs: Any) -> Any:
            if not counter.mine(path):
                return original(path, *args, **kwargs)
            counter.add(kind)
            result = original(path, *args, **kwargs)
            if scandir:
                return _CountedScan(result, counter)
            if isinstance(result, list):
                with counter._lock:
                    counter.entries += len(result)
            return result

        return call


def _site() -> str:
    """The innermost caller in batchspec (or the simulator's worker)."""
    frame = sys._getframe(3)
    while frame is not None:
        name = frame.f_code.co_filename
        if "/batchspec/" in name or name.endswith("fleet/worker.py"):
            return f"{Path(name).stem}.{frame.f_code.co_name}"
        frame = frame.f_back
    return "?"


class _CountedScan:
    """A scandir iterator that counts the entries it returns."""

    def __init__(self, inner: Any, counter: OpCounter):
        self.inner = inner
        self.counter = counter

    def __iter__(self) -> _CountedScan:
        return self

    def __next__(self) -> Any:
        entry = next(self.inner)
        with self.counter._lock:
            self.counter.entries += 1
        return entry

    def __enter__(self) -> _CountedScan:
        return self

    def __exit__(self, *exc: object) -> None:
        self.inner.close()

    def close(self) -> None:
        self.inner.close()
