"""Inputs that are not Parquet, staged once into Parquet: JSON lines, OpenAI batch requests and
the Arrow files of a saved Hugging Face dataset.

Planning, id checks, per-unit reads and export all work on Parquet files with small row groups
(``planner``, ``ids``, ``reader``, ``observe/export.py``); rather than teach each of them
another format, a non-Parquet input is streamed once (a batch of lines at a time: bounded
memory, linear time) into ``OUT/staged/<name>-<kind>/part-NNNNN.parquet``: the job's columns
only, in input order, one row group per ``unit_rows`` rows, a shard per ``SHARD_ROWS``. Every
step after reads those shards as the job's input files, with Parquet's costs. A line that
cannot become a row stays a row (its place and id kept) with the reason in ``__error``, which
the prompt builder turns into an error row; a line with no identity (not JSON, no id) is
refused, naming it (``io/jsonl_rows.py``, ``io/openai_batch.py``).

The copy is made as the row-group staging is (``staging.build_once``): in a temporary folder
renamed into place whole, under a lock that other workers wait on, and named by a hash of the
source's identity (path, size, mtime) and of everything that shapes the copy, so a changed
input or job never reads a stale copy.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from batchspec.errors import UserError
from batchspec.io.layout import OutDir
from batchspec.io.sources import Source
from batchspec.io.staging import build_once
from batchspec.io.temps import FileLock
from batchspec.spec import InputSpec
from batchspec.spec.sampling import SamplingSpec

CONVERT_VERSION = 1
"""Bumped when a staged copy's content changes for the same input: older copies are not read."""
SHARD_ROWS = 1 << 17
"""Rows per staged shard at most (a multiple of ``unit_rows``): a footer of ~512 row groups at
256 rows per unit, parsed once per file by each reader."""
BATCH_ROWS = 8192
"""Lines parsed between two writes (rounded to whole units): what staging holds in memory."""
ERROR = "__error"
"""A staged row's error (naming its line), or null: the prompt builder makes it an error row."""
SETTINGS = "__sampling"
"""A staged request's own sampling settings, as JSON (``io/openai_batch.py``), or null."""
LINE = "__line"
"""A staged row's line number in its source file (1-based), for messages about it."""
SOURCE_KEY = b"batchspec.source"
"""A staged shard's metadata: the file it was staged from."""
STAGED_EXTRA = (ERROR, SETTINGS)
"""Columns a staged file may hold beyond the job's: read wherever a file has them."""


@dataclass(frozen=True)
class Staging:
    """What shapes a staged copy, besides the source: the job's columns and unit size, and for
    OpenAI batch requests the model names a body may ask for and the settings the job's
    engine cannot apply (refused per line)."""

    spec: InputSpec
    sampling: SamplingSpec
    unit_rows: int
    columns: list[str]
    models: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)

    def key(self) -> list[object]:
        return [CONVERT_VERSION, self.unit_rows, self.columns, self.models, self.refused]


def staged_files(out: OutDir, sources: list[Source], how: Staging) -> tuple[list[Path], float]:
    """The Parquet files the job reads, in order: each Parquet source as it is, each other
    source's staged shards (staged now if no copy is there); and the seconds spent staging."""
    files: list[Path] = []
    seconds = 0.0
    made = [p for p in (out.root, out.staged) if not p.exists()]
    try:
        for src in sources:
            if not src.staged:
                files.append(src.path)
                continue
            name = _copy_name(src, how)
            result = build_once(out, name, lambda tmp, lock, s=src: _write(s, tmp, how, lock))
            seconds += result.seconds
            files.extend(sorted(result.path.glob("part-*.parquet")))
    except BaseException:
        for folder in reversed(made):  # a refused input leaves no output directory behind
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise
    return files, seconds


def _copy_name(src: Source, how: Staging) -> str:
    """Changes whenever the source or anything that shapes its copy changes."""
    st = src.path.stat()
    identity = [str(src.path.resolve()), st.st_size, st.st_mtime_ns, src.kind, *how.key()]
    digest = hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:16]
    stem = re.sub(r"[^A-Za-z0-9_-]+", "_", src.path.name.split(".")[0])[:40] or "input"
    return f"{stem}-{digest}-{src.kind}"


def _write(src: Source, folder: Path, how: Staging, lock: FileLock) -> None:
    """The source's rows as shards in ``folder``."""
    from batchspec.io.jsonl_rows import jsonl_batches
    from batchspec.io.openai_batch import request_batches

    batch = how.unit_rows * max(1, BATCH_ROWS // how.unit_rows)
    if src.kind == "arrow":
        tables = _arrow_batches(src.path, how.columns)
    elif src.kind == "openai-batch":
        tables = request_batches(src.path, numbered_lines(src.path), batch, how)
    else:
        tables = jsonl_batches(src.path, numbered_lines(src.path), batch, how)
    shards = _Shards(folder, how.unit_rows, lock, {SOURCE_KEY: str(src.path)})
    for table in rebatched(tables, batch):
        shards.write(table)
    if not shards.close():
        raise UserError(f"{src.path}: no rows (the file is empty)")


def numbered_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(line number from 1, line) for every non-blank line, streamed (``.gz``: decompressed
    as read); an unreadable file is a UserError naming it."""
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rb") as fh:
            for number, raw in enumerate(fh, 1):
                if raw.strip():
                    yield number, raw
    except (OSError, EOFError) as exc:
        raise UserError(f"{path}: cannot read it ({exc})") from None


def _arrow_batches(path: Path, columns: list[str]) -> Iterator[pa.Table]:
    """A ``save_to_disk`` Arrow file (an IPC stream), the job's columns, batch by batch."""
    try:
        source = pa.memory_map(str(path))
        reader = pa.ipc.open_stream(source)
    except (OSError, pa.ArrowException) as exc:
        raise UserError(f"{path}: not an Arrow file of a saved dataset ({exc})") from None
    names = reader.schema.names
    for col in columns:
        if col not in names:
            raise UserError(f"{path}: the dataset has no column {col!r} (it has {names})")
    for batch in reader:
        yield pa.Table.from_batches([batch]).select(columns)


def where_in_source(path: Path, row: int) -> str | None:
    """Row ``row`` of a staged shard as a person finds it in its source (``SOURCE: line N``,
    or ``row N`` for an Arrow file); None for a file that was not staged."""
    try:
        pf = pq.ParquetFile(path)
        source = (pf.schema_arrow.metadata or {}).get(SOURCE_KEY)
        if source is None:
            return None
        if LINE not in pf.schema_arrow.names:
            return f"{source.decode()}: row {row}"
        return f"{source.decode()}: line {pf.read(columns=[LINE]).column(0)[row].as_py()}"
    except (OSError, pa.ArrowException, IndexError):
        return None


def rebatched(tables: Iterator[pa.Table], size: int) -> Iterator[pa.Table]:
    """The same rows in tables of exactly ``size`` rows (the last one shorter), so that row
    groups of ``unit_rows`` line up with units across writes."""
    pending: list[pa.Table] = []
    held = 0
    for table in tables:
        pending.append(table)
        held += table.num_rows
        while held >= size:
            whole = pa.concat_tables(pending).combine_chunks()
            yield whole.slice(0, size)
            rest = whole.slice(size)
            pending, held = ([rest] if rest.num_rows else []), rest.num_rows
    if held:
        yield pa.concat_tables(pending).combine_chunks()


class _Shards:
    """Consecutive shard files of at most ``SHARD_ROWS`` rows, one row group per unit."""

    def __init__(self, folder: Path, unit_rows: int, lock: FileLock, meta: dict[bytes, str]):
        self.folder = folder
        self.meta = meta
        self.unit_rows = unit_rows
        self.limit = max(unit_rows, SHARD_ROWS - SHARD_ROWS % unit_rows)
        self.lock = lock
        self.count = 0
        self.rows = 0
        self._writer: pq.ParquetWriter | None = None
        self._fh: BinaryIO | None = None
        self._schema: pa.Schema | None = None

    def write(self, table: pa.Table) -> None:
        if self._schema is None:
            self._schema = table.schema.with_metadata(self.meta)
        if self._writer is None:
            path = self.folder / f"part-{self.count:05d}.parquet"
            self._fh = open(path, "wb")  # noqa: SIM115  (closed with the shard)
            self._writer = pq.ParquetWriter(self._fh, self._schema, compression="zstd")
        self._writer.write_table(table.cast(self._schema), row_group_size=self.unit_rows)
        self.rows += table.num_rows
        if self.rows >= self.limit:
            self._close_shard()

    def _close_shard(self) -> None:
        if self._writer is not None and self._fh is not None:
            self._writer.close()
            with contextlib.closing(self._fh):
                self._fh.flush()
                os.fsync(self._fh.fileno())
            self._writer, self._fh, self.rows = None, None, 0
            self.count += 1
            self.lock.refresh()

    def close(self) -> int:
        """Close the last shard; the number of shards written."""
        self._close_shard()
        return self.count
