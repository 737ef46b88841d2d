"""Size-bounded Parquet shards in the Hugging Face layout: ``data/train-XXXXX-of-YYYYY``.

Rows arrive a chunk at a time and are gathered into row groups; a shard is closed before the
next row group would take it past its bound (estimated from the compression seen so far), so
shards stay at or under ``shard_bytes`` except where one row group alone is larger. The count
of shards is known only at the end, so shards are written under provisional names and renamed.
The dataset folder itself is built under a temporary name beside DEST and renamed into place
whole: DEST is complete or absent, and never overwritten.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from batchspec.errors import UserError
from batchspec.io.temps import temp_name

MAX_GROUP_ROWS = 100_000


def statistics_columns(schema: pa.Schema) -> list[str]:
    """Columns whose min and max go into each row group's footer entry: numbers, and the id
    and domain (what readers filter on). Not text: the min and max of long prompts and
    generations are two more copies of them per row group, in the footer, for no reader."""
    number = (pa.types.is_integer, pa.types.is_floating, pa.types.is_boolean)
    return [f.name for f in schema if f.name in ("id", "domain") or any(t(f.type) for t in number)]


class ShardWriter:
    """Writes tables in order into ``data_dir`` as zstd Parquet shards of bounded size."""

    def __init__(self, data_dir: Path, schema: pa.Schema, shard_bytes: int, group_bytes: int):
        self.dir = data_dir
        self.schema = schema
        self.shard_bytes = shard_bytes
        self.group_bytes = max(1, min(group_bytes, shard_bytes // 4))
        """Uncompressed bytes per row group: a few per shard, so the bound can be kept."""
        self.paths: list[Path] = []
        self._pending: list[pa.Table] = []
        self._pending_bytes = 0
        self._sink: pa.NativeFile | None = None
        self._writer: pq.ParquetWriter | None = None
        self._ratio = 1.0
        """Compressed / uncompressed bytes of the row groups written so far."""
        self._groups = 0
        """Row groups in the open shard."""
        self._footer = 100.0 * len(schema)
        """Footer bytes per row group (a guess until a shard has been closed, then measured):
        at small bounds the footer is a good part of the shard."""
        self.rows = 0
        self.statistics = statistics_columns(schema)

    def write(self, table: pa.Table) -> None:
        if not table.num_rows:  # a chunk whose rows were all left out: Parquet has no empty group
            return
        self._pending.append(table.cast(self.schema))
        self._pending_bytes += table.nbytes
        rows = sum(t.num_rows for t in self._pending)
        if self._pending_bytes >= self.group_bytes or rows >= MAX_GROUP_ROWS:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        group = pa.concat_tables(self._pending).combine_chunks()
        raw = self._pending_bytes
        self._pending, self._pending_bytes = [], 0
        if self._sink is not None and self._projected(raw) > self.shard_bytes:
            self._close_shard()
        if self._writer is None:
            path = self.dir / f".shard-{len(self.paths):05d}.parquet"
            self.paths.append(path)
            self._sink = pa.OSFile(str(path), "wb")
            self._writer = pq.ParquetWriter(
                self._sink, self.schema, compression="zstd", write_statistics=self.statistics
            )
        before = self._sink.tell()
        self._writer.write_table(group, row_group_size=group.num_rows)
        written = self._sink.tell() - before
        if raw > 0 and written > 0:
            self._ratio = max(self._ratio * 0.5 + 0.5 * written / raw, 0.01)
        self.rows += group.num_rows
        self._groups += 1

    def _projected(self, raw: int) -> float:
        """The open shard's size with one more row group of ``raw`` bytes, footer included."""
        assert self._sink is not None
        return self._sink.tell() + raw * self._ratio + (self._groups + 1) * self._footer

    def _close_shard(self) -> None:
        if self._writer is not None and self._sink is not None:
            before = self._sink.tell()
            self._writer.close()
            self._footer = (self._sink.tell() - before) / max(self._groups, 1)
            self._sink.close()
        self._writer = self._sink = None
        self._groups = 0

    def close(self) -> list[Path]:
        """Finish the last shard and give every shard its final name; returns them."""
        self._flush()
        self._close_shard()
        if not self.paths:  # no rows at all: one empty shard keeps the schema
            path = self.dir / ".shard-00000.parquet"
            pq.write_table(self.schema.empty_table(), path, compression="zstd")
            self.paths.append(path)
        n = len(self.paths)
        final = []
        for i, path in enumerate(self.paths):
            target = self.dir / f"train-{i:05d}-of-{n:05d}.parquet"
            path.rename(target)
            final.append(target)
        return final


def clear_dest(dest: Path) -> None:
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise UserError(f"{dest}: exists and is not empty; export to a new folder")


def check_dest(dest: Path) -> None:
    """DEST must be new (or an empty folder), and its folder one this process can create and
    write in (the dataset is built beside DEST and renamed into place): tried by making (and
    removing) a folder there, since permission bits do not tell (root, read-only mounts,
    /proc). Refused in one line before export reads or writes anything."""
    clear_dest(dest)
    where = dest.absolute().parent
    while not os.path.lexists(where) and where != where.parent:
        where = where.parent
    if not where.is_dir():
        raise UserError(f"--to {dest}: lies under {where}, which is a file, not a folder")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".batchspec-probe-", dir=where))
    except OSError as exc:
        raise UserError(f"--to {dest}: cannot be created in {where} ({exc.strerror})") from None


def staging_dir(dest: Path) -> Path:
    """The folder the dataset is built in, beside DEST (renamed into place by ``publish``)."""
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp_name(dest)
        (tmp / "data").mkdir(parents=True)
    except OSError as exc:
        raise UserError(f"--to {dest}: cannot be created ({exc.strerror})") from None
    return tmp


def publish(tmp: Path, dest: Path) -> None:
    """Rename the finished folder into place (onto an empty DEST, or a new name)."""
    clear_dest(dest)
    if dest.exists():
        dest.rmdir()
    tmp.rename(dest)


def discard(tmp: Path) -> None:
    shutil.rmtree(tmp, ignore_errors=True)
