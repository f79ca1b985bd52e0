"""The Monte Carlo protocol itself: false-failure rate when the bound holds exactly, power at 1.5 × the bound."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from verification.montecarlo import CAP_FACTOR, DELTA, bernstein_lcb, hoeffding_lcb, mean_claim

DISTRIBUTIONS = {
    # name: sampler(rng, mean, size) of a non-negative law with the given mean
    "exponential": lambda rng, mean, size: rng.exponential(mean, size),
    "uniform": lambda rng, mean, size: rng.uniform(0, 2 * mean, size),
    "two-point": lambda rng, mean, size: mean * 4 * (rng.random(size) < 0.25),
    "chi2_1": lambda rng, mean, size: mean * rng.chisquare(1, size),
}


@pytest.mark.parametrize("law", sorted(DISTRIBUTIONS))
def test_false_failure_rate_when_the_bound_holds_with_equality(law):
    """E[X] = b exactly: the empirical false-failure rate at δ = 0.05 stays below δ (binomial 99.99 % slack),
    and at the suite's δ = 1e-4 no replication fails."""
    rng = np.random.default_rng(sorted(DISTRIBUTIONS).index(law))
    b, n, reps = 1.0, 400, 3000
    fails_05 = fails_suite = 0
    for _ in range(reps):
        x = DISTRIBUTIONS[law](rng, b, n)
        fails_05 += mean_claim(x, b, delta=0.05).failed
        fails_suite += mean_claim(x, b).failed
    slack = stats.binom.ppf(1 - 1e-4, reps, 0.05)
    assert fails_05 <= slack, (fails_05, slack)
    assert fails_suite == 0


@pytest.mark.parametrize("law", sorted(DISTRIBUTIONS))
def test_power_at_one_and_a_half_times_the_bound(law):
    """E[X] = 1.5 b, N = 10⁴, κ_M = 5 (THEOREMS.md §3.0): the failure is detected."""
    rng = np.random.default_rng(100 + sorted(DISTRIBUTIONS).index(law))
    b = 1.0
    res = mean_claim(DISTRIBUTIONS[law](rng, 1.5 * b, 10_000), b)
    assert res.failed, res
    assert res.lcb > b


def test_documented_lcb_values():
    """Uniform X on [0, 3b] (mean 1.5 b) with N = 10⁴: Hoeffding ≈ 1.44 b, empirical Bernstein ≈ 1.46 b."""
    rng = np.random.default_rng(7)
    b = 2.0
    x = rng.uniform(0, 3 * b, 10_000)
    y = np.minimum(x, CAP_FACTOR * b)
    assert hoeffding_lcb(y, CAP_FACTOR * b, DELTA) / b == pytest.approx(1.5 - 5 * np.sqrt(np.log(1e4) / 2e4), abs=0.02)
    assert 1.40 < bernstein_lcb(y, CAP_FACTOR * b, DELTA) / b < 1.52


def test_capping_never_raises_the_mean_and_bad_input():
    rng = np.random.default_rng(8)
    x = rng.pareto(1.5, 5000)
    res = mean_claim(x, 1.0)
    assert res.mean_capped <= res.mean
    with pytest.raises(ValueError, match="samples must be >= 0"):
        mean_claim([-1.0, 1.0], 1.0)
    with pytest.raises(ValueError, match="bound"):
        mean_claim([1.0, 1.0], 0.0)
    with pytest.raises(ValueError, match="delta"):
        mean_claim([1.0, 1.0], 1.0, delta=2.0)
    with pytest.raises(ValueError, match="non-finite"):
        mean_claim([1.0, np.nan], 1.0)
