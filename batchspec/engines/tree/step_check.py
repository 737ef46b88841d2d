"""The tree engine's step profile checked against the run's own steps, as they happen.

A profile (``profile.StepProfile``) is measured once per machine and cached, and the machine's
load moves under it: two identical runs, both at ~41 tok/s, once priced K=8 best for five
domains and once K=0 for all six (issue 35). So every verify step the engine runs is taken as
a measurement of its cell (rows in the batch, draft nodes of its widest tree), set against
what the profile says that cell costs, and the run's own figures win where they disagree:

- per cell and over all steps (the pool), running sums of the ratio measured / profiled;
- the pool **disagrees** with the profile when, after ``MIN_STEPS`` steps, its mean ratio
  with ``Z`` standard errors on either side lies wholly outside ``[1/TOLERANCE, TOLERANCE]``:
  then every cell is priced at the profile times that mean ratio (the machine is slower or
  faster now than when it was profiled, at every cell alike, K nobody ran included);
- a cell with ``MIN_STEPS`` steps of its own that disagrees, by the same rule, with the
  profile so scaled is **replaced**: priced at the profile times its own steps' mean ratio,
  which for a cell of whole trees is its mean measured step (a packed step, whose trees hold
  a mean of nodes between two cells, counts in the one above). The profile's shape is wrong
  there: a kernel that suffers more from contention, drafting that costs more than the
  forward's share, a packed batch's attention over rows of unequal trees and contexts;
- otherwise the profile is left alone: noise does not move prices.

Only the run keeps these figures: the cache holds synthetic forwards at a fixed context, one
well-defined quantity per machine and model, while a run's steps also carry its drafter, its
rows' contexts and the day's load, none of which the cache's key names. A run that begins
under other load than its profile's is priced from its own steps after ``MIN_STEPS`` of
them (a second or two).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

MIN_STEPS = 20
"""Steps before the pool or a cell is judged (as many as vLLM's step fit wants)."""
TOLERANCE = 1.1
"""Ratios within 10 % of what is expected are no disagreement: below that, K's price barely
moves, and a band keeps prices from following the load's small swings."""
Z = 2.0
"""Standard errors of the mean ratio that must lie outside the band as well."""

Cell = tuple[int, int]
"""(rows in the step, draft nodes of its widest tree, or of its trees' mean rounded up where
steps are packed; 0: a plain decode step)."""


@dataclass
class Ratios:
    """Running sums over steps of the measured seconds and of measured / profiled."""

    steps: int = 0
    seconds: float = 0.0
    ratio: float = 0.0
    ratio_sq: float = 0.0

    def add(self, seconds: float, ratio: float) -> None:
        self.steps += 1
        self.seconds += seconds
        self.ratio += ratio
        self.ratio_sq += ratio * ratio

    def mean_ratio(self) -> float:
        return self.ratio / self.steps if self.steps else 1.0

    def mean_seconds(self) -> float:
        return self.seconds / self.steps if self.steps else math.nan

    def noise(self) -> float:
        """The standard error of ``mean_ratio`` (from the steps' own spread)."""
        if self.steps < 2:
            return math.inf
        mean = self.mean_ratio()
        var = max(self.ratio_sq - self.steps * mean * mean, 0.0) / (self.steps - 1)
        return math.sqrt(var / self.steps)

    def disagrees(self, expected: float) -> bool:
        """At least ``MIN_STEPS`` steps whose mean ratio, ``Z`` standard errors either side,
        lies wholly outside ``expected`` within ``TOLERANCE``."""
        if self.steps < MIN_STEPS:
            return False
        mean, margin = self.mean_ratio(), Z * self.noise()
        return mean - margin > expected * TOLERANCE or mean + margin < expected / TOLERANCE


@dataclass
class StepCheck:
    """The run's steps per cell against the profile's, and the corrections they call for."""

    cells: dict[Cell, Ratios] = field(default_factory=dict)
    pool: Ratios = field(default_factory=Ratios)
    scale: float = 1.0
    """What the profile is multiplied by: the pool's mean ratio where it disagrees, else 1."""
    replaced: set[Cell] = field(default_factory=set)
    """Cells priced at their own steps' mean ratio to the profile."""

    def add(self, cell: Cell, seconds: float, profiled: float) -> None:
        """One real step of ``cell`` that took ``seconds``, where the profile says
        ``profiled``; judged at once, so the next price already follows it."""
        ratio = seconds / profiled
        self.cells.setdefault(cell, Ratios()).add(seconds, ratio)
        self.pool.add(seconds, ratio)
        scale = self.pool.mean_ratio() if self.pool.disagrees(1.0) else 1.0
        judged = self.cells if scale != self.scale else {cell: self.cells[cell]}
        self.scale = scale
        for c, r in judged.items():
            if r.disagrees(scale):
                self.replaced.add(c)
            else:
                self.replaced.discard(c)

    def price(self, cell: Cell, profiled: float) -> float:
        """Seconds of a step of ``cell``, whose profiled seconds are ``profiled``."""
        if cell in self.replaced:
            return profiled * self.cells[cell].mean_ratio()
        return profiled * self.scale

    def summary(self, profiled: dict[Cell, float]) -> dict[str, Any]:
        """For the run's step file and ``report``: the pool, and every cell judged (enough
        steps) with its measured and profiled seconds and whether it was replaced."""
        judged = sorted(c for c, r in self.cells.items() if r.steps >= MIN_STEPS)
        return {
            "steps": self.pool.steps,
            "ratio": self.pool.mean_ratio(),
            "scale": self.scale,
            "tolerance": TOLERANCE,
            "cells": [
                {
                    "batch": c[0],
                    "nodes": c[1],
                    "steps": self.cells[c].steps,
                    "measured_s": self.cells[c].mean_seconds(),
                    "profiled_s": profiled[c],
                    "replaced": c in self.replaced,
                }
                for c in judged
            ],
        }
