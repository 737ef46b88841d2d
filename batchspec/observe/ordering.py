"""Export's rows in input order, every input id checked: the reading half of ``export``.

Parts are per work unit, and a unit holds one domain's rows of a chunk of ``unit_rows`` input
rows, so input order interleaves the parts of a chunk. Export walks the planned units chunk by
chunk and streams the input's id, domain and prompt (or messages) columns beside them: each
chunk's rows are put back in input order from the domain sequence, and their ids are compared
with the input's, row for row, which proves that every input id appears exactly once, in its
place. Memory holds one chunk's parts and one input batch, whatever the output's size. Both
writers read from here: ``export.py`` (Parquet shards) and ``export_lines.py`` (JSON lines).

The prompt comes from the input, not from the parts. Export already reads the input in order,
once, for the ids, and refuses an input whose fingerprint differs from the run's manifest, so
the prompt read beside each id is the one the run answered. Storing it in every part instead
would write the input a second time during the run (10M rows of ~1 KB prompts: ~10 GB more in
``parts/``, on the workers' time), and parts committed before would have none. The input is
streamed (``iter_batches`` of ``INPUT_BATCH_ROWS``, column pages read through a small buffer):
never a whole row group at once, whatever the input's row groups
(docs/benchmarks.md, Export: measured once). The column is exported under its input
name, as the input holds it (a messages column as its list of structs): the chat template is
the model's, not the dataset's.

Parts are read through ``scan.conform``: columns a part was written without read as null.
"""

from __future__ import annotations

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
from batchspec.io.layout import OutDir
from batchspec.io.staging import READ_BUFFER
from batchspec.io.writer import output_schema
from batchspec.observe.scan import read_part
from batchspec.units import WorkUnit

INPUT_BATCH_ROWS = 16_384
"""Input rows decoded at a time (16 MB of 1 KB prompts); a chunk takes ``unit_rows`` of them."""


@dataclass(frozen=True)
class Columns:
    """What export reads of the input beside the parts (by name), and the rows' schema."""

    id: str
    domain: str | None
    prompt: str | None
    """The prompt or messages column, taken from the input; None when left out (or when it is
    a pass-through column, which the parts carry already)."""
    schema: pa.Schema
    """Today's output schema for the run's input types, the prompt column before the
    generation: what every exported row has, whatever version wrote its part."""
    n: int = 1
    """Samples per prompt (``sampling.n``): rows per input row, consecutive in a part."""

    @property
    def read(self) -> list[str]:
        return list(dict.fromkeys(c for c in (self.id, self.domain, self.prompt) if c))


def dataset_columns(job: dict[str, Any], files: list[Path], prompts: bool) -> Columns:
    """The input columns to read and the dataset's schema (``prompts``: export the prompt)."""
    inp = job["spec"]["input"]
    types = pq.read_schema(files[0])
    passthrough = {c: types.field(c).type for c in inp.get("passthrough_columns") or []}
    schema = output_schema(types.field(inp["id_column"]).type, passthrough)
    prompt = inp.get("prompt_column") or inp.get("messages_column")
    if not prompts or prompt in passthrough:
        prompt = None
    elif prompt in schema.names:
        raise UserError(
            f"{files[0]}: the prompt column {prompt!r} has the name of an output column; "
            "export with --no-prompts"
        )
    else:
        at = schema.get_field_index("generated_text")
        schema = schema.insert(at, pa.field(prompt, types.field(prompt).type))
    n = job["spec"].get("sampling", {}).get("n", 1)
    return Columns(inp["id_column"], inp.get("domain_column"), prompt, schema, n)


class _Rows:
    """Consecutive row ranges of one input file's columns, read once, in order: column pages
    through a small buffer, ``INPUT_BATCH_ROWS`` decoded at a time."""

    def __init__(self, path: Path, columns: list[str]):
        pf = pq.ParquetFile(path, buffer_size=READ_BUFFER, pre_buffer=False)
        self.batches = pf.iter_batches(batch_size=INPUT_BATCH_ROWS, columns=columns)
        self.buffer: pa.Table | None = None
        self.at = 0

    def take(self, start: int, stop: int) -> pa.Table:
        assert start == self.at, "chunks are read in order"
        pieces, need = [], stop - start
        while need > 0:
            if self.buffer is None or self.buffer.num_rows == 0:
                self.buffer = pa.Table.from_batches([next(self.batches)])
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


def _check_ids(
    out: OutDir,
    units: list[WorkUnit],
    rows: pa.Table,
    want: pa.Array,
    keep: np.ndarray,
    id_col: str,
    n: int = 1,
) -> None:
    """The chunk's (id, sample_index) pairs, in input order, are the input's ids each with
    its samples 0..n-1: else the first wrong one, named."""
    got = rows.column("id").combine_chunks()
    want = want.cast(got.type).take(pa.array(np.repeat(np.arange(len(want)), n)))
    samples = pc.fill_null(rows.column("sample_index"), 0).to_numpy(zero_copy_only=False)
    sample_ok = samples == np.tile(np.arange(n), len(want) // n)
    if got.equals(want) and sample_ok.all():
        return
    same = pc.fill_null(pc.equal(got, want), False).to_numpy(zero_copy_only=False)
    bad = int(np.flatnonzero(~(same & sample_ok))[0])
    unit = rows.column("unit_id")[bad].as_py()
    where = (
        f"({id_col}, row {units[0].start + int(np.flatnonzero(keep)[bad // n])} of {units[0].path})"
    )
    if not same[bad]:
        raise UserError(
            f"{out.part(unit)}: id {got[bad].as_py()!r} where the input has "
            f"{want[bad].as_py()!r} {where}"
        )
    raise UserError(
        f"{out.part(unit)}: id {got[bad].as_py()!r} sample_index {int(samples[bad])} where "
        f"sample {bad % n} of {n} belongs {where}"
    )


def chunk_rows(
    out: OutDir, units: list[WorkUnit], inputs: pa.Table, cols: Columns
) -> pa.Table | None:
    """One chunk's rows in input order (units not committed left out), ids checked, the
    input's prompts beside them."""
    done = [u for u in units if out.is_committed(u.unit_id)]
    tables = []
    for u in done:
        t = read_part(out.part(u.unit_id), cols.schema)
        if t.num_rows != u.num_rows * cols.n:
            raise UserError(
                f"{out.part(u.unit_id)}: {t.num_rows} rows, its unit has {u.num_rows} "
                f"x {cols.n} sample(s)"
            )
        tables.append(t)
    domains = inputs.column(cols.domain).combine_chunks() if cols.domain else None
    if domains is not None and not pa.types.is_string(domains.type):
        domains = pc.cast(domains, pa.string())
    order = _order(domains, done, inputs.num_rows)
    keep = order >= 0
    if not tables:
        return None
    n = cols.n
    # A prompt's n samples are consecutive in its part: row r's are r*n .. r*n+n-1.
    taken = (order[keep][:, None] * n + np.arange(n)).ravel()
    rows = pa.concat_tables(tables).take(pa.array(taken))
    mask = pa.array(keep)
    ids = inputs.column(cols.id).combine_chunks().filter(mask)
    _check_ids(out, units, rows, ids, keep, cols.id, n)
    if cols.prompt is not None:
        at = cols.schema.get_field_index(cols.prompt)
        prompts = inputs.column(cols.prompt).filter(mask).combine_chunks()
        prompts = prompts.take(pa.array(np.repeat(np.arange(len(prompts)), n)))
        rows = rows.set_column(at, cols.schema.field(at), prompts)
    return rows


def ordered_chunks(out: OutDir, units: list[WorkUnit], cols: Columns) -> Iterator[pa.Table]:
    """The committed rows, chunk by chunk, in input order."""
    for _, file_units in groupby(units, key=lambda u: u.file_index):
        file_units = list(file_units)
        reader = _Rows(Path(file_units[0].path), cols.read)
        for _, chunk in groupby(file_units, key=lambda u: u.start):
            chunk = list(chunk)
            rows = chunk_rows(out, chunk, reader.take(chunk[0].start, chunk[0].stop), cols)
            if rows is not None:
                yield rows
