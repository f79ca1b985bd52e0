"""Tests of sim.constants (docs/spec/constants.md#constants): smoothness, gradient bound, floor, L_adj (H.10),
LP matrix form and
κ_LP (docs/spec/lp.md#lp, docs/spec/statements.md#t-h6), H.17, H.19 / eq 64, H.20, H.34, PL, σ₀², L*."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import linprog

from sim import constants as K
from sim.preference import adjustment, chebyshev, uniformity_and_adjustment


def _spd(rng, n, lo=0.5, hi=3.0):
    U, _ = np.linalg.qr(rng.normal(size=(n, n)))
    ev = rng.uniform(lo, hi, size=n)
    return U @ np.diag(ev) @ U.T, ev


# ----------------------------------------------------------------------------------------- L0, B, c


@pytest.mark.parametrize("seed", range(3))
def test_smoothness_quadratic_is_max_eigenvalue(seed):
    rng = np.random.default_rng(seed)
    pairs = [_spd(rng, 4) for _ in range(3)]
    Qs = np.stack([p[0] for p in pairs])
    L0 = K.smoothness_quadratic(Qs)
    assert isinstance(L0, np.float64)
    assert L0 == pytest.approx(max(p[1].max() for p in pairs), rel=1e-12)
    assert K.smoothness_hessian_max(Qs[None].repeat(5, axis=0)) == pytest.approx(L0, rel=1e-12)


def test_gradient_bound_and_quadratic_ball_bound():
    rng = np.random.default_rng(1)
    n_w, m = 3, 2
    Qs = np.stack([_spd(rng, n_w)[0] for _ in range(m)])
    c = rng.normal(size=(m, n_w))
    wbar, R = rng.normal(size=n_w), 0.7
    u = rng.normal(size=(500, n_w))
    w = wbar + R * rng.uniform(size=(500, 1)) * u / np.linalg.norm(u, axis=1, keepdims=True)
    grads = np.stack([np.stack([Qs[j] @ (x - c[j]) for j in range(m)], axis=1) for x in w])  # (500, n_w, m)
    B = K.gradient_bound(grads)
    assert B == pytest.approx(max(np.linalg.norm(grads[p, :, j]) for p in range(500) for j in range(m)), rel=1e-14)
    assert B <= K.gradient_bound_quadratic_ball(Qs, c, wbar, R) * (1 + 1e-12)


def test_floor_constant():
    rng = np.random.default_rng(2)
    l = np.exp(rng.uniform(-1, 1, size=(6, 4)))
    lam_uniform = (1 / l) / (1 / l).sum(axis=1, keepdims=True)  # β = 0: ĺ uniform
    assert K.floor_constant(l, lam_uniform) == pytest.approx(1.0, abs=1e-12)
    lam = rng.dirichlet(np.ones(4), size=6)
    c = K.floor_constant(l, lam)
    assert 0.0 < c < 1.0
    c_small = K.floor_constant([1.0, 1.0], [1e-8, 1 - 1e-8])  # T-H9(e): c → 0
    assert c_small < 1e-7
    assert K.normalizer_min(l, lam) == pytest.approx(np.min((l * lam).sum(axis=1)), rel=1e-15)


# ------------------------------------------------------------------------------------------ H.10 L_adj


@pytest.mark.parametrize("m", [2, 3, 5, 7])
@pytest.mark.parametrize("seed", [0, 1])
def test_adjustment_lipschitz_bounds_random_pairs(m, seed):
    """H.10: ‖A(λ) − A(λ')‖ ≤ L_adj ‖λ − λ'‖ with c, Z_min over both preferences (T-H10)."""
    rng = np.random.default_rng(seed)
    worst = 0.0
    for p in range(300):
        l = np.exp(rng.uniform(-3, 3, size=m))
        lam = 0.95 * rng.dirichlet(np.ones(m)) + 0.05 / m
        if p % 2:
            lam2 = rng.dirichlet(np.ones(m))
            lam2 = 0.95 * lam2 + 0.05 / m
        else:
            lam2 = lam * (1 + 10 ** rng.uniform(-6, np.log10(0.3)) * rng.uniform(-1, 1, size=m))
            lam2 /= lam2.sum()
        L = K.adjustment_lipschitz(l, np.stack([lam, lam2]))
        ratio = np.linalg.norm(adjustment(l, lam) - adjustment(l, lam2)) / (L * np.linalg.norm(lam - lam2))
        worst = max(worst, ratio)
    assert worst <= 1.0


def test_adjustment_lipschitz_wrong_floor_negative_control():
    """T-H10(e): claimed c = 0.5 while the true floor is ≈ 2e-4: the observed slope exceeds L_adj(0.5)."""
    l = np.array([1.0, 1.0])
    lam, lam2 = np.array([1e-4, 1 - 1e-4]), np.array([2e-4, 1 - 2e-4])
    slope = np.linalg.norm(adjustment(l, lam) - adjustment(l, lam2)) / np.linalg.norm(lam - lam2)
    L_claimed = K.adjustment_lipschitz(l, np.stack([lam, lam2]), c=0.5)
    assert slope == pytest.approx(7.82, abs=0.01)
    assert L_claimed == pytest.approx(5.76, abs=0.01)
    assert slope > L_claimed
    assert slope <= K.adjustment_lipschitz(l, np.stack([lam, lam2]))  # the true floor covers it


# ---------------------------------------------------------------------------------- H.6 LP matrix form


def _solve_balancing_lp(l, lam, C):
    """Reference balancing-mode EPO LP by HiGHS (test helper), with duals in objective indexing."""
    m = l.size
    _, A = uniformity_and_adjustment(l, lam)
    CA = C @ A
    J = CA > 0
    Jstar = lam * l >= np.max(lam * l)
    if J.any():
        R = np.flatnonzero(Jstar | ~J)
        rhs = np.where(Jstar, 0.0, CA)[R]
    else:
        R = np.arange(m)
        rhs = np.zeros(m)
    res = linprog(-CA, A_ub=-C[R], b_ub=-rhs, A_eq=np.ones((1, m)), b_eq=[1.0], bounds=[(0, None)] * m,
                  method="highs")
    assert res.status == 0
    cd = np.zeros(m)
    cd[R] = res.ineqlin.marginals
    return res.x, res.lower.marginals, cd


@pytest.mark.parametrize("m", [2, 3, 4])
def test_lp_basis_eq8_on_nondegenerate_instances(m):
    rng = np.random.default_rng(100 + m)
    n_ok = 0
    for _ in range(40):
        n_w = int(rng.integers(m, 7))
        G = rng.normal(size=(n_w, m))
        C = G.T @ G
        l = np.exp(rng.uniform(-1, 1, size=m))
        lam = 0.95 * rng.dirichlet(np.ones(m)) + 0.05 / m
        mu, sd, cd = _solve_balancing_lp(l, lam, C)
        info = K.lp_basis(l, lam, C, mu, sign_duals=sd, constraint_duals=cd)
        assert len(info.rows) == info.M.shape[0] == info.S.shape[0] and info.M.shape[1] == m
        np.testing.assert_allclose(info.b, info.b_const + info.S @ (C @ info.adjustment), rtol=0, atol=0)
        assert info.active[0]
        if info.nondegenerate:
            n_ok += 1
            assert info.is_basis and info.M_B.shape == (m, m) and info.strictly_complementary
            np.testing.assert_allclose(info.solve(), mu, atol=1e-9)  # eq 8
            np.testing.assert_allclose(info.M_B @ mu, info.b_B, atol=1e-9)
            assert info.kappa_lp == pytest.approx(
                np.linalg.norm(np.linalg.inv(info.M_B), 2) * np.linalg.norm(C, 2), rel=1e-10)
            # b_B is affine in A: b_B(A') − b_B(A) = S_B C (A' − A)
            A2 = info.adjustment + 1e-3 * rng.normal(size=m)
            np.testing.assert_allclose(info.rhs_B(A2) - info.b_B, info.S_B @ C @ (A2 - info.adjustment),
                                       atol=1e-14)
    assert n_ok >= 10  # non-vacuous


def test_lp_basis_classification_without_duals_and_degenerate():
    rng = np.random.default_rng(7)
    m = 3
    G = rng.normal(size=(5, m))
    C = G.T @ G
    l = np.array([1.0, 2.0, 0.5])
    lam = np.array([0.5, 0.3, 0.2])
    mu, _, _ = _solve_balancing_lp(l, lam, C)
    info = K.lp_basis(l, lam, C, mu)
    assert info.strictly_complementary is None
    assert info.nondegenerate is (None if info.is_basis else False)
    loose = K.lp_basis(l, lam, C, mu, tol=1e6)  # every row active → degenerate vertex
    assert loose.n_active == loose.M.shape[0] > m
    assert not loose.is_basis and loose.nondegenerate is False and "degenerate" in loose.reason
    assert loose.M_B is None and loose.kappa_lp is None
    with pytest.raises(ValueError, match="no basis to solve eq 8 on: .*degenerate"):
        loose.solve()
    with pytest.raises(ValueError, match="no basis to evaluate b_B on"):
        loose.rhs_B(loose.adjustment)
    with pytest.raises(ValueError, match="no basis to compute duals at"):
        K.basis_duals(loose)


def test_lp_basis_rejects_dom_mode_and_infeasible_weights():
    l = np.array([1.0, 2.0, 4.0])
    lam_uniform = (1 / l) / (1 / l).sum()
    C = np.eye(3)
    with pytest.raises(ValueError, match="eps_mode"):
        K.lp_basis(l, lam_uniform, C, np.full(3, 1 / 3))
    lam = np.array([0.2, 0.3, 0.5])
    with pytest.raises(ValueError, match="weights"):
        K.lp_basis(l, lam, C, np.array([0.5, 0.6, -0.1]))
    with pytest.raises(ValueError, match="weights"):
        K.lp_basis(l, lam, C, np.array([0.5, 0.6]))
    with pytest.raises(ValueError, match="constraint_duals"):
        K.lp_basis(l, lam, C, np.full(3, 1 / 3), sign_duals=np.zeros(3))


def test_lp_sensitivity_and_h11_constant():
    rng = np.random.default_rng(3)
    MB = rng.normal(size=(3, 3))
    G = rng.normal(size=(4, 3))
    C = G.T @ G
    kap = K.lp_sensitivity(MB, C)
    assert kap == pytest.approx(np.linalg.norm(np.linalg.inv(MB), 2) * np.linalg.eigvalsh(C)[-1], rel=1e-10)
    with pytest.raises(ValueError, match="M_B"):
        K.lp_sensitivity(np.array([[1.0, 2.0], [2.0, 4.0]]), np.eye(2))
    C1 = K.h11_constant(kap, C, 2.0)
    assert C1 == pytest.approx(kap**2 * np.linalg.eigvalsh(C)[-1] * 4.0, rel=1e-12)
    assert K.h11_constant(kap, C, 2.0, half=True) == pytest.approx(0.5 * C1, rel=1e-15)


# ----------------------------------------------------------------------------------------------- H.17


def test_regularity_constants():
    gains = np.array([1.0, 4.0, 0.3, 9.0])
    betas = np.array([0.5, 1.0, 0.0, 3.0])
    dbal = np.array([1.0, 3.0, 0.0, 3.0])
    rc = K.regularity_constants(gains, betas, dbal)
    assert rc.kappa_beta == pytest.approx(2.0) and rc.L_A == pytest.approx(3.0) and rc.n_points == 3
    assert rc.holds
    bad = K.regularity_constants(np.array([-1.0, 4.0]), np.array([0.5, 1.0]), np.array([1.0, 1.0]))
    assert not bad.holds and bad.kappa_beta == pytest.approx(-2.0)
    with pytest.raises(ValueError, match="betas"):
        K.regularity_constants([1.0], [0.0], [0.0])


# --------------------------------------------------------------------------------------- H.19, eq 64


def _margin_data(rng, N=3, T=60):
    r = np.abs(rng.normal(size=(N, T))) * np.geomspace(1, 1e-3, T)
    mg = 2.0 * r + 0.01 * rng.normal(size=(N, T))
    return mg, r


@pytest.mark.parametrize("seed", range(3))
def test_descent_margin_constants_grid_choice(seed):
    rng = np.random.default_rng(seed)
    mg, r = _margin_data(rng)
    eta, B, L0 = 0.05, 2.0, 3.0
    lam_max = np.array([0.5, 0.6, 0.4])
    dev_traj = 0.01 * np.abs(rng.normal(size=r.shape))
    res = K.descent_margin_constants(mg, r, eta, lam_max, B, L0, dev_traj, n_grid=50)
    assert 0 < res.c_d <= 1 / eta * (1 + 1e-12)
    assert res.residual_max <= 1e-12  # H.19 holds on the points by construction
    assert np.all(res.b >= 0)
    np.testing.assert_allclose(res.deviation_bar, dev_traj.max(axis=1))
    # eps0 is eq 64 at the chosen constants
    np.testing.assert_allclose(res.eps0, K.band_radius(res.c_d, res.b, eta, lam_max, B, L0, dev_traj), rtol=1e-13)
    # brute force over the grid: the choice minimises max_i ε_{0,i}
    brute = [
        K.band_radius(c, np.maximum(0, (c * r - mg).max(axis=1)), eta, lam_max, B, L0, dev_traj).max()
        for c in res.c_grid
    ]
    assert res.eps0_max == pytest.approx(min(brute), rel=1e-13)
    assert res.eps0_mean == pytest.approx(res.eps0.mean(), rel=1e-15)


def test_band_radius_formula_and_two_phase():
    c_d, b, eta, B, L0 = 2.0, np.array([0.0, 0.1]), 0.01, 1.5, 4.0
    lam_max, dev = np.array([0.5, 0.8]), np.array([0.2, 0.05])
    eps = K.band_radius(c_d, b, eta, lam_max, B, L0, dev)
    kH, keta = lam_max * B / c_d, lam_max * L0 * B**2 / (2 * c_d)
    np.testing.assert_allclose(eps, kH * dev + keta * eta + b / c_d, rtol=1e-14)
    eps_hat = K.band_radius(c_d, b, eta, lam_max, B, L0, dev, eta_II=0.03)
    np.testing.assert_allclose(eps_hat, kH * dev + keta * 0.03 + b / c_d, rtol=1e-14)
    assert np.all(eps_hat > eps)
    np.testing.assert_allclose(K.band_radius(c_d, b, 0.03, lam_max, B, L0, dev, eta_II=0.01), eps_hat, rtol=1e-15)


def test_strict_descent_constant():
    r = np.array([[0.0, 0.5, 1.0], [0.2, 0.0, 0.4]])
    mg = np.array([[0.0, 1.5, 2.5], [0.5, 0.1, 1.0]])
    s = K.strict_descent_constant(mg, r)
    assert s.c_d == pytest.approx(2.5) and s.holds and s.n_points == 4
    s2 = K.strict_descent_constant(mg - 0.6, r)
    assert not s2.holds and np.isfinite(s2.c_d) and s2.c_d < 0
    mg3 = mg.copy()
    mg3[0, 0] = -0.01  # negative margin at an r = 0 point: strict H.19 fails for every c_d
    assert not K.strict_descent_constant(mg3, r).holds
    with pytest.raises(ValueError, match="gaps"):
        K.strict_descent_constant([1.0], [0.0])


# ----------------------------------------------------------------------------------------------- H.20


@pytest.mark.parametrize("seed", range(3))
def test_h20_implies_strict_h19_on_the_sample(seed):
    rng = np.random.default_rng(seed)
    r = np.abs(rng.normal(size=200))
    dM2 = 2 * r * rng.uniform(0.5, 2.0, size=200)  # (i) with μ_ψ ≥ 0.5
    mg = dM2 * rng.uniform(0.3, 1.0, size=200)  # (ii) with σ ≥ 0.3
    h = K.h20_constants(dM2, r, mg)
    assert h.holds and h.mu_psi >= 0.5 - 1e-12 and h.sigma >= 0.3 - 1e-12
    assert h.c_d == pytest.approx(2 * h.sigma * h.mu_psi)
    assert np.all(mg >= h.c_d * r * (1 - 1e-12))  # Lemma H.20: strict H.19 with c_d = 2σμ_ψ


def test_h20_kink_negative_control():
    """F5: inside the band the hull contains 0, so d_M = 0 while r = w/2 > 0: (i) fails."""
    w = np.array([0.05, 0.09, 0.2])
    r = w / 2
    dM2 = np.array([0.0, 0.0, 0.25])
    mg = np.array([-0.025, -0.045, 0.1])
    h = K.h20_constants(dM2, r, mg)
    assert not h.holds and h.mu_psi == 0.0
    assert h.n_dM_zero == 2 and h.n_dM_zero_positive_gap == 2 and h.min_margin_at_dM_zero == pytest.approx(-0.045)
    assert h.n_sigma_points == 1 and h.sigma == pytest.approx(0.4)


# ------------------------------------------------------------------------------------ H.34, PL, σ₀², L*


@pytest.mark.parametrize("seed", range(3))
def test_quadratic_growth_on_planted_quadratics(seed):
    """F1: ψ_i − ψ_i* ≥ (μ_i/2)‖w − w_i*‖² with μ_i = min_j λ_j λ_min(Q_j) (H.34)."""
    rng = np.random.default_rng(seed)
    m, n_w = 3, 4
    Qs = np.stack([_spd(rng, n_w, 0.5, 1.5)[0] for _ in range(m)])
    c = rng.normal(size=(m, n_w))
    bconst = 0.3 + rng.uniform(size=m)
    u = rng.dirichlet(3 * np.ones(m))
    w_star = np.linalg.solve(np.einsum("j,jab->ab", u, Qs), np.einsum("j,jab,jb->a", u, Qs, c))

    def losses(w):
        d = w[..., None, :] - c
        return 0.5 * np.einsum("...ja,jab,...jb->...j", d, Qs, d) + bconst

    lam = (1 / losses(w_star)) / (1 / losses(w_star)).sum()
    psi_star = chebyshev(losses(w_star), lam)
    mu = K.quadratic_growth(lam, Qs)
    assert mu > 0
    W = w_star + rng.normal(size=(2000, n_w)) * rng.uniform(1e-3, 2, size=(2000, 1))
    gap = chebyshev(losses(W), lam) - psi_star
    assert np.all(gap >= 0.5 * mu * ((W - w_star) ** 2).sum(axis=1) * (1 - 1e-9))
    assert K.quadratic_growth(np.stack([lam, lam]), Qs).shape == (2,)


def test_pl_constant_samples_quadratic():
    rng = np.random.default_rng(4)
    Q, ev = _spd(rng, 3, 0.5, 2.0)
    W = rng.normal(size=(500, 3))
    g2 = ((W @ Q) ** 2).sum(axis=1)
    gap = 0.5 * np.einsum("pa,ab,pb->p", W, Q, W)
    mu_pl = K.pl_constant_samples(g2, gap)
    assert ev.min() * (1 - 1e-12) <= mu_pl <= ev.max()
    with pytest.raises(ValueError, match="gaps"):
        K.pl_constant_samples([1.0], [0.0])


def test_direction_variance():
    rng = np.random.default_rng(5)
    Sigma = np.diag([1.0, 0.5, 2.0, 1.0])
    x = rng.multivariate_normal(np.ones(4), Sigma, size=20000)
    est = K.direction_variance(x)
    assert est == pytest.approx(np.trace(np.cov(x.T)), rel=1e-12)
    assert est == pytest.approx(np.trace(Sigma), rel=0.05)
    known = K.direction_variance(x, mean=np.ones(4))
    assert known == pytest.approx(((x - 1) ** 2).sum() / x.shape[0], rel=1e-12)
    batched = K.direction_variance(x.reshape(4, 5000, 4))
    assert batched.shape == (4,)
    with pytest.raises(ValueError, match="samples"):
        K.direction_variance(x[:1])


def test_loss_bound_at_optima():
    assert K.loss_bound_at_optima([1.0, 3.0], [[2.0, 2.5], [4.0, 0.1]]) == 4.0
    assert K.loss_bound_at_optima([1.0, 3.0]) == 3.0


# ------------------------------------------------------------------------------------------ bad inputs

_BAD = [
    (K.smoothness_quadratic, ([[1.0, 2.0], [0.0, 1.0]],), {}, "Qs"),
    (K.smoothness_quadratic, (np.ones((2, 3)),), {}, "Qs"),
    (K.smoothness_hessian_max, (np.full((2, 2), np.nan),), {}, "hessians"),
    (K.gradient_bound, (np.array([1.0, np.inf]),), {}, "grads"),
    (K.gradient_bound_quadratic_ball, (np.eye(2)[None], [[0.0, 0.0]], [0.0, 0.0], -1.0), {}, "radius"),
    (K.floor_constant, ([1.0, -1.0], [0.5, 0.5]), {}, "losses"),
    (K.floor_constant, ([1.0, 1.0], [0.5, 0.6]), {}, "prefs"),
    (K.adjustment_lipschitz, ([1.0, 1.0], [0.5, 0.5]), {"c": 0.0}, "c"),
    (K.adjustment_lipschitz, ([1.0, 1.0], [0.5, 0.5]), {"c": 2.0}, "c"),
    (K.adjustment_lipschitz, ([1.0, 1.0, 1.0], [0.5, 0.5]), {}, "prefs"),
    (K.lp_sensitivity, (np.ones((2, 3)), np.eye(2)), {}, "M_B"),
    (K.lp_sensitivity, (np.eye(2), np.eye(3)), {}, "C"),
    (K.lp_basis, ([1.0, 2.0], [0.3, 0.7], np.eye(3), [0.5, 0.5]), {}, "gram"),
    (K.lp_basis, ([1.0, 2.0], [0.3, 0.7], np.eye(2), [0.5, 0.5]), {"tol": -1.0}, "tol"),
    (K.regularity_constants, ([1.0, 2.0], [0.1], [1.0, 1.0]), {}, "betas"),
    (K.regularity_constants, ([1.0], [-0.1], [1.0]), {}, "betas"),
    (K.descent_margin_constants, (np.ones((2, 3)), np.ones((2, 3)), 0.0, 0.5, 1.0, 1.0, np.zeros(2)), {}, "eta"),
    (K.descent_margin_constants, (np.ones((2, 3)), np.ones((2, 4)), 0.1, 0.5, 1.0, 1.0, np.zeros(2)), {}, "gaps"),
    (K.descent_margin_constants, (np.ones((2, 3)), -np.ones((2, 3)), 0.1, 0.5, 1.0, 1.0, np.zeros(2)), {}, "gaps"),
    (K.descent_margin_constants, (np.ones((2, 3)), np.ones((2, 3)), 0.1, [0.5, 2.0], 1.0, 1.0, np.zeros(2)), {},
     "prefs_max"),
    (K.descent_margin_constants, (np.ones((2, 3)), np.ones((2, 3)), 0.1, 0.5, 1.0, 1.0, np.zeros(3)), {},
     "deviations"),
    (K.descent_margin_constants, (np.ones((2, 3)), np.ones((2, 3)), 0.1, 0.5, 1.0, 1.0, np.zeros(2)),
     {"c_grid": [1.0, 20.0]}, "c_grid"),
    (K.descent_margin_constants, (np.ones((2, 3)), np.ones((2, 3)), 0.1, 0.5, -1.0, 1.0, np.zeros(2)), {}, "B"),
    (K.band_radius, (0.0, 0.0, 0.1, 0.5, 1.0, 1.0, 0.1), {}, "c_d"),
    (K.band_radius, (1.0, -0.1, 0.1, 0.5, 1.0, 1.0, 0.1), {}, "b"),
    (K.band_radius, (1.0, 0.0, 0.1, 0.5, 1.0, np.nan, 0.1), {}, "L0"),
    (K.band_radius, (1.0, 0.0, 0.1, 0.5, 1.0, 1.0, 0.1), {"eta_II": -0.1}, "eta_II"),
    (K.strict_descent_constant, ([1.0, np.nan], [1.0, 1.0]), {}, "margins"),
    (K.h20_constants, ([1.0], [1.0], [1.0, 2.0]), {}, "margins"),
    (K.h20_constants, ([-1.0], [1.0], [1.0]), {}, "dM_norms_sq"),
    (K.quadratic_growth, ([0.5, 0.5], np.eye(2)[None]), {}, "Qs"),
    (K.pl_constant_samples, ([-1.0], [1.0]), {}, "grad_psi_norms_sq"),
    (K.direction_variance, (np.ones((3, 2)),), {"mean": np.ones(3)}, "mean"),
    (K.loss_bound_at_optima, ([0.0, 1.0],), {}, "loss_new_opt"),
    (K.loss_bound_at_optima, ([1.0, 1.0], [[1.0, 1.0, 1.0]]), {}, "client_opt_losses"),
]


@pytest.mark.parametrize("fn,args,kwargs,argname", _BAD, ids=[f"{b[0].__name__}-{i}" for i, b in enumerate(_BAD)])
def test_bad_inputs_raise_naming_the_argument(fn, args, kwargs, argname):
    with pytest.raises(ValueError, match=argname):
        fn(*args, **kwargs)


def test_with_duals_equals_the_second_lp_basis_pass():
    """LPBasis.with_duals gives what lp_basis computes from scratch with the duals (every field), on balancing
    instances with and without a basis, strict and non-strict complementarity."""
    import dataclasses

    from sim.constants import basis_duals, lp_basis
    from sim.direction import lp_direction

    rng = np.random.default_rng(11)
    seen = {"basis": 0, "no basis": 0, "strict": 0, "not strict": 0}
    for _ in range(300):
        m = int(rng.integers(2, 5))
        G = rng.standard_normal((m + 1, m))
        l = rng.uniform(0.2, 2.0, m)
        lam = rng.dirichlet(np.ones(m))
        if rng.random() < 0.3:  # two identical objectives: degenerate vertices, dependent active rows
            G[:, 1], l[1], lam[:2] = G[:, 0], l[0], lam[:2].sum() / 2
        C = G.T @ G
        res = lp_direction(l, lam, C, eps_mode=0.0)
        if str(res.mode) != "balance" or str(res.status) != "optimal":
            continue
        info = lp_basis(l, lam, C, res.weights)
        if info.is_basis:
            sd, cd, _, _ = basis_duals(info)
            dual_tol = 1e-10 if rng.random() < 0.8 else 1e3  # a huge tolerance: no strict complementarity
        else:
            sd, cd, dual_tol = rng.standard_normal(m), rng.standard_normal(m), 1e-10
        want = lp_basis(l, lam, C, res.weights, sign_duals=sd, constraint_duals=cd, dual_tol=dual_tol)
        got = info.with_duals(sd, cd, dual_tol)
        for f in dataclasses.fields(want):
            a, b = getattr(want, f.name), getattr(got, f.name)
            if isinstance(a, np.ndarray):
                np.testing.assert_array_equal(a, b, err_msg=f.name)
            else:
                assert a == b, f.name
        seen["basis" if info.is_basis else "no basis"] += 1
        seen["strict" if want.strictly_complementary else "not strict"] += 1
    assert min(seen.values()) > 0, seen


def test_client_bases_equals_client_basis_per_client():
    """The batched classification gives, for every client of a cluster, exactly what client_basis gives (every
    field, bitwise), on clusters with bases, degenerate vertices, dependent rows and descent-mode clients; its
    errors name the client."""
    import dataclasses

    from sim.constants import client_bases, client_basis
    from sim.direction import lp_direction

    rng = np.random.default_rng(5)
    seen = {"basis": 0, "no basis": 0, "dom": 0}
    for _ in range(80):
        m, N = int(rng.integers(2, 5)), int(rng.integers(1, 6))
        G = rng.standard_normal((m + 1, m))
        l = rng.uniform(0.2, 2.0, m)
        if rng.random() < 0.3:  # two identical objectives: degenerate vertices, dependent active rows
            G[:, 1], l[1] = G[:, 0], l[0]
        C = G.T @ G
        lam = rng.dirichlet(np.ones(m), size=N)
        if rng.random() < 0.3:
            lam[0] = (1 / l) / (1 / l).sum()  # on the preference ray: descent mode
        res = lp_direction(np.broadcast_to(l, (N, m)), lam, np.broadcast_to(C, (N, m, m)), eps_mode=0.0)
        got = client_bases(l, lam, C, res.weights, res.mode, dual_tol=1e-10)
        for i in range(N):
            want = client_basis(l, lam[i], C, res.weights[i], str(res.mode[i]), dual_tol=1e-10)
            assert (got[i].dual_feasible, got[i].min_dual) == (want.dual_feasible, want.min_dual)
            if want.info is None:
                assert got[i].info is None
                seen["dom"] += 1
                continue
            seen["basis" if want.info.is_basis else "no basis"] += 1
            for f in dataclasses.fields(want.info):
                a, b = getattr(want.info, f.name), getattr(got[i].info, f.name)
                if isinstance(a, np.ndarray):
                    np.testing.assert_array_equal(a, b, err_msg=f.name)
                else:
                    assert a == b, f.name
    assert min(seen.values()) > 0, seen
    l, C = np.array([1.0, 2.0]), np.eye(2)
    with pytest.raises(ValueError, match="client 1: weights must be >= 0"):
        client_bases(l, [[0.6, 0.4], [0.7, 0.3]], C, [[0.5, 0.5], [1.2, -0.2]], ["balance", "balance"])
