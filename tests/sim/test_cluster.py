"""Tests of sim.cluster: aggregation, dispersion (eq 9, Cor. H.14), mixed blocks (eq 43-45), δ_g (eq 40),
Stage-1 / Stage-2 clustering (docs/spec/algorithm.md#algorithm, docs/spec/open-points.md#o-17)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from sim import cluster as cl
from sim.preference import adjustment
from tests.error_patterns import float_value

# ------------------------------------------------------------------------------------------ aggregation


def test_aggregation_weights_uniform_and_proportional():
    np.testing.assert_allclose(cl.aggregation_weights(N=4), np.full(4, 0.25), rtol=0, atol=0)
    rho = cl.aggregation_weights(n_samples=[10, 30, 60])
    np.testing.assert_allclose(rho, [0.1, 0.3, 0.6], rtol=1e-15)
    assert rho.dtype == np.float64
    np.testing.assert_allclose(cl.aggregation_weights(n_samples=[2, 2], N=2), [0.5, 0.5])
    cl.check_aggregation_weights(rho)


def _random_instance(rng, N, n_w, m):
    G = rng.normal(size=(n_w, m))
    mu = rng.dirichlet(np.ones(m), size=N)
    rho = rng.dirichlet(np.full(N, 5.0))
    return G, mu, rho


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("N,n_w,m", [(1, 3, 2), (4, 5, 3), (9, 6, 5), (6, 2, 4)])
def test_eq9_dispersion_identity(seed, N, n_w, m):
    """eq 9: Σρ_i‖d_i − d̄‖² = Σρ_i(μ_i − μ̄)ᵀC(μ_i − μ̄) with d_i = Gμ_i, C = GᵀG (H.5)."""
    rng = np.random.default_rng(seed)
    G, mu, rho = _random_instance(rng, N, n_w, m)
    d = mu @ G.T
    H = cl.dispersion(d, rho)
    H9 = cl.dispersion_from_weights(mu, G.T @ G, rho)
    assert abs(H - H9) <= 1e-12 * max(1.0, abs(H))
    # shared direction equals G μ̄
    np.testing.assert_allclose(cl.shared_direction(d, rho), G @ (rho @ mu), rtol=1e-12, atol=1e-14)


def test_eq9_batched_with_per_instance_gram():
    rng = np.random.default_rng(7)
    B, N, n_w, m = 50, 5, 4, 3
    G = rng.normal(size=(B, n_w, m))
    mu = rng.dirichlet(np.ones(m), size=(B, N))
    rho = rng.dirichlet(np.ones(N), size=B)
    d = np.einsum("bkj,bij->bik", G, mu)
    H = cl.dispersion(d, rho)
    H9 = cl.dispersion_from_weights(mu, np.einsum("bkj,bkl->bjl", G, G), rho)
    assert H.shape == (B,)
    np.testing.assert_allclose(H, H9, rtol=1e-12, atol=1e-15)
    # batched deviations agree with the per-instance call
    D = cl.deviations(d, rho)
    np.testing.assert_allclose(D[3], cl.deviations(d[3], rho[3]), rtol=1e-15)


@pytest.mark.parametrize("seed", [0, 1])
def test_corollary_h14_deviation_bound(seed):
    """Cor. H.14: Δ_i ≤ √(H/ρ_i) ≤ √(H/ρ_min); the negative control Δ_i ≤ √H fails often."""
    rng = np.random.default_rng(seed)
    B, N, n_w = 1000, 5, 3
    d = rng.normal(size=(B, N, n_w))
    rho = rng.dirichlet(np.full(N, 0.5), size=B)
    H = cl.dispersion(d, rho)
    D = cl.deviations(d, rho)
    bound_i = np.sqrt(H[:, None] / rho)
    bound_min = np.sqrt(H / rho.min(axis=1))
    assert np.all(D <= bound_i * (1 + 1e-12) + 1e-15)
    assert np.all(bound_i <= bound_min[:, None] * (1 + 1e-12))
    # negative control (T-H14(e)): dropping 1/ρ breaks it in most instances
    assert np.mean(np.any(D > np.sqrt(H)[:, None], axis=1)) > 0.5


@pytest.mark.parametrize("seed", [3, 4])
def test_permuting_clients_permutes_deviations(seed):
    rng = np.random.default_rng(seed)
    N, n_w = 7, 4
    d = rng.normal(size=(N, n_w))
    rho = rng.dirichlet(np.ones(N))
    perm = rng.permutation(N)
    np.testing.assert_allclose(cl.deviations(d[perm], rho[perm]), cl.deviations(d, rho)[perm], rtol=1e-13)
    assert cl.dispersion(d[perm], rho[perm]) == pytest.approx(cl.dispersion(d, rho), rel=1e-13)
    np.testing.assert_allclose(cl.shared_direction(d[perm], rho[perm]), cl.shared_direction(d, rho),
                               rtol=1e-13, atol=1e-15)


def test_single_client_has_zero_dispersion():
    d = np.array([[1.0, -2.0, 0.5]])
    assert cl.dispersion(d, [1.0]) == 0.0
    np.testing.assert_array_equal(cl.deviations(d, [1.0]), [0.0])


# -------------------------------------------------------------------------------------- mixed clusters


@pytest.mark.parametrize("seed", range(4))
def test_mixed_blocks_blend_and_eq44_eq45(seed):
    rng = np.random.default_rng(seed)
    N, n_w = 6, 4
    d = rng.normal(size=(N, n_w))
    dbal = rng.normal(size=(N, n_w))
    rho = rng.dirichlet(np.full(N, 2.0))
    mask = rng.random(N) < 0.5
    mask[0], mask[1] = True, False  # both blocks non-empty
    blk = cl.mixed_cluster_blocks(d, dbal, rho, mask)
    assert blk.rho_plus + blk.rho_zero == pytest.approx(1.0, abs=1e-15)
    dbar = cl.shared_direction(d, rho)
    np.testing.assert_allclose(blk.rho_plus * blk.dbar_plus + blk.rho_zero * blk.dbar_zero, dbar,
                               rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(blk.dbar, dbar, rtol=1e-13, atol=1e-15)
    # eq 44 (identity) and eq 45 (bound)
    lhs = dbar[None, :] - d
    rhs = blk.rho_plus * (blk.dbar_plus[None, :] - d) + blk.rho_zero * (blk.dbar_zero[None, :] - d)
    assert np.max(np.abs(lhs - rhs)) <= 1e-12
    assert np.all(cl.deviations(d, rho) <= blk.deviation_bound + 1e-12)
    Dp = sum(rho[i] * np.linalg.norm(dbal[i]) for i in range(N) if mask[i]) / rho[mask].sum()
    assert blk.D_bal_plus == pytest.approx(Dp, rel=1e-13)
    assert (blk.n_plus, blk.n_zero) == (mask.sum(), (~mask).sum())
    assert not blk.plus_empty and not blk.zero_empty


@pytest.mark.parametrize("all_balancing", [True, False])
def test_mixed_blocks_empty_block(all_balancing):
    rng = np.random.default_rng(11)
    d = rng.normal(size=(3, 2))
    dbal = rng.normal(size=(3, 2))
    rho = np.array([0.2, 0.3, 0.5])
    blk = cl.mixed_cluster_blocks(d, dbal, rho, np.full(3, all_balancing))
    dbar = rho @ d
    if all_balancing:
        assert blk.zero_empty and not blk.plus_empty and blk.rho_zero == 0.0
        np.testing.assert_array_equal(blk.dbar_zero, np.zeros(2))
        np.testing.assert_allclose(blk.dbar_plus, dbar, rtol=1e-14)
        assert blk.D_bal_plus > 0.0
    else:
        assert blk.plus_empty and not blk.zero_empty and blk.rho_plus == 0.0
        np.testing.assert_array_equal(blk.dbar_plus, np.zeros(2))
        assert blk.D_bal_plus == 0.0
    for arr in (blk.dbar_plus, blk.dbar_zero, blk.dist_plus, blk.dist_zero, blk.deviation_bound):
        assert np.all(np.isfinite(arr))
    np.testing.assert_allclose(blk.rho_plus * blk.dbar_plus + blk.rho_zero * blk.dbar_zero, dbar, rtol=1e-14)


# ------------------------------------------------------------------------------ gradient dissimilarity


@pytest.mark.parametrize("seed", range(3))
def test_delta_g_bounded_by_max_and_zero_when_shared(seed):
    rng = np.random.default_rng(seed)
    N, n_w, m = 5, 4, 3
    g = rng.normal(size=(N, n_w, m))
    rho = rng.dirichlet(np.ones(N))
    dg = cl.gradient_dissimilarity(g, rho)
    dgm = cl.gradient_dissimilarity_max(g)
    assert 0.0 < dg <= dgm * (1 + 1e-15)
    brute = max(
        sum(rho[k] * np.linalg.norm(g[i, :, j] - g[k, :, j]) for k in range(N)) for i in range(N) for j in range(m)
    )
    assert dg == pytest.approx(brute, rel=1e-13)
    shared = np.broadcast_to(g[0], g.shape)
    assert cl.gradient_dissimilarity(shared, rho) == 0.0
    assert cl.gradient_dissimilarity_max(shared) == 0.0


def test_delta_g_exact_and_constant_for_shifted_quadratics():
    """F2: g_i^{(j)} − g_{i'}^{(j)} = −Q_j(e_ij − e_i'j), so δ_g does not depend on w
    (docs/spec/constants.md#constants)."""
    rng = np.random.default_rng(5)
    N, n_w, m = 4, 3, 2
    Q = np.stack([(lambda a: a @ a.T + np.eye(n_w))(rng.normal(size=(n_w, n_w))) for _ in range(m)])
    c = rng.normal(size=(m, n_w))
    e = 0.2 * rng.normal(size=(N, m, n_w))
    rho = rng.dirichlet(np.ones(N))

    def grads(w):
        return np.stack([np.stack([Q[j] @ (w - c[j] - e[i, j]) for j in range(m)], axis=1) for i in range(N)])

    vals = [cl.gradient_dissimilarity(grads(rng.normal(size=n_w)), rho) for _ in range(3)]
    np.testing.assert_allclose(vals, vals[0], rtol=1e-12)
    exact = max(
        sum(rho[k] * np.linalg.norm(Q[j] @ (e[i, j] - e[k, j])) for k in range(N)) for i in range(N) for j in range(m)
    )
    assert vals[0] == pytest.approx(exact, rel=1e-12)


# ------------------------------------------------------------------------------------------ clustering


def _constructed_clients(rng, centers_by_group, per_cluster=3, jitter=0.004):
    """Clients whose weighted losses λ_i ⊙ l_i are proportional to a jittered target t (ordering preserved)."""
    losses, prefs, truth = [], [], []
    for t in centers_by_group:
        t = np.asarray(t, dtype=float)
        idx = []
        for _ in range(per_cluster):
            target = t + jitter * rng.uniform(-1, 1, size=t.size)
            l = np.exp(rng.uniform(-0.02, 0.02, size=t.size)) * 1.5
            lam = target / l
            lam /= lam.sum()
            idx.append(len(losses))
            losses.append(l)
            prefs.append(lam)
        truth.append(idx)
    return np.array(losses), np.array(prefs), truth


def _partition(labels):
    return {frozenset(np.flatnonzero(labels == c).tolist()) for c in np.unique(labels)}


# two Stage-1 groups (orderings (0,1,2) and (2,1,0)); within each two well-separated A-clusters
_CENTERS = [(0.45, 0.33, 0.22), (0.72, 0.18, 0.10), (0.22, 0.33, 0.45), (0.10, 0.18, 0.72)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_stage1_and_stage2_recover_constructed_groups(seed):
    rng = np.random.default_rng(seed)
    l, lam, truth = _constructed_clients(rng, _CENTERS)
    perm = rng.permutation(l.shape[0])  # shuffle the clients
    l, lam = l[perm], lam[perm]
    inv = np.argsort(perm)
    truth = [sorted(int(inv[i]) for i in g) for g in truth]

    s1, keys = cl.stage1_groups(l, lam)
    assert set(keys) == {(0, 1, 2), (2, 1, 0)}
    assert _partition(s1) == {frozenset(truth[0] + truth[1]), frozenset(truth[2] + truth[3])}
    assert s1[0] == 0  # numbered by first appearance

    A = adjustment(l, lam)
    intra = max(np.linalg.norm(A[i] - A[k]) for g in truth for i in g for k in g)
    inter = min(np.linalg.norm(A[i] - A[k]) for a in (0, 2) for i in truth[a] for k in truth[a + 1])
    assert intra < inter / 3  # the construction is well separated
    thr = 0.5 * (intra + inter)
    expected = {frozenset(g) for g in truth}

    res = cl.cluster_clients(l, lam, threshold=thr)
    assert _partition(res.labels) == expected
    assert res.n_clusters == 4
    assert sorted(np.concatenate(res.clusters).tolist()) == list(range(l.shape[0]))
    np.testing.assert_array_equal(res.stage1_labels, s1)
    np.testing.assert_allclose(res.adjustments_ref, A, rtol=1e-15)
    assert res.keys.shape == (l.shape[0], 3)
    assert res.labels[0] == 0

    km = cl.cluster_clients(l, lam, method="kmeans", k=2, rng=np.random.default_rng(99))
    assert _partition(km.labels) == expected
    km2 = cl.cluster_clients(l, lam, method="kmeans", k=2, rng=np.random.default_rng(99))
    np.testing.assert_array_equal(km.labels, km2.labels)  # deterministic given rng

    cc = cl.cluster_clients(l, lam, k=2)  # complete linkage cut into k clusters per group
    assert _partition(cc.labels) == expected
    only1 = cl.cluster_clients(l, lam, stage2=False)
    assert _partition(only1.labels) == _partition(s1)


def test_bottleneck_key_merges_orderings_with_same_bottleneck():
    rng = np.random.default_rng(4)
    l, lam, truth = _constructed_clients(rng, [(0.5, 0.3, 0.2), (0.5, 0.2, 0.3)], per_cluster=2)
    full, _ = cl.stage1_groups(l, lam, key="ordering")
    bott, keys = cl.stage1_groups(l, lam, key="bottleneck")
    assert _partition(full) == {frozenset(g) for g in truth}
    assert _partition(bott) == {frozenset(range(4))} and keys == ((0,),)
    assert cl.stage1_keys(l, lam, key="bottleneck").shape == (4, 1)


def test_stage1_exact_ties_ordered_by_index():
    l = np.ones((2, 3))
    lam = np.array([[0.4, 0.4, 0.2], [0.2, 0.4, 0.4]])
    np.testing.assert_array_equal(cl.stage1_keys(l, lam), [[0, 1, 2], [1, 2, 0]])
    np.testing.assert_array_equal(cl.stage1_keys(l, lam, key="bottleneck"), [[0], [1]])


@pytest.mark.parametrize("seed", range(3))
def test_complete_linkage_threshold_bounds_cluster_diameter(seed):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(15, 3))
    for thr in (0.5, 1.0, 2.0, 4.0):
        labels = cl.stage2_split(X, threshold=thr)
        for c in np.unique(labels):
            P = X[labels == c]
            diam = max(np.linalg.norm(a - b) for a in P for b in P)
            assert diam <= thr + 1e-12
    assert np.all(cl.stage2_split(X, threshold=0.0) == np.arange(15))
    assert np.all(cl.stage2_split(X, threshold=1e6) == 0)
    np.testing.assert_array_equal(cl.stage2_split(X[:1], threshold=1.0), [0])


def test_kmeans_is_deterministic_given_rng():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(20, 2))
    a = cl.stage2_split(X, method="kmeans", k=3, rng=np.random.default_rng(5))
    b = cl.stage2_split(X, method="kmeans", k=3, rng=np.random.default_rng(5))
    np.testing.assert_array_equal(a, b)
    assert set(a.tolist()) == {0, 1, 2}
    assert np.all(cl.stage2_split(X, method="kmeans", k=1, rng=np.random.default_rng(1)) == 0)


def _inertia(X, labels):
    return sum(float(((X[labels == c] - X[labels == c].mean(axis=0)) ** 2).sum()) for c in np.unique(labels))


_STAGE2_OPTIONS = [
    {"threshold": 0.0},
    {"threshold": 0.15},
    {"threshold": 1e6},
    {"k": 1},
    {"k": 2},
    {"k": 3},
    {"method": "kmeans", "k": 2},
    {"method": "kmeans", "k": 4},
]


@pytest.mark.parametrize("opts", _STAGE2_OPTIONS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
@pytest.mark.parametrize("seed", [0, 1])
def test_stage2_splits_each_stage1_group_on_its_own(seed, opts):
    """A final cluster never spans two Stage-1 groups (labels [0,0,1,1,2,2] may not become [0,0,1,1,0,0]), and
    inside a group it is exactly the Stage-2 split of that group alone; groups are taken in Stage-1 label order,
    so one rng replays k-means group by group."""
    rng = np.random.default_rng(seed)
    N = 40
    l = rng.uniform(0.5, 2.0, size=(N, 3))
    lam = rng.dirichlet(np.ones(3), size=N)
    kmeans = opts.get("method") == "kmeans"
    res = cl.cluster_clients(l, lam, rng=np.random.default_rng(100 + seed) if kmeans else None, **opts)
    s1, _ = cl.stage1_groups(l, lam)
    assert int(s1.max()) >= 3  # several groups of different sizes: the construction exercises the numbering
    assert sorted(np.concatenate(res.clusters).tolist()) == list(range(N))
    for c in res.clusters:
        assert len(set(s1[c].tolist())) == 1, f"cluster {c.tolist()} spans Stage-1 groups {set(s1[c].tolist())}"
    replay = np.random.default_rng(100 + seed) if kmeans else None
    A = adjustment(l, lam)
    n_expected = 0
    for g in range(int(s1.max()) + 1):
        idx = np.flatnonzero(s1 == g)
        kk = None if "k" not in opts else min(opts["k"], idx.size)
        alone = cl.stage2_split(A[idx], method=opts.get("method", "complete"), threshold=opts.get("threshold"),
                                k=kk, rng=replay)
        assert _partition(res.labels[idx]) == _partition(alone)
        n_expected += len(np.unique(alone))
    assert res.n_clusters == n_expected
    if opts.get("threshold") == 1e6:
        assert _partition(res.labels) == _partition(s1)


def test_cluster_labels_are_numbered_by_first_appearance():
    rng = np.random.default_rng(3)
    l = rng.uniform(0.5, 2.0, size=(30, 3))
    lam = rng.dirichlet(np.ones(3), size=30)
    res = cl.cluster_clients(l, lam, threshold=0.1)
    first = [int(np.flatnonzero(res.labels == c)[0]) for c in range(res.n_clusters)]
    assert first == sorted(first) and res.labels[0] == 0
    for c, members in enumerate(res.clusters):
        np.testing.assert_array_equal(members, np.flatnonzero(res.labels == c))
        assert not members.flags.writeable


@pytest.mark.parametrize("method", ["complete", "kmeans"])
def test_k_equal_to_number_of_clients_gives_singletons(method):
    """Boundary k == N: every client alone (distinct points); one client with k == 1 likewise."""
    X = np.random.default_rng(8).normal(size=(7, 3))
    rng = np.random.default_rng(0) if method == "kmeans" else None
    np.testing.assert_array_equal(cl.stage2_split(X, method=method, k=7, rng=rng), np.arange(7))
    np.testing.assert_array_equal(cl.stage2_split(X[:1], method=method, k=1, rng=rng), [0])
    l = np.random.default_rng(1).uniform(0.5, 2.0, size=(6, 3))
    lam = np.full(3, 1 / 3)
    res = cl.cluster_clients(l, lam, method=method, k=6, rng=rng)  # each group of size s gets min(k, s) = s
    np.testing.assert_array_equal(res.labels, np.arange(6))


@pytest.mark.parametrize("k", range(1, 7))
def test_kmeans_never_returns_an_empty_cluster(k):
    """Duplicated points leave k-means++ seeds on top of each other and Lloyd clusters empty: each is re-seeded
    without emptying another, so there are exactly k clusters, no NaN centre and no warning; with k at least the
    number of distinct points the inertia is 0."""
    X = np.array([[0.0, 0.0]] * 4 + [[1.0, 0.0], [0.0, 1.0]])
    for seed in range(4):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            labels = cl.stage2_split(X, method="kmeans", k=k, rng=np.random.default_rng(seed))
        assert sorted(set(labels.tolist())) == list(range(k))
        if k >= 3:
            assert _inertia(X, labels) == 0.0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kmeans_result_is_a_lloyd_fixed_point(seed):
    """At convergence every point is nearest to the mean of its own cluster."""
    X = np.random.default_rng(seed).normal(size=(40, 2))
    labels = cl.stage2_split(X, method="kmeans", k=4, rng=np.random.default_rng(seed))
    means = np.stack([X[labels == c].mean(axis=0) for c in range(4)])
    d2 = ((X[:, None, :] - means[None, :, :]) ** 2).sum(axis=2)
    np.testing.assert_array_equal(d2.argmin(axis=1), labels)


def test_kmeans_keeps_the_restart_of_least_inertia_first_on_ties():
    """n_init restarts draw from the rng in turn, so n_init=R equals the best of R single restarts replayed on
    one generator: least inertia, the first such restart on exact ties (a square has two optimal 2-splits)."""
    for data_seed in range(3):
        X = np.random.default_rng(data_seed).normal(size=(30, 2))
        rng = np.random.default_rng(7)
        singles = [cl.stage2_split(X, method="kmeans", k=4, rng=rng, n_init=1) for _ in range(10)]
        inertias = [_inertia(X, s) for s in singles]
        assert inertias[0] > min(inertias) + 0.1  # restarts matter on this instance
        best = cl.stage2_split(X, method="kmeans", k=4, rng=np.random.default_rng(7), n_init=10)
        np.testing.assert_array_equal(best, singles[int(np.argmin(inertias))])

    square = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    rng = np.random.default_rng(4)
    singles = [cl.stage2_split(square, method="kmeans", k=2, rng=rng, n_init=1) for _ in range(4)]
    inertias = [_inertia(square, s) for s in singles]
    optimal = [i for i, v in enumerate(inertias) if v == min(inertias)]
    assert len({tuple(singles[i]) for i in optimal}) == 2  # two different partitions tie exactly
    best = cl.stage2_split(square, method="kmeans", k=2, rng=np.random.default_rng(4), n_init=4)
    np.testing.assert_array_equal(best, singles[optimal[0]])


def test_kmeans_plus_plus_seeding_finds_separated_blobs_without_lloyd():
    """k-means++ draws each new seed with probability ∝ D² (squared distance to the nearest seed so far): with
    three tight, far-apart blobs the seeds land one per blob (a second seed in a blob has probability ~1e-10), so
    a single assignment step (max_iter=1) already recovers the blobs; uniform seeding fails in most draws."""
    rng = np.random.default_rng(0)
    centres = np.array([[0.0, 0.0], [100.0, 0.0], [0.0, 60.0]])
    X = np.concatenate([c + 1e-3 * rng.normal(size=(5, 2)) for c in centres])
    truth = {frozenset(range(5 * b, 5 * b + 5)) for b in range(3)}
    for scale in (1.0, 1e-4):  # the D² weights are relative: the same at any scale of the data
        for seed in range(40):
            labels = cl.stage2_split(scale * X, method="kmeans", k=3, rng=np.random.default_rng(seed), n_init=1,
                                     max_iter=1)
            assert _partition(labels) == truth, f"scale {scale}, seed {seed}"


def test_stage1_keys_sort_the_weighted_losses_and_ties_by_index():
    """π_i = argsort_desc(λ_i ⊙ l_i) with widely varying losses (so λ alone or l alone would order differently),
    and exact ties among many objectives ordered by ascending index (a stable sort)."""
    rng = np.random.default_rng(6)
    l = np.exp(rng.uniform(-2.0, 2.0, size=(50, 5)))
    lam = rng.dirichlet(np.ones(5), size=50)
    keys = cl.stage1_keys(l, lam)
    for i in range(50):
        np.testing.assert_array_equal(keys[i], sorted(range(5), key=lambda j: -lam[i, j] * l[i, j]))
    assert keys.dtype == np.int64
    np.testing.assert_array_equal(cl.stage1_keys(l, lam, key="bottleneck")[:, 0], (lam * l).argmax(axis=1))
    lam8 = np.array([1.0, 2.0, 1.0, 2.0, 3.0, 1.0, 3.0, 2.0]) / 15.0
    np.testing.assert_array_equal(cl.stage1_keys(np.ones((1, 8)), lam8)[0], [4, 6, 1, 3, 7, 0, 2, 5])


def test_cluster_clients_passes_the_key_and_returns_integer_read_only_arrays():
    rng = np.random.default_rng(4)
    l, lam, _ = _constructed_clients(rng, [(0.5, 0.3, 0.2), (0.5, 0.2, 0.3)], per_cluster=2)
    res = cl.cluster_clients(l, lam, key="bottleneck", stage2=False)
    assert res.keys.shape == (4, 1)
    np.testing.assert_array_equal(res.labels, np.zeros(4))
    np.testing.assert_array_equal(res.stage1_labels, cl.stage1_groups(l, lam, key="bottleneck")[0])
    res = cl.cluster_clients(l, lam, key="bottleneck", threshold=1e6)
    assert res.keys.shape == (4, 1) and res.n_clusters == 1
    for arr in (res.labels, res.stage1_labels, res.keys):
        assert arr.dtype == np.int64 and not arr.flags.writeable
    assert not res.adjustments_ref.flags.writeable
    with pytest.raises(AttributeError):
        res.labels = None  # frozen
    assert res in {res}  # identity equality and hashing (array fields are never compared with ==)
    for labels in (cl.stage1_groups(l, lam)[0], cl.stage2_split(l[:1], threshold=1.0),
                   cl.stage2_split(l, threshold=0.1), cl.stage2_split(l, method="kmeans", k=2, rng=_RNG(0))):
        assert labels.dtype == np.int64
    blk = cl.mixed_cluster_blocks(np.ones((2, 2)), np.ones((2, 2)), [0.5, 0.5], [True, False])
    with pytest.raises(AttributeError):
        blk.rho_plus = 0.0
    assert blk in {blk} and not blk.dist_plus.flags.writeable


def test_cluster_clients_kmeans_without_k_names_k():
    l, lam = np.ones((3, 2)), np.full((3, 2), 0.5)
    with pytest.raises(ValueError, match=r"^method='kmeans' needs the number of clusters k"):
        cl.cluster_clients(l, lam, method="kmeans", rng=_RNG(0))


def test_mixed_blocks_distances_exactly_and_numeric_masks():
    rng = np.random.default_rng(21)
    d, dbal = rng.normal(size=(5, 3)), rng.normal(size=(5, 3))
    rho = rng.dirichlet(np.ones(5))
    mask = np.array([True, False, True, True, False])
    blk = cl.mixed_cluster_blocks(d, dbal, rho, mask)
    plus = (rho[mask] @ d[mask]) / rho[mask].sum()
    zero = (rho[~mask] @ d[~mask]) / rho[~mask].sum()
    assert blk.dist_plus.shape == blk.dist_zero.shape == blk.deviation_bound.shape == (5,)
    np.testing.assert_allclose(blk.dist_plus, [np.linalg.norm(plus - x) for x in d], rtol=1e-13)
    np.testing.assert_allclose(blk.dist_zero, [np.linalg.norm(zero - x) for x in d], rtol=1e-13)
    np.testing.assert_allclose(blk.deviation_bound, blk.rho_plus * blk.dist_plus + blk.rho_zero * blk.dist_zero,
                               rtol=1e-15)
    for numeric in (mask.astype(int), mask.astype(float)):  # 0/1 masks mean the same as booleans
        other = cl.mixed_cluster_blocks(d, dbal, rho, numeric)
        np.testing.assert_array_equal(other.balancing, mask)
        np.testing.assert_array_equal(other.dist_plus, blk.dist_plus)


def test_shared_weights_over_a_batch_and_two_batch_axes():
    """ρ of shape (N,) serves a batch of clusters; per-instance results equal the unbatched calls."""
    rng = np.random.default_rng(13)
    B, N, n_w, m = 4, 3, 2, 2
    d = rng.normal(size=(B, N, n_w))
    rho = rng.dirichlet(np.ones(N))
    H = cl.dispersion(d, rho)
    np.testing.assert_allclose(H, [cl.dispersion(d[b], rho) for b in range(B)], rtol=1e-14)
    np.testing.assert_allclose(cl.shared_direction(d, rho), [cl.shared_direction(d[b], rho) for b in range(B)],
                               rtol=1e-14)
    G = rng.normal(size=(B, 5, n_w, m))
    mu = rng.dirichlet(np.ones(m), size=(B, 5, N))
    C = np.swapaxes(G, -1, -2) @ G
    Hw = cl.dispersion_from_weights(mu, C, rho)
    assert Hw.shape == (B, 5)
    np.testing.assert_allclose(Hw[2, 3], cl.dispersion_from_weights(mu[2, 3], C[2, 3], rho), rtol=1e-14)
    np.testing.assert_allclose(cl.dispersion_from_weights(mu, C[0, 0], rho)[1],
                               [cl.dispersion_from_weights(mu[1, j], C[0, 0], rho) for j in range(5)], rtol=1e-14)
    grads = rng.normal(size=(B, N, n_w, m))
    rho_b = rng.dirichlet(np.ones(N), size=B)
    np.testing.assert_allclose(cl.gradient_dissimilarity(grads, rho_b),
                               [cl.gradient_dissimilarity(grads[b], rho_b[b]) for b in range(B)], rtol=1e-14)
    np.testing.assert_allclose(cl.gradient_dissimilarity_max(grads),
                               [cl.gradient_dissimilarity_max(grads[b]) for b in range(B)], rtol=1e-14)


def test_delta_g_sees_every_client_and_one_client_has_none():
    """The last client is an outlier: δ_g is attained at it; a single client has δ_g = 0."""
    rng = np.random.default_rng(14)
    N, n_w, m = 5, 3, 2
    g = rng.normal(size=(N, n_w, m))
    g[-1] += 10.0
    rho = np.full(N, 1.0 / N)
    brute = max(sum(rho[k] * np.linalg.norm(g[i, :, j] - g[k, :, j]) for k in range(N))
                for i in range(N) for j in range(m))
    assert cl.gradient_dissimilarity(g, rho) == pytest.approx(brute, rel=1e-13)
    assert cl.gradient_dissimilarity(g[:1], [1.0]) == 0.0 and cl.gradient_dissimilarity_max(g[:1]) == 0.0


def test_aggregation_weights_of_one_client_and_first_bad_entry_named():
    np.testing.assert_array_equal(cl.aggregation_weights(N=1), [1.0])
    np.testing.assert_array_equal(cl.aggregation_weights(n_samples=[7]), [1.0])
    np.testing.assert_array_equal(cl.check_aggregation_weights([1.0]), [1.0])
    with pytest.raises(ValueError, match=r"rho\[0\] = "):
        cl.check_aggregation_weights([0.0, 1.0, 0.0])
    with pytest.raises(ValueError, match=r"n_samples\[1\] = "):
        cl.aggregation_weights(n_samples=[1.0, 0.0, -1.0])


# ------------------------------------------------------------------------------------------ bad inputs

_D = np.ones((2, 2))
_X = np.arange(8.0).reshape(4, 2)
_RNG = np.random.default_rng


# each message must name the argument and the offending value (a regex; numpy's own ValueErrors do not match)
_BAD = [
    (cl.check_aggregation_weights, ([0.5, 0.6],), {}, r"^rho must sum to 1 .*sums to 1\.1"),
    (cl.check_aggregation_weights, ([1.0, 0.0],), {}, rf"^rho must be strictly positive .*rho\[1\] = {float_value('0.0')}"),
    (cl.check_aggregation_weights, ([np.nan, 1.0],), {}, rf"^rho contains a non-finite entry {float_value('nan')} at index \(0,\)"),
    (cl.check_aggregation_weights, ([[0.5, 0.5], [0.25, 0.5], [0.2, 0.8]],), {}, r"^rho must sum to 1 .*sums to 0\.75"),
    (cl.check_aggregation_weights, ([[0.5, 0.5], [0.5, -0.5]],), {}, rf"^rho must be strictly positive .*rho\[1, 1\] = {float_value('-0.5')}"),
    (cl.check_aggregation_weights, (np.ones((2, 0)),), {}, r"^rho must hold at least one client weight; got shape \(2, 0\)"),
    (cl.check_aggregation_weights, ("abc",), {}, r"^rho must be a numeric array; got 'abc'"),
    (cl.aggregation_weights, (), {"n_samples": [1, -2]}, rf"^n_samples must be strictly positive; n_samples\[1\] = {float_value('-2.0')}"),
    (cl.aggregation_weights, (), {"n_samples": []}, r"^n_samples must hold at least one client"),
    (cl.aggregation_weights, (), {"n_samples": [[1, 2]]}, r"^n_samples must have 1 dimension\(s\); got shape \(1, 2\)"),
    (cl.aggregation_weights, (), {"n_samples": [1, np.nan]}, rf"^n_samples contains a non-finite entry {float_value('nan')}"),
    (cl.check_aggregation_weights, (1.0,), {}, r"^rho must have at least 1 dimension\(s\); got shape \(\)"),
    (cl.aggregation_weights, (), {"N": 0}, r"^N must be a positive integer; got N=0"),
    (cl.aggregation_weights, (), {"N": True}, r"^N must be a positive integer; got N=True"),
    (cl.aggregation_weights, (), {"N": 2.0}, r"^N must be a positive integer; got N=2\.0"),
    (cl.aggregation_weights, (), {"n_samples": [1, 2], "N": 3}, r"^N=3 disagrees with len\(n_samples\)=2"),
    (cl.aggregation_weights, (), {}, r"needs n_samples or N; got n_samples=None and N=None"),
    (cl.shared_direction, (np.ones((3, 2)), [0.5, 0.5]), {}, r"^rho has 2 weights but directions has 3 clients"),
    (cl.shared_direction, ("abc", [1.0]), {}, r"^directions must be a numeric array; got 'abc'"),
    (cl.shared_direction, ([[1.0, 2.0], [3.0]], [0.5, 0.5]), {}, r"^directions must be a numeric array"),
    (cl.shared_direction, (np.ones((2, 3, 2)), np.full((3, 3), 1 / 3)), {},
     r"^rho batch shape \(3,\) does not broadcast with directions batch shape \(2,\)"),
    (cl.deviations, (np.full((2, 2), np.nan), [0.5, 0.5]), {}, rf"^directions contains a non-finite entry {float_value('nan')} at index \(0, 0\)"),
    (cl.dispersion, (np.ones(3), [1.0]), {}, r"^directions must have at least 2 dimension\(s\); got shape \(3,\)"),
    (cl.dispersion_from_weights, (np.ones((2, 3)) / 3, np.eye(2), [0.5, 0.5]), {},
     r"^gram must have shape \(\.\.\., 3, 3\) to match mu shape \(2, 3\); got \(2, 2\)"),
    (cl.dispersion_from_weights, (np.ones((2, 2)) / 2, [[1.0, 2.0], [0.0, 1.0]], [0.5, 0.5]), {}, r"^gram must be symmetric"),
    (cl.dispersion_from_weights, (np.ones((2, 2)) / 2, np.eye(2), [0.2, 0.2]), {}, r"^rho must sum to 1 .*sums to 0\.4"),
    (cl.dispersion_from_weights, (np.ones((2, 2)) / 2, np.eye(2), [0.2, 0.3, 0.5]), {}, r"^rho has 3 weights but mu has 2 clients"),
    (cl.dispersion_from_weights, (np.ones(2) / 2, np.eye(2), [1.0]), {}, r"^mu must have at least 2 dimension\(s\)"),
    (cl.dispersion_from_weights, (np.ones((2, 2, 2)) / 2, np.ones((3, 2, 2)), [0.5, 0.5]), {},
     r"^batch shapes do not broadcast: mu \(2,\), gram \(3,\), rho \(\)"),
    (cl.dispersion_from_weights, (np.ones((2, 2, 2)) / 2, np.eye(2), np.full((3, 2), 0.5)), {},
     r"^batch shapes do not broadcast: mu \(2,\), gram \(\), rho \(3,\)"),
    (cl.mixed_cluster_blocks, (_D, np.ones((3, 2)), [0.5, 0.5], [True, False]), {},
     r"^d_bal must have the shape of directions \(2, 2\); got \(3, 2\)"),
    (cl.mixed_cluster_blocks, (_D, _D, [0.2, 0.3, 0.5], [True, False]), {}, r"^rho must have shape \(2,\) to match directions; got \(3,\)"),
    (cl.mixed_cluster_blocks, (_D, _D, [0.5, 0.5], [2, 0]), {}, r"^balancing_mask must be a boolean mask \(entries 0/1\); got \[2, 0\]"),
    (cl.mixed_cluster_blocks, (_D, _D, [0.5, 0.5], ["a", "b"]), {}, r"^balancing_mask must be a boolean mask; got \['a', 'b'\]"),
    (cl.mixed_cluster_blocks, (_D, _D, [0.5, 0.5], [True]), {}, r"^balancing_mask must have shape \(2,\); got shape \(1,\)"),
    (cl.mixed_cluster_blocks, (np.ones(2), np.ones(2), [0.5, 0.5], [True, False]), {},
     r"^directions must have 2 dimension\(s\); got shape \(2,\)"),
    (cl.mixed_cluster_blocks, (_D, np.ones(2), [0.5, 0.5], [True, False]), {}, r"^d_bal must have 2 dimension\(s\)"),
    (cl.mixed_cluster_blocks, (_D, np.full((2, 2), np.nan), [0.5, 0.5], [True, False]), {},
     rf"^d_bal contains a non-finite entry {float_value('nan')}"),
    (cl.gradient_dissimilarity_max, (np.ones((2, 3)),), {}, r"^grads must have at least 3 dimension\(s\); got shape \(2, 3\)"),
    (cl.gradient_dissimilarity, (np.ones((2, 3, 2)), [0.2, 0.3, 0.5]), {}, r"^rho has 3 weights but grads has 2 clients"),
    (cl.gradient_dissimilarity, (np.ones((0, 3, 2)), [1.0]), {}, r"^grads must hold at least one client; got shape \(0, 3, 2\)"),
    (cl.gradient_dissimilarity_max, (np.full((2, 3, 2), np.inf),), {}, rf"^grads contains a non-finite entry {float_value('inf')} at index \(0, 0, 0\)"),
    (cl.stage1_keys, (np.ones((2, 2)), np.full((2, 2), 0.5)), {"key": "foo"}, r"^key must be one of .*; got key='foo'"),
    (cl.stage1_groups, (-np.ones((2, 2)), np.full((2, 2), 0.5)), {}, r"\blosses_ref\b.*-1\.0"),
    (cl.stage1_groups, (np.ones((2, 2)), np.full((2, 2), 0.6)), {}, r"\bprefs\b.*1\.2"),
    (cl.stage1_groups, (np.ones(2), np.full(2, 0.5)), {}, r"^losses_ref must have shape \(N, m\); got \(2,\)"),
    (cl.stage1_groups, (np.ones((2, 3)), np.full((2, 2), 0.5)), {}, r"objectives m: losses shape \(2, 3\), prefs shape \(2, 2\)"),
    (cl.stage1_groups, (np.ones((2, 2)), np.full((1, 2, 2), 0.5)), {}, r"^prefs must have shape \(N, m\) or \(m,\); got \(1, 2, 2\)"),
    (cl.stage2_split, (_X,), {}, r"needs exactly one of threshold or k; got threshold=None, k=None"),
    (cl.stage2_split, (_X,), {"threshold": 1.0, "k": 2}, r"needs exactly one of threshold or k; got threshold=1\.0, k=2"),
    (cl.stage2_split, (_X,), {"threshold": -1.0}, r"^threshold must be a finite number >= 0; got threshold=-1\.0"),
    (cl.stage2_split, (_X,), {"threshold": np.nan}, r"^threshold must be a finite number >= 0; got threshold=nan"),
    (cl.stage2_split, (_X,), {"method": "ward", "threshold": 1.0}, r"^method must be 'complete' or 'kmeans'; got method='ward'"),
    (cl.stage2_split, (_X,), {"method": "kmeans", "k": 2}, r"needs rng, a numpy\.random\.Generator; got rng=None"),
    (cl.stage2_split, (_X,), {"method": "kmeans", "k": 2, "rng": 5}, r"needs rng, a numpy\.random\.Generator; got rng=5"),
    (cl.stage2_split, (_X,), {"method": "kmeans", "rng": _RNG(0)}, r"^method='kmeans' needs the number of clusters k; got k=None"),
    (cl.stage2_split, (_X,), {"method": "kmeans", "k": 2, "threshold": 1.0, "rng": _RNG(0)},
     r"^method='kmeans' takes k, not threshold; got threshold=1\.0"),
    (cl.stage2_split, (_X,), {"method": "kmeans", "k": 10, "rng": _RNG(0)}, r"^k must be <= the number of clients N=4; got k=10"),
    (cl.stage2_split, (_X,), {"method": "kmeans", "k": 0, "rng": _RNG(0)}, r"^k must be a positive integer; got k=0"),
    (cl.stage2_split, (_X,), {"method": "kmeans", "k": True, "rng": _RNG(0)}, r"^k must be a positive integer; got k=True"),
    (cl.stage2_split, (_X,), {"method": "kmeans", "k": 2, "rng": _RNG(0), "n_init": 0}, r"^n_init and max_iter must be >= 1; got n_init=0"),
    (cl.stage2_split, (_X,), {"method": "kmeans", "k": 2, "rng": _RNG(0), "max_iter": 0}, r"must be >= 1; got n_init=10, max_iter=0"),
    (cl.stage2_split, (np.array([[1.0, np.nan]]),), {"threshold": 1.0}, rf"^adjustments contains a non-finite entry {float_value('nan')} at index \(0, 1\)"),
    (cl.stage2_split, (np.zeros((0, 2)),), {"threshold": 1.0}, r"^adjustments must hold at least one client"),
    (cl.stage2_split, (np.zeros(3),), {"threshold": 1.0}, r"^adjustments must have 2 dimension\(s\); got shape \(3,\)"),
    (cl.cluster_clients, (np.ones((2, 2)), np.full((2, 2), 0.5)), {}, r"needs exactly one of threshold or k; got threshold=None, k=None"),
    (cl.cluster_clients, (np.ones((2, 2)), np.full((2, 2), 0.5)), {"stage2": "no"}, r"^stage2 must be a bool; got stage2='no'"),
]


@pytest.mark.parametrize("fn,args,kwargs,pattern", _BAD, ids=[f"{b[0].__name__}-{i}" for i, b in enumerate(_BAD)])
def test_bad_inputs_raise_naming_the_argument_and_value(fn, args, kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        fn(*args, **kwargs)
