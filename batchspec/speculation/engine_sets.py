"""The cheapest set of engines for a plan: which K are worth an engine start, exactly.

``policy.KPolicy`` knows each domain's predicted time at every K of the grid; with vLLM fixing
K per engine, every K in the plan beyond the engine that is up costs a start. Over every
subset of the grid this finds the one whose domains' best times plus starts are least, by a
dynamic program over bit sets (2^G vector minima), so that a hundred domains and a dozen K
cost about a millisecond.
"""

from __future__ import annotations

import functools

import numpy as np

MAX_PLAN_K = 16
"""The engine plan is exact over this many K with predictions (2^16 sets); beyond, it keeps
the K that most domains are fastest at."""
_PLAN_CELLS = 1 << 22
"""Sets x domains evaluated at once in the plan (memory: 8 bytes each)."""


def cheapest_engine_set(
    seconds: np.ndarray, grid: list[int], required: set[int], engine_k: int | None, build_s: float
) -> list[int]:
    """Columns of ``grid`` forming the cheapest set of engines: over every subset S, the sum
    over domains (rows of ``seconds``) of the fastest K in S, plus ``build_s`` per engine of
    S ∪ ``required`` that is not ``engine_k`` (the one up; with none up, the first is free).

    Exact, by a dynamic program over bit sets: the domains' best time within S ∪ {K_i} is the
    minimum of their best time within S and their time at K_i, so the 2^G sets take 2^G
    vector minima (4096 x 100 domains for 12 K: about a millisecond).
    """
    cols = _candidates(seconds, grid, required, engine_k)
    n = len(cols)
    total = np.zeros(1 << n)
    step = max(1, _PLAN_CELLS >> n)
    for lo in range(0, seconds.shape[0], step):
        part = seconds[lo : lo + step, cols]
        best = np.empty((1 << n, part.shape[0]))
        best[0] = np.inf
        for i in range(n):
            np.minimum(best[: 1 << i], part[:, i], out=best[1 << i : 2 << i])
        total += best @ np.ones(part.shape[0])
    sets = np.arange(1 << n)
    size = _set_sizes(n)
    chosen_k = [grid[c] for c in cols]
    with_required = sets | sum(1 << i for i, k in enumerate(chosen_k) if k in required)
    engines = size[with_required] + len(required - set(chosen_k))
    if engine_k is None:
        up = 1
    elif engine_k in required or engine_k not in chosen_k:
        up = int(engine_k in required)
    else:
        up = with_required >> chosen_k.index(engine_k) & 1
    cost = total + build_s * np.maximum(engines - up, 0)
    # Of equally cheap sets, the one with fewest K.
    best_set = int(np.lexsort((size, cost))[0])
    return [c for i, c in enumerate(cols) if best_set >> i & 1]


@functools.lru_cache(maxsize=4)
def _set_sizes(n: int) -> np.ndarray:
    """Members of each of the 2^n bit sets."""
    return ((np.arange(1 << n)[:, None] >> np.arange(n)) & 1).sum(axis=1)


def _candidates(
    seconds: np.ndarray, grid: list[int], required: set[int], engine_k: int | None
) -> list[int]:
    """Grid columns worth a place in the set: those with a prediction for some domain (a K
    nobody can run at only adds a start). Beyond ``MAX_PLAN_K`` of them, the ones most domains
    are fastest at, then the engine that is up and the required ones, then the fastest overall."""
    cols = [j for j in range(len(grid)) if np.isfinite(seconds[:, j]).any()]
    if len(cols) <= MAX_PLAN_K:
        return cols
    fastest = np.bincount(np.argmin(seconds, axis=1), minlength=len(grid))
    total = np.where(np.isfinite(seconds), seconds, 0).sum(axis=0)

    def rank(j: int) -> tuple[int, bool, float]:
        return (-fastest[j], grid[j] != engine_k and grid[j] not in required, total[j])

    return sorted(sorted(cols, key=rank)[:MAX_PLAN_K])
