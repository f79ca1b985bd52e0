"""Tests of sim.algorithm.adaptation (the preconditioners of eq 88, Pipelines 1 and 2 of the new clients).

Measured numbers asserted below (seeded, deterministic):

* Pipeline 1 (lagged RMSprop, p in [0.5, 1], alpha_adapt=0.1, LP direction, from w_I) minus Pipeline 2, averaged
  over 8 new clients x 16 seeds: see test_pipeline1_approaches_pipeline2 for the grid values.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import sim.algorithm as al
from sim.direction import STATUSES

# (K, S) -> mean over 8 new clients and seeds 0..15 of gap(Pipeline 1) - gap(Pipeline 2), measured with the
# scale-relative lagged RMSprop (sim.algorithm.rmsprop_diagonal; P_k in [0.5, 1], 12-18% of the coordinates at 0.5)
_P1_MEASURED = {(4, 8): 0.0738, (16, 64): 0.0315, (64, 512): 0.0116, (64, 8): 0.0614, (4, 512): 0.0457}


def test_pipeline2_reaches_the_planted_optimum(adaptation_setup):
    src, w_I, new, p2 = adaptation_setup
    assert np.all(np.abs(p2.gap) <= 1e-9)
    np.testing.assert_allclose(p2.w, src.problem.w_star[new], atol=1e-5)
    assert np.all(p2.beta <= 1e-12)
    last = p2.records[p2.records["round"] == p2.records["round"].max()]
    np.testing.assert_allclose(last["gap"].to_numpy(), p2.gap, rtol=0, atol=0)
    assert p2.records["n_lp_steps"].sum() == p2.steps * new.size


def test_pipeline1_approaches_pipeline2(adaptation_setup):
    """Seeded average (8 new clients x 16 seeds) of gap(P1) - gap(P2): decreases when K and S grow together, when
    S grows at K = 64 and when K grows at S = 512 (measured values in _P1_MEASURED)."""
    src, w_I, new, p2 = adaptation_setup
    start = al._gap_at(src, new, np.broadcast_to(w_I, (new.size, src.n_params))).mean()
    mean = {}
    for K, S in _P1_MEASURED:
        cfg = al.AdaptConfig(K=K, S=S, alpha_adapt=0.1, preconditioner="rmsprop_lagged", p_minus=0.5, p_plus=1.0)
        gaps = [al.pipeline1(src, new, w_I, cfg, np.random.default_rng(seed)).gap - p2.gap for seed in range(16)]
        mean[(K, S)] = float(np.mean(gaps))
    for key, val in _P1_MEASURED.items():
        assert mean[key] == pytest.approx(val, abs=0.0005), (key, mean)
    assert mean[(4, 8)] > mean[(16, 64)] > mean[(64, 512)]  # K and S grow together
    assert mean[(64, 8)] > mean[(64, 512)]  # S grows
    assert mean[(4, 512)] > mean[(64, 512)]  # K grows
    assert mean[(64, 512)] < 0.3 * start  # start gap at w_I: 0.064


def test_preconditioner_identities(f1_samples):
    src, w0 = f1_samples
    new = np.array([4, 5])
    base = al.AdaptConfig(K=6, S=5, alpha_adapt=0.05)
    batches = al.draw_batches(src, new, base.K, base.S, np.random.default_rng(1))
    run = lambda cfg: al.pipeline1(src, new, w0, cfg, batches=batches)  # noqa: E731
    ident = run(base)
    np.testing.assert_array_equal(run(replace(base, preconditioner="sgd")).trajectory, ident.trajectory)
    fixed = run(replace(base, preconditioner="fixed", P=np.eye(src.n_params)))
    np.testing.assert_allclose(fixed.trajectory, ident.trajectory, rtol=0, atol=1e-15)
    # SGD with coupled weight decay: first step w0 - α(d + λ_wd w0)
    wd = run(replace(base, preconditioner="sgd", weight_decay=0.1))
    d0 = (ident.trajectory[0] - ident.trajectory[1]) / base.alpha_adapt
    np.testing.assert_allclose(wd.trajectory[1], w0 - base.alpha_adapt * (d0 + 0.1 * w0), atol=1e-14)
    # AdamW's first step: decoupled decay, then ±α per coordinate (m̂/√v̂ = sign(g))
    aw = run(replace(base, preconditioner="adamw", weight_decay=0.1, eps=1e-12))
    np.testing.assert_allclose(aw.trajectory[1], w0 * (1 - 0.005) - 0.05 * np.sign(d0), atol=1e-10)
    # lagged RMSprop: P_k within [p_-, p_+]; P_k does not depend on the k-th batch (measurable)
    cfg = replace(base, preconditioner="rmsprop_lagged", p_minus=0.3, p_plus=1.5)
    rm = run(cfg)
    rows = rm.records[rm.records["round"] < base.K]
    assert (rows["p_min"] >= 0.3).all() and (rows["p_max"] <= 1.5).all()
    other = batches.copy()
    other[:, 3] = al.draw_batches(src, new, 1, base.S, np.random.default_rng(99))[:, 0]
    rm2 = al.pipeline1(src, new, w0, cfg, batches=other)
    r1 = rm.records.set_index(["round", "client"])
    r2 = rm2.records.set_index(["round", "client"])
    for k in range(4):  # P_0..P_3 use only batches 0..2
        np.testing.assert_array_equal(r1.loc[k, ["p_min", "p_max"]], r2.loc[k, ["p_min", "p_max"]])
    assert not np.allclose(r1.loc[4, ["p_min", "p_max"]], r2.loc[4, ["p_min", "p_max"]])


class _LinearClients:
    """Clients ``i`` with one linear objective ``l_i(w) = a_iᵀw + 10`` (m = 1): every batch gradient is ``a_i``, so
    the Chebyshev direction is ``d_k = a_i`` at every step and the lagged RMSprop ``P_k`` (``k >= 1``) is known by
    hand."""

    def __init__(self, A):
        self.A = np.asarray(A, dtype=np.float64)  # (N, n_w)
        self.prefs = np.ones((self.A.shape[0], 1))
        self.psi_star = np.zeros(self.A.shape[0])
        self.n_clients, self.n_params = self.A.shape
        self.n_objectives = 1

    def losses_per_client(self, w):  # (..., N, n_w) -> (..., N, 1)
        return (np.einsum("...nw,nw->...n", np.asarray(w, dtype=np.float64), self.A) + 10.0)[..., None]

    def grads_per_client(self, w):  # (..., N, n_w) -> (..., N, n_w, 1)
        w = np.asarray(w, dtype=np.float64)
        return np.broadcast_to(self.A[:, :, None], w.shape + (1,)).copy()


class _LinearSamples:
    def __init__(self, problem, n=10):
        self.problem, self.n = problem, n

    @property
    def n_samples(self):
        return np.full(self.problem.n_clients, self.n)

    def sample_losses(self, w, client, idx=None):  # (..., n_w) -> (..., 1)
        return (np.asarray(w, dtype=np.float64) @ self.problem.A[int(client)] + 10.0)[..., None]

    def sample_grads(self, w, client, idx=None):
        w = np.asarray(w, dtype=np.float64)
        return np.broadcast_to(self.problem.A[int(client)][:, None], w.shape[:-1] + (self.problem.n_params, 1)).copy()

    def episode(self, rng, client, size):
        return np.sort(rng.choice(self.n, size=int(size), replace=False))


def _rmsprop_by_hand(V, p_minus, p_plus, eps=1e-8):
    """The documented rule written out per row: s = mean_j sqrt(v_j), P_j = clip(s/(sqrt(v_j) + eps s)),
    clip(1) on a row with v = 0."""
    out = np.empty_like(V)
    for i, v in enumerate(V):
        r = np.sqrt(v)
        s = r.mean()
        out[i] = np.clip(s / (r + eps * s), p_minus, p_plus) if s > 0 else np.clip(1.0, p_minus, p_plus)
    return out


def _lagged_diagonals(G, preconditioner="rmsprop_lagged", p=(0.5, 2.0), beta2=0.999):
    """P_k (K, n, n_w) of preconditioned_step for the direction sequence G (K, n, n_w)."""
    W = np.zeros(G.shape[1:])
    st = al.PreconditionerState.zeros(W.shape)
    out = []
    for k, g in enumerate(G):
        W, pd_ = al.preconditioned_step(W, g, k, st, preconditioner=preconditioner, alpha=0.1, p_minus=p[0],
                                        p_plus=p[1], beta2=beta2)
        out.append(pd_)
    return np.stack(out)


@pytest.mark.parametrize("preconditioner", ["rmsprop_lagged", "rmsprop_current"])
def test_rmsprop_preconditioner_is_scale_invariant(preconditioner):
    """Directions x c give the same P_k: bitwise for c = 2^-10 (exact scaling), to round-off for c = 1e-3 (the
    size of LoRA gradient coordinates, where the absolute rule 1/sqrt(v) would give 1e3, i.e. p_+ everywhere)."""
    rng = np.random.default_rng(5)
    G = rng.standard_normal((12, 3, 6)) * np.geomspace(0.3, 3.0, 6)
    P = _lagged_diagonals(G, preconditioner)
    np.testing.assert_array_equal(_lagged_diagonals(G * 2.0**-10, preconditioner), P)
    np.testing.assert_allclose(_lagged_diagonals(G * 1e-3, preconditioner), P, rtol=1e-13, atol=0)
    np.testing.assert_allclose(_lagged_diagonals(G * 1e3, preconditioner), P, rtol=1e-13, atol=0)
    at_lo, at_hi = al.clip_shares(P[-1], 0.5, 2.0)
    assert at_hi.max() < 1.0 and at_lo.max() < 1.0


def test_rmsprop_preconditioner_follows_the_documented_rule_and_varies_inside_the_clips():
    """A generic instance (coordinate scales within a factor 2 of each other, noise): P_k equals the rule written out
    by hand from the explicit v recursion, varies across coordinates (larger RMS, smaller P) and lies strictly
    inside (p_-, p_+) = (0.5, 2): no coordinate at a clip."""
    rng = np.random.default_rng(7)
    n, n_w, K, b2 = 4, 6, 30, 0.9
    scales = np.geomspace(0.7, 1.4, n_w)
    G = scales * (1.0 + 0.02 * rng.standard_normal((K, n, n_w))) * 1e-3
    P = _lagged_diagonals(G, beta2=b2)
    v = np.zeros((n, n_w))
    for k in range(K):
        want = np.full((n, n_w), 1.0) if k == 0 else _rmsprop_by_hand(v / (1 - b2**k), 0.5, 2.0)
        np.testing.assert_allclose(P[k], want, rtol=1e-14, atol=0)
        v = b2 * v + (1 - b2) * G[k] ** 2
    late = P[5:]
    assert np.all(late > 0.5) and np.all(late < 2.0)
    assert np.all(np.diff(late, axis=-1) < 0)  # coordinate scales increase along the row
    assert np.all(np.ptp(late, axis=-1) > 0.5)  # spread across coordinates: 1.4/0.7 = 2 in RMS
    lo, hi = al.clip_shares(P[-1], 0.5, 2.0)
    np.testing.assert_array_equal(lo, 0.0)
    np.testing.assert_array_equal(hi, 0.0)


def test_lagged_rmsprop_does_not_depend_on_the_current_direction():
    """P_k of rmsprop_lagged is a function of d_0..d_{k-1} (H.41(a)); rmsprop_current's P_k moves with d_k."""
    rng = np.random.default_rng(3)
    G = rng.standard_normal((8, 2, 5))
    H = G.copy()
    H[5] = 10.0 * rng.standard_normal((2, 5))  # a different current direction at step 5 only
    a, b = _lagged_diagonals(G), _lagged_diagonals(H)
    np.testing.assert_array_equal(a[:6], b[:6])
    assert not np.array_equal(a[6], b[6])
    c, d = _lagged_diagonals(G, "rmsprop_current"), _lagged_diagonals(H, "rmsprop_current")
    np.testing.assert_array_equal(c[:5], d[:5])
    assert not np.array_equal(c[5], d[5])


def test_rmsprop_zero_coordinates_and_zero_rows():
    """v_j = 0 in a row with other nonzero coordinates: P_jj = p_+ (1/eps, clipped); a row with v = 0: clip(1) on
    every coordinate (the P_0 of the lagged rule), for clips below, around and above 1; no floating-point warning."""
    V = np.array([[0.0, 1.0, 4.0, 16.0], [0.0, 0.0, 0.0, 0.0]]) * 1e-6
    with np.errstate(all="raise"):
        for (pm, pp), one in (((0.5, 2.0), 1.0), ((1.5, 3.0), 1.5), ((0.2, 0.8), 0.8)):
            P = al.rmsprop_diagonal(V, pm, pp)
            assert P[0, 0] == pp
            np.testing.assert_array_equal(P[1], one)
            np.testing.assert_allclose(P, _rmsprop_by_hand(V, pm, pp), rtol=1e-15, atol=0)
    # s = (0 + 1 + 2 + 4)/4 * 1e-3 = 1.75e-3: P = clip((1e8, 1.75, 0.875, 0.4375), 0.5, 2)
    # (rtol 1e-7: the exact values less the relative eps = 1e-8 in the denominator)
    np.testing.assert_allclose(al.rmsprop_diagonal(V, 0.5, 2.0)[0], [2.0, 1.75, 0.875, 0.5], rtol=1e-7, atol=0)


def test_pipeline1_records_the_share_of_coordinates_at_each_clip():
    """Hand-computed: constant directions d = a. Client 0, a = (1, 2, 4, 8)e-3: s = 3.75e-3, so for k >= 1
    P_k = clip((3.75, 1.875, 0.9375, 0.46875), 0.5, 2) = (2, 1.875, 0.9375, 0.5): p_at_lower = p_at_upper = 1/4
    (the absolute rule 1/sqrt(v) = 125..1000 would put all four at p_+). Client 1, a = (0, 1, 2, 4)e-3: P_k =
    (2, 1.75, 0.875, 0.5) (a zero coordinate at p_+): 1/4 and 1/4. Client 2, a = 0: P_k = 1, shares 0. Step 0:
    P_0 = 1, shares 0. The final row (no step) and the preconditioners without clips: NaN."""
    A = np.array([[1.0, 2.0, 4.0, 8.0], [0.0, 1.0, 2.0, 4.0], [0.0, 0.0, 0.0, 0.0]]) * 1e-3
    prob = _LinearClients(A)
    src = al.ClientSource(prob, _LinearSamples(prob))
    clients = np.arange(3)
    cfg = al.AdaptConfig(K=4, S=2, alpha_adapt=0.1, preconditioner="rmsprop_lagged", p_minus=0.5, p_plus=2.0,
                         direction="chebyshev")
    res = al.pipeline1(src, clients, np.zeros(4), cfg, np.random.default_rng(0))
    rec = res.records.set_index(["round", "client"])
    assert list(res.records.columns[:len(al.RECORD_COLUMNS)]) == list(al.RECORD_COLUMNS)
    for c in clients:
        np.testing.assert_array_equal(rec.loc[(0, c), ["p_min", "p_max", "p_at_lower", "p_at_upper"]], [1, 1, 0, 0])
        for k in range(1, 4):
            want = [0.5, 2.0, 0.25, 0.25] if c < 2 else [1.0, 1.0, 0.0, 0.0]
            np.testing.assert_array_equal(rec.loc[(k, c), ["p_min", "p_max", "p_at_lower", "p_at_upper"]], want)
        assert rec.loc[(4, c), ["p_min", "p_max", "p_at_lower", "p_at_upper"]].isna().all()
    # the steps taken are alpha P_k a, with the P_k above (rtol 1e-7: the relative eps = 1e-8 of the rule)
    np.testing.assert_allclose(res.trajectory[2, 0] - res.trajectory[1, 0], -0.1 * np.array([2, 1.875, 0.9375, 0.5])
                               * A[0], rtol=1e-7, atol=0)
    # clip [1.2, 3]: P_0 = 1.2 (all at the lower clip); the zero row keeps clip(1) = 1.2
    lo = al.pipeline1(src, clients, np.zeros(4), replace(cfg, p_minus=1.2, p_plus=3.0), np.random.default_rng(0))
    r2 = lo.records.set_index(["round", "client"])
    assert (r2.loc[0, "p_at_lower"] == 1.0).all() and (r2.loc[0, "p_at_upper"] == 0.0).all()
    assert r2.loc[(2, 2), "p_at_lower"] == 1.0
    np.testing.assert_array_equal(r2.loc[(2, 0), ["p_at_lower", "p_at_upper"]], [0.5, 0.25])  # (3, 1.875, 1.2, 1.2)
    for pre in ("identity", "adamw", "sgd"):
        other = al.pipeline1(src, clients, np.zeros(4), replace(cfg, preconditioner=pre), np.random.default_rng(0))
        assert other.records[["p_at_lower", "p_at_upper"]].isna().all().all()


def test_chebyshev_and_linear_directions(f1_samples):
    src, w0 = f1_samples
    new = np.array([0, 1, 2])
    batches = al.draw_batches(src, new, 1, 7, np.random.default_rng(2))
    lam = src.prefs[new]
    l, G = src.minibatch(np.broadcast_to(w0, (3, src.n_params)), new, batches[:, 0])
    for direction in ("chebyshev", "linear"):
        res = al.pipeline1(src, new, w0, al.AdaptConfig(K=1, S=7, alpha_adapt=0.1, direction=direction),
                           batches=batches)
        if direction == "chebyshev":
            j = np.argmax(lam * l, axis=1)
            d = lam[np.arange(3), j][:, None] * G[np.arange(3), :, j]
        else:
            d = np.einsum("nwm,nm->nw", G, lam)
        np.testing.assert_allclose(res.trajectory[1], w0 - 0.1 * d, rtol=0, atol=1e-14)
        assert (res.records["lp_mode"].iloc[:3] == direction).all()
        assert res.records["n_lp_steps"].sum() == 0


def _psi_rows(src, clients, W):
    """``ψ_i(w_i) = max_j λ_ij l_ij(w_i)`` of the rows ``W`` (one per client of ``clients``), from the problem."""
    full = np.zeros((src.n_clients, src.n_params))
    full[clients] = W
    return (src.prefs[clients] * src.problem.losses_per_client(full)[clients]).max(axis=-1)


def test_pipeline2_returns_the_best_or_the_last_iterate_as_selected(f1_samples):
    """A constant step too large to settle (eta 0.5, 6 steps): ``select="best"`` returns, per client, the iterate of
    smallest ψ, ``select="last"`` the last one; the two differ here, and the gap is that of the returned model."""
    src, w0 = f1_samples
    new = np.array([4, 5])
    runs = {sel: al.pipeline2(src, new, w0, al.Pipeline2Config(max_steps=6, eta=0.5, decay_steps=None, select=sel))
            for sel in ("best", "last")}
    traj = runs["last"].trajectory
    np.testing.assert_array_equal(runs["best"].trajectory, traj)  # the same iteration, another output
    psi = np.stack([_psi_rows(src, new, W) for W in traj])  # (steps + 1, clients)
    best = traj[psi.argmin(axis=0), np.arange(new.size)]
    np.testing.assert_array_equal(runs["best"].w, best)
    np.testing.assert_array_equal(runs["last"].w, traj[-1])
    assert np.all(psi.min(axis=0) < psi[-1] - 0.1)  # the last iterate is clearly not the best one
    for sel, res in runs.items():
        np.testing.assert_allclose(res.gap, _psi_rows(src, new, res.w) - src.psi_star[new], rtol=1e-14, err_msg=sel)


def test_adaptation_records_count_the_local_steps(f1_samples):
    """``local_steps``: one LP step per recorded Pipeline-1 / Pipeline-2 row, 0 on the last row (the returned
    model, no step taken); Phase 1 records τ per round."""
    src, w0 = f1_samples
    new = np.array([4, 5])
    p1 = al.pipeline1(src, new, w0, al.AdaptConfig(K=2, S=4), np.random.default_rng(0)).records
    assert p1["local_steps"].tolist() == [1, 1, 1, 1, 0, 0]
    p2 = al.pipeline2(src, new, w0, al.Pipeline2Config(max_steps=5, record_every=2)).records
    assert p2["round"].tolist() == [0, 0, 2, 2, 4, 4, 5, 5]
    assert p2["local_steps"].tolist() == [1, 1, 1, 1, 1, 1, 0, 0]
    ph = al.phase1(src, np.arange(4), w0, al.Phase1Config(rounds=2, tau=3), np.random.default_rng(0)).records
    assert ph["local_steps"].tolist() == [3] * 8 + [0] * 4


def test_pipeline2_records_its_step_size_and_direction_norm(f1_samples):
    """Each recorded Pipeline-2 row holds the step ``eta_k = eta/(1 + k/decay_steps)`` (``eta_eff``) and the norm
    of the LP direction taken there, ``‖w_{k+1} - w_k‖/eta_k`` (``d_norm``)."""
    src, w0 = f1_samples
    new = np.array([4, 5])
    res = al.pipeline2(src, new, w0, al.Pipeline2Config(max_steps=5, record_every=2, eta=0.2, decay_steps=4.0))
    rows = res.records[res.records["round"] < 5]
    k = rows["round"].to_numpy()
    np.testing.assert_allclose(rows["eta_eff"], 0.2 / (1.0 + k / 4.0), rtol=1e-15)
    steps = np.linalg.norm(np.diff(res.trajectory, axis=0), axis=-1)  # (5, clients)
    np.testing.assert_allclose(rows["d_norm"], steps[k, np.tile([0, 1], 3)] / (0.2 / (1.0 + k / 4.0)), rtol=1e-12)


def test_adamw_steps_are_the_hand_computed_updates():
    """Two AdamW steps (torch.optim.AdamW's rule) written out: bias-corrected moments, ``P = 1/(√v̂ + eps)``,
    decoupled weight decay ``w(1 - α·wd)``; the returned diagonal is ``P``."""
    a, wd, b1, b2, eps = 0.1, 0.01, 0.9, 0.999, 1e-8
    W0 = np.array([[1.0, -2.0, 0.5]])
    g0, g1 = np.array([[0.5, 4.0, -1.0]]), np.array([[-1.0, 2.0, 3.0]])
    state = al.PreconditionerState.zeros(W0.shape)
    kw = dict(preconditioner="adamw", alpha=a, beta1=b1, beta2=b2, eps=eps, weight_decay=wd)
    W1, P0 = al.preconditioned_step(W0, g0, 0, state, **kw)
    # step 0: m̂ = g0, v̂ = g0², so the step is α·g0/(|g0| + eps) = α·sign(g0) up to eps
    np.testing.assert_allclose(P0, 1.0 / (np.abs(g0) + eps), rtol=1e-15)
    np.testing.assert_allclose(W1, W0 * (1 - a * wd) - a * g0 / (np.abs(g0) + eps), rtol=1e-15)
    np.testing.assert_allclose(W1, [[0.999 - 0.1, -1.998 - 0.1, 0.4995 + 0.1]], rtol=1e-7)
    W2, P1 = al.preconditioned_step(W1, g1, 1, state, **kw)
    m = b1 * (1 - b1) * g0 + (1 - b1) * g1
    v = b2 * (1 - b2) * g0**2 + (1 - b2) * g1**2
    mhat, vhat = m / (1 - b1**2), v / (1 - b2**2)
    np.testing.assert_allclose(state.m1, m, rtol=1e-15)
    np.testing.assert_allclose(state.v, v, rtol=1e-15)
    np.testing.assert_allclose(P1, 1.0 / (np.sqrt(vhat) + eps), rtol=1e-15)
    np.testing.assert_allclose(W2, W1 * (1 - a * wd) - a * mhat / (np.sqrt(vhat) + eps), rtol=1e-15)
    # the defaults are torch.optim.AdamW's (β₁ = 0.9, β₂ = 0.999, eps = 1e-8): the same two steps without them
    state = al.PreconditionerState.zeros(W0.shape)
    V1, _ = al.preconditioned_step(W0, g0, 0, state, preconditioner="adamw", alpha=a, weight_decay=wd)
    V2, _ = al.preconditioned_step(V1, g1, 1, state, preconditioner="adamw", alpha=a, weight_decay=wd)
    np.testing.assert_array_equal(V2, W2)


def test_rmsprop_lagged_steps_keep_the_hand_computed_second_moment():
    """``rmsprop_lagged``: ``P_0 = clip(1)``, then ``P_k`` from ``v_{k-1}``; its state is the running second moment
    ``v_k = β₂v_{k-1} + (1-β₂)g_k²`` (not a multiple of it: the diagonal is scale-free, the state is not)."""
    W0 = np.array([[1.0, -2.0, 0.5]])
    g0, g1 = np.array([[0.5, 4.0, -1.0]]), np.array([[-1.0, 2.0, 3.0]])
    state = al.PreconditionerState.zeros(W0.shape)
    kw = dict(preconditioner="rmsprop_lagged", alpha=0.1, p_minus=0.5, p_plus=2.0, beta2=0.9)
    W1, P0 = al.preconditioned_step(W0, g0, 0, state, **kw)
    np.testing.assert_array_equal(P0, np.ones_like(W0))
    np.testing.assert_allclose(state.v, 0.1 * g0**2, rtol=1e-15)
    W2, P1 = al.preconditioned_step(W1, g1, 1, state, **kw)
    np.testing.assert_allclose(P1, al.rmsprop_diagonal(0.1 * g0**2, 0.5, 2.0, 1e-8), rtol=1e-15)
    np.testing.assert_allclose(state.v, 0.9 * 0.1 * g0**2 + 0.1 * g1**2, rtol=1e-15)
    np.testing.assert_allclose(W2, W1 - 0.1 * P1 * g1, rtol=1e-15)


def test_rmsprop_current_step_is_the_hand_computed_update():
    """``rmsprop_current``: ``v_k = β₂v_{k-1} + (1-β₂)g_k²`` first, then ``w - α P g`` with ``P`` from ``v_k``."""
    W0, g = np.array([[1.0, -2.0, 0.5]]), np.array([[0.5, 4.0, -1.0]])
    state = al.PreconditionerState.zeros(W0.shape)
    W1, P = al.preconditioned_step(W0, g, 0, state, preconditioner="rmsprop_current", alpha=0.1, p_minus=0.5,
                                   p_plus=2.0, beta2=0.9)
    v = 0.1 * g**2
    r = np.sqrt(v)
    expected_P = np.clip(1.0 / (r / r.mean() + 1e-8), 0.5, 2.0)  # r/s = (0.4, 3.2, 0.8)/... -> (2, 0.5, 1.0526)
    np.testing.assert_allclose(state.v, v, rtol=1e-15)
    np.testing.assert_allclose(P, expected_P, rtol=1e-15)
    np.testing.assert_allclose(W1, W0 - 0.1 * expected_P * g, rtol=1e-15)
    with pytest.raises(ValueError, match=r"^preconditioner must be one of \('identity', .*; got 'adam'$"):
        al.preconditioned_step(W0, g, 0, state, preconditioner="adam", alpha=0.1)


def test_overflowing_gradients_name_the_pipeline_step_and_step_size():
    """Gradients of norm 1e200 (finite losses, their Gram overflows): Pipeline 1 and Pipeline 2 stop at step 0
    naming the client, the Gram entry and the step size."""
    A = np.array([[1e200, 0.0], [0.0, 1.0]])
    prob = _LinearClients(A)
    src = al.ClientSource(prob, _LinearSamples(prob))
    with pytest.raises(al.DivergenceError, match=r"^pipeline1 step 0: client 0 has a non-finite gradient Gram entry "
                                                 r"C\[0, 0\] = inf .* with step size 0\.1: the iteration diverged"):
        al.pipeline1(src, np.arange(2), np.zeros(2), al.AdaptConfig(K=2, S=2, direction="linear"),
                     np.random.default_rng(0))
    with pytest.raises(al.DivergenceError, match=r"^pipeline2 step 0: client 0 .* with step size 0\.2: the iter"):
        al.pipeline2(src, np.arange(2), np.zeros(2), al.Pipeline2Config(max_steps=2))
    # a loss that overflows (1e300 · 1e10) is named with its objective
    with pytest.raises(al.DivergenceError, match=r"^pipeline1 step 0: client 0 has a non-finite loss \(inf, objective "
                                                 r"0\) with step size 0\.1: the iteration diverged"):
        huge = _LinearClients(A * 1e100)
        al.pipeline1(al.ClientSource(huge, _LinearSamples(huge)), np.arange(2), np.array([1e10, 0.0]),
                     al.AdaptConfig(K=1, S=2), np.random.default_rng(0))
    # gradients of norm 8e153: their Gram (6.4e307) is finite, ε_act = 2·η·B² is not at η = 2
    big = _LinearClients(np.array([[8e153, 0.0], [0.0, 1.0]]))
    with pytest.raises(al.DivergenceError, match=r"^phase1 cluster 0 round 0 diagnostic: client 0 has a gradient of "
                                                 r"norm 8\.000e\+153, so ε_act = 2·η·λ_max·B² overflows with step size "
                                                 r"2\.0: the iteration diverged"):
        al.phase1(big, np.arange(2), np.zeros(2), al.Phase1Config(rounds=1, eta_local=2.0), np.random.default_rng(0))
    # at η = 1, 2·η·B² = 1.28e308 is finite: the diagnostics at w_0 are computed (0 rounds), ε_act included
    ph = al.phase1(big, np.arange(2), np.zeros(2), al.Phase1Config(rounds=0, eta_local=1.0), np.random.default_rng(0))
    eps = ph.records["eps_act"].to_numpy()
    assert np.all(np.isfinite(eps)) and eps.max() > 1e307


def test_pipeline2_keeps_the_first_of_equally_good_iterates(f1_samples):
    """``select="best"`` returns per client the iterate of smallest ψ_new, the earliest of equal ones: with losses
    that do not change along the run (a source reporting constant losses, its gradients moving the model), every
    iterate ties, so Pipeline 2 returns its starting point although the model moved."""
    src0, w0 = f1_samples
    flat = np.array([0.9, 1.1, 1.0])

    class _Flat(al.ClientSource):
        def losses(self, W, clients):
            return np.tile(flat, (len(clients), 1))

        def evaluate(self, W, clients, batches=None):
            ev = super().evaluate(W, clients, batches)
            object.__setattr__(ev, "losses", np.tile(flat, (len(clients), 1)))
            return ev

    src = _Flat(src0.problem, src0.samples)
    res = al.pipeline2(src, np.array([4, 5]), w0, al.Pipeline2Config(max_steps=3, tol=0.0))
    assert res.trajectory is not None and np.abs(res.trajectory[-1] - res.trajectory[0]).max() > 0  # it moved
    np.testing.assert_array_equal(res.w, np.tile(w0, (2, 1)))


def test_rmsprop_lagged_first_step_keeps_the_parameters_dtype():
    """Step 0 of ``rmsprop_lagged`` uses ``P_0 = clip(1)`` in the parameters' dtype: float32 parameters stay float32."""
    W0 = np.array([[1.0, -2.0, 0.5]], dtype=np.float32)
    g0 = np.array([[0.5, 4.0, -1.0]], dtype=np.float32)
    state = al.PreconditionerState.zeros(W0.shape)
    W1, P0 = al.preconditioned_step(W0, g0, 0, state, preconditioner="rmsprop_lagged", alpha=0.1, p_minus=0.5,
                                    p_plus=2.0, beta2=0.9)
    assert P0.dtype == W1.dtype == np.float32
    np.testing.assert_array_equal(W1, W0 - np.float32(0.1) * g0)


def test_sgd_momentum_steps_are_torchs():
    """``sgd`` with momentum (torch.optim.SGD, dampening 0): ``b_0 = g_0 + wd·w_0``, ``b_k = μ b_{k-1} + g_k + wd·w_k``,
    ``w_{k+1} = w_k - α b_k``, written out for two steps."""
    W0 = np.array([[1.0, -2.0, 0.5]])
    g0, g1 = np.array([[0.5, 4.0, -1.0]]), np.array([[-1.0, 2.0, 3.0]])
    state = al.PreconditionerState.zeros(W0.shape)
    kw = dict(preconditioner="sgd", alpha=0.1, momentum=0.9, weight_decay=0.01)
    W1, _ = al.preconditioned_step(W0, g0, 0, state, **kw)
    b0 = g0 + 0.01 * W0
    np.testing.assert_allclose(W1, W0 - 0.1 * b0, rtol=1e-15)
    W2, _ = al.preconditioned_step(W1, g1, 1, state, **kw)
    b1 = 0.9 * b0 + g1 + 0.01 * W1
    np.testing.assert_allclose(W2, W1 - 0.1 * b1, rtol=1e-15)


def test_pipeline1_records_its_preconditioner_on_every_row(f1_samples):
    src, w0 = f1_samples
    res = al.pipeline1(src, np.array([4, 5]), w0, al.AdaptConfig(K=2, S=2, preconditioner="adamw"),
                       np.random.default_rng(0))
    assert res.records["preconditioner"].tolist() == ["adamw"] * len(res.records)
    assert sorted(set(res.records["round"])) == [0, 1, 2]  # the final row (k = K) included


def test_the_preconditioned_steps_default_clip_is_the_adaptation_configs():
    """Called without ``p_minus``, ``p_plus`` (as a user stepping by hand would), the step clips to the spectrum
    ``[p_-, p_+]`` that :class:`AdaptConfig` states by default."""
    import inspect

    sig = inspect.signature(al.preconditioned_step).parameters
    cfg = al.AdaptConfig()
    assert (sig["p_minus"].default, sig["p_plus"].default) == (cfg.p_minus, cfg.p_plus)


def test_adaptation_counts_the_status_of_every_lp_step(f1_samples):
    """``step_status_counts`` of Pipelines 1 and 2: one status per client and LP step, the sums of the records'
    per-status columns (every step recorded)."""
    src, w0 = f1_samples
    new = np.array([4, 5])
    p1 = al.pipeline1(src, new, w0, al.AdaptConfig(K=3, S=4), np.random.default_rng(0))
    p2 = al.pipeline2(src, new, w0, al.Pipeline2Config(max_steps=4, record_every=1))
    for res, steps in ((p1, 3), (p2, 4)):
        assert res.steps == steps and sum(res.step_status_counts.values()) == steps * new.size
        assert res.step_status_counts == {st: int(res.records[f"n_{st}"].sum()) for st in STATUSES}
