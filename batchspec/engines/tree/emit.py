"""What a row emits from the logits the target gave it: the first token after its prefill and,
each step, the accepted path of its verified tree and the bonus token.

The sampling rules live here, apart from the engine's loop (``engine.py``), because they are
what losslessness rests on and what the tests drive: penalties and ``min_tokens`` on what the
row samples from (each node along its own path, ``penalties.py``), the planted bias ``verify``
must catch (``engines.planted``), greedy's longest argmax path, multi-candidate rejection
sampling (``accept.py``), and logprobs always from the model's own logits, never the penalised
or tempered ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from batchspec.engines.tree.accept import accept_greedy, accept_sampled, sample_plain
from batchspec.engines.tree.penalties import open_penalties
from batchspec.engines.tree.rows import Stops, TreeRow, target_probs, top_logprobs
from batchspec.engines.tree.shape import DraftTree
from batchspec.spec.sampling import SamplingSpec


class Accepted(NamedTuple):
    """A step's outcome for one row."""

    kept: list[int]
    """The tree's nodes to keep in the cache: the root and the accepted path."""
    emitted: list[int]
    """The path's tokens and the bonus token."""
    counted: int
    """How many of ``emitted`` the row kept (it may end inside its path)."""


@dataclass(frozen=True)
class Emitter:
    """A job's sampling rules applied to one row at a time (a row's own ``sampling`` first)."""

    sampling: SamplingSpec
    """The job's sampling, for rows without their own."""
    stops: Stops
    logprobs: int | None
    """Top logprobs per emitted token (None: none)."""
    planted: bool
    """The planted bias: every draft token accepted (``verify`` must fail it)."""

    def first(self, row: TreeRow, prompt: list[int], logits: torch.Tensor) -> int:
        """Open the row's penalties on its prompt and emit its first token, sampled plainly
        from the prefill's last ``logits``."""
        s = row.req.sampling or self.sampling
        row.penalty = open_penalties(s, prompt, logits)
        scored = logits.unsqueeze(0)
        if row.penalty is not None:  # penalties, min_tokens: on what the row samples from
            scored = row.penalty.apply(scored, None, self.stops.eos_ids)
        first = sample_plain(scored, row.draws, s)
        row.emit([first], self.stops, self._logprobs(logits.unsqueeze(0), [first]))
        if row.penalty is not None:
            row.penalty.extend([first])
        return first

    def step(self, row: TreeRow, tree: DraftTree, logits: torch.Tensor) -> Accepted:
        """Accept a path of the row's verified ``tree`` (``logits``: one per node) and emit it
        with the bonus token."""
        s = row.req.sampling or self.sampling
        scored = logits  # each node penalised along its own path (penalties.py)
        if row.penalty is not None:
            scored = row.penalty.apply(logits, tree, self.stops.eos_ids)
        if self.planted:
            path = tree.first_path()
            last = path[-1] if path else 0
            bonus = sample_plain(scored[last : last + 1], row.draws, s)
        elif s.temperature == 0:
            path, bonus = accept_greedy(tree, scored)
        else:
            path, bonus = accept_sampled(tree, target_probs(scored, s), row.draws)
        kept = [0, *path]
        emitted = [tree.tokens[i] for i in path] + [bonus]
        counted = row.emit(emitted, self.stops, self._logprobs(logits[kept], emitted))
        if row.penalty is not None:
            row.penalty.extend(emitted[:counted])
        return Accepted(kept, emitted, counted)

    def _logprobs(self, logits: torch.Tensor, tokens: list[int]) -> list | None:
        if self.logprobs is None:
            return None
        return top_logprobs(logits, tokens, self.logprobs)
