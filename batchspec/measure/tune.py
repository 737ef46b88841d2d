"""``batchspec tune``: a calibration sweep over K (and batch sizes) on a sample of each domain.

For every batch size and every K of the grid it builds one engine and runs each domain's
sample through it alone, as a full batch (a domain with fewer rows than the batch repeats
them), measuring real output tokens/s and acceptance at the batch size it records. The
observations go to a tuning file that ``batchspec run`` loads into its K controller (and
refuses for another engine, model, draft, method, dtype or sampling); the table printed is the
measured tokens/s with its noise, and the K chosen never loses to another measured K by more
than that noise (``predictions.Predictions._measurement_wins``). A job with ``speculative.engine:
auto`` is swept on both engines, and the file records which one each batch size runs on
(``route``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from batchspec.engines import Engine, ListSource, open_engine
from batchspec.errors import UserError
from batchspec.io.checks import preflight
from batchspec.io.inputs import PromptBuilder
from batchspec.models import load_tokenizer
from batchspec.spec import JobSpec
from batchspec.spec.tree import AUTO, engines_of
from batchspec.speculation.controller import Controller
from batchspec.speculation.estimator import Observation
from batchspec.speculation.route import format_route, route_table, with_engine
from batchspec.speculation.tuning import (
    BatchTuning,
    DomainTuning,
    EngineTuning,
    TuningFile,
    tuning_identity,
    write_tuning,
)
from batchspec.units import UnitRequests, WorkUnit


def sample_units(units: list[WorkUnit], per_domain: int) -> dict[str | None, list[WorkUnit]]:
    """The first units of every domain that hold at least ``per_domain`` rows together (all
    of a domain's units when it has fewer rows)."""
    picked: dict[str | None, list[WorkUnit]] = {}
    counts: dict[str | None, int] = {}
    for unit in units:
        if counts.get(unit.domain, 0) < per_domain:
            picked.setdefault(unit.domain, []).append(unit)
            counts[unit.domain] = counts.get(unit.domain, 0) + unit.num_rows
    return picked


def _with_batch(spec: JobSpec, batch: int) -> JobSpec:
    return spec.model_copy(update={"model": spec.model.model_copy(update={"max_num_seqs": batch})})


def sample_rows(builder: PromptBuilder, units: list[WorkUnit], rows: int) -> UnitRequests:
    """``rows`` rows of these single-domain units as one request list: the first ones, and
    when the units hold fewer, their rows again in turn (sampling with replacement), so that
    the batch the measurement is labelled with is full."""
    found = [r for unit in units for r in builder.build(unit).rows]
    return UnitRequests(units[0], [found[i % len(found)] for i in range(rows)])


def measure(
    engine: Engine, builder: PromptBuilder, units: list[WorkUnit], rows: int, batch: int
) -> tuple[Observation, float]:
    """Run ``rows`` rows of these single-domain units alone; the observation and wall tokens/s."""
    requests = sample_rows(builder, units, rows)
    ob = Observation(units[0].domain, engine.k, batch)
    started = time.perf_counter()
    for result in engine.run(ListSource([requests]), lambda: False):
        ob.merge(Observation.from_result(result, batch))
    wall = time.perf_counter() - started
    # A row run twice is not a second sample of the domain: the noise counts distinct rows.
    distinct = len({id(r) for r in requests.rows})
    if ob.rated > distinct:
        ob.rate_sum *= distinct / ob.rated
        ob.rate_sq *= distinct / ob.rated
        ob.rated = distinct
    return ob, ob.output_tokens / wall if wall > 0 else 0.0


def tune(
    spec: JobSpec,
    sample: int,
    batches: list[int],
    out: Path,
    echo: Callable[[str], object] = print,
) -> TuningFile:
    """Sweep K x batch size on each engine the job may run on (both for ``engine: auto``),
    print a table per engine and batch size, and for ``auto`` the engine each batch size is
    routed to; write the tuning file. Each domain runs ``sample`` rows at each K and batch
    size, at least a full batch."""
    s = spec.speculative
    if s.method == "none":
        raise UserError("speculative.method is none: there is no K to tune")
    pre = preflight(spec)
    tokenizer = load_tokenizer(pre.tokenizer_dir, "model.tokenizer")
    samples = sample_units(pre.units, max(sample, *batches))
    engines = {}
    for engine in engines_of(s.engine):
        echo(f"engine {engine}:")
        sweep = _Sweep(with_engine(spec, engine), samples, sample, tokenizer, echo)
        measured = [sweep.batch(b) for b in batches]
        engines[engine] = EngineTuning(
            k_grid=sweep.grid,
            sample_rows={b: sweep.rows_at(b) for b in batches},
            batches=measured,
            # What a run's K controller weighs an engine switch against.
            engine_build_s=sum(sweep.builds) / len(sweep.builds),
        )
    tuning = TuningFile(
        method=s.method,
        identity=tuning_identity(spec),
        spec_hash=spec.content_hash(),
        created=time.time(),
        engines=engines,
    )
    if s.engine == AUTO:
        rows = {str(d): n for d, n in pre.domains().items()}
        tuning.route = route_table(tuning.engines, rows, spec)
        echo("speculative.engine auto routes (predicted from the measurements above):")
        for route in tuning.route:
            echo("  " + format_route(route))
    write_tuning(out, tuning)
    return tuning


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

    def rows_at(self, batch: int) -> int:
        """Rows per domain and K at this batch size: ``--sample``, at least a full batch."""
        return max(self.rows, batch)

    def batch(self, batch: int) -> BatchTuning:
        """One batch size: an engine per K, every domain measured on it; the tuning entry."""
        bspec = _with_batch(self.spec, batch)
        observations: list[Observation] = []
        walls: dict[str, dict[int, float]] = {}
        for k in self.grid:
            engine = open_engine(bspec, k)
            self.builds.append(engine.build_s)
            inp = self.spec.input
            builder = PromptBuilder(inp, self.tokenizer, engine.max_model_len, bspec.sampling.seed)
            try:
                # A new engine's first batch pays one-off costs (allocations, kernel warm-up)
                # that would count against whichever domain comes first: one batch, unmeasured.
                measure(engine, builder, next(iter(self.samples.values())), batch, batch)
                for domain, units in self.samples.items():
                    ob, wall = measure(engine, builder, units, self.rows_at(batch), batch)
                    observations.append(ob)
                    walls.setdefault(str(domain), {})[k] = wall
                    self.echo(
                        f"  batch {batch:3d}  K={k}  {domain}: {wall:.1f} tok/s wall "
                        f"({ob.rows} rows, {ob.output_tokens} tokens)"
                    )
            finally:
                engine.close()
        ctl = Controller(batch, self.grid, self.spec.speculative.num_speculative_tokens)
        for ob in observations:
            ctl.add(ob)
        domains = {}
        for domain in self.samples:
            choice = ctl.choose(domain)
            # What a full batch makes at each K (rows' rate x batch) and that figure's noise.
            obs = {o.k: o for o in observations if o.domain == domain}
            rates = {k: (o.rate or 0.0) * batch for k, o in obs.items()}
            domains[str(domain)] = DomainTuning(
                chosen_k=choice.k,
                best_measured_k=max(rates, key=lambda x: (rates[x], -x)),
                alpha=choice.alpha,
                alpha_std=choice.alpha_std,
                tokens_per_s=rates,
                noise_tokens_per_s={k: (o.rate_noise or 0.0) * batch for k, o in obs.items()},
                wall_tokens_per_s=walls[str(domain)],
            )
        self.echo(format_tuning_table(batch, self.grid, domains))
        return BatchTuning(batch=batch, domains=domains, observations=observations)


def format_tuning_table(batch: int, grid: list[int], domains: dict[str, DomainTuning]) -> str:
    head = ["domain", "alpha", *(f"K={k}" for k in grid), "chosen"]
    rows = []
    for domain, d in domains.items():
        alpha = "-" if d.alpha is None else f"{d.alpha:.2f}±{d.alpha_std or 0.0:.2f}"
        noise = d.noise_tokens_per_s
        rates = [f"{d.tokens_per_s[k]:.1f}±{noise[k]:.1f}" for k in grid]
        rows.append([domain, alpha, *rates, str(d.chosen_k)])
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]

    def fmt(cells: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    title = (
        f"batch {batch}: measured output tokens/s per domain and K (a full batch: rows' rate x "
        f"{batch}; ± its standard error; K=0: no speculation)"
    )
    return "\n".join([title, fmt(head), *(fmt(r) for r in rows)])
