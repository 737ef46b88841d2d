"""The K controller: per domain, measure acceptance and cost, pick the K with the most tokens/s.

Model. Drafts are accepted token by token with probability α (per domain) until the first
rejection, so a verify step with K drafts yields E(K) = (1 − α^(K+1)) / (1 − α) tokens. With
n-gram drafting only a share ``c`` of steps has a draft at all, so a step yields
c·E(K) + (1 − c). A row decodes at rate = tokens per step / step time, and the step time grows
with K (more tokens to verify, a draft model's own passes) at a rate that depends on the batch
size: this is what makes speculation pay at small batches and lose at large ones.

Measurements. Each committed unit contributes its rows' acceptance histograms (α and c, pooled
per domain) and their running time (the rate at which its rows decoded at that K). A step time
per K follows from any domain measured at that K (tokens per step / rate), pooled across
domains, so a K measured on one domain informs every other. ``batchspec tune`` measures every
K of the grid on a sample of every domain; during a run, workers append their units to
``stats/<worker>.jsonl`` in the output directory and read each other's, so the estimates keep
improving with the run (``shared``). Each domain's best K maximizes its predicted rate; a K
is only ever chosen from measured step times (interpolated between measured K, never assumed).
Since vLLM fixes K per engine, ``policy.KPolicy`` then weighs the domains' best K against
engine starts over the whole remaining work.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from batchspec.units import RowResult, UnitResult

MIN_RATE_TOKENS = 1500
"""Output tokens a (domain, K) pair needs before its own measured rate replaces the model."""


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens per verify step with K drafts at per-token acceptance α: (1 − α^(K+1))/(1 − α)."""
    if k <= 0:
        return 1.0
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


@dataclass
class Observation:
    """What a batch of rows of one domain at one K showed: the controller's only input."""

    domain: str | None
    k: int
    batch: int
    rows: int = 0
    output_tokens: int = 0
    running_s: float = 0.0
    """Sum over rows of the time from first scheduled to last token."""
    accepted: int = 0
    rejections: int = 0
    """Verify steps that rejected a draft (the geometric model's failures)."""
    spec_steps: int = 0
    decode_steps: int = 0
    """All steps after the first token: output tokens − 1 − accepted, per row."""

    @classmethod
    def from_result(cls, result: UnitResult, batch: int) -> Observation:
        """What a unit's rows showed, run at ``batch`` (the engine's max_num_seqs)."""
        ob = cls(result.unit.domain, result.k, batch)
        for r in result.results:
            ob.add(r)
        return ob

    def add(self, r: RowResult) -> None:
        """Add one row; error rows and rows without output carry nothing."""
        tokens = r.num_output_tokens
        if not tokens or r.error is not None:
            return
        self.rows += 1
        self.output_tokens += tokens
        if r.running_s is not None:
            self.running_s += r.running_s
        # Metrics of an engine without speculation (K=0) are not acceptance measurements.
        spec = r.spec if self.k > 0 else None
        accepted = spec["num_accepted_draft_tokens"] if spec else 0
        hist = spec["acceptance_histogram"] if spec else []
        self.accepted += accepted
        self.rejections += sum(hist[:-1]) if hist else 0
        self.spec_steps += spec["num_spec_steps"] if spec else 0
        self.decode_steps += max(tokens - 1 - accepted, 0)

    def merge(self, other: Observation) -> None:
        for name in (
            "rows",
            "output_tokens",
            "running_s",
            "accepted",
            "rejections",
            "spec_steps",
            "decode_steps",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class DomainModel:
    """Pooled acceptance of one domain, over every K it ran with."""

    accepted: int = 0
    rejections: int = 0
    spec_steps: int = 0
    decode_steps: int = 0

    @property
    def alpha(self) -> float:
        """Posterior mean of α under a uniform prior: (A + 1) / (A + R + 2)."""
        return (self.accepted + 1) / (self.accepted + self.rejections + 2)

    @property
    def alpha_std(self) -> float:
        a, b = self.accepted + 1, self.rejections + 1
        return math.sqrt(a * b / ((a + b) ** 2 * (a + b + 1)))

    @property
    def coverage(self) -> float:
        """Share of decode steps that had drafts (1 for draft models; less for n-gram)."""
        if self.decode_steps <= 0:
            return 1.0
        return min(1.0, self.spec_steps / self.decode_steps)

    def tokens_per_step(self, k: int) -> float:
        if k == 0:
            return 1.0
        c = self.coverage
        return c * expected_tokens(self.alpha, k) + (1.0 - c)


@dataclass
class Choice:
    """The controller's view of one domain, for decisions and reports."""

    domain: str | None
    k: int
    alpha: float | None
    alpha_std: float | None
    rates: dict[int, float] = field(default_factory=dict)
    """Predicted (or measured) decode rate per row, tokens/s, per K considered."""


class Controller:
    """Chooses K per domain from observations at one batch size."""

    def __init__(
        self, batch: int, k_grid: Iterable[int], default_k: int, fixed: dict[str, int] | None = None
    ):
        self.batch = batch
        self.k_grid = sorted(set(k_grid))
        self.default_k = default_k
        self.fixed = dict(fixed or {})
        """Per-domain K set by the user (speculative.per_domain): never changed."""
        self.obs: dict[tuple[str | None, int], Observation] = {}

    # -- input ---------------------------------------------------------------------------

    def add(self, ob: Observation) -> None:
        if ob.batch != self.batch or ob.rows == 0:
            return  # another batch size has other step costs
        key = (ob.domain, ob.k)
        if key not in self.obs:
            self.obs[key] = Observation(ob.domain, ob.k, ob.batch)
        self.obs[key].merge(ob)

    # -- estimates -----------------------------------------------------------------------

    def domain_model(self, domain: str | None) -> DomainModel:
        m = DomainModel()
        for (d, k), ob in self.obs.items():
            if d == domain and k > 0:
                m.accepted += ob.accepted
                m.rejections += ob.rejections
                m.spec_steps += ob.spec_steps
                m.decode_steps += ob.decode_steps
        return m

    def measured_rate(self, domain: str | None, k: int) -> float | None:
        ob = self.obs.get((domain, k))
        if ob is None or ob.running_s <= 0 or ob.output_tokens < MIN_RATE_TOKENS:
            return None
        return ob.output_tokens / ob.running_s

    def step_times(self) -> dict[int, float]:
        """Seconds per step at each measured K, pooled over domains (token-weighted)."""
        num: dict[int, float] = {}
        den: dict[int, float] = {}
        models = {d: self.domain_model(d) for d, _ in self.obs}
        for (d, k), ob in self.obs.items():
            if ob.running_s <= 0 or ob.output_tokens == 0:
                continue
            rate = ob.output_tokens / ob.running_s
            step = models[d].tokens_per_step(k) / rate
            num[k] = num.get(k, 0.0) + step * ob.output_tokens
            den[k] = den.get(k, 0.0) + ob.output_tokens
        return {k: num[k] / den[k] for k in sorted(num)}

    def _step_time(self, k: int, measured: dict[int, float]) -> float | None:
        """Measured, or interpolated linearly between the nearest measured K on both sides."""
        if k in measured:
            return measured[k]
        below = [x for x in measured if x < k]
        above = [x for x in measured if x > k]
        if not below or not above:
            return None
        lo, hi = max(below), min(above)
        return measured[lo] + (measured[hi] - measured[lo]) * (k - lo) / (hi - lo)

    def choose(self, domain: str | None) -> Choice:
        if domain is not None and domain in self.fixed:
            return Choice(domain, self.fixed[domain], None, None)
        model = self.domain_model(domain)
        steps = self.step_times()
        predicted: dict[int, float] = {}
        measured: dict[int, float] = {}
        for k in self.k_grid:
            step = self._step_time(k, steps)
            if step is not None:
                predicted[k] = model.tokens_per_step(k) / step
            rate = self.measured_rate(domain, k)
            if rate is not None:
                measured[k] = rate
        # Step times are pooled over domains, but a domain with long prompts steps slower at
        # every K, and its extra cost per draft differs too: the domain's own rates win where
        # it has them, and scale the model's level for the K it lacks.
        both = [k for k in measured if k in predicted]
        scale = sum(measured[k] for k in both) / sum(predicted[k] for k in both) if both else 1.0
        rates = dict(sorted(({k: r * scale for k, r in predicted.items()} | measured).items()))
        has_acceptance = model.accepted + model.rejections > 0
        if not rates or (not has_acceptance and not any(k == 0 for k in rates)):
            k = self.default_k
        else:
            k = max(rates, key=lambda x: (rates[x], -x))  # ties: the smaller K
        alpha = model.alpha if has_acceptance else None
        return Choice(domain, k, alpha, model.alpha_std if has_acceptance else None, rates)

    def rate(self, domain: str | None, k: int) -> float | None:
        return self.choose(domain).rates.get(k)

    # -- persistence ---------------------------------------------------------------------

    def load_observations(self, items: Iterable[dict[str, Any]]) -> None:
        for item in items:
            self.add(Observation(**item))
