"""Tests of sim.source (the kernel boundary of Algorithm 1) and of Algorithm 1 run through it.

* Conformance: the family source :class:`ClientSource` (F1, F2; population and minibatches) and the independent
  opaque source below satisfy :func:`sim.source.check_source`; sources that break the contract are caught.
* The Gram-based diagnostics of the records (H.19 margins from ``Cμ``, ``‖d_M‖`` from the Gram's min-norm weights,
  ``B`` from ``diag C``, ``Δ_i``/``H_Cn`` from the centred directions) equal the gradient-based kernels
  (:func:`sim.hull.descent_margin`, :func:`sim.hull.min_norm_element`, :func:`sim.cluster.deviations`,
  :func:`sim.cluster.dispersion`, ``‖g_j‖``) to 1e-12 relative to each quantity's scale on F1 and F2 iterates.
* :class:`OpaqueQuadraticSource` — a second implementation of the protocol, written independently of the family
  code: quadratic clients with sample noise whose parameters and gradients are ``array_api_strict`` arrays on a
  non-default device, so any numpy call on parameters inside the loop fails, and whose ``to_host`` refuses every
  array with a parameter-sized axis. It exposes losses, Grams and combine only (never ``G``), and drives Phase 1,
  Phase 2, FedAvg, the shared iteration, Pipeline 1 (every preconditioner and direction), Pipeline 2 and
  run_algorithm to the same records and trajectories as the family source, to 1e-10.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import replace
from types import SimpleNamespace

import array_api_strict as xps
import numpy as np
import pandas as pd
import pytest

import sim.algorithm as al
from sim.cluster import deviations, dispersion
from sim.hull import descent_margin, eps_act, min_norm_element, near_active_set
from sim.problems import PerturbedClients, PlantedQuadraticCluster
from sim.source import (
    ClientSource,
    GradientEvaluation,
    Source,
    as_source,
    check_batch_size,
    check_clients,
    check_psi_star,
    check_source,
    sample_counts,
)

DEV = xps.Device("device1")
CPU = xps.Device("CPU_DEVICE")
N_W = 7  # distinct from N, m, S, K below, so that a parameter-sized axis is recognisable


# ------------------------------------------------------------------------------------------ the opaque source


class _OpaqueEvaluation:
    """Losses and Grams on the host; the gradients stay on the device and are only combined."""

    def __init__(self, losses, gram, G):
        self.losses, self.gram, self._G = losses, gram, G

    def combine(self, weights):
        mu = xps.asarray(np.asarray(weights, dtype=np.float64), device=DEV)
        return xps.sum(self._G * xps.expand_dims(mu, axis=1), axis=-1)


class OpaqueQuadraticSource:
    """Quadratic clients ``l_ij(w) = ½(w - c_ij)ᵀQ_j(w - c_ij) + b_j``, sample ``s`` shifting ``c_ij`` by ``ξ_sj``
    with the offset ``b_j - κ_ij`` (the data of a family problem and its ClientSamples), evaluated per sample and
    averaged on ``array_api_strict`` arrays on device ``DEV``."""

    def __init__(self, problem, samples):
        self.prefs = np.asarray(problem.prefs, dtype=np.float64)
        self.psi_star = np.asarray(problem.psi_star, dtype=np.float64)
        self.n_clients, self.n_params, self.n_objectives = problem.n_clients, problem.n_params, problem.n_objectives
        self.n_samples = np.asarray(samples.n_samples)
        self._c = xps.asarray(problem._centres_all(), device=DEV)  # (N, m, n_w)
        self._Q = xps.asarray(problem.hessians, device=DEV)  # (m, n_w, n_w)
        self._b = xps.asarray(problem.offsets, device=DEV)  # (m,)
        self._xi = [xps.asarray(x, device=DEV) for x in samples.noise]  # (n_i, m, n_w)
        self._kappa = xps.asarray(samples.kappa, device=DEV)  # (N, m)
        self.uploads = 0

    def asarray(self, x):
        self.uploads += 1
        return xps.asarray(x, dtype=xps.float64, device=DEV, copy=True)

    def to_host(self, x) -> np.ndarray:
        if self.n_params in tuple(x.shape):
            raise AssertionError(f"a parameter-sized array {tuple(x.shape)} left the device")
        return self.download(x)

    @staticmethod
    def download(x) -> np.ndarray:
        """Test-only transfer (trajectories)."""
        return np.asarray(x.to_device(CPU), dtype=np.float64)

    def _per_sample(self, e, offset):
        """Losses ``(..., m)`` and gradients ``(..., m, n_w)`` at residuals ``e = w - c - ξ`` ``(..., m, n_w)``."""
        Qe = xps.matmul(self._Q, xps.expand_dims(e, axis=-1))[..., 0]
        return 0.5 * xps.sum(e * Qe, axis=-1) + offset, Qe

    def _centres(self, clients):
        return xps.take(self._c, xps.asarray(clients, device=DEV), axis=0)

    def losses(self, W, clients):
        return self.to_host(self._per_sample(xps.expand_dims(W, axis=1) - self._centres(clients), self._b)[0])

    def evaluate(self, W, clients, batches=None):
        c = self._centres(clients)
        if batches is None:
            l, Qe = self._per_sample(xps.expand_dims(W, axis=1) - c, self._b)
        else:
            ls, gs = [], []
            for r, i in enumerate(clients):
                xi = xps.take(self._xi[int(i)], xps.asarray(np.asarray(batches[r]), device=DEV), axis=0)
                e = W[r, ...] - c[r, ...] - xi  # (S, m, n_w)
                li, gi = self._per_sample(e, self._b - self._kappa[int(i), ...])
                ls.append(xps.mean(li, axis=0))
                gs.append(xps.mean(gi, axis=0))
            l, Qe = xps.stack(ls), xps.stack(gs)
        G = xps.permute_dims(Qe, (0, 2, 1))  # (n, n_w, m)
        C = xps.matmul(Qe, G)
        C = 0.5 * (C + xps.permute_dims(C, (0, 2, 1)))
        return _OpaqueEvaluation(self.to_host(l), self.to_host(C), G)

    def episode(self, rng, client, size):
        return np.sort(rng.choice(int(self.n_samples[client]), size=int(size), replace=False))


# ------------------------------------------------------------------------------------------------ fixtures


def _f1(seed=0, n_clients=6):
    return PlantedQuadraticCluster.make(np.random.default_rng(seed), m=3, n_w=N_W, n_clients=n_clients, spread=0.05)


def _f2(seed=0, n_clients=6):
    return PerturbedClients.make(np.random.default_rng(seed), m=3, n_w=N_W, n_clients=n_clients, shift=0.05,
                                 prefs="planted", spread=0.05)


_FAMILIES = {"F1": _f1, "F2": _f2}


@pytest.fixture(scope="module")
def pair():
    """The F1 family source and the opaque source over the same problem and samples, and a start point."""
    p = _f1(seed=3)
    s = p.with_samples(np.random.default_rng(4), np.r_[np.full(4, 30), np.full(2, 60)], 0.1)
    return ClientSource(p, s), OpaqueQuadraticSource(p, s), p.centres.mean(axis=0) + 0.5


def _same(a, b, what, rtol=1e-10):
    """``a`` (family, numpy) and ``b`` (opaque, downloaded) agree to ``rtol`` relative to ``max|a|``."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, what
    np.testing.assert_allclose(b, a, rtol=0, atol=rtol * max(1.0, float(np.nanmax(np.abs(a)))), err_msg=what)


def _same_records(a: pd.DataFrame, b: pd.DataFrame, what: str) -> None:
    assert tuple(a.columns) == tuple(b.columns) == al.RECORD_COLUMNS
    assert len(a) == len(b), what
    for col in a.columns:
        if a[col].dtype.kind in "fiu":
            x, y = a[col].to_numpy(np.float64), b[col].to_numpy(np.float64)
            assert np.array_equal(np.isnan(x), np.isnan(y)), f"{what}: NaN pattern of {col}"
            ok = ~np.isnan(x)
            if ok.any():
                _same(x[ok], y[ok], f"{what}: {col}")
        else:
            assert (a[col].astype(str) == b[col].astype(str)).all(), f"{what}: {col}"


# --------------------------------------------------------------------------------------------- conformance


@pytest.mark.parametrize("family", sorted(_FAMILIES))
def test_family_source_conforms(family):
    p = _FAMILIES[family]()
    s = p.with_samples(np.random.default_rng(1), 20, 0.1)
    src = ClientSource(p, s)
    assert isinstance(src, Source)
    w = p._centres_all().mean(axis=(0, 1)) + 0.3
    check_source(src, w, np.array([0, 2, 5]), np.random.default_rng(2), batch_size=4, rtol=1e-12)
    check_source(ClientSource(p), w, np.arange(p.n_clients), np.random.default_rng(2), rtol=1e-12)


def test_opaque_source_conforms(pair):
    _, opq, w = pair
    assert isinstance(opq, Source)
    check_source(opq, w, np.array([1, 4]), np.random.default_rng(0), batch_size=5, rtol=1e-12)


class _Broken(ClientSource):
    """A family source with one contract violation."""

    def __init__(self, problem, samples, fault):
        super().__init__(problem, samples)
        self.fault = fault

    def evaluate(self, W, clients, batches=None):
        ev = super().evaluate(W, clients, batches)
        losses, gram, combine = ev.losses, ev.gram, ev.combine
        if self.fault == "scaled_combine":  # combine no longer matches the Gram
            combine = lambda mu: 2.0 * ev.combine(mu)  # noqa: E731
        elif self.fault == "nonlinear_combine":
            combine = lambda mu: ev.combine(mu**2)  # noqa: E731
        elif self.fault == "asymmetric_gram":
            gram = gram.copy()
            gram[:, 0, 1] += 1e-3
        elif self.fault == "negative_diagonal":  # one entry of one client, the Gram still symmetric
            gram = gram.copy()
            gram[1, 0, 0] = -1.0
        elif self.fault == "float32_gram":
            gram = gram.astype(np.float32)
        elif self.fault == "float32_losses":
            losses = losses.astype(np.float32)
        elif self.fault == "transposed_combine":
            combine = lambda mu: ev.combine(mu).T  # noqa: E731
        elif self.fault == "losses_differ" and batches is None:  # 1e-9 relative: below numpy's default atol
            losses = losses * (1.0 + 1e-9)
        return SimpleNamespace(losses=losses, gram=gram, combine=combine)

    def losses(self, W, clients):
        l = super().losses(W, clients)
        return l.astype(np.float32) if self.fault == "float32_losses_method" else l

    def episode(self, rng, client, size):
        idx = super().episode(rng, client, size)
        if self.fault == "episode_negative_index":
            idx = idx.copy()
            idx[0] = -1
        return idx + 1000 if self.fault == "episode_out_of_range" else idx

    def to_host(self, x):
        h = super().to_host(x)
        return h.astype(np.float32) if self.fault == "float32_to_host" else h


@pytest.mark.parametrize("fault,match", [
    ("scaled_combine", "μᵀCμ"), ("asymmetric_gram", "symmetric"), ("float32_losses", "float64"),
    ("nonlinear_combine", "population combine must be linear"),
    ("negative_diagonal", "population gram must have a non-negative diagonal"),
    ("float32_gram", r"population gram must be float64 numpy \(n, m, m\)"),
    ("losses_differ", r"evaluate\(batches=None\)\.losses must equal losses\(\)"),
    ("float32_losses_method", r"losses must return float64 numpy \(n, m\) = \(2, 3\)"),
    ("episode_out_of_range", r"episode of client 0 must hold distinct indices in \[0, 19\]"),
    ("episode_negative_index", r"episode of client 0 must hold distinct indices in \[0, 19\]"),
    ("float32_to_host", r"^_Broken: to_host must return a float64 numpy array of the array's shape$"),
    ("transposed_combine", r"^_Broken: combine must return \(2, 7\) arrays of the parameters' namespace$"),
])
def test_check_source_catches_contract_violations(fault, match):
    """Negative control of the conformance check: each violation is named."""
    p = _f1()
    s = p.with_samples(np.random.default_rng(1), 20, 0.1)
    src = _Broken(p, s, fault)
    with pytest.raises(AssertionError, match=match):
        check_source(src, p.centres.mean(axis=0), np.array([0, 1]), np.random.default_rng(0), batch_size=3)


class _InPlace(ClientSource):
    """A source that writes into the rows it is given (allowed: they are the caller's fresh arrays)."""

    def losses(self, W, clients):
        W[...] = W + 0.0
        return super().losses(W, clients)


def test_check_source_hands_the_source_writable_rows():
    p = _f1()
    check_source(_InPlace(p), p.centres.mean(axis=0), np.array([0, 1]), np.random.default_rng(0))


def test_huge_gradients_give_an_infinite_gram_without_a_warning():
    """Gradients whose inner products overflow: the Gram holds inf (Algorithm 1 then names it), numpy stays quiet."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ev = GradientEvaluation(np.ones((1, 2)), np.full((1, 3, 2), 1e200))
    assert np.isinf(ev.gram).all()


def test_minibatches_need_sample_level_data():
    p = _f1()
    with pytest.raises(ValueError, match=r"^minibatches: "):
        ClientSource(p).minibatch(np.zeros((1, p.n_params)), np.array([0]), [np.array([0])])


def test_episodes_and_sample_counts_need_sample_level_data():
    """A source without samples refuses an episode and the per-client sample counts with a ValueError naming what
    needed them; Algorithm 1 with ``rho='samples'`` on such a source is refused the same way."""
    p = _f1()
    src = ClientSource(p)
    with pytest.raises(ValueError, match=r"^episodes: this source has no sample-level data"):
        src.episode(np.random.default_rng(0), 0, 2)
    with pytest.raises(ValueError, match=r"^what needs them: this source has no sample-level data"):
        sample_counts(src, "what needs them")
    with pytest.raises(ValueError, match=r"^rho='samples': this source has no sample-level data"):
        al.phase1(src, np.arange(2), np.zeros(p.n_params), al.Phase1Config(rounds=1), np.random.default_rng(0),
                  rho="samples")


def test_check_source_refuses_what_is_not_a_source():
    with pytest.raises(AssertionError, match=r"^dict: does not implement the Source protocol \(see sim\.source\)$"):
        check_source({}, np.zeros(2), np.array([0]), np.random.default_rng(0))


def test_client_checks_name_the_bad_client():
    """Client lists outside ``0..N-1`` (one past either end), a ψ* unknown for one client of several, a batch too
    large for the second client only: each refused naming the value."""
    p = _f1()  # 6 clients
    src = ClientSource(p, p.with_samples(np.random.default_rng(1), np.array([20, 3, 20, 20, 20, 20]), 0.1))
    for bad in ([6], [0, 6], [-1], [-1, 2]):
        with pytest.raises(ValueError, match=re.escape(f"clients must lie in [0, 5]; got {bad}")):
            check_clients(src, bad)
    for bad in ([], [[0, 1]], [0.5, 1.0], "01"):
        with pytest.raises(ValueError, match=re.escape(
                f"clients must be a non-empty 1-D integer array of client indices; got {bad!r}")):
            check_clients(src, bad)
    np.testing.assert_array_equal(check_clients(src, [5, 0]), [5, 0])
    psi = p.psi_star.copy()
    psi[3] = np.nan
    one_unknown = ClientSource(p, psi_star=psi)
    with pytest.raises(ValueError, match=re.escape("psi_star is unknown for client(s) [3]")):
        check_psi_star(one_unknown, np.array([2, 3, 4]))
    np.testing.assert_array_equal(check_psi_star(one_unknown, np.array([2, 4])), p.psi_star[[2, 4]])
    with pytest.raises(ValueError, match=re.escape("S=5 is larger than client 1's local dataset (n_i=3)")):
        check_batch_size(src, np.array([0, 1, 2]), 5, "S")
    check_batch_size(src, np.array([0, 2]), 5, "S")
    check_batch_size(src, np.array([0, 1]), 3, "S")  # a batch of the whole dataset
    with pytest.raises(ValueError, match=re.escape("S=20 is larger than client 1's local dataset (n_i=3)")):
        check_batch_size(src, np.array([0, 1]), 20, "S")  # client 0 holds exactly 20: not the one named


def test_sample_data_and_single_clients_make_a_source():
    """``as_source`` wraps sample-level data with its problem; the losses of one client at its own point are the
    problem's."""
    p = _f1()
    s = p.with_samples(np.random.default_rng(1), 20, 0.1)
    src = as_source(s)
    assert isinstance(src, ClientSource) and src.problem is p and src.samples is s
    w = p.centres.mean(axis=0)[None, :] + 0.3
    full = np.broadcast_to(w, (p.n_clients, p.n_params))
    np.testing.assert_array_equal(src.losses(w, np.array([4])), p.losses_per_client(full)[[4]])


def test_algorithm_refuses_a_source_with_bad_host_arrays():
    p = _f1()
    src = _Broken(p, p.with_samples(np.random.default_rng(1), 20, 0.1), "float32_losses")
    with pytest.raises(ValueError, match=r"_Broken\.evaluate\(\.\.\.\)\.losses must be a float64 numpy array"):
        al.phase1(src, np.arange(3), p.centres.mean(axis=0), al.Phase1Config(rounds=1), np.random.default_rng(0))
    with pytest.raises(ValueError, match="source must be a Source"):
        al.phase1(object(), np.arange(3), p.centres.mean(axis=0), al.Phase1Config(rounds=1), np.random.default_rng(0))


# ------------------------------------------------------------------------ Gram-based = gradient-based diagnostics


@pytest.mark.parametrize("family", sorted(_FAMILIES))
@pytest.mark.parametrize("direction", ["lp", "linear", "chebyshev"])
def test_gram_diagnostics_equal_gradient_formulas(family, direction):
    """At 13 iterates of a Phase-1 run (population) and at minibatches: the recorded diagnostics computed from
    ``(l, C)`` and combine equal the G-based kernels to 1e-12 relative to the quantity's scale (margins:
    ``max_j λ_j‖g_j‖‖d‖``; ``‖d_M‖``: ``max_j λ_j‖g_j‖``; ``Δ_i``: ``max_i‖d_i‖``; ``H``: ``max_i‖d_i‖²``)."""
    p = _FAMILIES[family](seed=5)
    s = p.with_samples(np.random.default_rng(6), 25, 0.1)
    src = ClientSource(p, s)
    N = p.n_clients
    clients = np.arange(N)
    rng = np.random.default_rng(7)
    rho = rng.dirichlet(np.ones(N)) * 0.5 + 0.5 / N
    w0 = p._centres_all().mean(axis=(0, 1)) + 0.8
    run = al.phase1(src, clients, w0, al.Phase1Config(rounds=60, eta_local=0.1), rng, rho=rho)
    lam, psi_star = src.prefs, src.psi_star
    cfg, eta = al.Phase1Config(direction="lp" if direction == "lp" else "linear"), 0.1
    checked = 0
    for t, w in enumerate(run.trajectory[::5]):
        W = np.broadcast_to(w, (N, N_W))
        batches = None if t % 2 == 0 else [s.episode(rng, i, 6) for i in clients]
        ev = src.evaluate(W, clients, batches)
        l, G = src.population(W, clients) if batches is None else src.minibatch(W, clients, batches)
        dr = al._directions(ev, lam, direction, cfg, where="test", clients=clients)
        cols, B, _, _, hull_in = al._diagnostics(src, ev, clients, lam, psi_star, rho, eta, None, 0.0, dr, cfg,
                                                 direction, "test")
        cols.update(al._hull_diagnostics(src, lam, eta, [hull_in])[0])
        d = np.einsum("nwm,nm->nw", G, dr.weights)
        np.testing.assert_array_equal(dr.d, d)  # combine is the family's d = G μ
        gn = np.linalg.norm(G, axis=1)
        assert B == pytest.approx(gn.max(), rel=1e-12)
        m_eps = near_active_set(l, lam, eps_act(eta, lam, B))
        np.testing.assert_array_equal(m_eps.sum(axis=1), cols["n_Jeps"])
        m_star = near_active_set(l, lam, 0.0)
        dn = np.linalg.norm(d, axis=1)
        g_scale = (lam * gn).max(axis=1)
        for name, mask in (("margin_Jstar", m_star), ("margin_Jeps", m_eps)):
            ref = descent_margin(d, G, lam, mask)
            assert np.all(np.abs(cols[name] - ref) <= 1e-12 * g_scale * dn), name
        dM = min_norm_element(G * lam[:, None, :], m_eps).norm
        assert np.all(np.abs(cols["dM_norm"] - dM) <= 1e-12 * g_scale)
        np.testing.assert_allclose(cols["d_norm"], dn, rtol=1e-12, atol=0)
        assert np.all(np.abs(cols["deviation"] - deviations(d, rho)) <= 1e-12 * dn.max())
        assert abs(cols["dispersion"][0] - float(dispersion(d, rho))) <= 1e-12 * dn.max() ** 2
        checked += 1
    assert checked == 13


# ------------------------------------------------------------------- one Algorithm 1 for two implementations


def _runs(src, w, rng):
    """Every phase of Algorithm 1 on ``src`` (same seeds for both sources)."""
    train, new = np.arange(4), np.array([4, 5])
    P = np.diag(np.linspace(0.6, 1.4, N_W))
    out = {}
    out["phase1_population"] = al.phase1(src, train, w, al.Phase1Config(rounds=12, tau=2, eta_local=0.1), rng)
    out["phase1_minibatch"] = al.phase1(src, train, w, al.Phase1Config(rounds=6, tau=2, batch_size=5), rng,
                                        rho="samples")
    out["fedavg"] = al.fedavg(src, train, w, al.Phase1Config(rounds=8), rng)
    p1 = out["phase1_population"]
    out["phase2"] = al.phase2(src, train, p1.w, al.Phase2Config(rounds=6, S=4, K=3), rng, round_offset=12,
                              B_start=p1.B)
    w_I = out["phase2"].w
    base = al.AdaptConfig(K=5, S=6, alpha_adapt=0.1)
    batches = al.draw_batches(src, new, base.K, base.S, rng)
    for name, cfg in {
        "identity": base, "fixed": replace(base, preconditioner="fixed", P=P),
        "rmsprop_lagged": replace(base, preconditioner="rmsprop_lagged"),
        "rmsprop_current": replace(base, preconditioner="rmsprop_current"),
        "adamw": replace(base, preconditioner="adamw", weight_decay=0.05),
        "sgd": replace(base, preconditioner="sgd", momentum=0.5, weight_decay=0.05),
        "chebyshev": replace(base, direction="chebyshev"), "linear": replace(base, direction="linear"),
    }.items():
        out[f"pipeline1_{name}"] = al.pipeline1(src, new, w_I, cfg, batches=batches)
    out["pipeline2"] = al.pipeline2(src, new, w_I, al.Pipeline2Config(max_steps=150, record_every=20))
    return out


def test_opaque_source_runs_algorithm_1_like_the_family_source(pair):
    fam, opq, w = pair
    a = _runs(fam, w, np.random.default_rng(11))
    b = _runs(opq, w, np.random.default_rng(11))
    assert set(a) == set(b)
    for name in a:
        _same(a[name].trajectory, opq.download(b[name].trajectory), f"{name} trajectory")
        _same_records(a[name].records, b[name].records, name)
    for name in ("phase1_population", "phase2"):
        assert a[name].step_status_counts == b[name].step_status_counts
        assert a[name].B == pytest.approx(b[name].B, rel=1e-12)
    # the runs moved and the LP worked: balancing and descent steps both happened
    assert np.abs(a["phase2"].w - w).max() > 0.1
    modes = pd.concat([a[n].records for n in a])["lp_mode"].value_counts()
    assert modes.get("balance", 0) > 0 and modes.get("descent", 0) > 0
    ref = al.shared_iteration(fam, np.arange(4), w, None, 0.1, 15)
    _same(ref, opq.download(al.shared_iteration(opq, np.arange(4), w, None, 0.1, 15)), "shared iteration")


def test_opaque_source_run_algorithm_end_to_end(pair):
    """run_algorithm (clustering, both phases, FedAvg, every pipeline and the summary) through both sources, and
    without trajectories."""
    fam, opq, w = pair
    cfg = al.AlgorithmConfig(
        phase1=al.Phase1Config(rounds=5, tau=2), phase2=al.Phase2Config(rounds=3, S=4, K=2),
        adapt=al.AdaptConfig(K=4, S=5, preconditioner="rmsprop_lagged"),
        adamw=al.AdaptConfig(K=4, S=5, preconditioner="adamw", weight_decay=0.01),
        pipeline2=al.Pipeline2Config(max_steps=40, record_every=10),
    )
    kw = dict(w_ref=w, train_clients=np.arange(4), new_clients=np.array([4, 5]))
    a = al.run_algorithm(fam, cfg, np.random.default_rng(2), **kw)
    b = al.run_algorithm(opq, cfg, np.random.default_rng(2), keep_trajectory=False, **kw)
    _same_records(a.records, b.records, "run_algorithm")
    for name in ("w_I", "w_II", "w_fedavg"):
        _same(getattr(a, name), opq.download(getattr(b, name)), name)
    assert all(res.trajectory is None for res in b.adaptation.values())
    assert all(res.trajectory is None for ph in b.phases.values() for res in ph.values())
    fa, fb = a.summary["mean_final_gap"], b.summary["mean_final_gap"]
    assert set(fa) == set(fb) and all(fb[k] == pytest.approx(fa[k], rel=1e-9, abs=1e-12) for k in fa)


def test_divergence_through_the_boundary_names_phase_client_and_step(pair):
    """A diverging run is reported from the host losses / Grams alone, whatever the source."""
    _, opq, w = pair
    with pytest.raises(al.DivergenceError, match=r"phase1 cluster 0 round \d+ .*client \d+ .*step size 3\.0.*diverged"):
        al.phase1(opq, np.arange(4), w, al.Phase1Config(rounds=500, eta_local=3.0), np.random.default_rng(0))


# ----------------------------------------------------------- records as a run goes, extra columns, refused losses


class _MetricSource(OpaqueQuadraticSource):
    """The opaque source with the optional ``record_metrics`` (each loss and the distance of the row from the
    origin, downloaded as one scalar per row) and a loss it refuses past ``refuse_after`` calls of ``losses``."""

    refuse_after: int | None = None

    def record_metrics(self, W, clients, losses):
        self.metric_calls = getattr(self, "metric_calls", 0) + 1
        out = {f"loss_q{j}": losses[:, j].copy() for j in range(losses.shape[1])}
        out["w_norm"] = self.to_host(xps.sqrt(xps.sum(W * W, axis=-1)))
        return out

    def losses(self, W, clients):
        self.loss_calls = getattr(self, "loss_calls", 0) + 1
        if self.refuse_after is not None and self.loss_calls > self.refuse_after:
            raise FloatingPointError(f"client {int(clients[0])}, objective 'q1': loss at its floor")
        return super().losses(W, clients)


def test_rows_stream_as_made_with_the_source_metric_columns(pair):
    """``on_rows`` gets each round's rows as they are made (together: the records); the source's metric columns
    follow RECORD_COLUMNS and hold its values; a source without ``record_metrics`` keeps RECORD_COLUMNS exactly."""
    fam, opq, w = pair
    src = _MetricSource.__new__(_MetricSource)
    src.__dict__.update(opq.__dict__)
    cfg = al.AlgorithmConfig(phase1=al.Phase1Config(rounds=3, tau=2), phase2=al.Phase2Config(rounds=2, S=4, K=2),
                             adapt=al.AdaptConfig(K=3, S=5), pipeline2=al.Pipeline2Config(max_steps=8, record_every=4))
    kw = dict(w_ref=w, train_clients=np.arange(4), new_clients=np.array([4, 5]))
    seen: list[pd.DataFrame] = []
    res = al.run_algorithm(src, cfg, np.random.default_rng(2), keep_trajectory=False, on_rows=seen.append, **kw)
    extra = ["loss_q0", "loss_q1", "loss_q2", "w_norm"]
    assert list(res.records.columns) == [*al.RECORD_COLUMNS, *extra]
    assert len(seen) > 10 and all(list(f.columns) == list(res.records.columns) for f in seen)
    streamed = pd.concat(seen, ignore_index=True)
    key = ["phase", "cluster", "round", "client"]
    a = streamed.sort_values(key, kind="stable").reset_index(drop=True)
    b = res.records.sort_values(key, kind="stable").reset_index(drop=True)
    pd.testing.assert_frame_equal(a, b, check_dtype=False)
    lam = src.prefs[res.records["client"].to_numpy()]
    L = res.records[extra[:3]].to_numpy()
    np.testing.assert_allclose(res.records["psi"], (lam * L).max(axis=1), rtol=1e-14)
    assert (res.records["w_norm"] > 0).all()
    plain = al.run_algorithm(fam, cfg, np.random.default_rng(2), keep_trajectory=False, **kw)
    assert tuple(plain.records.columns) == al.RECORD_COLUMNS
    _same_records(plain.records, res.records[list(al.RECORD_COLUMNS)], "with metric columns")


def test_a_loss_the_source_refuses_stops_the_run_naming_phase_round_and_client(pair):
    _, opq, w = pair
    src = _MetricSource.__new__(_MetricSource)
    src.__dict__.update(opq.__dict__)
    src.refuse_after = 3
    new = np.array([4, 5])
    batches = al.draw_batches(src, new, 6, 5, np.random.default_rng(0))
    with pytest.raises(al.DivergenceError, match=r"^pipeline1 step 3: client 4, objective 'q1': loss at its floor "
                                                 r"with step size 0\.1$"):
        al.pipeline1(src, new, w, al.AdaptConfig(K=6, S=5, alpha_adapt=0.1), batches=batches)
