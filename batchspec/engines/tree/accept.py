"""Accepting a verified draft tree: the longest path the target agrees with, plus one bonus token.

Greedy: follow the child whose token is the target's argmax, stop where none is. Sampling:
lossless multi-candidate rejection sampling (SpecInfer; EAGLE's tree sampling). At a node, with
the target's distribution p there, the children are tried in order; child x is accepted with
probability min(1, p(x)/q(x)), and after a rejection p <- normalize(max(p - q, 0)); when every
child failed the bonus token is drawn from the residual p, and at an accepted leaf from the
target's distribution there. Each trial is a standard speculative-sampling step whose
"rejected" branch is the next trial instead of a draw from the residual, so by induction the
emitted token is distributed exactly as p, whatever the children were, as long as each child
was drawn from the q the rule uses given everything before it:

- deterministic children (n-gram, top-k, EAGLE-2; ``draft_probs`` None): q is one-hot at x,
  so x is accepted with probability p(x), and a rejection zeroes p(x) and renormalises;
- children sampled i.i.d. from q = ``draft_probs[node]`` (``with_replacement``): q is the same
  for every sibling;
- children sampled from q without replacement: sibling k's proposal is q with the earlier
  siblings' tokens removed and renormalised (recursive rejection sampling).

Sampled siblings must stay in the order they were drawn: sorting them by q breaks the rule.

Every random choice goes through a ``Draws`` source: a coin with a given chance, a token from a
given distribution. The engine's source draws from a ``torch.Generator`` on the model's device;
a test's source can follow every outcome of every draw with its exact probability, so the
exact check of losslessness runs this module's own ``accept_sampled``, not a copy of it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from batchspec.engines.tree.rows import target_probs
from batchspec.engines.tree.shape import DraftTree
from batchspec.spec.sampling import SamplingSpec

Step = Callable[[torch.Tensor, "torch.Tensor | None", int], tuple[float, torch.Tensor]]


def accept_greedy(tree: DraftTree, logits: torch.Tensor) -> tuple[list[int], int]:
    """Accepted draft nodes (path order, root excluded) and the bonus token, the target's argmax
    at the last accepted node. ``logits`` [N, V] are the target's at each node. Ties in the
    argmax go to the lowest token id (torch.argmax returns the first maximal index), the same
    choice plain greedy decoding makes with torch.argmax."""
    node, accepted = 0, []
    while True:  # argmax only on the path: a row's argmax over 49k logits is ~60 µs here
        want = int(logits[node].argmax())
        nxt = next((c for c in tree.children(node) if tree.tokens[c] == want), None)
        if nxt is None:
            return accepted, want
        accepted.append(nxt)
        node = nxt


def sample_plain(logits: torch.Tensor, draws: Draws, s: SamplingSpec) -> int:
    """A token sampled plainly from ``logits`` [1, V] under ``s`` (a row's first token, and
    the bonus after an accepted path): the argmax when greedy, else one draw from
    ``target_probs``."""
    if s.temperature == 0:
        return int(torch.argmax(logits[0]))
    return draws.categorical(target_probs(logits, s)[0])


def reject_step(p: torch.Tensor, q: torch.Tensor | None, x: int) -> tuple[float, torch.Tensor]:
    """One child's trial: the probability of accepting draft token x given the residual target
    ``p`` (normalised) and the child's proposal ``q`` (None: one-hot at x), and the normalised
    residual to go on with if it is rejected. If the residual has no mass, p <= q everywhere,
    so p == q and rejection has probability 0 up to rounding: p itself is then returned."""
    px = float(p[x])
    if q is None:
        accept = px
        rest = p.clone()
        rest[x] = 0
    else:
        qx = float(q[x])
        if qx <= 0:
            raise ValueError(f"draft token {x} has draft probability 0: it cannot have been drawn")
        accept = min(1.0, px / qx)
        rest = (p - q).clamp_(min=0)
    mass = float(rest.sum())
    return accept, (rest / mass if mass > 0 else p)


def _target(probs: torch.Tensor, node: int) -> torch.Tensor:
    """The target's distribution at a node, normalised."""
    row = probs[node]
    mass = float(row.sum())
    if not mass > 0:
        raise ValueError(f"target probabilities at node {node} sum to {mass}, not > 0")
    return row / mass


def _proposal(tree: DraftTree, node: int, drawn: list[int]) -> torch.Tensor | None:
    """The distribution the next child of ``node`` was drawn from, after siblings ``drawn``."""
    if tree.draft_probs is None:
        return None
    q = tree.draft_probs[node]
    if tree.with_replacement or not drawn:
        return q
    q = q.clone()
    q[drawn] = 0
    mass = float(q.sum())
    if not mass > 0:
        raise ValueError(f"node {node}: draft probabilities left nothing to draw after {drawn}")
    return q / mass


class Draws(Protocol):
    """The random choices acceptance makes, one call per choice."""

    def bernoulli(self, chance: float) -> bool:
        """True with probability ``chance`` (clamped to [0, 1] by the comparison)."""

    def categorical(self, p: torch.Tensor) -> int:
        """A token drawn from ``p`` [vocab] (non-negative, not necessarily normalised)."""


class TorchDraws:
    """``Draws`` from a ``torch.Generator``: one uniform float64 per coin, one per token, made
    on the generator's device (the model's: a CPU generator cannot draw for CUDA tensors) in
    blocks of ``block``, brought to the host in one copy a block (a copy per draw waits for
    the device each time). Keep one per row: a new one starts a new block. On the CPU the
    blocks are the generator's scalar draws, in order."""

    def __init__(self, generator: torch.Generator, block: int = 64) -> None:
        self.generator, self.block = generator, block
        self._left: list[float] = []

    def uniform(self) -> float:
        if not self._left:
            g = self.generator
            us = torch.rand(self.block, generator=g, dtype=torch.float64, device=g.device)
            self._left = us.tolist()[::-1]
        return self._left.pop()

    def bernoulli(self, chance: float) -> bool:
        return self.uniform() < chance

    def categorical(self, p: torch.Tensor) -> int:
        return draw(p, self.uniform())


def accept_sampled(
    tree: DraftTree, probs: torch.Tensor, draws: Draws, step: Step = reject_step
) -> tuple[list[int], int]:
    """Accepted draft nodes (path order, root excluded) and the bonus token, by lossless
    multi-candidate rejection sampling (module docstring). ``probs`` [N, V] is the target's
    distribution at each node after temperature, top-k and top-p (the caller's job);
    ``draft_probs`` on the same device. ``step`` is the per-child rule, replaceable so tests
    can show that a broken rule fails the exact check."""
    if tree.draft_probs is None and step is reject_step:
        return _accept_one_hot(tree, probs, draws)
    node, accepted = 0, []
    while True:
        p = _target(probs, node)
        drawn: list[int] = []
        moved = False
        for child in tree.children(node):
            x = tree.tokens[child]
            chance, residual = step(p, _proposal(tree, node, drawn), x)
            if draws.bernoulli(chance):
                accepted.append(child)
                node, moved = child, True
                break
            drawn.append(x)
            p = residual
        if not moved:
            return accepted, draws.categorical(p)


def _accept_one_hot(tree: DraftTree, probs: torch.Tensor, draws: Draws) -> tuple[list[int], int]:
    """``accept_sampled`` for deterministic children (every engine drafter's), by
    ``reject_step``'s one-hot rule with the target's numbers brought to the host in one copy
    for the whole tree: every node's mass and every child's p(x) at its parent. Child k is
    accepted with p(x_k) / (the mass its rejected elder siblings left), a token already
    rejected with 0; the bonus is drawn from p with the rejected tokens zeroed (``draw``
    normalises). Per tried child the walk in tensors waited for the device ~4 times."""
    n, dev = tree.size, probs.device
    sums = probs.sum(-1)
    if n > 1:
        at = torch.tensor([tree.parents[1:], tree.tokens[1:]], dtype=torch.long, device=dev)
        sums = torch.cat([sums, probs[at[0], at[1]]])
    got = sums.tolist()
    masses, px = got[:n], [0.0, *got[n:]]
    node, accepted = 0, []
    while True:
        mass = masses[node]
        if not mass > 0:
            raise ValueError(f"target probabilities at node {node} sum to {mass}, not > 0")
        rejected: list[int] = []
        for child in tree.children(node):
            x = tree.tokens[child]
            p = 0.0 if x in rejected else px[child]
            if draws.bernoulli(min(1.0, p / mass) if mass > 0 else 0.0):
                accepted.append(child)
                break
            rejected.append(x)
            mass -= p
        else:
            return accepted, draws.categorical(_residual(probs[node], rejected))
        node = accepted[-1]


def _residual(p: torch.Tensor, rejected: list[int]) -> torch.Tensor:
    """``p`` with the rejected tokens zeroed, on its device; ``p`` itself where nothing is
    left (every token with mass rejected: a rejection of probability 0 up to rounding)."""
    if not rejected:
        return p
    rest = p.clone()
    rest[torch.tensor(rejected, dtype=torch.long, device=p.device)] = 0
    return torch.where(rest.sum() > 0, rest, p)


def draw(p: torch.Tensor, u: float) -> int:
    """The token of p (non-negative, not necessarily normalised) at uniform ``u`` in [0, 1),
    by inverting its cumulative sum: torch.multinomial took 1.5 ms on a 49k vocabulary here,
    this ~0.1 ms. A token of probability 0 is never drawn: the first cumulative sum above
    u has mass."""
    cum = torch.cumsum(p, 0, dtype=torch.float64)
    at = int(torch.searchsorted(cum, cum[-1:] * u, right=True))  # the one wait for the device
    if at >= len(cum):  # u rounded up to the total mass
        at = int((p > 0).nonzero()[-1])
    return at
