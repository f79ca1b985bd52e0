"""Tests of sim.algorithm.phases (Algorithm 1's clustering, the shared iteration eq 55, Phase 1 and Phase 2;
docs/spec/algorithm.md#algorithm), with the phases' input checks, LP status counts, records and hull
diagnostics.

Measured numbers asserted below (seeded, deterministic):

* Phase 1 on a planted F1 cluster with spread s_u = 0.01 (seed 0, m=3, n_w=4, N=5, τ=2, eta_local=0.05,
  alpha_server=1, 150 rounds): r_i falls from 1.53-1.57 at w_ref to 0.0053-0.0102 (a band, stationary to 1e-12);
  the smallest per-client reduction factor is 150. Asserted: factor >= 50.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

import sim.algorithm as al
import sim.algorithm.evaluation as al_evaluation
import sim.algorithm.phases as al_phases
from sim.cluster import cluster_clients
from sim.direction import STATUSES
from sim.problems import PerturbedClients, PlantedQuadraticCluster
from sim.simulate import ProblemSpec, build_problem


def _f1(seed=0, n_clients=5, spread=0.05, m=3, n_w=4):
    return PlantedQuadraticCluster.make(np.random.default_rng(seed), m=m, n_w=n_w, n_clients=n_clients,
                                        spread=spread)


def _f2(seed=0, n_clients=5):
    return PerturbedClients.make(np.random.default_rng(seed), m=3, n_w=4, n_clients=n_clients, shift=0.05,
                                 prefs="planted", spread=0.05)


_FAMILIES = {"F1": _f1, "F2": _f2}


@pytest.mark.parametrize("family", sorted(_FAMILIES))
def test_phase1_tau1_population_is_shared_iteration_eq55(family):
    """τ = 1, population gradients: w_{r+1} = w_r - alpha_server·eta_local·Σρ_i d_i(w_r) (eq 55), to 1e-12."""
    p = _FAMILIES[family]()
    clients = np.arange(p.n_clients)
    rho = np.array([0.1, 0.3, 0.2, 0.25, 0.15])
    w0 = p.centres.mean(axis=0) + 0.7
    cfg = al.Phase1Config(rounds=60, tau=1, eta_local=0.25, alpha_server=0.4)
    res = al.phase1(p, clients, w0, cfg, np.random.default_rng(0), rho=rho)
    ref = al.shared_iteration(p, clients, w0, rho, cfg.eta_eff, cfg.rounds)
    assert cfg.eta_eff == pytest.approx(0.1, rel=1e-15)
    np.testing.assert_allclose(res.trajectory, ref, rtol=0, atol=1e-12)
    assert np.abs(res.trajectory[-1] - res.trajectory[0]).max() > 0.1  # the iteration moved
    # with population gradients the round's first step is the recorded LP
    rows = res.records[res.records["round"] < cfg.rounds]
    assert rows["lp_from_step"].all()


@pytest.mark.parametrize("family", sorted(_FAMILIES))
def test_phase2_K1_population_continues_the_same_trajectory(family):
    """Phase 1 (η_I) then Phase 2 with K = 1, population gradients (η_II = alpha_server·eta_meta_inner) is eq 55
    with the step η_I for R rounds and η_II for R' rounds, to 1e-12."""
    p = _FAMILIES[family](seed=3)
    clients = np.arange(p.n_clients)
    w0 = p.centres.mean(axis=0) - 0.6
    c1 = al.Phase1Config(rounds=25, tau=1, eta_local=0.2, alpha_server=0.5)
    c2 = al.Phase2Config(rounds=30, S=None, K=1, eta_meta_inner=0.1, alpha_server=0.7)
    rng = np.random.default_rng(5)
    r1 = al.phase1(p, clients, w0, c1, rng)
    r2 = al.phase2(p, clients, r1.w, c2, rng, round_offset=c1.rounds, B_start=r1.B)
    traj = np.concatenate([r1.trajectory, r2.trajectory[1:]])
    steps = np.r_[np.full(c1.rounds, c1.eta_eff), np.full(c2.rounds, c2.eta_eff)]
    ref = al.shared_iteration(p, clients, w0, None, steps, c1.rounds + c2.rounds)
    assert c2.eta_eff == pytest.approx(0.07, rel=1e-15)
    np.testing.assert_allclose(traj, ref, rtol=0, atol=1e-12)
    # global round index t continues across the phases
    assert r2.records["t"].min() == c1.rounds and r2.records["t"].max() == c1.rounds + c2.rounds
    assert (r2.records["grad_bound"] >= r1.B).all()


def test_algorithm_clustering_step_uses_cluster_clients_end_to_end(monkeypatch):
    """Two planted groups with distinct u_0: Algorithm 1's clustering step is sim.cluster.cluster_clients at
    w_ref, recovers the groups, trains each cluster separately and assigns new clients to their group."""
    spec = ProblemSpec(m=3, n_w=4, n_groups=2, n_train=3, n_new=1, spread=0.02, train_samples=30,
                       new_samples=60)
    src, w_ref, train, new, groups = build_problem(spec, np.random.default_rng(4))
    calls = []
    real = al_phases.cluster_clients

    def spy(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(al_phases, "cluster_clients", spy)
    cfg = al.AlgorithmConfig(
        cluster=al.ClusterConfig(threshold=0.25),
        phase1=al.Phase1Config(rounds=4), phase2=al.Phase2Config(rounds=2, S=4, K=2),
        adapt=al.AdaptConfig(K=2, S=4), pipeline2=al.Pipeline2Config(max_steps=5),
    )
    res = al.run_algorithm(src, cfg, np.random.default_rng(0), w_ref=w_ref, train_clients=train, new_clients=new)
    assert len(calls) == 1
    l_ref = src.problem.losses_per_client(np.broadcast_to(w_ref, (src.n_clients, src.n_params)))[train]
    direct = cluster_clients(l_ref, src.prefs[train], threshold=0.25)
    np.testing.assert_array_equal(res.clustering.labels, direct.labels)
    np.testing.assert_allclose(calls[0][0][0], l_ref, rtol=1e-15)
    # the clusters are the planted groups
    part = {frozenset(train[c].tolist()) for c in res.clustering.clusters}
    assert part == {frozenset(train[groups[train] == g].tolist()) for g in range(spec.n_groups)}
    # each cluster's phases record exactly its members; new clients go to their group's cluster
    for c, members in enumerate(res.clustering.clusters):
        for ph in ("phase1", "phase2", "fedavg"):
            rows = res.records[(res.records["phase"] == ph) & (res.records["cluster"] == c)]
            assert set(rows["client"]) == set(train[members].tolist())
    for i, c in zip(new, res.assignment, strict=True):
        assert groups[train[res.clustering.clusters[c][0]]] == groups[i]


def test_phase1_drives_every_gap_to_a_band():
    """Planted F1, spread 0.01: measured r_i(w_ref) = 1.53-1.57, r_i(w_I) = 0.0053-0.0102, min factor 150."""
    p = _f1(seed=0, n_clients=5, spread=0.01)
    w_ref = p.centres.mean(axis=0) + 0.5
    cfg = al.Phase1Config(rounds=150, tau=2, eta_local=0.05, alpha_server=1.0)
    res = al.phase1(p, np.arange(5), w_ref, cfg, np.random.default_rng(0))
    df = res.records
    r0 = df[df["round"] == 0].sort_values("client")["gap"].to_numpy()
    rR = df[df["round"] == cfg.rounds].sort_values("client")["gap"].to_numpy()
    r100 = df[df["round"] == 100].sort_values("client")["gap"].to_numpy()
    np.testing.assert_allclose(r0, [1.534, 1.550, 1.566, 1.552, 1.539], atol=2e-3)
    assert np.all(rR >= -1e-12) and np.all(rR <= 0.011)
    assert (r0 / rR).min() >= 50.0  # measured 150
    assert np.abs(rR - r100).max() <= 1e-8  # the band is reached (stationary)
    # gaps are measured against the planted optimum
    np.testing.assert_allclose(df["psi_star"].to_numpy(), np.tile(p.psi_star, cfg.rounds + 1), rtol=1e-15)


@pytest.mark.parametrize("policy,event", [("fallback_preference", "fallback"), ("relaxed", "relaxed")])
def test_every_lp_fallback_is_counted_in_the_records(monkeypatch, policy, event):
    """Restricted descent LPs that are infeasible (minibatches, descent mode) are counted: the statuses of every
    lp_direction call equal the step counts in the records plus the separate diagnostic LPs."""
    rng = np.random.default_rng(0)
    p = PerturbedClients.make(rng, m=3, n_w=3, n_clients=4, shift=0.3, prefs="planted", spread=0.3)
    s = p.with_samples(rng, 50, 0.2)
    seen = {st: 0 for st in STATUSES}
    real = al_evaluation.lp_direction

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        for st, c in out.status_counts().items():
            seen[st] += c
        return out

    monkeypatch.setattr(al_evaluation, "lp_direction", spy)
    cfg = al.Phase1Config(rounds=40, tau=2, eta_local=0.1, eps_mode=0.05, on_infeasible=policy, batch_size=4)
    res = al.phase1(s, np.arange(4), p.centres.mean(axis=0) + 1.0, cfg, rng)
    df = res.records
    steps = {st: int(df[f"n_{st}"].sum()) for st in STATUSES}
    assert steps == res.step_status_counts
    diag = df[~df["lp_from_step"]]["lp_status"].value_counts().to_dict()
    assert {st: diag.get(st, 0) for st in STATUSES} == res.diagnostic_status_counts
    assert {st: steps[st] + res.diagnostic_status_counts[st] for st in STATUSES} == seen
    assert steps[event] > 0  # the events happen (measured: 16 fallbacks with this seed)
    assert int(df["n_lp_steps"].sum()) == cfg.rounds * cfg.tau * 4
    assert (df["n_descent_steps"] >= df["n_fallback"] + df["n_relaxed"]).all()


def test_lp_without_solution_raises(monkeypatch, f1_samples):
    src, w0 = f1_samples
    real = al_evaluation.lp_direction

    def broken(*args, **kwargs):
        out = real(*args, **kwargs)
        status = out.status.copy()
        status[1] = "iteration_limit"
        w = out.weights.copy()
        w[1] = np.nan
        return replace(out, status=status, weights=w)

    monkeypatch.setattr(al_evaluation, "lp_direction", broken)
    with pytest.raises(al.LPFailureError, match="iteration_limit"):
        al.phase1(src, np.arange(3), w0, al.Phase1Config(rounds=2), np.random.default_rng(0))


def test_clustering_step_uses_the_config_it_is_given_and_checks_w_ref(f1_samples):
    """``clustering_step`` with a config is ``cluster_clients`` at ``w_ref`` with that config's settings (key,
    stages, method, threshold or k), without one as ``ClusterConfig()``; a ``w_ref`` of the wrong shape or not
    finite is refused by name."""
    p = _f1(seed=3, n_clients=8, spread=0.1)  # one Stage-1 group where k-means and complete linkage disagree
    clients = np.arange(8)
    w_ref = p.centres.mean(axis=0) + 0.5
    l_ref = p.losses_per_client(np.broadcast_to(w_ref, (8, p.n_params)))
    configs = [al.ClusterConfig(), al.ClusterConfig(threshold=0.0), al.ClusterConfig(key="bottleneck"),
               al.ClusterConfig(stage2=False), al.ClusterConfig(method="kmeans", k=3, threshold=None),
               al.ClusterConfig(threshold=None, k=3)]
    got = []
    for cfg in configs:
        c = al.clustering_step(p, clients, w_ref, cfg, np.random.default_rng(0))
        direct = cluster_clients(l_ref, p.prefs, key=cfg.key, stage2=cfg.stage2, method=cfg.method,
                                 threshold=cfg.threshold if cfg.stage2 else None, k=cfg.k if cfg.stage2 else None,
                                 rng=np.random.default_rng(0))
        np.testing.assert_array_equal(c.labels, direct.labels, err_msg=str(cfg))
        np.testing.assert_array_equal(c.keys, direct.keys, err_msg=str(cfg))
        got.append(c)
    np.testing.assert_array_equal(al.clustering_step(p, clients, w_ref).labels, got[0].labels)
    assert got[1].n_clusters == 8 and got[3].n_clusters == 1 and got[2].keys.shape == (8, 1)
    assert not np.array_equal(got[4].labels, got[5].labels)  # k-means is not complete linkage here
    src, w_ref = f1_samples
    clients = np.arange(6)
    for bad, shape in ((w_ref[:2], r"\(2,\)"), (np.full(4, np.nan), r"\(4,\)")):
        with pytest.raises(ValueError, match=rf"^w_ref must be a finite array of shape \(4,\); got shape {shape}$"):
            al.clustering_step(src, clients, bad)


def test_phase_and_pipeline_records_name_their_defaults(f1_samples):
    """Without ``cluster=`` / ``phase=`` / ``round_offset=``: Phase 1 records cluster 0 and its rounds as the time
    ``t``, Pipeline 1 the phase "pipeline1"."""
    src, w0 = f1_samples
    ph = al.phase1(src, np.arange(3), w0, al.Phase1Config(rounds=1), np.random.default_rng(0))
    assert set(ph.records["cluster"]) == {0} and set(ph.records["phase"]) == {"phase1"}
    assert ph.records["t"].tolist() == ph.records["round"].tolist() == [0, 0, 0, 1, 1, 1]
    params = ph.records.attrs["params"]  # the run's parameters travel with its records
    assert (params["phase"], params["cluster"], params["clients"]) == ("phase1", 0, [0, 1, 2])
    assert len(params["rho"]) == 3 and abs(sum(params["rho"]) - 1.0) < 1e-12
    p1 = al.pipeline1(src, np.array([4]), w0, al.AdaptConfig(K=1, S=2), np.random.default_rng(0))
    assert set(p1.records["phase"]) == {"pipeline1"} and set(p1.records["cluster"]) == {-1}


def test_shared_iteration_names_a_bad_round_count(f1_samples):
    src, w0 = f1_samples
    for bad in (-1, 1.5):
        with pytest.raises(ValueError, match=rf"^shared_iteration\.rounds must be an integer >= 0; got {bad}$"):
            al.shared_iteration(src, np.arange(3), w0, None, 0.1, bad)


def test_the_stacked_hull_diagnostics_check_each_gram_once(f1_samples, monkeypatch):
    """A stack of rounds' Grams is checked once, by the minimum-norm weights: the two descent margins computed from
    the same Grams skip the check (``validate=False``), so the diagnostics do not validate the same data three times."""
    import sim.hull as hull

    src, w0 = f1_samples
    seen = {"gram": 0, "stacks": 0}
    check, stack = hull.check_gram, al_phases._hull_diagnostics_stack

    def counted_check(*a, **k):
        seen["gram"] += 1
        return check(*a, **k)

    def counted_stack(*a, **k):
        seen["stacks"] += 1
        return stack(*a, **k)

    monkeypatch.setattr(hull, "check_gram", counted_check)
    monkeypatch.setattr(al_phases, "_hull_diagnostics_stack", counted_stack)
    al.phase1(src, np.arange(3), w0, al.Phase1Config(rounds=3), np.random.default_rng(0))
    assert seen["stacks"] >= 1 and seen["gram"] == seen["stacks"]


def test_bad_run_inputs_raise(f1_samples):
    src, w0 = f1_samples
    rng = np.random.default_rng(0)
    cl = np.arange(4)
    with pytest.raises(ValueError, match="sum to 1"):
        al.phase1(src, cl, w0, al.Phase1Config(rounds=1), rng, rho=[0.3, 0.3, 0.3, 0.3])
    with pytest.raises(ValueError, match="rho"):
        al.phase1(src, cl, w0, al.Phase1Config(rounds=1), rng, rho=[0.5, 0.5])
    with pytest.raises(ValueError, match=r"S=41 is larger than client 0's local dataset \(n_i=40\)"):
        al.phase2(src, cl, w0, al.Phase2Config(rounds=1, S=41), rng)
    with pytest.raises(ValueError, match="batch_size=50"):
        al.phase1(src, cl, w0, al.Phase1Config(rounds=1, batch_size=50), rng)
    with pytest.raises(ValueError, match="S=41"):
        al.pipeline1(src, cl, w0, al.AdaptConfig(K=2, S=41), rng)
    with pytest.raises(ValueError, match="w0"):
        al.phase1(src, cl, w0[:2], al.Phase1Config(rounds=1), rng)
    with pytest.raises(ValueError, match="repeated"):
        al.phase1(src, np.array([0, 0]), w0, al.Phase1Config(rounds=1), rng)
    with pytest.raises(ValueError, match="rng"):
        al.phase1(src, cl, w0, al.Phase1Config(rounds=1), 0)
    with pytest.raises(ValueError, match="psi_star is unknown"):
        al.phase1(al.ClientSource(src.problem, psi_star=np.full(6, np.nan)), cl, w0, al.Phase1Config(rounds=1), rng)
    with pytest.raises(ValueError, match="sample-level"):
        al.phase2(src.problem, cl, w0, al.Phase2Config(rounds=1, S=2), rng)
    with pytest.raises(ValueError, match="take part in training"):
        al.run_algorithm(src, al.AlgorithmConfig(), rng, w_ref=w0, train_clients=cl, new_clients=[3, 4])


@pytest.mark.parametrize("batch_size", [None, 5])
def test_hull_diagnostics_stacked_over_rounds_equal_round_by_round(monkeypatch, f1_samples, batch_size):
    """The rounds' hull diagnostics (ε_act, J*_ε, d_M, the margins) of host evaluations wait for one call over the
    rounds: the records are bitwise those of the rounds one by one (rows streamed to ``on_rows``, or a waiting
    limit of zero), for Phase 1 (population and minibatch gradients) and Phase 2."""
    src, w0 = f1_samples
    clients = np.arange(src.n_clients)
    runs = {
        "phase1": lambda **kw: al.phase1(src, clients, w0, al.Phase1Config(rounds=12, tau=2, eta_local=0.05,
                                                                           batch_size=batch_size),
                                         np.random.default_rng(3), **kw),
        "phase2": lambda **kw: al.phase2(src, clients, w0, al.Phase2Config(rounds=8, S=4, K=2),
                                         np.random.default_rng(3), **kw),
    }
    for name, run in runs.items():
        stacked = run().records
        streamed_rows = []
        streamed = run(on_rows=streamed_rows.append).records
        monkeypatch.setattr(al_phases, "_PENDING_GRADIENTS", 0)
        one_by_one = run().records
        monkeypatch.undo()
        assert len(streamed_rows) == stacked["round"].nunique()  # one round at a time
        assert np.isfinite(stacked["dM_norm"]).all() and (stacked["n_Jeps"] >= 1).all(), name
        pd.testing.assert_frame_equal(stacked, streamed, check_exact=True)
        pd.testing.assert_frame_equal(stacked, one_by_one, check_exact=True)


def test_assign_to_cluster_names_a_clustering_of_other_clients(adaptation_setup):
    """A new client is assigned by the training clients of the clustering given; a clustering of 4 clients with 6
    training clients is refused with both counts named, not read against the wrong clients."""
    src, w_I, new, _ = adaptation_setup
    train = np.arange(6)
    clustering = al.clustering_step(src, train[:4], w_I)
    with pytest.raises(ValueError, match="clustering has 4 clients but train_clients has 6"):
        al.assign_to_cluster(src, new, w_I, clustering, train)
    full = al.clustering_step(src, train, w_I)
    labels = al.assign_to_cluster(src, new, w_I, full, train)
    assert labels.shape == new.shape and set(labels.tolist()) <= set(range(len(full.clusters)))


def test_a_stack_of_rounds_refused_by_the_hull_checks_gives_the_round_by_round_error(f1_samples):
    """A source whose third evaluation returns an asymmetric Gram (direction "linear": no LP checks it first): the
    rounds' stacked hull diagnostics refuse it, and the error is the one the rounds give one at a time (rows
    streamed to ``on_rows``): the refused round's own, naming its client by its position in the round (1,), not
    by a position in a stack of rounds."""
    src0, w0 = f1_samples

    class _Skew(al.ClientSource):
        def __init__(self, problem, samples):
            super().__init__(problem, samples)
            self.calls = 0

        def evaluate(self, W, clients, batches=None):
            ev = super().evaluate(W, clients, batches)
            self.calls += 1
            if self.calls == 3:
                C = ev.gram.copy()
                C[1, 0, 1] += 1e-3
                object.__setattr__(ev, "gram", C)
            return ev

    cfg = al.Phase1Config(rounds=4, direction="linear")
    msgs = []
    for kw in ({}, {"on_rows": lambda rows: None}):
        with pytest.raises(ValueError, match=r"^gram must be symmetric; instance \(1,\) has max ") as info:
            al.phase1(_Skew(src0.problem, src0.samples), np.arange(3), w0, cfg, np.random.default_rng(0), **kw)
        msgs.append(str(info.value))
    assert msgs[0] == msgs[1]


def test_phase2_refuses_another_configuration():
    p = _FAMILIES["F1"](seed=3)
    with pytest.raises(ValueError, match="config must be a Phase2Config; got Phase1Config"):
        al.phase2(p, np.arange(p.n_clients), p.centres.mean(axis=0), al.Phase1Config(), np.random.default_rng(0))
