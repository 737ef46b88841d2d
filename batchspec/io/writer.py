"""Output: the row schema, and part files committed atomically, one per work unit.

A part is written under a temporary name, fsynced, then linked to its final name; the link
fails if the final name exists, so the first committer of a unit wins and a late duplicate is
discarded. A reader therefore never sees a half-written part, and no unit is counted twice.
Where the filesystem has no hard links, a rename that refuses to replace does the same
(``temps.link_new``); a filesystem with neither is refused before any work.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
import uuid
from enum import Enum
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from batchspec.io.layout import OutDir
from batchspec.io.temps import fsync_dir, link_new, temp_name
from batchspec.units import RowResult, SpecStats, UnitResult

# Columns every output has after id, domain and the pass-through columns (README: Output schema).
LOGPROBS_TYPE = pa.list_(
    pa.list_(pa.struct([pa.field("token_id", pa.int32()), pa.field("logprob", pa.float32())]))
)
"""Per position, the generated (or prompt) token's log-probability first, then the top k."""
RESULT_FIELDS: list[pa.Field] = [
    pa.field("sample_index", pa.int32()),
    pa.field("generated_text", pa.string()),
    pa.field("num_prompt_tokens", pa.int32()),
    pa.field("num_output_tokens", pa.int32()),
    pa.field("finish_reason", pa.string()),
    pa.field("engine", pa.string()),
    pa.field("spec_method", pa.string()),
    pa.field("num_speculative_tokens", pa.int32()),
    pa.field("num_spec_steps", pa.int32()),
    pa.field("num_draft_tokens", pa.int32()),
    pa.field("num_accepted_tokens", pa.int32()),
    pa.field("acceptance_rate", pa.float64()),
    pa.field("mean_acceptance_length", pa.float64()),
    pa.field("acceptance_histogram", pa.list_(pa.int32())),
    pa.field("replayed_k", pa.list_(pa.int32())),
    pa.field("replayed_accepted", pa.list_(pa.int32())),
    pa.field("logprobs", LOGPROBS_TYPE),
    pa.field("prompt_logprobs", LOGPROBS_TYPE),
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


def _speculative(spec: SpecStats | None, method: str, k: int) -> dict[str, Any]:
    """Speculative columns: what was measured, or nulls where nothing was speculated."""
    cols: dict[str, Any] = {"spec_method": method, "num_speculative_tokens": k}
    if spec is None or k == 0:
        return cols
    cols.update(
        num_spec_steps=spec.steps,
        num_draft_tokens=spec.drafted,
        num_accepted_tokens=spec.accepted,
        # Undefined when nothing was drafted (n-gram found no match): null, not a made-up 0.
        acceptance_rate=spec.acceptance_rate,
        mean_acceptance_length=spec.mean_acceptance_length,
        acceptance_histogram=list(spec.histogram),
    )
    return cols


def result_row(r: RowResult, unit_id: str, result: UnitResult) -> dict[str, Any]:
    """One output row of ``result``'s unit ``unit_id``."""
    req = r.request
    row: dict[str, Any] = {"id": req.row_id, "domain": req.domain, **req.passthrough}
    row["unit_id"] = unit_id
    row["sample_index"] = req.sample_index
    # A row whose prompt failed (null, malformed, too long) never reached an engine: null.
    row["engine"] = result.engine if req.error is None else None
    if r.error is not None:
        # Nothing was generated: every generation column stays null.
        row["error"] = r.error
        return row
    row.update(_speculative(r.spec, result.method, result.k))
    row.update(
        generated_text=r.text,
        num_prompt_tokens=r.num_prompt_tokens,
        num_output_tokens=r.num_output_tokens,
        finish_reason=r.finish_reason,
        **_timing(r.timing, r.num_output_tokens),
    )
    if r.replayed is not None:  # speculation/replay.py: accepted drafts per K of the grid
        row["replayed_k"], row["replayed_accepted"] = list(r.replayed), list(r.replayed.values())
    if r.top_logprobs is not None and r.token_ids is not None:
        row["logprobs"] = logprob_lists(r.top_logprobs, r.token_ids)
    if r.prompt_logprobs is not None and req.prompt_token_ids is not None:
        row["prompt_logprobs"] = logprob_lists(r.prompt_logprobs, req.prompt_token_ids)
    return row


def logprob_lists(per_pos: list[dict[int, float]], chosen: list[int]) -> list[list[dict]]:
    """Each position's ``{token: logprob}`` as the column's list: the position's own token
    first (where the engine reported it), then the others by log-probability, best first;
    the same order whichever engine made them."""
    out = []
    for tops, tok in zip(per_pos, chosen, strict=False):
        rest = sorted((t for t in tops if t != tok), key=lambda t: -tops[t])
        first = [tok] if tok in tops else []
        out.append([{"token_id": t, "logprob": tops[t]} for t in first + rest])
    return out


def unit_table(result: UnitResult, schema: pa.Schema) -> pa.Table:
    unit_id = result.unit_requests.unit.unit_id
    rows = [result_row(r, unit_id, result) for r in result.results]
    return pa.Table.from_pylist(rows, schema=schema)


def _write_synced(path: Path, table: pa.Table) -> None:
    """Write a part's bytes and fsync them, so a rename can never expose a torn file."""
    with open(path, "wb") as fh:
        pq.write_table(table, fh, compression="zstd")
        fh.flush()
        os.fsync(fh.fileno())


class Commit(Enum):
    """What became of a unit's rows at commit."""

    COMMITTED = "committed"
    """The unit's part is in place: this writer put it there."""
    DISCARDED = "discarded"
    """Another committer got there first; this copy was dropped (exactly-once)."""
    REPLACED = "replaced"
    """A retry of error rows: the part was swapped for one with the new rows in their places."""


class PartWriter:
    """Commits units' rows as parts of one output directory, with one schema.

    The only code that writes ``parts/``: a first commit links a synced temporary file to the
    final name (first committer wins); a retry of error rows merges the new rows into the
    committed part and swaps it in, keeping the old version under ``history/``.
    """

    def __init__(self, out: OutDir, schema: pa.Schema):
        self.out = out
        self.schema = schema

    def commit(self, result: UnitResult) -> tuple[Commit, pa.Table]:
        """Write a unit's results; returns what happened and the rows as written for it."""
        unit_id = result.unit.unit_id
        table = unit_table(result, self.schema)
        positions = result.unit_requests.positions
        if positions is None:
            done = self._link_new(unit_id, table)
            return (Commit.COMMITTED if done else Commit.DISCARDED), table
        # A retry of error rows: the new rows take the old ones' places, the rest stays.
        rows = pq.read_table(self.out.part(unit_id)).to_pylist()
        for pos, row in zip(positions, table.to_pylist(), strict=True):
            rows[pos] = row
        self._replace(unit_id, pa.Table.from_pylist(rows, schema=self.schema))
        return Commit.REPLACED, table

    def _tmp(self, unit_id: str) -> Path:
        return temp_name(self.out.part(unit_id))

    def _link_new(self, unit_id: str, table: pa.Table) -> bool:
        """Write a unit's part atomically; False when another committer got there first."""
        final = self.out.part(unit_id)
        tmp = self._tmp(unit_id)
        try:
            try:
                _write_synced(tmp, table)
            except FileNotFoundError:  # its directory's first part: made then, not per commit
                final.parent.mkdir(parents=True, exist_ok=True)
                _write_synced(tmp, table)
            if not link_new(tmp, final):  # first committer wins, on any filesystem
                return False
            fsync_dir(final.parent)
            return True
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()

    def _replace(self, unit_id: str, table: pa.Table) -> None:
        """Swap a committed part for a new version, atomically; the old one goes to history/
        first, so nothing once committed is lost."""
        final = self.out.part(unit_id)
        self.out.history.mkdir(parents=True, exist_ok=True)
        stamp = f"{time.strftime('%Y%m%dT%H%M%S')}.{uuid.uuid4().hex[:6]}"
        kept = self.out.history / f"{unit_id}.{stamp}"
        try:
            os.link(final, kept)
        except OSError:  # a filesystem without hard links: a copy, made before the swap
            shutil.copyfile(final, kept)
        tmp = self._tmp(unit_id)
        try:
            _write_synced(tmp, table)
            os.replace(tmp, final)
            fsync_dir(final.parent)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()


def part_error_positions(out: OutDir, unit_id: str) -> list[int]:
    """Positions of the error rows in a committed part."""
    errors = pq.read_table(out.part(unit_id), columns=["error"]).column("error")
    return [i for i, e in enumerate(errors.to_pylist()) if e is not None]


def units_with_errors(out: OutDir) -> set[str]:
    """Committed units that hold error rows (what --retry-errors generates again)."""
    return {u for u in sorted(out.committed_units()) if part_error_positions(out, u)}
