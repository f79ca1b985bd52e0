"""Tests of sim.hull: near-active set, exact minimum-norm hull element, H.19 descent margin."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import minimize

import sim.hull as hull
from sim.hull import (
    ENUMERATION_MAX_K,
    descent_margin,
    descent_margin_from_gram,
    eps_act,
    min_norm_element,
    min_norm_weights_from_gram,
    near_active_set,
)
from tests.error_patterns import float_value, names


def _random_hull(rng, n, k):
    """Random generators with a random common offset, so the origin is sometimes inside, sometimes not."""
    return rng.standard_normal((n, k)) + rng.uniform(0.0, 2.0) * rng.standard_normal((n, 1))


def _slsqp_min_norm(V):
    """Independent QP: min ‖Vu‖² s.t. u ≥ 0, 1ᵀu = 1 (SLSQP)."""
    k = V.shape[1]
    K = V.T @ V
    res = minimize(lambda u: u @ K @ u, np.full(k, 1.0 / k), jac=lambda u: 2 * K @ u, method="SLSQP",
                   bounds=[(0.0, None)] * k,
                   constraints=[{"type": "eq", "fun": lambda u: u.sum() - 1.0, "jac": lambda u: np.ones(k)}],
                   options={"ftol": 1e-16, "maxiter": 1000})
    return V @ res.x


def test_two_generators_closed_form():
    """m = 2: d_M = θv1 + (1-θ)v2 with θ = clip((v2-v1)ᵀv2/‖v1-v2‖², 0, 1) (docs/spec/identities.md#s18)."""
    rng = np.random.default_rng(0)
    for n in (1, 2, 3, 6):
        V = rng.standard_normal((400, n, 2)) * rng.uniform(0.1, 3.0, (400, 1, 2))
        v1, v2 = V[..., 0], V[..., 1]
        theta = np.clip(np.einsum("bn,bn->b", v2 - v1, v2) / np.einsum("bn,bn->b", v1 - v2, v1 - v2), 0, 1)
        expected = theta[:, None] * v1 + (1 - theta[:, None]) * v2
        res = min_norm_element(V)
        np.testing.assert_allclose(res.point, expected, atol=1e-12, rtol=0)


@pytest.mark.parametrize("method", ["auto", "wolfe"])
@pytest.mark.parametrize("n,k", [(1, 3), (2, 2), (2, 5), (3, 4), (5, 8), (4, 10), (6, 12), (2, 11)])
def test_min_norm_matches_independent_qp(method, n, k):
    rng = np.random.default_rng(100 * n + k)
    for _ in range(15):
        V = _random_hull(rng, n, k)
        res = min_norm_element(V, method=method)
        p_ref = _slsqp_min_norm(V)
        assert res.norm <= np.linalg.norm(p_ref) + 1e-12
        np.testing.assert_allclose(res.point, p_ref, atol=1e-6)
        assert res.kkt_residual <= 1e-12 * max(1.0, np.abs(V).max() ** 2)


def test_kkt_property_on_random_hulls():
    """v_jᵀd_M ≥ ‖d_M‖² for every generator; weights on the simplex and zero outside the mask."""
    rng = np.random.default_rng(1)
    for k in range(1, ENUMERATION_MAX_K + 1):
        n = int(rng.integers(1, 7))
        V = rng.standard_normal((300, n, k)) + rng.uniform(0, 2, (300, 1, 1)) * rng.standard_normal((300, n, 1))
        mask = rng.random((300, k)) < 0.7
        mask[:, 0] = True
        res = min_norm_element(V, mask)
        p = res.point
        pp = np.einsum("bn,bn->b", p, p)
        vp = np.einsum("bnk,bn->bk", V, p)
        scale = np.einsum("bnk,bnk->bk", V, V).max(axis=1)
        assert np.all(np.where(mask, vp - pp[:, None], 0.0) >= -1e-12 * scale[:, None])
        np.testing.assert_allclose(
            res.kkt_residual, np.maximum(np.where(mask, pp[:, None] - vp, -np.inf).max(1), 0), atol=1e-13
        )
        assert np.all(res.weights >= 0) and np.all(res.weights[~mask] == 0)
        np.testing.assert_allclose(res.weights.sum(axis=-1), 1.0, atol=1e-14)
        np.testing.assert_allclose(np.einsum("bnk,bk->bn", V, res.weights), p, atol=1e-14)


def test_batched_equals_single_and_mask_equals_subset():
    rng = np.random.default_rng(2)
    V = rng.standard_normal((2, 3, 3, 6))
    mask = rng.random((2, 3, 6)) < 0.6
    mask[..., 2] = True
    res = min_norm_element(V, mask)
    assert res.point.shape == (2, 3, 3) and res.weights.shape == (2, 3, 6) and res.norm.shape == (2, 3)
    for a in range(2):
        for b in range(3):
            sub = min_norm_element(V[a, b][:, mask[a, b]])
            np.testing.assert_allclose(res.point[a, b], sub.point, atol=1e-13)
            np.testing.assert_allclose(res.weights[a, b][mask[a, b]], sub.weights, atol=1e-12)


def test_wolfe_agrees_with_enumeration():
    rng = np.random.default_rng(3)
    for _ in range(100):
        n, k = int(rng.integers(1, 6)), int(rng.integers(1, 9))
        V = _random_hull(rng, n, k)
        a, b = min_norm_element(V, method="enumerate"), min_norm_element(V, method="wolfe")
        np.testing.assert_allclose(a.point, b.point, atol=1e-10)


def test_wolfe_drops_a_generator_whose_affine_weight_is_zero():
    """v3 = (-1, 0) is the shortest generator and Wolfe's start; v1 = (2, -2) and then v2 = (-2, 2) enter, and the
    affine minimiser of the three (the origin, the midpoint of v1 and v2) gives v3 the weight 0 exactly. A corral
    keeps only strictly positive weights: v3 leaves and the weights are renormalised, so Wolfe's result is the
    enumeration's, (0.5, 0.5, 0) bit for bit, without a negative zero."""
    V = np.array([[2.0, -2.0, -1.0], [-2.0, 2.0, 0.0]])
    u = min_norm_element(V, method="wolfe").weights
    np.testing.assert_array_equal(u, min_norm_element(V, method="enumerate").weights)
    np.testing.assert_array_equal(u, [0.5, 0.5, 0.0])
    assert not np.signbit(u).any()


def test_gram_version_matches_vector_version():
    rng = np.random.default_rng(4)
    V = rng.standard_normal((500, 5, 7))
    C = np.swapaxes(V, -1, -2) @ V
    u = min_norm_weights_from_gram(C)
    assert np.all(u >= 0)
    np.testing.assert_allclose(u.sum(-1), 1.0, atol=1e-14)
    np.testing.assert_allclose(np.einsum("bnk,bk->bn", V, u), min_norm_element(V).point, atol=1e-10)
    # k > 8 (Wolfe) from the Gram matrix only
    V = rng.standard_normal((3, 10)) + 0.5
    u = min_norm_weights_from_gram(V.T @ V)
    np.testing.assert_allclose(V @ u, _slsqp_min_norm(V), atol=1e-6)


@pytest.mark.parametrize(
    "V,expected_norm",
    [
        (np.array([[1.0, -1.0]]), 0.0),  # F5 hull conv{1/2·1, 1/2·(-1)} up to scaling: 0 inside
        (np.array([[0.5, -0.5]]), 0.0),
        (np.array([[1.0, 1.0], [2.0, 2.0]]), np.sqrt(5.0)),  # duplicated generator (singular KKT systems)
        (np.zeros((3, 4)), 0.0),  # all zero
        (np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]]), 1.0),  # collinear, origin outside
        (np.array([[1.0, 0.0, -1.0, 0.0], [0.0, 1.0, 0.0, -1.0]]), 0.0),  # affinely dependent, origin inside
    ],
)
@pytest.mark.parametrize("method", ["enumerate", "wolfe"])
def test_degenerate_hulls(V, expected_norm, method):
    res = min_norm_element(V, method=method)
    assert res.norm == pytest.approx(expected_norm, abs=1e-14)
    assert res.kkt_residual <= 1e-14
    # the same hull with every generator repeated (k > 8 for Wolfe's method in the auto path)
    VV = np.concatenate([V, V, V], axis=1)
    assert min_norm_element(VV).norm == pytest.approx(expected_norm, abs=1e-14)


def test_near_active_set():
    rng = np.random.default_rng(5)
    l = rng.uniform(0.2, 2.0, (200, 4))
    lam = 0.95 * rng.dirichlet(np.ones(4), 200) + 0.05 / 4
    wl = lam * l
    J0 = near_active_set(l, lam, 0.0)
    np.testing.assert_array_equal(J0, wl == wl.max(-1, keepdims=True))
    eps = rng.uniform(0, 0.3, 200)
    J = near_active_set(l, lam, eps)
    np.testing.assert_array_equal(J, wl >= wl.max(-1, keepdims=True) - eps[:, None])
    assert np.all(J >= J0)
    assert np.all(near_active_set(l, lam, 10.0))
    # F5 (docs/spec/identities.md#s21): J*_ε = {1,2} iff |w| ≤ ε_act
    for w in (0.05, -0.05, 0.2):
        mask = near_active_set(np.array([1 + w, 1 - w]), np.array([0.5, 0.5]), 0.1)
        assert mask.all() == (abs(w) <= 0.1)


def test_eps_act():
    lam = np.array([[0.2, 0.5, 0.3], [0.6, 0.2, 0.2]])
    np.testing.assert_allclose(eps_act(0.1, lam, 2.0), 2 * 0.1 * np.array([0.5, 0.6]) * 4.0)
    assert eps_act(0.3, [0.5, 0.5], 1.0) == pytest.approx(0.3)  # F5: ε_act = η


def test_descent_margin():
    rng = np.random.default_rng(6)
    G = rng.standard_normal((50, 3, 4))
    d = rng.standard_normal((50, 3))
    lam = 0.95 * rng.dirichlet(np.ones(4), 50) + 0.05 / 4
    mask = rng.random((50, 4)) < 0.5
    mask[:, 1] = True
    m = descent_margin(d, G, lam, mask)
    brute = [min(lam[b, j] * d[b] @ G[b, :, j] for j in range(4) if mask[b, j]) for b in range(50)]
    np.testing.assert_allclose(m, brute, rtol=1e-14)
    # F5 at 0 < w < η: d ≈ w, margin over J*_ε = {1,2} is -d/2 < 0
    w = 0.01
    assert descent_margin(np.array([w]), np.array([[1.0, -1.0]]), np.array([0.5, 0.5]), np.array([True, True])) == pytest.approx(-w / 2)


def test_empty_batch_gives_empty_results():
    """A batch of zero hulls is not an error: every result has the batch axis of length 0."""
    for method in ("auto", "enumerate", "wolfe"):
        res = min_norm_element(np.zeros((0, 3, 4)), method=method)
        assert res.point.shape == (0, 3) and res.weights.shape == (0, 4)
        assert res.norm.shape == (0,) and res.kkt_residual.shape == (0,)
        res = min_norm_element(np.zeros((2, 0, 3, 4)), np.ones((2, 0, 4), dtype=bool), method=method)
        assert res.point.shape == (2, 0, 3) and res.weights.shape == (2, 0, 4)
        assert min_norm_weights_from_gram(np.zeros((0, 4, 4)), method=method).shape == (0, 4)
    assert descent_margin(np.zeros((0, 3)), np.zeros((0, 3, 2)), np.full((0, 2), 0.5), np.ones((0, 2), bool)).shape == (0,)


@pytest.mark.parametrize("method", ["enumerate", "wolfe"])
def test_singular_kkt_systems_in_a_mixed_batch(method):
    """A duplicated generator makes some KKT systems singular: the batched solve falls back to one instance at a
    time, the singular supports drop out, and every instance equals its own single solution and the QP reference;
    the weight of an exactly duplicated minimiser goes to its first copy."""
    rng = np.random.default_rng(12)
    V = rng.standard_normal((40, 3, 4)) + rng.uniform(0, 2, (40, 1, 1)) * rng.standard_normal((40, 3, 1))
    V[1, :, 2] = V[1, :, 0]  # instances 1 and 3 have a duplicated generator
    V[3] = np.array([[1.0, 1.0, 3.0, 1.0], [2.0, 2.0, 1.0, 2.0], [0.0, 0.0, 2.0, 0.0]])
    res = min_norm_element(V, method=method)
    assert np.all(np.isfinite(res.weights)) and np.all(np.isfinite(res.point))
    # the regular instances whose minimiser uses generators 0 and 2 together share those singular stacks
    assert np.sum((res.weights[:, 0] > 0) & (res.weights[:, 2] > 0)) >= 3
    for b in range(40):
        single = min_norm_element(V[b], method=method)
        np.testing.assert_allclose(res.point[b], single.point, atol=1e-13)
        np.testing.assert_allclose(res.weights[b], single.weights, atol=1e-12)
        np.testing.assert_allclose(res.point[b], _slsqp_min_norm(V[b]), atol=1e-6)
    np.testing.assert_allclose(res.weights[3], [1.0, 0.0, 0.0, 0.0], atol=1e-12)
    np.testing.assert_array_equal(min_norm_element(np.array([[1.0, 1.0], [2.0, 2.0]]), method=method).weights, [1, 0])


def test_one_empty_mask_in_a_batch_is_named():
    V = np.random.default_rng(3).standard_normal((2, 3, 2, 4))
    mask = np.ones((2, 3, 4), dtype=bool)
    mask[1, 2] = False
    with pytest.raises(ValueError, match=names(r"\bmask\b", r"instance \(1, 2\)", "empty")):
        min_norm_element(V, mask)
    with pytest.raises(ValueError, match=names(r"\bmask\b", r"instance \(1, 2\)", "empty")):
        min_norm_weights_from_gram(np.swapaxes(V, -1, -2) @ V, mask)
    with pytest.raises(ValueError, match=names(r"\bmask\b", r"instance \(1, 2\)")):
        descent_margin(np.ones((2, 3, 2)), V, np.full(4, 0.25), mask)
    mask[1, 2], mask[0, 1], mask[1, 0] = True, False, False  # two empty instances: the first is named
    with pytest.raises(ValueError, match=names(r"\bmask\b", r"instance \(0, 1\)")):
        min_norm_element(V, mask)


def test_one_bad_entry_in_a_good_batch_raises():
    lam = np.array([[0.2, 0.5, 0.3], [0.6, 0.2, 0.2]])
    np.testing.assert_array_equal(eps_act(0.0, lam, 2.0), [0.0, 0.0])  # eta = 0 and B = 0 are allowed
    np.testing.assert_array_equal(eps_act([0.1, 0.2], lam, 0.0), [0.0, 0.0])
    for eta, B, name in (([0.1, np.nan], 1.0, "eta"), ([0.1, -0.1], 1.0, "eta"), (0.1, [1.0, np.inf], "B"),
                         (0.1, [1.0, -2.0], "B")):
        with pytest.raises(ValueError, match=names(rf"\b{name}\b", r">= 0")):
            eps_act(eta, lam, B)
    l = np.ones((3, 2))
    for eps in ([0.1, -0.1, 0.1], [0.1, np.nan, 0.1]):
        with pytest.raises(ValueError, match=names(r"\beps_act\b", r"-0\.1|nan")):
            near_active_set(l, np.full(2, 0.5), eps)
    d, G = np.ones((3, 2)), np.ones((3, 2, 2))
    bad_d, bad_G = d.copy(), G.copy()
    bad_d[1, 0] = np.nan
    bad_G[2, 1, 1] = np.inf
    for args in ((bad_d, G), (d, bad_G)):
        with pytest.raises(ValueError, match=names(r"\bd\b", r"\bgrads\b", "finite")):
            descent_margin(*args, np.full(2, 0.5), np.ones(2, dtype=bool))


@pytest.mark.parametrize("n,k", [(2, 20), (3, 30), (5, 40)])
def test_wolfe_with_many_generators_in_low_dimension(n, k):
    """Many generators in few dimensions make Wolfe's minor cycles (a generator leaves the corral) frequent: the
    result must carry the optimality certificate v_jᵀd_M ≥ ‖d_M‖², lie on the simplex, and (n = 2) equal the
    enumeration over supports of at most n + 1 generators."""
    rng = np.random.default_rng(n * k)
    V = rng.standard_normal((25, n, k)) + rng.uniform(0, 2, (25, 1, 1)) * rng.standard_normal((25, n, 1))
    res = min_norm_element(V, method="wolfe")
    scale = np.einsum("bnk,bnk->bk", V, V).max(axis=1)
    assert np.all(res.kkt_residual <= 1e-12 * scale)
    assert np.all(res.weights >= 0)
    np.testing.assert_allclose(res.weights.sum(axis=-1), 1.0, atol=1e-14)
    np.testing.assert_allclose(np.einsum("bnk,bk->bn", V, res.weights), res.point, atol=1e-13)
    if n == 2:
        np.testing.assert_allclose(res.point, min_norm_element(V, method="enumerate").point, atol=1e-12)


def test_results_are_frozen_and_compared_by_identity():
    res = min_norm_element(np.eye(2))
    with pytest.raises(AttributeError):
        res.norm = 0.0
    assert res in {res}


def test_auto_dispatches_by_the_number_of_generators():
    """``auto``: enumeration for k <= 8, Wolfe above, bit for bit (the two differ in rounding)."""
    assert ENUMERATION_MAX_K == 8
    rng = np.random.default_rng(5)
    for k, same in ((8, "enumerate"), (9, "wolfe")):
        V = rng.standard_normal((50, 3, k)) + rng.standard_normal((50, 3, 1))
        auto = min_norm_element(V).point
        other = "wolfe" if same == "enumerate" else "enumerate"
        np.testing.assert_array_equal(auto, min_norm_element(V, method=same).point)
        assert np.any(auto != min_norm_element(V, method=other).point)  # the check can tell them apart
        C = np.swapaxes(V, -1, -2) @ V
        np.testing.assert_array_equal(min_norm_weights_from_gram(C), min_norm_weights_from_gram(C, method=same))


@pytest.mark.parametrize("method", ["enumerate", "wolfe"])
def test_a_tiny_positive_weight_is_kept(method):
    """Two generators whose minimum-norm point has θ = 1e-11 on v1 (closed form of S18): a support is accepted
    with any non-negative weight, so the point is not snapped to the vertex v2 (an error of 1e-7 relative)."""
    V = np.array([[1.0, 0.0], [1e-4 - 1e-7, 1e-4]])
    v1, v2 = V[:, 0], V[:, 1]
    theta = (v2 - v1) @ v2 / ((v1 - v2) @ (v1 - v2))
    assert 0.5e-11 < theta < 2e-11
    res = min_norm_element(V, method=method)
    np.testing.assert_allclose(res.point, theta * v1 + (1 - theta) * v2, rtol=0, atol=1e-18)
    np.testing.assert_allclose(res.weights, [theta, 1 - theta], rtol=1e-9, atol=0)


def test_a_tiny_negative_weight_is_clipped_to_the_vertex():
    """Mirror image: the affine minimiser of {v1, v2} lies just outside the segment (θ = -1e-11), so the minimum-norm
    point is the vertex v2 with weights exactly (0, 1), never a point outside the hull."""
    V = np.array([[1.0, 0.0], [1e-4 + 1e-7, 1e-4]])
    for method in ("enumerate", "wolfe"):
        res = min_norm_element(V, method=method)
        np.testing.assert_array_equal(res.weights, [0.0, 1.0])
        np.testing.assert_array_equal(res.point, V[:, 1])


@pytest.mark.parametrize("method", ["enumerate", "wolfe"])
@pytest.mark.parametrize("scale", [1e-9, 1e9])
def test_min_norm_is_scale_equivariant(method, scale):
    """conv{c v_j} has minimum-norm point c d_M (with the same weights where they are unique): tolerances are
    relative to the data."""
    rng = np.random.default_rng(15)
    V = rng.standard_normal((40, 2, 11)) + rng.uniform(0, 2, (40, 1, 1)) * rng.standard_normal((40, 2, 1))
    base = min_norm_element(V, method=method)
    res = min_norm_element(scale * V, method=method)
    np.testing.assert_allclose(res.point, scale * base.point, rtol=0, atol=1e-10 * scale)
    outside = base.norm > 1e-3  # origin outside the hull: the minimiser's weights are unique
    assert 5 <= outside.sum() < 40
    np.testing.assert_allclose(res.weights[outside], base.weights[outside], atol=1e-9)


def test_gram_roundoff_asymmetry_is_removed():
    """C + E with E antisymmetric at 1e-11 (accepted as symmetric up to round-off) gives the weights of C."""
    rng = np.random.default_rng(16)
    V = rng.standard_normal((30, 3, 5)) + rng.standard_normal((30, 3, 1))
    C = np.swapaxes(V, -1, -2) @ V
    C = 0.5 * (C + np.swapaxes(C, -1, -2))
    E = rng.standard_normal(C.shape) * 1e-11
    E = E - np.swapaxes(E, -1, -2)
    for method in ("enumerate", "wolfe"):
        ref = min_norm_weights_from_gram(C, method=method)
        np.testing.assert_allclose(min_norm_weights_from_gram(C + E, method=method), ref, atol=1e-14)
        np.testing.assert_allclose(min_norm_weights_from_gram(C[7] + E[7], method=method), ref[7], atol=1e-14)


def test_integer_inputs_are_converted_before_arithmetic():
    """Integers are taken as float64 first: B² and d·g of 1e10-sized integers would overflow int64."""
    assert eps_act(1, [0.5, 0.5], 10**10) == pytest.approx(1e20, rel=1e-15)
    big = descent_margin(np.array([10**10]), np.array([[10**10, 1]]), [0.5, 0.5], [True, False])
    assert big == pytest.approx(0.5e20, rel=1e-15)


def test_descent_margin_from_gram_takes_weights_of_any_real_type():
    """Weights as exact fractions (an exact LP's output) give the float weights' margin."""
    from fractions import Fraction

    C = np.array([[2.0, 0.5], [0.5, 1.0]])
    lam, mask = np.array([0.25, 0.75]), np.array([True, True])
    exact = descent_margin_from_gram([Fraction(1, 4), Fraction(3, 4)], C, lam, mask)
    assert exact == descent_margin_from_gram([0.25, 0.75], C, lam, mask) == min(0.25 * 0.875, 0.75 * 0.875)


def test_descent_margin_from_gram_equals_descent_margin():
    """``min_{j∈mask} λ_j (Cμ)_j`` equals ``min_{j∈mask} λ_j (Gμ)ᵀg_j`` (d = Gμ) to round-off, batched and single."""
    rng = np.random.default_rng(8)
    G = rng.standard_normal((60, 5, 4)) * rng.uniform(0.1, 10.0, (60, 1, 4))
    mu = rng.dirichlet(np.ones(4), 60)
    lam = 0.95 * rng.dirichlet(np.ones(4), 60) + 0.05 / 4
    mask = rng.random((60, 4)) < 0.5
    mask[:, 2] = True
    C = np.swapaxes(G, 1, 2) @ G
    C = 0.5 * (C + np.swapaxes(C, 1, 2))
    d = np.einsum("nwm,nm->nw", G, mu)
    ref = descent_margin(d, G, lam, mask)
    scale = (lam * np.linalg.norm(G, axis=1)).max(axis=1) * np.linalg.norm(d, axis=1)
    for validate in (True, False):
        got = descent_margin_from_gram(mu, C, lam, mask, validate=validate)
        assert np.all(np.abs(got - ref) <= 1e-14 * scale)
    assert descent_margin_from_gram(mu[3], C[3], lam[3], mask[3]) == pytest.approx(ref[3], rel=1e-13)
    two_axes = descent_margin_from_gram(mu.reshape(6, 10, 4), C.reshape(6, 10, 4, 4), lam.reshape(6, 10, 4),
                                        mask.reshape(6, 10, 4))
    np.testing.assert_allclose(two_axes.ravel(), descent_margin_from_gram(mu, C, lam, mask), rtol=1e-15)


@pytest.mark.parametrize(
    "call, pattern",
    [
        (lambda: near_active_set([1.0, 2.0], [0.5, 0.5], -0.1), names(r"\beps_act\b", r"-0\.1")),
        (lambda: near_active_set([1.0, -2.0], [0.5, 0.5], 0.1), names(r"\blosses\b", float_value("-2.0"))),
        (lambda: near_active_set([1.0, 2.0], [0.0, 1.0], 0.1), names(r"\bprefs\b", float_value("0.0"))),
        (lambda: near_active_set([1.0, 2.0], [0.5, 0.5], np.nan), names(r"\beps_act\b", "nan")),
        (lambda: near_active_set(np.ones((3, 2)), [0.5, 0.5], [0.1, 0.2]),
         names(r"\beps_act\b", r"\(2,\)", r"\(3,\)", "broadcast")),
        (lambda: eps_act(-1.0, [0.5, 0.5], 1.0), names(r"\beta\b", r"-1\.0")),
        (lambda: eps_act(1.0, [0.5, 0.5], -1.0), names(r"\bB\b", r"-1\.0")),
        (lambda: eps_act(np.nan, [0.5, 0.5], 1.0), names(r"\beta\b", "nan")),
        (lambda: min_norm_element(np.ones(3)), names(r"\bvectors\b", r"\(3,\)")),
        (lambda: min_norm_element(np.ones((2, 0))), names(r"\bvectors\b", r"\(2, 0\)")),
        (lambda: min_norm_element(np.ones((0, 3))), names(r"\bvectors\b", r"\(0, 3\)")),
        (lambda: min_norm_element("abc"), names(r"\bvectors\b", "numeric", "'abc'")),
        (lambda: min_norm_element(np.array([[1.0, np.nan]])), names(r"\bvectors\b", "non-finite")),
        (lambda: min_norm_element(np.eye(2), mask=np.array([False, False])), names(r"\bmask\b", "empty")),
        (lambda: min_norm_element(np.eye(2), mask=np.array([1, 0])), names(r"\bmask\b", "boolean", "int")),
        (lambda: min_norm_element(np.eye(2), mask=np.array([True, False, True])), names(r"\bmask\b", "k=2", r"\(3,\)")),
        (lambda: min_norm_element(np.ones((3, 2, 2)), mask=np.ones((2, 2), dtype=bool)),
         names(r"\bmask\b", r"\(2, 2\)", r"\(3,\)", "broadcast")),
        (lambda: min_norm_element(np.eye(2), method="nope"), names(r"\bmethod\b", "'nope'")),
        (lambda: min_norm_weights_from_gram(np.array([[1.0, 2.0], [0.0, 1.0]])), names(r"\bgram\b", "symmetric")),
        (lambda: min_norm_weights_from_gram(np.array([[1.0, 0.0], [0.0, -1.0]])),
         names(r"\bgram\b", "positive semi-definite", r"-1\.000e\+00|-1\.0")),
        (lambda: min_norm_weights_from_gram(np.eye(2), method="nope"), names(r"\bmethod\b", "'nope'")),
        (lambda: descent_margin(np.ones(2), np.ones((3, 2)), [0.5, 0.5], [True, True]),
         names(r"\bd\b", "n_w=3", r"\(2,\)")),
        (lambda: descent_margin(np.ones(3), np.ones(3), [0.5, 0.5], [True, True]), names(r"\bgrads\b", r"\(3,\)")),
        (lambda: descent_margin(np.float64(1.0), np.ones((3, 2)), [0.5, 0.5], [True, True]), names(r"\bd\b", r"\(\)")),
        (lambda: near_active_set([1.0, 2.0, 3.0], [0.5, 0.5], 0.1), names("objectives m", r"losses shape \(3,\)")),
        (lambda: descent_margin(np.ones(3), np.ones((3, 2)), [0.2, 0.3, 0.5], [True, True]),
         names(r"\bprefs\b", "m=3", "m=2")),
        (lambda: descent_margin(np.ones(3), np.ones((3, 2)), [0.5, 0.5], [False, False]), names(r"\bmask\b", "empty")),
        (lambda: descent_margin_from_gram([0.5, 0.5], np.array([[1.0, 2.0], [0.0, 1.0]]), [0.5, 0.5], [True, True]),
         names(r"\bgram\b", "symmetric", r"2\.000e\+00")),
        (lambda: descent_margin_from_gram([0.5, 0.5, 0.0], np.eye(2), [0.5, 0.5], [True, True]),
         names(r"\bweights\b", r"\(3,\)", "m=2")),
        (lambda: descent_margin_from_gram([0.5, np.nan], np.eye(2), [0.5, 0.5], [True, True]),
         names(r"\bweights\b", "finite")),
        (lambda: descent_margin_from_gram([0.5, 0.5], np.eye(2), [0.5, 0.5], [False, False]), names(r"\bmask\b", "empty")),
    ],
)
def test_bad_inputs_raise(call, pattern):
    with pytest.raises(ValueError, match=pattern):
        call()


def test_wolfe_that_runs_out_of_major_cycles_raises_naming_the_instance(monkeypatch):
    """A Wolfe run stopped by its cycle limit raises instead of returning a point that is not the minimiser: the
    instance below needs three major cycles (v3 = (-1, 0) starts, v1 and v2 enter, the third cycle finds the KKT
    property), so a limit of two stops it early; the error names the instance of the batch and the limit."""
    V = np.array([[2.0, -2.0, -1.0], [-2.0, 2.0, 0.0]])
    monkeypatch.setattr(hull, "WOLFE_MAX_ITER", 2)
    with pytest.raises(hull.WolfeNotConvergedError, match=r"WOLFE_MAX_ITER = 2 major cycles at instance \(1,\)"):
        min_norm_element(np.stack([V[:, [0]] @ np.ones((1, 3)), V]), method="wolfe")
    monkeypatch.setattr(hull, "WOLFE_MAX_ITER", 3)
    np.testing.assert_array_equal(min_norm_element(V, method="wolfe").weights, [0.5, 0.5, 0.0])


def test_wolfe_cycle_limit_is_the_documented_one():
    """min_norm_element's documentation states the limit users can rely on; it is the one the code applies."""
    stated = f"within {hull.WOLFE_MAX_ITER:,} major cycles".replace(",", " ")
    assert stated in " ".join(min_norm_element.__doc__.split())


def test_gram_version_gives_the_vector_versions_weights_bit_for_bit():
    """On affinely independent generators (k <= n) the minimiser's support is unique and both entry points solve
    its KKT system on the same symmetrised Gram VᵀV: the Gram version's weights are min_norm_element's, bit for bit
    (a Gram rescaled inside one of them would agree only to round-off)."""
    rng = np.random.default_rng(5)
    for k in (2, 3, 5):
        V = rng.standard_normal((100, 6, k))
        u = min_norm_weights_from_gram(np.swapaxes(V, -1, -2) @ V)
        np.testing.assert_array_equal(u, min_norm_element(V).weights)


def test_scale_is_the_largest_squared_norm_among_the_selected_generators():
    V = np.array([[3.0, 1.0, 0.0], [0.0, 1.0, 0.5]])
    mask = np.array([[True, True, True], [False, True, True], [False, False, True]])
    res = min_norm_element(np.broadcast_to(V, (3, 2, 3)), mask)
    np.testing.assert_array_equal(res.scale, [9.0, 2.0, 0.25])


def test_near_active_set_checks_its_inputs_once(monkeypatch):
    """near_active_set checks losses and prefs itself; the bottleneck set it adds reuses them (validate=False), so
    prefs are not checked and renormalised a second time."""
    import sim.preference as preference

    calls = []
    checked = preference.check_preferences

    def counting(*args, **kwargs):
        calls.append(args)
        return checked(*args, **kwargs)

    monkeypatch.setattr(preference, "check_preferences", counting)
    near_active_set([1.0, 2.0, 0.5], [0.2, 0.3, 0.5], 0.1)
    assert calls == []


def test_wolfe_batch_in_lockstep_equals_each_instance_alone():
    """Wolfe's iteration runs a batch in lockstep: every instance gets bitwise the weights it gets alone, with
    duplicated and affinely dependent generators and partial masks in the batch."""
    from sim.hull import _wolfe

    rng = np.random.default_rng(3)
    b, n, k = 60, 5, 11
    V = rng.standard_normal((b, n, k))
    V[::3, :, 1] = V[::3, :, 0]
    V[1::4, :, 2] = 0.5 * (V[1::4, :, 0] + V[1::4, :, 1])
    K = np.swapaxes(V, -1, -2) @ V
    K = 0.5 * (K + np.swapaxes(K, -1, -2))
    mask = rng.random((b, k)) < 0.8
    mask[:, 3] = True
    u = _wolfe(K, mask)
    for r in range(b):
        np.testing.assert_array_equal(u[r], _wolfe(K[r:r + 1], mask[r:r + 1])[0])
    assert np.all(u[~mask] == 0.0) and np.allclose(u.sum(axis=1), 1.0)


def _dependent_instances(rng, b: int, n: int, k: int, p_mask: float):
    """``b`` hulls of ``k`` generators in ``R^n`` (spreads of 1e±4): every third with its last generator a copy of
    the first, every fourth from the second with generator 1 on the segment of 0 and 2; their Gram matrices and
    masks (each with generator 0, the others with probability ``p_mask``)."""
    V = rng.standard_normal((b, n, k)) * np.exp(rng.uniform(-4.0, 4.0, (b, 1, k)))
    V[::3, :, -1] = V[::3, :, 0]
    V[1::4, :, 1] = 0.5 * (V[1::4, :, 0] + V[1::4, :, 2])
    K = np.swapaxes(V, -1, -2) @ V
    K = 0.5 * (K + np.swapaxes(K, -1, -2))
    mask = rng.random((b, k)) < p_mask
    mask[:, 0] = True
    return V, K, mask


@pytest.mark.parametrize("gram_only", [True, False])
def test_enumeration_batch_equals_each_instance_alone(gram_only):
    """The support enumeration solves every support of one size for the whole batch in one call: every instance
    gets bitwise the weights it gets alone (so a caller may stack rounds or clients freely), with duplicated
    generators (ties between supports of one point, decided by the norms' round-off) and partial masks."""
    from sim.hull import _enumerate

    rng = np.random.default_rng(4)
    for k, n in ((4, 7), (6, 3), (8, 9)):
        b = 57
        V, K, mask = _dependent_instances(rng, b, n, k, 0.7)
        Vx = None if gram_only else V
        size = k if gram_only else min(k, n + 1)
        u = _enumerate(K, mask, Vx, size)
        for r in range(b):
            alone = _enumerate(K[r:r + 1], mask[r:r + 1], None if Vx is None else Vx[r:r + 1], size)[0]
            np.testing.assert_array_equal(u[r], alone)
        assert np.all(u[~mask] == 0.0) and np.allclose(u.sum(axis=1), 1.0)


@pytest.mark.parametrize("gram_only", [True, False])
def test_enumeration_stops_at_the_minimiser_with_the_weights_of_every_size(gram_only):
    """An instance leaves the enumeration at the first size whose kept candidate has the KKT property: on random
    instances with spreads of 1e±4 and partial masks its weights are bit for bit those of trying every size. Where
    generators are affinely dependent (a duplicated generator, one on the segment of two others) one point has
    weights on several supports (so do more than n + 1 generators in R^n, which the Gram form tries), and trying
    every size could keep a larger support whose norm's round-off came out lower: the exit keeps the smaller
    support, the same point to round-off."""
    from sim.hull import KKT_TOL, _enumerate

    rng = np.random.default_rng(21)
    for k, n in ((4, 7), (6, 3), (8, 9), (8, 2)):
        b = 400
        V, K, mask = _dependent_instances(rng, b, n, k, 0.8)
        Vx = None if gram_only else V
        size = k if gram_only else min(k, n + 1)
        u = _enumerate(K, mask, Vx, size)
        every = _enumerate(K, mask, Vx, size, exhaustive=True)
        dependent = np.zeros(b, dtype=bool)
        dependent[::3] = mask[::3, 0] & mask[::3, -1]
        dependent[1::4] |= mask[1::4, 1] & (mask[1::4, 0] | mask[1::4, 2])
        dependent |= mask.sum(axis=1) > n + 1  # more generators than n + 1 in R^n (the Gram form tries them)
        differ = ~(u == every).all(axis=1)
        np.testing.assert_array_equal(u[~dependent], every[~dependent])
        assert not (differ & ~dependent).any()
        gap = u[differ] - every[differ]  # the two weights' points: the same to round-off
        assert np.all((np.einsum("bi,bij,bj->b", gap, K[differ], gap)) <= 1e-12 * np.einsum("bii->b", K[differ]))
        Ku = (K @ u[:, :, None])[:, :, 0]
        slack = np.where(mask, (Ku * u).sum(axis=1)[:, None] - Ku, -np.inf).max(axis=1)
        scale = np.where(mask, np.einsum("bii->bi", K), -np.inf).max(axis=1)
        assert np.all(slack <= 1e3 * KKT_TOL * scale)  # each is the minimiser
        assert ((u > 0).sum(axis=1) < size).any()


def test_enumeration_in_blocks_of_instances_equals_one_block(monkeypatch):
    """A batch larger than a block (``_ENUM_CHUNK`` pairs of the size with the most supports) is solved block by
    block, bounding the dense (instances × supports) arrays: the weights are bitwise those of one block, for blocks
    that divide the batch and one that does not, with partial masks and duplicated generators."""
    import sim.hull as hull

    rng = np.random.default_rng(11)
    b, n, k = 23, 3, 6
    V = rng.standard_normal((b, n, k))
    V[::4, :, -1] = V[::4, :, 0]
    K = np.swapaxes(V, -1, -2) @ V
    mask = rng.random((b, k)) < 0.8
    mask[:, 1] = True
    whole = hull._enumerate(K, mask, V, 4)
    gram_whole = hull._enumerate(K, mask, None, k)
    one, calls = hull._enumerate, []
    monkeypatch.setattr(hull, "_enumerate", lambda *a: calls.append(a[0].shape[0]) or one(*a))
    for chunk in (20, 100, 20 * 23):  # the largest size has C(6, 3) = 20 supports: blocks of 1, 5 and 23 instances
        monkeypatch.setattr(hull, "_ENUM_CHUNK", chunk)
        per = chunk // 20
        calls.clear()
        np.testing.assert_array_equal(hull._enumerate_in_blocks(K, mask, V, 4), whole)
        assert calls == [per] * (b // per) + ([b % per] if b % per else [])
        calls.clear()
        np.testing.assert_array_equal(hull._enumerate_in_blocks(K, mask, None, k), gram_whole)  # sizes 1..6
        assert max(calls) == per and sum(calls) == b
    monkeypatch.setattr(hull, "_enumerate", one)
    rng = np.random.default_rng(12)  # through the public entry point, in blocks of 2 instances of k = 8 (C(8, 4) = 70)
    G = rng.standard_normal((9, 5, 8))
    ref = hull.min_norm_element(G, method="enumerate").weights
    monkeypatch.setattr(hull, "_ENUM_CHUNK", 140)
    np.testing.assert_array_equal(hull.min_norm_element(G, method="enumerate").weights, ref)


def test_enumeration_weights_sum_to_one_to_the_rounding_of_a_division():
    """The enumeration's weights are normalised after the KKT solve: their sum is 1 within ``k·eps`` (each weight
    divided once, then k terms summed), whatever the solve's own round-off (about 8 ulps on these instances before
    the division), over generators whose scales differ by factors up to e⁶ ≈ 400."""
    rng = np.random.default_rng(5)
    for k, n in ((3, 2), (4, 7)):
        V = rng.standard_normal((4000, n, k)) * np.exp(rng.uniform(-3.0, 3.0, (4000, 1, k)))
        w = min_norm_element(V, method="enumerate").weights
        assert np.abs(w.sum(axis=-1) - 1.0).max() <= k * np.finfo(float).eps
        assert np.all(w >= 0.0)


def test_enumeration_ties_between_sizes_keep_the_smallest_support():
    """The minimum-norm point of conv{e1, e2, (e1 + e2)/2} is (e1 + e2)/2, reached both by the single generator 3
    and by the pair {1, 2} with weights (1/2, 1/2), at exactly the same norm: the enumeration keeps the first
    support in its order (by size), so the weights are (0, 0, 1) — the sparsest representation — on both entry
    points."""
    V = np.array([[1.0, 0.0, 0.5], [0.0, 1.0, 0.5]])  # columns are the generators
    res = min_norm_element(V, method="enumerate")
    np.testing.assert_array_equal(res.point, [0.5, 0.5])
    np.testing.assert_array_equal(res.weights, [0.0, 0.0, 1.0])
    np.testing.assert_array_equal(min_norm_weights_from_gram(V.T @ V, method="enumerate"), [0.0, 0.0, 1.0])
