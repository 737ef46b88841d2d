"""Filesystem operations counted by kind, for the fleet simulator (``sim.py``).

Every ``os`` call that costs a shared filesystem a metadata operation (open/create, stat,
readdir, link, rename, unlink, mkdir, utime, fsync) is wrapped in this process and counted when
its path lies under the output directory; ``pathlib`` and ``open`` go through these functions,
so the product's own code is counted unchanged. What pyarrow's C++ code opens is not seen: a
part's write counts as the ``open`` of its temporary (Python opens it for pyarrow).
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

CALLS = {
    "open": (builtins, ["open"]),
    "os.open": (os, ["open"]),
    "stat": (os, ["stat", "lstat"]),
    "readdir": (os, ["scandir", "listdir"]),
    "link": (os, ["link"]),
    "rename": (os, ["rename", "replace"]),
    "unlink": (os, ["unlink", "remove", "rmdir"]),
    "mkdir": (os, ["mkdir"]),
    "utime": (os, ["utime"]),
}


class OpCounter:
    """Counts by kind and by second of the run (for the steady rate), directory entries
    listed, and with SIM_FLEET_SITES set, by kind and the product's function that called."""

    def __init__(self, root: str, t0: float):
        self.root, self.t0 = os.path.realpath(root), t0
        self.kinds: Counter[str] = Counter()
        self.per_second: Counter[int] = Counter()
        self.sites: Counter[str] = Counter()
        self.entries = 0
        self._by_site = bool(os.environ.get("SIM_FLEET_SITES"))
        self._lock = threading.Lock()

    def add(self, kind: str) -> None:
        with self._lock:
            self.kinds[kind] += 1
            self.per_second[int(time.time() - self.t0)] += 1
            if self._by_site:
                self.sites[f"{kind} {_site()}"] += 1

    def mine(self, path: Any) -> bool:
        if isinstance(path, int):
            return False
        try:
            return os.path.abspath(os.fsdecode(os.fspath(path))).startswith(self.root)
        except TypeError:
            return False

    def install(self) -> None:
        """Wrap the calls in this process (the simulator's workers run in it)."""
        for kind, (module, names) in CALLS.items():
            for name in names:
                wrapped = self._wrap(kind.removeprefix("os."), getattr(module, name))
                setattr(module, name, wrapped)
                if module is builtins:
                    io.open = wrapped
        fsync = os.fsync

        def counted_fsync(fd: int) -> None:
            self.add("fsync")
            fsync(fd)

        os.fsync = counted_fsync

    def _wrap(self, kind: str, original: Callable) -> Callable:
        def call(path: Any = ".", *args: Any, **kwargs: Any) -> Any:
            if not self.mine(path):
                return original(path, *args, **kwargs)
            self.add(kind)  # before the call: a failed create or stat costs a round trip too
            result = original(path, *args, **kwargs)
            if original is _SCANDIR:  # read at once, its entries counted as a listing's
                with result:
                    result = _Listing(result)
            if isinstance(result, list):
                with self._lock:
                    self.entries += len(result)
            return result

        return call


_SCANDIR = os.scandir


def _site() -> str:
    """The innermost caller in batchspec (or the simulator's worker)."""
    frame = sys._getframe(3)
    while frame is not None:
        name = frame.f_code.co_filename
        if "/batchspec/" in name or name.endswith("fleet/worker.py"):
            return f"{Path(name).stem}.{frame.f_code.co_name}"
        frame = frame.f_back
    return "?"


class _Listing(list):
    """A scandir listing read at once, iterable and closable as scandir's iterator is (pathlib
    and glob read every entry of theirs anyway)."""

    def __enter__(self) -> _Listing:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        pass
