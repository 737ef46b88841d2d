"""What ``batchspec verify`` concludes from the rows it ran: greedy token comparison with
near-tie margins, and the two-sample tests of sampled rows. Pure functions of the engines'
results, so that every verdict can be tested without an engine.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from batchspec.measure.verify_stats import detectable_tv, holm, two_sample_test
from batchspec.units import RowResult

END = -1
"""The category of a sample that ended (EOS, stop) before a position."""


@dataclass
class Divergence:
    """The first position where a speculative greedy row left the plain one, and why."""

    row_id: Any
    position: int
    plain_token: int | None
    spec_token: int | None
    margin: float | None
    """How much the target (plain run) preferred its token over speculation's, in nats:
    logprob(plain token) - logprob(spec token); None when speculation's token is not among
    the target's top log-probabilities (then it is at least ``margin_bound``)."""
    margin_bound: float | None
    drift: float
    """Largest change of the same token's logprob between the runs before this position:
    the numerical noise that the two runs' kernels showed on this row."""
    near_tie: bool


def _margin(lp: dict[int, float] | None, top: int | None, other: int | None) -> tuple:
    """(margin, lower bound) of the target's preference for ``top`` over ``other``."""
    if lp is None or top is None or other is None or top not in lp:
        return None, None
    if other in lp:
        return lp[top] - lp[other], None
    return None, lp[top] - min(lp.values())


def compare_greedy(plain: RowResult, spec: RowResult, near_tie: float) -> Divergence | None:
    """None when the rows have the same tokens; else their first divergence, a near-tie when
    the target's margin there is at most ``near_tie`` nats (0: every divergence fails)."""
    a, b = plain.token_ids or [], spec.token_ids or []
    if a == b:
        return None
    i = next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    top = a[i] if i < len(a) else None
    other = b[i] if i < len(b) else None
    lps = plain.top_logprobs or []
    margin, bound = _margin(lps[i] if i < len(lps) else None, top, other)
    tie = near_tie > 0 and margin is not None and margin <= near_tie
    return Divergence(plain.request.row_id, i, top, other, margin, bound, drift(plain, spec), tie)


def drift(plain: RowResult, spec: RowResult) -> float:
    """The largest change of a token's logprob between the runs while both rows agree."""
    a, b = plain.token_ids or [], spec.token_ids or []
    lps, lpb = plain.top_logprobs or [], spec.top_logprobs or []
    worst = 0.0
    for j in range(min(len(a), len(b), len(lps), len(lpb))):
        if a[j] != b[j]:
            break
        if a[j] in lps[j] and a[j] in lpb[j]:
            worst = max(worst, abs(lps[j][a[j]] - lpb[j][a[j]]))
    return worst


@dataclass
class GreedyCheck:
    """One dtype's greedy comparison over the sampled rows."""

    dtype: str
    near_tie: float
    rows: int = 0
    identical: int = 0
    errors: int = 0
    divergences: list[Divergence] = field(default_factory=list)
    max_drift: float | None = None
    """Largest logprob change of an agreed token over every compared row: the job dtype's
    numerical noise between the two engines (0 in float32 on this project's CPU)."""

    @property
    def failures(self) -> list[Divergence]:
        return [d for d in self.divergences if not d.near_tie]

    @property
    def passed(self) -> bool:
        return self.rows > 0 and not self.failures

    def summary(self) -> dict[str, Any]:
        margins = [d.margin for d in self.divergences if d.margin is not None]
        return {
            "check": "greedy",
            "dtype": self.dtype,
            "near_tie_threshold": self.near_tie,
            "rows": self.rows,
            "identical": self.identical,
            "errors": self.errors,
            "near_ties": len(self.divergences) - len(self.failures),
            "failures": len(self.failures),
            "min_margin": min(margins, default=None),
            "max_margin": max(margins, default=None),
            "max_drift": self.max_drift,
            "passed": self.passed,
            "divergences": [asdict(d) for d in self.divergences],
        }


DRIFT_FACTOR = 4.0
"""Default near-tie threshold: this many times the largest drift measured (a margin moves by
up to two tokens' drifts; twice that again for positions noisier than the ones seen)."""


def greedy_check(
    dtype: str, plain: Sequence[RowResult], spec: Sequence[RowResult], near_tie: float | None
) -> GreedyCheck:
    """Row by row (same order in both runs); rows that failed in either run are not compared.
    ``near_tie`` None: ``DRIFT_FACTOR`` times the drift measured over all rows; float32
    always 0 (identity required)."""
    pairs = [(p, s) for p, s in zip(plain, spec, strict=True)]
    ok = [(p, s) for p, s in pairs if p.error is None and s.error is None]
    drifts = [drift(p, s) for p, s in ok if p.top_logprobs and s.top_logprobs]
    max_drift = max(drifts, default=None)
    if dtype == "float32":
        near_tie = 0.0
    elif near_tie is None:
        near_tie = DRIFT_FACTOR * (max_drift or 0.0)
    check = GreedyCheck(dtype, near_tie, errors=len(pairs) - len(ok), max_drift=max_drift)
    for p, s in ok:
        check.rows += 1
        div = compare_greedy(p, s, near_tie)
        if div is None:
            check.identical += 1
        else:
            check.divergences.append(div)
    return check


def position_samples(results: Sequence[RowResult], position: int) -> list[int]:
    """The token each sample has at ``position`` (``END`` for a sample that stopped before)."""
    out = []
    for r in results:
        ids = r.token_ids or []
        out.append(ids[position] if position < len(ids) else END)
    return out


def sampled_check(
    prompts: Sequence[tuple[Any, Sequence[RowResult], Sequence[RowResult]]],
    positions: int,
    alpha: float,
) -> dict[str, Any]:
    """Per prompt (row id, plain samples, speculative samples) and position, a two-sample
    test; Holm's correction over all of them; the smallest distance each detects."""
    tests = []
    for row_id, plain, spec in prompts:
        plain = [r for r in plain if r.error is None]
        spec = [r for r in spec if r.error is None]
        if not plain or not spec:
            continue
        for pos in range(positions):
            t = two_sample_test(position_samples(plain, pos), position_samples(spec, pos))
            entry = {"row_id": row_id, "position": pos, "n_plain": len(plain), "n_spec": len(spec)}
            tests.append(entry | asdict(t))
    live = [t for t in tests if t["df"] > 0]
    for t, adj in zip(live, holm([t["p_value"] for t in live]), strict=True):
        t["p_holm"] = adj
        # Holm's first step tests at alpha / m: the level every test is sure to get.
        t["detectable_tv"] = detectable_tv(t["n_plain"], t["n_spec"], t["df"], alpha / len(live))
    rejected = [t for t in live if t["p_holm"] < alpha]
    detect = [t["detectable_tv"] for t in live]
    return {
        "check": "sampled",
        "alpha": alpha,
        "prompts": len({t["row_id"] for t in tests}),
        "positions": positions,
        "tests": len(live),
        "constant": len(tests) - len(live),
        "rejected": len(rejected),
        "min_p": min((t["p_value"] for t in live), default=None),
        "min_p_holm": min((t["p_holm"] for t in live), default=None),
        "max_tv_observed": max((t["tv"] for t in live), default=None),
        "detectable_tv_median": statistics.median(detect) if detect else None,
        "detectable_tv_max": max(detect, default=None),
        "passed": bool(live) and not rejected,
        "details": tests,
    }
