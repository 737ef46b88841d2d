"""The random draws of sampled tree decoding (``accept.draw``, ``accept.TorchDraws``), exactly.

Every token a sampled row emits comes from ``TorchDraws``: a coin per tried child, and the
first and every bonus token by ``draw``, which inverts the cumulative sum at a uniform u. The
walk in ``test_tree_accept`` and ``test_tree_sampled`` replaces these draws, so their own
rules need their own check, and a Monte-Carlo test (3,000 samples) cannot see an error at a
boundary (u equal to a cumulative sum) or a bias below a percent. On dyadic probabilities
every interval of u is a whole number of steps of 2^-8, so the share of the 256 grid points
each outcome takes is its exact probability under a uniform u.
"""

from __future__ import annotations

import torch

from batchspec.engines.tree.accept import TorchDraws, draw

GRID = 256


class Grid(TorchDraws):
    """``TorchDraws`` with its uniforms given: the real ``bernoulli`` and ``categorical``."""

    def __init__(self, us: list[float]) -> None:
        super().__init__(torch.Generator())
        self.us = us

    def uniform(self) -> float:
        return self.us.pop(0)


def shares(pick) -> dict[object, float]:
    """Each outcome of ``pick(draws)`` with its probability under a uniform u: its share of
    the grid u = j / 256."""
    out: dict[object, float] = {}
    for j in range(GRID):
        got = pick(Grid([j / GRID]))
        out[got] = out.get(got, 0.0) + 1 / GRID
    return out


def test_draw_gives_each_token_its_share_of_the_mass_exactly() -> None:
    """Unnormalised weights (total 2) with zeros among them, at the ends and inside: each
    token is drawn with probability weight / total exactly, and a token without mass never
    (at u on a boundary the token above it is drawn)."""
    p = torch.tensor([0.0, 0.75, 0.0, 0.25, 1.0, 0.0], dtype=torch.float64)
    assert shares(lambda d: d.categorical(p)) == {1: 0.375, 3: 0.125, 4: 0.5}
    assert shares(lambda d: draw(p.float(), d.uniform())) == {1: 0.375, 3: 0.125, 4: 0.5}
    assert [draw(p, u) for u in (0.375, 0.5, 1.0)] == [3, 4, 4]


def test_a_coin_comes_up_with_its_chance_exactly() -> None:
    """``bernoulli(c)`` is u < c: true on a share c of the grid, for chances at and between
    grid points, 0 and 1 included (a chance above 1 is 1)."""
    for chance in (0.0, 1 / GRID, 0.375, 0.6015625, 1.0, 1.5):
        assert shares(lambda d, c=chance: d.bernoulli(c)).get(True, 0.0) == min(chance, 1.0)


def test_the_generator_gives_one_float64_uniform_per_draw_in_order() -> None:
    """A row's draws from its seed are a function of the seed alone: coin i and token i read
    the i-th float64 uniform of the generator (what makes a seeded row reproducible and a
    walked row's probabilities the engine's)."""
    p = torch.tensor([0.5, 0.0, 0.25, 0.25], dtype=torch.float64)
    us = torch.rand(40, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    draws = TorchDraws(torch.Generator().manual_seed(5))
    got = [draws.bernoulli(0.5) if i % 2 else draws.categorical(p) for i in range(40)]
    want = [bool(u < 0.5) if i % 2 else draw(p, float(u)) for i, u in enumerate(us.tolist())]
    assert got == want
