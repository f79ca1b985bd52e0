"""Remark H.8's clustering comparison (sim.algorithm.comparison_clusterings / phase1_by_clustering) and the LP
inputs in the records (a source's ``record_lp_inputs``), on a planted F1 problem."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from sim import algorithm as al
from sim.cluster import cluster_clients
from sim.constants import client_basis
from sim.direction import lp_direction


@pytest.fixture(scope="module")
def problem():
    spec = al.ProblemSpec(m=3, n_w=4, n_groups=3, n_train=3, n_new=0, spread=0.05)
    src, w_ref, train, _new, _groups = al.build_problem(spec, np.random.default_rng(3))
    clus = al.clustering_step(src, train, w_ref, al.ClusterConfig(threshold=0.25), np.random.default_rng(4))
    return src, w_ref, train, clus


def test_random_partition_sizes_and_errors():
    rng = np.random.default_rng(0)
    parts = al.random_partition(rng, [3, 1, 2])
    assert [len(p) for p in parts] == [3, 1, 2]
    assert sorted(np.concatenate(parts).tolist()) == list(range(6))
    assert all(np.all(np.diff(p) > 0) for p in parts)
    with pytest.raises(ValueError, match="positive integers"):
        al.random_partition(rng, [2, 0])
    # sizes from any iterable of integers (numpy's too); a fractional size is refused, not truncated
    gen = al.random_partition(np.random.default_rng(0), (n for n in [3, 1, 2]))
    assert [len(p) for p in gen] == [3, 1, 2] and all(np.array_equal(a, b) for a, b in zip(gen, parts, strict=True))
    assert [len(p) for p in al.random_partition(rng, np.array([2, 2]))] == [2, 2]
    for bad in ([2.5, 1], [2, True]):
        with pytest.raises(ValueError, match=re.escape(f"sizes must be positive integers; got {bad}")):
            al.random_partition(rng, bad)


def test_comparison_clusterings_are_the_stage1_groups_and_random_partitions_of_the_same_sizes(problem):
    src, w_ref, train, clus = problem
    parts = al.comparison_clusterings(clus, np.random.default_rng(1), 3)
    assert [(n, d) for n, d, _ in parts] == [("stage1_stage2", 0), ("stage1_only", 0), ("random", 0), ("random", 1),
                                             ("random", 2)]
    assert tuple(dict.fromkeys(n for n, _, _ in parts)) == al.CLUSTERING_NAMES  # the names the studies group by
    assert al.same_partition(parts[0][2], clus.clusters)
    l = src.losses(np.broadcast_to(w_ref, (train.size, src.n_params)), train)
    s1 = cluster_clients(l, src.prefs[train], key="ordering", stage2=False)
    assert al.same_partition(parts[1][2], s1.clusters)
    sizes = sorted(len(c) for c in clus.clusters)
    for _, _, p in parts[2:]:
        assert sorted(len(c) for c in p) == sizes
    again = al.comparison_clusterings(clus, np.random.default_rng(1), 3)
    assert all(al.same_partition(a[2], b[2]) for a, b in zip(parts, again, strict=True))
    assert not al.same_partition(parts[0][2], [np.arange(train.size)])
    with pytest.raises(ValueError, match="n_random"):
        al.comparison_clusterings(clus, np.random.default_rng(1), -1)
    # no random partition asked for: the two clusterings of Algorithm 1 alone; the Stage-1 groups in their order
    only = al.comparison_clusterings(clus, np.random.default_rng(1), 0)
    assert [n for n, _, _ in only] == ["stage1_stage2", "stage1_only"]
    assert [c.tolist() for c in only[1][2]] == [c.tolist() for c in s1.clusters]


def test_phase1_by_clustering_is_phase1_per_cluster(problem):
    src, w_ref, train, clus = problem
    cfg = al.Phase1Config(rounds=4, tau=1, eta_local=0.1)
    parts = al.comparison_clusterings(clus, np.random.default_rng(1), 1)
    seen = []
    recs = al.phase1_by_clustering(src, train, w_ref, parts, cfg, np.random.default_rng(2), on_rows=seen.append)
    assert list(recs.columns[:2]) == ["clustering", "draw"]
    assert set(recs.columns[2:]) >= set(al.RECORD_COLUMNS)
    pd.testing.assert_frame_equal(pd.concat(seen, ignore_index=True), recs, check_dtype=False)
    for name, draw, clusters in parts:
        for c, members in enumerate(clusters):
            want = al.phase1(src, train[members], w_ref, cfg, np.random.default_rng(2), cluster=c).records
            got = recs[(recs["clustering"] == name) & (recs["draw"] == draw) & (recs["cluster"] == c)]
            got = got.drop(columns=["clustering", "draw"]).reset_index(drop=True)
            pd.testing.assert_frame_equal(got, want.reset_index(drop=True), check_exact=True)
    with pytest.raises(ValueError, match=re.escape("rho must be 'uniform' or 'samples' (one rule for every cluster)")):
        al.phase1_by_clustering(src, train, w_ref, parts, cfg, np.random.default_rng(2), rho=np.ones(3))


def test_phase1_by_clustering_takes_the_weighting_rule_and_client_lists(problem):
    """``rho="uniform"`` is the default rule; ``rho="samples"`` weighs each cluster's clients by their sample counts
    (the records' ``rho`` column); clients may be a list; an empty cluster is refused as a client list; no
    clustering at all gives the empty records with their columns."""
    src, w_ref, train, clus = problem
    cfg = al.Phase1Config(rounds=1)
    parts = [("stage1_stage2", 0, clus.clusters)]
    calls = []
    base = al.phase1_by_clustering(src, train, w_ref, parts, cfg, np.random.default_rng(2),
                                   progress=lambda *a: calls.append(a))
    assert {name for name, *_ in calls} == {f"phase1 cluster {c}" for c in range(len(clus.clusters))}
    uni = al.phase1_by_clustering(src, train.tolist(), w_ref, parts, cfg, np.random.default_rng(2), rho="uniform")
    pd.testing.assert_frame_equal(uni, base)
    counts = np.arange(1, src.n_clients + 1) * 10
    weighted = al.ClientSource(src.problem, src.problem.with_samples(np.random.default_rng(0), counts, 0.1))
    rec = al.phase1_by_clustering(weighted, train, w_ref, parts, cfg, np.random.default_rng(2), rho="samples")
    for c, members in enumerate(clus.clusters):
        rows = rec[(rec["cluster"] == c) & (rec["round"] == 0)].set_index("client")["rho"]
        n = counts[train[members]]
        np.testing.assert_allclose(rows.loc[train[members]].to_numpy(), n / n.sum(), rtol=1e-15)
    with pytest.raises(ValueError, match="clients must be a non-empty 1-D integer array"):
        al.phase1_by_clustering(src, train, w_ref, [("empty", 0, [[]])], cfg, np.random.default_rng(2))
    empty = al.phase1_by_clustering(src, train, w_ref, [], cfg, np.random.default_rng(2))
    assert empty.empty and list(empty.columns) == ["clustering", "draw", *al.RECORD_COLUMNS]


def test_recorded_lp_inputs_re_solve_to_the_recorded_weights(problem, tmp_path):
    src, w_ref, train, clus = problem
    cfg = al.Phase1Config(rounds=3, tau=1, eta_local=0.1)
    clients = train[clus.clusters[0]]
    plain = al.phase1(src, clients, w_ref, cfg, np.random.default_rng(0)).records
    assert not any(c.startswith(("gram_", "mu_")) for c in plain.columns)  # off unless the source asks
    src.record_lp_inputs = True
    try:
        res = al.phase1(src, clients, w_ref, cfg, np.random.default_rng(0), keep_trajectory=True)
    finally:
        del src.record_lp_inputs
    rec = res.records
    pd.testing.assert_frame_equal(rec[list(plain.columns)], plain, check_exact=True)  # nothing else moves
    # through the CSV of a run directory, as a reader sees them
    rec.to_csv(tmp_path / "r.csv", index=False)
    back = pd.read_csv(tmp_path / "r.csv")
    from verification.llm.records import RunRecords, lp_inputs

    run = RunRecords(path=tmp_path, kind="sim", records=back, summary={}, objectives=None)
    C, mu = lp_inputs(run, back)
    assert C.shape == (len(back), 3, 3) and mu.shape == (len(back), 3)
    for r in range(cfg.rounds + 1):
        rows = (back["round"] == r).to_numpy()
        w = res.trajectory[r]
        l, G = src.population(np.broadcast_to(w, (clients.size, src.n_params)), clients)
        C_true = np.einsum("nwj,nwk->njk", G, G)
        np.testing.assert_allclose(C[rows], C_true, rtol=1e-12, atol=1e-14)
        lam = src.prefs[clients]
        dr = lp_direction(l, lam, C[rows])
        np.testing.assert_array_equal(dr.weights, mu[rows])  # bitwise: the CSV keeps every digit
        for k in range(clients.size):
            b = client_basis(l[k], lam[k], C[rows][k], mu[rows][k], str(back.loc[rows, "lp_mode"].iloc[k]))
            assert isinstance(b.vertex, bool)
