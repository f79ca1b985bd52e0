r"""F6 — generic random instances for LP-level tests (docs/spec/problems.md#families), and named LP instance
families.

Every generator returns :class:`LPInstances` ``(losses (n, m), prefs (n, m), grads (n, n_w, m), gram (n, m, m))``
with positive losses, preferences in the open simplex (``0.95·Dirichlet(1) + 0.05/m``) and ``gram = GᵀG``
(symmetrised exactly). It unpacks like a tuple: ``l, lam, G, C = lp_instance_family("gaussian", rng, 100, 3)``.

Families of :func:`lp_instance_family`:

* ``"gaussian"``: i.i.d. ``N(0, 1)`` gradient entries, losses ``exp(N(0, 0.5²))``.
* ``"conflicting"``: strongly conflicting gradients with unequal norms: the ``m`` directions of a regular
  simplex (pairwise cosine ``-1/(m-1)``) in a random ``m``-dimensional subspace, perturbed by ``N(0, 0.05²/m)``
  and renormalised (every pairwise cosine stays negative), with norms ``10^{Unif(-1, 1)}``.
* ``"near_stationary"``: points close to a planted F1 optimum, ``w = w* + r·ξ/‖ξ‖``, ``r = 10^{Unif(-6, -2)}``,
  with the planted preference ``λ = normalize(1/l(w*))`` (so ``β ≈ 0``, ``J*`` is nearly all of ``[m]`` and the
  LP constraints bind).
* ``"rank_deficient"``: ``G = A Bᵀ`` of rank ``r ~ Unif{1..m-1}``, columns rescaled to norms spanning exactly
  ``1e-3 .. 1e3`` (one column at each end, the rest log-uniform).
* ``"degenerate"``: gaussian gradients with two identical objectives (columns ``0`` and ``1`` of ``G`` equal, with
  equal preference-weighted losses), so that the LP has several optimal vertices.
* ``"on_ray"``: the losses lie exactly on the preference ray, ``l = ψ/λ`` (``β = 0``, ``J* = [m]``: the converged
  regime), gaussian gradients.
* ``"near_mode"``: ``β`` at a relative distance ``10^{Unif(-6, -1)}`` (either side) from the mode threshold
  ``eps_mode = 1e-4`` of :func:`sim.direction.lp_direction`: every instance within a whisker of the switch between
  the balancing and the descent LP, none within the roundoff resolution of it.
* ``"mixed_magnitude"``: losses ``10^{Unif(-200, 200)}`` and gradient columns with norms ``10^{Unif(-100, 100)}``:
  valid float64 data of wildly mixed magnitude.
* ``"ray_edge"``: losses just off the preference ray, ``l = (ψ/λ)·exp(s·v)`` with ``v`` a random vector rescaled to
  ``min v = 0``, ``max v = 1`` and the log spread ``s = 10^{Unif(-13, -7)}`` (about ``log(max λl / min λl)``):
  the regime where the roundoff rules (R1)-(R3) of :mod:`sim.direction` decide, gaussian gradients.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from sim.problems._quadratic import (
    check_int,
    check_nonneg,
    check_rng,
    gram_of,
    interior_preferences,
    planted_point,
    planted_preferences,
    quad_grads,
    quad_losses,
    random_orthogonal,
    random_quadratics,
)

__all__ = ["LPInstances", "LP_FAMILIES", "NEAR_MODE_EPS", "random_lp_instances", "lp_instance_family"]

#: Names accepted by :func:`lp_instance_family`.
LP_FAMILIES = ("gaussian", "conflicting", "near_stationary", "rank_deficient", "degenerate", "on_ray", "near_mode",
               "mixed_magnitude", "ray_edge")
#: The mode threshold around which the ``"near_mode"`` family is built (``lp_direction``'s default).
NEAR_MODE_EPS = 1e-4


class LPInstances(NamedTuple):
    """A batch of LP inputs: ``losses (n, m)``, ``prefs (n, m)``, ``grads (n, n_w, m)``, ``gram (n, m, m)``."""

    losses: np.ndarray
    prefs: np.ndarray
    grads: np.ndarray
    gram: np.ndarray


def random_lp_instances(rng, n: int, m: int | None = None, *, n_w: int | None = None,
                        w_scale: float = 1.0) -> LPInstances:
    """F6: random F1-type quadratics (``m`` objectives), random interior ``λ`` and a random point ``w ~ N(0, w_scale² I)``.

    ``m=None`` draws one ``m ∈ {2..6}`` for the batch. ``n_w=None`` draws ``n_w ∈ {1..6}`` per instance and pads
    the gradients with zero rows to 6 (which leaves ``C = GᵀG`` and every ``Gμ`` norm unchanged).
    """
    rng = check_rng(rng)
    n = check_int(n, "n", 1)
    m = int(rng.integers(2, 7)) if m is None else check_int(m, "m", 1)
    w_scale = check_nonneg(w_scale, "w_scale")
    if n_w is None:
        dims = rng.integers(1, 7, size=n)
        width = 6
    else:
        width = check_int(n_w, "n_w", 1)
        dims = np.full(n, width)
    losses = np.empty((n, m))
    grads = np.zeros((n, width, m))
    for d in np.unique(dims):
        rows = np.flatnonzero(dims == d)
        c, Q, b = random_quadratics(rng, m, int(d), size=rows.size)
        w = w_scale * rng.standard_normal((rows.size, int(d)))
        losses[rows] = quad_losses(w, c, Q, b)
        grads[rows, : int(d)] = quad_grads(w, c, Q)
    prefs = interior_preferences(rng, n, m)
    return LPInstances(losses, prefs, grads, gram_of(grads))


def _positive_losses(rng, n, m):
    return np.exp(rng.normal(0.0, 0.5, (n, m)))


def _gaussian(rng, n, m, n_w):
    return _positive_losses(rng, n, m), interior_preferences(rng, n, m), rng.standard_normal((n, n_w, m))


def _conflicting(rng, n, m, n_w):
    if n_w < m:
        raise ValueError(f"n_w must be >= m for 'conflicting' (the perturbed simplex directions span an m-dimensional subspace); got n_w={n_w}, m={m}")
    S = np.eye(m) - 1.0 / m  # columns: regular simplex directions in R^m (pairwise cosine -1/(m-1))
    S = S / np.linalg.norm(S, axis=0)
    D = S[None] + (0.05 / np.sqrt(m)) * rng.standard_normal((n, m, m))
    D = D / np.linalg.norm(D, axis=1, keepdims=True)
    frame = random_orthogonal(rng, n_w, n)[:, :, :m]  # random m-dimensional subspace of R^{n_w}
    norms = 10.0 ** rng.uniform(-1.0, 1.0, (n, 1, m))
    return _positive_losses(rng, n, m), interior_preferences(rng, n, m), (frame @ D) * norms


def _near_stationary(rng, n, m, n_w):
    c, Q, b = random_quadratics(rng, m, n_w, size=n)
    u = rng.dirichlet(3.0 * np.ones(m), size=n)
    w_star = planted_point(u, c, Q)
    lam, _ = planted_preferences(quad_losses(w_star, c, Q, b))
    xi = rng.standard_normal((n, n_w))
    r = 10.0 ** rng.uniform(-6.0, -2.0, (n, 1))
    w = w_star + r * xi / np.linalg.norm(xi, axis=-1, keepdims=True)
    return quad_losses(w, c, Q, b), lam, quad_grads(w, c, Q)


def _rank_deficient(rng, n, m, n_w):
    if m < 2:
        raise ValueError(f"'rank_deficient' needs m >= 2; got m={m}")
    r = rng.integers(1, m, size=n)  # rank in [1, m-1]
    A = rng.standard_normal((n, n_w, m - 1))
    B = rng.standard_normal((n, m, m - 1))
    keep = np.arange(m - 1)[None, :] < r[:, None]
    B = B * keep[:, None, :]
    G = A @ np.swapaxes(B, -1, -2)
    G = G / np.linalg.norm(G, axis=1, keepdims=True)
    logn = rng.uniform(-3.0, 3.0, (n, m))
    for k in range(n):
        lo, hi = rng.choice(m, size=2, replace=False)
        logn[k, lo], logn[k, hi] = -3.0, 3.0
    return _positive_losses(rng, n, m), interior_preferences(rng, n, m), G * (10.0 ** logn)[:, None, :]


def _degenerate(rng, n, m, n_w):
    if m < 2:
        raise ValueError(f"'degenerate' needs m >= 2; got m={m}")
    l, lam, G = _gaussian(rng, n, m, n_w)
    G[:, :, 1] = G[:, :, 0]
    lam[:, 1] = lam[:, 0]
    lam = lam / lam.sum(axis=1, keepdims=True)
    l[:, 1] = l[:, 0]
    return l, lam, G


def _on_ray(rng, n, m, n_w):
    lam = interior_preferences(rng, n, m)
    psi = np.exp(rng.normal(0.0, 0.5, (n, 1)))
    return psi / lam, lam, rng.standard_normal((n, n_w, m))


def _ray_edge(rng, n, m, n_w):
    lam = interior_preferences(rng, n, m)
    psi = np.exp(rng.normal(0.0, 0.5, (n, 1)))
    v = rng.standard_normal((n, m))
    v = (v - v.min(axis=1, keepdims=True)) / np.ptp(v, axis=1, keepdims=True)
    s = 10.0 ** rng.uniform(-13.0, -7.0, (n, 1))
    return psi / lam * np.exp(s * v), lam, rng.standard_normal((n, n_w, m))


def _near_mode(rng, n, m, n_w):
    from sim.preference import preference_uniformity

    lam = interior_preferences(rng, n, m)
    v = rng.standard_normal((n, m))
    v -= v.mean(axis=1, keepdims=True)
    target = NEAR_MODE_EPS * (1.0 + rng.choice([-1.0, 1.0], (n, 1)) * 10.0 ** rng.uniform(-6.0, -1.0, (n, 1)))
    lo, hi = np.zeros((n, 1)), np.full((n, 1), 1.0)  # β(t·v) increases from 0; β(1·v) > 1e-4 for these v
    for _ in range(200):  # bisection on t to the last bit
        t = 0.5 * (lo + hi)
        above = preference_uniformity(np.exp(t * v) / lam, lam, validate=False)[:, None] > target
        hi, lo = np.where(above, t, hi), np.where(above, lo, t)
    return np.exp(hi * v) / lam, lam, rng.standard_normal((n, n_w, m))


def _mixed_magnitude(rng, n, m, n_w):
    l = 10.0 ** rng.uniform(-200.0, 200.0, (n, m))
    G = rng.standard_normal((n, n_w, m)) * 10.0 ** rng.uniform(-100.0, 100.0, (n, 1, m))
    return l, interior_preferences(rng, n, m), G


_FAMILIES = {
    "gaussian": _gaussian,
    "conflicting": _conflicting,
    "near_stationary": _near_stationary,
    "rank_deficient": _rank_deficient,
    "degenerate": _degenerate,
    "on_ray": _on_ray,
    "near_mode": _near_mode,
    "mixed_magnitude": _mixed_magnitude,
    "ray_edge": _ray_edge,
}


def lp_instance_family(name: str, rng, n: int, m: int, *, n_w: int | None = None) -> LPInstances:
    """``n`` LP instances of the named family (see the module docstring); ``n_w`` defaults to ``m`` for
    ``"conflicting"`` and to ``m + 1`` otherwise. Returns ``(losses, prefs, grads, gram)`` as :class:`LPInstances`."""
    if name not in _FAMILIES:
        raise ValueError(f"name must be one of {LP_FAMILIES}; got {name!r}")
    rng = check_rng(rng)
    n = check_int(n, "n", 1)
    m = check_int(m, "m", 2)
    n_w = (m if name == "conflicting" else m + 1) if n_w is None else check_int(n_w, "n_w", 1)
    losses, prefs, grads = _FAMILIES[name](rng, n, m, n_w)
    return LPInstances(losses, prefs, grads, gram_of(grads))
