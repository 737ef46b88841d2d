"""Exact distributions of code that draws at random: a ``Draws`` source that follows the
outcomes a script names, and the depth-first walk over every script, so that each path is run
once with its exact probability (``tests/test_tree_accept.py``: one acceptance;
``tests/test_tree_sampled.py``: whole rows through the engine)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TypeVar

R = TypeVar("R")


class ScriptedDraws:
    """The outcomes a script names (by index), then each further draw's first; records each
    draw's outcomes and the path's probability (the product of the outcomes')."""

    def __init__(self, script: tuple[int, ...]) -> None:
        self.script = script
        self.taken: list[int] = []
        self.options: list[int] = []
        self.weight = 1.0

    def pick(self, outcomes: list[tuple[object, float]]) -> object:
        """One draw among ``outcomes`` (value, probability); those of probability 0 never."""
        outcomes = [(o, w) for o, w in outcomes if w > 0]
        i = self.script[len(self.taken)] if len(self.taken) < len(self.script) else 0
        self.taken.append(i)
        self.options.append(len(outcomes))
        value, w = outcomes[i]
        self.weight *= w
        return value

    def bernoulli(self, chance: float) -> bool:
        c = min(max(chance, 0.0), 1.0)  # the engine's source: uniform u < chance
        return bool(self.pick([(True, c), (False, 1.0 - c)]))


W = TypeVar("W", bound=ScriptedDraws)


def every_path(
    make: Callable[[tuple[int, ...]], W], run: Callable[[W], R]
) -> Iterator[tuple[W, R]]:
    """``run`` once per path of its draws (depth first), with the source that took it."""
    stack: list[tuple[int, ...]] = [()]
    while stack:
        script = stack.pop()
        walk = make(script)
        result = run(walk)
        yield walk, result
        for at in range(len(script), len(walk.taken)):
            stack.extend((*walk.taken[:at], alt) for alt in range(1, walk.options[at]))
