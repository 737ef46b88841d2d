"""Run manifest: ties an output directory to one spec and one input, so runs are never mixed.

Written once by the first run into a directory (atomically, first writer wins) and checked by
every later run: a different spec, a changed input or another ``--limit`` is refused before any
work starts, because its parts could not be told apart from the earlier run's.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import pyarrow.parquet as pq

from batchspec import __version__
from batchspec.errors import UserError
from batchspec.io.layout import OutDir, temp_name
from batchspec.io.temps import fsync_dir, write_synced
from batchspec.spec import JobSpec
from batchspec.units import WorkUnit


def input_fingerprint(files: list[Path]) -> str:
    """Cheap identity of the input: names, sizes and Parquet footers (schema, row groups)."""
    h = hashlib.sha256()
    for path in files:
        meta = pq.ParquetFile(path).metadata
        h.update(
            f"{path.name}|{path.stat().st_size}|{meta.num_rows}|{meta.num_row_groups}|".encode()
        )
        h.update(str(meta.schema.to_arrow_schema()).encode())
        for g in range(meta.num_row_groups):
            rg = meta.row_group(g)
            h.update(f"{rg.num_rows}:{rg.total_byte_size};".encode())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class Manifest:
    spec_hash: str
    input_fingerprint: str
    limit: int | None
    num_units: int
    num_rows: int
    created: float
    version: str

    def identity(self) -> tuple[str, str, int | None]:
        return (self.spec_hash, self.input_fingerprint, self.limit)


def make_manifest(
    spec: JobSpec, files: list[Path], limit: int | None, units: list[WorkUnit]
) -> Manifest:
    return Manifest(
        spec_hash=spec.content_hash(),
        input_fingerprint=input_fingerprint(files),
        limit=limit,
        num_units=len(units),
        num_rows=sum(u.num_rows for u in units) * spec.sampling.n,  # output rows: n per input row
        created=time.time(),
        version=__version__,
    )


def read_manifest(out: OutDir) -> Manifest | None:
    path = out.manifest
    if not path.exists():
        return None
    try:
        return Manifest(**json.loads(path.read_text()))
    except (ValueError, TypeError) as exc:
        raise UserError(f"{path}: unreadable run manifest ({exc})") from None


def claim_output_dir(out: OutDir, manifest: Manifest) -> Manifest:
    """Bind ``out`` to this run, or check that it already is; returns the manifest in force."""
    out.root.mkdir(parents=True, exist_ok=True)
    path = out.manifest
    tmp = temp_name(path)
    # Synced before it is linked into place: a crash never leaves a manifest with no content.
    write_synced(tmp, (json.dumps(asdict(manifest), indent=2) + "\n").encode())
    try:
        os.link(tmp, path)  # atomic: concurrent first runs agree on one manifest
        fsync_dir(out.root)
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
    existing = read_manifest(out)
    assert existing is not None
    check_bound(out, manifest, existing)
    return existing


def _limit(limit: int | None) -> str:
    return "no --limit" if limit is None else f"--limit {limit}"


def check_bound(out: OutDir, manifest: Manifest, existing: Manifest | None = None) -> None:
    """Refuse a run whose spec, input or ``--limit`` differ from the run ``out`` is bound to
    (``existing``, else its manifest if any); reads only, so ``validate`` checks it too."""
    existing = existing or read_manifest(out)
    if existing is None or existing.identity() == manifest.identity():
        return
    what = []
    if existing.spec_hash != manifest.spec_hash:
        what.append("a different job spec")
    if existing.input_fingerprint != manifest.input_fingerprint:
        what.append("a different input")
    if existing.limit != manifest.limit:
        what.append(f"{_limit(existing.limit)} (this run: {_limit(manifest.limit)})")
    raise UserError(
        f"{out}: holds a run with {' and '.join(what)}; refusing to mix them "
        "(write elsewhere with --output DIR)"
    )
