"""Measurements shared between a run's workers: the per-unit stats.

Every worker appends one observation per committed unit to ``stats/<worker>.jsonl`` and reads
the others' new lines, so every K controller of a run learns from every unit. (What ``batchspec
tune`` measured before the run comes from the tuning file: ``tuning``.)

Reading every worker's file costs a shared filesystem one open per file, so with many workers
it is paced (``pace_s``, ``read_paced``): at most one file per ``FILE_S`` seconds on average,
however many workers write, from the start of a run on. At 1,000 workers a worker learns the
others' units up to a few hours late, which a K controller that also learns from its own units
can afford; a handful of workers share them within seconds. Files of workers that ended long
ago are read once more at most (``FINISHED_S``), so requeued workers' files do not pile up in
every read.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

from batchspec.io.layout import OutDir
from batchspec.speculation.estimator import Observation

FILE_S = 20.0
"""Seconds of pacing per file read beyond the first: the others' files are read every
``FILE_S`` × (files − 1) seconds, if that is longer than the reader's own period."""
FINISHED_S = 3600.0
"""A file unchanged for this long (its worker ended or died) is not read again."""
FIRST_FILES = 8
"""Files a paced read may open however recent the last one (``read_paced``)."""


class SharedStats:
    """Observations shared through ``OUT/stats/<worker>.jsonl`` (append-only, one per unit)."""

    def __init__(self, out: OutDir, worker: str):
        self.dir = out.stats
        self.path = out.stats_file(worker)
        self._offsets: dict[Path, int] = {}
        self._files = 0
        """Other workers' files at the last read."""
        self._finished: set[str] = set()
        """Files unchanged for ``FINISHED_S`` at a read: skipped from then on."""
        self._grown: dict[str, tuple[int, float]] = {}
        """Per file: its size, and since when (our monotonic clock) it has had it; a file's
        mtime against our clock would compare two hosts' clocks."""
        self._made = False
        self._paced_at = time.monotonic()
        self._cursor = ""
        """The last file a paced read opened: the next one goes on after it."""

    def pace_s(self, period_s: float) -> float:
        """Seconds between reads: ``period_s``, or ``FILE_S`` per file beyond the first."""
        return max(period_s, FILE_S * (self._files - 1))

    def append(self, ob: Observation) -> None:
        if not self._made:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._made = True
        with open(self.path, "a") as fh:
            fh.write(json.dumps(asdict(ob)) + "\n")
            # Our own lines are added to the controller directly: skip them when reading.
            self._offsets[self.path] = fh.tell()

    def read_paced(self) -> list[Observation]:
        """``read_new`` for a K controller: at most one file per ``FILE_S`` since the last
        paced read (``FIRST_FILES`` at least), taken in turn. A fleet's workers find the
        others' files all at once, after their first commits: 1,000 workers each opening
        1,000 files then is 10^6 opens in minutes, where paced they open one per 20 s each."""
        now = time.monotonic()
        budget = max(FIRST_FILES, int((now - self._paced_at) / FILE_S) + 1)
        self._paced_at = now
        return self.read_new(budget)

    def read_new(self, max_files: int | None = None) -> list[Observation]:
        """Observations appended by any worker since the last call (whole lines only); with
        ``max_files``, from that many files at most, in turn (the rest are read later)."""
        found: list[Observation] = []
        try:
            names = sorted(n for n in os.listdir(self.dir) if n.endswith(".jsonl"))
        except FileNotFoundError:
            return found
        self._files = len(names) - (self.path.name in names)
        names = [n for n in names if n not in self._finished]
        if max_files is not None:
            # Our own lines went to the controller as we wrote them: once we wrote, skip ours.
            names = [n for n in names if n != self.path.name or self.path not in self._offsets]
            turn = [n for n in names if n > self._cursor] + [n for n in names if n <= self._cursor]
            names = turn[:max_files]
            self._cursor = names[-1] if names else self._cursor
        for name in names:
            path = self.dir / name
            start = self._offsets.get(path, 0)
            with open(path, "rb") as fh:
                fh.seek(start)
                data = fh.read()
            size, since = self._grown.get(name, (-1, time.monotonic()))
            if size != start + len(data):
                self._grown[name] = (start + len(data), time.monotonic())
            elif time.monotonic() - since > FINISHED_S:
                self._finished.add(name)
            end = data.rfind(b"\n") + 1
            for line in data[:end].splitlines():
                if line.strip():
                    found += _observation(line, path)
            self._offsets[path] = start + end
        return found


def _observation(line: bytes, path: Path) -> list[Observation]:
    """One line's observation; none for a damaged line (a torn write, a stray edit), which
    costs the K controller one measurement, never a worker or a ``status``."""
    try:
        return [Observation(**json.loads(line))]
    except (ValueError, TypeError) as exc:
        print(f"batchspec: {path}: a damaged line skipped ({exc})", file=sys.stderr)
        return []
