"""Run status from the output directory alone: units, leases, rows, throughput, ETA, K.

Reads committed parts' footers (row counts, each once), leases, failure records, the manifest
and the workers' progress records (``work.progress``), so it is safe to run from any node
while workers are running, during the run and after it, and costs no engine.
``status_view`` shows it: the documented, versioned JSON form for dashboards and cron
(docs/operations.md: "status --json"), and the lines ``status`` prints.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batchspec.errors import UserError
from batchspec.io.layout import PART_SUFFIX, OutDir
from batchspec.io.manifest import read_manifest
from batchspec.observe.report import ControllerView, controller_view
from batchspec.speculation.steps import read_step_fit
from batchspec.work.holders import Holder
from batchspec.work.leases import LeaseDir, LeaseInfo
from batchspec.work.progress import RunTotals, add_up, read_records

WINDOWS_S = (60, 300, 900)
"""Throughput is given over the last 1, 5 and 15 minutes; the ETA uses the 5-minute rate."""


@dataclass
class RunStatus:
    out_dir: Path
    units_total: int
    rows_total: int
    units_done: int = 0
    rows_done: int = 0
    units_leased: int = 0
    units_stale: int = 0
    """Leased by a worker that stopped renewing its lease: taken over by the next claimant."""
    units_failed: int = 0
    leases: list[dict[str, Any]] = field(default_factory=list)
    workers: list[dict[str, Any]] = field(default_factory=list)
    totals: RunTotals | None = None
    throughput: list[dict[str, Any]] = field(default_factory=list)
    eta_s: float | None = None
    time: float = 0.0
    started: bool = True
    """False for a directory that ``batchspec tune`` wrote into but no run has bound yet."""
    k_view: ControllerView | None = None
    """The K controller's view of the committed units (``report.controller_view``)."""
    step_check: dict[str, Any] | None = None
    """The tree engine's step profile against the run's own steps (``profile_check``)."""

    @property
    def units_pending(self) -> int:
        return max(self.units_total - self.units_done - self.units_leased - self.units_failed, 0)

    @property
    def complete(self) -> bool:
        return self.units_done >= self.units_total

    @property
    def state(self) -> str:
        if not self.started:
            return "not started"
        if self.complete:
            return "complete"
        return "running" if any(w["state"] == "live" for w in self.workers) else "stopped"


def _lease_rows(out: OutDir, lease_timeout_s: float) -> dict[str, int]:
    """Rows finished per open unit, from the live workers' lease progress records."""
    import json

    rows: dict[str, int] = {}
    for path in out.progress_files():
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if time.time() - data["time"] <= lease_timeout_s:
            rows.update(data["units"])
    return rows


def _rows_committed(parts: list[Path]) -> int:
    """Rows in committed parts, from their footers. A part that is not Parquet (damaged, or
    overwritten) is refused, naming it, as ``report`` and ``export`` refuse it: a count
    that silently skipped it would call an unreadable dataset complete."""
    import pyarrow.parquet as pq

    rows = 0
    for path in parts:
        try:
            rows += pq.ParquetFile(path).metadata.num_rows
        except FileNotFoundError:
            continue  # replaced under us (--retry-errors): its new version is counted next time
        except (OSError, ValueError) as exc:  # ArrowInvalid is a ValueError
            raise UserError(f"{path}: not a readable Parquet part ({exc})") from None
    return rows


def _heartbeat_age(out: OutDir, info: LeaseInfo) -> float:
    """Seconds since the lease or its holder's record last changed, as this host sees them."""
    if info.holder is None:
        return info.age_s
    try:
        return min(info.age_s, time.time() - out.progress(info.holder.worker).stat().st_mtime)
    except FileNotFoundError:
        return info.age_s


def _units(st: RunStatus, out: OutDir, lease_timeout_s: float) -> None:
    parts = out.part_files()
    done = {p.name[: -len(PART_SUFFIX)] for p in parts}
    st.rows_done = _rows_committed(parts)
    st.units_done = len(done)
    leases = LeaseDir(out, lease_timeout_s)
    finished = _lease_rows(out, lease_timeout_s)
    for info in sorted(leases.all(), key=lambda i: i.unit_id):
        if info.unit_id in done:
            continue
        # One look cannot watch a record change (``work.heartbeat``): stale here means its
        # holder is known gone (its process dead on this host, or its record moved to
        # progress/: ended, or found dead by a watcher), and the age below is by this
        # host's clock against the file server's, shown, never used to decide.
        stale = leases.is_stale(info)
        st.units_stale += stale
        st.units_leased += 1
        holder = info.holder
        st.leases.append(
            {
                "unit_id": info.unit_id,
                "worker": holder.worker if holder else None,
                "host": holder.host if holder else None,
                "heartbeat_age_s": round(_heartbeat_age(out, info), 1),
                "stale": stale,
                "rows_finished": finished.get(info.unit_id, 0),
            }
        )
    failed = out.failed.glob("*.json") if out.failed.is_dir() else []
    st.units_failed = sum(1 for p in failed if p.name[: -len(".json")] not in done)


def _worker_state(record: dict[str, Any], now: float, lease_timeout_s: float) -> str:
    """``ended`` cleanly; ``dead``: silent for the lease timeout, or its process is gone on
    this host (killed); else ``live``."""
    if record["ended"]:
        return "ended"
    holder = Holder(record["worker"], record["host"], record["pid"], None)
    if now - record["time"] > lease_timeout_s or holder.is_dead_here():
        return "dead"
    return "live"


def check_output_dir(out: OutDir) -> None:
    """The one rule of ``status``, ``report`` and ``export``: a directory that batchspec run
    or tune wrote into (its manifest, or a tuning file) is an output directory, even with
    nothing committed yet; anything else (a typo, another tool's folder) is refused."""
    if not out.root.is_dir():
        raise UserError(f"{out}: no such output directory")
    if not (out.manifest.exists() or out.tuning.exists()):
        raise UserError(
            f"{out}: no batchspec run here (no manifest.json or tuning.json): not an output "
            "directory of batchspec run or tune"
        )
    read_manifest(out)  # a damaged one (empty, truncated) is refused here, in one line


def profile_check(out: OutDir) -> dict[str, Any] | None:
    """The newest worker's check of the tree engine's step profile against its own steps
    (``engines.tree.step_check``, as ``report`` shows it): the batch, the steps, their mean
    ratio measured / profiled, the scale it put on the profile and every cell judged; None
    where no tree engine wrote one (vLLM prices K by a fit of its steps instead)."""
    found = read_step_fit(out)
    if found is None or found[1].get("kind") != "tree-profile":
        return None
    batch, fit = found
    keys = ("steps", "ratio", "scale", "tolerance", "cells")
    return {"batch": batch, **{k: fit[k] for k in keys if k in fit}}


def run_status(out: OutDir, lease_timeout_s: float = 300.0) -> RunStatus:
    manifest = read_manifest(out)
    if manifest is None:
        check_output_dir(out)  # tuned only: a run has yet to bind it
        return RunStatus(out.root, 0, 0, time=time.time(), started=False)
    st = RunStatus(out.root, manifest.num_units, manifest.num_rows, time=time.time())
    records = read_records(out)
    _units(st, out, lease_timeout_s)
    live = set()
    for r in records:
        state = _worker_state(r, st.time, lease_timeout_s)
        live |= {r["worker"]} if state == "live" else set()
        st.workers.append(
            {
                "worker": r["worker"],
                "run_id": r["run_id"],
                "host": r["host"],
                "pid": r["pid"],
                "state": state,
                "updated_s_ago": round(st.time - r["time"], 1),
                "units_committed": r["units_committed"],
                "rows_committed": r["rows_committed"],
                "units_open": r["open"]["units"] if state == "live" else 0,
                "rows_finished_open": r["open"]["rows_finished"] if state == "live" else 0,
                "k": r["open"]["k"] if state == "live" else None,
            }
        )
    st.k_view = controller_view(out)
    st.step_check = profile_check(out)
    counted = sum(r["rows_committed"] for r in records)
    st.totals = add_up(records, st.rows_total, max(st.rows_done - counted, 0), live)
    # After the run (no live worker), rates are of its last minutes, not of the idle time since.
    end = st.time if live or not records else max(r["time"] for r in records)
    for window in WINDOWS_S:
        rows_s, tokens_s, span = st.totals.rates(records, end, window)
        st.throughput.append(
            {
                "window_s": window,
                "end": end,
                "measured_s": round(span, 1),
                "rows_per_s": rows_s,
                "output_tokens_per_s": tokens_s,
            }
        )
    rate = st.throughput[1]["rows_per_s"]
    st.eta_s = 0.0 if st.complete else st.totals.eta_s(rate if live else None)
    return st
