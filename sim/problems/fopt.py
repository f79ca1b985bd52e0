r"""F-OPT — optimum of a Chebyshev problem when no closed form is available (docs/spec/problems.md#families).

1. :func:`chebyshev_optimum` solves ``min_{w,t} t  s.t.  λ_j (l_j(w) - l_j^ref) ≤ t`` with SLSQP
   (``ftol = 1e-14``) from several starts and keeps the best ``ψ(w) = max_j λ_j(l_j(w) - l_j^ref)``; the best
   point is then polished by Newton steps on the KKT system of its active set (exact residual, Hessians from
   ``hess_fn`` or central differences of the gradients), kept only if neither ψ nor the KKT norm grows.
   It then certifies the result with the KKT condition: the active set
   ``𝒜 = {j : λ_j(l_j(w) - l_j^ref) ≥ ψ(w) - 1e-9}`` and ``d = min-norm point of conv{λ_j g_j(w) : j ∈ 𝒜}``
   (:func:`sim.hull.min_norm_element`); certified iff ``‖d‖ ≤ 1e-7``. For convex ``l_j`` this certifies global
   optimality (``0 ∈ ∂ψ(w)``, the Clarke subdifferential ``conv{λ_j g_j : j ∈ J*}``).
2. :func:`grid_minimize_1d` is the dense-grid optimiser for non-convex 1-D problems (F4): every local minimum
   of the grid, polished by a bounded scalar search, sorted by value.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize, minimize_scalar

from sim.hull import min_norm_element
from sim.preference import check_preferences
from sim.roundoff import TIE_RTOL, order_desc

__all__ = ["ChebyshevOptimum", "chebyshev_optimum", "GridMinima", "grid_minimize_1d"]


@dataclass(frozen=True, eq=False)
class ChebyshevOptimum:
    """Result of :func:`chebyshev_optimum`.

    Attributes:
        w: the minimiser ``w*`` ``(n_w,)``.  psi: ``ψ* = ψ(w*)``.
        active: boolean ``(m,)`` active set ``𝒜``.  kkt_weights: convex weights ``(m,)`` of the min-norm point
        (zero outside ``𝒜``; the KKT multipliers of the λ-scaled gradients).  kkt_norm: ``‖d‖``.
        certified: ``kkt_norm ≤ cert_tol``.  start_psi: best ψ reached from each start ``(n_starts,)``.
        n_success: number of starts whose SLSQP run reported success.
    """

    w: np.ndarray
    psi: float
    active: np.ndarray
    kkt_weights: np.ndarray
    kkt_norm: float
    certified: bool
    start_psi: np.ndarray
    n_success: int


def _weighted(losses_fn, lam, ref, w):
    l = np.asarray(losses_fn(w), dtype=np.float64)
    if l.shape != lam.shape or not np.all(np.isfinite(l)):
        raise ValueError(f"losses_fn must return a finite array of shape {lam.shape}; got {l!r}")
    return lam * (l - ref)


def chebyshev_optimum(
    losses_fn,
    grads_fn,
    prefs,
    w0s,
    *,
    reference=None,
    ftol: float = 1e-14,
    maxiter: int = 1000,
    active_tol: float = 1e-9,
    cert_tol: float = 1e-7,
    polish: bool = True,
    hess_fn=None,
) -> ChebyshevOptimum:
    """Solve ``min_w ψ(w) = max_j λ_j (l_j(w) - l_j^ref)`` by SLSQP on ``(w, t)`` and certify it by KKT.

    Args:
        losses_fn: ``w (n_w,) -> l(w) (m,)``.  grads_fn: ``w (n_w,) -> G(w) (n_w, m)`` (columns ``g_j``).
        prefs: ``λ`` ``(m,)`` in the open simplex.
        w0s: starting points ``(n_starts, n_w)`` (or one ``(n_w,)``).
        reference: optional reference point ``l^ref`` ``(m,)`` (H.30 uses the ideal point); default 0.
        ftol, maxiter: SLSQP options.  active_tol: width of the active set.  cert_tol: KKT norm bound.
        polish: refine the best SLSQP point by Newton steps on the KKT system of the active set (kept only if
            it does not increase ψ and does not increase the KKT norm).
        hess_fn: optional ``w -> (m, n_w, n_w)`` Hessians for the polish; default central differences of
            ``grads_fn``.
    """
    lam = check_preferences(prefs)
    if lam.ndim != 1:
        raise ValueError(f"prefs must be one preference vector (m,); got shape {lam.shape}")
    W0 = np.atleast_2d(np.asarray(w0s, dtype=np.float64))
    if W0.ndim != 2 or W0.shape[0] == 0 or not np.all(np.isfinite(W0)):
        raise ValueError(f"w0s must be a finite (n_starts, n_w) array; got shape {np.shape(w0s)}")
    ref = np.zeros_like(lam) if reference is None else np.asarray(reference, dtype=np.float64)
    if ref.shape != lam.shape or not np.all(np.isfinite(ref)):
        raise ValueError(f"reference must be a finite array of shape {lam.shape}; got {reference!r}")
    for name, v in (("ftol", ftol), ("active_tol", active_tol), ("cert_tol", cert_tol)):
        if not (np.isfinite(v) and v > 0):
            raise ValueError(f"{name} must be finite and > 0; got {v!r}")
    n_w = W0.shape[1]

    def cons(x):
        return x[-1] - _weighted(losses_fn, lam, ref, x[:-1])

    def cons_jac(x):
        G = np.asarray(grads_fn(x[:-1]), dtype=np.float64)
        if G.shape != (n_w, lam.size):
            raise ValueError(f"grads_fn must return shape {(n_w, lam.size)}; got {G.shape}")
        return np.hstack([-(G * lam).T, np.ones((lam.size, 1))])

    obj_grad = np.zeros(n_w + 1)
    obj_grad[-1] = 1.0
    best_w: np.ndarray | None = None
    best_psi, start_psi, n_success = np.inf, [], 0
    for w0 in W0:
        x0 = np.append(w0, _weighted(losses_fn, lam, ref, w0).max())
        res = minimize(lambda x: x[-1], x0, jac=lambda x: obj_grad, method="SLSQP",
                       constraints=[{"type": "ineq", "fun": cons, "jac": cons_jac}],
                       options={"ftol": ftol, "maxiter": maxiter})
        n_success += bool(res.success)
        w = res.x[:-1]
        psi = float(_weighted(losses_fn, lam, ref, w).max())
        start_psi.append(psi)
        if psi < best_psi:
            best_w, best_psi = w, psi
    if best_w is None:
        raise ValueError(f"no start of w0s reached a finite Chebyshev value (values {start_psi})")
    def certificate(w, psi):
        active = _weighted(losses_fn, lam, ref, w) >= psi - active_tol
        mn = min_norm_element(np.asarray(grads_fn(w), dtype=np.float64) * lam, active)
        return active, mn

    active, mn = certificate(best_w, best_psi)
    if polish:
        w_p = _newton_polish(losses_fn, grads_fn, hess_fn, lam, ref, best_w, active, mn.weights)
        if w_p is not None:
            psi_p = float(_weighted(losses_fn, lam, ref, w_p).max())
            if psi_p <= best_psi + 1e-13 * max(1.0, abs(best_psi)):
                active_p, mn_p = certificate(w_p, psi_p)
                if mn_p.norm <= mn.norm:
                    best_w, best_psi, active, mn = w_p, psi_p, active_p, mn_p
    return ChebyshevOptimum(
        w=best_w, psi=best_psi, active=active, kkt_weights=mn.weights, kkt_norm=float(mn.norm),
        certified=bool(mn.norm <= cert_tol), start_psi=np.array(start_psi), n_success=n_success,
    )


def _fd_hessians(grads_fn, w, m, step=1e-5):
    """Central finite-difference Hessians ``(m, n_w, n_w)`` of the objectives from ``grads_fn``."""
    n = w.size
    H = np.empty((m, n, n))
    for a in range(n):
        e = np.zeros(n)
        e[a] = step * max(1.0, abs(w[a]))
        dG = (np.asarray(grads_fn(w + e)) - np.asarray(grads_fn(w - e))) / (2 * e[a])  # (n, m)
        H[:, :, a] = dG.T
    return 0.5 * (H + np.swapaxes(H, -1, -2))


def _newton_polish(losses_fn, grads_fn, hess_fn, lam, ref, w, active, weights, n_steps=6):
    r"""Newton iterations on the KKT system of ``min t s.t. λ_j(l_j - l_j^ref) ≤ t`` restricted to ``𝒜``.

    Unknowns ``(w, t, ν_𝒜)``; equations ``Σ_𝒜 ν_j λ_j g_j(w) = 0``, ``λ_j(l_j(w) - l_j^ref) = t`` (j ∈ 𝒜),
    ``Σ ν_j = 1``. The residual is exact; an approximate (finite-difference) Jacobian still converges to the
    exact root. Returns the polished ``w`` or ``None`` if the system is degenerate or ``ν`` leaves the simplex.
    """
    A = np.flatnonzero(active)
    a, n = A.size, w.size
    if a > n + 1:
        return None
    nu = weights[A].copy()
    t = float(_weighted(losses_fn, lam, ref, w)[A].max())
    x = np.concatenate([w, [t], nu])
    for _ in range(n_steps):
        w, t, nu = x[:n], x[n], x[n + 1:]
        G = np.asarray(grads_fn(w), dtype=np.float64)[:, A] * lam[A]  # (n, a)
        H = (np.asarray(hess_fn(w)) if hess_fn is not None else _fd_hessians(grads_fn, w, lam.size))[A]
        F = np.concatenate([G @ nu, _weighted(losses_fn, lam, ref, w)[A] - t, [nu.sum() - 1.0]])
        J = np.zeros((n + a + 1, n + 1 + a))
        J[:n, :n] = np.einsum("j,j,jab->ab", nu, lam[A], H)
        J[:n, n + 1:] = G
        J[n:n + a, :n] = G.T
        J[n:n + a, n] = -1.0
        J[n + a, n + 1:] = 1.0
        if np.linalg.matrix_rank(J) < J.shape[0]:
            return None
        x = x - np.linalg.solve(J, F)
    if not np.all(np.isfinite(x)) or np.any(x[n + 1:] < -1e-9):
        return None
    return x[:n]


@dataclass(frozen=True, eq=False)
class GridMinima:
    """Local minima found by :func:`grid_minimize_1d`, sorted by value (the first is the global minimum).

    Attributes: ``w`` ``(k,)``, ``values`` ``(k,)``, ``on_boundary`` ``(k,)`` (minimum at a grid end point).
    """

    w: np.ndarray
    values: np.ndarray
    on_boundary: np.ndarray

    @property
    def global_w(self) -> float:
        return float(self.w[0])

    @property
    def global_value(self) -> float:
        return float(self.values[0])


def grid_minimize_1d(fn, lo: float, hi: float, n_grid: int = 600_001, *, polish: bool = True) -> GridMinima:
    """Dense-grid minimisation of a vectorised 1-D function ``fn`` on ``[lo, hi]`` (F-OPT step 3).

    Every grid point that is ``≤`` its left and ``<`` its right neighbour is a local minimum; with ``polish``
    it is refined by a bounded Brent search on the two adjacent grid cells (``xatol = 1e-14``).
    """
    if not (np.isfinite(lo) and np.isfinite(hi) and lo < hi):
        raise ValueError(f"need finite lo < hi; got lo={lo!r}, hi={hi!r}")
    if isinstance(n_grid, bool) or not isinstance(n_grid, (int, np.integer)) or n_grid < 3:
        raise ValueError(f"n_grid must be an integer >= 3; got {n_grid!r}")
    x = np.linspace(lo, hi, int(n_grid))
    f = np.asarray(fn(x), dtype=np.float64)
    if f.shape != x.shape or not np.all(np.isfinite(f)):
        raise ValueError("fn must return finite values of the same shape as its input")
    left = np.r_[True, f[1:] <= f[:-1]]
    right = np.r_[f[:-1] < f[1:], True]
    idx = np.flatnonzero(left & right)
    ws, vals, bnd = [], [], []
    h = x[1] - x[0]
    for i in idx:
        boundary = i == 0 or i == x.size - 1
        wi, vi = x[i], f[i]
        if polish and not boundary:
            r = minimize_scalar(lambda s: float(fn(np.array([s]))[0]), bounds=(x[i] - h, x[i] + h),
                                method="bounded", options={"xatol": 1e-14})
            if r.fun <= vi:
                wi, vi = float(r.x), float(r.fun)
        ws.append(wi)
        vals.append(vi)
        bnd.append(boundary)
    order = order_desc(-np.asarray(vals, dtype=np.float64), TIE_RTOL) if vals else np.zeros(0, dtype=np.int64)
    return GridMinima(np.array(ws)[order], np.array(vals)[order], np.array(bnd)[order])
