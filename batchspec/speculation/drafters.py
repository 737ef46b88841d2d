"""The drafter per domain (``speculative.drafters``): each enabled drafter at each K of the
grid, K=0 included, priced from what was measured, and the fastest taken.

Each drafter has a K controller of its own (``controller.Controller``), fed the part of every
observation that is that drafter's: its replay of the unit's rows (n-gram and suffix trees
replay exactly on any finished row, whichever drafter made it, so every model-free drafter is
priced on the same rows), and the unit's measured rates and acceptance where the unit ran with
it. A unit at K=0 ran no drafter: its rate is every drafter's K=0. A step is priced as the
engine's profiled verify forward (checked against the run's own steps,
``engines/tree/step_check.py``) plus, at K > 0, the batch's rows times the drafter's measured
drafting seconds per row (``engines/tree/multi.py``): an EAGLE head's forwards cost a step
several milliseconds, an n-gram trie a fraction of one.

The controllers' predictions are compared on one footing: a domain's measured rates scale the
model's prediction of every drafter's other K by one factor, pooled over the drafters that
ran (a domain with long prompts steps slower whatever drafts for it; scaling each drafter by
its own measurements alone would favour the one never run). A drafter is a candidate in a
domain only where something measured in the domain prices it: a replay of its rows or, for a
model drafter, its own rows' acceptance there; otherwise (a domain not seen yet too) the domain
starts at the spec's method, at the K of a blind unit, as the single controller does
(``controller.blind_k``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import NamedTuple

import numpy as np

from batchspec.spec import SpeculativeSpec
from batchspec.speculation.controller import Controller, blind_k
from batchspec.speculation.estimator import Observation

Domain = str | None
REPLAY_ONLY = -1
"""The batch size of an observation's replay-only part: replayed acceptance holds at any batch
size, and a controller takes the measured rest only at its own (``Controller.add``)."""


class Pick(NamedTuple):
    """A domain's drafter and K, the predicted rate of a row there (tokens/s; None where
    nothing prices it), and every drafter's rate at each K priced (``report`` shows them)."""

    drafter: str
    k: int
    rate: float | None
    options: dict[str, dict[int, float]]


def part_of(ob: Observation, drafter: str, method: str) -> Observation | None:
    """The part of ``ob`` that is ``drafter``'s: its replay of the unit's rows, and the
    measured rest where the unit ran with it or at K=0; None where nothing is."""
    ran = ob.drafter or method
    own = ran == drafter
    replay = ob.replays.get(drafter, []) if ob.replays else (ob.replay if own else [])
    if own or ob.k == 0:
        return dataclasses.replace(ob, replay=replay, replays={})
    if not replay:
        return None
    return dataclasses.replace(ob, replay=replay, replays={}, batch=REPLAY_ONLY)


class DrafterChoice:
    """Per domain, the drafter and K with the most predicted tokens/s (``choose``, ``plan``),
    from one ``Controller`` per drafter."""

    def __init__(
        self,
        drafters: Iterable[str],
        method: str,
        batch: int,
        k_grid: Iterable[int],
        default_k: int,
        fixed: Callable[[Domain], int | None] | None = None,
    ) -> None:
        self.method, self.batch = method, batch
        self.ctls = {d: Controller(batch, k_grid, default_k, fixed=fixed) for d in drafters}
        self.grid = np.array(self.ctls[method].k_grid)
        self._verify: Callable[[int], float] | None = None
        """The profiled verify forward at K (``price``): what a blind start is bounded by."""

    @classmethod
    def for_spec(cls, s: SpeculativeSpec, batch: int) -> DrafterChoice | None:
        """The choice among the speculative section's ``drafters`` at ``batch``; None
        without them."""
        if s.drafters is None:
            return None
        return cls(s.drafters, s.method, batch, s.k_grid, s.num_speculative_tokens, s.fixed_k)

    def add(self, ob: Observation) -> None:
        for drafter, ctl in self.ctls.items():
            part = part_of(ob, drafter, self.method)
            if part is not None:
                ctl.add(part)

    @property
    def version(self) -> int:
        """Changes whenever a prediction could."""
        return sum(ctl.version for ctl in self.ctls.values())

    def price(
        self,
        step: Callable[[int], float],
        per_row: Callable[[str], float | None],
        filled: Callable[[int, float], float] | None = None,
    ) -> None:
        """Price a step of each drafter at K: ``step(K)`` (the verify forward, profiled) plus,
        at K > 0, the batch's rows times ``per_row(drafter)`` (measured drafting seconds per
        row; None: never measured, so no K > 0 of that drafter is priced). ``filled(K,
        fill)``: the verify forward at a domain's own drafts (``Controller.fill_cost``), so
        each drafter's K is priced at the nodes its own trees hold in the domain."""
        self._verify = step
        for drafter, ctl in self.ctls.items():
            ctl.step_cost = _priced(lambda k, f: step(k), per_row, drafter, self.batch)
            if filled is not None:
                ctl.fill_cost = _priced(filled, per_row, drafter, self.batch)
            ctl.version += 1
            ctl._table = None

    def choose(self, domain: Domain) -> Pick:
        """The domain's drafter and K: the fastest priced candidate (ties: the smaller K,
        then the drafter listed first), its fixed K with the method, or the method at the
        spec's method where nothing prices any drafter yet, at the K a blind unit runs
        (``controller.blind_k``: priced at the verify forward, drafting not measured yet)."""
        main = self.ctls[self.method]
        fixed = main.fixed_k(domain)
        if fixed is not None:
            return Pick(self.method, fixed, None, {})
        options = self.options(domain)
        order = list(self.ctls)
        cells = [
            (rate, -k, -order.index(d), d, k)
            for d, rates in options.items()
            for k, rate in rates.items()
        ]
        if not any(k for *_, k in cells):  # no drafter priced: the spec's method, blind
            blind = blind_k(self.grid, main.default_k, self._verify)
            return Pick(self.method, blind, None, options)
        rate, _, _, drafter, k = max(cells)
        return Pick(self.method if k == 0 else drafter, k, rate, options)

    def options(self, domain: Domain) -> dict[str, dict[int, float]]:
        """Per candidate drafter, a row's predicted (or measured) tokens/s at each K priced,
        every drafter's prediction scaled by the domain's measured rates pooled over all
        drafters (the module's docstring)."""
        rows, scale_num, scale_den = {}, 0.0, 0.0
        for drafter, ctl in self.ctls.items():
            table = ctl._current()
            i = ctl.index.get(domain, table.blank)
            predicted, measured = table.predicted[i], table.measured[i]
            both = np.isfinite(predicted) & np.isfinite(measured)
            scale_num += measured[both].sum()
            scale_den += predicted[both].sum()
            rows[drafter] = (predicted, measured, self._candidate(ctl, domain))
        scale = scale_num / scale_den if scale_den > 0 else 1.0
        out: dict[str, dict[int, float]] = {}
        for drafter, (predicted, measured, candidate) in rows.items():
            rates = np.where(np.isfinite(measured), measured, predicted * scale)
            if not candidate:
                rates = np.where(self.grid == 0, rates, np.nan)
            priced = {int(k): float(r) for k, r in zip(self.grid, rates, strict=True) if r == r}
            if priced and (candidate or 0 in priced):
                out[drafter] = priced
        return out

    def _candidate(self, ctl: Controller, domain: Domain) -> bool:
        """Whether something measured prices this drafter's K > 0 in ``domain``."""
        model = ctl.domain_model(domain)
        return bool(ctl.replayed(domain)) or model.accepted + model.rejections > 0

    def plan(self, domains: list[Domain]) -> tuple[dict[Domain, int], dict[Domain, str]]:
        """K and drafter per domain."""
        picks = {d: self.choose(d) for d in domains}
        return {d: p.k for d, p in picks.items()}, {d: p.drafter for d, p in picks.items()}


def _priced(
    step: Callable[[int, float], float],
    per_row: Callable[[str], float | None],
    drafter: str,
    batch: int,
) -> Callable[..., float]:
    """Seconds of a step at K with ``drafter`` (``DrafterChoice.price``), its rows' trees
    filling a share ``fill`` of K (1: all K nodes, the step's price)."""

    def cost(k: int, fill: float = 1.0) -> float:
        if k <= 0:
            return step(0, 0.0)
        drafting = per_row(drafter)  # None: never measured (no replay, no unit ran it)
        return float("nan") if drafting is None else step(k, fill) + batch * drafting

    return cost
