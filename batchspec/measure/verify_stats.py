"""The statistics of ``batchspec verify``: two-sample tests of token distributions, Holm's
correction, and the power of the test as the smallest total-variation distance it detects.

Pure Python (``math`` only), so that the figures in a report can be checked by hand and the
unit tests can compare them with exact, enumerated expectations.

Why these choices:

- Pearson's chi-square test of homogeneity on the 2 x k table of token counts, with tokens
  seen fewer than ``MIN_POOLED`` times in both samples together pooled into one category: that
  keeps every expected count at 5 or more, where the chi-square approximation holds (the
  enumeration tests check its size and power). Pooling looks at the pooled counts only, never
  at which sample a token came from, so the test stays valid.
- Holm's step-down correction over every (prompt, position) test: the family-wise error rate
  stays at ``alpha`` whatever the dependence between tests, and it rejects at least what
  Bonferroni rejects.
- Power: for two distributions at total-variation distance d, the chi-square noncentrality is
  at least 4 d^2 n1 n2 / (n1 + n2) (Cauchy-Schwarz: sum (p-q)^2 / m >= (sum |p-q|)^2 when the
  weights m sum to 1). So the smallest d whose smallest noncentrality reaches 95% power at the
  corrected level is detected, whatever the shape of the difference.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

MIN_POOLED = 10
"""Tokens seen fewer times than this in both samples together share one category."""
OTHER = ("<other>",)
"""The pooled category of rare tokens (a tuple, so no token id can collide with it)."""
POWER = 0.95


def _gamma_q(a: float, x: float) -> float:
    """Regularized upper incomplete gamma Q(a, x): series below a + 1, continued fraction
    above (Numerical Recipes, 6.2); accurate to ~1e-12."""
    if x <= 0:
        return 1.0
    log_front = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1:
        term = total = 1.0 / a
        n = a
        while abs(term) > abs(total) * 1e-15:
            n += 1
            term *= x / n
            total += term
        return max(0.0, 1.0 - total * math.exp(log_front))
    tiny = 1e-300
    b = x + 1 - a
    c = 1 / tiny
    d = 1 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return math.exp(log_front) * h


def chi2_sf(x: float, df: int) -> float:
    """P(X > x) for X chi-square with ``df`` degrees of freedom."""
    return _gamma_q(df / 2, x / 2)


def chi2_isf(p: float, df: int) -> float:
    """The x with ``chi2_sf(x, df) == p`` (bisection; the critical value of a test)."""
    lo, hi = 0.0, 1.0
    while chi2_sf(hi, df) > p:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if chi2_sf(mid, df) > p else (lo, mid)
    return (lo + hi) / 2


def ncx2_sf(x: float, df: int, nc: float) -> float:
    """P(X > x) for X noncentral chi-square: a Poisson(nc / 2) mixture of central ones."""
    half = nc / 2
    j0 = int(half)
    total = 0.0
    # Sum outward from the Poisson mode until the weights are negligible.
    for step in (1, -1):
        j = j0 if step == 1 else j0 - 1
        while j >= 0:
            weight = math.exp(-half + j * math.log(half) - math.lgamma(j + 1)) if half else 0.0
            weight = weight if half else float(j == 0)
            total += weight * chi2_sf(x, df + 2 * j)
            if weight < 1e-17 and abs(j - j0) > 5:
                break
            j += step
    return min(1.0, total)


def detectable_tv(n1: int, n2: int, df: int, level: float, power: float = POWER) -> float:
    """The smallest total-variation distance that a chi-square test with ``df`` degrees of
    freedom at ``level`` detects with probability ``power`` from samples of n1 and n2, for
    any pair of distributions that far apart (see the module docstring)."""
    crit = chi2_isf(level, df)
    lo, hi = 0.0, 1.0
    while ncx2_sf(crit, df, hi) < power:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ncx2_sf(crit, df, mid) < power else (lo, mid)
    nc = (lo + hi) / 2
    return min(1.0, math.sqrt(nc * (n1 + n2) / (4 * n1 * n2)))


@dataclass
class TwoSample:
    """One test: the categories compared, the statistic, its degrees of freedom, p-value."""

    categories: int
    statistic: float
    df: int
    p_value: float
    tv: float
    """Total-variation distance between the two empirical distributions (pooled categories)."""
    counts: list[tuple[str, int, int]]
    """Per category (token id, or ``<other>``), its count in each sample, most frequent first."""


def two_sample_test(a: Sequence[Hashable], b: Sequence[Hashable]) -> TwoSample:
    """Chi-square test that samples ``a`` and ``b`` come from one distribution."""
    ca, cb = Counter(a), Counter(b)
    pooled = ca + cb
    rare = {t for t, n in pooled.items() if n < MIN_POOLED}
    keys = [t for t in pooled if t not in rare]
    if rare:
        # A pooled category that is itself rare joins the smallest frequent one.
        if sum(pooled[t] for t in rare) < MIN_POOLED and keys:
            rare.add(min(keys, key=lambda t: (pooled[t], repr(t))))
            keys = [t for t in keys if t not in rare]
        keys.append(OTHER)
    fold = {t: (OTHER if t in rare else t) for t in pooled}
    ra = Counter(fold[t] for t in a)
    rb = Counter(fold[t] for t in b)
    n1, n2 = len(a), len(b)
    n = n1 + n2
    stat = 0.0
    for t in keys:
        total = ra[t] + rb[t]
        for obs, size in ((ra[t], n1), (rb[t], n2)):
            expected = size * total / n
            stat += (obs - expected) ** 2 / expected
    tv = 0.5 * sum(abs(ra[t] / n1 - rb[t] / n2) for t in keys)
    df = len(keys) - 1
    p = chi2_sf(stat, df) if df > 0 else 1.0
    counts = sorted(((str(t[0] if t is OTHER else t), ra[t], rb[t]) for t in keys), key=_by_total)
    return TwoSample(len(keys), stat, df, p, tv, counts)


def _by_total(row: tuple[str, int, int]) -> tuple[int, str]:
    return -(row[1] + row[2]), row[0]


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order: reject where adjusted < alpha."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [1.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted
