"""Whether a run is complete: what its output directory holds against its plan, as an exit code.

The exit code of ``run``, of each worker and Slurm task, and of ``status --require-complete``
is this verdict, read from the output directory after the work: 0 only when every unit of the
plan is committed and no committed row is an error row. A worker that leaves while others
still hold units says so (``INCOMPLETE``) instead of claiming success for them, so that a
pipeline chained on "exit 0" never starts on a partial dataset.

It costs one listing of each directory of parts, of ``failed/`` and of ``leases/``, and, only
once every unit is committed, one Parquet footer per part (the error column's null count:
no row is read).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import IntEnum

from batchspec.errors import UserError
from batchspec.io.layout import LEASE_SUFFIX, OutDir, unit_ids_in
from batchspec.io.manifest import read_manifest


class Exit(IntEnum):
    """The documented exit codes of every command that runs or checks a job (README)."""

    DONE = 0
    """Every unit of the plan is committed, no error rows (or nothing was left to do)."""
    ERROR = 1
    """Anything else: a bug, an engine that could not start, a worker that lost its heartbeat."""
    BAD_INPUT = 2
    """Bad input, refused before anything was written (one line names the field or file)."""
    UNITS_FAILED = 3
    """Some units failed repeatedly (``OUT/failed``); a rerun retries them."""
    ROWS_FAILED = 4
    """Every unit is committed, but some rows are error rows; ``run --retry-errors`` retries."""
    INCOMPLETE = 5
    """Units are still missing: held by other workers (still running, or dead and not yet
    taken over), or nobody's (a stop, a crash). Wait for the others, or run again."""


@dataclass(frozen=True)
class Completion:
    """What an output directory holds against its plan (the manifest's ``num_units``)."""

    units_total: int
    units_committed: int
    units_failed: int
    """Units with a failure record and no part."""
    units_held: int
    """Uncommitted units with a lease (a live holder, or a dead one not yet taken over)."""
    error_rows: int
    """Error rows in committed parts (counted only once every unit is committed)."""

    @property
    def units_missing(self) -> int:
        """Uncommitted units nobody holds and no failure record names."""
        left = self.units_total - self.units_committed - self.units_failed - self.units_held
        return max(left, 0)

    @property
    def exit_code(self) -> Exit:
        if self.units_failed:
            return Exit.UNITS_FAILED
        if self.units_committed < self.units_total:
            return Exit.INCOMPLETE
        return Exit.ROWS_FAILED if self.error_rows else Exit.DONE

    def line(self) -> str:
        """The verdict in one line, for the end of a run and for ``status``."""
        code = self.exit_code
        done = f"{self.units_committed}/{self.units_total} units committed"
        if code is Exit.DONE:
            return f"complete: {done}, no error rows"
        if code is Exit.ROWS_FAILED:
            return (
                f"complete with {self.error_rows} error rows: {done} "
                f"(exit {int(code)}; `run --retry-errors` generates them again)"
            )
        what = [f"{self.units_held} held by workers", f"{self.units_missing} not started"]
        if self.units_failed:
            what.insert(0, f"{self.units_failed} failed")
        return f"incomplete: {done}; {', '.join(what)} (exit {int(code)})"


def completion(out: OutDir) -> Completion:
    """The verdict on ``out`` now; a directory no run has bound is refused (``UserError``)."""
    manifest = read_manifest(out)
    if manifest is None:
        raise UserError(f"{out}: no run has bound this directory (no manifest.json)")
    committed = out.committed_units()
    failed = unit_ids_in(out.failed, ".json") - committed
    held = unit_ids_in(out.leases, LEASE_SUFFIX) - committed - failed
    errors = 0
    if len(committed) >= manifest.num_units and not failed:
        errors = sum(_error_rows(p) for p in out.part_files())
    return Completion(manifest.num_units, len(committed), len(failed), len(held), errors)


def _error_rows(path: os.PathLike[str]) -> int:
    """Error rows in one part, from its footer: rows whose ``error`` is not null."""
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(path).metadata
    except (OSError, ValueError) as exc:  # ArrowInvalid is a ValueError: a damaged part
        raise UserError(f"{path}: not a readable Parquet part ({exc})") from None
    names = [meta.schema.column(i).name for i in range(meta.num_columns)]
    if "error" not in names:
        return 0
    col = names.index("error")
    errors = 0
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        stats = group.column(col).statistics
        if stats is None or not stats.has_null_count:
            table = pq.read_table(path, columns=["error"])
            return table.num_rows - table.column("error").null_count
        errors += group.num_rows - stats.null_count
    return errors
