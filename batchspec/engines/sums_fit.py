"""Least squares from running sums, with no coefficient negative and some columns tied.

``vllm_steps.StepCosts`` keeps XᵀX, Xᵀy and yᵀy of an engine's steps (bounded memory over a
run of days) and fits a step's cost from them; a negative cost per row or per token is noise
(or a column the steps cannot separate), so it is dropped and the rest refitted, and columns
the steps cannot tell apart are priced as a partner or left out.
"""

from __future__ import annotations

import numpy as np


def solve(
    xtx: np.ndarray, xty: np.ndarray, yy: float, n: float, tied: dict[int, int | None]
) -> tuple[np.ndarray, np.ndarray]:
    """Least squares from the sums, no coefficient negative (a negative one is dropped and
    the rest refitted), tied columns priced as their partner; and the coefficients'
    covariance from the residuals."""
    m = len(xty)
    active = [j for j in range(m) if j not in tied]
    while True:
        a = xtx[np.ix_(active, active)]
        coef_a = np.linalg.lstsq(a, xty[active], rcond=None)[0]
        if (coef_a >= 0).all() or len(active) == 1:
            break
        active = [j for j, c in zip(active, coef_a, strict=True) if c >= 0] or active[:1]
    coef = np.zeros(m)
    coef[active] = np.maximum(coef_a, 0.0)
    for j, partner in tied.items():
        if partner is not None:
            coef[j] = coef[partner]
    rss = max(yy - 2 * coef @ xty + coef @ xtx @ coef, 0.0)
    dof = max(n - len(active), 1.0)
    sigma = np.zeros((m, m))
    sigma[np.ix_(active, active)] = np.linalg.pinv(a) * (rss / dof)
    return coef, sigma
