"""Measurements that outlive a worker: the run's shared per-unit stats, and tuning files.

Every worker appends one observation per committed unit to ``stats/<worker>.jsonl`` and reads
the others' new lines, so every K controller of a run learns from every unit. ``batchspec
tune`` writes ``tuning.json``, which a run loads first.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from batchspec.errors import UserError
from batchspec.io.layout import OutDir
from batchspec.spec import JobSpec
from batchspec.speculation.estimator import Observation


class SharedStats:
    """Observations shared through ``OUT/stats/<worker>.jsonl`` (append-only, one per unit)."""

    def __init__(self, out: OutDir, worker: str):
        self.dir = out.stats
        self.path = out.stats_file(worker)
        self._offsets: dict[Path, int] = {}

    def append(self, ob: Observation) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as fh:
            fh.write(json.dumps(asdict(ob)) + "\n")
        # Our own lines are added to the controller directly: skip them when reading.
        self._offsets[self.path] = self.path.stat().st_size

    def read_new(self) -> list[Observation]:
        """Observations appended by any worker since the last call (whole lines only)."""
        found: list[Observation] = []
        if not self.dir.is_dir():
            return found
        for path in sorted(self.dir.glob("*.jsonl")):
            start = self._offsets.get(path, 0)
            with open(path, "rb") as fh:
                fh.seek(start)
                data = fh.read()
            end = data.rfind(b"\n") + 1
            for line in data[:end].splitlines():
                if line.strip():
                    found.append(Observation(**json.loads(line)))
            self._offsets[path] = start + end
        return found


def write_tuning(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def read_tuning(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


ENGINES = ("vllm", "tree")


def job_engines(spec: JobSpec) -> list[str]:
    """The engines a job may run on: both with ``speculative.engine: auto``, else its own."""
    engine = spec.speculative.engine
    return list(ENGINES) if engine == "auto" else [engine]


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
    if s.engine != "vllm" and s.tree is not None:
        identity["speculative.tree"] = s.tree.model_dump(mode="json")
    for key, value in spec.sampling.model_dump().items():
        if key != "seed":
            identity[f"sampling.{key}"] = value
    return json.loads(json.dumps(identity))  # as read back from the file


def check_tuning(tuning: dict[str, Any], spec: JobSpec, path: Path) -> None:
    """Refuse a tuning file measured for another job: its K would be chosen from the wrong
    engine's, model's, draft's or sampling's acceptance and costs, silently."""
    made = tuning.get("identity", {})
    engines = tuning.get("engines")
    if engines is None:
        raise UserError(
            f"{path}: made by an older batchspec tune (no engines recorded): run batchspec "
            "tune again, or remove the file"
        )
    missing = [e for e in job_engines(spec) if e not in engines]
    if missing:
        raise UserError(
            f"{path}: measured on the {', '.join(sorted(engines))} engine, the job runs on "
            f"{' and '.join(missing)} (speculative.engine): run batchspec tune again, or "
            "remove the file"
        )
    for key, value in tuning_identity(spec).items():
        if key not in made:
            raise UserError(
                f"{path}: does not say which {key} it was measured with: run batchspec tune "
                "again, or remove the file"
            )
        if made[key] != value:
            raise UserError(
                f"{path}: measured with {key}={made[key]!r}, the job has {value!r}: run "
                "batchspec tune again, or remove the file"
            )


def job_tuning(spec: JobSpec, out: OutDir) -> dict[str, Any] | None:
    """The output directory's tuning file when the job's K is adaptive or its engine is
    routed (``auto``), refused (UserError) when it was measured for another job; None
    without one."""
    s = spec.speculative
    if not (s.adaptive and s.method != "none") and s.engine != "auto":
        return None
    tuning = read_tuning(out.tuning)
    if tuning is not None:
        check_tuning(tuning, spec, out.tuning)
    return tuning


def tuning_observations(tuning: dict[str, Any], batch: int, engine: str) -> list[dict[str, Any]]:
    """The tuning sweep's observations on this engine at this batch size (none if it was not
    swept)."""
    for entry in tuning.get("engines", {}).get(engine, {}).get("batches", []):
        if entry["batch"] == batch:
            return entry["observations"]
    return []
