"""Tuning files (``OUT/tuning.json``): what ``batchspec tune`` measured, as types.

``tune`` (``measure.tune``) writes one; a run's K controller starts from its observations
(``policy``), ``speculative.engine: auto`` takes its engine from its route (``route``), and
``report`` shows what the controller makes of it. Every reader goes through ``read_tuning``,
which checks the file's version and shape and refuses a bad, older or newer file in one line
naming it; ``write_tuning`` is the one writer.

On disk it is JSON, as ``tune`` has written it since tuning files recorded engines (K keys of
the per-K figures are strings there, JSON's only keys), plus ``version``: files written before
that field existed are version 1. A change of the format bumps ``TUNING_VERSION``; files of
another version are refused with a clear message, never half-read.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from batchspec.errors import UserError
from batchspec.io.layout import OutDir
from batchspec.spec import JobSpec
from batchspec.spec.tree import AUTO, VLLM, EngineName, engines_of
from batchspec.speculation.estimator import Observation

TUNING_VERSION = 1
"""The format ``write_tuning`` writes and ``read_tuning`` reads."""
AGAIN = ": run batchspec tune again, or remove the file"


class DomainTuning(BaseModel):
    """One domain at one batch size on one engine: the K the controller chose from the sweep,
    and a full batch's output tokens/s at each K measured (the rows' rate x batch)."""

    chosen_k: int
    best_measured_k: int | None = None
    alpha: float | None = None
    alpha_std: float | None = None
    tokens_per_s: dict[int, float]
    noise_tokens_per_s: dict[int, float] = Field(default_factory=dict)
    """Standard error of each ``tokens_per_s`` figure (none: no noise known)."""
    wall_tokens_per_s: dict[int, float] = Field(default_factory=dict)
    """What the sample made per wall second (for the table ``tune`` prints)."""


class BatchTuning(BaseModel):
    """One batch size on one engine: every domain's figures and the observations behind them
    (what a run's controller loads)."""

    batch: int
    domains: dict[str, DomainTuning] = Field(default_factory=dict)
    """By domain as a string (``"None"``: rows without a domain); none in files made by hand,
    which then route on nothing."""
    observations: list[Observation]


class EngineTuning(BaseModel):
    """One engine's sweep: the K grid, each batch size's measurements, its start time."""

    k_grid: list[int]
    sample_rows: dict[int, int] = Field(default_factory=dict)
    """Rows per domain and K measured at each batch size."""
    batches: list[BatchTuning]
    engine_build_s: float | None = None
    """Mean engine start of the sweep: what a run's controller weighs a switch of K against
    (None: not measured, so the first engine of a run measures it)."""

    def at(self, batch: int) -> BatchTuning | None:
        """The measurements at this batch size, if it was swept."""
        return next((b for b in self.batches if b.batch == batch), None)


class RouteEntry(BaseModel):
    """``engine: auto`` at one batch size: each engine's predicted tokens/s for the job's
    rows, its standard error, and the engine chosen."""

    batch: int
    engine: EngineName
    tokens_per_s: dict[EngineName, float] = Field(default_factory=dict)
    noise: dict[EngineName, float] = Field(default_factory=dict)


class TuningFile(BaseModel):
    """A whole tuning file: what it was measured for (``identity``) and each engine's sweep."""

    version: int = TUNING_VERSION
    method: str | None = None
    identity: dict[str, Any] = Field(default_factory=dict)
    """Spec keys the measurements depend on, by dotted name (``tuning_identity``)."""
    spec_hash: str | None = None
    created: float | None = None
    engines: dict[EngineName, EngineTuning]
    route: list[RouteEntry] | None = None
    """Only for a job with ``speculative.engine: auto``."""

    def observations(self, batch: int, engine: str) -> list[Observation]:
        """The sweep's observations on this engine at this batch size (none if not swept)."""
        tuned = self.engines.get(engine)  # type: ignore[call-overload]
        entry = tuned.at(batch) if tuned is not None else None
        return list(entry.observations) if entry is not None else []


def write_tuning(path: Path, tuning: TuningFile) -> None:
    """The file written whole under a temporary name, then renamed: readers never see half."""
    data = tuning.model_dump(mode="json")
    if data["route"] is None:
        del data["route"]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def read_tuning(path: Path) -> TuningFile | None:
    """The tuning file at ``path``, checked; None when there is none. One that batchspec
    cannot use (unreadable, not JSON, another shape, from an older or a newer batchspec) is a
    one-line ``UserError`` naming it."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UserError(f"{path}: cannot read the tuning file ({exc.strerror})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not a tuning file (not JSON: {exc.msg}){AGAIN}") from None
    if not isinstance(data, dict) or "engines" not in data:
        raise UserError(f"{path}: made by an older batchspec tune (no engines recorded){AGAIN}")
    version = data.get("version", 1)
    if version != TUNING_VERSION:
        newer = isinstance(version, int) and version > TUNING_VERSION
        raise UserError(
            f"{path}: tuning file version {version!r}"
            + (", made by a newer batchspec" if newer else "")
            + f"; this batchspec reads version {TUNING_VERSION}{AGAIN}"
        )
    try:
        return TuningFile.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise UserError(f"{path}: not a tuning file ({where}: {first['msg']}){AGAIN}") from None


def tuning_identity(spec: JobSpec) -> dict[str, Any]:
    """What a tuning file's measurements depend on, by spec key: the target, the draft and
    its method, the tree settings of a job that may run on the tree engine, the dtype and the
    sampling (acceptance and step cost change with each; the sampling seed changes no
    distribution and is left out). ``batchspec tune`` writes it."""
    s = spec.speculative
    identity = {
        "model.model": spec.model.model,
        "model.dtype": spec.model.dtype,
        "speculative.method": s.method,
        "speculative.model": s.model,
    }
    if s.engine != VLLM and s.tree is not None:
        identity["speculative.tree"] = s.tree.model_dump(mode="json")
    for key, value in spec.sampling.model_dump().items():
        if key != "seed":
            identity[f"sampling.{key}"] = value
    return json.loads(json.dumps(identity))  # as read back from the file


def check_tuning(tuning: TuningFile, spec: JobSpec, path: Path) -> None:
    """Refuse a tuning file measured for another job: its K would be chosen from the wrong
    engine's, model's, draft's or sampling's acceptance and costs, silently."""
    missing = [e for e in engines_of(spec.speculative.engine) if e not in tuning.engines]
    if missing:
        raise UserError(
            f"{path}: measured on the {', '.join(sorted(tuning.engines))} engine, the job runs "
            f"on {' and '.join(missing)} (speculative.engine){AGAIN}"
        )
    made = tuning.identity
    for key, value in tuning_identity(spec).items():
        if key not in made:
            raise UserError(f"{path}: does not say which {key} it was measured with{AGAIN}")
        if made[key] != value:
            raise UserError(
                f"{path}: measured with {key}={made[key]!r}, the job has {value!r}{AGAIN}"
            )


def job_tuning(spec: JobSpec, out: OutDir) -> TuningFile | None:
    """The output directory's tuning file when the job's K is adaptive or its engine is
    routed (``auto``), refused (UserError) when it was measured for another job; None
    without one."""
    s = spec.speculative
    if not (s.adaptive and s.method != "none") and s.engine != AUTO:
        return None
    tuning = read_tuning(out.tuning)
    if tuning is not None:
        check_tuning(tuning, spec, out.tuning)
    return tuning
