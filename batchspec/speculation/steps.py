"""Step costs as the run used them, kept in the output directory for reports.

The K controller prices every K by the engine's step profile (the tree engine's,
``engines/tree/profile.py``) or by vLLM's fit of its own steps (``engines/vllm_steps.py``),
which only a process with the engine can measure. So each
worker writes the seconds per step it priced K with (``OUT/stats/steps-<worker>.json``,
rewritten as real steps correct them), and ``report`` and ``status`` price K as the run did.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from batchspec.engines.tree.drafted import seconds_drafted
from batchspec.engines.vllm_steps import FEATURES, decode_step_seconds
from batchspec.io.layout import OutDir
from batchspec.spec.tree import TREE


def steps_path(out: OutDir, worker: str) -> Path:
    return out.stats / f"steps-{worker}.json"


def write_step_costs(
    out: OutDir,
    worker: str,
    engine: str,
    batch: int,
    seconds: dict[int, float],
    fit: dict[str, Any] | None = None,
    drafting: dict[str, float] | None = None,
) -> None:
    """This worker's seconds per step by K at ``batch`` on ``engine`` (atomic rewrite; K not
    priced yet left out), and what they come from: on vLLM the fit of its steps
    (``engines.vllm_steps``), on the tree engine its profile's check against the run's steps
    (``engines.tree.step_check``, ``"kind": "tree-profile"``); ``drafting``: each drafter's
    measured seconds per row and step (``engines.tree.multi.DraftCosts``), of which the job's
    method's is in ``seconds`` at K > 0."""
    out.stats.mkdir(parents=True, exist_ok=True)
    path = steps_path(out, worker)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    priced = [[k, s] for k, s in seconds.items() if s == s]
    data: dict[str, Any] = {"engine": engine, "batch": batch, "seconds": priced}
    if fit is not None:
        data["fit"] = fit
    if drafting:
        data["drafting"] = drafting
    tmp.write_text(json.dumps(data) + "\n")
    os.replace(tmp, path)


def _step_files(out: OutDir) -> Iterator[tuple[float, dict[str, Any]]]:
    """(modification time, content) of every worker's step file that reads as a JSON object;
    one being rewritten, or not ours, is passed over."""
    if not out.stats.is_dir():
        return
    for path in out.stats.glob("steps-*.json"):
        try:
            data, mtime = json.loads(path.read_text()), path.stat().st_mtime
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            yield mtime, data


def read_step_costs(out: OutDir, engine: str | None, batch: int) -> Callable[[int], float] | None:
    """Seconds per step at any K, interpolated from the newest worker's file for this engine
    and batch size; None when no worker priced K by a profile."""
    found = [
        (mtime, sorted(data["seconds"]))
        for mtime, data in _step_files(out)
        if data.get("engine") == engine and data.get("batch") == batch and data.get("seconds")
    ]
    if not found:
        return None
    pairs = max(found)[1]
    ks, secs = [float(k) for k, _ in pairs], [float(s) for _, s in pairs]
    return lambda k: float(np.interp(k, ks, secs))


def read_drafting(out: OutDir, engine: str | None, batch: int) -> dict[str, float]:
    """Each drafter's drafting seconds per row and step as the newest worker's file for this
    engine and batch size has them (``write_step_costs``); empty where none does."""
    found = [
        (mtime, data["drafting"])
        for mtime, data in _step_files(out)
        if data.get("engine") == engine
        and data.get("batch") == batch
        and isinstance(data.get("drafting"), dict)
    ]
    return {str(d): float(s) for d, s in max(found, key=lambda f: f[0])[1].items()} if found else {}


def read_fill_cost(
    out: OutDir, engine: str | None, batch: int
) -> Callable[[int, float], float] | None:
    """A step at K with rows drafting a share of K each (``Controller.fill_cost``), from the
    newest worker's account at this batch size: vLLM's fit, or the tree engine's prices by
    node count; None without either (older runs, another batch size)."""
    found = read_step_fit(out)
    if found is None or found[0] != batch:
        return None
    if engine == TREE:
        return _tree_fill_cost(out, batch, found[1])
    if engine != "vllm":
        return None
    given = found[1].get("coefficients")
    if not isinstance(given, dict) or set(given) != set(FEATURES):
        return None
    coef = np.array([float(given[f]) for f in FEATURES])
    rows = float(found[1].get("rows", batch))  # the rows the run's steps carried
    return lambda k, fill: decode_step_seconds(coef, rows, k, fill * k)


def _tree_fill_cost(
    out: OutDir, batch: int, check: dict[str, Any]
) -> Callable[[int, float], float] | None:
    """The tree engine's step at K at a domain's drafted nodes, as the worker priced it
    (``StepProfile.seconds_at``): its seconds at each node count (``by_nodes``, corrected by
    the run's steps) at the trees' mean (packed forwards) or the widest tree's bound, plus
    what the step file's seconds at K hold beyond the forward at K nodes: the job's method's
    drafting."""
    table, step = check.get("by_nodes"), read_step_costs(out, TREE, batch)
    if not isinstance(table, list) or not table or step is None:
        return None
    prices = {int(n): float(s) for n, s in table}
    nodes, packed = sorted(prices), bool(check.get("packed"))

    def cost(k: int, fill: float) -> float:
        forward = seconds_drafted(prices.__getitem__, nodes, k, fill, batch, packed)
        full = seconds_drafted(prices.__getitem__, nodes, k, 1.0, batch, packed)
        return forward + (step(k) - full if k > 0 else 0.0)

    return cost


def read_step_fit(out: OutDir) -> tuple[int, dict[str, Any]] | None:
    """The batch size and the newest worker's account of its step costs (``write_step_costs``:
    vLLM's fit, or the tree profile's check); None when no worker wrote one."""
    found = []
    for mtime, data in _step_files(out):
        if isinstance(data.get("fit"), dict):
            try:
                found.append((mtime, int(data["batch"]), data["fit"]))
            except (KeyError, TypeError, ValueError):
                continue  # not ours
    if not found:
        return None
    _, batch, fit = max(found, key=lambda f: f[0])
    return batch, fit
