"""The tree engine's drafters: what the engine asks of a draft source and what it tells it.

A drafter keeps its own view of every row in flight, by slot: it sees the prompt when the row
starts (``start``), every token the row commits (``extend``: the first token, then each
step's accepted path and bonus token), and is asked once per step for the trees of the rows
that draft (``draft``, all rows at once, so a draft model runs one batched forward per depth).
It never sees the target's logits or the acceptance's random draws, which keeps any tree it
proposes verifiable losslessly by the one-hot rule (``accept``).

Drafters: ``ngram.NgramDrafter`` (a trie of the context's repeated continuations, no
forward), ``suffix.SuffixDrafter`` (that trie merged with the domain's earlier outputs: a
``Learner``, given every finished row) and ``drafter.ModelDrafter`` (EAGLE-2 growth on a draft
model). A third, an
EAGLE head, would also need the target's last hidden state at each committed position: the
engine would hand those to ``extend`` beside the tokens (the verify forward computes them).

Because a drafter only ever sees committed tokens, it can be driven offline over a finished
row: ``replay`` feeds it a row's prompt and output as the engine would have, and matches each
tree against the output, which gives the engine's own per-step counts for greedy rows at any
K and shape without running the target.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from batchspec.engines.tree.shape import DraftTree
from batchspec.spec.tree import TreeShape


@dataclass(frozen=True)
class Ask:
    """One row's draft request for one step: at most ``budget`` nodes, none deeper than
    ``depth``, within the shape (``branching`` per depth or explicit rank ``paths``; both
    None: a dynamic tree, the best-ranked nodes anywhere)."""

    slot: int
    budget: int
    depth: int
    branching: tuple[int, ...] | None = None
    paths: tuple[tuple[int, ...], ...] | None = None
    domain: str | None = None
    """The row's domain: which of the job's earlier outputs a ``Learner`` drafts from."""


def ask_for(
    slot: int, k: int, shape: TreeShape | None, room: int, domain: str | None = None
) -> Ask | None:
    """The row's request under ``shape`` with ``room`` tokens left to emit before
    ``max_tokens`` (no path needs to outrun it); None: the row drafts nothing this step."""
    if k <= 0 or room <= 0 or shape is None:
        return None
    branching = tuple(shape.branching) if shape.branching is not None else None
    paths = tuple(tuple(p) for p in shape.paths) if shape.paths is not None else None
    return Ask(slot, k, min(shape.depth(), room), branching, paths, domain)


class Drafter(Protocol):
    """A draft source for the rows in flight, each known by its slot."""

    def start(self, slot: int, prompt: Sequence[int], twin: int | None = None) -> None:
        """A row enters ``slot`` with this prompt; ``twin``: a slot in flight whose row has
        the same prompt (its state may be copied instead of computed)."""

    def extend(self, slot: int, tokens: Sequence[int]) -> None:
        """Tokens the row committed, in order; the last one is the root of its next tree."""

    def draft(self, asks: Sequence[Ask]) -> list[DraftTree]:
        """One tree per ask, in order, each rooted at its row's last committed token."""

    def release(self, slot: int) -> None:
        """The row in ``slot`` is done; the slot may start another row."""


@runtime_checkable
class Learner(Protocol):
    """A drafter that learns from the job's own outputs (``suffix.SuffixDrafter``): the engine
    gives it every row that finishes, at any K, with its domain."""

    def learn(self, domain: str | None, output: Sequence[int]) -> None:
        """A row of ``domain`` finished with these tokens."""

    def view(self, slot: int, domain: str | None) -> int:
        """What the row in ``slot`` drafted from: the position of ``domain``'s index below
        which it read (asked before the row is released and learned). A replay that reads
        the same index below it drafts what the row drafted, at any batch size."""


def learn_row(drafter: object, slot: int, domain: str | None, output: Sequence[int]) -> int | None:
    """A finished row (at any K) given to a drafter that learns from the job's outputs, before
    its slot is released: returns what the row drafted from (``Learner.view``, read before the
    row itself is learned: its replay reads the index below it), or None where the drafter
    does not learn."""
    if not isinstance(drafter, Learner):
        return None
    view = drafter.view(slot, domain)
    drafter.learn(domain, output)
    return view


@dataclass
class Replayed:
    """A row's drafting replayed: per verify step that drafted, the draft nodes, the depth the
    engine records for it (``per_step_drafted``: the deepest node's, or the accepted path's
    when the row ended inside it), and the draft tokens the output accepted."""

    nodes: list[int]
    depth: list[int]
    accepted: list[int]


def replay(
    drafter: Drafter,
    prompt: Sequence[int],
    out: Sequence[int],
    k: int,
    shape: TreeShape,
    max_tokens: int,
    slot: int = 0,
    domain: str | None = None,
) -> Replayed:
    """Drive ``drafter`` over a finished greedy row (``out``: its tokens) as the engine drove
    it, without the target: greedy acceptance only compares draft tokens with the target's
    choices, which are ``out`` itself, so each tree is matched against the output and the
    accepted path plus the next output token (the bonus) are committed. Draft tokens past the
    row's end count as not accepted, as the engine counts them. ``domain``: the row's; a
    ``Learner`` drafts from what it learned so far (the caller feeds it the rows the engine had
    finished before this one, and this row after, if others follow)."""
    got = Replayed([], [], [])
    drafter.start(slot, prompt)
    drafter.extend(slot, out[:1])
    t = 1
    while t < len(out):
        request = ask_for(slot, k, shape, max_tokens - t, domain)
        if request is None:
            tree = DraftTree([out[t - 1]], [-1])
        else:
            (tree,) = drafter.draft([request])
        node, path = 0, 0
        while t + path < len(out):
            want = out[t + path]
            node = next((c for c in tree.children(node) if tree.tokens[c] == want), -1)
            if node < 0:
                break
            path += 1
        if tree.size > 1:
            got.nodes.append(tree.size - 1)
            got.depth.append(max(tree.depths()) if t + path < len(out) else path)
            got.accepted.append(path)
        drafter.extend(slot, out[t : t + path + 1])
        t += path + 1
    drafter.release(slot)
    return got
