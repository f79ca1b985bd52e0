"""Tests of sim.problems: families F1–F6, sample-level F1/F2, F-OPT (docs/spec/problems.md#families)."""

from __future__ import annotations

import numpy as np
import pytest

from sim.hull import min_norm_element
from sim.preference import check_gram, check_preferences, preference_uniformity
from sim.problems import (
    LP_FAMILIES,
    ClientSamples,
    CommonMinimizer,
    DoubleWell,
    Kink,
    PerturbedClients,
    PlantedQuadraticCluster,
    chebyshev_optimum,
    grid_minimize_1d,
    lp_instance_family,
    random_lp_instances,
)

# ---------------------------------------------------------------------------------------------------------------
# gradients of every family vs central finite differences


def _f1():
    P = PlantedQuadraticCluster.make(np.random.default_rng(10), m=3, n_w=4, n_clients=3)
    return P.losses, P.grads, 4


def _f2_all():
    P = PerturbedClients.make(np.random.default_rng(11), m=3, n_w=3, n_clients=4, shift=0.2)
    return P.losses, P.grads, 3


def _f2_client():
    P = PerturbedClients.make(np.random.default_rng(12), m=2, n_w=5, n_clients=3, shift=0.3)
    return (lambda w: P.losses(w, 2)), (lambda w: P.grads(w, 2)), 5


def _f2_per_client():
    P = PerturbedClients.make(np.random.default_rng(13), m=3, n_w=2, n_clients=3, shift=0.2)
    # one point for all clients, broadcast over the client axis
    def lf(w):
        return P.losses_per_client(np.broadcast_to(w[..., None, :], w.shape[:-1] + (3, 2)))

    def gf(w):
        return P.grads_per_client(np.broadcast_to(w[..., None, :], w.shape[:-1] + (3, 2)))
    return lf, gf, 2


def _f3():
    F = CommonMinimizer.reference()
    return F.losses, F.grads, 4


def _f4():
    F = DoubleWell()
    return F.losses, F.grads, 1


def _f5():
    F = Kink()
    return (lambda w: F.losses(0.5 * np.tanh(w))), (lambda w: F.grads(w) * (0.5 / np.cosh(w) ** 2)[..., None]), 1


def _samples():
    rng = np.random.default_rng(14)
    S = PerturbedClients.make(rng, m=3, n_w=4, n_clients=2, shift=0.1).with_samples(rng, [6, 9], 0.1)
    idx = np.array([0, 3, 4, 8])
    return (lambda w: S.sample_losses(w, 1, idx)), (lambda w: S.sample_grads(w, 1, idx)), 4


@pytest.mark.parametrize("family", [_f1, _f2_all, _f2_client, _f2_per_client, _f3, _f4, _f5, _samples],
                         ids=["F1", "F2", "F2-client", "F2-per-client", "F3", "F4", "F5", "F2-samples"])
def test_gradients_match_central_differences(family):
    losses, grads, n_w = family()
    w = np.random.default_rng(0).uniform(-0.9, 0.9, (5, n_w))
    G = grads(w)  # (..., n_w, m)
    h = 1e-6
    fd = np.stack([(losses(w + h * e) - losses(w - h * e)) / (2 * h) for e in np.eye(n_w)], axis=-2)
    err = np.linalg.norm((fd - G).reshape(5, -1), axis=1) / np.maximum(np.linalg.norm(G.reshape(5, -1), axis=1), 1e-8)
    assert err.max() <= 1e-5


# ---------------------------------------------------------------------------------------------------------------
# F1


F1_CASES = [(2, 2, 0.0), (2, 4, 0.05), (3, 3, 0.1), (3, 6, 0.3), (4, 5, 0.01)]


@pytest.mark.parametrize("m,n_w,spread", F1_CASES)
def test_f1_planted_optimum_agrees_with_fopt(m, n_w, spread):
    P = PlantedQuadraticCluster.make(np.random.default_rng(7 * m + n_w), m=m, n_w=n_w, n_clients=2, spread=spread)
    starts = np.vstack([P.centres.mean(0), P.centres])
    for i in range(P.n_clients):
        res = chebyshev_optimum(*P.loss_fn(i), P.prefs[i], starts)
        assert res.certified and res.kkt_norm <= 1e-7
        assert np.linalg.norm(res.w - P.w_star[i]) <= 1e-7
        assert res.psi == pytest.approx(P.psi_star[i], abs=1e-12)
        assert res.active.all()  # planted optimum lies on the ray: every objective active


@pytest.mark.parametrize("m,n_w,spread", F1_CASES)
def test_f1_planted_structure(m, n_w, spread):
    rng = np.random.default_rng(m + 10 * n_w)
    P = PlantedQuadraticCluster.make(rng, m=m, n_w=n_w, n_clients=4, spread=spread)
    l_star = P.losses(P.w_star)
    np.testing.assert_allclose(preference_uniformity(l_star, P.prefs), 0.0, atol=1e-12)
    np.testing.assert_allclose(P.q_star, l_star, rtol=1e-13)
    np.testing.assert_allclose(P.prefs * l_star, P.psi_star[:, None] * np.ones(m), rtol=1e-13)
    # stationarity of Σ u_j l_j at w* (docs/spec/identities.md#s26)
    np.testing.assert_allclose(np.einsum("inj,ij->in", P.grads(P.w_star), P.mixing), 0.0, atol=1e-12)
    check_preferences(P.prefs)
    # L0 and the quadratic-growth constant μ_i: ψ_i(w) - ψ_i* ≥ (μ_i/2)‖w - w_i*‖²
    assert P.L0 == pytest.approx(max(np.linalg.norm(Q, 2) for Q in P.hessians), rel=1e-12)
    w = P.w_star[None] + rng.standard_normal((200, P.n_clients, n_w)) * rng.uniform(0.01, 2, (200, 1, 1))
    psi = np.stack([P.chebyshev(w[:, i], i) for i in range(P.n_clients)], axis=-1)
    gap = psi - P.psi_star
    assert np.all(gap >= 0.5 * P.mu_qg * np.sum((w - P.w_star) ** 2, -1) * (1 - 1e-10))
    # identical clients when the spread is zero
    if spread == 0.0:
        np.testing.assert_allclose(P.prefs, P.prefs[:1].repeat(4, 0), rtol=1e-14)
    # gradient bound on a ball
    B = P.gradient_bound(P.w_star[0], 1.0)
    xi = rng.standard_normal((500, n_w))
    pts = P.w_star[0] + rng.uniform(0, 1, (500, 1)) * xi / np.linalg.norm(xi, axis=-1, keepdims=True)
    assert np.linalg.norm(P.grads(pts), axis=-2).max() <= B


def test_f1_new_client_and_batched_chebyshev():
    rng = np.random.default_rng(20)
    P = PlantedQuadraticCluster.make(rng, m=3, n_w=4, n_clients=3)
    u, lam, w_star, psi = P.new_client(rng)
    np.testing.assert_allclose(lam * P.losses(w_star), psi, rtol=1e-13)
    w = rng.standard_normal((6, 2, 4))
    assert P.chebyshev(w).shape == (6, 2, 3) and P.beta(w, 1).shape == (6, 2)
    np.testing.assert_allclose(P.chebyshev(w)[..., 1], P.chebyshev(w, 1))
    np.testing.assert_allclose(P.gram(w), np.swapaxes(P.grads(w), -1, -2) @ P.grads(w), rtol=1e-13)


# ---------------------------------------------------------------------------------------------------------------
# F2


@pytest.mark.parametrize("shift", [0.0, 0.02, 0.2, 0.3])
def test_f2_delta_g_exact_and_planted(shift):
    rng = np.random.default_rng(int(100 * shift) + 1)
    P = PerturbedClients.make(rng, m=3, n_w=4, n_clients=4, shift=shift)
    rho = np.array([0.1, 0.2, 0.3, 0.4])
    for w in rng.standard_normal((3, 4)):
        G = P.grads(w)  # (N, n_w, m)
        norms = np.linalg.norm(G[:, None] - G[None, :], axis=-2)  # (N, N, m)
        assert P.delta_g(rho) == pytest.approx(np.einsum("k,ikj->ij", rho, norms).max(), rel=1e-9, abs=1e-14)
        assert P.delta_g_max() == pytest.approx(norms.max(), rel=1e-9, abs=1e-14)
    if shift == 0.0:
        assert P.delta_g() == 0.0
    # planted per-client optima (client's own centres) agree with F-OPT
    solved = P.solve_optima(clients=range(P.n_clients))
    np.testing.assert_allclose(solved.w_star, P.w_star, atol=1e-7)
    np.testing.assert_allclose(preference_uniformity(P.losses_per_client(P.w_star), P.prefs), 0.0, atol=1e-12)


def test_f2_uniform_client_and_random_prefs():
    rng = np.random.default_rng(21)
    P = PerturbedClients.make(rng, m=3, n_w=3, n_clients=3, shift=0.2, prefs="random")
    assert not P.known_optimum.any()
    with pytest.raises(ValueError):
        P.optimum(0)
    S = P.solve_optima()
    for i in range(3):
        w, psi = S.optimum(i)
        # no point of a small ball does better
        pts = w + 1e-3 * rng.standard_normal((500, 3))
        assert np.all(S.chebyshev(pts, i) >= psi - 1e-12)
    w0 = rng.standard_normal(3)
    U = S.with_uniform_client(1, w0)
    assert U.beta(w0, 1) == pytest.approx(0.0, abs=1e-12)
    assert list(U.known_optimum) == [True, False, True]
    assert P.losses(rng.standard_normal((5, 3))).shape == (5, 3, 3)
    assert P.grads(w0).shape == (3, 3, 3) and P.gram(w0, 2).shape == (3, 3)


# ---------------------------------------------------------------------------------------------------------------
# sample level


@pytest.mark.parametrize("kind", ["F1", "F2"])
def test_sample_level_means_equal_population(kind):
    rng = np.random.default_rng(22)
    if kind == "F1":
        P = PlantedQuadraticCluster.make(rng, m=3, n_w=4, n_clients=3)
    else:
        P = PerturbedClients.make(rng, m=3, n_w=4, n_clients=3, shift=0.2)
    S = ClientSamples.make(rng, P, [5, 12, 40], noise_scale=0.15)
    np.testing.assert_array_equal(S.n_samples, [5, 12, 40])
    w = rng.standard_normal((8, 4))
    for i in range(3):
        pop = P.losses(w, i)
        np.testing.assert_allclose(S.sample_losses(w, i), pop, atol=1e-12, rtol=0)
        np.testing.assert_allclose(S.sample_grads(w, i), P.grads(w, i), atol=1e-12, rtol=0)
        per = S.per_sample_losses(w, i)
        np.testing.assert_allclose(per.mean(axis=-2), pop, atol=1e-12, rtol=0)
        assert np.all(per > 0)
        idx = S.episode(rng, i, 3)
        np.testing.assert_allclose(S.sample_losses(w, i, idx), per[:, idx].mean(axis=-2), atol=1e-12, rtol=0)
        # batched episodes (B, S) against points (B, n_w)
        idxs = np.stack([S.episode(rng, i, 3) for _ in range(8)])
        np.testing.assert_allclose(S.sample_losses(w, i, idxs), np.stack([per[b, idxs[b]].mean(0) for b in range(8)]),
                                   atol=1e-12, rtol=0)
        np.testing.assert_allclose(S.kappa[i], 0.5 * np.einsum("jab,jba->j", P.hessians, S.noise_covariance(i)),
                                   rtol=1e-12)
    with pytest.raises(ValueError):
        ClientSamples.make(rng, P, 5, noise_scale=10.0)  # sample losses could be <= 0
    with pytest.raises(ValueError):
        S.sample_losses(w, 0, np.array([0, 5]))  # index out of range for client 0 (5 samples)


# ---------------------------------------------------------------------------------------------------------------
# F3


def test_f3_exact_constants():
    F = CommonMinimizer.reference()
    rng = np.random.default_rng(23)
    w = F.centre + rng.standard_normal((300, 4))
    q = 0.5 * np.einsum("ba,ac,bc->b", w - F.centre, F.hessian, w - F.centre)
    np.testing.assert_allclose(F.chebyshev(w), F.t + F.lam_star * q, rtol=1e-14)
    assert np.all(np.argmax(F.prefs * F.losses(w), -1) == F.j_star)
    assert F.chebyshev(F.w_star) == F.psi_star == 1.0 and F.beta(F.w_star) == pytest.approx(0.0, abs=1e-15)
    assert F.L0 == pytest.approx(0.5 * 3.0) and F.mu_pl == pytest.approx(0.5 * 0.5)
    assert F.sigma0_sq == pytest.approx(0.25 * 4.5)
    # PL inequality ‖∇ψ‖² ≥ 2 μ_PL (ψ - ψ*)
    assert np.all(np.sum(F.direction(w) ** 2, -1) >= 2 * F.mu_pl * (F.chebyshev(w) - F.t) * (1 - 1e-12))
    # per-sample variance of d̃ (S = 1) is σ0²
    d = F.sample_direction(rng, np.broadcast_to(F.w0, (40000, 4)), 1)
    var = np.mean(np.sum((d - F.direction(F.w0)) ** 2, -1))
    assert var == pytest.approx(F.sigma0_sq, rel=0.03)
    # an explicit batch of S = 4 samples has variance σ0²/4
    d = F.sample_direction(rng, np.broadcast_to(F.w0, (20000, 4)), 4, explicit_batch=True)
    assert np.mean(np.sum((d - F.direction(F.w0)) ** 2, -1)) == pytest.approx(F.sigma0_sq / 4, rel=0.04)


@pytest.mark.parametrize("precond", ["identity", "fixed", "varying"])
def test_f3_moment_recursion_matches_monte_carlo(precond):
    F = CommonMinimizer.reference()
    K, alpha, S, N = 30, 0.2, 3, 20000
    rng = np.random.default_rng(24)
    if precond == "identity":
        P = None
    elif precond == "fixed":
        P = np.diag([0.5, 1.0, 1.5, 2.0])
    else:
        P = np.stack([np.eye(4) * (1.0 + 0.5 * np.sin(k)) for k in range(K)])
    exact = F.expected_gap(alpha, S, K, P)
    mean, M = F.moment_recursion(alpha, S, K, P)
    np.testing.assert_allclose(exact, 0.5 * F.lam_star * np.einsum("ab,kba->k", F.hessian, M))
    assert exact[0] == pytest.approx(F.chebyshev(F.w0) - F.t, rel=1e-14)
    wK, gaps = F.simulate(rng, alpha, S, K, N, P)
    se = gaps.std(axis=1) / np.sqrt(N)
    for k in (1, 5, 15, 30):
        assert abs(gaps[k].mean() - exact[k]) <= 5 * se[k] + 1e-12
    e = wK - F.centre
    assert np.all(np.abs(e.mean(0) - mean[-1]) <= 5 * e.std(0) / np.sqrt(N))


# ---------------------------------------------------------------------------------------------------------------
# F4, F5


def test_f4_double_well_golden_values():
    mins = DoubleWell().minima()
    assert mins.global_w == pytest.approx(-1.0299, abs=5e-5)
    assert mins.global_value == pytest.approx(1.246209, abs=1e-6)
    assert mins.w.size == 2 and not mins.on_boundary.any()
    # spurious local minimum; docs/spec/problems.md#families prints w ≈ 0.9676, but l'(0.9676) = 3.3e-3 ≠ 0:
    # the root of l'(w) = 4w³ - 4w + 1/4 is w = 0.967149 (the printed value l ≈ 1.745964 is right).
    assert mins.w[1] == pytest.approx(0.967149, abs=1e-6)
    assert mins.values[1] == pytest.approx(1.745964, abs=1e-6)
    assert abs(DoubleWell().grads(np.array([mins.w[1]]))[0, 0]) <= 1e-6


def test_f5_kink():
    F = Kink()
    w = np.linspace(-0.99, 0.99, 199)[:, None]
    np.testing.assert_allclose(F.chebyshev(w), (1 + np.abs(w[:, 0])) / 2, rtol=1e-15)
    assert F.chebyshev(np.zeros(1)) == F.psi_star
    res = chebyshev_optimum(F.losses, F.grads, F.prefs, np.array([[0.3], [-0.5]]))
    assert res.certified and abs(res.w[0]) <= 1e-9 and res.psi == pytest.approx(0.5, abs=1e-12)
    assert res.active.all()
    with pytest.raises(ValueError):
        F.losses(np.array([1.0]))


def test_grid_minimize_1d_on_a_cubic_polynomial():
    mins = grid_minimize_1d(lambda x: (x - 0.3) ** 2 * (x + 1.0) ** 2 + 0.1 * x, -2.0, 2.0, 40001)
    assert mins.w.size == 2
    for x in mins.w:
        assert abs(2 * (x - 0.3) * (x + 1) ** 2 + 2 * (x - 0.3) ** 2 * (x + 1) + 0.1) <= 1e-6


# ---------------------------------------------------------------------------------------------------------------
# F6 / LP instance families


@pytest.mark.parametrize("m", [2, 3, 5])
@pytest.mark.parametrize("name", LP_FAMILIES)
def test_lp_instance_families_valid(name, m):
    rng = np.random.default_rng(m)
    l, lam, G, C = lp_instance_family(name, rng, 300, m)
    assert l.shape == (300, m) and lam.shape == (300, m) and G.shape[0] == 300 and G.shape[-1] == m
    assert C.shape == (300, m, m) and l.dtype == np.float64
    assert np.all(np.isfinite(l)) and np.all(l > 0)
    check_preferences(lam)
    check_gram(C)
    np.testing.assert_allclose(C, np.swapaxes(G, -1, -2) @ G, rtol=1e-12, atol=1e-12 * np.abs(C).max())
    np.testing.assert_array_equal(C, np.swapaxes(C, -1, -2))
    norms = np.linalg.norm(G, axis=-2)
    if name == "rank_deficient":
        assert np.all(np.linalg.matrix_rank(G) < m)
        np.testing.assert_allclose(norms.min(-1), 1e-3, rtol=1e-12)
        np.testing.assert_allclose(norms.max(-1), 1e3, rtol=1e-12)
    if name == "ray_edge":
        from sim.preference import log_spread

        spread = log_spread(l, lam)
        assert spread.min() >= 0.9e-13 and spread.max() <= 1.1e-7, (spread.min(), spread.max())
        assert spread.min() < 1e-12 < 1e-9 < spread.max()
    if name == "conflicting":
        cos = np.swapaxes(G, -1, -2) @ G / (norms[:, :, None] * norms[:, None, :])
        off = ~np.eye(m, dtype=bool)
        assert np.all(cos[:, off] < 0)
        assert np.all(norms.max(-1) / norms.min(-1) > 1.0)
    if name == "near_stationary":
        # close to a planted ray point: nearly uniform and 0 almost in the hull of {λ_j g_j}
        assert np.all(preference_uniformity(l, lam) <= 1e-3)
        assert np.all(min_norm_element(G * lam[:, None, :]).norm <= 0.05)


def test_random_lp_instances():
    rng = np.random.default_rng(30)
    l, lam, G, C = random_lp_instances(rng, 200)
    m = l.shape[1]
    assert 2 <= m <= 6 and G.shape == (200, 6, m)
    assert np.all(l > 0)
    check_preferences(lam)
    np.testing.assert_allclose(C, np.swapaxes(G, -1, -2) @ G, rtol=1e-12, atol=1e-12)
    out = random_lp_instances(rng, 50, 3, n_w=2)
    assert out.grads.shape == (50, 2, 3) and out.losses.shape == (50, 3)


# ---------------------------------------------------------------------------------------------------------------
# bad inputs


_RNG = np.random.default_rng(0)


@pytest.mark.parametrize(
    "call",
    [
        lambda: PlantedQuadraticCluster.make(_RNG, m=0),
        lambda: PlantedQuadraticCluster.make(_RNG, n_w=2.5),
        lambda: PlantedQuadraticCluster.make(_RNG, spread=-0.1),
        lambda: PlantedQuadraticCluster.make(42),
        lambda: PlantedQuadraticCluster.make(_RNG, b_min=0.0),
        lambda: PlantedQuadraticCluster.make(_RNG, kappa_Q=0.5),
        lambda: PlantedQuadraticCluster.make(_RNG, m=2, n_w=3).losses(np.ones(2)),
        lambda: PlantedQuadraticCluster.make(_RNG, m=2, n_w=3).losses(np.array([1.0, np.nan, 0.0])),
        lambda: PlantedQuadraticCluster.make(_RNG, m=2, n_w=3, n_clients=2).chebyshev(np.ones(3), 5),
        lambda: PerturbedClients.make(_RNG, prefs="uniform"),
        lambda: PerturbedClients.make(_RNG, shift=np.inf),
        lambda: PerturbedClients.make(_RNG, n_clients=2).delta_g(np.array([0.5, 0.6])),
        lambda: PerturbedClients.make(_RNG, n_clients=2).with_prefs(np.ones((2, 3))),
        lambda: ClientSamples.make(_RNG, PerturbedClients.make(_RNG, n_clients=2), 1),
        lambda: ClientSamples.make(_RNG, PerturbedClients.make(_RNG, n_clients=2), [3, 4, 5]),
        lambda: ClientSamples.make(_RNG, "F1", 3),
        lambda: CommonMinimizer.reference().expected_gap(-0.1, 1, 5),
        lambda: CommonMinimizer.reference().expected_gap(0.1, 0, 5),
        lambda: CommonMinimizer.reference().expected_gap(0.1, 1, 5, preconditioner=-np.eye(4)),
        lambda: CommonMinimizer.reference().expected_gap(0.1, 1, 5, preconditioner=np.stack([np.eye(4)] * 3)),
        lambda: CommonMinimizer.make(_RNG, prefs=(0.4, 0.4, 0.2)),
        lambda: DoubleWell(offset=-1.0),
        lambda: Kink().losses(np.array([[0.5], [-1.5]])),
        lambda: chebyshev_optimum(lambda w: w, lambda w: np.eye(2), [0.5, 0.6], np.zeros(2)),
        lambda: chebyshev_optimum(lambda w: w, lambda w: np.eye(2), [0.5, 0.5], np.array([[np.nan, 0.0]])),
        lambda: grid_minimize_1d(np.sin, 1.0, 0.0),
        lambda: lp_instance_family("uniform", _RNG, 10, 3),
        lambda: lp_instance_family("gaussian", _RNG, 0, 3),
        lambda: lp_instance_family("rank_deficient", _RNG, 10, 1),
        lambda: lp_instance_family("conflicting", _RNG, 10, 4, n_w=3),
    ],
)
def test_bad_inputs_raise(call):
    with pytest.raises(ValueError):
        call()


def test_with_min_entry_sets_the_smallest_entry_and_keeps_the_simplex():
    from sim.problems import with_min_entry

    p = np.array([[0.2, 0.5, 0.3], [0.6, 0.1, 0.3]])
    q = with_min_entry(p, 1e-13)
    assert q[0, 0] == 1e-13 and q[1, 1] == 1e-13
    np.testing.assert_allclose(q.sum(axis=-1), 1.0, rtol=0, atol=1e-15)
    np.testing.assert_allclose(q[0, 1:] / q[0, 1:].sum(), p[0, 1:] / p[0, 1:].sum(), rtol=1e-15)
    with pytest.raises(ValueError, match="lambda_min must lie in"):
        with_min_entry(p, 0.5)
