"""What a tree engine step costs, measured: seconds per step by batch size and draft nodes.

The K controller's trade is tokens per step against seconds per step, and the second half
cannot be extrapolated from a run's own units without running every K (the cost of a K
nobody ran is unknown). So it is measured once, up front, where it is cheap: synthetic tokens
through the real verify forward (``TreeModel.verify``; nodes 0 is a plain decode step, a
tree of the root alone) for each node count of the job's grid at the batch sizes the run
will see (powers of two up to ``max_num_seqs``, and ``max_num_seqs``), behind a context of
``CONTEXT`` cached tokens, the median of up to ``REPEATS`` repetitions after a warm-up (fewer
for a cell whose forwards take long). The default grid (6 node counts) at batch 8 is 24 cells:
4.4 s on this 2-core CPU for 16 of them with the embedded model.

The table is cached per machine, model, dtype, device and thread count in the user's cache
(``$BATCHSPEC_CACHE``, else ``$BATCHSPEC_HOME``, else ``~/.cache/batchspec``; under
``profiles/``), so only the first engine build pays; a later job with another grid measures
only the cells it lacks. Between measured cells, ``seconds`` interpolates linearly (and
extrapolates from the last two cells beyond them).

A cached profile is not trusted: the engine feeds every real step back (``observe``), and
where the run's own steps disagree with the profile beyond noise, the profile is rescaled or
the step's cell priced from the run's figures (``step_check``: the rule, and why the cache
keeps only the synthetic forwards).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from batchspec.engines.tree import smallm
from batchspec.engines.tree.drafted import interp, seconds_drafted
from batchspec.engines.tree.model import TreeModel
from batchspec.engines.tree.step_check import StepCheck
from batchspec.engines.tree.weights import SMALL_ROWS
from batchspec.models import user_cache

CONTEXT = 256
"""Cached tokens behind every measured row: attention cost grows with context, and a few
hundred is where the job's rows spend most steps; real steps correct the rest."""
REPEATS = 3
"""Timed forwards per cell at most, after one untimed warm-up: the median is kept."""
CELL_BUDGET_S = 0.2
"""Timed seconds after which a cell stops repeating: a forward that long varies little
between repetitions, and the widest cells would otherwise cost most of the profile."""


@dataclass
class StepProfile:
    """Measured seconds per step: ``table[i][j]`` at ``batches[i]`` rows of ``nodes[j]``
    draft nodes each (0: plain decoding), both ascending."""

    batches: list[int]
    nodes: list[int]
    table: list[list[float]]
    key: str = ""
    """The cache key: machine, model, dtype, device, threads, context."""
    measured_s: float = 0.0
    """Seconds this build spent measuring cells (0: all of them came from the cache)."""
    check: StepCheck = field(default_factory=StepCheck)
    """This run's real steps against the table, and the corrections they call for."""
    packed: bool = False
    """The model's verify forwards run over their trees' real nodes (``packing``): a step
    costs the nodes its trees hold, not the widest tree's padding."""

    def forward_seconds(self, batch: int, nodes: int) -> float:
        """The verify forward's measured seconds, interpolated between cells."""
        per_batch = [interp(self.nodes, row, nodes) for row in self.table]
        return max(interp(self.batches, per_batch, batch), 0.0)

    def seconds(self, batch: int, nodes: int) -> float:
        """Predicted seconds of a step of ``batch`` rows whose widest tree has ``nodes`` draft
        nodes (0: a plain decode step): the measured forward, as this run's own steps have
        corrected it (``step_check``)."""
        return self.check.price((batch, nodes), self.forward_seconds(batch, nodes))

    def seconds_at(self, batch: int, k: int, fill: float) -> float:
        """Seconds of a step of ``batch`` rows at ``k`` whose trees hold ``fill``·k nodes a
        step on average (a domain's replayed drafts, ``Controller.fill_cost``): priced at the
        widest tree's bound (``drafted``), between the node counts around it as this run's
        steps have corrected them."""
        at = partial(self.seconds, batch)
        return seconds_drafted(at, self.priced_nodes(batch), k, fill, batch, self.packed)

    def priced_nodes(self, batch: int) -> list[int]:
        """The node counts a step of ``batch`` rows is priced at: the profile's, and those
        the run's own steps replaced at this batch (``step_check``: the profile's shape is
        wrong there, so a price between two node counts must pass through them)."""
        own = {n for b, n in self.check.replaced if b == batch}
        return sorted({*self.nodes, *own})

    def observe_step(self, nodes: list[int], seconds: float) -> None:
        """A real step whose rows' trees held these draft ``nodes``: a packed step costs
        their mean, a padded one its widest (``observe``)."""
        at = sum(nodes) / len(nodes) if self.packed else max(nodes)
        self.observe(len(nodes), at, seconds)

    def observe(self, batch: int, nodes: float, seconds: float) -> None:
        """A real step's seconds, its trees' ``nodes`` (the widest's; packed, their mean):
        checked against the profile there, and counted in the cell at or above it (a plain
        step's cell holds plain steps alone)."""
        predicted = self.forward_seconds(batch, nodes)
        if predicted > 0 and seconds > 0:
            self.check.add((batch, math.ceil(nodes)), seconds, predicted)

    def summary(self, batch: int, grid: list[int]) -> dict[str, Any]:
        """For the run's step file and ``report``: the check (cells measured against
        profiled) and, at ``batch``, each K's price beside its profiled forward, and the
        price at each node count a domain's drafted nodes are priced between
        (``seconds_at``)."""
        profiled = {c: self.forward_seconds(*c) for c in self.check.cells}
        priced = {k: [self.seconds(batch, k), self.forward_seconds(batch, k)] for k in grid}
        # What a domain's drafts are priced at between node counts (``report``, ``status``).
        by_nodes = [[n, self.seconds(batch, n)] for n in self.priced_nodes(batch)]
        check = self.check.summary(profiled)
        summary = {"kind": "tree-profile", **check, "priced": priced, "by_nodes": by_nodes}
        return summary | {"packed": self.packed}


def batch_sizes(max_num_seqs: int) -> list[int]:
    """The batch sizes a run sees (it drains to 1): powers of two up to ``max_num_seqs``, and
    ``max_num_seqs`` itself."""
    out, b = [], 1
    while b < max_num_seqs:
        out.append(b)
        b *= 2
    return [*out, max_num_seqs]


def cache_root() -> Path:
    """Where profiles are kept: ``$BATCHSPEC_CACHE``, else ``$BATCHSPEC_HOME`` (as models
    are), else ``~/.cache/batchspec``; under ``profiles/``."""
    return user_cache() / "profiles"


def machine() -> str:
    """This machine: its name and its processor or GPU (a copied cache on another machine
    must not be taken for this one's)."""
    if torch.cuda.is_available():
        chip = torch.cuda.get_device_name()
    else:
        chip = platform.processor() or platform.machine()
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    chip = line.split(":", 1)[1].strip()
                    break
        except OSError:
            pass
    return f"{platform.node()}|{chip}"


def profile_key(model: TreeModel, name: str, context: int = CONTEXT) -> str:
    """The cache key of ``model``'s profile: machine, model (``name`` and its config),
    dtype, device, the process's thread count, the context measured behind each row, and the
    kernels its steps run by."""
    parts = [
        machine(),
        name,
        model.cfg.to_json_string(use_diff=False),
        str(model.dtype),
        str(model.device),
        f"threads={torch.get_num_threads()}",
        f"context={context}",
    ]
    parts += ["cuda graphs"] if model.graphs is not None else []  # eager steps cost more
    parts += ["small-row kernel"] if model.weights.head.small is not None else []  # cheaper
    few = model.few_rows is not None  # cheaper still, by the kernel's build
    parts += [f"few-row forward in C {smallm.TAG}, {SMALL_ROWS} rows"] if few else []
    return hashlib.sha1("\n".join(parts).encode()).hexdigest()[:16]


def measure_cell(model: TreeModel, slots: list[int], nodes: int, repeats: int) -> float:
    """Median seconds of one verify forward of a chain of ``nodes`` draft nodes under every
    slot's root (synthetic tokens; a chain costs what any tree of as many nodes costs)."""
    b, n = len(slots), nodes + 1
    gen = torch.Generator().manual_seed(n)
    tokens = torch.randint(model.vocab_size, (b, n), generator=gen)
    lens = torch.tensor([model.cache.lens[s] for s in slots]).unsqueeze(1)
    positions = lens + torch.arange(n).unsqueeze(0)
    mask = torch.ones(n, n, dtype=torch.bool).tril().expand(b, n, n).contiguous()
    times: list[float] = []
    warm = False
    while len(times) < repeats and sum(times) < CELL_BUDGET_S:
        started = time.perf_counter()
        model.verify(slots, tokens, positions, mask)
        if str(model.device).startswith("cuda"):
            torch.cuda.synchronize()
        if warm:
            times.append(time.perf_counter() - started)
        warm = True
    return statistics.median(times)


def measure(
    model: TreeModel,
    cells: Sequence[tuple[int, int]],
    context: int = CONTEXT,
    repeats: int = REPEATS,
) -> dict[tuple[int, int], float]:
    """Seconds of each (batch, nodes) cell on ``model``, whose slots must all be free: they
    are filled with one synthetic context (one prefill, copied), then freed again."""
    if any(model.cache.lens):
        raise RuntimeError("a step profile is measured on an idle engine (no rows in flight)")
    context = max(1, min(context, model.max_len - 1 - max(n for _, n in cells) - 1))
    gen = torch.Generator().manual_seed(0)
    model.prefill(0, torch.randint(model.vocab_size, (context,), generator=gen).tolist())
    for slot in range(1, max(b for b, _ in cells)):
        model.share_prefix(0, slot, context)
    try:
        return {(b, n): measure_cell(model, list(range(b)), n, repeats) for b, n in cells}
    finally:
        for slot in range(model.max_batch):
            model.release(slot)


def load_or_measure(
    model: TreeModel, name: str, nodes: Sequence[int], batches: Sequence[int] | None = None
) -> StepProfile:
    """The model's profile over ``batches`` (default: ``batch_sizes(max_batch)``) x
    ``nodes`` (0 always among them): from the cache where it has the cells, measured (and
    cached) where it does not."""
    batches = sorted(set(batches or batch_sizes(model.max_batch)))
    nodes = sorted({0, *nodes})
    key = profile_key(model, name)
    path = cache_root() / f"{key}.json"
    known = _read(path)
    missing = [(b, n) for b in batches for n in nodes if (b, n) not in known]
    started = time.perf_counter()
    if missing:
        known |= measure(model, missing)
        _write(path, known)
    spent = time.perf_counter() - started if missing else 0.0
    table = [[known[(b, n)] for n in nodes] for b in batches]
    return StepProfile(batches, nodes, table, key, spent, packed=model.packs)


def _read(path: Path) -> dict[tuple[int, int], float]:
    """Cells cached at ``path``; none when it is missing or unreadable (measured again)."""
    try:
        data = json.loads(path.read_text())
        return {(int(c["batch"]), int(c["nodes"])): float(c["seconds"]) for c in data["cells"]}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def _write(path: Path, cells: dict[tuple[int, int], float]) -> None:
    """Write atomically (a concurrent worker reads the old file or the new, never half)."""
    rows = [{"batch": b, "nodes": n, "seconds": s} for (b, n), s in sorted(cells.items())]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"cells": rows}, indent=1))
        tmp.replace(path)
    except OSError:
        pass  # an unwritable cache costs the next build a measurement, nothing else
