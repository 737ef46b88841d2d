"""Output: the row schema, and part files committed atomically, one per work unit.

A part is written under a temporary name, fsynced, then linked to its final name; the link
fails if the final name exists, so the first committer of a unit wins and a late duplicate is
discarded. A reader therefore never sees a half-written part, and no unit is counted twice.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from batchspec.engine import RowResult, UnitResult

PARTS_DIR = "parts"

# Columns every output has after id, domain and the pass-through columns (README: Output schema).
RESULT_FIELDS: list[pa.Field] = [
    pa.field("generated_text", pa.string()),
    pa.field("num_prompt_tokens", pa.int32()),
    pa.field("num_output_tokens", pa.int32()),
    pa.field("finish_reason", pa.string()),
    pa.field("spec_method", pa.string()),
    pa.field("num_speculative_tokens", pa.int32()),
    pa.field("num_spec_steps", pa.int32()),
    pa.field("num_draft_tokens", pa.int32()),
    pa.field("num_accepted_tokens", pa.int32()),
    pa.field("acceptance_rate", pa.float64()),
    pa.field("mean_acceptance_length", pa.float64()),
    pa.field("acceptance_histogram", pa.list_(pa.int32())),
    pa.field("queue_s", pa.float64()),
    pa.field("ttft_s", pa.float64()),
    pa.field("decode_s", pa.float64()),
    pa.field("e2e_s", pa.float64()),
    pa.field("output_tokens_per_s", pa.float64()),
    pa.field("error", pa.string()),
    pa.field("unit_id", pa.string()),
]
RESERVED = {"id", "domain", *(f.name for f in RESULT_FIELDS)}


def output_schema(id_type: pa.DataType, passthrough: dict[str, pa.DataType]) -> pa.Schema:
    """The output schema for an input whose id and pass-through columns have these types."""
    fields = [pa.field("id", id_type), pa.field("domain", pa.string())]
    fields += [pa.field(name, typ) for name, typ in passthrough.items()]
    return pa.schema(fields + RESULT_FIELDS)


def _timing(t: dict[str, float] | None, num_output_tokens: int | None) -> dict[str, Any]:
    if t is None:
        return {}
    # All four are engine-core monotonic timestamps of one clock, taken in this order.
    queue = t["scheduled"] - t["queued"]
    ttft = t["first_token"] - t["queued"]
    e2e = t["last_token"] - t["queued"]
    running = e2e - queue
    return {
        "queue_s": queue,
        "ttft_s": ttft,
        "decode_s": e2e - ttft,
        "e2e_s": e2e,
        "output_tokens_per_s": (num_output_tokens or 0) / running if running > 0 else None,
    }


def _speculative(spec: dict[str, Any] | None, method: str, k: int) -> dict[str, Any]:
    """Speculative columns: what was measured, or nulls where nothing was speculated."""
    cols: dict[str, Any] = {"spec_method": method, "num_speculative_tokens": k}
    if spec is None or k == 0:
        return cols
    steps = spec["num_spec_steps"]
    drafted = spec["num_draft_tokens"]
    accepted = spec["num_accepted_draft_tokens"]
    cols.update(
        num_spec_steps=steps,
        num_draft_tokens=drafted,
        num_accepted_tokens=accepted,
        # Undefined when nothing was drafted (n-gram found no match): null, not a made-up 0.
        acceptance_rate=accepted / drafted if drafted else None,
        mean_acceptance_length=1.0 + accepted / steps if steps else None,
        acceptance_histogram=list(spec["acceptance_histogram"]),
    )
    return cols


def result_row(r: RowResult, unit_id: str, method: str, k: int) -> dict[str, Any]:
    req = r.request
    row: dict[str, Any] = {"id": req.row_id, "domain": req.domain, **req.passthrough}
    row["unit_id"] = unit_id
    if r.error is not None:
        # Nothing was generated: every generation column stays null.
        row["error"] = r.error
        return row
    row.update(_speculative(r.spec, method, k))
    row.update(
        generated_text=r.text,
        num_prompt_tokens=r.num_prompt_tokens,
        num_output_tokens=r.num_output_tokens,
        finish_reason=r.finish_reason,
        **_timing(r.timing, r.num_output_tokens),
    )
    return row


def unit_table(result: UnitResult, schema: pa.Schema) -> pa.Table:
    unit_id = result.unit_requests.unit.unit_id
    rows = [result_row(r, unit_id, result.method, result.k) for r in result.results]
    return pa.Table.from_pylist(rows, schema=schema)


def part_path(out_dir: Path, unit_id: str) -> Path:
    return out_dir / PARTS_DIR / f"{unit_id}.parquet"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_synced(path: Path, table: pa.Table) -> None:
    """Write a part's bytes and fsync them, so a rename can never expose a torn file."""
    with open(path, "wb") as fh:
        pq.write_table(table, fh, compression="zstd")
        fh.flush()
        os.fsync(fh.fileno())


def commit_part(out_dir: Path, unit_id: str, table: pa.Table) -> bool:
    """Write a unit's part atomically; False when another committer got there first."""
    final = part_path(out_dir, unit_id)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{unit_id}.{uuid.uuid4().hex[:12]}.tmp"
    try:
        _write_synced(tmp, table)
        try:
            os.link(tmp, final)  # fails if the final name exists: first committer wins
        except FileExistsError:
            return False
        except OSError as exc:  # a filesystem without hard links
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
                raise
            if final.exists():
                return False
            os.replace(tmp, final)
        _fsync_dir(final.parent)
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


HISTORY_DIR = "history"


def replace_part(out_dir: Path, unit_id: str, table: pa.Table) -> None:
    """Swap a committed part for a new version (a retry of its error rows), atomically.

    The old version is kept under history/ first: nothing once committed is lost.
    """
    final = part_path(out_dir, unit_id)
    history = out_dir / HISTORY_DIR
    history.mkdir(parents=True, exist_ok=True)
    os.link(final, history / f"{unit_id}.{time.strftime('%Y%m%dT%H%M%S')}.{uuid.uuid4().hex[:6]}")
    tmp = final.parent / f".{unit_id}.{uuid.uuid4().hex[:12]}.tmp"
    try:
        _write_synced(tmp, table)
        os.replace(tmp, final)
        _fsync_dir(final.parent)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def part_error_positions(out_dir: Path, unit_id: str) -> list[int]:
    """Positions of the error rows in a committed part."""
    errors = pq.read_table(part_path(out_dir, unit_id), columns=["error"]).column("error")
    return [i for i, e in enumerate(errors.to_pylist()) if e is not None]


def error_positions(out_dir: Path) -> dict[str, list[int]]:
    """Per committed unit, the positions of its error rows (units without errors left out)."""
    found = {}
    for unit_id in sorted(committed_units(out_dir)):
        positions = part_error_positions(out_dir, unit_id)
        if positions:
            found[unit_id] = positions
    return found


def committed_units(out_dir: Path) -> set[str]:
    """Unit ids whose part is in place under its final name."""
    parts = out_dir / PARTS_DIR
    if not parts.is_dir():
        return set()
    return {p.name[: -len(".parquet")] for p in parts.glob("*.parquet")}
