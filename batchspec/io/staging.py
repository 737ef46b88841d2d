"""Staging: an input file with large row groups, copied once so that each unit is one row group.

Parquet is read a row group at a time, and files written with pyarrow or polars defaults hold
256k-1M rows per group: read directly, every 256-row unit would decode a whole group (seconds
and gigabytes, per unit). So such a file is streamed once (bounded memory: column pages are
read through a small buffer, a few thousand rows at a time) into ``OUT/staged/<name>/``: only
the columns the job reads, plus ``__row`` (the row's number in the input), cut at the planner's
chunk boundaries (multiples of ``unit_rows``), and within a chunk one row group per domain, in
the planner's unit order. Every unit is then exactly one row group: reading it costs its own
rows, and reading all units costs the input once. Small row groups are staged too where
domains are interleaved (``needs_staging``): each unit would decode its chunk's every domain.

The copy is split into shards of at most ~64k rows or 128 row groups (``s<first row>.parquet``)
so that a shard's footer stays small to open; each footer lists its row groups' (chunk start,
domain). The copy is built in a temporary directory and renamed into place whole: it exists
complete or not at all. Its name carries a hash of the input file's identity (path, size,
mtime), the rows staged, ``unit_rows`` and the columns, so every worker and every rerun of the
job finds and reuses it, and a changed input is never read from a stale copy. A lock file keeps
concurrent workers from staging one file twice; they wait for the copy instead.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from batchspec.io.layout import OutDir
from batchspec.io.temps import FileLock, fsync_dir, temp_name

STAGE_FACTOR = 4
"""A file is staged when one of its row groups holds more than this many units' rows: reading
every unit then decodes at most this many times the input, whatever its layout."""
SHARD_ROWS = 65536
SHARD_GROUPS = 128
"""A shard closes at the first chunk boundary past either bound (a short footer to parse)."""
READ_BUFFER = 1 << 20
"""Bytes read at a time from a column chunk while staging: without it pyarrow loads whole
column chunks (a 1M-row group of 1 KB prompts is a gigabyte)."""
LOCK_STALE_S = 120.0
"""A staging lock not refreshed for this long is taken over (refreshed at every shard)."""
GROUPS_KEY = b"batchspec.groups"
ROW = "__row"


def domain_order(domain: str | None) -> tuple[bool, str]:
    """The planner's order of a chunk's domains (its units), None last."""
    return (domain is None, domain or "")


def needs_staging(meta: pq.FileMetaData, stop: int, unit_size: float) -> bool:
    """Whether reading rows ``[0, stop)`` a unit at a time would decode far more than units
    hold: a row group of more than ``STAGE_FACTOR`` units' rows (``unit_size``: the file's
    mean unit, smaller than ``unit_rows`` where domains are interleaved and each unit of a
    chunk would decode the chunk's every domain)."""
    offset = 0
    for g in range(meta.num_row_groups):
        if offset >= stop:
            break
        n = meta.row_group(g).num_rows
        if n > STAGE_FACTOR * unit_size:
            return True
        offset += n
    return False


def staged_name(path: Path, stop: int, unit_rows: int, columns: list[str]) -> str:
    """Name of a file's staged copy: changes whenever the input or what is staged changes."""
    st = path.stat()
    identity = [str(path.resolve()), st.st_size, st.st_mtime_ns, stop, unit_rows, columns]
    digest = hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:16]
    stem = re.sub(r"[^A-Za-z0-9_-]+", "_", path.stem)[:40] or "input"
    return f"{stem}-{digest}"


def shard_name(first_row: int) -> str:
    return f"s{first_row:012d}.parquet"


def shard_first_row(path: Path) -> int:
    return int(path.name[1:13])


@dataclass
class StageResult:
    path: Path
    seconds: float
    """Time spent staging here (0 when the copy was already there), waits included."""
    staged_here: bool


def stage_file(
    out: OutDir,
    src: Path,
    stop: int,
    unit_rows: int,
    columns: list[str],
    domain_column: str | None,
) -> StageResult:
    """The staged copy of rows ``[0, stop)`` of ``src``: found, waited for, or made here."""
    name = staged_name(src, stop, unit_rows, columns)

    def write(tmp: Path, lock: FileLock) -> None:
        _write_copy(src, tmp, stop, unit_rows, columns, domain_column, lock)

    return build_once(out, name, write)


def build_once(out: OutDir, name: str, write: Callable[[Path, FileLock], None]) -> StageResult:
    """``OUT/staged/<name>``: found, waited for (another worker builds it), or built here by
    ``write(folder, lock)`` into a temporary folder renamed into place whole (it exists
    complete or not at all); ``write`` refreshes the lock as it goes."""
    final = out.staged_copy(name)
    started = time.perf_counter()
    if final.is_dir():
        return StageResult(final, 0.0, False)
    out.staged.mkdir(parents=True, exist_ok=True)
    lock = FileLock(out.staging_lock(name), LOCK_STALE_S)
    while not final.is_dir():
        if not lock.try_acquire():
            time.sleep(0.2)  # another worker is staging this file: its copy serves us too
            continue
        try:
            if final.is_dir():
                break
            for old in out.staged.glob(f".{name}.*"):
                # Under the lock, only an earlier holder's copy (dead, or silent for
                # LOCK_STALE_S) can be here.
                shutil.rmtree(old, ignore_errors=True)
            _publish(final, lambda tmp: write(tmp, lock))
            return StageResult(final, time.perf_counter() - started, True)
        finally:
            lock.release()
    return StageResult(final, time.perf_counter() - started, False)


def _publish(final: Path, write: Callable[[Path], None]) -> None:
    """Write into a temporary directory, then rename it to ``final`` (first wins)."""
    tmp = temp_name(final)
    tmp.mkdir()
    try:
        write(tmp)
        fsync_dir(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.is_dir():
                raise  # not a lost race: a real failure
        fsync_dir(final.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _write_copy(
    src: Path,
    folder: Path,
    stop: int,
    unit_rows: int,
    columns: list[str],
    domain_column: str | None,
    lock: FileLock,
) -> None:
    """The shards of the copy, written into ``folder``."""
    pf = pq.ParquetFile(src, buffer_size=READ_BUFFER, pre_buffer=False)
    fields = [pf.schema_arrow.field(c) for c in columns] + [pa.field(ROW, pa.int64())]
    shards = _ShardWriter(folder, pa.schema(fields), lock)
    for start, chunk in _chunks(pf, columns, stop, unit_rows):
        for domain, rows in _split_by_domain(chunk, domain_column):
            shards.add_group(start, domain, rows)
        shards.end_chunk()
    shards.close()


def _chunks(
    pf: pq.ParquetFile, columns: list[str], stop: int, unit_rows: int
) -> Iterator[tuple[int, pa.Table]]:
    """(first row, table with ``__row``) for consecutive chunks of ``unit_rows`` rows."""
    batch_rows = unit_rows * max(1, 8192 // unit_rows)
    pending: pa.Table | None = None
    start = read = 0
    for batch in pf.iter_batches(batch_size=batch_rows, columns=columns):
        take = min(batch.num_rows, stop - read)
        rows = pa.array(np.arange(read, read + take, dtype=np.int64))
        table = pa.Table.from_batches([batch.slice(0, take)]).append_column(ROW, rows)
        read += take
        pending = table if pending is None else pa.concat_tables([pending, table])
        while pending.num_rows >= unit_rows:
            yield start, pending.slice(0, unit_rows)
            pending = pending.slice(unit_rows)
            start += unit_rows
        if read >= stop:
            break
    if pending is not None and pending.num_rows:
        yield start, pending


def _split_by_domain(
    chunk: pa.Table, domain_column: str | None
) -> Iterator[tuple[str | None, pa.Table]]:
    """A chunk's rows by domain, as the planner cuts it into units (same order, same keys)."""
    if domain_column is None:
        yield None, chunk
        return
    dom = chunk.column(domain_column)
    if not pa.types.is_string(dom.type):
        dom = pc.cast(dom, pa.string())
    domains = [item["values"] for item in pc.value_counts(dom).to_pylist()]
    for domain in sorted(domains, key=domain_order):
        mask = pc.is_null(dom) if domain is None else pc.fill_null(pc.equal(dom, domain), False)
        yield domain, chunk.filter(mask)


class _ShardWriter:
    """Writes groups into consecutive shard files, one row group each, fsynced."""

    def __init__(self, folder: Path, schema: pa.Schema, lock: FileLock):
        self.folder = folder
        self.schema = schema
        self.lock = lock
        self._fh: object | None = None
        self._writer: pq.ParquetWriter | None = None
        self._groups: list[tuple[int, str | None]] = []
        self._rows = 0

    def add_group(self, start: int, domain: str | None, rows: pa.Table) -> None:
        if self._writer is None:
            self._fh = open(self.folder / shard_name(start), "wb")  # noqa: SIM115
            self._writer = pq.ParquetWriter(
                self._fh, self.schema, compression="zstd", write_statistics=False
            )
        self._writer.write_table(rows, row_group_size=max(rows.num_rows, 1))
        self._groups.append((start, domain))
        self._rows += rows.num_rows

    def end_chunk(self) -> None:
        if self._rows >= SHARD_ROWS or len(self._groups) >= SHARD_GROUPS:
            self.close()

    def close(self) -> None:
        if self._writer is None:
            return
        self._writer.add_key_value_metadata({GROUPS_KEY: json.dumps(self._groups)})
        self._writer.close()
        fh = self._fh
        assert fh is not None
        with contextlib.closing(fh):  # type: ignore[arg-type]
            fh.flush()  # type: ignore[attr-defined]
            os.fsync(fh.fileno())  # type: ignore[attr-defined]
        self._writer, self._fh, self._groups, self._rows = None, None, [], 0
        self.lock.refresh()


class StagedCopy:
    """Reads units from a staged copy: shard by first row, row group by (chunk, domain)."""

    CACHED_SHARDS = 8

    def __init__(self, path: Path, unit_rows: int):
        self.path = path
        self.unit_rows = unit_rows
        self.firsts = sorted(shard_first_row(p) for p in path.glob("s*.parquet"))
        self._open: dict[int, tuple[pq.ParquetFile, dict[tuple[int, str | None], int]]] = {}

    def _shard(self, first: int) -> tuple[pq.ParquetFile, dict[tuple[int, str | None], int]]:
        if first in self._open:
            shard = self._open.pop(first)
        else:
            pf = pq.ParquetFile(self.path / shard_name(first))
            groups = json.loads(pf.metadata.metadata[GROUPS_KEY])
            shard = (pf, {(start, domain): i for i, (start, domain) in enumerate(groups)})
            if len(self._open) >= self.CACHED_SHARDS:
                self._open.pop(next(iter(self._open)))
        self._open[first] = shard  # most recently used last
        return shard

    def read(self, start: int, domain: str | None, columns: list[str]) -> pa.Table | None:
        """The row group of the unit at chunk ``start`` and ``domain``; None if not staged."""
        i = int(np.searchsorted(self.firsts, start, side="right")) - 1
        if i < 0:
            return None
        pf, groups = self._shard(self.firsts[i])
        group = groups.get((start, domain))
        if group is None:
            return None
        return pf.read_row_group(group, columns=[*columns, ROW])
