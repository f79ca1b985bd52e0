"""Shared set-ups of Algorithm 1's tests (``tests/test_algorithm_*.py``): the planted F1 source with samples, and a
cluster trained by Phase 1 with its new clients' Pipeline 2; each test module's fixture of the same name builds
its own from these."""

from __future__ import annotations

import numpy as np

import sim.algorithm as al
from sim.problems import PlantedQuadraticCluster


def f1_samples():
    rng = np.random.default_rng(11)
    p = PlantedQuadraticCluster.make(rng, m=3, n_w=4, n_clients=6, spread=0.05)
    s = p.with_samples(rng, 40, 0.1)
    return al.ClientSource(p, s), p.centres.mean(axis=0) + 0.5


def adaptation_setup():
    rng = np.random.default_rng(0)
    p = PlantedQuadraticCluster.make(rng, m=3, n_w=5, n_clients=14, spread=0.05)
    s = p.with_samples(rng, np.r_[np.full(6, 200), np.full(8, 4000)], 0.1)
    src = al.ClientSource(p, s)
    w_ref = p.centres.mean(axis=0)
    r1 = al.phase1(src, np.arange(6), w_ref, al.Phase1Config(rounds=100, eta_local=0.1), rng)
    new = np.arange(6, 14)
    p2 = al.pipeline2(src, new, r1.w)
    return src, r1.w, new, p2
