"""Reports read only committed parts and the run logs: never a half-written or in-flight unit."""

from __future__ import annotations

import polars as pl

from batchspec.errors import UserError
from batchspec.io.layout import OutDir
from batchspec.observe.scan import PARTS_PER_SCAN, Scan, scan_output, table_of, with_latency
from batchspec.speculation.controller import Controller
from batchspec.speculation.shared import SharedStats
from batchspec.speculation.tuning import TuningFile, read_tuning
from batchspec.work.runlog import RunStats

ControllerView = tuple[int, dict[str | None, tuple[float | None, int, float | None]]]


def domain_table(out: OutDir) -> pl.DataFrame:
    """Per domain: rows, error rows, tokens, acceptance α, mean accepted length, K used
    (``scan.table_of``). Parts are read a batch at a time and only their report columns: a
    10M-row output is gigabytes of text that a report never needs."""
    return table_of(scan_output(out, per_scan=PARTS_PER_SCAN))


def controller_view(out: OutDir) -> ControllerView | None:
    """What the K controller makes of a run's measurements (its units and tuning file).

    Returns the batch size and, per domain, the per-token acceptance α, the K it would choose
    now and the batch's output tokens/s predicted (or measured) at that K; None when nothing
    was measured.
    """
    observations = SharedStats(out, "report").read_new()
    try:
        tuning = read_tuning(out.tuning) or TuningFile(engines={})
    except UserError:  # a tuning file no run could use: the run's own units only
        tuning = TuningFile(engines={})
    # The engine the run's units ran on (the last one, if a rerun changed it), else the
    # first one tuned; step costs differ by engine.
    ran = [o.engine for o in observations if o.engine is not None]
    engine = ran[-1] if ran else next(iter(tuning.engines), None)
    observations = [o for o in observations if o.engine in (None, engine)]
    entry = tuning.engines.get(engine)  # type: ignore[call-overload]
    batches = [o.batch for o in observations] or [b.batch for b in (entry.batches if entry else [])]
    if not batches:
        return None
    batch = max(set(batches), key=batches.count)
    grid = (entry.k_grid if entry else None) or sorted({o.k for o in observations})
    ctl = Controller(batch, grid, default_k=max(grid))
    ctl.load_observations(tuning.observations(batch, engine or ""))
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


_COLUMNS = [
    ("domain", "domain", 2),
    ("rows", "rows", 2),
    ("errors", "errors", 2),
    ("out_tok", "output_tokens", 2),
    ("acc_rate", "acceptance_rate", 2),
    ("mean_acc_len", "mean_acceptance_length", 2),
    ("K_used", "k_used", 2),
    ("engines", "engines", 2),
    ("row_tok/s", "row_tokens_per_s", 1),
    ("p50_s", "latency_p50_s", 2),
    ("p95_s", "latency_p95_s", 2),
    ("alpha", "alpha", 2),
    ("chosen_K", "chosen_k", 2),
    ("tok/s", "tokens_per_s", 1),
]
"""Header, table column, digits; a column the table lacks is left out."""


def format_domain_table(table: pl.DataFrame, markdown: bool = False) -> str:
    """A fixed-width text table (or a Markdown one), one line per domain."""
    if table.is_empty():
        return "(no rows committed)"
    cols = [c for c in _COLUMNS if c[1] in table.columns]
    header = [h for h, _, _ in cols]
    lines = [[_fmt(r[c], d) for _, c, d in cols] for r in table.iter_rows(named=True)]
    if markdown:
        rule = ["---"] + ["---:"] * (len(header) - 1)
        return "\n".join(f"| {' | '.join(cells)} |" for cells in [header, rule, *lines])
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]

    def row(cells: list[str]) -> str:
        pairs = enumerate(zip(cells, widths, strict=True))
        return "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in pairs)

    return "\n".join([row(header), *(row(line) for line in lines)])


def full_report(out: OutDir) -> tuple[Scan, pl.DataFrame, ControllerView | None]:
    """``batchspec report``: one pass over the parts with the extras (latency, acceptance
    histograms, units over time), the table with latency and the controller's columns."""
    scan = scan_output(out, extras=True, per_scan=PARTS_PER_SCAN)
    view = controller_view(out)
    table = with_controller(with_latency(table_of(scan), scan), view)
    return scan, table, view


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
