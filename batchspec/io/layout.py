"""The output directory's layout: one object names every path in it.

Workers on many nodes share nothing but this directory, so its layout is the protocol between
them, and between them and ``status``, ``report`` and later runs. Every module asks ``OutDir``
for a path rather than joining names of its own::

    OUT/
      manifest.json   spec hash, input fingerprint, limit, units: binds the directory to one run
      parts/          one Parquet file per committed work unit (<unit_id>.parquet)
      leases/         claims of units in flight (<unit_id>.lease), each worker's progress
      failed/         units given up after repeated engine failures (<unit_id>.json)
      history/        earlier versions of parts replaced by --retry-errors
      runs/           one JSON log per worker invocation
      stats/          per-unit measurements shared by the workers' K controllers (<worker>.jsonl)
      tuning.json     batchspec tune's measurements
      slurm/          sbatch scripts, submitted job ids (jobs.jsonl), one log per array task
"""

from __future__ import annotations

from pathlib import Path

PART_SUFFIX = ".parquet"
LEASE_SUFFIX = ".lease"


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
