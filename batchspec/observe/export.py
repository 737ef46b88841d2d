"""``batchspec export OUT --to DEST``: the committed output as one Hugging Face dataset.

Parts are per work unit, and a unit holds one domain's rows of a chunk of ``unit_rows`` input
rows, so input order interleaves the parts of a chunk. Export walks the planned units chunk by
chunk and streams the input's id and domain columns beside them: each chunk's rows are put
back in input order from the domain sequence, and their ids are compared with the input's, row
for row, which proves that every input id appears exactly once, in its place. Rows go to
``data/train-XXXXX-of-YYYYY.parquet`` (zstd), a shard closed before it would pass
``shard_mb``; memory holds one chunk's parts and one row group, whatever the output's size.
Everything is written in a temporary folder beside DEST and renamed into place at the end.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from batchspec.errors import UserError
from batchspec.io.layout import OutDir, temp_name
from batchspec.io.manifest import input_fingerprint, read_manifest
from batchspec.io.planner import plan_units
from batchspec.units import WorkUnit

ROW_GROUP_BYTES = 64 << 20
"""Rows are gathered into row groups of about this many uncompressed bytes (or less, to keep
several row groups per shard)."""


@dataclass
class ExportResult:
    dest: Path
    rows: int = 0
    error_rows: int = 0
    """Error rows written (``include_errors``) or left out (``drop_errors``)."""
    missing_rows: int = 0
    """Rows of units not committed (``allow_unfinished`` only)."""
    shards: int = 0
    bytes: int = 0


def load_job_record(out: OutDir) -> dict[str, Any]:
    try:
        return json.loads(out.job_record.read_text())
    except FileNotFoundError:
        raise UserError(
            f"{out.job_record}: missing (written by batchspec run since this version); run "
            "`batchspec run JOB --output OUT` once (a finished run only records the job)"
        ) from None


def planned_units(out: OutDir, job: dict[str, Any]) -> list[WorkUnit]:
    """The run's units, planned again from its input; refused if the input changed."""
    manifest = read_manifest(out)
    if manifest is None:
        raise UserError(f"{out}: no batchspec run here (no manifest.json)")
    files = [Path(f) for f in job["input_files"]]
    for f in files:
        if not f.exists():
            raise UserError(f"{f}: input file of this run is gone; export needs it for the order")
    if input_fingerprint(files) != manifest.input_fingerprint:
        raise UserError(f"{files[0].parent}: the input changed since the run; refusing to export")
    spec = job["spec"]
    units = plan_units(
        files, spec["output"]["unit_rows"], spec["input"]["domain_column"], job["limit"]
    )
    if len(units) != manifest.num_units:
        raise UserError(f"{out}: {len(units)} units planned now, the run had {manifest.num_units}")
    return units


def check_finished(out: OutDir, units: list[WorkUnit], allow_unfinished: bool) -> None:
    done = out.committed_units()
    missing = [u for u in units if u.unit_id not in done]
    if missing and not allow_unfinished:
        rows = sum(u.num_rows for u in missing)
        raise UserError(
            f"{out}: unfinished run: {len(units) - len(missing)} of {len(units)} units committed "
            f"({rows} rows missing); finish it with batchspec run, or pass --allow-unfinished"
        )


def _input_slices(path: Path, columns: list[str]) -> Iterator[pa.Table]:
    """The file's ``columns`` as consecutive tables (row groups decoded one at a time)."""
    pf = pq.ParquetFile(path)
    for batch in pf.iter_batches(batch_size=65536, columns=columns):
        yield pa.Table.from_batches([batch])


class _Rows:
    """Consecutive row ranges of one input file's id/domain columns, read once, in order."""

    def __init__(self, path: Path, columns: list[str]):
        self.batches = _input_slices(path, columns)
        self.buffer: pa.Table | None = None
        self.at = 0

    def take(self, start: int, stop: int) -> pa.Table:
        assert start == self.at, "chunks are read in order"
        pieces, need = [], stop - start
        while need > 0:
            if self.buffer is None or self.buffer.num_rows == 0:
                self.buffer = next(self.batches)
            piece = self.buffer.slice(0, need)
            self.buffer = self.buffer.slice(piece.num_rows)
            pieces.append(piece)
            need -= piece.num_rows
        self.at = stop
        return pa.concat_tables(pieces).combine_chunks()


def _order(domains: pa.Array | None, units: list[WorkUnit], size: int) -> np.ndarray:
    """Input order of a chunk: for each row, its index in the chunk's parts concatenated in
    ``units`` order (-1 where its unit is missing)."""
    index = np.full(size, -1, dtype=np.int64)
    if domains is None:
        index[:] = np.arange(size)
        return index
    offset = 0
    for u in units:
        if u.domain is None:
            mask = pc.is_null(domains)
        else:
            mask = pc.fill_null(pc.equal(domains, pa.scalar(u.domain)), False)
        where = np.flatnonzero(mask.to_numpy(zero_copy_only=False))
        if len(where) != u.num_rows:
            raise UserError(f"{u.path}: rows {u.start}-{u.stop} changed since the run")
        index[where] = offset + np.arange(len(where))
        offset += len(where)
    return index


def chunk_rows(
    out: OutDir, units: list[WorkUnit], inputs: pa.Table, id_col: str
) -> pa.Table | None:
    """One chunk's rows in input order (units not committed left out), ids checked."""
    done = [u for u in units if out.is_committed(u.unit_id)]
    tables = []
    for u in done:
        t = pq.read_table(out.part(u.unit_id))
        if t.num_rows != u.num_rows:
            raise UserError(f"{out.part(u.unit_id)}: {t.num_rows} rows, its unit has {u.num_rows}")
        tables.append(t)
    domains = inputs.column(1).combine_chunks() if inputs.num_columns > 1 else None
    if domains is not None and not pa.types.is_string(domains.type):
        domains = pc.cast(domains, pa.string())
    order = _order(domains, done, inputs.num_rows)
    keep = order >= 0
    if not tables:
        return None
    rows = pa.concat_tables(tables, promote_options="default").take(pa.array(order[keep]))
    got = rows.column("id").combine_chunks()
    want = inputs.column(0).combine_chunks().filter(pa.array(keep)).cast(got.type)
    if not got.equals(want):
        same = pc.fill_null(pc.equal(got, want), False).to_numpy(zero_copy_only=False)
        bad = int(np.flatnonzero(~same)[0])
        unit = rows.column("unit_id")[bad].as_py()
        raise UserError(
            f"{out.part(unit)}: id {got[bad].as_py()!r} where the input has {want[bad].as_py()!r} "
            f"({id_col}, row {units[0].start + int(np.flatnonzero(keep)[bad])} of {units[0].path})"
        )
    return rows


def ordered_chunks(
    out: OutDir, units: list[WorkUnit], id_col: str, domain_col: str | None
) -> Iterator[pa.Table]:
    """The committed rows, chunk by chunk, in input order."""
    columns = [id_col, *([domain_col] if domain_col else [])]
    for _, file_units in groupby(units, key=lambda u: u.file_index):
        file_units = list(file_units)
        reader = _Rows(Path(file_units[0].path), columns)
        for _, chunk in groupby(file_units, key=lambda u: u.start):
            chunk = list(chunk)
            inputs = reader.take(chunk[0].start, chunk[0].stop)
            rows = chunk_rows(out, chunk, inputs, id_col)
            if rows is not None:
                yield rows


def clear_dest(dest: Path) -> None:
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise UserError(f"{dest}: exists and is not empty; export to a new folder")


def staging_dir(dest: Path) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(dest)
    (tmp / "data").mkdir(parents=True)
    return tmp


def publish(tmp: Path, dest: Path) -> None:
    """Rename the finished folder into place (onto an empty DEST, or a new name)."""
    clear_dest(dest)
    if dest.exists():
        dest.rmdir()
    tmp.rename(dest)


def discard(tmp: Path) -> None:
    shutil.rmtree(tmp, ignore_errors=True)


def export_dataset(
    out: OutDir,
    dest: Path,
    include_errors: bool = True,
    allow_unfinished: bool = False,
    shard_mb: float = 500.0,
) -> ExportResult:
    """Write the run's output to ``dest`` as one dataset (see the module's docstring)."""
    from batchspec.observe.card import dataset_card
    from batchspec.observe.report import format_domain_table, full_report
    from batchspec.observe.shards import ShardWriter

    clear_dest(dest)
    job = load_job_record(out)
    units = planned_units(out, job)
    check_finished(out, units, allow_unfinished)
    parts = out.part_files()
    if not parts:
        raise UserError(f"{out}: no rows committed; nothing to export")
    schema = pq.read_schema(parts[0])
    result = ExportResult(dest)
    tmp = staging_dir(dest)
    try:
        writer = ShardWriter(tmp / "data", schema, int(shard_mb * (1 << 20)), ROW_GROUP_BYTES)
        inp = job["spec"]["input"]
        for rows in ordered_chunks(out, units, inp["id_column"], inp["domain_column"]):
            errors = pc.sum(pc.is_valid(rows.column("error"))).as_py() or 0
            result.error_rows += errors
            if errors and not include_errors:
                rows = rows.filter(pc.is_null(rows.column("error")))
            writer.write(rows)
        shards = writer.close()
        result.rows = writer.rows
        result.shards = len(shards)
        result.bytes = sum(p.stat().st_size for p in shards)
        result.missing_rows = sum(u.num_rows for u in units) - result.rows
        result.missing_rows -= 0 if include_errors else result.error_rows
        _, table, _ = full_report(out)
        counts = {
            "rows": result.rows,
            "error_rows": result.error_rows,
            "errors_kept": include_errors,
            "missing_rows": result.missing_rows,
            "shards": result.shards,
        }
        card = dataset_card(job, schema, counts, format_domain_table(table, markdown=True))
        (tmp / "README.md").write_text(card)
        publish(tmp, dest)
    except BaseException:
        discard(tmp)
        raise
    return result
