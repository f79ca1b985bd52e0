r"""F3 — common-minimiser family for new-client adaptation (docs/spec/problems.md#families,
docs/spec/statements.md#t-h39, docs/spec/statements.md#t-h40, docs/spec/statements.md#t-h41,
docs/spec/statements.md#t-h42, docs/spec/statements.md#t-h43, docs/spec/statements.md#t-h44,
docs/spec/statements.md#t-h45; exact everything).

Objectives ``l_j(w) = ½(w - c)ᵀQ(w - c) + b_j`` with ``b_j = t/λ_j`` (``λ = λ_new``, unique largest entry
``j* = argmax λ``). Then ``λ_j l_j(w) = t + λ_j q(w)``, ``q(w) = ½‖w - c‖²_Q``, so

* ``ψ_new(w) = t + λ_{j*} q(w)`` (smooth everywhere: stable bottleneck ``j*``), ``ψ_new* = t``, ``w_new* = c``,
  ``β_new(c) = 0``;
* ``L₀ = λ_{j*}‖Q‖`` (smoothness of ψ_new), ``μ_PL = μ = λ_{j*} λ_min(Q)``;
* stochastic direction ``d̃ = λ_{j*}(Q(w - c) + ξ̄_S)``, ``ξ̄_S`` the mean of ``S`` i.i.d. ``N(0, Σ_ξ)``;
  per-sample variance ``σ₀² = λ_{j*}² tr Σ_ξ`` (exact);
* update ``w_{k+1} = w_k - α P_k d̃(w_k)`` (eq 88). For deterministic symmetric ``P_k``, with ``e_k = w_k - c``:
  ``E e_{k+1} = T_k E e_k`` and the second moment ``M_k = E e_k e_kᵀ`` obeys

  .. math::  M_{k+1} = T_k M_k T_kᵀ + α² λ_{j*}² P_k Σ_ξ P_k / S,\qquad T_k = I - α λ_{j*} P_k Q,

  so ``E ψ_new(w_K) - t = ½ λ_{j*} tr(Q M_K)`` exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.preference import chebyshev, check_preferences, preference_uniformity
from sim.problems._quadratic import (
    check_int,
    check_nonneg,
    check_points,
    check_rng,
    gram_of,
    random_orthogonal,
)

__all__ = ["CommonMinimizer"]


def _check_sym(M, name: str, n: int, *, pd: bool) -> np.ndarray:
    A = np.asarray(M, dtype=np.float64)
    if A.shape[-2:] != (n, n) or not np.all(np.isfinite(A)):
        raise ValueError(f"{name} must be a finite array of shape (..., {n}, {n}); got shape {A.shape}")
    if np.abs(A - np.swapaxes(A, -1, -2)).max() > 1e-12 * max(1.0, np.abs(A).max()):
        raise ValueError(f"{name} must be symmetric")
    ev = np.linalg.eigvalsh(A)
    if pd and np.any(ev[..., 0] <= 0):
        raise ValueError(f"{name} must be positive definite; smallest eigenvalue {ev[..., 0].min():.3e}")
    if not pd and np.any(ev[..., 0] < -1e-12 * max(1.0, np.abs(ev).max())):
        raise ValueError(f"{name} must be positive semi-definite; smallest eigenvalue {ev[..., 0].min():.3e}")
    return A


def _psd_sqrt(S: np.ndarray) -> np.ndarray:
    ev, U = np.linalg.eigh(S)
    return (U * np.sqrt(np.maximum(ev, 0.0))) @ U.T


@dataclass(frozen=True, eq=False)
class CommonMinimizer:
    """F3 instance. Attributes: ``hessian`` Q ``(n_w, n_w)`` (SPD), ``centre`` c ``(n_w,)``, ``prefs`` λ_new
    ``(m,)`` (unique largest entry), ``t`` (> 0), ``noise_cov`` Σ_ξ ``(n_w, n_w)`` (PSD), ``w0`` ``(n_w,)``."""

    hessian: np.ndarray
    centre: np.ndarray
    prefs: np.ndarray
    t: float
    noise_cov: np.ndarray
    w0: np.ndarray

    def __post_init__(self):
        n = self.centre.shape[-1]
        _check_sym(self.hessian, "hessian", n, pd=True)
        _check_sym(self.noise_cov, "noise_cov", n, pd=False)
        lam = check_preferences(self.prefs)
        if lam.ndim != 1:
            raise ValueError(f"prefs must be one preference vector (m,); got shape {lam.shape}")
        top = np.sort(lam)[::-1]
        if lam.size > 1 and not top[0] > top[1]:
            raise ValueError(f"prefs must have a unique largest entry (stable bottleneck j*); got {lam}")
        check_nonneg(self.t, "t", positive=True)
        check_points(self.w0, n, "w0")

    # -- construction ------------------------------------------------------------------------------------------
    @classmethod
    def make(cls, rng, n_w: int = 4, prefs=(0.5, 0.3, 0.2), *, t: float = 1.0, eig=(0.5, 3.0),
             noise_scale: float = 1.0, w0_scale: float = 1.0) -> CommonMinimizer:
        """Random instance: ``Q = U diag(Unif(eig)) Uᵀ``, ``c ~ N(0, I)``, ``Σ_ξ = noise_scale²·diag(Unif(0.5, 2))``,
        ``w0 = c + w0_scale·N(0, I)``."""
        rng = check_rng(rng)
        n_w = check_int(n_w, "n_w", 1)
        U = random_orthogonal(rng, n_w)
        Q = (U * rng.uniform(eig[0], eig[1], n_w)) @ U.T
        c = rng.standard_normal(n_w)
        Sig = check_nonneg(noise_scale, "noise_scale") ** 2 * np.diag(rng.uniform(0.5, 2.0, n_w))
        w0 = c + check_nonneg(w0_scale, "w0_scale") * rng.standard_normal(n_w)
        return cls(0.5 * (Q + Q.T), c, np.asarray(prefs, dtype=np.float64), float(t), Sig, w0)

    @classmethod
    def reference(cls, rng: np.random.Generator | None = None) -> CommonMinimizer:
        """Reference instance of docs/spec/problems.md#families, ``Q = U diag(0.5, 1, 2, 3) Uᵀ``, ``λ_new =
        (0.5, 0.3, 0.2)``, ``t = 1``, ``c = 1``, ``Σ_ξ = diag(1, 0.5, 2, 1)``, ``w0 = c + (1, -0.5, 0.7,
        0.2)``.

        ``U`` is Haar-random when ``rng`` is given; otherwise the fixed Householder reflection
        ``I - 2vvᵀ/‖v‖²`` with ``v = (1, 2, 3, 4)`` (deterministic, not axis-aligned).
        """
        if rng is None:
            v = np.array([1.0, 2.0, 3.0, 4.0])
            U = np.eye(4) - 2.0 * np.outer(v, v) / (v @ v)
        else:
            U = random_orthogonal(check_rng(rng), 4)
        Q = (U * np.array([0.5, 1.0, 2.0, 3.0])) @ U.T
        c = np.ones(4)
        return cls(0.5 * (Q + Q.T), c, np.array([0.5, 0.3, 0.2]), 1.0, np.diag([1.0, 0.5, 2.0, 1.0]),
                   c + np.array([1.0, -0.5, 0.7, 0.2]))

    # -- exact quantities --------------------------------------------------------------------------------------
    @property
    def n_params(self) -> int:
        return int(self.centre.shape[-1])

    @property
    def n_objectives(self) -> int:
        return int(self.prefs.shape[-1])

    @property
    def offsets(self) -> np.ndarray:
        """``b_j = t / λ_j``."""
        return self.t / self.prefs

    @property
    def j_star(self) -> int:
        return int(np.argmax(self.prefs))

    @property
    def lam_star(self) -> float:
        """``λ_{j*} = max_j λ_j``."""
        return float(self.prefs.max())

    @property
    def psi_star(self) -> float:
        """``ψ_new* = t``."""
        return float(self.t)

    @property
    def w_star(self) -> np.ndarray:
        """``w_new* = c``."""
        return self.centre

    @property
    def L0(self) -> float:
        """``L₀ = λ_{j*}‖Q‖`` (smoothness of ψ_new; docs/spec/problems.md#f3)."""
        return self.lam_star * float(np.linalg.eigvalsh(self.hessian)[-1])

    @property
    def objective_smoothness(self) -> float:
        """``‖Q‖``: smoothness of each objective ``l_j``."""
        return float(np.linalg.eigvalsh(self.hessian)[-1])

    @property
    def mu_pl(self) -> float:
        """``μ_PL = μ = λ_{j*} λ_min(Q)``."""
        return self.lam_star * float(np.linalg.eigvalsh(self.hessian)[0])

    @property
    def sigma0_sq(self) -> float:
        """``σ₀² = λ_{j*}² tr Σ_ξ`` (per-sample variance of ``d̃``)."""
        return self.lam_star**2 * float(np.trace(self.noise_cov))

    # -- evaluation --------------------------------------------------------------------------------------------
    def losses(self, w) -> np.ndarray:
        """``l_j(w) = ½(w - c)ᵀQ(w - c) + t/λ_j``, ``(..., n_w) -> (..., m)``."""
        e = check_points(w, self.n_params) - self.centre
        q = 0.5 * np.einsum("...a,ab,...b->...", e, self.hessian, e)
        return q[..., None] + self.offsets

    def grads(self, w) -> np.ndarray:
        """Every column is ``Q(w - c)``: ``(..., n_w, m)``."""
        e = check_points(w, self.n_params) - self.centre
        g = e @ self.hessian
        return np.repeat(g[..., :, None], self.n_objectives, axis=-1)

    def gram(self, w) -> np.ndarray:
        """``C = GᵀG``, ``(..., m, m)`` (rank one)."""
        return gram_of(self.grads(w))

    def chebyshev(self, w) -> np.ndarray:
        """``ψ_new(w) = max_j λ_j l_j(w) = t + λ_{j*} q(w)``, ``(...)``."""
        return chebyshev(self.losses(w), self.prefs)

    def beta(self, w) -> np.ndarray:
        """``β_new(w)``, ``(...)``."""
        return preference_uniformity(self.losses(w), self.prefs)

    def direction(self, w) -> np.ndarray:
        """Population direction ``d_new(w) = ∇ψ_new(w) = λ_{j*} Q(w - c)``, ``(..., n_w)``."""
        e = check_points(w, self.n_params) - self.centre
        return self.lam_star * (e @ self.hessian)

    def sample_direction(self, rng, w, batch_size: int, *, explicit_batch: bool = False) -> np.ndarray:
        """``d̃ = λ_{j*}(Q(w - c) + ξ̄_S)`` with a fresh batch of ``S = batch_size`` samples per point.

        By default ``ξ̄_S`` is drawn directly from its law ``N(0, Σ_ξ/S)`` (identical in distribution to the mean
        of ``S`` i.i.d. ``N(0, Σ_ξ)`` samples); ``explicit_batch=True`` draws the ``S`` samples and averages them.
        One independent draw per point of ``w`` ``(..., n_w)``.
        """
        rng = check_rng(rng)
        S = check_int(batch_size, "batch_size", 1)
        w = check_points(w, self.n_params)
        root = _psd_sqrt(self.noise_cov)
        if explicit_batch:
            z = (rng.standard_normal(w.shape[:-1] + (S, self.n_params)) @ root).mean(axis=-2)
        else:
            z = rng.standard_normal(w.shape) @ root / np.sqrt(S)
        return self.lam_star * ((w - self.centre) @ self.hessian + z)

    # -- adaptation: exact moments and Monte Carlo ------------------------------------------------------------
    def _preconditioners(self, preconditioner, K: int) -> np.ndarray:
        n = self.n_params
        if preconditioner is None:
            return np.broadcast_to(np.eye(n), (K, n, n))
        P = _check_sym(preconditioner, "preconditioner", n, pd=True)
        if P.ndim == 2:
            return np.broadcast_to(P, (K, n, n))
        if P.shape[0] != K or P.ndim != 3:
            raise ValueError(f"preconditioner must be (n_w, n_w) or (K={K}, n_w, n_w); got {P.shape}")
        return P

    def _check_adapt(self, alpha, batch_size, K, w0):
        alpha = check_nonneg(alpha, "alpha", positive=True)
        S = check_int(batch_size, "batch_size", 1)
        K = check_int(K, "K", 0)
        w0 = self.w0 if w0 is None else check_points(w0, self.n_params, "w0")
        return alpha, S, K, w0

    def moment_recursion(self, alpha, batch_size: int, K: int, preconditioner=None, w0=None):
        """Exact first and second moments of ``e_k = w_k - c`` for deterministic ``P_k``.

        Returns ``(mean (K+1, n_w), second_moment (K+1, n_w, n_w))`` with ``M_0 = e_0 e_0ᵀ``,
        ``M_{k+1} = T_k M_k T_kᵀ + α²λ_{j*}² P_k Σ_ξ P_k / S``, ``T_k = I - αλ_{j*}P_kQ``.
        """
        alpha, S, K, w0 = self._check_adapt(alpha, batch_size, K, w0)
        if w0.ndim != 1:
            raise ValueError(f"w0 must be one point; got shape {w0.shape}")
        P = self._preconditioners(preconditioner, K)
        lam, n = self.lam_star, self.n_params
        mean = np.empty((K + 1, n))
        M = np.empty((K + 1, n, n))
        mean[0] = w0 - self.centre
        M[0] = np.outer(mean[0], mean[0])
        for k in range(K):
            T = np.eye(n) - alpha * lam * P[k] @ self.hessian
            mean[k + 1] = T @ mean[k]
            M[k + 1] = T @ M[k] @ T.T + (alpha * lam) ** 2 * P[k] @ self.noise_cov @ P[k] / S
        return mean, M

    def expected_gap(self, alpha, batch_size: int, K: int, preconditioner=None, w0=None) -> np.ndarray:
        """``E ψ_new(w_k) - ψ_new* = ½ λ_{j*} tr(Q M_k)`` for ``k = 0..K`` (exact), shape ``(K+1,)``."""
        _, M = self.moment_recursion(alpha, batch_size, K, preconditioner, w0)
        return 0.5 * self.lam_star * np.einsum("ab,kba->k", self.hessian, M)

    def simulate(self, rng, alpha, batch_size: int, K: int, n_runs: int, preconditioner=None, w0=None):
        """Monte Carlo of ``w_{k+1} = w_k - α P_k d̃(w_k)`` over ``n_runs`` independent runs (vectorised).

        Returns ``(w_K (n_runs, n_w), gaps (K+1, n_runs))`` with ``gaps[k] = ψ_new(w_k) - t``.
        """
        rng = check_rng(rng)
        alpha, S, K, w0 = self._check_adapt(alpha, batch_size, K, w0)
        n_runs = check_int(n_runs, "n_runs", 1)
        P = self._preconditioners(preconditioner, K)
        w = np.broadcast_to(w0, (n_runs, self.n_params)).copy()
        gaps = np.empty((K + 1, n_runs))
        gaps[0] = self.chebyshev(w) - self.t
        for k in range(K):
            w = w - alpha * self.sample_direction(rng, w, S) @ P[k]
            gaps[k + 1] = self.chebyshev(w) - self.t
        return w, gaps
