"""Reading a work unit's rows: from the input file, or from its staged copy.

Reading a unit must cost about its own rows whatever the input's row groups are (a worker
reads every unit it claims, while its engine waits). Files whose row groups hold a few units
are read directly (each file's footer parsed once); files with larger groups are staged once
into the output directory (``staging``) and read from there, one row group per unit.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from batchspec.io.convert import STAGED_EXTRA
from batchspec.io.layout import OutDir
from batchspec.io.staging import ROW, StagedCopy, needs_staging, stage_file, staged_name
from batchspec.spec import InputSpec
from batchspec.spec.sampling import SamplingSpec
from batchspec.units import WorkUnit


def required_columns(spec: InputSpec, sampling: SamplingSpec | None = None) -> list[str]:
    """The input columns a job reads: id, prompt or messages, domain, pass-through, and the
    per-row sampling settings' (``sampling.columns``); an OpenAI batch file's, the format's."""
    cols = [spec.id_column, spec.prompt_column or spec.messages_column]
    if spec.format == "openai-batch":
        cols.append("prompt")  # a completions request's raw text (``io/openai_batch.py``)
    if spec.domain_column:
        cols.append(spec.domain_column)
    cols.extend(spec.passthrough_columns)
    if sampling is not None:
        cols.extend(sampling.columns.values())
    return [c for c in dict.fromkeys(cols) if c is not None]


def read_unit_table(
    unit: WorkUnit,
    columns: list[str],
    domain_column: str | None,
    pf: pq.ParquetFile | None = None,
) -> pa.Table:
    """The unit's rows (its range, its domain) with a ``__row`` column of file row numbers,
    read from the input file itself: every row group the range overlaps is decoded."""
    pf = pf or pq.ParquetFile(unit.path)
    meta = pf.metadata
    groups, first_row, offset = [], None, 0
    for g in range(meta.num_row_groups):
        n = meta.row_group(g).num_rows
        if offset + n > unit.start and offset < unit.stop:
            groups.append(g)
            if first_row is None:
                first_row = offset
        offset += n
    table = pf.read_row_groups(groups, columns=columns)
    table = table.slice(unit.start - (first_row or 0), unit.stop - unit.start)
    table = table.append_column(ROW, pa.array(range(unit.start, unit.stop), pa.int64()))
    if domain_column is not None:
        dom = table.column(domain_column)
        if not pa.types.is_string(dom.type):
            dom = pc.cast(dom, pa.string())
        mask = (
            pc.is_null(dom)
            if unit.domain is None
            else pc.fill_null(pc.equal(dom, unit.domain), False)
        )
        table = table.filter(mask)
    return table


class UnitReader:
    """A worker's reads of units: each input file read directly or through its staged copy.

    Without ``stage`` (validate, tune) every file is read directly. ``stage`` binds the reader
    to an output directory and stages there what needs it; a file it was not given that needs
    a copy gets one on its first read.
    """

    CACHED_FILES = 8

    def __init__(
        self,
        spec: InputSpec,
        unit_rows: int | None = None,
        units: Iterable[WorkUnit] = (),
        sampling: SamplingSpec | None = None,
    ):
        self.columns = required_columns(spec, sampling)
        self.domain_column = spec.domain_column
        self.unit_rows = unit_rows
        self.stops: dict[str, int] = {}
        """Rows of each file that the plan covers (fewer than the file's with --limit)."""
        self._sizes: dict[str, list[int]] = {}
        """Per file: rows and units planned (interleaved domains make units smaller)."""
        for u in units:
            self.stops[u.path] = max(self.stops.get(u.path, 0), u.stop)
            size = self._sizes.setdefault(u.path, [0, 0])
            size[0] += u.num_rows
            size[1] += 1
        self.out: OutDir | None = None
        self.stage_s = 0.0
        """Seconds this reader spent staging (or waiting for another worker's staging)."""
        self.files_staged = 0
        self._copies: dict[str, StagedCopy | None] = {}
        self._files: dict[str, pq.ParquetFile] = {}

    def _file(self, path: str) -> pq.ParquetFile:
        """The input file, opened (footer parsed) once; the few most recent kept open."""
        pf = self._files.pop(path, None) or pq.ParquetFile(path)
        if len(self._files) >= self.CACHED_FILES:
            self._files.pop(next(iter(self._files)))
        self._files[path] = pf
        return pf

    def stage(self, out: OutDir, units: Iterable[WorkUnit]) -> float:
        """Stage every file of ``units`` that needs it (or find its copy); seconds spent.

        Files another worker is staging are skipped and come back to, so that workers
        starting together stage different files at once rather than queue on one.
        """
        if self.unit_rows is None:
            raise ValueError("a reader made without unit_rows cannot stage")
        self.out = out
        self._copies.clear()  # files read before were read directly: look again
        pending = [p for p in dict.fromkeys(u.path for u in units) if self._wants_copy(p)]
        while pending:
            waiting = [p for p in pending if self._copy(p, wait=False) is None]
            if len(waiting) == len(pending):
                self._copy(waiting[0], wait=True)
                waiting = waiting[1:]
            pending = waiting
        return self.stage_s

    def _stop(self, path: str) -> int:
        return self.stops.get(path) or self._file(path).metadata.num_rows

    def _wants_copy(self, path: str) -> bool:
        if self.out is None or self.unit_rows is None:
            return False
        rows, count = self._sizes.get(path, (self.unit_rows, 1))
        return needs_staging(self._file(path).metadata, self._stop(path), rows / max(count, 1))

    def _copy(self, path: str, wait: bool = True) -> StagedCopy | None:
        """The file's staged copy, staged now if needed (None when read directly, or when
        another worker is staging it and ``wait`` is False)."""
        if path in self._copies:
            return self._copies[path]
        if not self._wants_copy(path):
            self._copies[path] = None
            return None
        assert self.out is not None and self.unit_rows is not None
        args = (Path(path), self._stop(path), self.unit_rows, self.columns_of(path))
        if not wait and self.out.staging_lock(staged_name(*args)).exists():
            return None
        result = stage_file(self.out, *args, self.domain_column)
        self.stage_s += result.seconds
        self.files_staged += result.staged_here
        self._copies[path] = StagedCopy(result.path, self.unit_rows)
        return self._copies[path]

    def columns_of(self, path: str) -> list[str]:
        """The job's columns, and those a staged input file adds (``convert.STAGED_EXTRA``:
        a row's error, a request's settings) where the file has them."""
        names = self._file(path).schema_arrow.names
        return self.columns + [c for c in STAGED_EXTRA if c in names and c not in self.columns]

    def read(self, unit: WorkUnit) -> pa.Table:
        """The unit's rows in input order, with ``__row`` (their row numbers in the file)."""
        columns = self.columns_of(unit.path)
        copy = self._copy(unit.path)
        if copy is not None:
            table = copy.read(unit.start, unit.domain, columns)
            if table is not None and table.num_rows == unit.num_rows:
                return table
            # Not in the copy (a unit not planned from this input): the file has every row.
        return read_unit_table(unit, columns, self.domain_column, self._file(unit.path))
