"""The run as ``export`` finds it: the job record (``OUT/job.json``) read and checked, the
run's units planned again from its input, and whether they are all committed.

The job record is written by every run (``work.runlog.write_job_record``), but it is a file
in a shared folder that a person, a copy or a full disk can damage: it is refused in one
line naming it, and what export and the dataset card read of it is checked first, so that a
record of the wrong shape is not a ``KeyError`` halfway through writing the dataset.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from batchspec.errors import UserError
from batchspec.io.layout import OutDir
from batchspec.io.manifest import input_fingerprint, read_manifest
from batchspec.io.planner import plan_units
from batchspec.units import WorkUnit

_ANY = object()
"""Any value: the key must be there."""
RECORD_KEYS: dict[tuple[str, ...], Any] = {
    ("input_files",): list,
    ("limit",): (int, type(None)),
    ("spec", "input", "id_column"): str,
    ("spec", "input", "domain_column"): (str, type(None)),
    ("spec", "output", "unit_rows"): int,
    ("spec", "model", "model"): _ANY,
    ("spec", "model", "dtype"): _ANY,
    ("spec", "model", "max_num_seqs"): _ANY,
    ("spec", "speculative", "method"): _ANY,
    ("spec", "speculative", "num_speculative_tokens"): _ANY,
    ("spec", "sampling", "temperature"): _ANY,
    ("spec", "sampling", "max_tokens"): _ANY,
}
"""What export and the dataset card read of the record, and the type each must have."""


def _check_record(path: Path, record: Any) -> None:
    """Every key of ``RECORD_KEYS`` present with its type, else a ``UserError`` naming it."""
    for keys, kind in RECORD_KEYS.items():
        value = record
        for i, key in enumerate(keys):
            if not isinstance(value, dict) or key not in value:
                where = ".".join(keys[: i + 1])
                raise UserError(f"{path}: not a job record of batchspec run ({where} missing)")
            value = value[key]
        if kind is not _ANY and (not isinstance(value, kind) or isinstance(value, bool)):
            raise UserError(f"{path}: {'.'.join(keys)} is {value!r}; expected {_name(kind)}")
    files = record["input_files"]
    if not files or not all(isinstance(f, str) for f in files):
        raise UserError(f"{path}: input_files is {files!r}, not a list of paths")


def _name(kind: Any) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join("null" if k is type(None) else k.__name__ for k in kinds)


def load_job_record(out: OutDir) -> dict[str, Any]:
    """``OUT/job.json``, checked (``RECORD_KEYS``); missing or damaged: a ``UserError``."""
    path = out.job_record
    rerun = "run `batchspec run JOB --output OUT` once (a finished run only records the job)"
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(
            f"{path}: missing (written by batchspec run since this version); {rerun}"
        ) from None
    except (OSError, ValueError) as exc:  # unreadable, not UTF-8, not JSON
        raise UserError(f"{path}: not a readable job record ({exc}); {rerun}") from None
    _check_record(path, record)
    return record


def planned_units(out: OutDir, job: dict[str, Any]) -> list[WorkUnit]:
    """The run's units, planned again from its input; refused if the input changed."""
    manifest = read_manifest(out)
    if manifest is None:
        raise UserError(f"{out}: no batchspec run here (no manifest.json)")
    files = [Path(f) for f in job["input_files"]]
    for f in files:
        if not f.exists():
            raise UserError(f"{f}: input file of this run is gone; export needs it for the order")
    if input_fingerprint(files) != manifest.input_fingerprint:
        raise UserError(f"{files[0].parent}: the input changed since the run; refusing to export")
    spec = job["spec"]
    units = plan_units(
        files, spec["output"]["unit_rows"], spec["input"]["domain_column"], job["limit"]
    )
    if len(units) != manifest.num_units:
        raise UserError(f"{out}: {len(units)} units planned now, the run had {manifest.num_units}")
    return manifest.named_units(out, units)  # a legacy directory: the ids its parts carry


def check_finished(out: OutDir, units: list[WorkUnit], allow_unfinished: bool) -> None:
    """Every unit committed, unless ``allow_unfinished`` (``--allow-unfinished``)."""
    done = out.committed_units()
    missing = [u for u in units if u.unit_id not in done]
    if missing and not allow_unfinished:
        rows = sum(u.num_rows for u in missing)
        raise UserError(
            f"{out}: unfinished run: {len(units) - len(missing)} of {len(units)} units committed "
            f"({rows} rows missing); finish it with batchspec run, or pass --allow-unfinished"
        )
