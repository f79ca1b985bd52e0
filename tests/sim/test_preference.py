"""Preference functions: identities I1-I5, finite differences, metamorphic relations and input checks."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.preference import (
    adjustment,
    bottleneck_set,
    chebyshev,
    check_gram,
    check_losses,
    check_preferences,
    check_shapes,
    jstar_log_tolerance,
    log_ratios,
    log_spread,
    normalized_losses,
    normalizer,
    preference_parts,
    preference_uniformity,
    ray_point,
    uniformity_and_adjustment,
)
from sim.roundoff import EPS, TIE_RTOL
from tests.error_patterns import float_value, names

FD_STEP_LOSS = 1e-6
FD_RTOL = 1e-5


def random_instance(rng, m, batch=()):
    losses = np.exp(rng.uniform(-2, 2, size=batch + (m,)))
    prefs = 0.95 * rng.dirichlet(np.ones(m), size=batch if batch else None) + 0.05 / m
    return losses, prefs


@pytest.mark.parametrize("m", [2, 3, 5, 8])
def test_identities_I1_and_ranges(m):
    rng = np.random.default_rng(m)
    l, lam = random_instance(rng, m, (500,))
    beta, A = uniformity_and_adjustment(l, lam)
    assert np.all(beta >= 0) and np.all(beta <= np.log(m) + 1e-12)
    # (I1) Σ_j a_j l_j = 0 (Euler: β is 0-homogeneous in l)
    scale = np.abs(A * l).sum(axis=-1)
    np.testing.assert_array_less(np.abs((A * l).sum(axis=-1)), 1e-13 * np.maximum(1, scale))
    np.testing.assert_allclose(beta, preference_uniformity(l, lam), rtol=0, atol=0)
    np.testing.assert_allclose(A, adjustment(l, lam), rtol=0, atol=0)
    lhat = normalized_losses(l, lam)
    np.testing.assert_allclose(lhat.sum(axis=-1), 1.0, rtol=1e-14)


@pytest.mark.parametrize("m", [2, 3, 5])
def test_gradient_in_losses_I2_by_finite_differences(m):
    """∇_l β = A / Z, central differences with step 1e-6 (relative to l), rel. error <= 1e-5."""
    rng = np.random.default_rng(10 + m)
    for _ in range(50):
        l, lam = random_instance(rng, m)
        beta, A = uniformity_and_adjustment(l, lam)
        Z = normalizer(l, lam)
        fd = np.empty(m)
        for k in range(m):
            h = FD_STEP_LOSS * l[k]
            lp, lm = l.copy(), l.copy()
            lp[k] += h
            lm[k] -= h
            fd[k] = (preference_uniformity(lp, lam) - preference_uniformity(lm, lam)) / (2 * h)
        exact = A / Z
        err = np.linalg.norm(fd - exact) / max(np.linalg.norm(exact), 1e-300)
        assert err <= FD_RTOL, (l, lam, fd, exact)


def test_uniform_point_gives_zero():
    rng = np.random.default_rng(3)
    for m in (2, 3, 6):
        l = np.exp(rng.uniform(-1, 1, m))
        lam = (1 / l) / (1 / l).sum()  # λ ∝ 1/l puts l on the preference ray
        beta, A = uniformity_and_adjustment(l, lam)
        assert beta <= 1e-15
        assert np.abs(A).max() <= 1e-14
        q = ray_point(chebyshev(l, lam), lam)
        np.testing.assert_allclose(q, l, rtol=1e-13)


def test_I5_second_order_expansion():
    """β = Σ ε_j²/(2m) + o(ε²) and ‖A‖²/β ∈ [2mλ_min², 2mλ_max²] in the limit (I5, S1-S3)."""
    rng = np.random.default_rng(5)
    m = 4
    lam = 0.9 * rng.dirichlet(np.ones(m)) + 0.1 / m
    eps = rng.normal(size=m)
    eps -= eps.mean()
    for t in (1e-2, 1e-3):
        lhat = (1 + t * eps) / m
        l = lhat / lam  # so that λ ⊙ l ∝ lhat
        beta, A = uniformity_and_adjustment(l, lam)
        approx = (t * eps) @ (t * eps) / (2 * m)
        assert abs(beta - approx) <= 2 * t * approx
        ratio = A @ A / beta
        assert 2 * m * lam.min() ** 2 * (1 - 5 * t) <= ratio <= 2 * m * lam.max() ** 2 * (1 + 5 * t)


def test_loss_scaling_leaves_beta_and_A_unchanged():
    rng = np.random.default_rng(7)
    l, lam = random_instance(rng, 4, (200,))
    beta, A = uniformity_and_adjustment(l, lam)
    for s in (1e-3, 0.5, 7.0, 1e4):
        b2, A2 = uniformity_and_adjustment(s * l, lam)
        np.testing.assert_allclose(b2, beta, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(A2, A, rtol=1e-10, atol=1e-14)


def test_permutation_equivariance():
    rng = np.random.default_rng(8)
    l, lam = random_instance(rng, 5, (100,))
    perm = rng.permutation(5)
    beta, A = uniformity_and_adjustment(l, lam)
    b2, A2 = uniformity_and_adjustment(l[:, perm], lam[:, perm])
    np.testing.assert_allclose(b2, beta, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(A2, A[:, perm], rtol=1e-12, atol=1e-15)
    np.testing.assert_array_equal(bottleneck_set(l[:, perm], lam[:, perm]), bottleneck_set(l, lam)[:, perm])


def test_batching_over_leading_axes():
    rng = np.random.default_rng(9)
    l, lam = random_instance(rng, 3, (4, 5))
    beta = preference_uniformity(l, lam)
    assert beta.shape == (4, 5)
    for i in range(4):
        for j in range(5):
            assert beta[i, j] == preference_uniformity(l[i, j], lam[i, j])
    assert chebyshev(l, lam).shape == (4, 5)
    assert ray_point(chebyshev(l, lam), lam).shape == (4, 5, 3)


# ------------------------------------------------------------------------------------------------ bad input


GOOD_L = np.array([1.0, 2.0, 3.0])
GOOD_LAM = np.array([0.2, 0.3, 0.5])


@pytest.mark.parametrize(
    "prefs, pattern",
    [
        ([0.25, 0.25, 0.75], names(r"\bprefs\b", "sum to 1", r"1\.25")),
        ([0.0, 0.5, 0.5], names(r"\bprefs\b", "open simplex", float_value("0.0"))),
        ([-0.125, 0.625, 0.5], names(r"\bprefs\b", "open simplex", float_value("-0.125"))),
        ([np.nan, 0.5, 0.5], names(r"\bprefs\b", "non-finite", "nan")),
        ([0.5, np.inf, 0.5], names(r"\bprefs\b", "non-finite", "inf")),
    ],
)
def test_bad_preferences_raise(prefs, pattern):
    with pytest.raises(ValueError, match=pattern):
        preference_uniformity(GOOD_L, prefs)


@pytest.mark.parametrize(
    "losses, pattern",
    [
        ([1.0, 0.0, 2.0], names(r"\blosses\b", "strictly positive", float_value("0.0"))),
        ([1.0, -2.0, 2.0], names(r"\blosses\b", "strictly positive", float_value("-2.0"))),
        ([1.0, np.nan, 2.0], names(r"\blosses\b", "non-finite", "nan")),
        ([1.0, np.inf, 2.0], names(r"\blosses\b", "non-finite", "inf")),
    ],
)
def test_bad_losses_raise(losses, pattern):
    with pytest.raises(ValueError, match=pattern):
        adjustment(losses, GOOD_LAM)


def test_shape_mismatch_raises():
    with pytest.raises(ValueError, match=names("objectives m", r"\(2,\)", r"\(3,\)")):
        preference_uniformity([1.0, 2.0], GOOD_LAM)


@pytest.mark.parametrize(
    "gram, pattern",
    [
        (np.array([[1.0, 0.5], [0.25, 1.0]]), names(r"\bgram\b", "symmetric", r"2\.500e-01|0\.25")),
        (np.array([[1.0, 2.0], [2.0, 1.0]]), names(r"\bgram\b", "positive semi-definite", r"-1\.000e\+00|-1\.0")),
        (np.array([[1.0, np.nan], [np.nan, 1.0]]), names(r"\bgram\b", "non-finite", "nan")),
        (np.ones((2, 3)), names(r"\bgram\b", "square", r"\(2, 3\)")),
    ],
)
def test_bad_gram_raises(gram, pattern):
    with pytest.raises(ValueError, match=pattern):
        check_gram(gram)


# one bad row in a batch of good rows must raise and name that row (validation of every row, not of the first or
# of all rows at once)
_MIXED_FUNCTIONS = [normalizer, normalized_losses, preference_uniformity, adjustment, uniformity_and_adjustment,
                    chebyshev, bottleneck_set]
_MIXED_CASES = {
    "prefs-sum": ("prefs", [0.25, 0.25, 0.75], names(r"\bprefs\b", r"\(3,", r"1\.25")),
    "prefs-zero": ("prefs", [0.5, 0.0, 0.5], names(r"\bprefs\b", r"\(3, 1\)", float_value("0.0"))),
    "prefs-nan": ("prefs", [0.5, np.nan, 0.5], names(r"\bprefs\b", r"\(3, 1\)", "nan")),
    "losses-negative": ("losses", [1.0, -0.5, 2.0], names(r"\blosses\b", r"\(3, 1\)", float_value("-0.5"))),
    "losses-inf": ("losses", [1.0, 2.0, np.inf], names(r"\blosses\b", r"\(3, 2\)", "inf")),
}


@pytest.mark.parametrize("case", sorted(_MIXED_CASES))
@pytest.mark.parametrize("fn", _MIXED_FUNCTIONS, ids=lambda f: f.__name__)
def test_one_bad_row_in_a_good_batch_is_named(fn, case):
    rng = np.random.default_rng(2)
    losses, prefs = random_instance(rng, 3, batch=(6,))
    fn(losses, prefs)  # the good batch passes
    which, row, pattern = _MIXED_CASES[case]
    arrays = {"losses": losses.copy(), "prefs": prefs.copy()}
    arrays[which][3] = row
    with pytest.raises(ValueError, match=pattern):
        fn(arrays["losses"], arrays["prefs"])


def test_one_bad_ray_level_in_a_good_batch_raises():
    prefs = np.array([0.2, 0.3, 0.5])
    for psi, what, value in (([1.0, 2.0, -1.0, 3.0], "strictly positive", "-1"),
                             ([1.0, 2.0, np.nan, 3.0], "finite", "nan"), (0.0, "strictly positive", r"got 0\.0")):
        with pytest.raises(ValueError, match=names(rf"\bpsi must be {what};", value)):
            ray_point(psi, prefs)


def test_one_bad_ray_level_in_a_good_batch_is_named_by_index():
    with pytest.raises(ValueError, match=names(r"\bpsi\b", r"(?:\(2,\)|\[2\]|index 2\b|entry 2\b)", "-1")):
        ray_point([1.0, 2.5, -1.0, 3.0], np.array([0.2, 0.3, 0.5]))


def test_gram_roundoff_is_accepted():
    rng = np.random.default_rng(11)
    G = rng.normal(size=(6, 3))
    G[:, 2] = G[:, 0] + G[:, 1]  # rank deficient: smallest eigenvalue is 0 up to round-off
    C = G.T @ G
    check_gram(C)


@settings(max_examples=60, deadline=None)
@given(
    m=st.integers(2, 6),
    seed=st.integers(0, 2**32 - 1),
    spread=st.floats(0.01, 5.0),
)
def test_property_beta_kl_and_gradient_identity(m, seed, spread):
    rng = np.random.default_rng(seed)
    l = np.exp(rng.uniform(-spread, spread, m))
    lam = check_preferences(0.9 * rng.dirichlet(np.ones(m)) + 0.1 / m)
    beta, A = uniformity_and_adjustment(l, lam)
    kl = _kl_reference(l, lam)
    assert abs(beta - kl) <= 4 * EPS * (kl + np.sqrt(kl) + log_spread(l, lam))
    assert 0 <= beta <= np.log(m) + 1e-12
    assert abs(A @ l) <= 1e-12 * max(1.0, np.abs(A * l).sum())
    assert (np.abs(A).max() == 0) == (beta == 0)


def _kl_reference(l, lam) -> float:
    """β of the float64 data ``l, λ`` in 60-digit arithmetic."""
    import mpmath as mp

    with mp.workdps(60):
        w = [mp.mpf(float(a)) * mp.mpf(float(b)) for a, b in zip(l, lam, strict=True)]
        Z = mp.fsum(w)
        m = len(w)
        return float(mp.fsum((x / Z) * mp.log(m * x / Z) for x in w))


@settings(max_examples=60, deadline=None)
@given(
    m=st.integers(2, 6),
    seed=st.integers(0, 2**32 - 1),
    log10_spread=st.floats(-14.0, 0.0),
    log10_scale=st.floats(-300.0, 300.0),
)
def test_property_beta_accurate_near_the_ray_and_at_extreme_magnitudes(m, seed, log10_spread, log10_scale):
    """β against 60-digit arithmetic: error <= 4ε(β + √β + spread) for spreads 1e-14..1 and magnitudes 1e-300..1e300
    (the textbook Σ ĺ log(m ĺ) has an error of order ε, i.e. is pure roundoff below β ≈ 1e-16)."""
    rng = np.random.default_rng(seed)
    lam = check_preferences(rng.dirichlet(np.ones(m)) * 0.9 + 0.1 / m)
    l = (1.0 + 10.0**log10_spread * rng.uniform(-1, 1, m)) / lam * 10.0**log10_scale
    kl = _kl_reference(l, lam)
    beta = float(preference_uniformity(l, lam))
    assert abs(beta - kl) <= 4 * EPS * (kl + np.sqrt(kl) + log_spread(l, lam)), (beta, kl)


@pytest.mark.parametrize(
    "losses, prefs, expected",
    [
        ([1e300, 1e-300, 1.0], [1 / 3] * 3, np.log(3.0)),
        ([5e-324, 5e-324, 5e-324], [1 / 3] * 3, 0.0),
        ([1e-310, 1e-310], [0.5, 0.5], 0.0),
        ([1.7e308, 1.7e308, 1.7e308], [0.2, 0.3, 0.5], None),
    ],
)
def test_extreme_but_valid_losses_give_finite_exact_values(losses, prefs, expected):
    """Extreme magnitudes: no NaN, no overflow; β, A and the LP direction are computed in log space."""
    from sim.direction import lp_direction

    beta, A = uniformity_and_adjustment(losses, prefs)
    ref = _kl_reference(losses, check_preferences(prefs)) if expected is None else expected
    assert np.isfinite(beta) and np.all(np.isfinite(A))
    assert beta == pytest.approx(ref, rel=1e-14, abs=1e-300)
    res = lp_direction(losses, prefs, np.eye(len(losses)))
    assert np.isfinite(res.beta) and np.all(np.isfinite(res.weights))
    assert str(res.status) == "optimal"


# ------------------------------------------------ gradients in the parameters (I3, I4), over problem families


def _family(name, rng, m):
    from sim.problems import CommonMinimizer, PerturbedClients, PlantedQuadraticCluster

    if name == "F1":
        P = PlantedQuadraticCluster.make(rng, m, 5, 3, spread=0.1)
        return (lambda w: P.losses(w)), (lambda w: P.grads(w)), P.prefs[1], P.n_params
    if name == "F2":
        P = PerturbedClients.make(rng, m, 5, 3, shift=0.2)
        return (lambda w: P.losses(w, client=2)), (lambda w: P.grads(w, client=2)), P.prefs[2], P.n_params
    P = CommonMinimizer.make(rng, n_w=5, prefs=tuple(np.linspace(2, 1, m) / np.linspace(2, 1, m).sum()))
    return (lambda w: P.losses(w)), (lambda w: P.grads(w)), P.prefs, P.hessian.shape[0]


@pytest.mark.parametrize("m", [2, 3, 4])
@pytest.mark.parametrize("family", ["F1", "F2", "F3"])
def test_gradient_in_parameters_I3_and_directional_derivative_I4(family, m):
    """∇_w β = G A / Z and d/ds β(l(w − s v)) = −vᵀ G A / Z, central differences (step 1e-7), rel. error <= 1e-5."""
    rng = np.random.default_rng([m, ["F1", "F2", "F3"].index(family)])
    loss, grad, lam, n_w = _family(family, rng, m)
    h = 1e-7
    for _ in range(10):
        w = rng.normal(size=n_w)
        l, G = loss(w), grad(w)
        beta, A = uniformity_and_adjustment(l, lam)
        exact = G @ A / normalizer(l, lam)
        fd = np.array([(preference_uniformity(loss(w + h * e), lam) - preference_uniformity(loss(w - h * e), lam))
                       / (2 * h) for e in np.eye(n_w)])
        assert np.linalg.norm(fd - exact) <= FD_RTOL * np.linalg.norm(exact), (w, fd, exact)
        v = rng.normal(size=n_w)
        dd = (preference_uniformity(loss(w - h * v), lam) - preference_uniformity(loss(w + h * v), lam)) / (2 * h)
        assert abs(dd + v @ exact) <= FD_RTOL * abs(v @ exact)


# ------------------------------------------------- golden values, batches, resolutions (mutation-tested gaps)

# λ ⊙ l = (1/2, 1/2, 1)/1: Z = 2, ĺ = (1/4, 1/4, 1/2), x = log(3ĺ), β = ½ log(9/8), spread = log 2, ψ = 1
GOLD_L = np.array([1.0, 2.0, 4.0])
GOLD_LAM = np.array([0.5, 0.25, 0.25])
GOLD_LHAT = np.array([0.25, 0.25, 0.5])
GOLD_X = np.log(3.0 * GOLD_LHAT)
GOLD_BETA = 0.5 * np.log(9.0 / 8.0)


def test_golden_values_of_every_preference_function():
    """Closed-form values on one instance, to a few ulps (rtol 1e-14 / atol 1e-15)."""
    tol = dict(rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(normalizer(GOLD_L, GOLD_LAM), 2.0, **tol)
    np.testing.assert_allclose(normalized_losses(GOLD_L, GOLD_LAM), GOLD_LHAT, **tol)
    np.testing.assert_allclose(log_ratios(GOLD_L, GOLD_LAM), GOLD_X, **tol)
    np.testing.assert_allclose(log_spread(GOLD_L, GOLD_LAM), np.log(2.0), **tol)
    np.testing.assert_allclose(preference_uniformity(GOLD_L, GOLD_LAM), GOLD_BETA, **tol)
    np.testing.assert_allclose(adjustment(GOLD_L, GOLD_LAM), GOLD_LAM * (GOLD_X - GOLD_BETA), **tol)
    np.testing.assert_allclose(chebyshev(GOLD_L, GOLD_LAM), 1.0, **tol)
    np.testing.assert_allclose(ray_point(1.0, GOLD_LAM), [2.0, 4.0, 4.0], **tol)
    np.testing.assert_array_equal(bottleneck_set(GOLD_L, GOLD_LAM), [False, False, True])
    parts = preference_parts(GOLD_L, GOLD_LAM)
    np.testing.assert_allclose(parts.lhat, GOLD_LHAT, **tol)
    np.testing.assert_allclose(parts.x, GOLD_X, **tol)
    np.testing.assert_allclose(parts.beta, GOLD_BETA, **tol)
    np.testing.assert_allclose(parts.spread, np.log(2.0), **tol)
    np.testing.assert_allclose(parts.adjustment, GOLD_LAM * (GOLD_X - GOLD_BETA), **tol)


_ROW_FUNCTIONS = [normalizer, normalized_losses, log_ratios, log_spread, preference_uniformity, adjustment,
                  chebyshev, bottleneck_set]


@pytest.mark.parametrize("fn", _ROW_FUNCTIONS, ids=lambda f: f.__name__)
def test_a_batch_is_its_rows(fn):
    """Every function of a (4, 5, m) batch equals the function of each row, bit for bit: no reduction runs over a
    batch axis. Rows of very different spreads (1e-13 .. 3) so that batch-wide reductions would show."""
    rng = np.random.default_rng(21)
    m = 4
    lam = check_preferences(0.9 * rng.dirichlet(np.ones(m), size=(4, 5)) + 0.1 / m)
    spread = 10.0 ** rng.uniform(-13, 0.5, size=(4, 5, 1))
    l = np.exp(spread * rng.uniform(-1, 1, (4, 5, m))) / lam * 10.0 ** rng.uniform(-5, 5, (4, 5, 1))
    out = fn(l, lam)
    for i in range(4):
        for j in range(5):
            np.testing.assert_array_equal(out[i, j], fn(l[i, j], lam[i, j]))


def test_validate_false_computes_in_float64_on_the_values_given():
    """``validate=False`` skips the checks, not the conversion: float32 inputs are computed in float64."""
    rng = np.random.default_rng(22)
    l, lam = random_instance(rng, 5, (50,))
    l32, lam32 = l.astype(np.float32), lam.astype(np.float32)
    for fn in _ROW_FUNCTIONS:
        np.testing.assert_array_equal(fn(l32, lam32, validate=False),
                                      fn(l32.astype(np.float64), lam32.astype(np.float64), validate=False))
    np.testing.assert_array_equal(ray_point(np.float32(0.3), lam32, validate=False),
                                  np.float64(np.float32(0.3)) / lam32.astype(np.float64))


def test_validate_false_converts_object_arrays():
    """Numbers numpy keeps as objects (Python integers beyond int64, mpmath numbers) are converted to float64 with
    or without validation, for losses and preferences alike."""
    import mpmath as mp

    l_obj, lam_obj = [10**20, 3 * 10**19, 10**19], [mp.mpf(1) / 5, mp.mpf(3) / 10, mp.mpf(1) / 2]
    l, lam = np.array([1e20, 3e19, 1e19]), np.array([0.2, 0.3, 0.5])
    for fn in _ROW_FUNCTIONS:
        want = fn(l, lam)
        np.testing.assert_array_equal(fn(l_obj, lam, validate=False), want)
        np.testing.assert_array_equal(fn(l, lam_obj, validate=False), want)
        np.testing.assert_array_equal(fn(l_obj, lam_obj), want)


def test_resolutions_follow_their_stated_formulas():
    """PreferenceParts.beta_resolution and adjustment_resolution, recomputed from their docstring formulas (rtol
    1e-12): ``TIE_RTOL·Σ_k ĺ_k |x_k - β| + 8mε·β`` and ``λ_j (2·TIE_RTOL((1 - ĺ_j) + Σ_k ĺ_k |y_j - y_k|) +
    4mε Σ_{k≠j} ĺ_k (|y_j| + |y_k| + |y_j - y_k|))``. The data have l_j in [1/2, 1) and λ_0 >= 1/2, so the per-row
    power-of-two shift of the logarithms is 0 and ``y_j = log(λ_j l_j)``; one instance alone and a (7, 3) batch."""
    rng = np.random.default_rng(23)
    m = 4
    lam = rng.dirichlet(np.ones(m), size=(7, 3))
    lam[..., 0] = 0.5 + 0.4 * rng.uniform(size=(7, 3))
    lam[..., 1:] *= (1.0 - lam[..., :1]) / lam[..., 1:].sum(axis=-1, keepdims=True)
    l = rng.uniform(0.5, 1.0, size=(7, 3, m))
    y = np.log(lam * l)
    lhat = lam * l / (lam * l).sum(axis=-1, keepdims=True)
    x = np.log(m * lhat)
    beta = (lhat * x).sum(axis=-1)
    res_beta = TIE_RTOL * (lhat * np.abs(x - beta[..., None])).sum(axis=-1) + 8 * m * EPS * beta
    P = y[..., :, None] - y[..., None, :]
    off = 1.0 - np.eye(m)
    rnd = ((np.abs(y)[..., :, None] + np.abs(y)[..., None, :] + np.abs(P)) * off * lhat[..., None, :]).sum(axis=-1)
    res_A = lam * (2 * TIE_RTOL * ((1.0 - lhat) + (np.abs(P) * lhat[..., None, :]).sum(axis=-1))
                   + 4 * m * EPS * rnd)
    for idx in ((0, 0), (6, 2), Ellipsis):  # single instances (1-D inputs) and the whole batch
        parts = preference_parts(l[idx], lam[idx])
        np.testing.assert_allclose(parts.beta_resolution, res_beta[idx], rtol=1e-12, atol=0)
        np.testing.assert_allclose(parts.adjustment_resolution, res_A[idx], rtol=1e-12, atol=0)


def test_resolutions_bound_the_change_under_perturbations_at_the_resolution():
    """What the resolutions are for: relative perturbations of the weighted losses of size TIE_RTOL change β and A
    by at most their resolution, up to the roundoff of computing β twice (2ε(β + √β + spread), the module's error
    bound); the worst sign pattern for β reaches at least half of it: the bound is not loose."""
    rng = np.random.default_rng(24)
    for m in (2, 3, 6):
        l, lam = random_instance(rng, m, (300,))
        parts = preference_parts(l, lam)
        roundoff = 2 * EPS * (parts.beta + np.sqrt(parts.beta) + parts.spread)
        for _ in range(5):
            lp = l * (1.0 + TIE_RTOL * rng.choice([-1.0, 1.0], size=l.shape))
            beta, A = uniformity_and_adjustment(lp, lam)
            assert np.all(np.abs(beta - parts.beta) <= parts.beta_resolution + roundoff)
            assert np.all(np.abs(A - parts.adjustment) <= parts.adjustment_resolution)
        worst = l * (1.0 + TIE_RTOL * np.sign(parts.lhat * (parts.x - parts.beta[:, None])))
        change = np.abs(preference_uniformity(worst, lam) - parts.beta)
        assert np.all(change >= 0.5 * parts.beta_resolution)


@pytest.mark.parametrize(
    "tol, expected",
    [
        (0.0, [True, False, False, False]),
        (0.04, [True, False, False, False]),
        (0.06, [True, True, False, False]),
        (0.55, [True, True, True, False]),
        (0.9, [True, True, True, True]),
        (1.0, [True, True, True, True]),
        (3, [True, True, True, True]),
    ],
)
def test_bottleneck_set_tolerance_golden(tol, expected):
    """J* = {j : λ_j l_j >= ψ - tol·ψ} with weighted losses (1, 0.95, 0.5, 0.2)·1/4."""
    lam = np.full(4, 0.25)
    l = np.array([1.0, 0.95, 0.5, 0.2])
    np.testing.assert_array_equal(bottleneck_set(l, lam, tol=tol), expected)
    if tol == 0.0:
        np.testing.assert_array_equal(bottleneck_set(l, lam), expected)  # the default is exact maximisers


def test_bottleneck_ties_within_the_resolution():
    lam = np.array([0.5, 0.5])
    assert bottleneck_set([1.0, 1.0 - 0.5 * TIE_RTOL], lam).tolist() == [True, True]
    assert bottleneck_set([1.0 - 0.5 * TIE_RTOL, 1.0], lam).tolist() == [True, True]
    assert bottleneck_set([1.0, 1.0 - 5.0 * TIE_RTOL], lam).tolist() == [True, False]


def test_jstar_log_tolerance_values_and_dtype():
    """``-log(1 - tol)`` widened to TIE_RTOL, ``inf`` from tol = 1, elementwise, always float64."""
    out = jstar_log_tolerance([0.0, 1e-15, 0.1, 0.5, 1.0, 2.0])
    np.testing.assert_allclose(out, [TIE_RTOL, TIE_RTOL, -np.log(0.9), np.log(2.0), np.inf, np.inf], rtol=1e-15)
    for tol in (np.float32(0.1), np.float16(0.25), 0, 1):
        t = jstar_log_tolerance(tol)
        assert t.dtype == np.float64
        want = -np.log1p(-float(tol)) if float(tol) < 1 else np.inf
        assert float(t) == max(want, TIE_RTOL)


def test_scalar_and_empty_inputs_are_refused_naming_the_shape():
    with pytest.raises(ValueError, match=names(r"\blosses\b", "at least 1 dimension", r"\(\)")):
        preference_uniformity(2.0, [1.0])
    with pytest.raises(ValueError, match=names(r"\bgram\b", "at least 2 dimension", r"\(3,\)")):
        check_gram(np.ones(3))
    with pytest.raises(ValueError, match=names(r"\blosses\b", "empty objective axis", r"\(3, 0\)")):
        preference_uniformity(np.ones((3, 0)), np.ones((3, 0)))
    with pytest.raises(ValueError, match=names(r"\bprefs\b", "empty objective axis", r"\(2, 0\)")):
        check_preferences(np.ones((2, 0)))


def _grams(rng, n, m, scale=1.0):
    G = rng.normal(size=(n, m + 2, m)) * scale
    C = np.swapaxes(G, -1, -2) @ G
    return 0.5 * (C + np.swapaxes(C, -1, -2))


def test_check_gram_on_batches_names_the_instance():
    """A batch (N = 5 instances of m = 3) passes unchanged; one asymmetric or one indefinite instance is named."""
    rng = np.random.default_rng(25)
    C = _grams(rng, 5, 3)
    np.testing.assert_array_equal(check_gram(C), C)
    np.testing.assert_array_equal(check_gram(C.reshape(5, 1, 3, 3)), C.reshape(5, 1, 3, 3))
    bad = C.copy()
    bad[2, 0, 1] += 1e-3
    with pytest.raises(ValueError, match=names(r"\bgram\b", "symmetric", r"\(2,\)", r"1\.000e-03")):
        check_gram(bad)
    bad = C.copy()
    bad[3] = [[1.0, 2.0, 0.0], [2.0, 1.0, 0.0], [0.0, 0.0, 1.0]]
    with pytest.raises(ValueError, match=names(r"\bgram\b", "positive semi-definite", r"\(3,\)", r"-1\.000e\+00")):
        check_gram(bad)


def test_check_gram_on_two_batch_axes_has_a_tolerance_per_instance():
    """Two leading axes (2 × 4 instances of m = 3): the batch passes unchanged; the semi-definiteness tolerance is each
    instance's own (1e-10·max(1, ‖C‖_∞)): an instance of scale 1e8 with an eigenvalue of -1e-4 passes among unit-scale
    ones, and an indefinite unit-scale instance is named by both indices."""
    rng = np.random.default_rng(27)
    C = _grams(rng, 8, 3).reshape(2, 4, 3, 3)
    C /= np.abs(C).max(axis=(-2, -1), keepdims=True)
    w, V = np.linalg.eigh(C[1, 2])
    w[0] = -1e-4 / 1e8
    C[1, 2] = 1e8 * (V * w) @ V.T
    C[1, 2] = 0.5 * (C[1, 2] + C[1, 2].T)
    np.testing.assert_array_equal(check_gram(C), C)
    bad = C.copy()
    w, V = np.linalg.eigh(C[0, 3])
    w[0] = -1e-8
    bad[0, 3] = (V * w) @ V.T
    bad[0, 3] = 0.5 * (bad[0, 3] + bad[0, 3].T)
    with pytest.raises(ValueError, match=names(r"\bgram\b", "positive semi-definite", r"\(0, 3\)", r"-1\.000e-08")):
        check_gram(bad)


def test_check_gram_tolerances_scale_with_the_matrix():
    """Symmetry within 1e-10·max(1, max|C|) and λ_min >= -1e-10·max(1, ‖C‖_∞): a Gram matrix of scale 1e8 with
    a relative asymmetry of 1e-13 and an eigenvalue of -1e-4 (roundoff at that scale) passes; at scale 1 an
    asymmetry of 1e-9 or an eigenvalue of -1e-8 does not."""
    rng = np.random.default_rng(26)
    C = _grams(rng, 1, 3)[0]
    C /= np.abs(C).max()  # max|C| = 1: tolerances 1e-10 (symmetry) and <= 3e-10 (eigenvalues)
    big = 1e8 * C
    big[0, 1] *= 1.0 + 1e-13
    check_gram(big)
    w, V = np.linalg.eigh(C)
    w[0] = -1e-4 / 1e8
    check_gram(1e8 * (V * w) @ V.T)
    asym = C.copy()
    asym[0, 1] += 1e-9
    with pytest.raises(ValueError, match=names(r"\bgram\b", "symmetric")):
        check_gram(asym)
    w[0] = -1e-8
    with pytest.raises(ValueError, match=names(r"\bgram\b", "positive semi-definite", r"-1\.000e-08")):
        check_gram((V * w) @ V.T)


def test_check_shapes_with_batched_gram():
    rng = np.random.default_rng(27)
    l, lam = random_instance(rng, 3, (4,))
    check_shapes(l, lam, _grams(rng, 4, 3))
    check_shapes(l, lam, np.eye(3))  # one Gram matrix for the whole batch
    with pytest.raises(ValueError, match=names(r"\bgram\b", r"batch shape \(5,\)", r"\(4,\)")):
        check_shapes(l, lam, _grams(rng, 5, 3))
    with pytest.raises(ValueError, match=names(r"\bgram\b", r"\(\.\.\., 3, 3\)", r"\(4, 2, 2\)")):
        check_shapes(l, lam, _grams(rng, 4, 2))
    with pytest.raises(ValueError, match=names(r"\blosses shape \(4, 3\)", r"prefs shape \(2, 3\)", "broadcast")):
        check_shapes(l, lam[:2])


def test_single_instance_losses_with_a_gram_are_checked():
    """1-D losses (one instance) with a Gram of the wrong size are refused; the right size passes."""
    check_shapes(np.ones(3), np.full(3, 1 / 3), np.eye(3))
    with pytest.raises(ValueError, match=re.escape("gram must have shape (..., 3, 3) to match losses; got (2, 2)")):
        check_shapes(np.ones(3), np.full(3, 1 / 3), np.eye(2))


def test_a_gram_at_exactly_the_semi_definiteness_tolerance_is_accepted():
    """The tolerance is inclusive: smallest eigenvalue exactly -δ (δ = GRAM_RTOL·max(1, ‖C‖_∞) = 1e-10 here) passes,
    a little below it is refused."""
    check_gram(np.diag([1.0, -1e-10]))
    with pytest.raises(ValueError, match="positive semi-definite"):
        check_gram(np.diag([1.0, -1.0000001e-10]))


def test_the_error_for_one_bad_row_prints_that_row_only():
    """A batch with one preference row off the simplex: the message names and prints that row, not the batch."""
    lam = np.full((3, 2), 0.5)
    lam[1] = [0.5, 0.6]
    with pytest.raises(ValueError) as info:
        check_preferences(lam)
    msg = str(info.value)
    assert "row (1,) = [0.5, 0.6] sums to 1.1" in msg and msg.count("0.5") == 1, msg


def test_ray_point_overflow_names_the_entry_without_a_warning():
    """An overflow of ψ/λ is an error naming the entry, not an inf with a RuntimeWarning (warnings are errors here)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=names("ray_point overflows", r"index \(1, 0\)", r"psi = 1e\+308",
                                                   r"prefs entry 0\.001")):
            ray_point([1.0, 1e308], [0.001, 0.999])


def test_preference_dtype_tolerance_and_renormalisation():
    """Rows must sum to 1 within max(SIMPLEX_ATOL, 2·m·ε_dtype) of the input dtype; accepted rows come back as
    float64 λ/Σλ."""
    from sim.preference import SIMPLEX_ATOL, simplex_tolerance

    assert simplex_tolerance(np.float64, 3) == SIMPLEX_ATOL == 1e-9
    assert simplex_tolerance(np.float32, 3) == 6 * float(np.finfo(np.float32).eps)
    assert simplex_tolerance(np.float16, 2) == 4 * float(np.finfo(np.float16).eps)
    assert simplex_tolerance(np.int64, 3) == simplex_tolerance(np.dtype(object), 50) == SIMPLEX_ATOL
    assert simplex_tolerance(np.float64, 10**8) == 2e8 * EPS  # many objectives: m·ε beats 1e-9
    lam32 = np.array([[0.2, 0.3, 0.5], [0.1, 0.1, 0.8]], dtype=np.float32)
    out = check_preferences(lam32)
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, lam32.astype(np.float64) / lam32.astype(np.float64).sum(axis=1, keepdims=True))
    near = np.array([0.2, 0.3, 0.5 + 5e-10])  # within 1e-9: accepted, renormalised
    np.testing.assert_array_equal(check_preferences(near), near / near.sum())
    with pytest.raises(ValueError, match=names(r"\bprefs\b", r"tolerance 7\.2e-07 for float32", r"row \(1,\)")):
        check_preferences(np.array([[0.2, 0.3, 0.5], [0.2, 0.31, 0.5]], dtype=np.float32))
    with pytest.raises(ValueError, match=names(r"\bweights\b", r"tolerance 1\.0e-09 for float64", "sums to 1.000000002")):
        check_preferences([0.2, 0.3, 0.5 + 2e-9], name="weights")


@pytest.mark.parametrize(
    "value, pattern",
    [
        (np.array([1.0 + 1j, 2.0]), names(r"\bvals\b", "must be real", "complex")),
        (np.array([True, False]), names(r"\bvals\b", "not booleans")),
        (["a", "b"], names(r"\bvals\b", "numeric array", "'a'")),
        ([[1.0, 2.0], [3.0]], names(r"\bvals\b", "numeric array")),
    ],
)
def test_non_real_inputs_are_refused_naming_the_argument(value, pattern):
    with pytest.raises(ValueError, match=pattern):
        check_losses(value, name="vals")
    with pytest.raises(ValueError, match=pattern):
        check_preferences(value, name="vals")


@pytest.mark.parametrize("tol", [-0.1, float("nan"), "0.1x", None])
def test_bottleneck_set_refuses_a_bad_tolerance(tol):
    with pytest.raises(ValueError, match=names(r"\btol\b", ">= 0", re.escape(repr(tol)))):
        bottleneck_set(GOLD_L, GOLD_LAM, tol=tol)


def test_centring_of_the_logarithms_does_not_change_the_values():
    """Spreads just below and above the switch from mean- to max-centred logarithms (50 in log units), and far
    beyond it (1500: e^d would overflow if centred on the mean): β and ĺ against 60-digit arithmetic, ĺ to 1e-13
    relative in every entry (computed as 1 + expm1(d), an entry of 1.7e-22 came out as 0 at spread 50.1, and one of
    1.3e-11 with a relative error of 3e-6)."""
    import mpmath as mp

    lam = np.array([0.25, 0.25, 0.5])
    for spread in (49.9, 50.1, 700.0, 1500.0):
        l = np.array([np.exp(spread / 2) if spread < 1400 else 1e300, 1.0, 1.0]) / lam
        l[1] = l[0] * np.exp(-spread) if spread < 1400 else 1e-300 / lam[1]
        w = [mp.mpf(float(a)) * mp.mpf(float(b)) for a, b in zip(l, lam, strict=True)]
        with mp.workdps(60):
            Z = mp.fsum(w)
            lhat = [x / Z for x in w]
            beta = float(mp.fsum(p * mp.log(3 * p) for p in lhat))
            lhat = np.array([float(p) for p in lhat])
        b, A = uniformity_and_adjustment(l, lam)
        assert b == pytest.approx(beta, rel=1e-14)
        np.testing.assert_allclose(normalized_losses(l, lam), lhat, rtol=1e-13, atol=1e-300)
        assert np.all(np.isfinite(A)) and abs(A @ (l / l.max())) <= 1e-13 * np.abs(A).max()


def test_bottleneck_from_log_ratios_takes_array_likes_and_includes_the_band_edge():
    """x_j >= max x - t: an entry exactly at the edge of the band (t = TIE_RTOL for tol = 0) is in J*; lists work."""
    from sim.preference import bottleneck_from_log_ratios

    assert bottleneck_from_log_ratios([0.0, -TIE_RTOL, -2 * TIE_RTOL]).tolist() == [True, True, False]
    assert bottleneck_from_log_ratios([[1.0, 0.5], [0.0, 0.0]], tol=[0.0, 0.0]).tolist() == [[True, False],
                                                                                           [True, True]]


def test_check_gram_proves_a_singular_gram_without_an_eigendecomposition(monkeypatch):
    """The documented fast path: a PSD Gram, even a singular one (collinear gradients, the common case of a
    bottleneck), is proved by one Cholesky factorisation of C + δI; the eigenvalues are computed only when that
    fails. A shifted factorisation that could not prove a singular Gram (C - δI) would fall through to eigvalsh."""
    g = np.array([[1.0, -2.0, 0.5], [0.3, 0.1, -1.0]])
    C = np.stack([g.T @ g, np.outer(g[0], g[0]), np.zeros((3, 3))])
    assert np.linalg.eigvalsh(C)[:, 0].max() < 1e-12  # singular: the smallest eigenvalue is 0 up to round-off

    def eigvalsh(*args, **kwargs):
        raise AssertionError("check_gram computed eigenvalues of a Gram its Cholesky test should prove")

    monkeypatch.setattr(np.linalg, "eigvalsh", eigvalsh)
    np.testing.assert_array_equal(check_gram(C), C)
