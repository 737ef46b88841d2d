"""Accepting verified trees (``engines.tree.accept``), checked exactly.

Greedy acceptance on hand-made logits. Sampled acceptance through the engine's own
``accept_sampled``: its random draws come from a source that walks every outcome of every draw
with its exact probability, so on a toy vocabulary, where the target is a full conditional
table, the distribution of the emitted tokens is computed exactly and must equal the target's
to 1e-12 in float64, for deterministic drafts and for drafts sampled from a draft model (every
tree the draft can sample, weighted by its probability), with and without replacement, with
duplicate siblings. Broken rules must fail the same check. A Monte-Carlo run then shows the
engine's generator-backed source drawing what the walk counts.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from typing import Any

import pytest
import torch
from support.walks import ScriptedDraws, every_path

from batchspec.engines.tree.accept import (
    TorchDraws,
    accept_greedy,
    accept_sampled,
    draw,
    reject_step,
)
from batchspec.engines.tree.shape import DraftTree, paths_to_parents, shape_paths

Dist = dict[tuple[int, ...], float]
Table = dict[tuple[int, ...], torch.Tensor]
BONUS = -1
"""What the walk's categorical draw returns: the bonus token, expanded by ``exact``."""


def test_greedy_follows_the_argmax_and_breaks_ties_low() -> None:
    # root 0; children 1 (token 2), 2 (token 3); node 1's children 3 (token 1), 4 (token 3).
    tree = DraftTree([0, 2, 3, 1, 3], [-1, 0, 0, 1, 1])
    logits = torch.full((5, 4), -1.0)
    logits[0, 2] = 5.0  # root wants 2: node 1
    logits[1, 3] = 1.0  # node 1 wants 3: node 4
    logits[4, 1] = logits[4, 3] = 2.0  # tie at the leaf: bonus 1
    assert accept_greedy(tree, logits) == ([1, 4], 1)
    logits[1, 0] = 9.0  # node 1 wants 0: no child has it
    assert accept_greedy(tree, logits) == ([1], 0)
    logits[0, 1] = 9.0
    assert accept_greedy(tree, logits) == ([], 1)


class Walk(ScriptedDraws):
    """``ScriptedDraws`` whose categorical draw must come last: it is not branched here but
    returned as ``BONUS`` with its distribution kept in ``final`` (one run per path, not per
    token)."""

    def __init__(self, script: tuple[int, ...]) -> None:
        super().__init__(script)
        self.final: list[float] | None = None

    def bernoulli(self, chance: float) -> bool:
        assert self.final is None, "a draw after the bonus token"
        return super().bernoulli(chance)

    def categorical(self, p: torch.Tensor) -> int:
        assert self.final is None, "two bonus tokens"
        self.final = (p / p.sum()).tolist()
        return BONUS


def outcomes(run: Callable[[Walk], tuple[int, ...]]) -> Dist:
    """Every result of ``run`` with its exact probability (``every_path``); a result ending
    in ``BONUS`` is spread over the final categorical draw's tokens."""
    out: Dist = {}
    for walk, result in every_path(Walk, run):
        if result and result[-1] == BONUS:
            assert walk.final is not None
            for tok, pr in enumerate(walk.final):
                if pr > 0:
                    seq = (*result[:-1], tok)
                    out[seq] = out.get(seq, 0.0) + walk.weight * pr
        else:
            out[result] = out.get(result, 0.0) + walk.weight
    return out


def exact(tree: DraftTree, probs: torch.Tensor, step=reject_step) -> Dist:
    """The exact distribution of the tokens ``accept_sampled`` emits for this tree (the
    accepted draft tokens, then the bonus)."""

    def run(walk: Walk) -> tuple[int, ...]:
        path, bonus = accept_sampled(tree, probs, walk, step)
        return (*[tree.tokens[i] for i in path], bonus)

    return outcomes(run)


def test_the_walk_counts_exactly() -> None:
    def run(walk: Any) -> tuple[int, ...]:
        first = walk.bernoulli(0.25)
        second = walk.bernoulli(1.5) if first else walk.bernoulli(0.5)
        return (int(first), int(second), walk.categorical(torch.tensor([1.0, 0.0, 3.0])))

    got = outcomes(run)
    want = {(1, 1, 0): 0.0625, (1, 1, 2): 0.1875}
    for second in (0, 1):
        want |= {(0, second, 0): 0.09375, (0, second, 2): 0.28125}
    assert got == pytest.approx(want, abs=1e-15) and set(got) == set(want)


def table(vocab: int, depth: int, seed: int) -> Table:
    """A full conditional distribution over the next token for every context of up to
    ``depth`` tokens, in float64, with one zero per row (so p(x) = 0 and q(x) = 0 occur)."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for n in range(depth + 1):
        for ctx in itertools.product(range(vocab), repeat=n):
            row = torch.rand(vocab, generator=gen, dtype=torch.float64) ** 2
            row[int(torch.randint(vocab, (1,), generator=gen))] = 0
            out[ctx] = row / row.sum()
    return out


def context(tokens: list[int], parents: list[int], node: int) -> tuple[int, ...]:
    """The draft tokens from the root (excluded) down to ``node``."""
    path = []
    while node > 0:
        path.append(tokens[node])
        node = parents[node]
    return tuple(path[::-1])


def rows(tokens: list[int], parents: list[int], tab: Table) -> torch.Tensor:
    return torch.stack([tab[context(tokens, parents, i)] for i in range(len(tokens))])


def continued(dist: Dist, target: Table, length: int) -> Dist:
    """The distribution of the first ``length`` tokens when decoding goes on from the target
    after the emitted ones (the next steps are lossless by the same argument)."""
    out: Dist = {}
    stack = list(dist.items())
    while stack:
        seq, weight = stack.pop()
        if len(seq) >= length:
            out[seq[:length]] = out.get(seq[:length], 0.0) + weight
            continue
        for tok, pr in enumerate(target[seq].tolist()):
            if pr > 0:
                stack.append(((*seq, tok), weight * pr))
    return out


def distance(a: Dist, b: Dist) -> float:
    return max(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


def random_tree(
    rng: random.Random, vocab: int, depth: int, duplicates: bool
) -> tuple[list[int], list[int]]:
    """0 to 3 children per node, breadth first; siblings distinct, or drawn with repeats."""
    tokens, parents, depths = [0], [-1], [0]
    at = 0
    while at < len(tokens):
        if depths[at] < depth:
            n = rng.randrange(4)
            kids = rng.choices(range(vocab), k=n) if duplicates else rng.sample(range(vocab), n)
            for tok in kids:
                tokens.append(tok)
                parents.append(at)
                depths.append(depths[at] + 1)
        at += 1
    return tokens, parents


def no_zeroing(p: torch.Tensor, q: torch.Tensor | None, x: int) -> tuple[float, torch.Tensor]:
    """A broken rule: a rejected token keeps its probability in the residual."""
    return reject_step(p, q, x)[0], p


def no_renormalising(p: torch.Tensor, q: torch.Tensor | None, x: int) -> tuple[float, torch.Tensor]:
    """A broken rule: the residual goes on without being normalised."""
    chance, _ = reject_step(p, q, x)
    rest = p.clone()
    if q is None:
        rest[x] = 0
    else:
        rest = (p - q).clamp_(min=0)
    return chance, rest


@pytest.mark.parametrize("duplicates", [False, True], ids=["distinct", "duplicate-siblings"])
def test_deterministic_drafts_are_lossless_exactly(duplicates: bool) -> None:
    vocab, depth = 5, 3
    target = table(vocab, depth, seed=1)
    want = continued({(): 1.0}, target, depth + 1)
    rng = random.Random(2)
    broken: dict[str, list[float]] = {"no_zeroing": [], "no_renormalising": []}
    repeated = 0
    for _ in range(10):
        tokens, parents = random_tree(rng, vocab, depth, duplicates)
        tree, probs = DraftTree(tokens, parents), rows(tokens, parents, target)
        repeated += any(
            len(kids) > len({tokens[k] for k in kids})
            for kids in map(tree.children, range(len(tokens)))
        )
        dist = exact(tree, probs)
        first = torch.zeros(vocab, dtype=torch.float64)
        for seq, pr in dist.items():
            first[seq[0]] += pr
        assert torch.allclose(first, target[()], rtol=0, atol=1e-12)
        assert distance(continued(dist, target, depth + 1), want) < 1e-12
        for name, rule in (("no_zeroing", no_zeroing), ("no_renormalising", no_renormalising)):
            broken[name].append(
                distance(continued(exact(tree, probs, rule), target, depth + 1), want)
            )
    assert (repeated > 0) == duplicates
    assert min(max(v) for v in broken.values()) > 1e-3  # the check can fail


def drawn_trees(shape: list[int], draft: Table, vocab: int, replacement: bool):
    """Every tree of this shape a draft model can sample, with its probability: siblings
    drawn from q(. | path) i.i.d. or without replacement, in draw order."""
    parents = paths_to_parents(shape_paths(shape))
    for drawn in itertools.product(range(vocab), repeat=len(parents) - 1):
        tokens, weight = [0, *drawn], 1.0
        for i in range(1, len(tokens)):
            q = draft[context(tokens, parents, parents[i])]
            before = [tokens[j] for j in range(1, i) if parents[j] == parents[i]]
            if replacement:
                weight *= float(q[tokens[i]])
            elif tokens[i] not in before:
                weight *= float(q[tokens[i]] / (1 - q[before].sum()))
            else:
                weight = 0.0
        if weight > 0:
            yield weight, tokens, parents


def sampled_mixture(shape, target, draft, vocab, replacement, draws, step=reject_step):
    """The exact output distribution averaged over every tree the draft can sample, and how
    much of the draft's probability went to trees with duplicate siblings."""
    out: Dist = {}
    total = duplicated = 0.0
    for weight, tokens, parents in drawn_trees(shape, draft, vocab, draws):
        q = rows(tokens, parents, draft)
        tree = DraftTree(tokens, parents, q, with_replacement=replacement)
        total += weight
        kids = [tree.children(i) for i in range(len(tokens))]
        duplicated += weight * any(len(k) > len({tokens[c] for c in k}) for k in kids)
        for seq, pr in exact(tree, rows(tokens, parents, target), step).items():
            out[seq] = out.get(seq, 0.0) + weight * pr
    assert abs(total - 1) < 1e-12
    return continued(out, target, len(shape) + 1), duplicated


@pytest.mark.parametrize(
    ("shape", "replacement"),
    [([2, 2], True), ([3, 1], False), ([1, 3], False), ([3], True)],
)
def test_sampled_drafts_are_lossless_exactly(shape: list[int], replacement: bool) -> None:
    vocab = 4
    target, draft = table(vocab, len(shape), seed=7), table(vocab, len(shape), seed=8)
    want = continued({(): 1.0}, target, len(shape) + 1)
    got, duplicated = sampled_mixture(shape, target, draft, vocab, replacement, replacement)
    assert distance(got, want) < 1e-12
    # I.i.d. siblings repeat tokens; siblings drawn without replacement never do.
    assert (duplicated > 0.05) == (replacement and max(shape) > 1)
    # The check can fail: without the residual update, without renormalising it, or with
    # the i.i.d. rule for siblings drawn without replacement.
    for rule in (no_zeroing, no_renormalising):
        bad, _ = sampled_mixture(shape, target, draft, vocab, replacement, replacement, rule)
        assert distance(bad, want) > 1e-2
    if not replacement:
        wrong, _ = sampled_mixture(shape, target, draft, vocab, True, replacement)
        assert distance(wrong, want) > 1e-3


def chi_square_p(samples: dict[tuple[int, ...], int], want: Dist) -> float:
    """Goodness of fit of sampled counts to an exact distribution; cells expected below 5
    counts are pooled."""
    n = sum(samples.values())
    if not set(samples) <= set(want):
        return 0.0
    stat, cells, pooled_obs, pooled_exp = 0.0, 0, 0, 0.0
    for seq, pr in want.items():
        obs, exp = samples.get(seq, 0), n * pr
        if exp < 5:
            pooled_obs, pooled_exp = pooled_obs + obs, pooled_exp + exp
        else:
            stat, cells = stat + (obs - exp) ** 2 / exp, cells + 1
    if pooled_exp > 0:
        stat, cells = stat + (pooled_obs - pooled_exp) ** 2 / pooled_exp, cells + 1
    dof = torch.tensor(cells - 1.0, dtype=torch.float64)
    return float(torch.special.gammaincc(dof / 2, torch.tensor(stat / 2, dtype=torch.float64)))


def sample_counts(tree: DraftTree, probs: torch.Tensor, n: int, step=reject_step):
    draws = TorchDraws(torch.Generator().manual_seed(11))
    counts: dict[tuple[int, ...], int] = {}
    for _ in range(n):
        accepted, bonus = accept_sampled(tree, probs, draws, step)
        seq = (*[tree.tokens[i] for i in accepted], bonus)
        counts[seq] = counts.get(seq, 0) + 1
    return counts


@pytest.mark.parametrize("with_q", [False, True])
def test_the_generator_draws_what_the_walk_counts(with_q: bool) -> None:
    """The engine's source (``TorchDraws``: a uniform per coin, cumulative-sum inversion for
    the bonus) samples the distribution the walk computes, and a planted bias fails: a
    Monte-Carlo check with a fixed seed."""
    vocab = 5
    target, draft = table(vocab, 3, seed=1), table(vocab, 3, seed=8)
    parents = [-1, 0, 0, 0, 1, 1, 2, 4]
    tokens = [0] * len(parents)
    gen = torch.Generator().manual_seed(4)
    for node in range(len(parents)):  # children drawn without replacement, in draw order
        kids = [i for i, p in enumerate(parents) if p == node]
        if not kids:
            continue
        picks = torch.multinomial(draft[context(tokens, parents, node)], len(kids), generator=gen)
        for kid, tok in zip(kids, picks.tolist(), strict=True):
            tokens[kid] = tok
    q = rows(tokens, parents, draft) if with_q else None
    tree = DraftTree(tokens, parents, q, with_replacement=False)
    probs = rows(tokens, parents, target)
    want = exact(tree, probs)
    assert chi_square_p(sample_counts(tree, probs, 3000), want) > 1e-3
    assert chi_square_p(sample_counts(tree, probs, 3000, no_zeroing), want) < 1e-6


def test_draw_inverts_the_cumulative_sum_and_never_picks_a_token_without_mass() -> None:
    p = torch.tensor([1.0, 0.0, 3.0, 0.0])
    assert [draw(p, u) for u in (0.0, 0.2499, 0.25, 0.9999)] == [0, 0, 2, 2]
    assert draw(p, 1.0) == 2  # u rounded up to the total mass: the last token with mass
    assert {draw(torch.tensor([0.0, 0.0, 3.0, 0.0]), u / 10) for u in range(10)} == {2}
