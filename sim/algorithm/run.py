"""Algorithm 1 end to end (:mod:`sim.algorithm`): the baselines (FedAvg, local-only training), :func:`run_algorithm`
with its summary, and Remark H.8's clustering comparison (Phase 1 on Algorithm 1's clusters, on its Stage-1 groups
and on random partitions of the same sizes)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from sim.algorithm.adaptation import draw_batches, pipeline1, pipeline2
from sim.algorithm.configs import AdaptConfig, AlgorithmConfig, Phase1Config
from sim.algorithm.evaluation import _check_point, _check_rng, _losses, _rho_for, _rows, _take
from sim.algorithm.phases import assign_to_cluster, clustering_step, phase1, phase2
from sim.algorithm.records import RECORD_COLUMNS, AdaptResult, AlgorithmResult, PhaseResult, Progress, RowSink
from sim.cluster import Clustering
from sim.direction import STATUSES
from sim.source import Source, array_namespace, as_source, check_batch_size, check_clients, check_psi_star


def fedavg(source, clients, w0, config: Phase1Config, rng: np.random.Generator, *, rho=None, cluster: int = 0,
           progress: Progress | None = None, keep_trajectory: bool = True,
           on_rows: RowSink | None = None) -> PhaseResult:
    """FedAvg baseline: Phase 1 with the linear scalarisation ``d_i = G_i λ_i`` instead of the LP."""
    return phase1(source, clients, w0, replace(config, direction="linear"), rng, rho=rho, cluster=cluster,
                  progress=progress, phase="fedavg", keep_trajectory=keep_trajectory, on_rows=on_rows)


def local_only(source, clients, w_ref, config: AdaptConfig, rng: np.random.Generator | None = None, *,
               batches=None, cluster=-1, keep_trajectory: bool = True, on_rows: RowSink | None = None) -> AdaptResult:
    """Local-only baseline: Pipeline 1's optimiser from ``w_ref`` on the same ``S·K`` samples (pass ``batches``)."""
    return pipeline1(source, clients, w_ref, config, rng, batches=batches, phase="local_only", cluster=cluster,
                     keep_trajectory=keep_trajectory, on_rows=on_rows)


def run_algorithm(source, config: AlgorithmConfig, rng: np.random.Generator, *, w_ref, train_clients,
                  new_clients=(), progress: Progress | None = None, keep_trajectory: bool = True,
                  on_rows: RowSink | None = None) -> AlgorithmResult:
    """Algorithm 1 end to end: clustering of ``train_clients`` at ``w_ref``; per cluster Phase 1 (``w_I``), Phase 2
    (``w_II``) and the FedAvg baseline (``w_FA``); every new client is assigned to a cluster and runs Pipeline 1
    from ``w_I`` and from ``w_II``, Pipeline 2, the local-only baseline from ``w_ref`` and FedAvg + adaptation
    (linear direction, from ``w_FA``), all on the same fresh batches. Random draws happen in this fixed order:
    clustering, then per cluster Phase 1, Phase 2, FedAvg, then the adaptation batches."""
    if not isinstance(config, AlgorithmConfig):
        raise ValueError(f"config must be an AlgorithmConfig; got {type(config).__name__}")
    src = as_source(source)
    rng = _check_rng(rng)
    train = check_clients(src, train_clients, "train_clients")
    new = np.asarray(new_clients, dtype=np.int64)
    if new.size:
        new = check_clients(src, new, "new_clients")
        if np.intersect1d(new, train).size:
            raise ValueError(f"new_clients must not take part in training; overlap {np.intersect1d(new, train).tolist()}")
    w_ref = _check_point(src, w_ref, "w_ref")
    xp = array_namespace(w_ref)
    cfg = config
    # validate every batch size against the data before running anything
    if cfg.phase1.batch_size is not None:
        check_batch_size(src, train, cfg.phase1.batch_size, "Phase1Config.batch_size")
    if cfg.phase2.S is not None:
        check_batch_size(src, train, cfg.phase2.S, "Phase2Config.S")
    if new.size:
        check_batch_size(src, new, cfg.adapt.S, "AdaptConfig.S")
        check_psi_star(src, new)
    check_psi_star(src, train)

    clus = clustering_step(src, train, w_ref, cfg.cluster, rng)
    keep: dict[str, Any]  # the keyword arguments every phase takes
    outputs: dict = {"w_I": [], "w_II": [], "w_FA": []}
    phases: dict = {}
    frames = []
    fa_cfg = cfg.phase1 if cfg.fedavg is None else cfg.fedavg
    keep = dict(progress=progress, keep_trajectory=keep_trajectory, on_rows=on_rows)
    for c, members in enumerate(clus.clusters):
        cl = train[members]
        rho = _rho_for(src, cl, cfg.rho)
        p1 = phase1(src, cl, w_ref, cfg.phase1, rng, rho=rho, cluster=c, **keep)
        p2 = phase2(src, cl, p1.w, cfg.phase2, rng, rho=rho, cluster=c, round_offset=cfg.phase1.rounds,
                    B_start=p1.B, **keep)
        fa = fedavg(src, cl, w_ref, fa_cfg, rng, rho=rho, cluster=c, **keep)
        for name, phase_res in (("w_I", p1), ("w_II", p2), ("w_FA", fa)):
            outputs[name].append(phase_res.w)
        phases[c] = dict(phase1=p1, phase2=p2, fedavg=fa)
        frames += [p1.records, p2.records, fa.records]
    w_I, w_II, w_FA = (xp.stack(outputs[name]) for name in ("w_I", "w_II", "w_FA"))

    adaptation: dict = {}
    assign = np.empty(0, dtype=np.int64)
    if new.size:
        assign = assign_to_cluster(src, new, w_ref, clus, train, key=cfg.cluster.key)
        batches = draw_batches(src, new, cfg.adapt.K, cfg.adapt.S, rng)
        lin = replace(cfg.adapt, direction="linear")
        runs = {
            "pipeline1_wI": (_take(w_I, assign), cfg.adapt),
            "pipeline1_wII": (_take(w_II, assign), cfg.adapt),
            "local_only": (xp.broadcast_to(w_ref, (new.size, src.n_params)), cfg.adapt),
            "fedavg_adapt": (_take(w_FA, assign), lin),
        }
        if cfg.adamw is not None:
            if cfg.adamw.K != cfg.adapt.K or cfg.adamw.S != cfg.adapt.S:
                raise ValueError("AlgorithmConfig.adamw must use the same K and S as AlgorithmConfig.adapt")
            runs["pipeline1_wII_adamw"] = (_take(w_II, assign), cfg.adamw)
        for name, (starts, acfg) in runs.items():
            if progress is not None:
                progress(name, 0, 1)
            res = pipeline1(src, new, starts, acfg, batches=batches, phase=name, cluster=assign,
                            keep_trajectory=keep_trajectory, on_rows=on_rows)
            adaptation[name] = res
            frames.append(res.records)
            if progress is not None:
                progress(name, 1, 1)
        if progress is not None:
            progress("pipeline2", 0, 1)
        p2res = pipeline2(src, new, _take(w_II, assign), cfg.pipeline2, cluster=assign,
                          keep_trajectory=keep_trajectory, on_rows=on_rows)
        adaptation["pipeline2"] = p2res
        frames.append(p2res.records)
        if progress is not None:
            progress("pipeline2", 1, 1)

    records = pd.concat(frames, ignore_index=True)
    records.attrs["params"] = cfg.to_dict()
    summary = _summary(src, train, new, assign, clus, w_ref, w_I, w_II, w_FA, phases, adaptation, records, cfg)
    return AlgorithmResult(clustering=clus, train_clients=train, new_clients=new, assignment=assign, w_ref=w_ref,
                           w_I=w_I, w_II=w_II, w_fedavg=w_FA, phases=phases, adaptation=adaptation,
                           records=records, summary=summary)


def _gap_at(src: Source, clients: np.ndarray, W) -> np.ndarray:
    l = _losses(src, W, clients, where="summary")
    return (src.prefs[clients] * l).max(axis=-1) - src.psi_star[clients]


def _summary(src, train, new, assign, clus, w_ref, w_I, w_II, w_FA, phases, adaptation, records, cfg) -> dict:
    def fl(a):
        return [float(x) for x in np.asarray(a).ravel()]

    clusters = []
    for c, members in enumerate(clus.clusters):
        cl = train[members]
        p1 = phases[c]["phase1"].records
        p2 = phases[c]["phase2"].records
        fa = phases[c]["fedavg"].records
        first = p1[p1["round"] == 0].set_index("client")["gap"]
        clusters.append(dict(
            cluster=c, clients=[int(i) for i in cl],
            gap_w_ref=fl(first.loc[cl]),
            gap_w_I=fl(p1[p1["round"] == p1["round"].max()].set_index("client")["gap"].loc[cl]),
            gap_w_II=fl(p2[p2["round"] == p2["round"].max()].set_index("client")["gap"].loc[cl]),
            gap_fedavg=fl(fa[fa["round"] == fa["round"].max()].set_index("client")["gap"].loc[cl]),
        ))
    counts = {s: int(records[f"n_{s}"].sum()) for s in STATUSES}
    out: dict = dict(
        n_train_clients=int(train.size), n_new_clients=int(new.size), n_clusters=clus.n_clusters,
        cluster_labels=[int(v) for v in clus.labels], clusters=clusters,
        lp_step_status_counts=counts,
        eta_I=cfg.phase1.eta_eff, eta_II=cfg.phase2.eta_eff,
    )
    if new.size:
        new_rows = []
        final = {name: res.gap for name, res in adaptation.items()}
        start = dict(w_ref=_gap_at(src, new, _rows(w_ref, new.size)),
                     w_I=_gap_at(src, new, _take(w_I, assign)), w_II=_gap_at(src, new, _take(w_II, assign)),
                     w_fedavg=_gap_at(src, new, _take(w_FA, assign)))
        for c, i in enumerate(new):
            new_rows.append(dict(client=int(i), cluster=int(assign[c]), psi_star=float(src.psi_star[i]),
                                 start_gap={k: float(v[c]) for k, v in start.items()},
                                 final_gap={k: float(v[c]) for k, v in final.items()}))
        out["new_clients"] = new_rows
        out["mean_final_gap"] = {k: float(np.mean(v)) for k, v in final.items()}
        out["mean_start_gap"] = {k: float(np.mean(v)) for k, v in start.items()}
        out["adaptation_samples_per_client"] = int(cfg.adapt.K * cfg.adapt.S)
    return out


# ------------------------------------------------------------------------------- clusterings compared (Remark H.8)


#: Clusterings of :func:`comparison_clusterings`, in order.
CLUSTERING_NAMES = ("stage1_stage2", "stage1_only", "random")


def random_partition(rng: np.random.Generator, sizes) -> list[np.ndarray]:
    """A uniformly random partition of the positions ``0 .. sum(sizes) - 1`` into groups of exactly ``sizes``
    (sorted index arrays; one ``rng.permutation``)."""
    sizes = list(sizes)
    if any(isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 1 for s in sizes):
        raise ValueError(f"sizes must be positive integers; got {sizes}")
    perm = rng.permutation(int(sum(sizes)))
    out, start = [], 0
    for s in sizes:
        out.append(np.sort(perm[start:start + s]))
        start += s
    return out


def comparison_clusterings(clustering: Clustering, rng: np.random.Generator,
                           n_random: int) -> list[tuple[str, int, list[np.ndarray]]]:
    """The clusterings that Remark H.8's design claim compares, as ``(name, draw, clusters)`` (positions in the
    clustered clients, as :attr:`~sim.cluster.Clustering.clusters`): Algorithm 1's Stage-1+2 ``clustering``
    (``stage1_stage2``), its Stage-1 groups alone (``stage1_only``; the clusters of ``stage2=False``, no draw) and
    ``n_random`` uniformly random partitions with the Stage-1+2 cluster sizes (``random``, draw ``0 ..
    n_random - 1``, in that order from ``rng``)."""
    if not isinstance(n_random, (int, np.integer)) or isinstance(n_random, bool) or n_random < 0:
        raise ValueError(f"n_random must be an integer >= 0; got {n_random!r}")
    s1 = np.asarray(clustering.stage1_labels)
    stage1 = [np.flatnonzero(s1 == g) for g in range(int(s1.max()) + 1)]
    sizes = [len(c) for c in clustering.clusters]
    parts = [("stage1_stage2", 0, [np.asarray(c) for c in clustering.clusters]), ("stage1_only", 0, stage1)]
    parts += [("random", d, random_partition(rng, sizes)) for d in range(int(n_random))]
    return parts


def same_partition(a, b) -> bool:
    """Whether two lists of index arrays are the same partition (cluster order ignored)."""
    key = lambda p: sorted(tuple(int(x) for x in np.sort(np.asarray(c))) for c in p)  # noqa: E731
    return key(a) == key(b)


def phase1_by_clustering(source, clients, w_ref, parts, config: Phase1Config, rng: np.random.Generator, *,
                         rho=None, progress: Progress | None = None, on_rows: RowSink | None = None) -> pd.DataFrame:
    """Phase 1 (``config``) from ``w_ref`` on every cluster of every clustering of ``parts`` (``(name, draw,
    clusters)``, e.g. from :func:`comparison_clusterings`; clusters index positions in ``clients``), in order, each
    cluster with its own server model: the comparison of Remark H.8 (``H_Cn(w^t)`` is the ``dispersion`` column).
    Returns the records of every run with the columns ``clustering`` and ``draw`` first (``on_rows`` receives them
    round by round, with those columns); ``rho``: ``"uniform"`` (default) or ``"samples"`` within each cluster, as
    :attr:`AlgorithmConfig.rho`."""
    if rho is not None and not (isinstance(rho, str) and rho in ("uniform", "samples")):
        raise ValueError(f"rho must be 'uniform' or 'samples' (one rule for every cluster); got {rho!r}")
    src = as_source(source)
    clients = check_clients(src, clients)
    frames = []
    for name, draw, clusters in parts:
        for c, members in enumerate(clusters):
            cl = clients[np.asarray(members, dtype=np.int64)]
            sink = None if on_rows is None else (
                lambda f, n=name, d=draw: on_rows(f.assign(clustering=n, draw=d)[["clustering", "draw", *f.columns]]))
            res = phase1(src, cl, w_ref, config, rng, rho=rho, cluster=c, progress=progress, keep_trajectory=False,
                         on_rows=sink)
            frames.append(res.records.assign(clustering=name, draw=int(draw)))
    if not frames:
        return pd.DataFrame(columns=["clustering", "draw", *RECORD_COLUMNS])
    out = pd.concat(frames, ignore_index=True)
    return out[["clustering", "draw", *[c for c in out.columns if c not in ("clustering", "draw")]]]
