"""A unit source for engine tests that notes what the engine's consumer already held each
time the engine took a unit: the order of handing over and taking is what lets a unit's K be
chosen knowing the units that just finished (``tests/test_tree_loop.py``,
``tests/test_vllm_feed.py``)."""

from __future__ import annotations

from typing import Any

from batchspec.engines.base import ListSource
from batchspec.units import RowRequest, UnitRequests, WorkUnit


class Watched(ListSource):
    """A list of units that notes, as the engine takes each, how many finished units its
    consumer (``got``) already holds."""

    def __init__(self, units: list[UnitRequests], got: list[Any]):
        super().__init__(units)
        self.got, self.held_at_take = got, []

    def next_unit(self) -> UnitRequests | None:
        unit = super().next_unit()
        if unit is not None:
            self.held_at_take.append(len(self.got))
        return unit


def one_row_units(prompts: list[list[int]]) -> list[UnitRequests]:
    """A unit of one row per prompt."""
    return [
        UnitRequests(WorkUnit(i, "in.parquet", i, i + 1, None, 1), [RowRequest(i, i, None, {}, p)])
        for i, p in enumerate(prompts)
    ]
