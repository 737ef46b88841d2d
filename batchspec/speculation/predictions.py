"""The K controller's predictions for one state of its observations, every domain at once.

``Controller`` keeps the sums per (domain, K) as units commit; ``Predictions`` turns them into
rates per (domain, K of the grid) and each domain's chosen K, in arrays, once per new
observation: replayed tokens per step (or the α model) over step times that are measured,
interpolated, profiled (the tree engine) or fitted (vLLM's steps, priced at each domain's own
drafts).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from batchspec.speculation.estimator import MIN_RATE_TOKENS, rate_noise, tokens_per_step

if TYPE_CHECKING:
    from batchspec.speculation.controller import Controller


class Predictions:
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
        measured = _rates(ctl._running[:n, grid], ctl._tokens[:n, grid], n)
        level = _rates(ctl._level_running[:n, grid], ctl._level_tokens[:n, grid], n)
        # Step times are pooled over domains, but a domain with long prompts steps slower at
        # every K, and its extra cost per draft differs too: the domain's own rates win where
        # it has them, and scale the model's level for the K it lacks. Rates of rows that
        # shared batches with other K (``Observation.mixed``) scale the level only: their
        # neighbours set their pace as much as their own K does.
        seen = np.where(np.isfinite(measured), measured, level)
        both = np.isfinite(seen) & np.isfinite(predicted)
        num = np.where(both, seen, 0.0).sum(axis=1)
        den = np.where(both, predicted, 0.0).sum(axis=1)
        scale = np.divide(num, den, out=np.ones_like(num), where=den > 0)
        levelled = predicted * scale[:, None]
        self.rates = np.where(np.isfinite(measured), measured, levelled)
        # With no step model to compare K by, those rates are all there is.
        self.rates = np.where(np.isfinite(self.rates), self.rates, level)
        self.predicted, self.measured = predicted, measured  # unscaled (``drafters``)
        known = np.isfinite(self.rates)
        # K=0 ran for the domain (its step time measured, not only profiled).
        ran = ctl._running[:n, 0] + ctl._level_running[:n, 0] > 0
        zero = np.zeros(n + 1, dtype=bool)
        zero[:n] = known[:n, 0] & ran if grid[0] == 0 else False
        # Ties go to the smaller K (the grid is sorted; argmax takes the first maximum).
        best = grid[np.argmax(np.where(known, self.rates, -np.inf), axis=1)]
        # A domain that nothing tells acceptance of (no drafts counted or replayed, no K=0
        # run; a domain not seen yet, the blank row, too) starts blind: at the largest K up to
        # the spec's that would lose at most ``BLIND_LOSS`` were nothing accepted
        # (``blind_k``), rather than at a prior's choice. Other domains' replay, pooled, is no
        # such prior: domains differ too much (at batch 8 on the records set, 1.3 to 2.4
        # tokens a step at K=2), and every blank unit taken at the pooled K > 0 in the records
        # runs was a domain where K=0 was best. Its first units lose nothing to measuring
        # either way: replay of their rows at whatever K (K=0 included) tells every K.
        replayed = np.zeros(n + 1, dtype=bool)
        replayed[:n] = (ctl._replay_tokens[:n][:, grid] > 0).any(axis=1)
        default = ~known.any(axis=1) | ((accepted + rejections == 0) & ~replayed & ~zero)
        self.k = np.where(default, ctl.blind_k(), best)
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
        """Each domain's step at every K priced at its own drafts (``fill_cost``): at the
        share of K its rows' drafts fill a step, replayed at that K where replay counted the
        drafts (vLLM's n-gram chains, the tree engine's n-gram and suffix trees, whose tries
        often hold fewer nodes than K: exact for greedy rows, from the domain's first unit at
        any K), else its coverage where its rows drafted (an n-gram chain drafts K tokens or
        none, so a row drafts coverage·K a step: measured within 2 % per domain), else the
        pooled price (rows of ``step``, one per domain and the blank one). Shares differ
        threefold between domains (0.31 translation, 0.85 long_qa at batch 8 on the
        long-context set), which one pooled share prices alike. The blank row takes every
        domain's replayed drafts pooled, as its tokens per step do (``replayed_per_step``)."""
        n = len(coverage)
        out = np.tile(step, (n + 1, 1))
        if ctl.fill_cost is None:
            return out
        fill = np.full(out.shape, np.nan)
        drafted = ctl._acceptance[:n, 3] > 0  # decode steps at a K > 0
        fill[:n][drafted] = coverage[drafted, None]
        inside = grid < ctl._replay_steps.shape[1]
        cols = grid[inside]
        drafts = _with_pooled(ctl._replay_drafted[:n, cols])
        steps = _with_pooled(ctl._replay_steps[:n, cols])
        per_slot = np.maximum(cols, 1) * steps
        replayed = np.divide(drafts, per_slot, out=np.full_like(drafts, np.nan), where=steps > 0)
        fill[:, inside] = np.where(steps > 0, replayed, fill[:, inside])
        for i in np.flatnonzero(np.isfinite(fill).any(axis=1)):
            costs = [
                ctl.fill_cost(int(k), float(f)) if np.isfinite(f) else float(s)
                for k, f, s in zip(grid, fill[i], out[i], strict=True)
            ]
            out[i] = np.maximum.accumulate(costs)
        return out


def _rates(running: np.ndarray, tokens: np.ndarray, n: int) -> np.ndarray:
    """Measured rates per (domain, K) with at least ``MIN_RATE_TOKENS``, NaN elsewhere, and
    a NaN row for the blank domain."""
    out = np.full((n + 1, running.shape[1]), np.nan)
    np.divide(tokens, running, out=out[:n], where=(running > 0) & (tokens >= MIN_RATE_TOKENS))
    return out


def _with_pooled(sums: np.ndarray) -> np.ndarray:
    """Per-domain ``sums`` and, as one more row, their total: the blank domain's."""
    return np.vstack([sums, sums.sum(axis=0, keepdims=True)])


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
