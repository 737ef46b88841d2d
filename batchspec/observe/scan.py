"""One pass over the committed parts, a batch of parts at a time, for reports and plots.

Memory is bounded by ``PARTS_PER_SCAN`` parts' report columns plus what is kept per domain:
running sums, row speeds for the exact median (8 bytes a row, as before), log-spaced latency
histograms (percentiles to within 1.2 %), pooled acceptance histograms, and one entry per
unit (its commit time, domain, K, tokens) for plots over time. Never ``generated_text``.

Parts written before a column existed (or after one was retired) are read through one rule,
``conform``, here and by ``export``: a part's table is put in the current schema (the columns
today's ``io.writer`` writes); a column the part lacks reads as nulls of the current type, a
column of another type is cast (safely) to the current one, and a column the current schema
does not know is left out. Leaving out, not keeping: the dataset card explains every column of
the current schema, and a newer batchspec's parts export whole with that newer version.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from batchspec.errors import UserError
from batchspec.io.layout import OutDir
from batchspec.io.writer import output_schema

REPORT_COLUMNS = [
    "domain",
    "error",
    "num_output_tokens",
    "num_accepted_tokens",
    "num_draft_tokens",
    "num_spec_steps",
    "num_speculative_tokens",
    "spec_method",
    "engine",
    "output_tokens_per_s",
]
"""The columns the per-domain table reads: never ``generated_text`` or pass-through columns."""
EXTRA_COLUMNS = ["e2e_s", "acceptance_histogram", "unit_id"]
"""Also read for ``report``'s latency columns and plots."""

PARTS_PER_SCAN = 256
"""Parts aggregated together: memory is bounded by this many parts' report columns (polars'
own streaming engine held ~0.9 GB for a median over 10M rows; this way holds ~0.1 GB)."""

LATENCY_EDGES = 10.0 ** np.arange(-3.0, 5.0 + 1e-9, 0.005)
"""Latency histogram bins, 1 ms to 1e5 s, 200 per decade: a percentile is the geometric
middle of its bin, within 1.2 % of the exact value."""

REPORT_SCHEMA = output_schema(pa.string(), {})
"""Today's types of the columns a report reads (its id type and pass-through are not read)."""

_SUMS = ["rows", "errors", "output_tokens", "ok_tokens", "ok_counted", "accepted", "drafted"]


@dataclass
class Scan:
    """What a report needs of the committed output, gathered in one pass."""

    partials: list[pl.DataFrame] = field(default_factory=list)
    rates: dict[str | None, list[np.ndarray]] = field(default_factory=dict)
    latency: dict[str | None, np.ndarray] = field(default_factory=dict)
    """Per domain, counts of rows' e2e latency (queued to last token) in ``LATENCY_EDGES``."""
    accept_hist: dict[str | None, np.ndarray] = field(default_factory=dict)
    """Per domain, verify steps that accepted 0, 1, 2, ... draft tokens (pooled over rows)."""
    units: list[dict] = field(default_factory=list)
    """Per committed unit: unit_id, domain, k, rows, output_tokens, time (its commit)."""


def _partial(rows: pl.DataFrame) -> pl.DataFrame:
    """Per-domain sums of one batch of parts, to be added up across batches."""
    ok = pl.col("error").is_null()
    return rows.group_by("domain").agg(
        pl.len().alias("rows"),
        (~ok).sum().alias("errors"),
        pl.col("num_output_tokens").sum().alias("output_tokens"),
        pl.col("num_output_tokens").filter(ok).sum().alias("ok_tokens"),
        pl.col("num_output_tokens").filter(ok).count().alias("ok_counted"),
        pl.col("num_accepted_tokens").sum().alias("accepted"),
        pl.col("num_draft_tokens").sum().alias("drafted"),
        pl.col("num_spec_steps").sum().alias("steps"),
        pl.col("num_speculative_tokens").drop_nulls().unique().alias("k_used"),
        pl.col("spec_method").drop_nulls().unique().alias("methods"),
        pl.col("engine").drop_nulls().unique().alias("engines"),
    )


def _add_extras(scan: Scan, rows: pl.DataFrame, out: OutDir) -> None:
    for (domain,), frame in rows.partition_by("domain", as_dict=True).items():
        lat = frame["e2e_s"].drop_nulls().to_numpy()
        counts, _ = np.histogram(np.clip(lat, LATENCY_EDGES[0], LATENCY_EDGES[-1]), LATENCY_EDGES)
        scan.latency[domain] = scan.latency.get(domain, 0) + counts
        hist = frame["acceptance_histogram"].drop_nulls()
        if len(hist):
            width = int(hist.list.len().max())
            padded = np.zeros(width, dtype=np.int64)
            for i in range(width):
                padded[i] = int(hist.list.get(i, null_on_oob=True).sum() or 0)
            old = scan.accept_hist.get(domain, np.zeros(0, dtype=np.int64))
            size = max(len(old), width)
            scan.accept_hist[domain] = np.pad(old, (0, size - len(old))) + np.pad(
                padded, (0, size - width)
            )
    per_unit = rows.group_by("unit_id").agg(
        pl.col("domain").first(),
        pl.col("num_speculative_tokens").max().alias("k"),
        pl.len().alias("rows"),
        pl.col("num_output_tokens").sum().alias("output_tokens"),
    )
    for u in per_unit.iter_rows(named=True):
        try:
            u["time"] = os.stat(out.part(u["unit_id"])).st_mtime
        except OSError:
            continue
        scan.units.append(u)


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """A part's rows in the current ``schema`` (the module's rule): missing columns null,
    other types cast, unknown columns left out. Raises ValueError for a type that does not
    convert."""
    names = set(table.column_names)
    columns = []
    for f in schema:
        if f.name not in names:
            columns.append(pa.nulls(table.num_rows, f.type))
            continue
        col = table.column(f.name)
        if col.type != f.type:
            try:
                col = col.cast(f.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise ValueError(f"column {f.name!r} is {col.type}, not {f.type}: {exc}") from None
        columns.append(col)
    return pa.Table.from_arrays(columns, schema=schema)


def read_part(path: Path, schema: pa.Schema) -> pa.Table:
    """A committed part's columns of ``schema`` (only those it has are read), conformed."""
    try:
        pf = pq.ParquetFile(path)
        have = set(pf.schema_arrow.names)
        table = pf.read(columns=[n for n in schema.names if n in have])
        return conform(table, schema)
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise UserError(f"{path}: {exc}") from None


def read_parts(paths: list[Path], schema: pa.Schema) -> pl.DataFrame:
    """Parts' columns of ``schema``, conformed. One polars scan reads them together when every
    part has every column in today's type (``conform`` would change nothing), as nearly all
    do; otherwise they are read part by part through ``read_part`` (4x slower)."""
    want = pl.from_arrow(schema.empty_table()).schema
    try:
        rows = pl.scan_parquet(paths).select(schema.names).collect()
        if rows.schema == want:
            return rows
    except (pl.exceptions.PolarsError, OSError):
        pass  # a column missing or of another type (or a damaged part: named below)
    return pl.from_arrow(pa.concat_tables([read_part(p, schema) for p in paths]))


def scan_output(out: OutDir, extras: bool = False, per_scan: int = PARTS_PER_SCAN) -> Scan:
    """Read every committed part, ``per_scan`` at a time, only the columns needed."""
    parts = out.part_files()
    scan = Scan()
    columns = REPORT_COLUMNS + (EXTRA_COLUMNS if extras else [])
    schema = pa.schema([REPORT_SCHEMA.field(c) for c in columns])
    for i in range(0, len(parts), per_scan):
        rows = read_parts(parts[i : i + per_scan], schema)
        scan.partials.append(_partial(rows))
        speeds = rows.select("domain", "output_tokens_per_s").drop_nulls("output_tokens_per_s")
        for (domain,), frame in speeds.partition_by("domain", as_dict=True).items():
            scan.rates.setdefault(domain, []).append(frame["output_tokens_per_s"].to_numpy())
        if extras:
            _add_extras(scan, rows, out)
    return scan


def percentile(counts: np.ndarray, q: float) -> float | None:
    """The ``q``-th percentile (0-100) of a latency histogram: its bin's geometric middle."""
    total = counts.sum()
    if total == 0:
        return None
    i = int(np.searchsorted(np.cumsum(counts), q / 100.0 * total))
    i = min(i, len(counts) - 1)
    return float(np.sqrt(LATENCY_EDGES[i] * LATENCY_EDGES[i + 1]))


def table_of(scan: Scan) -> pl.DataFrame:
    """Per domain: rows, error rows, tokens, acceptance α, mean accepted length, K used, the
    median row speed. α is pooled (all accepted / all drafted tokens of the domain), not a
    mean of row rates, so long rows weigh by what they drafted. ``engines``, the engines a
    domain's rows ran on, only when some domain's ran on more than one (a rerun of
    ``engine: auto`` that switched): one engine for all is the job's, said elsewhere."""
    if not scan.partials:
        return pl.DataFrame()
    sums = (
        pl.concat(scan.partials)
        .group_by("domain")
        .agg(
            *(pl.col(c).sum() for c in [*_SUMS, "steps"]),
            pl.col("k_used").list.explode(keep_nulls=False, empty_as_null=False).unique().sort(),
            pl.col("methods").list.explode(keep_nulls=False, empty_as_null=False).unique().sort(),
            pl.col("engines").list.explode(keep_nulls=False, empty_as_null=False).unique().sort(),
        )
    )
    if (sums["engines"].list.len() <= 1).all():
        sums = sums.drop("engines")
    medians = pl.DataFrame(
        {
            "domain": list(scan.rates),
            "row_tokens_per_s": [float(np.median(np.concatenate(v))) for v in scan.rates.values()],
        },
        schema={"domain": sums.schema["domain"], "row_tokens_per_s": pl.Float64},
    )
    # 0/0 (nothing drafted) is NaN in polars; reported as null, like the rows do.
    return (
        sums.with_columns(
            (pl.col("ok_tokens") / pl.col("ok_counted")).alias("mean_output_tokens"),
            (pl.col("accepted") / pl.col("drafted")).fill_nan(None).alias("acceptance_rate"),
            (1 + pl.col("accepted") / pl.col("steps"))
            .fill_nan(None)
            .alias("mean_acceptance_length"),
        )
        .join(medians, on="domain", how="left", nulls_equal=True)
        .drop("ok_tokens", "ok_counted", "accepted", "drafted", "steps")
        .sort("domain", nulls_last=True)
    )


def with_latency(table: pl.DataFrame, scan: Scan) -> pl.DataFrame:
    """The table plus each domain's row latency p50 and p95 (seconds, queued to last token)."""
    if table.is_empty():
        return table
    domains = table["domain"].to_list()
    hists = [scan.latency.get(d) for d in domains]
    return table.with_columns(
        pl.Series(
            f"latency_p{q}_s",
            [percentile(h, q) if h is not None else None for h in hists],
            dtype=pl.Float64,
        )
        for q in (50, 95)
    )
