"""The K controller's model and measurements: acceptance and cost per domain and K.

Model. Drafts are accepted token by token with probability α (per domain) until the first
rejection, so a verify step with K drafts yields E(K) = (1 − α^(K+1)) / (1 − α) tokens. With
n-gram drafting only a share ``c`` of steps has a draft at all, so a step yields
c·E(K) + (1 − c). A row decodes at rate = tokens per step / step time, and the step time grows
with K (more tokens to verify, a draft model's own passes) at a rate that depends on the batch
size: this is what makes speculation pay at small batches and lose at large ones.

Measurements. Each committed unit contributes its rows' acceptance (α and c, pooled per
domain; ``rejected_steps``), their running time (the rate at which its rows decoded at that
K) and how much the rows' own rates vary (the measurement's noise). A step time
per K follows from any domain measured at that K (tokens per step / rate), pooled across
domains, so a K measured on one domain informs every other. ``batchspec tune`` measures every
K of the grid on a sample of every domain; during a run, workers append their units to
``stats/<worker>.jsonl`` in the output directory and read each other's, so the estimates keep
improving with the run (``shared``). ``controller.Controller`` picks each domain's best K
from these (only ever from measured step times, interpolated between measured K, never
assumed); since vLLM fixes K per engine, ``policy.KPolicy`` then weighs the domains' best K
against engine starts over the remaining work.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from batchspec.units import RowResult, SpecStats, UnitResult

MIN_RATE_TOKENS = 1500
"""Output tokens a (domain, K) pair needs before its own measured rate replaces the model."""


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens per verify step with K drafts at per-token acceptance α: (1 − α^(K+1))/(1 − α)."""
    if k <= 0:
        return 1.0
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def rejected_steps(spec: SpecStats) -> int:
    """Verify steps of a row that rejected a draft token: the geometric model's failures.

    A step fails when it accepted fewer tokens than it drafted. Drafts are shorter than K at
    times (n-gram near the end of the context, suffix decoding), and a short draft accepted in
    full lands below the histogram's top bucket without any rejection: counting every step
    below the top as a failure biases α low. vLLM's ``detailed`` metrics list each step's
    drafted and accepted tokens, which is exact. From the summary alone: a failed step left at
    least one drafted token unaccepted, so failures are at most drafted − accepted, and at most
    the steps below the top bucket; the smaller bound is exact when every draft had K tokens
    or no draft was rejected.
    """
    drafted, accepted = spec.per_step_drafted, spec.per_step_accepted
    if drafted is not None and accepted is not None:
        return sum(a < d for a, d in zip(accepted, drafted, strict=True))
    unaccepted = spec.drafted - spec.accepted
    return max(0, min(unaccepted, sum(spec.histogram[:-1])))


def tokens_per_step(alpha: np.ndarray, coverage: np.ndarray, k: np.ndarray) -> np.ndarray:
    """``DomainModel.tokens_per_step`` elementwise (broadcast): many domains and K at once.
    α is a posterior mean, always below 1, and K = 0 gives 1 token per step."""
    expected = (1.0 - alpha ** (k + 1)) / (1.0 - alpha)
    return coverage * expected + (1.0 - coverage)


def rate_noise(rate: Any, rated: Any, rate_sum: Any, rate_sq: Any) -> np.ndarray:
    """Standard error of measured rates (elementwise): the relative standard error of the
    mean of the rows' own rates, applied to the rate. Rows differ (prompt, length,
    acceptance), so another sample of rows would measure differently by about this much.
    NaN with fewer than two rows."""
    rated = np.asarray(rated, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = rate_sum / rated
        var = np.maximum(rate_sq - rated * mean**2, 0.0) / (rated - 1)
        return np.where((rated >= 2) & (mean > 0), rate * np.sqrt(var / rated) / mean, np.nan)


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
    rated: int = 0
    """Rows with a decode rate (tokens / running time); ``rate_sum``, ``rate_sq``: the sum of
    those rates and of their squares, for the measurement's noise (``rate_noise``)."""
    rate_sum: float = 0.0
    rate_sq: float = 0.0
    engine: str | None = None
    """``vllm`` or ``tree`` (step costs differ by engine); None in files of older runs."""
    replay: list[list[int]] = field(default_factory=list)
    """Replayed acceptance (``replay``), one ``[K, tokens, accepted]`` per K of the grid:
    over the replayed rows, their output tokens after the first (the decode steps' share)
    and the draft tokens replay accepted at K; tokens per step at K is tokens / (tokens −
    accepted). Replay adds a fourth, the drafts proposed: draft tokens of vLLM's n-gram
    chains, draft nodes of the tree engine's trees (what the drafts cost:
    ``Controller.fill_cost``). Empty where no row was replayed (and in files of older
    runs)."""
    drafter: str | None = None
    """The drafter its rows ran with (``speculative.drafters``); None: the job's method."""
    mixed: bool = False
    """Its rows shared the engine's batches with rows at other K (an engine that takes K per
    unit, at a batch size above 1): a step costs what every row's drafts cost, so a K=0 row
    beside K=4 rows decodes slower than in a batch of its own, and they faster. Their rates
    say how fast the domain runs, not how one K compares with another (``Predictions``)."""
    replays: dict[str, list[list[int]]] = field(default_factory=dict)
    """With ``speculative.drafters``, ``replay`` per drafter that replays exactly, on the
    same rows (``speculation/drafters.py`` prices each drafter from its own)."""

    @property
    def rate(self) -> float | None:
        """Measured decode rate of a row, tokens/s: all tokens over all running time."""
        return self.output_tokens / self.running_s if self.running_s > 0 else None

    @property
    def rate_noise(self) -> float | None:
        """Standard error of ``rate`` (``rate_noise``); None with fewer than two rows."""
        if self.rate is None:
            return None
        noise = float(rate_noise(self.rate, self.rated, self.rate_sum, self.rate_sq))
        return None if math.isnan(noise) else noise

    @classmethod
    def from_result(cls, result: UnitResult, batch: int) -> Observation:
        """What a unit's rows showed, run at ``batch`` (the engine's max_num_seqs)."""
        ob = cls(result.unit.domain, result.k, batch, drafter=result.unit_requests.drafter)
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
        if r.running_s:
            self.rated += 1
            self.rate_sum += tokens / r.running_s
            self.rate_sq += (tokens / r.running_s) ** 2
        # Metrics of an engine without speculation (K=0) are not acceptance measurements.
        if r.replayed is not None:
            self.add_replay(replay_items(tokens - 1, r.replayed, r.replayed_drafted))
        for name, replayed in (r.replays or {}).items():
            drafted = (r.replays_drafted or {}).get(name)
            add_replay(
                self.replays.setdefault(name, []), replay_items(tokens - 1, replayed, drafted)
            )
        spec = r.spec if self.k > 0 else None
        accepted = spec.accepted if spec else 0
        self.accepted += accepted
        self.rejections += rejected_steps(spec) if spec else 0
        self.spec_steps += spec.steps if spec else 0
        self.decode_steps += max(tokens - 1 - accepted, 0)

    def add_replay(self, items: list[list[int]]) -> None:
        """Add ``[K, tokens, accepted]`` sums, K by K."""
        add_replay(self.replay, items)

    def merge(self, other: Observation) -> None:
        self.add_replay(other.replay)
        for name, items in other.replays.items():
            add_replay(self.replays.setdefault(name, []), items)
        for name in (
            "rows",
            "output_tokens",
            "running_s",
            "accepted",
            "rejections",
            "spec_steps",
            "decode_steps",
            "rated",
            "rate_sum",
            "rate_sq",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))


def replay_items(
    tokens: int, accepted: dict[int, int], drafted: dict[int, int] | None
) -> list[list[int]]:
    """One row's replay as ``Observation.replay`` items: ``[K, tokens, accepted]`` per K, and
    the drafts proposed at K fourth where the replay counted them."""
    drafted = drafted or {}
    return [[k, tokens, a, *([drafted[k]] if k in drafted else [])] for k, a in accepted.items()]


def add_replay(sums: list[list[int]], items: list[list[int]]) -> None:
    """Add ``[K, tokens, accepted]`` or ``[K, tokens, accepted, drafted]`` ``items`` into
    ``sums`` (of the same form), K by K; a sum keeps ``drafted`` only while every item it
    adds has one (rows of older runs, or of drafters whose drafts are not counted, lack it)."""
    at = {item[0]: i for i, item in enumerate(sums)}
    for item in items:
        k = item[0]
        if k not in at:
            at[k] = len(sums)
            sums.append(list(item))
            continue
        old = sums[at[k]]
        added = [a + b for a, b in zip(old, item, strict=False)]
        sums[at[k]] = [k, *added[1:]]


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
    replayed: dict[int, float] = field(default_factory=dict)
    """Tokens per decode step per K of the grid, replayed from the domain's committed rows."""
    measured: list[int] = field(default_factory=list)
    """The K its rows ran at (their rates measured); the other K's rates are predicted."""
