"""K per domain over the rest of the work: which engines (one per K) are worth building.

Where K is fixed when an engine is built (vLLM at a fixed K or on its own schedule; an
adaptive job's vLLM engine takes K per unit, ``engines.vllm_live_k``), choosing K is choosing
engines. ``KPolicy.decide`` turns the controller's per-domain predictions into a plan (K per
domain) that weighs every extra engine against its measured start, and, when much work is
left, a probe: one unit at a K whose step time nobody measured yet, without which a run that
starts at one K would never learn another's cost. Each worker weighs these against its own
share of the rows left (rows ÷ live workers): with N workers, it runs about 1/N of them.

Acceptance needs no exploring where the job's drafts can be replayed (n-gram: ``replay``):
every committed row tells every K's acceptance, so no unit rides along at another K to
measure it. On an engine that takes K per unit with a step cost (the tree engine's profile,
vLLM's fit of its own steps), nothing needs exploring at all: each domain gets its best K,
unit by unit, in one engine.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from batchspec.engines.base import Engine
from batchspec.io.layout import OutDir
from batchspec.spec import JobSpec
from batchspec.speculation.controller import Controller
from batchspec.speculation.drafters import DrafterChoice
from batchspec.speculation.engine_sets import cheapest_engine_set
from batchspec.speculation.estimator import Observation
from batchspec.speculation.shared import SharedStats
from batchspec.speculation.steps import write_step_costs
from batchspec.speculation.tuning import job_tuning

Domain = str | None

REFRESH_S = 5.0
"""How often a worker reads the units other workers shared (and at its own next commit)."""


@dataclass(frozen=True)
class Decision:
    """K per domain for the rows left, and maybe one (domain, K) worth a unit to measure K."""

    plan: dict[Domain, int]
    probe: tuple[Domain, int] | None
    drafters: dict[Domain, str] = field(default_factory=dict)
    """The drafter per domain, where the job has several (``speculative.drafters``)."""


class KPolicy:
    """K per domain for one worker: the spec's fixed K, or the adaptive controller.

    The controller starts from the tuning file (refused if it was made for another model,
    draft, method, dtype or sampling), takes every unit this worker commits, and now and then
    the units other workers shared. ``version`` changes whenever a decision could.
    """

    def __init__(self, spec: JobSpec, out: OutDir, worker: str):
        s = spec.speculative
        self.spec = spec
        self.adaptive = s.adaptive and s.method != "none"
        self.ctl = Controller(
            spec.model.max_num_seqs, s.k_grid, s.num_speculative_tokens, fixed=s.fixed_k
        )
        self.drafters = DrafterChoice.for_spec(s, self.ctl.batch) if self.adaptive else None
        """With ``speculative.drafters``: the drafter and K per domain (``drafters``)."""
        self.draft_costs: object = None
        """The engine's measured drafting seconds per drafter (``multi.DraftCosts``)."""
        self.shared = SharedStats(out, worker)
        self.out, self.worker = out, worker
        self._taken: dict[Domain, tuple[int, int]] = {}
        """Per domain: units taken, and how many of them ran away from their planned K."""
        self.build_s: float | None = None
        """Seconds to start an engine, as last measured: what a switch of K costs."""
        self._read_at = -math.inf
        self.engine = s.engine
        self.replays = s.method == "ngram"
        """The job's drafts can be replayed (``replay.Replayer.supported``): acceptance of
        every K comes from committed rows, so no unit runs away from its K to measure it."""
        self.per_unit = False
        """The engine takes K per unit (``Engine.k_per_unit``): no engine starts to weigh."""
        self.explored = 0
        self._profile: object = None
        """The engine's step profile K is priced by (None until an engine with one is up)."""
        """Units this worker ran at a K other than its domain's planned one, to measure it."""
        tuning = job_tuning(spec, out)
        if tuning is not None:
            self.ctl.load_observations(tuning.observations(spec.model.max_num_seqs, self.engine))
            self.build_s = tuning.engines[self.engine].engine_build_s
        self.refresh()

    @property
    def version(self) -> tuple[int, float | None]:
        """What decisions depend on besides the rows left: observations and the start cost."""
        return self.ctl.version + (self.drafters.version if self.drafters else 0), self.build_s

    def _learn(self, ob: Observation) -> None:
        self.ctl.add(ob)
        if self.drafters is not None:
            self.drafters.add(ob)

    def refresh(self) -> None:
        """Take in the units other workers committed: every ``REFRESH_S`` seconds, or less
        often with many workers (``SharedStats.pace_s`` and ``read_paced``: a file read per
        20 s, from the start)."""
        if not self.adaptive or time.monotonic() - self._read_at < self.shared.pace_s(REFRESH_S):
            return
        self._read_at = time.monotonic()
        for ob in self.shared.read_paced():
            if ob.engine in (None, self.engine):  # another engine has other step costs
                self._learn(ob)

    def measured_start(self, seconds: float) -> None:
        """An engine just started in this many seconds: what the next switch of K costs."""
        self.build_s = seconds

    def engine_up(self, engine: Engine) -> None:
        """An engine is up: whether it takes K per unit, and, where K is chosen, its step
        cost (``step_profile``: ``seconds(batch, nodes)``; the tree engine's profile,
        measured on first use, or vLLM's fit of its own steps, ``engines.vllm_steps``, priced
        at the rows its steps carry), which then prices every K of the grid, K=0 included,
        without running it."""
        self.per_unit = engine.k_per_unit
        profile = getattr(engine, "step_profile", None) if self.adaptive else None
        seconds = getattr(profile, "seconds", None)
        if seconds is not None and self.ctl.step_cost is None:
            self._profile = profile
            rows = getattr(profile, "rows", None)  # vLLM: the rows its steps really carry
            batch = (lambda: rows(self.ctl.batch)) if rows else (lambda: self.ctl.batch)
            costs = self.draft_costs = getattr(engine, "draft_costs", None)
            per_row = costs.per_row if costs is not None else lambda d: None
            method = self.spec.speculative.method

            def drafting(k: int) -> float:
                """What drafting adds to a step at K (measured): the profile prices the
                verify forward alone."""
                return batch() * (per_row(method) or 0.0) if k > 0 else 0.0

            self.ctl.step_cost = lambda k: float(seconds(batch(), k)) + drafting(k)
            # A domain's own drafts: vLLM's draft tokens, the tree engine's draft nodes.
            seconds_at = getattr(profile, "seconds_at", None)
            filled = (lambda k, f: float(seconds_at(batch(), k, f))) if seconds_at else None
            if filled is not None:
                self.ctl.fill_cost = lambda k, fill: filled(k, fill) + drafting(k)
            if self.drafters is not None:
                self.drafters.price(lambda k: float(seconds(batch(), k)), per_row, filled)
            self.ctl.version += 1
            self.ctl._table = None
            self._write_steps()

    def _write_steps(self) -> None:
        """The step costs K is priced by, for ``report`` and ``status`` (``steps``)."""
        cost = self.ctl.step_cost
        if cost is not None and self.adaptive:
            seconds = {k: cost(k) for k in self.ctl.k_grid}
            summary = getattr(self._profile, "summary", None)  # the fit, or the check
            fit = summary(self.ctl.batch, self.ctl.k_grid) if summary else None
            if fit is not None and fit.get("kind") == "tree-profile":
                fit["drafted"] = self.ctl.drafted_per_step()  # the nodes K is priced at
            drafting = getattr(self.draft_costs, "summary", dict)()
            args = (self.engine, self.ctl.batch, seconds, fit, drafting)
            write_step_costs(self.out, self.worker, *args)

    def observe(self, ob: Observation) -> None:
        """A unit this worker committed: learn from it and share it."""
        if self.adaptive:
            ob.engine = self.engine
            ob.mixed = self.per_unit and self.ctl.batch > 1
            self._learn(ob)
            self.shared.append(ob)
            self._write_steps()  # real steps correct the prices

    def decide(self, rows: dict[Domain, int], engine_k: int | None, workers: int = 1) -> Decision:
        """The plan and the probe for the rows left (``workers`` share them), in one pass."""
        if not self.adaptive:  # every domain's K is fixed
            return Decision({d: self.ctl.choose(d).k for d in rows}, None)
        domains = list(rows)
        rates, own = self.ctl.table(domains)
        # Output tokens of this worker's share of each domain's rows (max_tokens per row
        # until rows were measured), and the seconds they take at each K.
        tokens = self.ctl.tokens_per_row(domains, self.spec.sampling.max_tokens)
        tokens *= np.array([rows[d] for d in domains]) / max(workers, 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            seconds = tokens[:, None] / (self.ctl.batch * rates)
        seconds[~np.isfinite(seconds)] = np.inf
        if self.per_unit and self.drafters is not None:  # the drafter and K per domain
            plan, drafters = self.drafters.plan(domains)
            return Decision(plan, None, drafters)
        if self.per_unit:  # no engine to build: every domain at its own best K
            return Decision({d: int(k) for d, k in zip(domains, own, strict=True)}, None)
        plan = self._plan(domains, seconds, own, engine_k)
        return Decision(plan, self._probe(domains, rows, plan, seconds))

    def choose(self, domain: Domain) -> tuple[int, str | None]:
        """One domain's K and drafter (None: the job's method) on an engine that takes K per
        unit, as ``decide`` would plan them."""
        if self.drafters is not None:
            pick = self.drafters.choose(domain)
            return pick.k, pick.drafter
        return self.ctl.choose(domain).k, None

    def _plan(
        self, domains: list[Domain], seconds: np.ndarray, own: np.ndarray, engine_k: int | None
    ) -> dict[Domain, int]:
        """K per domain for this worker's share of the rows left, deciding at once which
        engines are worth building (``seconds``: predicted time of each domain's share at
        each K of the grid, inf where unknown).

        Every domain at its own best K can need one engine per distinct K, and each engine
        beyond the one that is up costs a start. So over every set of K from the grid, the
        predicted time of the rows left, each domain at the fastest K of the set, plus the
        starts of the set's new engines; the cheapest set wins (``cheapest_engine_set``).
        Domains without predictions keep the controller's choice (the spec's K until
        measured), and so do domains with a fixed K. Until an engine start has been measured
        (here or by ``batchspec tune``) every domain gets its own best K: the first engine
        measures it.
        """
        plan = {d: int(k) for d, k in zip(domains, own, strict=True)}
        free = np.isfinite(seconds).any(axis=1)
        if self.build_s is None or not free.any():
            return plan
        grid = self.ctl.k_grid
        required = {plan[d] for d, f in zip(domains, free, strict=True) if not f}
        times = seconds[free]
        cols = cheapest_engine_set(times, grid, required, engine_k, self.build_s)
        pick = np.argmin(times[:, cols], axis=1)  # ties: the smaller K
        for d, j in zip([d for d, f in zip(domains, free, strict=True) if f], pick, strict=True):
            plan[d] = grid[cols[j]]
        return plan

    def _probe(
        self,
        domains: list[Domain],
        rows: dict[Domain, int],
        plan: dict[Domain, int],
        seconds: np.ndarray,
    ) -> tuple[Domain, int] | None:
        """A (domain, K) worth one unit on an engine of its own, to measure a K no unit has run.

        The plan only weighs K with a measured step time, so a run that starts at one K (no
        tuning file) would otherwise stay there. When the predicted time of this worker's
        share of the rows left is large enough that two engine starts (there and back) are at
        most ``explore`` of it, one unit of the domain with the most rows runs at an
        unmeasured grid neighbour of its planned K; the measurement then informs every
        domain's prediction at that K.
        """
        if self.build_s is None or self.ctl.step_cost is not None:
            return None  # with step costs (a profile, or vLLM's fitted steps) every K is priced
        measured = self.ctl.step_times()
        if not measured:
            return None
        grid = self.ctl.k_grid
        column = {k: j for j, k in enumerate(grid)}
        at = [column.get(plan[d], -1) for d in domains]
        left = sum(seconds[i, j] for i, j in enumerate(at) if j >= 0 and seconds[i, j] < np.inf)
        if 2 * self.build_s > self.spec.speculative.explore * left:
            return None
        for d in sorted(rows, key=lambda x: -rows[x]):
            if self.ctl.fixed_k(d) is not None or plan[d] not in column:
                continue
            i = column[plan[d]]
            for j in (i + 1, i - 1):
                if 0 <= j < len(grid) and grid[j] not in measured:
                    return d, grid[j]
        return None

    def explores(self, domain: Domain, best: int, engine_k: int) -> bool:
        """Whether the next unit of this domain, planned at ``best``, should run at
        ``engine_k``, a grid neighbour, to keep measuring it: while fewer than ``explore`` of
        the domain's units this worker took ran away from their planned K."""
        if not self.adaptive or self.replays or self.ctl.fixed_k(domain) is not None:
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
        self.explored += explored
