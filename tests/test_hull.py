"""Tests of sim.hull: near-active set, exact minimum-norm hull element, H.19 descent margin."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import minimize

from sim.hull import (
    ENUMERATION_MAX_K,
    descent_margin,
    descent_margin_from_gram,
    eps_act,
    min_norm_element,
    min_norm_weights_from_gram,
    near_active_set,
)


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
    """m = 2: d_M = θv1 + (1-θ)v2 with θ = clip((v2-v1)ᵀv2/‖v1-v2‖², 0, 1) (THEOREMS.md §4 S18)."""
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
    # F5 (THEOREMS.md §4 S21): J*_ε = {1,2} iff |w| ≤ ε_act
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


@pytest.mark.parametrize(
    "call",
    [
        lambda: near_active_set([1.0, 2.0], [0.5, 0.5], -0.1),
        lambda: near_active_set([1.0, -2.0], [0.5, 0.5], 0.1),
        lambda: near_active_set([1.0, 2.0], [0.0, 1.0], 0.1),
        lambda: near_active_set([1.0, 2.0], [0.5, 0.5], np.nan),
        lambda: eps_act(-1.0, [0.5, 0.5], 1.0),
        lambda: eps_act(1.0, [0.5, 0.5], -1.0),
        lambda: min_norm_element(np.ones(3)),
        lambda: min_norm_element(np.array([[1.0, np.nan]])),
        lambda: min_norm_element(np.eye(2), mask=np.array([False, False])),
        lambda: min_norm_element(np.eye(2), mask=np.array([1, 0])),
        lambda: min_norm_element(np.eye(2), mask=np.array([True, False, True])),
        lambda: min_norm_element(np.eye(2), method="nope"),
        lambda: min_norm_weights_from_gram(np.array([[1.0, 2.0], [0.0, 1.0]])),
        lambda: min_norm_weights_from_gram(np.array([[1.0, 0.0], [0.0, -1.0]])),
        lambda: descent_margin(np.ones(2), np.ones((3, 2)), [0.5, 0.5], [True, True]),
        lambda: descent_margin(np.ones(3), np.ones((3, 2)), [0.5, 0.5], [False, False]),
        lambda: descent_margin_from_gram([0.5, 0.5], np.array([[1.0, 2.0], [0.0, 1.0]]), [0.5, 0.5], [True, True]),
        lambda: descent_margin_from_gram([0.5, 0.5, 0.0], np.eye(2), [0.5, 0.5], [True, True]),
        lambda: descent_margin_from_gram([0.5, np.nan], np.eye(2), [0.5, 0.5], [True, True]),
        lambda: descent_margin_from_gram([0.5, 0.5], np.eye(2), [0.5, 0.5], [False, False]),
    ],
)
def test_bad_inputs_raise(call):
    with pytest.raises(ValueError):
        call()
