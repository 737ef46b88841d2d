"""``batchspec tune``: a calibration sweep over K (and batch sizes) on a sample of each domain.

For every batch size and every K of the grid it builds one engine and runs each domain's
sample through it alone, measuring real output tokens/s and acceptance. The observations go
to a tuning file that ``batchspec run`` loads into its K controller; the table printed is the
measured tokens/s, not a prediction.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from batchspec.engines import Engine, open_engine
from batchspec.errors import UserError
from batchspec.io.checks import preflight
from batchspec.io.inputs import PromptBuilder
from batchspec.models import load_tokenizer
from batchspec.spec import JobSpec
from batchspec.speculation.estimator import Controller, Observation
from batchspec.speculation.shared import write_tuning
from batchspec.units import UnitRequests, WorkUnit


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
        ob.merge(Observation.from_result(result, batch))
    wall = time.perf_counter() - started
    return ob, ob.output_tokens / wall if wall > 0 else 0.0


def tune(
    spec: JobSpec,
    sample: int,
    batches: list[int],
    out: Path,
    echo: Callable[[str], object] = print,
) -> dict[str, Any]:
    """Sweep K x batch size, print a table per batch size, write the tuning file."""
    s = spec.speculative
    if s.method == "none":
        raise UserError("speculative.method is none: there is no K to tune")
    pre = preflight(spec)
    tokenizer = load_tokenizer(pre.tokenizer_dir, "model.tokenizer")
    sweep = _Sweep(spec, sample_units(pre.units, sample), sample, tokenizer, echo)
    data: dict[str, Any] = {
        "method": s.method,
        "spec_hash": spec.content_hash(),
        "k_grid": sweep.grid,
        "sample_rows": sample,
        "created": time.time(),
        "batches": [sweep.batch(b) for b in batches],
    }
    # What a run's K controller weighs an engine switch against.
    data["engine_build_s"] = sum(sweep.builds) / len(sweep.builds)
    write_tuning(out, data)
    return data


class _Sweep:
    """Every K of the grid on every domain's sample, one batch size at a time."""

    def __init__(
        self,
        spec: JobSpec,
        samples: dict[str | None, list[WorkUnit]],
        rows: int,
        tokenizer: Any,
        echo: Callable[[str], object],
    ) -> None:
        self.spec = spec
        self.samples = samples
        self.rows = rows
        self.tokenizer = tokenizer
        self.echo = echo
        self.grid = sorted(set(spec.speculative.k_grid))
        self.builds: list[float] = []

    def batch(self, batch: int) -> dict[str, Any]:
        """One batch size: an engine per K, every domain measured on it; the tuning entry."""
        bspec = _with_batch(self.spec, batch)
        observations: list[Observation] = []
        measured: dict[str, dict[int, float]] = {}
        for k in self.grid:
            engine = open_engine(bspec, k)
            self.builds.append(engine.build_s)
            inp = self.spec.input
            builder = PromptBuilder(inp, self.tokenizer, engine.max_model_len, bspec.sampling.seed)
            try:
                for domain, units in self.samples.items():
                    ob, tps = measure(engine, builder, units, self.rows, batch)
                    observations.append(ob)
                    measured.setdefault(str(domain), {})[k] = tps
                    self.echo(
                        f"  batch {batch:3d}  K={k}  {domain}: {tps:.1f} tok/s "
                        f"({ob.output_tokens} tokens)"
                    )
            finally:
                engine.close()
        ctl = Controller(batch, self.grid, self.spec.speculative.num_speculative_tokens)
        for ob in observations:
            ctl.add(ob)
        domains = {}
        for domain in self.samples:
            choice = ctl.choose(domain)
            rates = measured[str(domain)]
            domains[str(domain)] = {
                "chosen_k": choice.k,
                "best_measured_k": max(rates, key=rates.get),
                "alpha": choice.alpha,
                "alpha_std": choice.alpha_std,
                "tokens_per_s": rates,
            }
        self.echo(format_tuning_table(batch, self.grid, domains))
        return {
            "batch": batch,
            "domains": domains,
            "observations": [asdict(o) for o in observations],
        }


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
