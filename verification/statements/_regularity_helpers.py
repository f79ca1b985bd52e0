r"""Shared helpers of the regularity statements H.19, H.20, H.22, H.27, H.30, H.34 (private module).

The registry skips modules whose name starts with ``_``. Nothing here computes a formula of the theory that
:mod:`sim` already provides; the helpers only *assemble* the :mod:`sim` kernels at many points at once:

* :func:`ball_points`, :func:`shell_points`, :func:`gaussian_offsets` — i.i.d. samples of a region (uniform
  in a ball; radius uniform in a shell, which over-represents points near the centre; ``center + Unif(a,b)·ξ``
  with ``ξ ~ N(0, I)``, the docs/spec/statements.md#t-h13, docs/spec/statements.md#t-h22 sampling).
* :func:`cluster_quantities` — for an F1 cluster (H.5: common losses) at common points ``w`` (``(T, n_w)``):
  the EPO LP direction of every client (one batched :func:`sim.direction.lp_direction` call), the near-active
  set ``J*_ε`` (width ``ε_act = 2ηλ_max B²``), the H.19 margin ``m_i(w)``, the minimum-norm element ``d_M`` of
  ``conv{λ_j g_j : j ∈ J*_ε}``, the gap ``r_i = ψ_i - ψ_i*``, ``β_i``, ``γ_i*``, ``‖d_bal,i‖`` and the deviation
  ``Δ_i = ‖d̄ - d_i‖`` (uniform ``ρ``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.cluster import aggregation_weights, deviations
from sim.direction import lp_direction
from sim.hull import descent_margin, eps_act, min_norm_element, near_active_set
from sim.preference import bottleneck_set, chebyshev

#: LP statuses that carry a solution of the LP that was asked for (the relaxed dom LP keeps ``Cμ ≥ 0``).
SOLVED_STATUSES = ("optimal", "relaxed")


def unit_directions(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    """``n`` directions uniform on the unit sphere of ``R^dim``."""
    v = rng.standard_normal((n, dim))
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def ball_points(rng: np.random.Generator, center: np.ndarray, radius: float, n: int) -> np.ndarray:
    """``n`` points uniform in the ball ``‖w - center‖ ≤ radius``; shape ``(n, n_w)``."""
    center = np.asarray(center, dtype=np.float64)
    rad = radius * rng.uniform(0.0, 1.0, n) ** (1.0 / center.size)
    return center + rad[:, None] * unit_directions(rng, n, center.size)


def shell_points(rng: np.random.Generator, center: np.ndarray, r_lo: float, r_hi: float, n: int) -> np.ndarray:
    """``n`` points ``center + s·v`` with ``s ~ Unif(r_lo, r_hi)`` and ``v`` uniform on the sphere."""
    center = np.asarray(center, dtype=np.float64)
    rad = rng.uniform(r_lo, r_hi, n)
    return center + rad[:, None] * unit_directions(rng, n, center.size)


def gaussian_offsets(rng: np.random.Generator, center: np.ndarray, r_lo: float, r_hi: float, n: int) -> np.ndarray:
    """``n`` points ``center + s ξ`` with ``s ~ Unif(r_lo, r_hi)`` and ``ξ ~ N(0, I)`` (the docs/spec/statements.md#catalogue "Unif(a,b)ξ")."""
    center = np.asarray(center, dtype=np.float64)
    s = rng.uniform(r_lo, r_hi, n)
    return center + s[:, None] * rng.standard_normal((n, center.size))


@dataclass(frozen=True, eq=False)
class ClusterQuantities:
    """Per (point ``t``, client ``i``) quantities of an F1 cluster; arrays ``(T, N)`` unless stated.

    losses (T, m), grads (T, n_w, m): the common ``l(w)``, ``G(w)``.  direction (T, N, n_w): LP ``d_i``.
    status, mode: LP status / mode strings.  near_active (T, N, m): ``J*_ε``.  bottleneck (T, N, m): ``J*``.
    margin: ``m_i(w) = min_{J*_ε} λ_j d_iᵀg_j``.  dM_sq: ``‖d_M‖²``.  dM (T, N, n_w).  dM_margin:
    ``min_{J*_ε} λ_j d_Mᵀg_j``.  gap: ``r_i = ψ_i - ψ_i*``.  psi: ``ψ_i``.  beta, gain (``γ_i* = μᵀCA``),
    dbal_norm (``‖G A_i‖``), deviation (``Δ_i``).  eps_act (N,): the near-active widths.
    """

    losses: np.ndarray
    grads: np.ndarray
    direction: np.ndarray
    status: np.ndarray
    mode: np.ndarray
    near_active: np.ndarray
    bottleneck: np.ndarray
    margin: np.ndarray
    dM: np.ndarray
    dM_sq: np.ndarray
    dM_margin: np.ndarray
    dM_scale: np.ndarray
    gap: np.ndarray
    psi: np.ndarray
    beta: np.ndarray
    gain: np.ndarray
    dbal_norm: np.ndarray
    deviation: np.ndarray
    eps_act: np.ndarray


def cluster_quantities(problem, W, *, eta: float, B: float, eps_mode: float = 1e-10,
                       clients=None) -> ClusterQuantities:
    """Evaluate an F1 cluster (:class:`sim.problems.PlantedQuadraticCluster`) at common points ``W`` ``(T, n_w)``.

    ``eta`` and ``B`` set ``ε_act = 2 η λ_max,i B²`` (:func:`sim.hull.eps_act`); ``clients`` (default all) selects
    the clients; ``Δ_i`` uses uniform ``ρ`` over the selected clients.
    """
    W = np.atleast_2d(np.asarray(W, dtype=np.float64))
    idx = np.arange(problem.n_clients) if clients is None else np.asarray(clients)
    lam = problem.prefs[idx]  # (N, m)
    psi_star = problem.psi_star[idx]
    T, N, m = W.shape[0], idx.size, problem.n_objectives
    l = problem.losses(W)  # (T, m)
    G = problem.grads(W)  # (T, n_w, m)
    C = problem.gram(W)  # (T, m, m)
    lb = np.broadcast_to(l[:, None, :], (T, N, m))
    Gb = np.broadcast_to(G[:, None], (T, N) + G.shape[1:])
    lamb = np.broadcast_to(lam[None], (T, N, m))
    res = lp_direction(lb, lamb, np.broadcast_to(C[:, None], (T, N, m, m)), eps_mode=eps_mode)
    mu = np.where(np.isfinite(res.weights), res.weights, 0.0)
    d = np.einsum("tnwm,tnm->tnw", Gb, mu)
    ea = eps_act(eta, lam, B)  # (N,)
    mask = near_active_set(lb, lamb, np.broadcast_to(ea[None], (T, N)))
    margin = descent_margin(d, Gb, lamb, mask)
    mn = min_norm_element(Gb * lamb[:, :, None, :], mask)
    dM_margin = descent_margin(mn.point, Gb, lamb, mask)
    psi = chebyshev(lb, lamb)
    gap = psi - psi_star[None]
    dbal = np.einsum("tnwm,tnm->tnw", Gb, res.adjustment)
    dev = deviations(d, aggregation_weights(N=N))
    return ClusterQuantities(
        losses=l, grads=G, direction=d, status=res.status, mode=res.mode, near_active=mask,
        bottleneck=bottleneck_set(lb, lamb), margin=margin, dM=mn.point, dM_sq=mn.norm**2,
        dM_margin=dM_margin, dM_scale=mn.scale, gap=gap, psi=psi, beta=res.beta, gain=res.gain,
        dbal_norm=np.linalg.norm(dbal, axis=-1), deviation=dev, eps_act=ea,
    )


def summary(x) -> dict:
    """min / median / max of an array (NaN-free), for the details of an Evidence."""
    a = np.asarray(x, dtype=np.float64).ravel()
    if a.size == 0:
        return {"n": 0}
    return {"n": int(a.size), "min": float(a.min()), "median": float(np.median(a)), "max": float(a.max())}
