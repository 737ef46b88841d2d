"""What a tree engine step costs at the nodes its rows actually draft, not at K.

K is a budget of draft nodes, and a model-free tree often holds fewer: an n-gram or suffix
trie has only as many continuations as the context (and, for suffix trees, the domain's
outputs) repeats. A verify forward costs what its trees hold, padded to the widest one
(``shape.batch_layout``), so pricing every step at the full K over-prices K for a domain whose
trees are sparse, and can turn speculation off where it pays. Replay counts the nodes each
step of a row drafts at every K (``speculation.replay``), which gives a domain's mean nodes
per decode step, ``fill``·K, from its first unit at any K.

At batch 1 a step costs the row's own nodes, so the domain's step at K is priced at its mean;
so does a packed step at any batch (``packing``: the products run over the trees' real nodes,
the CPU's forwards), whose cost follows the nodes its B trees hold together: the profile's
cell of B rows x the mean. Padded (a GPU's), a step of B rows costs the widest of B trees,
which the mean alone does not fix: it depends on how the nodes spread from step to step. Of
all spreads with that mean, the widest of B trees drawn independently is largest when every
tree holds K nodes or none, at K·(1 − (1 − fill)^B) (Jensen's inequality: the widest's
expectation is ∫ 1 − F(x)^B dx over [0, K], and 1 − (1 − u)^B is concave in u = 1 − F(x),
whose integral is the mean). The price takes that
bound: the mean itself at batch 1, never below what the padding can cost, never above the
full K priced before.

This module imports no torch: ``report`` and ``status`` price K as the run did from the
prices the worker wrote (``speculation.steps``).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence


def widest_nodes(k: int, fill: float, batch: float) -> float:
    """The nodes a step of ``batch`` rows at ``k`` is priced at, when each row's trees hold
    ``fill``·k nodes a step on average: the widest tree's bound (the module's docstring)."""
    share = min(max(fill, 0.0), 1.0)
    return k * (1.0 - (1.0 - share) ** max(batch, 1.0))


def interp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise linear through (xs, ys), xs ascending; linear beyond the ends."""
    if len(xs) == 1:
        return ys[0]
    i = min(max(bisect_left(xs, x), 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def seconds_drafted(
    at: Callable[[int], float],
    nodes: Sequence[int],
    k: int,
    fill: float,
    batch: float,
    packed: bool = False,
) -> float:
    """Seconds of a step of ``batch`` rows at ``k`` whose trees hold ``fill``·k nodes a step
    on average: ``at(n)`` (a step's seconds at ``n`` nodes, for ``n`` of ``nodes``,
    ascending) interpolated linearly at the mean (``packed``) or ``widest_nodes`` between
    the two node counts around it. Only those two are priced: ``at`` may apply the run's
    corrections (``step_check``)."""
    x = widest_nodes(k, fill, 1 if packed else batch)
    if len(nodes) == 1:
        return at(nodes[0])
    i = min(max(bisect_left(nodes, x), 1), len(nodes) - 1)
    pair = nodes[i - 1 : i + 1]
    return interp(pair, [at(n) for n in pair], x)
