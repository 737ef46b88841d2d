"""Reports read only committed parts and the run logs: never a half-written or in-flight unit."""

from __future__ import annotations

from typing import NamedTuple

import polars as pl

from batchspec.errors import UserError
from batchspec.io.layout import OutDir
from batchspec.observe.scan import PARTS_PER_SCAN, Scan, scan_output, table_of, with_latency
from batchspec.speculation.controller import Controller
from batchspec.speculation.shared import SharedStats
from batchspec.speculation.steps import read_fill_cost, read_step_costs
from batchspec.speculation.tuning import TuningFile, read_tuning
from batchspec.work.runlog import RunStats


class DomainView(NamedTuple):
    """The K controller's view of one domain (its first three: the domain table's columns)."""

    alpha: float | None
    k: int
    tokens_per_s: float | None
    """The batch's output tokens/s at ``k``, predicted (or measured)."""
    replayed: dict[int, float]
    """Tokens per decode step at each K of the grid, replayed from committed rows."""
    measured: list[int]
    """The K the domain's rows ran at; the other K's rates are predicted."""
    priced: list[int]
    """The K with a predicted rate (a step cost measured, interpolated or profiled)."""
    rates: dict[int, float]
    """The batch's output tokens/s at each priced K (measured where ``measured``): why
    ``k`` was chosen."""


ControllerView = tuple[int, dict[str | None, DomainView]]


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
    replayed = {k for o in observations for k, *_ in o.replay}
    grid = (entry.k_grid if entry else None) or sorted({o.k for o in observations} | replayed)
    ctl = Controller(
        batch, grid, default_k=max(grid), step_cost=read_step_costs(out, engine, batch)
    )
    ctl.fill_cost = read_fill_cost(out, engine, batch)  # each domain's drafts, as the run
    ctl.load_observations(tuning.observations(batch, engine or ""))
    for ob in observations:
        ctl.add(ob)
    view = {}
    for domain in sorted({d for d, _ in ctl.obs}, key=lambda d: (d is None, d or "")):
        c = ctl.choose(domain)
        rate = c.rates.get(c.k)
        tokens_per_s = rate * batch if rate is not None else None
        rates = {k: r * batch for k, r in c.rates.items()}
        view[domain] = DomainView(
            c.alpha, c.k, tokens_per_s, c.replayed, c.measured, sorted(c.rates), rates
        )
    return batch, view


def format_k_view(view: ControllerView, markdown: bool = False) -> str:
    """Per domain, the K chosen, its predicted tokens/s and the replayed tokens per step at
    every K (``*``: measured, the domain's rows ran there; ``?``: no step cost, not a
    candidate): where speculation pays. Without a replayed row, one line saying that the
    acceptance at every K is the geometric model's: which of the two a run's K rests on."""
    batch, per_domain = view
    if not any(v.replayed for v in per_domain.values()):
        return (
            f"K per domain at batch {batch}: no row replayed (replay is exact for n-gram "
            "drafts only); acceptance at every K from the geometric model, alpha from the "
            "engine's own counts"
        )
    # A K some rows ran at has its column even where replay did not reach it (its time budget).
    grid = sorted({k for v in per_domain.values() for k in (*v.replayed, *v.measured)})
    header = ["domain", "chosen_K", "tok/s", *(f"K={k}" for k in grid)]
    lines = []
    for domain, v in per_domain.items():
        cells = [domain or "-", str(v.k), _fmt(v.tokens_per_s, 1)]
        for k in grid:
            mark = "*" if k in v.measured else ("" if k in v.priced else "?")
            cells.append(f"{v.replayed[k]:.2f}{mark}" if k in v.replayed else f"-{mark}")
        lines.append(cells)
    title = (
        f"K per domain at batch {batch}: replayed tokens per step at each K "
        "(* measured; ? no step cost, not a candidate)"
    )
    tables = [_table(title, header, lines, markdown)]
    predicted = [
        [domain or "-", str(v.k), *(_fmt(v.rates.get(k), 1) for k in grid)]
        for domain, v in per_domain.items()
    ]
    if any(v.rates for v in per_domain.values()):
        title = "predicted output tokens/s of the batch at each K (measured where * above)"
        tables.append(_table(title, ["domain", "chosen_K", *header[3:]], predicted, markdown))
    return "\n\n".join(tables)


def _table(title: str, header: list[str], lines: list[list[str]], markdown: bool) -> str:
    """A titled fixed-width table (or a Markdown one, untitled)."""
    if markdown:
        rule = ["---"] + ["---:"] * (len(header) - 1)
        return "\n".join(f"| {' | '.join(c)} |" for c in [header, rule, *lines])
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]
    rows = [
        "  ".join(
            c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in [header, *lines]
    ]
    return "\n".join([title, *rows])


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


def _units(n: int) -> str:
    """``1 unit``, ``2 units``."""
    return f"{n} unit" if n == 1 else f"{n} units"


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
            f"{_units(stats.units_committed)}, {stats.output_tokens} output tokens, "
            f"{stats.output_tokens_per_s:.1f} output tokens/s over {stats.generate_s:.1f} s of "
            f"generation (+{stats.engine_build_s:.1f} s engine start{staging}; "
            f"wall {stats.wall_s:.1f} s)"
        )
    notes = []
    if stats.units_failed:
        notes.append(f"{_units(stats.units_failed)} failed (see {out.failed}; a rerun retries)")
    if stats.engine_failures:
        notes.append(f"{stats.engine_failures} engine failures recovered")
    if stats.units_abandoned:
        notes.append(f"{_units(stats.units_abandoned)} handed back unfinished")
    if stats.stopped_by_signal:
        notes.append("stopped by signal; rerun to continue")
    if notes:
        lines.append("note: " + "; ".join(notes))
    if stats.error_causes:
        causes = sorted(stats.error_causes.items(), key=lambda kv: -kv[1])
        shown = "; ".join(f"{n} x {cause}" for cause, n in causes[:3])
        more = f"; {len(causes) - 3} more causes" if len(causes) > 3 else ""
        lines.append(f"error rows by cause: {shown}{more}")
    rows, _, table = domain_report(out)
    lines += [f"committed: {rows} rows in {_units(stats.units_total)}", table]
    return "\n".join(lines)
