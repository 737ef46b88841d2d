"""The output directory's layout: one object names every path in it.

Workers on many nodes share nothing but this directory, so its layout is the protocol between
them, and between them and ``status``, ``report`` and later runs. Every module asks ``OutDir``
for a path rather than joining names of its own::

    OUT/
      manifest.json   spec hash, input fingerprint, limit, units: binds the directory to one run
      parts/          one Parquet file per committed work unit (<unit_id>.parquet)
      leases/         claims of units in flight (<unit_id>.lease), each worker's progress
      progress/       one progress record per worker invocation (<worker>.json): counters and
                      recent samples, kept after it ends (live progress, status)
      job.json        the job spec of the latest run (export's dataset card, input order)
      failed/         units given up after repeated engine failures (<unit_id>.json)
      history/        earlier versions of parts replaced by --retry-errors
      runs/           one JSON log per worker invocation, and its engines' output
                      (<worker>.log: vLLM's and the libraries' logs, warnings)
      stats/          per-unit measurements shared by the workers' K controllers (<worker>.jsonl)
      tuning.json     batchspec tune's measurements
      slurm/          sbatch scripts, submitted job ids (jobs.jsonl), one log per array task
      staged/         input files with large row groups, copied once into one row group per
                      unit (<stem>-<key>/s<first row>.parquet) so a unit read costs its rows

Files being written are dot-named temporaries beside their final name (``temp_name``), carrying
the writer's host and pid, so that one left behind by a kill can be told from one still in use.
"""

from __future__ import annotations

import os
import re
import socket
import uuid
from pathlib import Path

PART_SUFFIX = ".parquet"
LEASE_SUFFIX = ".lease"
TEMP_SUFFIX = ".tmp"


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
    return host == host_tag()


class OutDir:
    """An output directory: the paths in it, and what is committed there.

    A unit is done exactly when ``parts/<unit_id>.parquet`` exists (parts are linked into place
    whole), so ``committed_units`` is the one answer to "what is done" for every reader.
    """

    def __init__(self, root: Path | str):
        self.root = Path(root)
        self._part_rows: dict[str, int] = {}
        """Row counts of parts already read, by file name (a part's row count never changes)."""

    def __repr__(self) -> str:
        return f"OutDir({str(self.root)!r})"

    def __str__(self) -> str:
        return str(self.root)

    # -- paths --------------------------------------------------------------------------------

    @property
    def manifest(self) -> Path:
        return self.root / "manifest.json"

    @property
    def parts(self) -> Path:
        return self.root / "parts"

    def part(self, unit_id: str) -> Path:
        return self.parts / f"{unit_id}{PART_SUFFIX}"

    def commit_lock(self, unit_id: str) -> Path:
        """Serializes commits of a unit where the filesystem has no hard links."""
        return self.parts / f".{unit_id}{PART_SUFFIX}.commit"

    @property
    def leases(self) -> Path:
        return self.root / "leases"

    def lease(self, unit_id: str) -> Path:
        return self.leases / f"{unit_id}{LEASE_SUFFIX}"

    def progress(self, worker: str) -> Path:
        """A worker's progress record: rows finished per unit it holds, rewritten per beat."""
        return self.leases / f"{worker}.progress.json"

    def progress_files(self) -> list[Path]:
        return sorted(self.leases.glob("*.progress.json")) if self.leases.is_dir() else []

    @property
    def progress_dir(self) -> Path:
        return self.root / "progress"

    def progress_record(self, worker: str) -> Path:
        """A worker invocation's progress record (``work.progress``), kept after it ends."""
        return self.progress_dir / f"{worker}.json"

    def progress_records(self) -> list[Path]:
        if not self.progress_dir.is_dir():
            return []
        return sorted(p for p in self.progress_dir.glob("*.json") if not p.name.startswith("."))

    @property
    def job_record(self) -> Path:
        """The job spec the latest run used, with its input files (``batchspec export``)."""
        return self.root / "job.json"

    @property
    def failed(self) -> Path:
        return self.root / "failed"

    def failure(self, unit_id: str) -> Path:
        return self.failed / f"{unit_id}.json"

    @property
    def history(self) -> Path:
        return self.root / "history"

    @property
    def runs(self) -> Path:
        return self.root / "runs"

    def engine_log(self, worker: str) -> Path:
        """What a worker's engines printed (``engines.quiet``): kept off the terminal."""
        return self.runs / f"{worker}.log"

    @property
    def stats(self) -> Path:
        return self.root / "stats"

    def stats_file(self, worker: str) -> Path:
        return self.stats / f"{worker}.jsonl"

    @property
    def tuning(self) -> Path:
        return self.root / "tuning.json"

    @property
    def slurm(self) -> Path:
        return self.root / "slurm"

    @property
    def slurm_jobs(self) -> Path:
        return self.slurm / "jobs.jsonl"

    @property
    def staged(self) -> Path:
        return self.root / "staged"

    def staged_copy(self, name: str) -> Path:
        """A staged input file: a directory of shards, complete once it exists."""
        return self.staged / name

    def staging_lock(self, name: str) -> Path:
        return self.staged / f"{name}.lock"

    def temp_dirs(self) -> list[Path]:
        """Where writers leave temporaries: the root (manifest), parts/ and staged/."""
        return [self.root, self.parts, self.staged]

    # -- what is committed --------------------------------------------------------------------

    def part_files(self) -> list[Path]:
        """Committed parts, sorted by unit id (temporary files are dot-named and left out)."""
        if not self.parts.is_dir():
            return []
        return sorted(p for p in self.parts.glob(f"*{PART_SUFFIX}") if not p.name.startswith("."))

    def committed_units(self) -> set[str]:
        """Unit ids whose part is in place under its final name."""
        return {p.name[: -len(PART_SUFFIX)] for p in self.part_files()}

    def is_committed(self, unit_id: str) -> bool:
        return self.part(unit_id).exists()

    def rows_committed(self) -> int:
        """Rows in committed parts, from their footers; each part's footer is read once."""
        import pyarrow.parquet as pq

        for path in self.part_files():
            if path.name not in self._part_rows:
                try:
                    self._part_rows[path.name] = pq.ParquetFile(path).metadata.num_rows
                except OSError:
                    continue  # removed or replaced under us: counted next time
        return sum(self._part_rows.values())
