"""The statistics of ``batchspec verify`` against exact expectations: closed forms of the
chi-square distributions, a hand-computed table, Holm on an enumerated example, and the size
and power of the whole test computed exactly by enumerating every outcome of toy samples."""

from __future__ import annotations

import math

import pytest

from batchspec.measure.verify_checks import compare_greedy, greedy_check, sampled_check
from batchspec.measure.verify_stats import (
    MIN_POOLED,
    OTHER,
    chi2_isf,
    chi2_sf,
    detectable_tv,
    holm,
    ncx2_sf,
    two_sample_test,
)
from batchspec.units import RowRequest, RowResult


def phi(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2))


@pytest.mark.parametrize("x", [0.01, 0.5, 1.0, 3.84, 7.0, 20.0, 60.0])
def test_chi2_sf_matches_closed_forms(x: float) -> None:
    assert chi2_sf(x, 1) == pytest.approx(math.erfc(math.sqrt(x / 2)), rel=1e-9)
    assert chi2_sf(x, 2) == pytest.approx(math.exp(-x / 2), rel=1e-9)
    assert chi2_sf(x, 4) == pytest.approx(math.exp(-x / 2) * (1 + x / 2), rel=1e-9)
    assert chi2_isf(chi2_sf(x, 3), 3) == pytest.approx(x, rel=1e-6)


@pytest.mark.parametrize(("x", "nc"), [(3.84, 0.0), (3.84, 5.0), (10.0, 13.0), (1.0, 40.0)])
def test_noncentral_chi2_matches_a_shifted_normal(x: float, nc: float) -> None:
    """One degree of freedom: X = (Z + sqrt(nc))^2."""
    r, s = math.sqrt(x), math.sqrt(nc)
    assert ncx2_sf(x, 1, nc) == pytest.approx(phi(-r - s) + phi(s - r), rel=1e-9)


def test_detectable_distance_is_where_power_reaches_95_percent() -> None:
    """df 1: power(nc) = P(|Z + sqrt(nc)| > z); the distance is sqrt(nc (n1+n2) / 4 n1 n2)."""
    z = math.sqrt(chi2_isf(0.01, 1))
    tv = detectable_tv(150, 250, 1, 0.01)
    nc = tv**2 * 4 * 150 * 250 / 400
    assert phi(-z - math.sqrt(nc)) + phi(math.sqrt(nc) - z) == pytest.approx(0.95, abs=1e-9)
    # More categories, a stricter level or fewer samples: a coarser guarantee.
    assert detectable_tv(150, 250, 5, 0.01) > tv
    assert detectable_tv(150, 250, 1, 0.001) > tv
    assert detectable_tv(50, 50, 1, 0.01) > tv


def test_statistic_of_a_hand_computed_table() -> None:
    """30/10 against 20/20: expected 25/15 in each row, X^2 = 4 * 25/25 + 4 * 25/15 = 16/3."""
    t = two_sample_test([1] * 30 + [2] * 10, [1] * 20 + [2] * 20)
    assert (t.categories, t.df, t.tv) == (2, 1, 0.25)
    assert t.statistic == pytest.approx(16 / 3)
    assert t.p_value == pytest.approx(math.erfc(math.sqrt(8 / 3)))


def test_rare_tokens_are_pooled_blind_to_the_sample() -> None:
    """Tokens seen fewer than MIN_POOLED times in both samples together are one category; a
    pooled category that is itself rare takes in the smallest frequent token."""
    a = [1] * 40 + [2] * 5 + [3] * 3
    b = [1] * 40 + [2] * 2 + [3] * 1 + [4] * 6
    t = two_sample_test(a, b)
    assert t.categories == 2  # {1} and {2, 3, 4} (7 + 4 + 6 pooled)
    assert t.tv == pytest.approx(abs(8 / 48 - 9 / 49) / 2 * 2)
    few = two_sample_test([1] * 30 + [2] * 20 + [3] * 2, [1] * 30 + [2] * 20 + [3] * 1)
    assert few.categories == 2 and MIN_POOLED > 3  # {1} and {2, 3}
    assert two_sample_test([OTHER] * 3, [OTHER] * 3).df == 0


def test_holm_on_an_enumerated_example() -> None:
    """Sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04 -> running max."""
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == [1.0, 1.0]  # monotone: never below an earlier step


def binomial(n: int, p: float) -> list[float]:
    return [math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(n + 1)]


def exact_rejection(n: int, pa: float, pb: float, level: float) -> float:
    """Exact probability that the test rejects at ``level``: every outcome of two samples of
    n Bernoulli draws enumerated."""
    wa, wb = binomial(n, pa), binomial(n, pb)
    total = 0.0
    for i in range(n + 1):
        for j in range(n + 1):
            t = two_sample_test([1] * i + [0] * (n - i), [1] * j + [0] * (n - j))
            total += wa[i] * wb[j] * (t.p_value < level)
    return total


def test_size_and_power_hold_exactly_on_enumerated_samples() -> None:
    """n = 60 per sample: under equal distributions the test rejects at most ~alpha; at the
    reported detectable distance (a split 0.5 +- d/2) it rejects at least ~95% of the time."""
    n, level = 60, 0.05
    size = exact_rejection(n, 0.5, 0.5, level)
    assert 0.03 < size <= level + 0.01
    tv = detectable_tv(n, n, 1, level)
    assert exact_rejection(n, 0.5 - tv / 2, 0.5 + tv / 2, level) >= 0.94


def row(tokens: list[int], logprobs: list[dict[int, float]] | None = None) -> RowResult:
    return RowResult(RowRequest(0, "r0", None, {}), token_ids=tokens, top_logprobs=logprobs)


def test_greedy_divergences_are_classified_by_the_targets_margin() -> None:
    lp = [{5: -0.1, 6: -3.0}, {7: -0.70, 8: -0.75}, {9: -0.1, 1: -4.0}]
    spec_lp = [{5: -0.12, 6: -3.1}, {8: -0.71, 7: -0.72}, {9: -0.1}]
    plain = row([5, 7, 9], lp)
    assert compare_greedy(plain, row([5, 7, 9], lp), 0.5) is None
    tie = compare_greedy(plain, row([5, 8, 9], spec_lp), 0.5)
    assert tie is not None and tie.near_tie and tie.position == 1
    assert tie.margin == pytest.approx(0.05) and tie.drift == pytest.approx(0.02)
    assert not compare_greedy(plain, row([5, 8, 9], spec_lp), 0.0).near_tie  # float32
    far = compare_greedy(plain, row([6, 7, 9]), 0.5)
    assert far is not None and not far.near_tie and far.margin == pytest.approx(2.9)
    outside = compare_greedy(plain, row([5, 7, 3]), 5.0)
    assert outside is not None and not outside.near_tie
    assert (outside.margin, outside.margin_bound) == (None, pytest.approx(3.9))
    check = greedy_check("bfloat16", [plain, plain, plain], [plain, row([5, 8, 9]), row([6])], 0.5)
    s = check.summary()
    assert (s["rows"], s["identical"], s["near_ties"], s["failures"]) == (3, 1, 1, 1)
    assert not s["passed"] and s["min_margin"] == pytest.approx(0.05)


def test_sampled_check_rejects_a_shift_and_corrects_for_every_test() -> None:
    same = [row([t % 3, t % 2]) for t in range(90)]
    shifted = [row([t % 3, 1 if t % 5 else 0]) for t in range(90)]
    ok = sampled_check([("a", same, same), ("b", same, list(reversed(same)))], 2, 0.05)
    assert ok["passed"] and ok["tests"] == 4 and ok["min_p"] == pytest.approx(1.0)
    bad = sampled_check([("a", same, same), ("b", same, shifted)], 2, 0.05)
    assert not bad["passed"] and bad["rejected"] == 1
    hit = next(t for t in bad["details"] if t["p_holm"] < 0.05)
    assert (hit["row_id"], hit["position"]) == ("b", 1)
    assert hit["p_holm"] == pytest.approx(min(1.0, 4 * hit["p_value"]))
    assert hit["detectable_tv"] == pytest.approx(detectable_tv(90, 90, 1, 0.05 / 4))


def test_default_near_tie_threshold_follows_the_measured_drift() -> None:
    """Not float32: 4 x the largest logprob drift of agreed tokens; float32: always 0."""
    plain = row([5, 7, 9], [{5: -0.1, 6: -3.0}, {7: -0.70, 8: -0.75}, {9: -0.1}])
    spec = row([5, 8, 9], [{5: -0.12, 6: -3.1}, {8: -0.71, 7: -0.72}, {9: -0.1}])
    bf16 = greedy_check("bfloat16", [plain], [spec], None).summary()
    assert bf16["max_drift"] == pytest.approx(0.02)
    assert bf16["near_tie_threshold"] == pytest.approx(0.08) and bf16["near_ties"] == 1
    f32 = greedy_check("float32", [plain], [spec], 1.0).summary()
    assert f32["near_tie_threshold"] == 0 and f32["failures"] == 1
