"""Profiled step costs as the run used them, kept in the output directory for reports.

On the tree engine the K controller prices every K by the engine's step profile
(``engines/tree/profile.py``), which only a process with the model can measure. So each
worker writes the seconds per step it priced K with (``OUT/stats/steps-<worker>.json``,
rewritten as real steps refine them), and ``report`` and ``status`` price K as the run did.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from batchspec.io.layout import OutDir


def steps_path(out: OutDir, worker: str) -> Path:
    return out.stats / f"steps-{worker}.json"


def write_step_costs(
    out: OutDir, worker: str, engine: str, batch: int, seconds: dict[int, float]
) -> None:
    """This worker's seconds per step by K at ``batch`` on ``engine`` (atomic rewrite)."""
    out.stats.mkdir(parents=True, exist_ok=True)
    path = steps_path(out, worker)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    data = {"engine": engine, "batch": batch, "seconds": [[k, s] for k, s in seconds.items()]}
    tmp.write_text(json.dumps(data) + "\n")
    os.replace(tmp, path)


def read_step_costs(out: OutDir, engine: str | None, batch: int) -> Callable[[int], float] | None:
    """Seconds per step at any K, interpolated from the newest worker's file for this engine
    and batch size; None when no worker priced K by a profile."""
    if not out.stats.is_dir():
        return None
    found = []
    for path in out.stats.glob("steps-*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being rewritten, or not ours
        if data.get("engine") == engine and data.get("batch") == batch and data.get("seconds"):
            found.append((path.stat().st_mtime, sorted(data["seconds"])))
    if not found:
        return None
    pairs = max(found)[1]
    ks, secs = [float(k) for k, _ in pairs], [float(s) for _, s in pairs]
    return lambda k: float(np.interp(k, ks, secs))
