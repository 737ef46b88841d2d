"""Run status from the output directory alone: units done, leased, pending, failed.

Reads only committed parts, leases, failure records and the manifest, so it is safe to run
from any node while workers are running, and costs no engine.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from batchspec.errors import UserError
from batchspec.io.layout import OutDir
from batchspec.io.manifest import read_manifest
from batchspec.work.leases import LeaseDir


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
    workers: list[dict] = field(default_factory=list)
    """Live workers' progress records: worker, units held, rows finished in them, age."""

    @property
    def units_pending(self) -> int:
        return max(self.units_total - self.units_done - self.units_leased - self.units_failed, 0)

    @property
    def complete(self) -> bool:
        return self.units_done >= self.units_total


def run_status(out: OutDir, lease_timeout_s: float = 300.0) -> RunStatus:
    manifest = read_manifest(out)
    if manifest is None:
        raise UserError(f"{out}: no batchspec run here (no manifest.json)")
    st = RunStatus(out.root, manifest.num_units, manifest.num_rows)
    done = out.committed_units()
    st.rows_done = out.rows_committed()
    st.units_done = len(done)
    leases = LeaseDir(out, lease_timeout_s)
    for info in leases.all():
        if info.unit_id in done:
            continue
        if leases.is_stale(info):
            st.units_stale += 1
        st.units_leased += 1
    failed = out.failed.glob("*.json") if out.failed.is_dir() else []
    st.units_failed = sum(1 for p in failed if p.name[: -len(".json")] not in done)
    for path in out.progress_files():
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        age = time.time() - data["time"]
        if age > lease_timeout_s:
            continue  # a worker that died without cleaning up
        units = data["units"]
        st.workers.append(
            {
                "worker": data["worker"],
                "units": len(units),
                "rows_finished": sum(units.values()),
                "age_s": age,
            }
        )
    return st


def format_status(st: RunStatus) -> str:
    pct = 100.0 * st.rows_done / st.rows_total if st.rows_total else 100.0
    lines = [
        f"{st.out_dir}: {'complete' if st.complete else 'in progress'}",
        f"units: {st.units_done}/{st.units_total} done, {st.units_leased} leased"
        f"{f' ({st.units_stale} stale)' if st.units_stale else ''}, {st.units_pending} pending, "
        f"{st.units_failed} failed",
        f"rows: {st.rows_done}/{st.rows_total} committed ({pct:.1f}%)",
    ]
    for w in st.workers:
        lines.append(
            f"  worker {w['worker']}: {w['units']} units open, {w['rows_finished']} "
            f"rows finished in them (updated {w['age_s']:.0f} s ago)"
        )
    return "\n".join(lines)
