r"""The exact theory of the new-client adaptation statements H.39–H.45 and Thm-A
(docs/spec/iteration.md#new-client, docs/spec/problems.md#f3; private module: the leading underscore keeps it
out of statement discovery). Everything here is built on :class:`sim.problems.CommonMinimizer` (family F3:
``ψ_new(w) = t + λ_{j*} q(w)``, ``q(w) = ½‖w − c‖²_Q``, stochastic direction ``d̃ = λ_{j*}(Q(w − c) +
ξ̄_S)``), whose constants are exact: ``L₀ = λ_{j*}‖Q‖``, ``μ_PL = μ = λ_{j*}λ_min(Q)``, ``σ₀² = λ_{j*}² tr
Σ_ξ``, ``ψ_new* = t``, ``w_new* = c``.

* the F3 instances (:func:`one_dim_instance`, :func:`isotropic`, spectral preconditioners);
* eq 89–91 right-hand sides (:func:`rhs_91`, :func:`floor_term`), the step condition ``α ≤ p₋/(L₀p₊²)``;
* exact moments for a deterministic ``P`` (the problem's :meth:`~sim.problems.CommonMinimizer.moment_recursion`)
  and Gaussian endpoint samples;
* ``L_β`` (O-12, docs/spec/constants.md#constants: :func:`beta_lipschitz`, :func:`beta_segment_constant`) and
the quartic of the QG control.

The runs are in :mod:`._adaptation_runs`, the rows, statistics and hypotheses in :mod:`._adaptation_evidence`.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from sim.preference import adjustment, normalizer
from sim.problems import CommonMinimizer

# ----------------------------------------------------------------------------------------------- instances


def one_dim_instance(w0: float = 3.0, noise_var: float = 1.0) -> CommonMinimizer:
    """The 1-D F3 instance ``ψ = 1 + ½w²`` (``Q = 1``, ``λ = (1)``, ``t = 1``, ``c = 0``, ``Σ_ξ = noise_var``):
    ``L₀ = μ_PL = 1``, ``σ₀² = noise_var``."""
    return CommonMinimizer(np.eye(1), np.zeros(1), np.array([1.0]), 1.0, np.array([[noise_var]]),
                           np.array([float(w0)]))


def isotropic(prob: CommonMinimizer) -> CommonMinimizer:
    """``prob`` with ``Q = I`` (condition number 1): ``L₀ = μ_PL = λ_{j*}``, so with ``P = I`` and
    ``α = 1/L₀`` the iteration reaches ``c`` up to noise in one step and eq 90/91 hold with equality for ``K ≥ 1``
    (``E gap_K = ½α²λ³ tr Σ/S`` = the floor ``L₀ασ₀²/(2μS)``)."""
    return dataclasses.replace(prob, hessian=np.eye(prob.n_params))


def random_orthogonal(rng: np.random.Generator, n: int) -> np.ndarray:
    """Haar orthogonal matrix (QR of a Gaussian matrix with the sign fix)."""
    A = rng.standard_normal((n, n))
    Qm, R = np.linalg.qr(A)
    return Qm * np.sign(np.diag(R))


def spectral_preconditioner(U: np.ndarray, p_minus: float, p_plus: float) -> np.ndarray:
    """``P = U diag(linspace(p₋, p₊, n)) Uᵀ`` (symmetric, spectrum exactly ``[p₋, p₊]``)."""
    n = U.shape[0]
    P = (U * np.linspace(p_minus, p_plus, n)) @ U.T
    return 0.5 * (P + P.T)


# ----------------------------------------------------------------------------------------------- eq 89–91


def alpha_max(prob: CommonMinimizer, p_minus: float, p_plus: float) -> float:
    """Largest step of H.43/H.44: ``p₋/(L₀p₊²)``."""
    return float(p_minus / (prob.L0 * p_plus**2))


def rate(prob: CommonMinimizer, alpha: float, p_minus: float) -> float:
    """Contraction factor ``1 − αμ_PL p₋``."""
    return float(1.0 - alpha * prob.mu_pl * p_minus)


def floor_term(prob: CommonMinimizer, alpha: float, S: int, p_minus: float, p_plus: float) -> float:
    """Statistical floor ``L₀αp₊²σ₀²/(2μ_PL p₋ S)`` of eq 90/91."""
    return float(prob.L0 * alpha * p_plus**2 * prob.sigma0_sq / (2.0 * prob.mu_pl * p_minus * S))


def rhs_91(prob: CommonMinimizer, alpha: float, S: int, K: int, p_minus: float, p_plus: float,
           delta0: float) -> np.ndarray:
    """``(1 − αμ_PL p₋)^k Δ₀ + L₀αp₊²σ₀²/(2μ_PL p₋ S)`` for ``k = 0..K`` (eq 90/91, Thm-A's ``δ₀``)."""
    k = np.arange(K + 1)
    return rate(prob, alpha, p_minus) ** k * float(delta0) + floor_term(prob, alpha, S, p_minus, p_plus)


def rhs_89(prob: CommonMinimizer, alpha: float, S: int, p_minus: float, p_plus: float, gap) -> np.ndarray:
    """One-step bound eq 89: ``(1 − αμ_PL p₋) r + L₀α²p₊²σ₀²/(2S)``."""
    return (rate(prob, alpha, p_minus) * np.asarray(gap, dtype=np.float64)
            + prob.L0 * alpha**2 * p_plus**2 * prob.sigma0_sq / (2.0 * S))


def gap_of(prob: CommonMinimizer, W) -> np.ndarray:
    """``ψ_new(w) − ψ_new* = λ_{j*} q(w)`` (exact F3 identity, free of the ``t``-cancellation round-off)."""
    e = np.asarray(W, dtype=np.float64) - prob.centre
    return 0.5 * prob.lam_star * np.einsum("...a,ab,...b->...", e, prob.hessian, e)


def exact_moments(prob: CommonMinimizer, alpha: float, S: int, K: int, P=None, w0=None, bias=None):
    """Exact mean ``(K+1, n)`` and second moment ``(K+1, n, n)`` of ``e_k = w_k − c``.

    Without ``bias`` this is :meth:`CommonMinimizer.moment_recursion`. With a constant bias ``b`` in the
    direction (``d̃ = ∇ψ + b + λ_{j*}ξ̄_S``; negative controls only): ``m_{k+1} = T m_k − αPb``,
    ``C_{k+1} = T C_k Tᵀ + α²λ²PΣ_ξP/S`` (covariance), second moment ``C + m mᵀ``."""
    if bias is None:
        return prob.moment_recursion(alpha, S, K, P, w0)
    n = prob.n_params
    P = np.eye(n) if P is None else np.asarray(P, dtype=np.float64)
    w0 = prob.w0 if w0 is None else np.asarray(w0, dtype=np.float64)
    b = np.broadcast_to(np.asarray(bias, dtype=np.float64), (n,))
    lam = prob.lam_star
    T = np.eye(n) - alpha * lam * P @ prob.hessian
    noise = (alpha * lam) ** 2 * P @ prob.noise_cov @ P / S
    mean = np.empty((K + 1, n))
    second = np.empty((K + 1, n, n))
    m, C = w0 - prob.centre, np.zeros((n, n))
    for k in range(K + 1):
        mean[k], second[k] = m, C + np.outer(m, m)
        m, C = T @ m - alpha * P @ b, T @ C @ T.T + noise
    return mean, second


def exact_gap(prob: CommonMinimizer, alpha: float, S: int, K: int, P=None, w0=None, bias=None) -> np.ndarray:
    """``E ψ_new(w_k) − ψ_new* = ½λ_{j*} tr(Q M_k)``, ``k = 0..K`` (exact)."""
    if bias is None:
        return prob.expected_gap(alpha, S, K, P, w0)
    _, M = exact_moments(prob, alpha, S, K, P, w0, bias)
    return 0.5 * prob.lam_star * np.einsum("ab,kba->k", prob.hessian, M)


def exact_sq_dist(prob: CommonMinimizer, alpha: float, S: int, K: int, P=None, w0=None) -> np.ndarray:
    """``E‖w_k − c‖² = tr M_k``, ``k = 0..K`` (exact)."""
    _, M = prob.moment_recursion(alpha, S, K, P, w0)
    return np.trace(M, axis1=1, axis2=2)


def gaussian_endpoint_samples(prob: CommonMinimizer, rng, alpha: float, S: int, K: int, P, w0, n: int):
    """Exact samples of ``w_K`` for a deterministic ``P``: ``w_K`` is Gaussian with the exact mean and covariance
    of the moment recursion (the noise is Gaussian and the map is affine)."""
    mean, M = prob.moment_recursion(alpha, S, K, P, w0)
    m = mean[K]
    C = M[K] - np.outer(m, m)
    ev, U = np.linalg.eigh(0.5 * (C + C.T))
    root = U * np.sqrt(np.maximum(ev, 0.0))
    return prob.centre + m + rng.standard_normal((n, prob.n_params)) @ root.T


# ----------------------------------------------------------------------------------------------- L_beta (O-12)


def beta_lipschitz(prob: CommonMinimizer, rng, points, radius: float, *, n_ball: int = 20000,
                   safety: float = 1.1, n_grid: int = 100_001) -> dict:
    """``L_β`` := ``safety ×`` the largest ``‖∇_w β_new(w)‖ = ‖G A_new/Z_new‖`` (identity I3) over ``points`` and
    ``n_ball`` uniform points of the ball ``B(c, radius)`` (docs/spec/constants.md#constants,
    docs/spec/statements.md#t-h44: sampling with a ×1.1 safety factor).

    Also returns ``sup_1d``, an upper bound of ``‖∇β‖`` on the ball from F3's one-dimensional reduction:
    ``β`` depends on ``w`` only through ``q``, ``∇_wβ = β'(q) Q(w − c)`` and ``‖Q(w − c)‖ ≤ √(2‖Q‖q)``, so
    ``‖∇β‖ ≤ max_{q ≤ ½‖Q‖R²} |β'(q)|√(2‖Q‖q)`` (dense grid). ``L_β ≥ sup_1d`` is monitored as a hypothesis."""
    n = prob.n_params
    u = rng.standard_normal((n_ball, n))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    r = radius * rng.random(n_ball) ** (1.0 / n)
    pts = np.concatenate([np.asarray(points, dtype=np.float64).reshape(-1, n), prob.centre + r[:, None] * u])
    L = prob.losses(pts)
    G = prob.grads(pts)
    g = np.einsum("nam,nm->na", G, adjustment(L, prob.prefs)) / normalizer(L, prob.prefs)[:, None]
    sampled = float(np.linalg.norm(g, axis=1).max())
    Qn = prob.objective_smoothness
    q = np.linspace(0.0, 0.5 * Qn * radius**2, n_grid)
    m, t, lam = prob.n_objectives, prob.t, prob.prefs
    lh = (t + lam[None, :] * q[:, None]) / (q[:, None] + m * t)
    dlh = t * (m * lam[None, :] - 1.0) / (q[:, None] + m * t) ** 2
    dbeta = (dlh * np.log(m * lh)).sum(axis=1)
    sup_1d = float(np.max(np.abs(dbeta) * np.sqrt(2.0 * Qn * q)))
    return {"L_beta": safety * sampled, "sampled_max": sampled, "safety": safety, "sup_1d": sup_1d,
            "radius": float(radius), "n_points": int(pts.shape[0]),
            "method": "1.1 x max ||G A/Z|| over the iterates and uniform ball points (docs/spec/constants.md#constants, docs/spec/statements.md#t-h44)"}


def _beta_q_terms(prob: CommonMinimizer, s) -> tuple[np.ndarray, np.ndarray]:
    """F3's one-dimensional reduction of ``β_new``: with ``s = q(w) = ½‖w − c‖²_Q``,
    ``ĺ_j(s) = (t + λ_j s)/(s + mt)`` and ``β(s) = Σ_j ĺ_j log(mĺ_j)``, so ``β'(s) = Σ_j ĺ_j'(s) log(mĺ_j(s))`` with
    ``ĺ_j'(s) = t(mλ_j − 1)/(s + mt)²``. ``ĺ_j`` runs monotonically from ``1/m`` (at ``s = 0``) towards ``λ_j``, so
    ``ĺ_j'`` and ``log(mĺ_j)`` share the sign of ``mλ_j − 1`` and every term of ``β'`` is ``≥ 0``. Returns
    ``(|ĺ_j'(s)|, |log(mĺ_j(s))|)``, ``(..., m)`` each; ``β'(s)`` is the sum of their products."""
    m, t, lam = prob.n_objectives, prob.t, prob.prefs
    s = np.asarray(s, dtype=np.float64)[..., None]
    lh = (t + lam * s) / (s + m * t)
    return np.abs(t * (m * lam - 1.0) / (s + m * t) ** 2), np.abs(np.log(m * lh))


def beta_segment_constant(prob: CommonMinimizer, points, *, cell_ratio: float = 1e-3, s_min: float = 1e-9) -> dict:
    """Per point ``w``, an upper bound ``M(w)`` of the mean-value constant of ``β_new`` on the segment ``[c, w]``,
    ``sup_{ξ∈[c, w]} ‖∇_wβ_new(ξ)‖``, so that ``β_new(w) = β_new(w) − β_new(c) ≤ M(w)‖w − c‖`` (mean-value
    inequality; ``β_new(c) = 0``).

    Exact reduction (F3): ``β`` depends on ``w`` only through ``q``, ``∇β(ξ) = β'(q(ξ))Q(ξ − c)``; on the segment
    ``ξ_τ = c + τe`` (``e = w − c``, ``q(ξ_τ) = τ²q``) ``‖∇β(ξ_τ)‖ = β'(τ²q)τ‖Qe‖``, so
    ``sup_τ ‖∇β(ξ_τ)‖ = (‖Qe‖/√q)·sup_{s≤q} φ(s)`` with ``φ(s) = √s β'(s)``. The supremum of ``φ`` is bounded on cells
    ``[s_k, s_{k+1}]`` (``s_0 = 0``, then geometric from ``s_min·max q`` with ratio ``1 + cell_ratio``; the last cell
    ends at the point's own ``q``): ``√s ≤ √s_{k+1}``, ``|ĺ_j'|`` decreases in ``s`` (``≤`` its value at ``s_k``) and
    ``|log(mĺ_j)|`` is monotone (``≤`` the larger endpoint value), so ``φ ≤ √s_{k+1}Σ_j|ĺ_j'(s_k)|·max_ends
    |log(mĺ_j)|`` on the cell (:func:`_beta_q_terms`: every term of ``β'`` is ``≥ 0``, no cancellation). The bound
    exceeds the supremum by a relative ``O(cell_ratio)``. Returns ``{"M", "q", "cells"}``."""
    e = np.asarray(points, dtype=np.float64).reshape(-1, prob.n_params) - prob.centre
    Qe = e @ prob.hessian
    q = 0.5 * np.einsum("na,na->n", e, Qe)
    qmax = float(q.max()) if q.size else 0.0
    if qmax <= 0.0:
        return {"M": np.zeros(q.size), "q": q, "cells": 0}
    k = int(np.ceil(np.log(1.0 / s_min) / np.log1p(cell_ratio)))
    s = np.r_[0.0, s_min * qmax * (1.0 + cell_ratio) ** np.arange(k + 1)]
    d, x = _beta_q_terms(prob, s)
    cell = np.sqrt(s[1:]) * (d[:-1] * np.maximum(x[:-1], x[1:])).sum(axis=-1)
    upto = np.maximum.accumulate(cell)  # upto[k]: bound of sup φ on [0, s_{k+1}]
    i = np.searchsorted(s, q, side="right") - 1  # s_i <= q < s_{i+1}
    _, xq = _beta_q_terms(prob, q)
    last = np.sqrt(q) * (d[i] * np.maximum(x[i], xq)).sum(axis=-1)  # the cell [s_i, q]
    phi = np.maximum(np.where(i >= 1, upto[np.maximum(i - 1, 0)], 0.0), last)
    with np.errstate(divide="ignore", invalid="ignore"):
        M = np.where(q > 0.0, np.linalg.norm(Qe, axis=1) * phi / np.sqrt(q), 0.0)
    return {"M": M, "q": q, "cells": int(s.size - 1)}


# ----------------------------------------------------------------------------------------------- quartic (QG control)


def quartic_psi(lam: float, t: float, W, c) -> np.ndarray:
    """``ψ(w) = t + λ‖w − c‖⁴`` (QG fails near ``c`` for every ``μ > 0``)."""
    e = np.asarray(W, dtype=np.float64) - c
    return t + lam * np.einsum("...a,...a->...", e, e) ** 2


def quartic_grad(lam: float, W, c) -> np.ndarray:
    e = np.asarray(W, dtype=np.float64) - c
    return 4.0 * lam * np.einsum("...a,...a->...", e, e)[..., None] * e
