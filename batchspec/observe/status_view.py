"""How a run's status is shown: the stable JSON form for dashboards and cron (``status_json``,
versioned by ``STATUS_SCHEMA_VERSION``, every field in docs/operations.md) and the lines
``status`` prints (``format_status``). Both come from one ``RunStatus`` (``status.py`` reads
it from the output directory) through one per-domain record (``_domains``), so the two forms
never disagree on a figure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from batchspec.observe.report import ControllerView
from batchspec.work.progress import RunTotals, acceptance

if TYPE_CHECKING:
    from batchspec.observe.status import RunStatus

STATUS_SCHEMA_VERSION = 1


def _domains(totals: RunTotals, view: ControllerView | None = None) -> list[dict[str, Any]]:
    """Per domain: progress, and the K controller's view (K chosen, its predicted tokens/s,
    replayed tokens per step at every K, the K measured)."""
    per_domain = view[1] if view is not None else {}
    rows = []
    for domain, d in sorted(totals.domains.items(), key=lambda kv: (kv[0] is None, kv[0] or "")):
        rate, length = acceptance(d)
        rows.append(
            {
                "domain": domain,
                "rows": d["rows"],
                "error_rows": d["errors"],
                "output_tokens": d["output_tokens"],
                "acceptance_rate": rate,
                "mean_acceptance_length": length,
                "k_in_use": d["k_in_use"],
                "k_last": d["k_last"],
                **_k_fields(per_domain.get(domain)),
            }
        )
    return rows


def _k_fields(v: Any) -> dict[str, Any]:
    """A domain's ``DomainView`` as status fields (nulls and empties without one)."""
    return {
        "k_chosen": v.k if v else None,
        "predicted_tokens_per_s": v.tokens_per_s if v else None,
        "replayed_tokens_per_step": {str(k): t for k, t in v.replayed.items()} if v else {},
        "k_measured": list(v.measured) if v else [],
    }


def status_json(st: RunStatus, slurm: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The stable JSON form (``STATUS_SCHEMA_VERSION``; every field is in docs/operations.md)."""
    t = st.totals or RunTotals(st.rows_total)
    return {
        "schema_version": STATUS_SCHEMA_VERSION,
        "out_dir": str(st.out_dir),
        "time": st.time,
        "state": st.state,
        "units": {
            "total": st.units_total,
            "done": st.units_done,
            "leased": st.units_leased,
            "stale": st.units_stale,
            "pending": st.units_pending,
            "failed": st.units_failed,
        },
        "rows": {
            "total": st.rows_total,
            "committed": st.rows_done,
            "finished_uncommitted": t.rows_open,
            "error_rows": t.error_rows,
        },
        "output_tokens": t.output_tokens,
        "throughput": st.throughput,
        "eta_s": st.eta_s,
        "leases": st.leases,
        "workers": st.workers,
        "domains": _domains(t, st.k_view),
        "step_check": st.step_check,
        "slurm": slurm or [],
    }


def engine(k: int | None) -> str:
    return "no engine yet" if k is None else f"K={k}"


def _count(n: int, noun: str) -> str:
    """``1 unit``, ``4 units``: a reader stumbles on ``1 units``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _rate(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_status(st: RunStatus) -> str:
    """The lines ``status`` prints (docs/operations.md quotes them; tests hold the quotes to
    this)."""
    if not st.started:
        return f"{st.out_dir}: not started (tuned by batchspec tune; no run has bound it yet)"
    t = st.totals or RunTotals(st.rows_total)
    pct = 100.0 * st.rows_done / st.rows_total if st.rows_total else 100.0
    eta = "-" if st.eta_s is None else f"{st.eta_s / 60:.1f} min"
    lines = [
        f"{st.out_dir}: {st.state}",
        f"units: {st.units_done}/{st.units_total} done, {st.units_leased} leased"
        f"{f' ({st.units_stale} stale)' if st.units_stale else ''}, {st.units_pending} pending, "
        f"{st.units_failed} failed",
        f"rows: {st.rows_done}/{st.rows_total} committed ({pct:.1f}%), {t.error_rows} error rows",
        "throughput: "
        + ", ".join(
            f"last {w['window_s'] // 60} min {_rate(w['output_tokens_per_s'])} tok/s "
            f"{_rate(w['rows_per_s'], 2)} rows/s"
            for w in st.throughput
        )
        + f"; ETA {eta}",
    ]
    if st.step_check is not None:
        lines.append(_step_check_text(st.step_check))
    for lease in st.leases:
        age = lease["heartbeat_age_s"]
        lines.append(
            f"  lease {lease['unit_id']}: {lease['worker']} (heartbeat {age:.0f} s ago"
            f"{', stale' if lease['stale'] else ''}), {lease['rows_finished']} rows finished"
        )
    for w in st.workers:
        if w["state"] == "live":
            units = _count(w["units_open"], "unit")
            lines.append(
                f"  worker {w['worker']}: live, {engine(w['k'])}, {units} open, "
                f"{w['rows_committed']} rows committed (updated {w['updated_s_ago']:.0f} s ago)"
            )
    for d in _domains(t, st.k_view):
        k = ",".join(map(str, d["k_in_use"])) or f"{d['k_last']} (last)"
        lines.append(
            f"  domain {d['domain'] or '-'}: {d['rows']} rows, {d['error_rows']} errors, "
            f"acceptance {_rate(d['acceptance_rate'], 2)}, mean length "
            f"{_rate(d['mean_acceptance_length'], 2)}, K {k}{_k_text(d)}"
        )
    return "\n".join(lines)


def _step_check_text(check: dict[str, Any]) -> str:
    """The tree step profile's check, in one line: as ``report`` has it, without the prices."""
    scale = check["scale"]
    verdict = f"profile scaled x{scale:.2f}" if scale != 1.0 else "profile kept"
    cells = ", ".join(
        f"{c['batch']}x{c['nodes']} {c['measured_s'] * 1000:.1f}/{c['profiled_s'] * 1000:.1f}"
        + ("*" if c["replaced"] else "")
        for c in check["cells"]
    )
    return (
        f"step profile (tree, batch {check['batch']}): {check['steps']} steps, measured / "
        f"profiled {check['ratio']:.2f}, {verdict}"
        + (
            f"; cells rows x nodes ms measured/profiled (* priced as measured) {cells}"
            if cells
            else ""
        )
    )


def _k_text(d: dict[str, Any]) -> str:
    """The K controller's part of a domain's status line."""
    if d["k_chosen"] is None:
        return ""
    replayed = " ".join(
        f"{k}:{t:.2f}{'*' if int(k) in d['k_measured'] else ''}"
        for k, t in d["replayed_tokens_per_step"].items()
    )
    text = f"; chosen K {d['k_chosen']} at {_rate(d['predicted_tokens_per_s'])} tok/s"
    return text + (f"; tokens/step replayed (K:t, * measured) {replayed}" if replayed else "")
