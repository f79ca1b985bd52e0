"""The planted F1 scenario of Algorithm 1's runs (:mod:`sim.algorithm`, :mod:`sim.simulate`, the studies): groups
of training and new clients with planted preferences and optima (:class:`ProblemSpec`, :func:`build_problem`)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from sim.problems import PlantedQuadraticCluster
from sim.problems.quadratic import planted_mixing
from sim.source import ClientSource


@dataclass(frozen=True)
class ProblemSpec:
    """Planted F1 scenario: ``n_groups`` groups of ``n_train`` training and ``n_new`` new clients each."""

    m: int = 3
    n_w: int = 5
    n_groups: int = 2
    n_train: int = 4
    n_new: int = 2
    spread: float = 0.05
    train_samples: int = 200
    new_samples: int = 4000
    noise_scale: float = 0.1
    w_ref_offset: float = 0.5


def build_problem(spec: ProblemSpec, rng: np.random.Generator):
    """Planted F1 problem with ``n_groups`` groups; returns ``(source, w_ref, train_clients, new_clients, groups)``.

    All groups share the objectives (H.5); group ``g`` draws ``u_0^g ~ Dirichlet(3·1)`` and ``n_train + n_new``
    mixings ``u_i`` with spread ``s_u`` around it; each client is planted (``λ_i``, ``w_i*``, ``ψ_i*``) by
    :meth:`PlantedQuadraticCluster.planted_client`. ``w_ref`` is the mean of the centres ``c_j`` shifted by
    ``w_ref_offset`` in every coordinate. Clients are ordered group by group, training clients first.
    """
    per = spec.n_train + spec.n_new
    base = PlantedQuadraticCluster.make(rng, m=spec.m, n_w=spec.n_w, n_clients=per, spread=spec.spread)
    mix, groups = [], []
    for g in range(spec.n_groups):
        u0 = base.u0 if g == 0 else rng.dirichlet(3.0 * np.ones(spec.m))
        mix.append(planted_mixing(rng, u0, per, spec.spread))
        groups += [g] * per
    u = np.concatenate(mix)
    lam, w_star, psi = base.planted_client(u)
    problem = replace(base, mixing=u, prefs=lam, w_star=w_star, psi_star=psi)
    idx = np.arange(u.shape[0]).reshape(spec.n_groups, per)
    train = idx[:, : spec.n_train].ravel()
    new = idx[:, spec.n_train :].ravel()
    counts = np.full(u.shape[0], spec.train_samples)
    counts[new] = spec.new_samples
    samples = problem.with_samples(rng, counts, spec.noise_scale)
    w_ref = problem.centres.mean(axis=0) + spec.w_ref_offset
    return ClientSource(problem, samples), w_ref, train, new, np.asarray(groups)
