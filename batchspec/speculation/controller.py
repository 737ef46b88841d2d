"""The K controller: per domain, the K with the most predicted tokens/s, for all domains at once.

It keeps sums per (domain, K) as observations come and makes every prediction in arrays, once
per new observation, so that a worker's scheduling decisions over a hundred domains cost a
lookup (see ``estimator`` for the model, ``policy`` for the engines).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import numpy as np

from batchspec.speculation.estimator import Choice, DomainModel, Observation
from batchspec.speculation.predictions import Predictions

BLIND_LOSS = 0.02
"""What a unit run blind (its domain's acceptance unknown: nothing committed, nothing
replayed) may lose to plain decoding should none of its drafts be accepted: its K is the
largest whose step costs at most this much more than a plain step. The share is the "never
below 0.98× plain" of "speculation that never loses"; the blind unit's rows are replayed at
every K when they commit, so the domain's next units run at its own K."""


def blind_k(grid: Iterable[int], default_k: int, cost: Callable[[int], float] | None) -> int:
    """The K of a unit run blind: the largest of ``grid`` up to ``default_k`` (the spec's K)
    up to which every step ``cost`` (seconds at K, the verify forward profiled or fitted) is
    within ``BLIND_LOSS`` of K=0's. With acceptance unknown, the worst case is that no draft
    is accepted, and then a step at K yields the one token a plain step does, at its own
    price. On this CPU's tree engine (the small model, one thread) a verify of a few nodes
    costs about a plain step at batch 1 and 1.8x one at batch 8: blind units keep the spec's
    K=4 at batch 1 and decode plain at batch 8, where K=4 had cost them a third of their speed
    (the records benchmark, docs/choosing-k.md). The spec's K where nothing prices a step,
    or the grid's smallest K where none is within the bound (K=0 not in the grid)."""
    ks = sorted(k for k in grid if k <= default_k)
    if cost is None or not ks:
        return default_k
    plain = float(cost(0))
    if not math.isfinite(plain) or plain <= 0:
        return default_k
    safe = ks[0]
    for k in ks:  # up to the first K past the bound: a cheaper one beyond it is a quirk
        at = float(cost(k))
        if not math.isfinite(at) or at > plain * (1 + BLIND_LOSS):  # NaN: unpriced, no bound
            break
        safe = k
    return int(safe)


class Controller:
    """Chooses K per domain from observations at one batch size.

    Sums are kept per domain and K as observations come, and every prediction is made for all
    domains at once, in arrays, once per new observation (``Predictions``): a scheduling decision
    over a hundred domains then costs a lookup.
    """

    def __init__(
        self,
        batch: int,
        k_grid: Iterable[int],
        default_k: int,
        fixed: Callable[[str | None], int | None] | None = None,
        step_cost: Callable[[int], float] | None = None,
    ):
        self.batch = batch
        self.k_grid = sorted(set(k_grid))
        self.default_k = default_k
        self.fixed_k = fixed or (lambda domain: None)
        """A domain's K when the user fixed it (``SpeculativeSpec.fixed_k``), never changed;
        None where the controller chooses."""
        self.step_cost = step_cost
        """Seconds of one step at K for this batch size, profiled (the tree engine's
        ``StepProfile``, vLLM's fit of its steps); None: step times only from measured rates."""
        self.fill_cost: Callable[[int, float], float] | None = None
        """Seconds of one step at K whose rows each draft a share ``fill`` of K (vLLM's fit:
        ``StepCosts.seconds_at``; the tree engine's profile at the nodes its trees hold:
        ``StepProfile.seconds_at``), to price a domain's K at its own drafts
        (``Predictions``)."""
        self.obs: dict[tuple[str | None, int], Observation] = {}
        self.version = 0
        """Counts the observations taken in: predictions change only when it does."""
        self.index: dict[str | None, int] = {}
        """Row of each observed domain in the arrays below."""
        self._running = np.zeros((0, max(self.k_grid) + 1))
        """Per domain and K (column): rows' running seconds; ``_tokens``: their output tokens;
        rows that ran in batches of their own K only. ``_level_running`` and
        ``_level_tokens``: the same of rows that shared batches with other K
        (``Observation.mixed``), which tell a domain's level, not K against K."""
        self._tokens = np.zeros_like(self._running)
        self._level_running = np.zeros_like(self._running)
        self._level_tokens = np.zeros_like(self._running)
        self._acceptance = np.zeros((0, 4))
        """Per domain, over K > 0: accepted, rejections, spec steps, decode steps."""
        self._rated = np.zeros_like(self._running)
        """Per domain and K: rows with a rate, and the sums of their rates and squares."""
        self._rate_sum = np.zeros_like(self._running)
        self._rate_sq = np.zeros_like(self._running)
        self._replay_tokens = np.zeros_like(self._running)
        """Per domain and K: replayed rows' decode tokens, and the drafts replay accepted."""
        self._replay_accepted = np.zeros_like(self._running)
        self._replay_drafted = np.zeros_like(self._running)
        """Per domain and K: drafts replay proposed (draft tokens of vLLM's n-gram chains,
        draft nodes of the tree engine's trees), and the decode steps of the rows that count
        them (tokens − accepted): their share of K filled per step is what their drafts cost
        (``Predictions``)."""
        self._replay_steps = np.zeros_like(self._running)
        self._produced = np.zeros((0, 2))
        """Per domain, over every K: rows and output tokens."""
        self._table: Predictions | None = None

    # -- input ---------------------------------------------------------------------------

    def add(self, ob: Observation) -> None:
        if ob.rows == 0:
            return
        i = self._row(ob.domain, max([ob.k, *(k for k, *_ in ob.replay)]))
        # Replayed acceptance holds at any batch size; the rest is this batch size's.
        for k, tokens, accepted, *drafted in ob.replay:
            self._replay_tokens[i, k] += tokens
            self._replay_accepted[i, k] += accepted
            if drafted:
                self._replay_drafted[i, k] += drafted[0]
                self._replay_steps[i, k] += tokens - accepted
        self.version += 1
        self._table = None
        if ob.batch != self.batch:
            return  # another batch size has other step costs
        key = (ob.domain, ob.k)
        if key not in self.obs:
            self.obs[key] = Observation(ob.domain, ob.k, ob.batch)
        self.obs[key].merge(ob)
        self._produced[i] += (ob.rows, ob.output_tokens)
        if ob.mixed:
            self._level_running[i, ob.k] += ob.running_s
            self._level_tokens[i, ob.k] += ob.output_tokens
        else:
            self._running[i, ob.k] += ob.running_s
            self._tokens[i, ob.k] += ob.output_tokens
            self._rated[i, ob.k] += ob.rated
            self._rate_sum[i, ob.k] += ob.rate_sum
            self._rate_sq[i, ob.k] += ob.rate_sq
        if ob.k > 0:
            self._acceptance[i] += (ob.accepted, ob.rejections, ob.spec_steps, ob.decode_steps)

    def _row(self, domain: str | None, k: int) -> int:
        """The domain's row in the arrays, grown (doubling) for a new domain or a larger K."""
        i = self.index.setdefault(domain, len(self.index))
        rows, cols = self._running.shape
        if i >= rows or k >= cols:
            grow = max(rows, 2 * i + 1)
            per_k = ("_running", "_tokens", "_level_running", "_level_tokens")
            per_k += ("_rated", "_rate_sum", "_rate_sq")
            per_k += ("_replay_tokens", "_replay_accepted", "_replay_drafted", "_replay_steps")
            widths = dict.fromkeys(per_k, max(cols, k + 1)) | {"_acceptance": 4, "_produced": 2}
            for name, width in widths.items():
                old = getattr(self, name)
                new = np.zeros((grow, width))
                new[: old.shape[0], : old.shape[1]] = old
                setattr(self, name, new)
        return i

    def blind_k(self) -> int:
        """The K of a domain nothing tells acceptance of (``blind_k``, this batch size's step
        cost)."""
        return blind_k(self.k_grid, self.default_k, self.step_cost)

    def seen(self, domain: str | None) -> bool:
        """Whether any rows of ``domain`` were observed (at any batch size, or replayed)."""
        return domain in self.index

    def load_observations(self, items: Iterable[Observation]) -> None:
        for item in items:
            self.add(item)

    # -- estimates -----------------------------------------------------------------------

    def domain_model(self, domain: str | None) -> DomainModel:
        """Pooled acceptance over every K > 0 the domain ran with."""
        if domain not in self.index:
            return DomainModel()
        return DomainModel(*(int(x) for x in self._acceptance[self.index[domain]]))

    def tokens_per_row(self, domains: list[str | None], default: float) -> np.ndarray:
        """Mean output tokens of each domain's rows observed so far; ``default`` before any."""
        at = [self.index.get(d, -1) for d in domains]
        rows = np.array([self._produced[i, 0] if i >= 0 else 0.0 for i in at])
        tokens = np.array([self._produced[i, 1] if i >= 0 else 0.0 for i in at])
        return np.divide(tokens, rows, out=np.full(len(at), float(default)), where=rows > 0)

    def replayed(self, domain: str | None) -> dict[int, float]:
        """Tokens per decode step at each K of the grid, from replayed rows (``replay``)."""
        if domain not in self.index:
            return {}
        i = self.index[domain]
        out = {}
        for k in self.k_grid:
            tokens = self._replay_tokens[i, k] if k < self._replay_tokens.shape[1] else 0.0
            if tokens > 0:
                out[k] = float(tokens / max(tokens - self._replay_accepted[i, k], 1.0))
        return out

    def drafted_per_step(self) -> dict[int, float]:
        """Drafts per decode step at each K of the grid, replayed, every domain pooled: what
        a step at K is priced at for a domain not seen yet (``fill_cost``), which ``report``
        shows beside the step's prices (each seen domain is priced at its own)."""
        drafts, steps = self._replay_drafted.sum(axis=0), self._replay_steps.sum(axis=0)
        grid = [k for k in self.k_grid if k < len(steps) and steps[k] > 0]
        return {k: float(drafts[k] / steps[k]) for k in grid}

    def measured_k(self, domain: str | None) -> list[int]:
        """The K of the grid this domain's rows ran at (at this batch size)."""
        return [k for k in self.k_grid if (domain, k) in self.obs]

    def step_times(self) -> dict[int, float]:
        """Seconds per step at each measured K, pooled over domains (token-weighted)."""
        return self._current().steps

    def choose(self, domain: str | None) -> Choice:
        fixed = self.fixed_k(domain)
        if fixed is not None:
            return Choice(domain, fixed, None, None)
        t = self._current()
        i = self.index.get(domain, t.blank)
        rates = {k: float(r) for k, r in zip(self.k_grid, t.rates[i], strict=True) if r == r}
        model = self.domain_model(domain)
        seen = self.replayed(domain), self.measured_k(domain)
        if model.accepted + model.rejections == 0:
            return Choice(domain, int(t.k[i]), None, None, rates, *seen)
        return Choice(domain, int(t.k[i]), model.alpha, model.alpha_std, rates, *seen)

    def table(self, domains: list[str | None]) -> tuple[np.ndarray, np.ndarray]:
        """Rates (rows: ``domains``, columns: ``k_grid``; NaN where unknown) and chosen K of
        these domains; a fixed domain has its K and no rates (the controller leaves it)."""
        t = self._current()
        at = [self.index.get(d, t.blank) for d in domains]
        rates, k = t.rates[at], t.k[at]
        for i, d in enumerate(domains):
            fixed = self.fixed_k(d)
            if fixed is not None:
                rates[i] = np.nan
                k[i] = fixed
        return rates, k

    def _current(self) -> Predictions:
        if self._table is None:
            self._table = Predictions(self)
        return self._table
