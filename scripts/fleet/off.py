"""Claiming mechanisms that only save work, switched off in the fleet simulator (``--off``).

Exactly once rests on the part commit alone (link to the final name, first wins); every other
mechanism of claiming only saves work or sees that somebody does each unit. Each switch
monkeypatches the product's code in the simulator's processes (the product is not changed),
so one command measures what a mechanism buys (issue 33, docs/fleet.md):

- ``watch``: no watch ring (``Watch.look`` does nothing): dead workers' units wait for a
  claimant that tries them.
- ``linger_all`` / ``linger_none``: every worker / no worker lingers at the end
  (``Claims.lingers``).
- ``steal``: no work stealing by halves (``Claims._jump`` does nothing).
- ``held``: no listing of leases/ (``HeldIndex.held`` always False): every unit met is tried.

Claiming ahead (a unit claimed before an engine starts) has no switch: it keeps an engine from
being built for units others hold, which the stand-in engine (free to start) does not model.
"""

from __future__ import annotations

from collections.abc import Callable

from batchspec.work import claims as claims_mod
from batchspec.work import indexes as indexes_mod
from batchspec.work import watch as watch_mod


def _lingers(value: bool) -> Callable[[], None]:
    def switch() -> None:
        claims_mod.Claims.lingers = lambda self: value  # type: ignore[method-assign]

    return switch


def _watch() -> None:
    watch_mod.Watch.look = lambda self: None  # type: ignore[method-assign]


def _steal() -> None:
    claims_mod.Claims._jump = lambda self, scheduler, k: None  # type: ignore[method-assign]


def _held() -> None:
    indexes_mod.HeldIndex.held = lambda self, unit_id: False  # type: ignore[method-assign]


SWITCHES: dict[str, Callable[[], None]] = {
    "watch": _watch,
    "linger_all": _lingers(True),
    "linger_none": _lingers(False),
    "steal": _steal,
    "held": _held,
}


def check(names: list[str]) -> None:
    for name in names:
        if name not in SWITCHES:
            raise SystemExit(f"--off: unknown mechanism {name!r} (one of {', '.join(SWITCHES)})")


def switch_off(names: list[str]) -> None:
    """Switch the named mechanisms off in this process (before any worker is made)."""
    check(names)
    for name in names:
        SWITCHES[name]()
