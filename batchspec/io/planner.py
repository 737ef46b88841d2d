"""Planner: the input split into deterministic, single-domain work units.

A unit is a row range of one input file, restricted to one domain when the input has a domain
column. The same input and settings always give the same units (and unit ids), which is what
lets any number of workers, started at any time, agree on what is done without talking to each
other. Planning streams the Parquet footer and, with a domain column, that one column batch by
batch: the dataset itself is never held in memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from batchspec.errors import UserError
from batchspec.units import WorkUnit


def _domains_by_chunk(
    pf: pq.ParquetFile, column: str, unit_rows: int, num_rows: int
) -> Iterator[tuple[int, int, dict[str | None, int]]]:
    """(start, stop, {domain: count}) for consecutive chunks of ``unit_rows`` rows."""
    start = 0
    counts: dict[str | None, int] = {}
    filled = 0
    for batch in pf.iter_batches(batch_size=65536, columns=[column]):
        col = batch.column(0)
        offset = 0
        while offset < len(col):
            take = min(unit_rows - filled, len(col) - offset, num_rows - start - filled)
            if take <= 0:
                break
            piece = col.slice(offset, take)
            if not pa.types.is_string(piece.type) and not pa.types.is_large_string(piece.type):
                piece = pc.cast(piece, pa.string())
            for item in pc.value_counts(piece).to_pylist():
                key = item["values"]
                counts[key] = counts.get(key, 0) + item["counts"]
            offset += take
            filled += take
            if filled == unit_rows or start + filled == num_rows:
                yield start, start + filled, counts
                start += filled
                filled, counts = 0, {}
        if start >= num_rows:
            return
    if filled:
        yield start, start + filled, counts


def plan_units(
    files: list[Path],
    unit_rows: int,
    domain_column: str | None,
    limit: int | None = None,
) -> list[WorkUnit]:
    """All work units of the input, in input order (file, row range, domain name).

    ``limit`` keeps only the first ``limit`` rows of the whole input (files in order).
    """
    units: list[WorkUnit] = []
    chunks: list[tuple[int, str, int, int, str | None, int]] = []  # units once domains are known
    remaining = limit
    for index, path in enumerate(files):
        if remaining is not None and remaining <= 0:
            break
        try:
            pf = pq.ParquetFile(path)
        except (OSError, pa.ArrowException) as exc:
            raise UserError(f"{path}: not a readable Parquet file ({exc})") from None
        num_rows = pf.metadata.num_rows
        if remaining is not None:
            num_rows = min(num_rows, remaining)
            remaining -= num_rows
        if domain_column is None:
            for start in range(0, num_rows, unit_rows):
                stop = min(start + unit_rows, num_rows)
                units.append(WorkUnit(index, str(path), start, stop, None, stop - start))
            continue
        if domain_column not in pf.schema_arrow.names:
            raise UserError(f"{path}: input.domain_column {domain_column!r} is not a column")
        for start, stop, counts in _domains_by_chunk(pf, domain_column, unit_rows, num_rows):
            # Sorted so that the order of units never depends on hash order.
            for domain in sorted(counts, key=lambda d: (d is None, d or "")):
                chunks.append((index, str(path), start, stop, domain, counts[domain]))
    units += with_domain_indexes(chunks)
    check_unique_ids(units, "input.path", "a batchspec bug: please report it")
    return units


def with_domain_indexes(chunks: list[tuple[int, str, int, int, str | None, int]]) -> list[WorkUnit]:
    """Units of (file, path, start, stop, domain, rows), each with its domain's index among the
    plan's distinct domains, sorted: what makes unit ids unique by construction."""
    names = sorted({c[4] for c in chunks if c[4] is not None})
    index: dict[str | None, int | None] = {name: i for i, name in enumerate(names)}
    index[None] = None
    return [WorkUnit(*c, domain_index=index[c[4]]) for c in chunks]


def check_unique_ids(units: list[WorkUnit], where: str, fix: str) -> None:
    """Refuse a plan in which two units share an id, in one line: the second one's claim would
    find the first one's part, answer "committed", and its rows would be lost. One pass."""
    seen: dict[str, WorkUnit] = {}
    for u in units:
        first = seen.setdefault(u.unit_id, u)
        if first is not u:
            raise UserError(
                f"{where}: the work units of domains {first.domain!r} and {u.domain!r} share "
                f"the id {u.unit_id}; {fix}"
            )
