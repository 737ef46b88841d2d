"""Several drafters in one tree engine, each row drafting with its unit's (``speculative.
drafters``), and what each one's drafting costs per row and step, measured.

The K controller chooses a drafter per domain as it chooses K (``speculation/drafters.py``),
so the engine loads every enabled drafter once and a unit carries its drafter as it carries
its K: a domain switches drafter without a rebuild or a drained batch. Drafters may share
parts (suffix trees use the n-gram drafter's per-slot tries; n-gram first uses both the trie
and the model), so every slot is started, extended and released through exactly one of them,
its row's; ``draft`` asks each drafter once per step for all of its rows (one batched forward
per depth for a model).

The time each ``draft`` call takes is the drafter's cost: a model drafter's forwards are most
of a step, an n-gram trie's a fraction of a millisecond. The engine's step profile prices the
verify forward alone (the engine leaves drafting out of what it checks the profile against),
so a drafter's price is the profiled step plus what it was measured to cost here, or, for a
drafter the engine has not run yet, in the worker's replay of it (``replayed``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from batchspec.engines.tree.drafting import Ask, Drafter, Learner
from batchspec.engines.tree.shape import DraftTree

MIN_STEPS = 20
"""Row-steps of a drafter's own drafting before its measured mean prices it."""


def recorded_method(s: Any, k: int, drafter: str | None = None) -> str:
    """A unit's ``spec_method`` at K = ``k`` with ``drafter`` (``s``: the speculative section;
    default: its method): ``none`` at K=0, else e.g. ``suffix-tree`` or ``eagle3+ngram-tree``
    (n-gram trees first: ``tree.ngram_first``, or the drafter ``eagle3+ngram``)."""
    if drafter is None:  # the job's method, n-gram first under ``tree.ngram_first``
        hybrid = s.tree is not None and s.tree.ngram_first
        drafter = s.method + ("+ngram" if hybrid else "")
    return "none" if k == 0 else f"{drafter}-tree"


class DraftCosts:
    """Seconds of drafting per row and step, per drafter: from the engine's own steps, and
    from the worker's replay of finished rows (a drafter this engine has not run yet)."""

    def __init__(self) -> None:
        self.engine: dict[str, list[float]] = {}
        """Per drafter: [seconds, row-steps drafted] in the engine."""
        self.replayed: dict[str, list[float]] = {}
        """Per drafter: [seconds, row-steps drafted] in the worker's replay."""

    def add(self, drafter: str, seconds: float, rows: int, replayed: bool = False) -> None:
        sums = (self.replayed if replayed else self.engine).setdefault(drafter, [0.0, 0.0])
        sums[0] += seconds
        sums[1] += rows

    def per_row(self, drafter: str) -> float | None:
        """Seconds one row's draft costs a step: the engine's mean once it has ``MIN_STEPS``
        row-steps, else the replay's, else the engine's fewer; None: never measured."""
        own = self.engine.get(drafter)
        for sums in (own if own and own[1] >= MIN_STEPS else None, self.replayed.get(drafter), own):
            if sums and sums[1] > 0:
                return sums[0] / sums[1]
        return None

    def summary(self) -> dict[str, float]:
        """Per drafter measured, seconds per row and step (``report`` prices with them)."""
        out = {d: self.per_row(d) for d in {*self.engine, *self.replayed}}
        return {d: s for d, s in sorted(out.items()) if s is not None}


class DrafterSet:
    """A ``Drafter`` over several, by name: each slot drafts with the one its row was
    ``assign``-ed (the unit's drafter), started, extended and released through it alone."""

    def __init__(self, drafters: dict[str, Drafter], costs: DraftCosts | None = None) -> None:
        self.drafters = drafters
        self.of: dict[int, str] = {}
        """The drafter of each slot in flight."""
        self.costs = costs or DraftCosts()

    def assign(self, slot: int, name: str) -> None:
        """The row about to start in ``slot`` drafts with ``name`` (one of ``drafters``)."""
        if name not in self.drafters:
            raise ValueError(f"drafter {name} is not loaded (loaded: {', '.join(self.drafters)})")
        self.of[slot] = name

    def start(self, slot: int, prompt: Sequence[int], twin: int | None = None) -> None:
        # A twin's state is copied only from a row of the same drafter (``admit.Prompts``
        # copies a prompt only then: another drafter never made this one's state).
        same = twin is not None and self.of.get(twin) == self.of[slot]
        self.drafters[self.of[slot]].start(slot, prompt, twin if same else None)

    def extend(self, slot: int, tokens: Sequence[int]) -> None:
        self.drafters[self.of[slot]].extend(slot, tokens)

    def draft(self, asks: Sequence[Ask]) -> list[DraftTree]:
        """Each drafter once, for its rows; trees in the asks' order; each call timed."""
        trees: list[DraftTree | None] = [None] * len(asks)
        for name, drafter in self.drafters.items():
            mine = [i for i, a in enumerate(asks) if self.of[a.slot] == name]
            if not mine:
                continue
            started = time.perf_counter()
            for i, tree in zip(mine, drafter.draft([asks[i] for i in mine]), strict=True):
                trees[i] = tree
            self.costs.add(name, time.perf_counter() - started, len(mine))
        return trees  # type: ignore[return-value]

    def release(self, slot: int) -> None:
        name = self.of.pop(slot, None)
        if name is not None:
            self.drafters[name].release(slot)


class LearningDrafterSet(DrafterSet):
    """A ``DrafterSet`` with a drafter that learns from the job's outputs (suffix trees): a
    ``drafting.Learner`` itself, so the engine gives it every finished row and the worker the
    committed ones (``work/seeding.py``), which a set without one does not need."""

    def learn(self, domain: str | None, output: Sequence[int]) -> None:
        """Every drafter that learns sees every finished row, whichever drafter ran it."""
        for drafter in self.drafters.values():
            if isinstance(drafter, Learner):
                drafter.learn(domain, output)

    @property
    def learner(self) -> Learner:
        """The drafter that learns (the job lists a drafter once: one suffix drafter)."""
        return next(d for d in self.drafters.values() if isinstance(d, Learner))

    def view(self, slot: int, domain: str | None) -> int:
        """``drafting.Learner.view`` of the learning drafter, whichever drafter ran the row
        (one that did not draft from the index reads where it stands)."""
        return self.learner.view(slot, domain)


def drafter_set(drafters: dict[str, Drafter]) -> DrafterSet:
    """The set of ``drafters``: a ``LearningDrafterSet`` where one of them learns."""
    learns = any(isinstance(d, Learner) for d in drafters.values())
    return (LearningDrafterSet if learns else DrafterSet)(drafters)
