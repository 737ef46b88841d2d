"""Replayed acceptance: what every K of the grid would have accepted on a finished row.

A drafter is a function of the context alone, so the drafts it would have proposed at any K
follow from a row's prompt and output without running the target: step by step, draft from
the context, match the draft against the output (the target's choices), commit the matched
path and the next output token (the bonus), and go on. For greedy rows this is exact: at the
K that ran it gives the engine's own counts. For sampled rows with deterministic drafts
(n-gram chains and trees), the emitted token equals a draft token exactly when it was
accepted (one-hot acceptance), so at the K that ran the counts are again the real ones, and at
other K the match rate is an unbiased estimate of acceptance (the indicator "sampled token =
draft token" has expectation p(draft)).

Three drafters are replayed: vLLM 0.32's n-gram proposer (``vllm/v1/spec_decode/
ngram_proposer.py``: the longest suffix of ``prompt_lookup_min..max`` tokens that occurred
before, its earliest occurrence, the K tokens after it), and the tree engine's n-gram trees
and suffix trees (``engines.tree.drafting.replay`` with the job's tree shape at each K). Suffix
trees also draft from the domain's earlier outputs, which the replay learns in the order it
sees rows (unit by unit), not the engine's (row by row, as each finished): its counts are an
after-the-fact estimate, and the run log's replay check says how often they equal the
engine's. Drafts that need a model or Arctic Inference (vLLM's draft model, EAGLE, MTP, suffix
decoding; the tree engine's draft-model trees) are not replayed: their rows carry no replay,
and the controller measures those K instead.

Beside the accepted drafts, replay counts the drafts proposed at every K: vLLM's draft tokens,
the trees' draft nodes (a trie holds K or fewer). They are what a domain's steps cost at K,
priced per domain (``Controller.fill_cost``), from its first unit at any K.

One caveat on vLLM: it counts draft tokens accepted past a row's end (an EOS or ``max_tokens``
inside an accepted draft; its sampler accepts before the stop check truncates the output),
which no replay can know: the replay counts only emitted tokens, as the tree engine does.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from batchspec.spec import JobSpec
from batchspec.spec.tree import TREE
from batchspec.units import RowResult

VLLM_DEFAULT_LOOKUP = 5
"""vLLM's ``prompt_lookup_min`` and ``_max`` when neither is set (``SpeculativeConfig``)."""


def vllm_lookup(lo: int | None, hi: int | None) -> tuple[int, int]:
    """The n-gram lengths vLLM matches: one bound set stands for both, neither means 5."""
    if lo is None and hi is None:
        return VLLM_DEFAULT_LOOKUP, VLLM_DEFAULT_LOOKUP
    return (lo if lo is not None else hi), (hi if hi is not None else lo)  # type: ignore[return-value]


def ngram_starts(tokens: Sequence[int], first: int, min_n: int, max_n: int) -> list[int]:
    """Where vLLM's n-gram proposer starts copying for each context ``tokens[:m]``, m from
    ``first`` to ``len(tokens)`` (index m − first); −1 where it proposes nothing.

    vLLM's rule (``_find_longest_matched_ngram_and_propose_tokens``): the longest suffix of
    ``min_n..max_n`` tokens that also occurs ending before the context's last token, at its
    earliest occurrence; the draft is what followed it. Kept incrementally: the earliest end
    of every n-gram, so all contexts of a row cost O(len · (max_n − min_n + 1))."""
    earliest: dict[tuple[int, ...], int] = {}
    out: list[int] = []
    toks = list(tokens)
    indexed = 0  # n-grams ending before this index are in ``earliest``
    for m in range(first, len(toks) + 1):
        # The occurrence must end at m - 2 at the latest (before the suffix's own end).
        while indexed <= m - 2:
            for n in range(min_n, min(max_n, indexed + 1) + 1):
                earliest.setdefault(tuple(toks[indexed - n + 1 : indexed + 1]), indexed)
            indexed += 1
        start = -1
        for n in range(min(max_n, m - 1), min_n - 1, -1):
            end = earliest.get(tuple(toks[m - n : m]))
            if end is not None:
                start = end + 1
                break
        out.append(start)
    return out


class Chain(NamedTuple):
    """vLLM's n-gram proposer at one K replayed over one row (``replay_chain``)."""

    steps: int
    """Verify steps that drafted."""
    drafted: int
    """Draft tokens proposed (K a step, fewer where the match's continuation or the model's
    length runs out): what the row's drafts cost the engine's steps (``Controller.fill_cost``)."""
    accepted: int
    open_end: bool
    """The last step's draft matched up to the row's end with tokens left: vLLM may count
    more accepted tokens than were emitted (the module's caveat)."""


def replay_chain(
    tokens: Sequence[int], prompt_len: int, starts: list[int], k: int, max_model_len: int
) -> Chain:
    """vLLM's n-gram proposer at K on a row (``tokens``: prompt then output; ``starts``:
    ``ngram_starts`` from ``prompt_len + 1``). The first output token comes from the prefill;
    every later step drafts from the context so far and emits its accepted draft tokens and
    one more."""
    n_out = len(tokens) - prompt_len
    steps = drafted = accepted = 0
    open_end = False
    t = 1
    while t < n_out:
        m = prompt_len + t
        s = starts[t - 1]
        room = min(k, max_model_len - m)
        length = min(room, m - s) if s >= 0 and room > 0 else 0
        got = 0
        while got < length and t + got < n_out and tokens[s + got] == tokens[m + got]:
            got += 1
        if length:
            steps += 1
            drafted += length
            accepted += got
            open_end = t + got == n_out and got < length
        t += got + 1
    return Chain(steps, drafted, accepted, open_end)


class TreeSteps(NamedTuple):
    """The tree engine's trees at one K replayed over one row (``Replayer._tree``)."""

    steps: int
    """Verify steps that drafted (a tree beyond its root)."""
    nodes: int
    """Draft nodes the trees held, summed over the row's steps: K or fewer a step (a trie
    holds only the continuations it has seen), what the row's steps cost at batch 1."""
    accepted: int


class Trees(NamedTuple):
    """A drafter's trees over one row at every K of the grid, in its order."""

    accepted: list[int]
    nodes: list[int]


@dataclass
class Replayer:
    """Replays the job's drafter over finished rows at every K of ``grid``.

    ``supported`` is False where the job's drafts need a model: then ``row`` gives None."""

    spec: JobSpec
    engine: str
    grid: list[int]
    max_model_len: int
    open_end: set[int] = field(default_factory=set)
    """The K at which the last row's final draft outran the row's end (vLLM n-gram only):
    there vLLM's own count may exceed the replay's."""
    drafted: dict[str, dict[int, int]] | None = None
    """Per drafter replayed (as ``each``), the last row's drafts at each K of the grid: draft
    tokens of vLLM's chains (``Chain.drafted``), draft nodes of the tree engine's trees (the
    verify forward's width at batch 1: ``engines.tree.drafted``); what its drafts cost,
    priced per domain (``Controller.fill_cost``). None where the row was not replayed."""
    suffix: Any = None
    """``method: suffix`` on the tree engine: the ``SuffixDrafter`` replayed (made on the
    first row). With ``learner`` it reads the engine's indexes; without, its own, which learn
    each row after it is replayed (exact at batch 1 only, where rows finish in order)."""
    learner: Any = None
    """The engine's suffix drafter (``TreeEngine.learner``): a row is replayed against its
    indexes below the row's ``suffix_view``, i.e. as the row drafted from them, whatever
    finished around it while it decoded; exact at any batch (unless a million tokens of the
    domain evicted what it read before its replay). The replayer then learns nothing."""

    costs: Any = None
    """The engine's ``multi.DraftCosts``: each tree drafter's replay time per drafting step
    is added to it (what prices a drafter the engine has not run yet)."""

    @property
    def drafters(self) -> list[str]:
        """The job's drafters that replay exactly: on the tree engine the n-gram and suffix
        drafters among ``speculative.drafters`` (or its method), on vLLM n-gram chains."""
        s = self.spec.speculative
        if self.engine != TREE:
            return ["ngram"] if s.method == "ngram" else []
        return [d for d in s.drafters or [s.method] if d in ("ngram", "suffix")]

    @property
    def supported(self) -> bool:
        return bool(self.drafters)

    def learn(self, domain: str | None, outputs: list[list[int]]) -> None:
        """Outputs the engine learned before any row of ``domain`` (committed parts, read
        back: ``work/seeding.py``), learned here too, so the domain's rows replay against
        the index the engine drafted from."""
        if "suffix" in self.drafters and self.learner is None:
            for out in outputs:
                self._suffix().learn(domain, out)

    def _suffix(self) -> Any:
        """The replayed ``SuffixDrafter`` (made on first use: its module imports torch)."""
        if self.suffix is None:
            from batchspec.engines.tree.ngram import NgramDrafter
            from batchspec.engines.tree.suffix import SuffixDrafter

            s = self.spec.speculative
            ngram = NgramDrafter(s.prompt_lookup_min or 1, s.prompt_lookup_max or 3)
            indexes = getattr(self.learner, "indexes", None)
            self.suffix = SuffixDrafter(ngram, s.suffix, indexes)
        return self.suffix

    def row(self, r: RowResult) -> list[int] | None:
        """Accepted draft tokens per K of the grid for one finished row, with the job's
        method; None for an error row, a row without output, or drafts that cannot be
        replayed (``each``: every drafter of the job)."""
        return (self.each(r) or {}).get(self.spec.speculative.method)

    def each(self, r: RowResult) -> dict[str, list[int]] | None:
        """Per drafter of the job that replays, accepted draft tokens per K of the grid for
        one finished row; None for an error row, a row without output, or none that
        replays. A suffix drafter learns the row after every drafter replayed it."""
        prompt, out = r.request.prompt_token_ids, r.token_ids
        self.open_end, self.drafted = set(), None
        if not self.supported or r.error is not None or not prompt or not out:
            return None
        if self.engine == TREE:
            if self.learner is not None and r.suffix_view is None and "suffix" in self.drafters:
                return None  # not a row of the engine whose index it reads
            trees = {d: self._timed(d, prompt, out, r) for d in self.drafters}
            if self.suffix is not None and self.learner is None:
                self.suffix.learn(r.request.domain, out)
            self.drafted = {
                d: dict(zip(self.grid, got.nodes, strict=True)) for d, got in trees.items()
            }
            return {d: got.accepted for d, got in trees.items()}
        s = self.spec.speculative
        lo, hi = vllm_lookup(s.prompt_lookup_min, s.prompt_lookup_max)
        tokens = [*prompt, *out]
        starts = ngram_starts(tokens, len(prompt) + 1, lo, hi)
        accepted, drafted = [], {}
        for k in self.grid:
            chain = replay_chain(tokens, len(prompt), starts, k, self.max_model_len)
            accepted.append(chain.accepted if k > 0 else 0)
            drafted[k] = chain.drafted if k > 0 else 0
            if chain.open_end and k > 0:
                self.open_end.add(k)
        self.drafted = {"ngram": drafted}
        return {"ngram": accepted}

    def _timed(self, drafter: str, prompt: list[int], out: list[int], r: RowResult) -> Trees:
        """``drafter``'s trees at every K of the grid, its time per drafting step noted in
        ``costs`` (the whole replay's: an upper bound on the drafting alone)."""
        started = time.perf_counter()
        got = [self._tree(drafter, prompt, out, r, k) for k in self.grid]
        if self.costs is not None:
            steps = sum(t.steps for t in got)
            self.costs.add(drafter, time.perf_counter() - started, steps, replayed=True)
        return Trees([t.accepted for t in got], [t.nodes for t in got])

    def _tree(
        self, method: str, prompt: list[int], out: list[int], r: RowResult, k: int
    ) -> TreeSteps:
        """The tree engine's n-gram or suffix trees (``method``) at K with the domain's shape
        (its own defaults) over row ``r``; suffix trees read the index as the row did."""
        # Imported here: the tree engine's modules import torch (a second of every CLI
        # command's start, ``validate`` and ``status`` included, which reach this module).
        from batchspec.engines.tree.drafting import replay
        from batchspec.engines.tree.ngram import NgramDrafter

        s = self.spec.speculative
        if k <= 0 or s.tree is None:
            return TreeSteps(0, 0, 0)
        # The tree engine's own defaults (``engines/tree/load.py``), not vLLM's rule.
        lo, hi = s.prompt_lookup_min or 1, s.prompt_lookup_max or 3
        domain = r.request.domain
        shape = s.tree.shape_for(domain)
        max_tokens = min(self.spec.sampling.max_tokens, self.max_model_len - len(prompt))
        if method == "suffix":
            suffix = self._suffix()
            with suffix.pinned(r.suffix_view if self.learner is not None else None):
                got = replay(suffix, prompt, out, k, shape, max_tokens, domain=domain)
        else:
            got = replay(NgramDrafter(lo, hi), prompt, out, k, shape, max_tokens, domain=domain)
        return TreeSteps(len(got.accepted), sum(got.nodes), sum(got.accepted))
