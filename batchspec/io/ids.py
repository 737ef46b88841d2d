"""Row ids: every planned row must have one, and no two the same.

Output rows are matched to input rows by id downstream; a null or repeated id would make two
rows indistinguishable, silently. Checked before any engine starts, in memory bounded for
10M-row inputs: ids are streamed one column batch at a time and kept only as 64-bit hashes
(80 MB for 10M rows); hashes that repeat are then confirmed on the ids themselves, so a hash
collision is never reported as a duplicate.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from batchspec.errors import UserError
from batchspec.io.convert import where_in_source

BATCH_ROWS = 65536


def _id_batches(
    files: list[Path], column: str, limit: int | None
) -> Iterator[tuple[Path, int, pa.Array]]:
    """(file, first row, ids) for the planned rows (the first ``limit`` of the input)."""
    left = limit
    for path in files:
        pf = pq.ParquetFile(path, buffer_size=1 << 20)
        row = 0
        for batch in pf.iter_batches(batch_size=BATCH_ROWS, columns=[column]):
            if left is not None and left <= 0:
                return
            ids = batch.column(0)
            if left is not None:
                ids = ids.slice(0, left)
                left -= len(ids)
            yield path, row, ids
            row += len(ids)


def _hashes(ids: pa.Array) -> np.ndarray:
    return pl.Series(values=ids).hash(seed=0).to_numpy().astype(np.uint64, copy=False)


def check_ids(files: list[Path], column: str, limit: int | None = None) -> None:
    """Raise a UserError naming the first null id, or the first id seen twice (input order)."""
    hashes = []
    for path, row, ids in _id_batches(files, column, limit):
        if ids.null_count:
            first = row + int(pc.index(pc.is_null(ids), True).as_py())
            staged = where_in_source(path, first)
            if staged is not None:  # a row staged from a line: named by its line
                raise UserError(f"{staged}: input.id_column {column!r} is null")
            raise UserError(f"{path}: input.id_column {column!r} is null at row {first}")
        hashes.append(_hashes(ids))
    if not hashes:
        return
    every = np.concatenate(hashes)
    del hashes
    every.sort()
    repeated = np.unique(every[1:][every[1:] == every[:-1]])
    del every
    if len(repeated):
        _report_duplicate(files, column, limit, repeated)


def _report_duplicate(files: list[Path], column: str, limit: int | None, hashes: Any) -> None:
    """Second pass over the ids whose hash repeats: the first true repeat, with both places."""
    seen: dict[Any, tuple[Path, int]] = {}
    for path, row, ids in _id_batches(files, column, limit):
        hits = np.flatnonzero(np.isin(_hashes(ids), hashes))
        for i in hits:
            value = ids[int(i)].as_py()
            if value in seen:
                staged = where_in_source(path, row + int(i))
                if staged is not None:  # rows staged from lines: named by their lines
                    raise UserError(
                        f"{staged}: input.id_column {column!r}: id {value!r} repeats the id at "
                        f"{where_in_source(*seen[value])}; ids must be unique"
                    )
                first_path, first_row = seen[value]
                where = "" if first_path == path else f"{first_path} "
                raise UserError(
                    f"{path}: input.id_column {column!r}: id {value!r} at row {row + int(i)} "
                    f"repeats the id at {where}row {first_row}; ids must be unique"
                )
            seen[value] = (path, row + int(i))
