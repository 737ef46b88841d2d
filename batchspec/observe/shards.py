"""Size-bounded Parquet shards in the Hugging Face layout: ``data/train-XXXXX-of-YYYYY``.

Rows arrive a chunk at a time and are gathered into row groups; a shard is closed before the
next row group would take it past its bound (estimated from the compression seen so far), so
shards stay at or under ``shard_bytes`` except where one row group alone is larger. The count
of shards is known only at the end, so shards are written under provisional names and renamed.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

MAX_GROUP_ROWS = 100_000


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
        self.rows = 0

    def write(self, table: pa.Table) -> None:
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
        if self._sink is not None and self._sink.tell() + raw * self._ratio > self.shard_bytes:
            self._close_shard()
        if self._writer is None:
            path = self.dir / f".shard-{len(self.paths):05d}.parquet"
            self.paths.append(path)
            self._sink = pa.OSFile(str(path), "wb")
            self._writer = pq.ParquetWriter(self._sink, self.schema, compression="zstd")
        before = self._sink.tell()
        self._writer.write_table(group, row_group_size=group.num_rows)
        written = self._sink.tell() - before
        if raw > 0 and written > 0:
            self._ratio = max(self._ratio * 0.5 + 0.5 * written / raw, 0.01)
        self.rows += group.num_rows

    def _close_shard(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._sink.close()
        self._writer = self._sink = None

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
