"""Run manifest: ties an output directory to one spec and one input, so runs are never mixed.

Written once by the first run into a directory (atomically, first writer wins) and checked by
every later run: a different spec, a changed input or another ``--limit`` is refused before any
work starts, because its parts could not be told apart from the earlier run's.

It also records what every reader and writer of the directory must agree on, so that none
decides it alone: how unit ids are formed (``unit_ids``), where parts go (``parts_layout``),
and the spec's hashed keys (``spec``, so that a refusal names the keys that differ). A manifest
without them was written before them (legacy) and keeps its old rules. A batchspec older than
these keys refuses a directory that has them: its ``Manifest(**json)`` raises on an unknown key,
which it reports as "unreadable run manifest" (exit 2) before it writes anything.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from batchspec import __version__
from batchspec.errors import UserError
from batchspec.io.layout import FANOUT, FLAT, OutDir, layout_for
from batchspec.io.planner import check_unique_ids
from batchspec.io.temps import fsync_dir, temp_name, write_synced
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


UNIT_IDS = "domain-index"
"""How the units of a directory are named: by their domain's index in the plan, unique by
construction (``WorkUnit.unit_id``). A manifest without ``unit_ids`` is legacy: its parts carry
ids of a slug and 24 bits of a hash, which it keeps (``Manifest.named_units``)."""
LEGACY = {"unit_ids": None, "parts_layout": None, "spec": None}
"""What a manifest written before these keys means by their absence."""


@dataclass(frozen=True)
class Manifest:
    spec_hash: str
    input_fingerprint: str
    limit: int | None
    num_units: int
    num_rows: int
    created: float
    version: str
    unit_ids: str | None = UNIT_IDS
    parts_layout: str | None = FLAT
    """``layout.FLAT`` or ``layout.FANOUT``: read by every ``OutDir``, never probed."""
    spec: dict[str, Any] | None = None
    """The spec's hashed keys (``JobSpec.hashed_content``): a refused run names what differs."""

    def identity(self) -> tuple[str, str, int | None]:
        return (self.spec_hash, self.input_fingerprint, self.limit)

    def named_units(self, out: OutDir, units: list[WorkUnit]) -> list[WorkUnit]:
        """The plan's units with the ids the parts of ``out`` (bound by this manifest) carry:
        the planner's, or in a legacy directory the legacy ids, refused in one line if two
        units share one (a resume would take the first one's part for the second's)."""
        if self.unit_ids is not None:
            return units
        legacy = [
            WorkUnit(u.file_index, u.path, u.start, u.stop, u.domain, u.num_rows) for u in units
        ]
        check_unique_ids(
            legacy,
            f"{out}: written by batchspec {self.version}, whose unit ids can collide",
            "resuming would lose one unit's rows; run into a new directory (--output DIR)",
        )
        return legacy


_TYPES: dict[str, tuple[type, ...]] = {
    "spec_hash": (str,),
    "input_fingerprint": (str,),
    "limit": (int, type(None)),
    "num_units": (int,),
    "num_rows": (int,),
    "created": (int, float),
    "version": (str,),
    "unit_ids": (str, type(None)),
    "parts_layout": (str, type(None)),
    "spec": (dict, type(None)),
}
_KNOWN = {"unit_ids": (UNIT_IDS, None), "parts_layout": (FLAT, FANOUT, None)}


def make_manifest(
    spec: JobSpec, files: list[Path], limit: int | None, units: list[WorkUnit]
) -> Manifest:
    """This run's manifest: what binds a new directory, its parts layout chosen by the run's
    size here, once (every worker of a run computes the same)."""
    return Manifest(
        spec_hash=spec.content_hash(),
        input_fingerprint=input_fingerprint(files),
        limit=limit,
        num_units=len(units),
        num_rows=sum(u.num_rows for u in units) * spec.sampling.n,  # output rows: n per input row
        created=time.time(),
        version=__version__,
        parts_layout=layout_for(len(units)),
        spec=spec.hashed_content(),
    )


def read_manifest(out: OutDir) -> Manifest | None:
    """The directory's manifest; None if there is none. One that is empty, truncated, of the
    wrong shape or of a newer batchspec is refused in one line (UserError, exit 2) by every
    command: the directory's binding is unknown then."""
    path = out.manifest
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:  # unreadable, not UTF-8
        raise UserError(f"{path}: unreadable run manifest ({exc})") from None
    try:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise TypeError(f"a JSON {type(data).__name__}, not an object")
        manifest = Manifest(**{**LEGACY, **data})  # an unknown key: TypeError
    except (ValueError, TypeError) as exc:
        why = "empty" if not text.strip() else str(exc)
        raise UserError(f"{path}: unreadable run manifest ({why})") from None
    for key, types in _TYPES.items():
        value = getattr(manifest, key)
        if not isinstance(value, types) or value not in _KNOWN.get(key, (value,)):
            raise UserError(f"{path}: unreadable run manifest ({key} is {value!r})")
    return manifest


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
    if existing.parts_layout is None:
        out.choose_layout(existing.num_units)  # legacy: the first run's choice, as before
    stray = out.stray_parts()
    if stray:
        print(
            f"batchspec: warning: {out.parts}: {len(stray)} part(s) outside the directory's "
            f"{existing.parts_layout} layout (e.g. {stray[0].name}) are ignored (never read); "
            "their units are generated in place",
            file=sys.stderr,
        )
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
        changes = spec_changes(recorded_spec(out, existing), manifest.spec)
        what.append("a different job spec" + (f" ({changes})" if changes else ""))
    if existing.input_fingerprint != manifest.input_fingerprint:
        what.append("a different input")
    if existing.limit != manifest.limit:
        what.append(f"{_limit(existing.limit)} (this run: {_limit(manifest.limit)})")
    raise UserError(
        f"{out}: holds a run with {' and '.join(what)}; refusing to mix them "
        "(write elsewhere with --output DIR)"
    )


def recorded_spec(out: OutDir, manifest: Manifest) -> dict[str, Any] | None:
    """The hashed keys of the spec ``out`` is bound to: the manifest's; in a legacy one, those
    of the last run's spec (``job.json``) if they hash to the manifest's spec hash."""
    if manifest.spec is not None:
        return manifest.spec
    try:
        job = json.loads(out.job_record.read_text())
        spec = JobSpec.model_validate({**job["spec"], "base_dir": job.get("base_dir", ".")})
    except (OSError, ValueError, TypeError, KeyError):  # pydantic's errors are ValueErrors
        return None
    return spec.hashed_content() if spec.content_hash() == manifest.spec_hash else None


def _flat(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested sections as dotted keys: ``{"sampling": {"n": 2}}`` -> ``{"sampling.n": 2}``."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


_UNSET = object()
"""A key one side's spec lacks (a key added or removed between versions)."""


def _shown(value: Any) -> str:
    if value is _UNSET:
        return "unset"
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def spec_changes(old: dict[str, Any] | None, new: dict[str, Any] | None, most: int = 3) -> str:
    """The hashed keys that differ, ``key: old -> new``, the first ``most`` then "and N more";
    empty where either side is unknown (a legacy manifest without a matching job.json)."""
    if old is None or new is None:
        return ""
    a, b = _flat(old), _flat(new)
    keys = sorted(k for k in a.keys() | b.keys() if a.get(k, _UNSET) != b.get(k, _UNSET))
    shown = [f"{k}: {_shown(a.get(k, _UNSET))} -> {_shown(b.get(k, _UNSET))}" for k in keys]
    more = f", and {len(keys) - most} more" if len(keys) > most else ""
    return ", ".join(shown[:most]) + more
