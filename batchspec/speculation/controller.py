"""The K controller: per domain, the K with the most predicted tokens/s, for all domains at once.

It keeps sums per (domain, K) as observations come and makes every prediction in arrays, once
per new observation, so that a worker's scheduling decisions over a hundred domains cost a
lookup (see ``estimator`` for the model, ``policy`` for the engines).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from batchspec.speculation.estimator import (
    MIN_RATE_TOKENS,
    Choice,
    DomainModel,
    Observation,
    rate_noise,
    tokens_per_step,
)


class Controller:
    """Chooses K per domain from observations at one batch size.

    Sums are kept per domain and K as observations come, and every prediction is made for all
    domains at once, in arrays, once per new observation (``_Table``): a scheduling decision
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
        ``StepCosts.seconds_at``), to price a domain's K at its own drafts (``_Table``)."""
        self.obs: dict[tuple[str | None, int], Observation] = {}
        self.version = 0
        """Counts the observations taken in: predictions change only when it does."""
        self.index: dict[str | None, int] = {}
        """Row of each observed domain in the arrays below."""
        self._running = np.zeros((0, max(self.k_grid) + 1))
        """Per domain and K (column): rows' running seconds; ``_tokens``: their output tokens."""
        self._tokens = np.zeros_like(self._running)
        self._acceptance = np.zeros((0, 4))
        """Per domain, over K > 0: accepted, rejections, spec steps, decode steps."""
        self._rated = np.zeros_like(self._running)
        """Per domain and K: rows with a rate, and the sums of their rates and squares."""
        self._rate_sum = np.zeros_like(self._running)
        self._rate_sq = np.zeros_like(self._running)
        self._replay_tokens = np.zeros_like(self._running)
        """Per domain and K: replayed rows' decode tokens, and the drafts replay accepted."""
        self._replay_accepted = np.zeros_like(self._running)
        self._produced = np.zeros((0, 2))
        """Per domain, over every K: rows and output tokens."""
        self._table: _Table | None = None

    # -- input ---------------------------------------------------------------------------

    def add(self, ob: Observation) -> None:
        if ob.rows == 0:
            return
        i = self._row(ob.domain, max([ob.k, *(k for k, _, _ in ob.replay)]))
        # Replayed acceptance holds at any batch size; the rest is this batch size's.
        for k, tokens, accepted in ob.replay:
            self._replay_tokens[i, k] += tokens
            self._replay_accepted[i, k] += accepted
        self.version += 1
        self._table = None
        if ob.batch != self.batch:
            return  # another batch size has other step costs
        key = (ob.domain, ob.k)
        if key not in self.obs:
            self.obs[key] = Observation(ob.domain, ob.k, ob.batch)
        self.obs[key].merge(ob)
        self._running[i, ob.k] += ob.running_s
        self._tokens[i, ob.k] += ob.output_tokens
        self._rated[i, ob.k] += ob.rated
        self._rate_sum[i, ob.k] += ob.rate_sum
        self._rate_sq[i, ob.k] += ob.rate_sq
        self._produced[i] += (ob.rows, ob.output_tokens)
        if ob.k > 0:
            self._acceptance[i] += (ob.accepted, ob.rejections, ob.spec_steps, ob.decode_steps)

    def _row(self, domain: str | None, k: int) -> int:
        """The domain's row in the arrays, grown (doubling) for a new domain or a larger K."""
        i = self.index.setdefault(domain, len(self.index))
        rows, cols = self._running.shape
        if i >= rows or k >= cols:
            grow = max(rows, 2 * i + 1)
            per_k = ("_running", "_tokens", "_rated", "_rate_sum", "_rate_sq")
            per_k += ("_replay_tokens", "_replay_accepted")
            widths = dict.fromkeys(per_k, max(cols, k + 1)) | {"_acceptance": 4, "_produced": 2}
            for name, width in widths.items():
                old = getattr(self, name)
                new = np.zeros((grow, width))
                new[: old.shape[0], : old.shape[1]] = old
                setattr(self, name, new)
        return i

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

    def _current(self) -> _Table:
        if self._table is None:
            self._table = _Table(self)
        return self._table


class _Table:
    """The controller's predictions for one state of its observations, every domain at once:
    rates per (domain, K of the grid), NaN where unknown, and each domain's chosen K. Row
    ``blank`` stands for a domain with no observation yet."""

    def __init__(self, ctl: Controller):
        n = self.blank = len(ctl.index)
        accepted, rejections, spec, decode = np.vstack([ctl._acceptance[:n], np.zeros(4)]).T
        alpha = (accepted + 1) / (accepted + rejections + 2)
        coverage = np.minimum(
            1.0, np.divide(spec, decode, out=np.ones_like(spec), where=decode > 0)
        )
        grid = np.array(ctl.k_grid)
        step = self._steps(ctl, alpha[:n], coverage[:n], grid)
        per_step = replayed_per_step(ctl, alpha, coverage, grid)
        predicted = per_step / step
        running, tokens = ctl._running[:n, grid], ctl._tokens[:n, grid]
        measured = np.full_like(predicted, np.nan)
        long_enough = (running > 0) & (tokens >= MIN_RATE_TOKENS)
        np.divide(tokens, running, out=measured[:n], where=long_enough)
        # Step times are pooled over domains, but a domain with long prompts steps slower at
        # every K, and its extra cost per draft differs too: the domain's own rates win where
        # it has them, and scale the model's level for the K it lacks.
        both = np.isfinite(measured) & np.isfinite(predicted)
        num = np.where(both, measured, 0.0).sum(axis=1)
        den = np.where(both, predicted, 0.0).sum(axis=1)
        scale = np.divide(num, den, out=np.ones_like(num), where=den > 0)
        self.rates = np.where(np.isfinite(measured), measured, predicted * scale[:, None])
        self.predicted, self.measured = predicted, measured  # unscaled (``drafters``)
        known = np.isfinite(self.rates)
        # K=0 ran for the domain (its step time measured, not only profiled).
        zero = np.zeros(n + 1, dtype=bool)
        zero[:n] = known[:n, 0] & (ctl._running[:n, 0] > 0) if grid[0] == 0 else False
        # Ties go to the smaller K (the grid is sorted; argmax takes the first maximum).
        best = grid[np.argmax(np.where(known, self.rates, -np.inf), axis=1)]
        # A domain that nothing tells acceptance of (no drafts counted or replayed, no K=0
        # run) starts at the spec's K, rather than at a prior's choice; except, where other
        # domains' rows were replayed, a domain not seen yet (the blank row): it starts at the
        # K best for their pooled replay (``replayed_per_step``). Its first unit then loses
        # nothing to measuring: replay of its rows at whatever K tells every K.
        replayed = (ctl._replay_tokens[:, grid] > 0).any(axis=1)[: n + 1].copy()
        replayed.resize(n + 1)
        replayed[n] = replayed[:n].any()
        default = ~known.any(axis=1) | ((accepted + rejections == 0) & ~replayed & ~zero)
        self.k = np.where(default, ctl.default_k, best)
        self.default = default
        self._measurement_wins(ctl, grid, default)

    def _measurement_wins(self, ctl: Controller, grid: np.ndarray, default: np.ndarray) -> None:
        """Where the chosen K was measured and another measured K beat it by more than the
        two measurements' noise (standard errors, combined), the model is wrong for that
        domain: its rates become the measured ones alone (for the engine plan too), and it
        gets its fastest measured K. Below ``MIN_RATE_TOKENS`` the model's rates stand in for
        measured ones, but they must not overrule a clear measurement."""
        n = self.blank
        running, tokens = ctl._running[:n, grid], ctl._tokens[:n, grid]
        rated = ctl._rated[:n, grid]
        with np.errstate(divide="ignore", invalid="ignore"):
            rate = np.where((running > 0) & (rated >= 2), tokens / running, np.nan)
        noise = rate_noise(rate, rated, ctl._rate_sum[:n, grid], ctl._rate_sq[:n, grid])
        measured = np.isfinite(rate) & np.isfinite(noise)
        rate[~measured] = np.nan
        chosen = np.searchsorted(grid, self.k[:n]).clip(max=len(grid) - 1)
        rows = np.arange(n)
        own, own_noise = rate[rows, chosen], noise[rows, chosen]
        with np.errstate(invalid="ignore"):
            beaten = (rate - own[:, None] > np.hypot(noise, own_noise[:, None])).any(axis=1)
        beaten &= measured[rows, chosen] & (grid[chosen] == self.k[:n]) & ~default[:n]
        fastest = grid[np.argmax(np.where(measured, rate, -np.inf), axis=1)]
        self.k[:n] = np.where(beaten, fastest, self.k[:n])
        self.rates[:n][beaten] = rate[beaten]

    def _steps(
        self, ctl: Controller, alpha: np.ndarray, coverage: np.ndarray, grid: np.ndarray
    ) -> np.ndarray:
        """Seconds per step at each K of the grid: measured (rows at rate r with t tokens per
        step take t / r per step; pooled over domains, token-weighted, so Σ t·running_s over
        Σ tokens), or interpolated linearly between the nearest measured K, never beyond
        them (NaN); with a profile (``Controller.step_cost``), the profiled time at every K.
        Sets ``steps``, the measured ones."""
        n = len(alpha)
        running, tokens = ctl._running[:n], ctl._tokens[:n]
        ks = np.arange(running.shape[1])
        valid = (running > 0) & (tokens > 0)
        weighted = np.where(valid, replayed_per_step(ctl, alpha, coverage, ks), 0.0)
        den = np.where(valid, tokens, 0.0).sum(axis=0)
        at = np.flatnonzero(den > 0)
        pooled = (weighted * running).sum(axis=0)[at] / den[at]
        self.steps = {int(k): float(v) for k, v in zip(at, pooled, strict=True)}
        if ctl.step_cost is not None:
            # A step with more draft nodes never costs less: a profile cell that says so
            # is noise (or a kernel's quirk at one size), so costs rise with K.
            step = np.maximum.accumulate([ctl.step_cost(int(k)) for k in grid])
            return self._own_drafts(ctl, coverage, grid, step)
        if not len(at):
            return np.full(len(grid), np.nan)
        step = np.interp(grid, at, pooled)
        step[(grid < at[0]) | (grid > at[-1])] = np.nan
        return step

    @staticmethod
    def _own_drafts(
        ctl: Controller, coverage: np.ndarray, grid: np.ndarray, step: np.ndarray
    ) -> np.ndarray:
        """Each domain's step at every K priced at its own drafts (``fill_cost``), where its
        rows drafted: an n-gram chain drafts K tokens or none, so a row drafts coverage·K a
        step (measured: drafts / (steps·K) equals coverage within 2 % per domain), and
        coverage differs threefold between domains (0.31 translation, 0.85 long_qa at batch 8
        on the long-context set), which one pooled share of filled slots prices alike. Rows
        of ``step`` (one per domain and the blank one) where nothing drafted yet."""
        n = len(coverage)
        out = np.tile(step, (n + 1, 1))
        if ctl.fill_cost is None:
            return out
        for i in np.flatnonzero(ctl._acceptance[:n, 3] > 0):  # decode steps at a K > 0
            costs = [ctl.fill_cost(int(k), float(coverage[i])) for k in grid]
            out[i] = np.maximum.accumulate(costs)
        return out


def replayed_per_step(
    ctl: Controller, alpha: np.ndarray, coverage: np.ndarray, ks: np.ndarray
) -> np.ndarray:
    """Tokens per decode step of each domain (rows of ``alpha``; one more row than there are
    domains stands for the blank domain) at each K of ``ks``: replayed where rows of the
    domain were replayed at that K (``replay``: exact for greedy rows), for the blank domain
    every domain's replay pooled, the α model elsewhere."""
    out = tokens_per_step(alpha[:, None], coverage[:, None], ks[None, :])
    n = min(len(alpha), len(ctl.index))
    inside = ks < ctl._replay_tokens.shape[1]
    cols = ks[inside]
    tokens = ctl._replay_tokens[:n, cols]
    accepted = ctl._replay_accepted[:n, cols]
    seen = tokens > 0
    replayed = np.divide(
        tokens, np.maximum(tokens - accepted, 1.0), out=np.ones_like(tokens), where=seen
    )
    block = out[:n, inside]
    out[:n, inside] = np.where(seen, replayed, block)
    if len(alpha) > n:  # the blank row: every domain's replay pooled, where there is any
        pooled, pooled_accepted = tokens.sum(axis=0), accepted.sum(axis=0)
        some = pooled > 0
        per_step = pooled / np.maximum(pooled - pooled_accepted, 1.0)
        out[n, inside] = np.where(some, per_step, out[n, inside])
    return out
