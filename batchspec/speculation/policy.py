"""K per domain over the rest of the work: which engines (one per K) are worth building.

vLLM fixes K when an engine is built, so choosing K is choosing engines. ``KPolicy.decide``
turns the controller's per-domain predictions into a plan (K per domain) that weighs every
extra engine against its measured start, and, when much work is left, a probe: one unit at a
K nobody measured yet, without which a run that starts at one K would never learn another.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from batchspec.io.layout import OutDir
from batchspec.spec import JobSpec
from batchspec.speculation.estimator import Choice, Controller, Observation
from batchspec.speculation.shared import SharedStats, read_tuning, tuning_observations

Domain = str | None


@dataclass(frozen=True)
class Decision:
    """K per domain for the rows left, and maybe one (domain, K) worth a unit to measure K."""

    plan: dict[Domain, int]
    probe: tuple[Domain, int] | None


class KPolicy:
    """K per domain for one worker: the spec's fixed K, or the adaptive controller.

    The controller starts from the tuning file (if it was made for this method), takes every
    unit this worker commits, and on every decision the units other workers shared.
    """

    def __init__(self, spec: JobSpec, out: OutDir, worker: str):
        s = spec.speculative
        self.spec = spec
        self.adaptive = s.adaptive and s.method != "none"
        self.ctl = Controller(
            spec.model.max_num_seqs, s.k_grid, s.num_speculative_tokens, fixed=s.per_domain
        )
        self.shared = SharedStats(out, worker)
        self._taken: dict[Domain, tuple[int, int]] = {}
        """Per domain: units taken, and how many of them ran away from their planned K."""
        self.build_s: float | None = None
        """Seconds to start an engine, as last measured: what a switch of K costs."""
        tuning = read_tuning(out.tuning) if self.adaptive else None
        if tuning is not None and tuning.get("method") == s.method:
            self.ctl.load_observations(tuning_observations(tuning, spec.model.max_num_seqs))
            self.build_s = tuning.get("engine_build_s")
        self.refresh()

    def refresh(self) -> None:
        """Take in the units other workers committed since the last call."""
        if self.adaptive:
            for ob in self.shared.read_new():
                self.ctl.add(ob)

    def measured_start(self, seconds: float) -> None:
        """An engine just started in this many seconds: what the next switch of K costs."""
        self.build_s = seconds

    def observe(self, ob: Observation) -> None:
        """A unit this worker committed: learn from it and share it."""
        if self.adaptive:
            self.ctl.add(ob)
            self.shared.append(ob)

    def decide(self, rows: dict[Domain, int], engine_k: int | None) -> Decision:
        """The plan and the probe for the rows left, from one pass over the controller."""
        if not self.adaptive:
            return Decision({d: self.spec.speculative.k_for(d) for d in rows}, None)
        choices = {d: self.ctl.choose(d) for d in rows}
        per_row = {d: self.tokens_per_row(d) for d in rows}
        plan = self._plan(rows, engine_k, choices, per_row)
        return Decision(plan, self._probe(rows, plan, choices, per_row))

    def _plan(
        self,
        rows: dict[Domain, int],
        engine_k: int | None,
        choices: dict[Domain, Choice],
        per_row: dict[Domain, float],
    ) -> dict[Domain, int]:
        """K per domain for the rows left, deciding at once which engines are worth building.

        Every domain at its own best K can need one engine per distinct K, and each engine
        beyond the one that is up costs a start. So over every set of K from the grid (a few
        dozen sets), the predicted time of the rows left, each domain at the fastest K of the
        set, plus the starts of the set's new engines; the cheapest set wins. Domains without
        predictions keep the controller's choice (the spec's K until measured), and so do
        domains with a fixed K. Until an engine start has been measured (here or by
        ``batchspec tune``) every domain gets its own best K: the first engine measures it.
        """
        own = {d: c.k for d, c in choices.items()}
        if self.build_s is None:
            return own
        forced = {d: c.k for d, c in choices.items() if d in self.ctl.fixed or not c.rates}
        free = {d: c.rates for d, c in choices.items() if d not in forced}
        if not free:
            return forced
        required = set(forced.values())
        best: tuple[float, dict[Domain, int]] | None = None
        grid = self.ctl.k_grid
        for n in range(1, len(grid) + 1):
            for ks in itertools.combinations(grid, n):
                engines = required | set(ks)
                new = len(engines - {engine_k}) if engine_k is not None else len(engines) - 1
                cost = new * self.build_s
                assign = dict(forced)
                for d, rates in free.items():
                    usable = [k for k in ks if k in rates]
                    if not usable:
                        break
                    k = max(usable, key=lambda x, r=rates: (r[x], -x))
                    assign[d] = k
                    cost += rows[d] * per_row[d] / (self.ctl.batch * rates[k])
                else:
                    if best is None or cost < best[0]:
                        best = (cost, assign)
        return own if best is None else best[1]

    def _probe(
        self,
        rows: dict[Domain, int],
        plan: dict[Domain, int],
        choices: dict[Domain, Choice],
        per_row: dict[Domain, float],
    ) -> tuple[Domain, int] | None:
        """A (domain, K) worth one unit on an engine of its own, to measure a K no unit has run.

        The plan only weighs K with a measured step time, so a run that starts at one K (no
        tuning file) would otherwise stay there. When the predicted time of the rows left is
        large enough that two engine starts (there and back) are at most ``explore`` of it,
        one unit of the domain with the most rows runs at an unmeasured grid neighbour of its
        planned K; the measurement then informs every domain's prediction at that K.
        """
        if self.build_s is None:
            return None
        measured = self.ctl.step_times()
        if not measured:
            return None
        left = 0.0
        for d, n in rows.items():
            rate = choices[d].rates.get(plan[d])
            if rate:
                left += n * per_row[d] / (self.ctl.batch * rate)
        if 2 * self.build_s > self.spec.speculative.explore * left:
            return None
        grid = self.ctl.k_grid
        for d in sorted(rows, key=lambda x: -rows[x]):
            if d in self.ctl.fixed or plan[d] not in grid:
                continue
            i = grid.index(plan[d])
            for j in (i + 1, i - 1):
                if 0 <= j < len(grid) and grid[j] not in measured:
                    return d, grid[j]
        return None

    def tokens_per_row(self, domain: Domain) -> float:
        """Mean output tokens of the domain's rows so far; ``max_tokens`` before any."""
        rows = tokens = 0
        for (d, _), ob in self.ctl.obs.items():
            if d == domain:
                rows += ob.rows
                tokens += ob.output_tokens
        return tokens / rows if rows else float(self.spec.sampling.max_tokens)

    def explores(self, domain: Domain, best: int, engine_k: int) -> bool:
        """Whether the next unit of this domain, planned at ``best``, should run at
        ``engine_k``, a grid neighbour, to keep measuring it: while fewer than ``explore`` of
        the domain's units this worker took ran away from their planned K."""
        if not self.adaptive or domain in self.ctl.fixed:
            return False
        grid = self.ctl.k_grid
        if best not in grid or engine_k not in grid:
            return False
        if abs(grid.index(best) - grid.index(engine_k)) != 1:
            return False
        took, explored = self._taken.get(domain, (0, 0))
        return explored < self.spec.speculative.explore * (took + 1)

    def taken(self, domain: Domain, explored: bool) -> None:
        """Count a unit the worker took, for the exploring quota."""
        took, n = self._taken.get(domain, (0, 0))
        self._taken[domain] = (took + 1, n + explored)
