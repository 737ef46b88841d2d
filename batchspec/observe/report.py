"""Reports read only committed parts and the run logs: never a half-written or in-flight unit."""

from __future__ import annotations

import numpy as np
import polars as pl

from batchspec.io.layout import OutDir
from batchspec.speculation.controller import Controller
from batchspec.speculation.shared import SharedStats, read_tuning, tuning_observations
from batchspec.work.runlog import RunStats

ControllerView = tuple[int, dict[str | None, tuple[float | None, int, float | None]]]


REPORT_COLUMNS = [
    "domain",
    "error",
    "num_output_tokens",
    "num_accepted_tokens",
    "num_draft_tokens",
    "num_spec_steps",
    "num_speculative_tokens",
    "spec_method",
    "output_tokens_per_s",
]
"""The only output columns a report reads: never ``generated_text`` or pass-through columns."""


PARTS_PER_SCAN = 256
"""Parts aggregated together: memory is bounded by this many parts' report columns (polars'
own streaming engine held ~0.9 GB for a median over 10M rows; this way holds ~0.1 GB)."""

_SUMS = ["rows", "errors", "output_tokens", "ok_tokens", "ok_counted", "accepted", "drafted"]


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
    )


def domain_table(out: OutDir) -> pl.DataFrame:
    """Per domain: rows, error rows, tokens, acceptance α, mean accepted length, K used.

    α is pooled (all accepted / all drafted tokens of the domain), not a mean of row rates,
    so long rows weigh by what they drafted. Parts are read a batch at a time and only their
    report columns: a 10M-row output is gigabytes of text that a report never needs.
    """
    parts = out.part_files()
    partials, rates = [], {}
    for i in range(0, len(parts), PARTS_PER_SCAN):
        rows = pl.scan_parquet(parts[i : i + PARTS_PER_SCAN]).select(REPORT_COLUMNS).collect()
        partials.append(_partial(rows))
        speeds = rows.select("domain", "output_tokens_per_s").drop_nulls("output_tokens_per_s")
        for (domain,), frame in speeds.partition_by("domain", as_dict=True).items():
            rates.setdefault(domain, []).append(frame["output_tokens_per_s"].to_numpy())
    if not partials:
        return pl.DataFrame()
    sums = (
        pl.concat(partials)
        .group_by("domain")
        .agg(
            *(pl.col(c).sum() for c in [*_SUMS, "steps"]),
            pl.col("k_used").list.explode(keep_nulls=False, empty_as_null=False).unique().sort(),
            pl.col("methods").list.explode(keep_nulls=False, empty_as_null=False).unique().sort(),
        )
    )
    medians = pl.DataFrame(
        {
            "domain": list(rates),
            "row_tokens_per_s": [float(np.median(np.concatenate(v))) for v in rates.values()],
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


def controller_view(out: OutDir) -> ControllerView | None:
    """What the K controller makes of a run's measurements (its units and tuning file).

    Returns the batch size and, per domain, the per-token acceptance α, the K it would choose
    now and the batch's output tokens/s predicted (or measured) at that K; None when nothing
    was measured.
    """
    observations = SharedStats(out, "report").read_new()
    tuning = read_tuning(out.tuning) or {}
    batches = [o.batch for o in observations] or [b["batch"] for b in tuning.get("batches", [])]
    if not batches:
        return None
    batch = max(set(batches), key=batches.count)
    grid = tuning.get("k_grid") or sorted({o.k for o in observations})
    ctl = Controller(batch, grid, default_k=max(grid))
    ctl.load_observations(tuning_observations(tuning, batch))
    for ob in observations:
        ctl.add(ob)
    view = {}
    for domain in sorted({d for d, _ in ctl.obs}, key=lambda d: (d is None, d or "")):
        choice = ctl.choose(domain)
        rate = choice.rates.get(choice.k)
        view[domain] = (choice.alpha, choice.k, rate * batch if rate is not None else None)
    return batch, view


def with_controller(table: pl.DataFrame, view: ControllerView | None) -> pl.DataFrame:
    """The domain table plus the controller's chosen K and tokens/s per domain."""
    if table.is_empty() or view is None:
        return table
    _, per_domain = view
    cols = {"alpha": pl.Float64, "chosen_k": pl.Int64, "tokens_per_s": pl.Float64}
    domains = table["domain"].to_list()
    return table.with_columns(
        pl.Series(name, [per_domain.get(d, (None,) * 3)[i] for d in domains], dtype=typ)
        for i, (name, typ) in enumerate(cols.items())
    )


def _fmt(value: object, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def format_domain_table(table: pl.DataFrame) -> str:
    """A fixed-width text table, one line per domain plus a total line."""
    if table.is_empty():
        return "(no rows committed)"
    header = ["domain", "rows", "errors", "out_tok", "acc_rate", "mean_acc_len", "K_used"]
    header.append("row_tok/s")
    controlled = "chosen_k" in table.columns
    if controlled:
        header += ["alpha", "chosen_K", "tok/s"]
    lines = []
    for r in table.iter_rows(named=True):
        line = [
            _fmt(r["domain"]),
            _fmt(r["rows"]),
            _fmt(r["errors"]),
            _fmt(r["output_tokens"]),
            _fmt(r["acceptance_rate"]),
            _fmt(r["mean_acceptance_length"]),
            _fmt(r["k_used"]),
            _fmt(r["row_tokens_per_s"], 1),
        ]
        if controlled:
            line += [_fmt(r["alpha"]), _fmt(r["chosen_k"]), _fmt(r["tokens_per_s"], 1)]
        lines.append(line)
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]

    def row(cells: list[str]) -> str:
        pairs = enumerate(zip(cells, widths, strict=True))
        return "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in pairs)

    return "\n".join([row(header), *(row(line) for line in lines)])


def domain_report(out: OutDir) -> tuple[int, ControllerView | None, str]:
    """Rows committed, the K controller's view, and the per-domain table showing both."""
    table = domain_table(out)
    rows = int(table["rows"].sum()) if not table.is_empty() else 0
    view = controller_view(out)
    return rows, view, format_domain_table(with_controller(table, view))


def run_summary(stats: RunStats) -> str:
    """The one-screen summary of a ``run``: this invocation, then everything committed."""
    out = OutDir(stats.out_dir)
    lines = [f"output: {out}"]
    if stats.units_committed == 0 and stats.units_skipped == stats.units_total:
        lines.append(f"nothing to do: all {stats.units_total} units are already committed")
    elif stats.output_tokens_per_s is not None:
        staging = f", {stats.stage_s:.1f} s staging input" if stats.stage_s >= 0.05 else ""
        lines.append(
            f"this run: {stats.rows} rows ({stats.error_rows} errors) in "
            f"{stats.units_committed} units, {stats.output_tokens} output tokens, "
            f"{stats.output_tokens_per_s:.1f} output tokens/s over {stats.generate_s:.1f} s of "
            f"generation (+{stats.engine_build_s:.1f} s engine start{staging}; "
            f"wall {stats.wall_s:.1f} s)"
        )
    notes = []
    if stats.units_failed:
        notes.append(f"{stats.units_failed} units failed (see {out.failed}; a rerun retries)")
    if stats.engine_failures:
        notes.append(f"{stats.engine_failures} engine failures recovered")
    if stats.units_abandoned:
        notes.append(f"{stats.units_abandoned} units handed back unfinished")
    if stats.stopped_by_signal:
        notes.append("stopped by signal; rerun to continue")
    if notes:
        lines.append("note: " + "; ".join(notes))
    rows, _, table = domain_report(out)
    lines += [f"committed: {rows} rows in {stats.units_total} units", table]
    return "\n".join(lines)
