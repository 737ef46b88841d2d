"""``batchspec tune``: a calibration sweep over K (and batch sizes) on a sample of each domain.

For every batch size and every K of the grid it builds one engine and runs each domain's
sample through it alone, measuring real output tokens/s and acceptance. The observations go
to a tuning file that ``batchspec run`` loads into its K controller; the table printed is the
measured tokens/s, not a prediction.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict
from pathlib import Path
from typing import Any

from batchspec.checks import preflight
from batchspec.controller import Controller, Observation, write_tuning
from batchspec.engine import Engine
from batchspec.errors import UserError
from batchspec.inputs import PromptBuilder, UnitRequests
from batchspec.planner import WorkUnit
from batchspec.runner import load_tokenizer
from batchspec.spec import JobSpec
from batchspec.writer import result_row


class ListSource:
    """A fixed list of units for the engine: no claiming, no waiting."""

    def __init__(self, units: list[UnitRequests]):
        self.units = deque(units)

    def next_unit(self) -> UnitRequests | None:
        return self.units.popleft() if self.units else None

    def exhausted(self) -> bool:
        return not self.units

    def wait(self) -> None:
        return None


def sample_units(units: list[WorkUnit], per_domain: int) -> dict[str | None, list[WorkUnit]]:
    """The first units of every domain that hold at least ``per_domain`` rows together."""
    picked: dict[str | None, list[WorkUnit]] = {}
    counts: dict[str | None, int] = {}
    for unit in units:
        if counts.get(unit.domain, 0) < per_domain:
            picked.setdefault(unit.domain, []).append(unit)
            counts[unit.domain] = counts.get(unit.domain, 0) + unit.num_rows
    return picked


def _with_batch(spec: JobSpec, batch: int) -> JobSpec:
    return spec.model_copy(update={"model": spec.model.model_copy(update={"max_num_seqs": batch})})


def measure(
    engine: Engine, builder: PromptBuilder, units: list[WorkUnit], rows: int, batch: int
) -> tuple[Observation, float]:
    """Run ``rows`` rows of these single-domain units alone; the observation and wall tokens/s."""
    requests = []
    left = rows
    for unit in units:
        built = builder.build(unit)
        built.rows = built.rows[:left]
        left -= len(built.rows)
        requests.append(built)
    ob = Observation(units[0].domain, engine.k, batch)
    started = time.perf_counter()
    for result in engine.run(ListSource(requests), lambda: False):
        for r in result.results:
            ob.add_row(result_row(r, "", result.method, result.k))
    wall = time.perf_counter() - started
    return ob, ob.output_tokens / wall if wall > 0 else 0.0


def tune(spec: JobSpec, sample: int, batches: list[int], out: Path, echo=print) -> dict[str, Any]:
    """Sweep K x batch size, print a table per batch size, write the tuning file."""
    s = spec.speculative
    if s.method == "none":
        raise UserError("speculative.method is none: there is no K to tune")
    pre = preflight(spec)
    samples = sample_units(pre.units, sample)
    tokenizer = load_tokenizer(pre, spec)
    grid = sorted(set(s.k_grid))
    data: dict[str, Any] = {
        "method": s.method,
        "spec_hash": spec.content_hash(),
        "k_grid": grid,
        "sample_rows": sample,
        "created": time.time(),
        "batches": [],
    }
    builds: list[float] = []
    for batch in batches:
        bspec = _with_batch(spec, batch)
        observations: list[Observation] = []
        measured: dict[str, dict[int, float]] = {}
        for k in grid:
            engine = Engine(bspec, k)
            builds.append(engine.build_s)
            builder = PromptBuilder(spec.input, tokenizer, engine.max_model_len, spec.sampling.seed)
            try:
                for domain, units in samples.items():
                    ob, tps = measure(engine, builder, units, sample, batch)
                    observations.append(ob)
                    measured.setdefault(str(domain), {})[k] = tps
                    echo(
                        f"  batch {batch:3d}  K={k}  {domain}: {tps:.1f} tok/s "
                        f"({ob.output_tokens} tokens)"
                    )
            finally:
                engine.close()
        ctl = Controller(batch, grid, s.num_speculative_tokens)
        for ob in observations:
            ctl.add(ob)
        domains = {}
        for domain in samples:
            choice = ctl.choose(domain)
            best_measured = max(measured[str(domain)], key=measured[str(domain)].get)
            domains[str(domain)] = {
                "chosen_k": choice.k,
                "best_measured_k": best_measured,
                "alpha": choice.alpha,
                "alpha_std": choice.alpha_std,
                "tokens_per_s": measured[str(domain)],
            }
        data["batches"].append(
            {"batch": batch, "domains": domains, "observations": [asdict(o) for o in observations]}
        )
        echo(format_tuning_table(batch, grid, domains))
    # What a run's K controller weighs an engine switch against.
    data["engine_build_s"] = sum(builds) / len(builds)
    write_tuning(out, data)
    return data


def format_tuning_table(batch: int, grid: list[int], domains: dict[str, Any]) -> str:
    head = ["domain", "alpha", *(f"K={k}" for k in grid), "chosen"]
    rows = []
    for domain, d in domains.items():
        alpha = "-" if d["alpha"] is None else f"{d['alpha']:.2f}±{d['alpha_std']:.2f}"
        rates = [f"{d['tokens_per_s'][k]:.1f}" for k in grid]
        rows.append([domain, alpha, *rates, str(d["chosen_k"])])
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]

    def fmt(cells: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    title = f"batch {batch}: measured output tokens/s per domain and K (K=0: no speculation)"
    return "\n".join([title, fmt(head), *(fmt(r) for r in rows)])
