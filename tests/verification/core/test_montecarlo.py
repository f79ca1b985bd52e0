"""The Monte Carlo protocol itself: false-failure rate when the bound holds exactly, power at 1.5 × the bound."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from verification.core.evidence import bound_factor
from verification.core.montecarlo import (
    ASSERTIONS,
    CAP_FACTOR,
    DELTA,
    FAMILY_WISE_BUDGET,
    bernstein_lcb,
    bernstein_lcbs,
    chi2_capped_mean,
    crossing_factor,
    hoeffding_lcb,
    hoeffding_lcbs,
    mean_claim,
    protocol_lcbs,
    recorded_claims,
    required_runs,
)

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
    and at the suite's δ (the family-wise budget split over its assertions) no replication fails."""
    rng = np.random.default_rng(sorted(DISTRIBUTIONS).index(law))
    b, n, reps = 1.0, 400, 3000
    fails_05 = fails_suite = 0
    for _ in range(reps):
        x = DISTRIBUTIONS[law](rng, b, n)
        fails_05 += mean_claim(x, b, delta=0.05, with_crossing=False).failed
        fails_suite += mean_claim(x, b, with_crossing=False).failed
    slack = stats.binom.ppf(1 - 1e-4, reps, 0.05)
    assert fails_05 <= slack, (fails_05, slack)
    assert fails_suite == 0


@pytest.mark.parametrize("law", sorted(DISTRIBUTIONS))
def test_power_at_one_and_a_half_times_the_bound(law):
    """E[X] = 1.5 b, N = 10⁴, κ_M = 5 (docs/spec/tolerances.md#monte-carlo): the failure is detected."""
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
    assert hoeffding_lcb(y, CAP_FACTOR * b, 1e-4) / b == pytest.approx(1.5 - 5 * np.sqrt(np.log(1e4) / 2e4), abs=0.02)
    assert 1.40 < bernstein_lcb(y, CAP_FACTOR * b, 1e-4) / b < 1.52


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


def test_budget_split_adds_up():
    assert DELTA * sum(ASSERTIONS.values()) <= FAMILY_WISE_BUDGET * (1 + 1e-12)


def test_crossing_factor_agrees_with_the_scaled_claim():
    """mean_claim under bound_factor(f) fails iff f < crossing factor (the cap scales with the bound)."""
    rng = np.random.default_rng(11)
    x = 0.8 * rng.chisquare(1, 3000)  # E X = 0.8 against b = 1
    f_star = crossing_factor(x, 1.0)
    assert 0.5 < f_star < 0.8
    res = mean_claim(x, 1.0)
    assert res.crossing == pytest.approx(f_star) and not res.failed
    for f in (0.95 * f_star, 1.05 * f_star):
        with bound_factor(f):
            r = mean_claim(x, 1.0)
        assert r.bound == pytest.approx(f) and r.cap == pytest.approx(CAP_FACTOR * f)
        assert r.failed is (f < f_star)


def test_sample_size_detects_a_halved_bound_with_probability_099():
    """E X = b exactly (X = b ξ²): N = required_runs(ν) detects the bound b/2 in >= 99 % of replications;
    the stated ν = E min(X, 5b/2)/(b/2) = 2 E min(χ²₁, 2.5) matches a Monte Carlo estimate."""
    rng = np.random.default_rng(12)
    nu = 2.0 * chi2_capped_mean(2.5)
    assert nu == pytest.approx(2.0 * np.minimum(rng.chisquare(1, 400_000), 2.5).mean(), rel=5e-3)
    n = required_runs(nu)
    assert 500 < n < 2000
    reps = 300
    detected = 0
    for _ in range(reps):
        with bound_factor(0.5):
            detected += mean_claim(rng.chisquare(1, n), 1.0, with_crossing=False).failed
    assert detected >= 0.99 * reps - 3  # binomial slack: P(Bin(300, 0.99) < 294) < 0.1
    with pytest.raises(ValueError, match="exceed 1"):
        required_runs(0.9)


def test_vectorised_bounds_are_the_scalar_ones_row_by_row():
    """One implementation: each row of the bounds computed along the last axis equals, bit for bit, the scalar bound
    of that row and the LCB that mean_claim tests (the calibration study evaluates the rows)."""
    rng = np.random.default_rng(7)
    for n in (2, 3, 17, 963, 4000):
        for law in sorted(DISTRIBUTIONS):
            X = np.stack([DISTRIBUTIONS[law](rng, 1.0, n) for _ in range(3)])
            b = 1.3
            Y, M = np.minimum(X, CAP_FACTOR * b), CAP_FACTOR * b
            h, bern, lcb = protocol_lcbs(Y, M, DELTA)
            assert np.array_equal(hoeffding_lcbs(Y, M, DELTA / 2), h)
            assert np.array_equal(bernstein_lcbs(Y, M, DELTA / 2), bern)
            for r in range(3):
                res = mean_claim(X[r], b, with_crossing=False)
                assert h[r] == hoeffding_lcb(Y[r], M, DELTA / 2) == res.lcb_hoeffding
                assert bern[r] == bernstein_lcb(Y[r], M, DELTA / 2) == res.lcb_bernstein
                assert lcb[r] == res.lcb and res.failed == bool(lcb[r] > b)


def test_recorded_claims_hands_over_the_samples_and_nothing_outside_the_block():
    rng = np.random.default_rng(0)
    x = rng.exponential(1.0, 50)
    mean_claim(x, 2.0, with_crossing=False)
    with recorded_claims() as log:
        res = mean_claim(x, 2.0, with_crossing=False)
        x[0] = -1.0  # the record holds a copy
    mean_claim(np.abs(x), 2.0, with_crossing=False)
    assert len(log) == 1 and log[0].result == res and log[0].samples[0] != -1.0 and log[0].samples.size == 50
