"""``batchspec export OUT --to DEST``: the committed output as one Hugging Face dataset.

The rows come from ``ordering.py`` in input order, every input id checked; this module writes
them: the columns ``--columns`` keeps (``columns.py``), rows to
``data/train-XXXXX-of-YYYYY.parquet`` (zstd, ``shards.py``), a shard closed before it would
pass ``shard_mb``, then the dataset card (``card.py``). Memory holds one chunk's rows and one
row group, whatever the output's size. Everything is written in a temporary folder beside DEST
and renamed into place at the end.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from batchspec.errors import UserError
from batchspec.io.layout import OutDir
from batchspec.observe.columns import DEFAULT, Kept, kept_for
from batchspec.observe.ordering import dataset_columns, ordered_chunks
from batchspec.observe.record import check_finished, load_job_record, planned_units

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
    prompt_column: str | None = None
    """The input's prompt or messages column, when exported (not with ``--no-prompts``, unless
    it is also a pass-through column)."""
    no_acceptance_rows: int = 0
    """Rows written with a generation but no ``acceptance_rate``: nothing was drafted."""
    null_columns: list[str] = field(default_factory=list)
    """Columns written that are null in every row."""


def _write_rows(
    writer: Any, chunks: Iterator[pa.Table], include_errors: bool, r: ExportResult
) -> None:
    """Every chunk into the shards (error rows kept or not), only the columns kept; counts the
    rows written that have a generation but no ``acceptance_rate`` (nothing drafted) and the
    columns null in every row, for the card."""
    names = writer.schema.names
    unfilled = set(names)
    for rows in chunks:
        failed = pc.is_valid(rows.column("error"))
        errors = pc.sum(failed).as_py() or 0
        r.error_rows += errors
        if errors and not include_errors:
            rows = rows.filter(pc.invert(failed))
            failed = pc.is_valid(rows.column("error"))
        no_rate = pc.and_(pc.invert(failed), pc.is_null(rows.column("acceptance_rate")))
        r.no_acceptance_rows += pc.sum(no_rate).as_py() or 0
        rows = rows.select(names)
        unfilled -= {n for n in unfilled if rows.column(n).null_count < rows.num_rows}
        writer.write(rows)
    r.null_columns = [n for n in names if n in unfilled]


def export_dataset(
    out: OutDir,
    dest: Path,
    include_errors: bool = True,
    allow_unfinished: bool = False,
    shard_mb: float = 500.0,
    prompts: bool = True,
    columns: str = DEFAULT,
) -> ExportResult:
    """Write the run's output to ``dest`` as one dataset (see the module's docstring);
    ``prompts``: the input's prompt (or messages) column beside the generation; ``columns``:
    the ``--columns`` profiles or names (``columns.choose``)."""
    from batchspec.observe.shards import ShardWriter, check_dest, discard, publish, staging_dir

    check_dest(dest)  # before anything is read or written
    job = load_job_record(out)
    units = planned_units(out, job)
    check_finished(out, units, allow_unfinished)
    if not out.part_files():
        raise UserError(f"{out}: no rows committed; nothing to export")
    cols = dataset_columns(job, [Path(f) for f in job["input_files"]], prompts)
    kept = kept_for(out, job, cols.schema, columns)
    inp = job["spec"]["input"]
    named = inp.get("prompt_column") or inp.get("messages_column")
    result = ExportResult(dest, prompt_column=named if named in kept.schema.names else None)
    tmp = staging_dir(dest)
    try:
        writer = ShardWriter(tmp / "data", kept.schema, int(shard_mb * (1 << 20)), ROW_GROUP_BYTES)
        _write_rows(writer, ordered_chunks(out, units, cols), include_errors, result)
        shards = writer.close()
        if not writer.rows and result.error_rows and not include_errors:
            raise UserError(
                f"{out}: every committed row is an error row ({result.error_rows}); nothing "
                "left to export with --drop-errors (`run --retry-errors` generates them again)"
            )
        result.rows = writer.rows
        result.shards = len(shards)
        result.bytes = sum(p.stat().st_size for p in shards)
        result.missing_rows = sum(u.num_rows for u in units) * cols.n - result.rows
        result.missing_rows -= 0 if include_errors else result.error_rows
        (tmp / "README.md").write_text(_card(out, job, kept, result, include_errors))
        publish(tmp, dest)
    except BaseException:
        discard(tmp)
        raise
    return result


def _card(out: OutDir, job: dict[str, Any], kept: Kept, r: ExportResult, errors_kept: bool) -> str:
    """The dataset card, with the run's per-domain table (of every committed row)."""
    from batchspec.observe.card import dataset_card
    from batchspec.observe.report import format_domain_table, full_report

    _, table, _ = full_report(out)
    counts = {
        "rows": r.rows,
        "error_rows": r.error_rows,
        "errors_kept": errors_kept,
        "missing_rows": r.missing_rows,
        "shards": r.shards,
        "no_acceptance_rows": r.no_acceptance_rows,
        "null_columns": r.null_columns,
    }
    return dataset_card(job, kept, counts, format_domain_table(table, markdown=True))
