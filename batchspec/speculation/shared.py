"""Measurements shared between a run's workers: the per-unit stats.

Every worker appends one observation per committed unit to ``stats/<worker>.jsonl`` and reads
the others' new lines, so every K controller of a run learns from every unit. (What ``batchspec
tune`` measured before the run comes from the tuning file: ``tuning``.)
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from batchspec.io.layout import OutDir
from batchspec.speculation.estimator import Observation


class SharedStats:
    """Observations shared through ``OUT/stats/<worker>.jsonl`` (append-only, one per unit)."""

    def __init__(self, out: OutDir, worker: str):
        self.dir = out.stats
        self.path = out.stats_file(worker)
        self._offsets: dict[Path, int] = {}

    def append(self, ob: Observation) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as fh:
            fh.write(json.dumps(asdict(ob)) + "\n")
        # Our own lines are added to the controller directly: skip them when reading.
        self._offsets[self.path] = self.path.stat().st_size

    def read_new(self) -> list[Observation]:
        """Observations appended by any worker since the last call (whole lines only)."""
        found: list[Observation] = []
        if not self.dir.is_dir():
            return found
        for path in sorted(self.dir.glob("*.jsonl")):
            start = self._offsets.get(path, 0)
            with open(path, "rb") as fh:
                fh.seek(start)
                data = fh.read()
            end = data.rfind(b"\n") + 1
            for line in data[:end].splitlines():
                if line.strip():
                    found.append(Observation(**json.loads(line)))
            self._offsets[path] = start + end
        return found
