r"""Constants of the theory and how they are computed or estimated on a point set (THEOREMS.md §1.11).

Every function states whether its value is

* **exact** — true by construction (a closed form for the problem family, or a quantity that is *defined* on
  the given points, such as ``c = m·min ĺ`` over the visited points), or
* **an estimate over a finite sample** — a ``min`` (``max``) over sampled points of a ratio whose infimum
  (supremum) over a region is the constant. Such an estimate is **optimistic**: the true infimum can only be
  smaller (the true supremum only larger) than the sampled value (O-8).

Symbols (THEOREMS.md) next to the code names:

================================  =================================================================
``smoothness_quadratic``          ``L₀ = max_j ‖Q_j‖₂`` (quadratic family, exact)
``smoothness_hessian_max``        ``L₀ ≈ max ‖∇²l‖₂`` over sampled Hessians (estimate)
``gradient_bound``                ``B = max ‖g_i^{(j)}(w)‖`` over the given points
``gradient_bound_quadratic_ball`` ``B = max_j ‖Q_j‖ (R + ‖w̄ - c_j‖)`` on a ball (exact upper bound)
``floor_constant``                ``c = m · min ĺ`` (H.9)
``normalizer_min``                ``Z_min = min_i Z_i``
``adjustment_lipschitz``          ``L_adj = (1 + log(m/c))(1 + √m ‖l‖_∞ / Z_min)`` (eq 14, O-5)
``lp_basis``, ``lp_sensitivity``  ``M, b(A), M_B, b_B, S_B`` (§1.5 LP matrix form) and ``κ_LP = ‖M_B⁻¹‖‖C‖``
``h11_constant``                  ``C_1 = κ_LP² σ_max(C) L_adj²`` (H.11)
``regularity_constants``          ``κ_β = min γ*/β``, ``L_A = max ‖d_bal‖/√β`` (H.17)
``descent_margin_constants``      ``(c_d, b_i)`` of H.19 chosen on a log grid to minimise ``max_i ε_{0,i}``
``strict_descent_constant``       ``c_d = min m_i/r_i`` over ``r_i > 0`` (strict H.19)
``band_radius``                   ``ε_{0,i}`` (eq 64) and ``ε̂_{0,i}`` (eq 74, two-phase)
``h20_constants``                 ``μ_ψ = min ‖d_M‖²/(2r)``, ``σ = min m/‖d_M‖²``, ``c_d = 2σμ_ψ`` (H.20)
``quadratic_growth``              ``μ_i = min_j λ_i^{(j)} λ_min(Q_j)`` (H.34, quadratic family)
``pl_constant_samples``           ``μ_PL = min ‖∇ψ‖²/(2(ψ - ψ*))`` (H.39)
``direction_variance``            ``σ₀²`` = trace of the per-sample covariance (H.40)
``loss_bound_at_optima``          ``L* = max(‖l(w_new*)‖_∞, max_i ‖l(w_i*)‖_∞)`` (eq 80)
================================  =================================================================

Only :mod:`sim.preference` is imported; LP weights are taken as arguments. Bad input raises
:class:`ValueError` naming the argument and the value.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import numpy as np

from sim.preference import (
    bottleneck_set,
    check_gram,
    check_losses,
    check_preferences,
    check_shapes,
    normalized_losses,
    normalizer,
    uniformity_and_adjustment,
)
from sim.roundoff import TIE_RTOL, first_min

__all__ = [
    "smoothness_quadratic",
    "smoothness_hessian_max",
    "gradient_bound",
    "gradient_bound_quadratic_ball",
    "floor_constant",
    "normalizer_min",
    "adjustment_lipschitz",
    "lp_sensitivity",
    "LPBasis",
    "lp_basis",
    "basis_duals",
    "ClientBasis",
    "client_basis",
    "client_bases",
    "h11_constant",
    "RegularityConstants",
    "regularity_constants",
    "DescentMarginConstants",
    "descent_margin_constants",
    "StrictDescentConstant",
    "strict_descent_constant",
    "band_radius",
    "H20Constants",
    "h20_constants",
    "quadratic_growth",
    "pl_constant_samples",
    "direction_variance",
    "loss_bound_at_optima",
]

#: Round-off allowance below 0 for gaps ``r = ψ - ψ*`` (relative to ``max(1, max|r|)``); clipped to 0.
GAP_ROUNDOFF = 1e-12


# ----------------------------------------------------------------------------------------------- helpers


def _arr(x, name: str, *, ndim: int | None = None, min_ndim: int = 0, nonneg: bool = False,
         positive: bool = False, nonempty: bool = True) -> np.ndarray:
    try:
        a = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError, RuntimeError) as exc:  # RuntimeError: a tensor needing grad
        raise ValueError(f"{name} must be a numeric array; got {x!r}") from exc
    if ndim is not None and a.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s); got shape {a.shape}")
    if a.ndim < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimension(s); got shape {a.shape}")
    if nonempty and a.size == 0:
        raise ValueError(f"{name} must not be empty; got shape {a.shape}")
    bad = ~np.isfinite(a)
    if bad.any():
        at = tuple(int(i) for i in np.argwhere(bad)[0]) if a.ndim else ()
        raise ValueError(f"{name} contains a non-finite entry {a[at]!r} at index {at}")
    if positive and np.any(a <= 0):
        at = tuple(int(i) for i in np.argwhere(a <= 0)[0]) if a.ndim else ()
        raise ValueError(f"{name} must be strictly positive; entry {at} is {a[at]!r}")
    if nonneg and np.any(a < 0):
        at = tuple(int(i) for i in np.argwhere(a < 0)[0]) if a.ndim else ()
        raise ValueError(f"{name} must be >= 0; entry {at} is {a[at]!r}")
    return a


def _scalar(x, name: str, *, positive: bool = False, nonneg: bool = False) -> float:
    a = _arr(x, name, ndim=0, positive=positive, nonneg=nonneg)
    return float(a)


def _symmetric_stack(Qs, name: str) -> np.ndarray:
    Q = _arr(Qs, name, min_ndim=2)
    if Q.shape[-1] != Q.shape[-2]:
        raise ValueError(f"{name} must be square in its last two axes; got shape {Q.shape}")
    scale = np.maximum(1.0, np.abs(Q).max(axis=(-2, -1)))
    asym = np.abs(Q - np.swapaxes(Q, -1, -2)).max(axis=(-2, -1))
    if np.any(asym > 1e-10 * scale):
        raise ValueError(f"{name} must be symmetric (Hessians); max |Q - Qᵀ| = {float(np.max(asym)):.3e}")
    return Q


def _gaps(gaps, name: str = "gaps") -> np.ndarray:
    r = _arr(gaps, name)
    scale = max(1.0, float(np.max(np.abs(r))))
    if np.any(r < -GAP_ROUNDOFF * scale):
        at = tuple(int(i) for i in np.argwhere(r < -GAP_ROUNDOFF * scale)[0]) if r.ndim else ()
        raise ValueError(f"{name} (ψ - ψ*) must be >= 0; entry {at} is {r[at]!r}")
    return np.maximum(r, 0.0)


def _same_shape(a: np.ndarray, b: np.ndarray, na: str, nb: str) -> None:
    if a.shape != b.shape:
        raise ValueError(f"{na} and {nb} must have the same shape; got {a.shape} and {b.shape}")


# --------------------------------------------------------------------------------------- H.1–H.3 bundle


def smoothness_quadratic(Qs) -> np.float64:
    """``L₀ = max_j ‖Q_j‖₂`` for quadratic objectives ``½(w-c_j)ᵀQ_j(w-c_j) + b_j``.

    ``Qs``: ``(..., n_w, n_w)`` symmetric Hessians. **Exact** (the Hessian is constant).
    """
    Q = _symmetric_stack(Qs, "Qs")
    return np.float64(np.max(np.abs(np.linalg.eigvalsh(Q))))


def smoothness_hessian_max(hessians) -> np.float64:
    """``L₀ ≈ max ‖∇² l_i^{(j)}(w)‖₂`` over sampled Hessians ``(..., n_w, n_w)`` (grid or segment points).

    **Estimate over a finite sample**: optimistic (the supremum over the region is ≥ this value).
    """
    H = _symmetric_stack(hessians, "hessians")
    return np.float64(np.max(np.abs(np.linalg.eigvalsh(H))))


def gradient_bound(grads) -> np.float64:
    """``B = max ‖g_i^{(j)}(w)‖`` over all given points; ``grads``: ``(..., n_w, m)`` (columns are gradients).

    **Exact on the given points** (iterates and segment points, §1.11); as a bound on a region it is an
    **estimate over a finite sample** (optimistic).
    """
    g = _arr(grads, "grads", min_ndim=2)
    return np.float64(np.max(np.linalg.norm(g, axis=-2)))


def gradient_bound_quadratic_ball(Qs, centers, ball_center, radius) -> np.float64:
    """``B = max_j ‖Q_j‖ (R + ‖w̄ - c_j‖)`` for quadratics on the ball ``‖w - w̄‖ ≤ R``.

    ``Qs``: ``(m, n_w, n_w)``; ``centers``: ``(m, n_w)`` (the ``c_j``); ``ball_center``: ``(n_w,)``; ``radius ≥ 0``.
    **Exact upper bound** (``‖Q_j(w - c_j)‖ ≤ ‖Q_j‖(‖w - w̄‖ + ‖w̄ - c_j‖)``).
    """
    Q = _symmetric_stack(Qs, "Qs")
    if Q.ndim != 3:
        raise ValueError(f"Qs must have shape (m, n_w, n_w); got {Q.shape}")
    c = _arr(centers, "centers", ndim=2)
    wb = _arr(ball_center, "ball_center", ndim=1)
    R = _scalar(radius, "radius", nonneg=True)
    if c.shape != Q.shape[:2] or wb.shape != (Q.shape[1],):
        raise ValueError(
            f"shapes disagree: Qs {Q.shape}, centers {c.shape} (expected {Q.shape[:2]}), "
            f"ball_center {wb.shape} (expected ({Q.shape[1]},))"
        )
    norms = np.abs(np.linalg.eigvalsh(Q)).max(axis=-1)
    return np.float64(np.max(norms * (R + np.linalg.norm(wb[None, :] - c, axis=1))))


# ------------------------------------------------------------------------------------------- H.9 / H.10


def floor_constant(losses, prefs) -> np.float64:
    """H.9 floor ``c = m · min_{i,j,w} ĺ_i^{(j)}(w)`` over all given (broadcast) losses and preferences.

    **Exact on the given points** (definition over the visited points); ``c ∈ (0, 1]``, ``c = 1`` iff every
    ``ĺ`` is uniform (``β = 0``).
    """
    lhat = normalized_losses(losses, prefs)
    return np.float64(lhat.shape[-1] * lhat.min())


def normalizer_min(losses, prefs) -> np.float64:
    """``Z_min = min_i Z_i`` with ``Z_i = Σ_j λ_i^{(j)} l_i^{(j)}`` over all given points. Exact."""
    return np.float64(np.min(normalizer(losses, prefs)))


def adjustment_lipschitz(losses, prefs, c=None) -> np.float64:
    """``L_adj = (1 + log(m/c)) (1 + √m ‖l‖_∞ / Z_min)`` (eq 14, O-5), Lipschitz constant of ``λ ↦ A``.

    ``losses``: ``(..., m)`` (one common ``l(w)`` under H.5, or several); ``prefs``: ``(..., m)``, all the preferences
    the bound must cover (e.g. both ends of each pair). ``‖l‖_∞`` is the max over all losses, ``Z_min`` the min of
    ``Z`` over the broadcast pairs, ``c`` defaults to :func:`floor_constant` of the same arrays. A ``c`` passed in is
    used as given (it is not checked against the data: the H.10 negative control passes a wrong floor on
    purpose) and must lie in ``(0, 1]``.

    **Exact** as a proved upper bound (derived from I6; THEOREMS.md H.10) for any two preferences on the segment
    between points covered by ``c`` and ``Z_min``.
    """
    l = check_losses(losses)
    lam = check_preferences(prefs)
    check_shapes(l, lam)
    m = l.shape[-1]
    if c is None:
        c = floor_constant(l, lam)
    c = _scalar(c, "c", positive=True)
    if c > 1.0 + 1e-12:
        raise ValueError(f"c must lie in (0, 1] (H.9 floor ĺ >= c/m); got c={c!r}")
    z_min = float(np.min(normalizer(l, lam, validate=False)))
    return np.float64((1.0 + np.log(m / c)) * (1.0 + np.sqrt(m) * float(np.max(l)) / z_min))


# ------------------------------------------------------------------------------------- H.6: LP matrix form


def _kappa(M_B: np.ndarray, C: np.ndarray) -> np.ndarray:
    """``κ_LP = ‖M_B⁻¹‖₂ ‖C‖₂`` over a batch ``(..., m, m)`` of validated square bases and Gram matrices; raises
    ``ValueError`` naming the first singular ``M_B``."""
    s = np.linalg.svd(M_B, compute_uv=False)
    sing = s[..., -1] <= s[..., 0] * M_B.shape[-1] * np.finfo(np.float64).eps
    if np.any(sing):
        at = tuple(int(i) for i in np.argwhere(np.atleast_1d(sing))[0]) if sing.ndim else ()
        where = f" (instance {at})" if at else ""
        raise ValueError(f"M_B is singular{where} (smallest singular value {float(s[at + (-1,)]):.3e}); "
                         "it is not a basis")
    return (1.0 / s[..., -1]) * np.linalg.norm(C, 2, axis=(-2, -1))


def lp_sensitivity(M_B, C) -> np.float64:
    """``κ_LP = ‖M_B⁻¹‖₂ ‖C‖₂`` (§1.5), for a square non-singular basis matrix ``M_B`` ``(m, m)``. Exact."""
    MB = _arr(M_B, "M_B", ndim=2)
    if MB.shape[0] != MB.shape[1]:
        raise ValueError(f"M_B must be square; got shape {MB.shape}")
    Cm = check_gram(C, "C")
    if Cm.ndim != 2 or Cm.shape[0] != MB.shape[0]:
        raise ValueError(f"C must have shape {MB.shape}; got {Cm.shape}")
    return np.float64(_kappa(MB, Cm))


@dataclass(frozen=True, eq=False)
class LPBasis:
    """The balancing-mode LP of one client in matrix form (§1.5, "LP matrix form for Assumption H.6").

    Row ``r`` of ``M`` is ``rows[r]``: ``("eq", -1)`` for ``1ᵀμ = 1``, ``("sign", j)`` for ``μ_j ≥ 0`` and
    ``("con", j)`` for ``(Cμ)_j ≥ rhs_j`` (``j ∈ R``). The rhs is affine in ``A``:
    ``b(A) = b_const + S C A`` where ``S`` selects the A-dependent rows (``j ∈ J̄∖J*`` when ``J ≠ ∅``).

    Attributes
    ----------
    beta, adjustment, CA, J, J_bar, J_star : the instance (``β``, ``A``, ``CA``, index-set masks).
    rows, M, b, b_const, S : the full constraint system (``1 + m + |R|`` rows).
    slack : (k,) ``Mμ - b`` (0 on the equality row).
    active : (k,) bool, active rows (the equality always counts).
    n_active, rank_active : number and rank of the active rows.
    is_basis : exactly ``m`` active rows, linearly independent.
    strictly_complementary : every active inequality has ``|dual| > dual_tol``; ``None`` when no duals given.
    nondegenerate : ``is_basis and strictly_complementary``; ``None`` if ``is_basis`` and duals unknown.
    basis_rows, M_B, b_B, b_const_B, S_B : the basis (``None`` unless ``is_basis``); ``μ* = M_B⁻¹ b_B(A)`` (eq 8).
    kappa_lp : ``‖M_B⁻¹‖‖C‖`` (``None`` unless ``is_basis``).
    reason : why it is not a (non-degenerate) basis, empty otherwise.
    """

    gram: np.ndarray
    beta: float
    adjustment: np.ndarray
    CA: np.ndarray
    J: np.ndarray
    J_bar: np.ndarray
    J_star: np.ndarray
    rows: tuple
    M: np.ndarray
    b: np.ndarray
    b_const: np.ndarray
    S: np.ndarray
    slack: np.ndarray
    active: np.ndarray
    n_active: int
    rank_active: int
    is_basis: bool
    strictly_complementary: bool | None
    nondegenerate: bool | None
    basis_rows: np.ndarray | None
    M_B: np.ndarray | None
    b_B: np.ndarray | None
    b_const_B: np.ndarray | None
    S_B: np.ndarray | None
    kappa_lp: float | None
    reason: str

    def basis(self, what: str = "use") -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(basis_rows, M_B, b_const_B, S_B)``; raises ``ValueError`` with :attr:`reason` when the active rows
        are not a basis (``what``: what needed it, for the message)."""
        if not self.is_basis or self.basis_rows is None or self.M_B is None or self.b_const_B is None \
                or self.S_B is None:
            raise ValueError(f"no basis to {what}: {self.reason}")
        return self.basis_rows, self.M_B, self.b_const_B, self.S_B

    def rhs_B(self, adjustment) -> np.ndarray:
        """``b_B(A') = b_const_B + S_B C A'`` for another adjustment vector ``A'`` (same basis)."""
        _, _, b_const_B, S_B = self.basis("evaluate b_B on")
        a = _arr(adjustment, "adjustment", ndim=1)
        if a.shape != self.adjustment.shape:
            raise ValueError(f"adjustment must have shape {self.adjustment.shape}; got {a.shape}")
        return b_const_B + S_B @ (self.gram @ a)

    def with_duals(self, sign_duals, constraint_duals, dual_tol: float = 1e-10) -> LPBasis:
        """This classification with the duals given: what :func:`lp_basis` returns for the same instance and
        weights with ``sign_duals``, ``constraint_duals`` and ``dual_tol``, without building the LP again."""
        dual_tol = _scalar(dual_tol, "dual_tol", nonneg=True)
        R = np.array([j for kind, j in self.rows if kind == "con"], dtype=np.intp)
        reason = "" if self.is_basis else self.reason
        strict, nondeg, reason = _complementarity(np.asarray(self.active), R, self.is_basis, reason, sign_duals,
                                                  constraint_duals, dual_tol)
        return replace(self, strictly_complementary=strict, nondegenerate=nondeg, reason=reason)

    def solve(self, adjustment=None) -> np.ndarray:
        """Eq 8: ``μ = M_B⁻¹ b_B(A')`` (default ``A' = A`` of the instance)."""
        _, M_B, _, _ = self.basis("solve eq 8 on")
        a = self.adjustment if adjustment is None else adjustment
        return np.linalg.solve(M_B, self.rhs_B(a))


def _strictly_complementary(active_ineq: np.ndarray, duals: np.ndarray, dual_tol: float) -> np.ndarray:
    """Strict complementarity: every active inequality row has ``|dual| > dual_tol`` (masks and duals
    ``(..., k)``, result ``(...)``)."""
    return np.all((np.abs(duals) > dual_tol) | ~active_ineq, axis=-1)


def _complementarity(active: np.ndarray, R: np.ndarray, is_basis: bool, reason: str, sign_duals,
                     constraint_duals, dual_tol: float) -> tuple[bool | None, bool | None, str]:
    """``(strictly_complementary, nondegenerate, reason)`` of :func:`lp_basis` from its active rows (the equality
    first, then ``m`` sign rows, then the rows ``R``) and the duals (both None: unknown)."""
    m = active.shape[0] - 1 - R.size
    strict: bool | None = None
    if sign_duals is not None:
        sd = _arr(sign_duals, "sign_duals", ndim=1)
        cd = _arr(constraint_duals, "constraint_duals", ndim=1)
        if sd.shape != (m,) or cd.shape != (m,):
            raise ValueError(
                f"sign_duals and constraint_duals must have shape ({m},); got {sd.shape} and {cd.shape}"
            )
        duals = np.concatenate([[np.inf], sd, cd[R]])
        act_ineq = active.copy()
        act_ineq[0] = False
        strict = bool(_strictly_complementary(act_ineq, duals, dual_tol))
        if is_basis and not strict:
            reason = _ZERO_DUAL
    nondeg = strict if is_basis else False
    return strict, nondeg, reason


_ZERO_DUAL = "an active inequality has a zero dual (no strict complementarity)"


class _Classified(NamedTuple):
    """:func:`_classify` over a batch of ``n`` clients, in the full row layout ``1 + 2m``: the equality, the
    ``m`` sign rows, the ``m`` constraint rows ``(Cμ)_j ≥ rhs_j`` (``present``: ``j ∈ R``)."""

    beta: np.ndarray  # (n,)
    A: np.ndarray  # (n, m)
    CA: np.ndarray  # (n, m)
    J: np.ndarray  # (n, m)
    J_star: np.ndarray  # (n, m)
    a_dep: np.ndarray  # (n, m): the A-dependent constraint rows (j ∈ J̄∖J* when J ≠ ∅)
    present: np.ndarray  # (n, 1 + 2m)
    M: np.ndarray  # (n, 1 + 2m, m)
    b: np.ndarray  # (n, 1 + 2m)
    slack: np.ndarray  # (n, 1 + 2m)
    active: np.ndarray  # (n, 1 + 2m), False where not present
    n_active: np.ndarray  # (n,)
    rank: np.ndarray  # (n,)
    is_basis: np.ndarray  # (n,)
    kappa: np.ndarray  # (n,), NaN where not a basis


def _classify(l, lam, C, mu, tol: float, eps_mode: float, tol_Jstar: float, feas_tol: float,
              who: Callable[[int], str]) -> _Classified:
    """The matrix form of the balancing LP (§1.5) and the classification of its active rows at ``μ``, for ``n``
    validated clients at once (``l``, ``lam``, ``mu`` ``(n, m)``, ``C`` ``(n, m, m)``): :func:`lp_basis` and
    :func:`client_bases` both build it here. ``who(i)``: how an error names client ``i``."""
    n, m = l.shape
    beta, A = uniformity_and_adjustment(l, lam, validate=False)
    bad = ~(beta > eps_mode)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"{who(i)}lp_basis is defined for balancing-mode instances (β > eps_mode, O-24); got "
            f"β={float(beta[i])!r} with eps_mode={eps_mode!r} from losses/prefs"
        )
    CA = np.matmul(C, A[..., None])[..., 0]
    J = CA > 0.0
    J_star = bottleneck_set(l, lam, tol=tol_Jstar, validate=False)
    any_J = J.any(axis=-1, keepdims=True)
    R = np.where(any_J, J_star | ~J, True)
    a_dep = any_J & ~J & ~J_star
    present = np.concatenate([np.ones((n, 1 + m), dtype=bool), R], axis=1)
    M = np.concatenate([np.ones((n, 1, m)), np.broadcast_to(np.eye(m), (n, m, m)), C], axis=1)
    b_con = 0.0 + np.where(a_dep, CA, 0.0)  # b = b_const + S CA (0.0 + : no negative zero)
    b = np.concatenate([np.ones((n, 1)), np.zeros((n, m)), b_con], axis=1)

    # feasibility of the given weights
    total = mu.sum(axis=-1)
    bad = np.abs(total - 1.0) > max(feas_tol, 1e-12)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{who(i)}weights must sum to 1 (LP equality); they sum to {float(total[i])!r}")
    bad = np.any(mu < -feas_tol, axis=-1)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        low = int(np.argmin(mu[i]))
        raise ValueError(f"{who(i)}weights must be >= 0 (LP sign constraints); weights[{low}] = {mu[i, low]!r}")
    con = np.matmul(C, mu[..., None])[..., 0] - b_con
    scale = np.maximum(1.0, np.maximum(np.abs(C).max(axis=-1), np.abs(b_con)))
    bad = np.any(R & (con < -feas_tol * scale), axis=-1)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        j = int(np.argmin(np.where(R[i], con[i] / scale[i], np.inf)))
        raise ValueError(
            f"{who(i)}weights violate LP constraint row (Cμ)_{j} >= {b_con[i, j]!r}: slack {con[i, j]!r}"
        )
    slack = np.concatenate([np.zeros((n, 1)), mu, con], axis=1)

    active = np.concatenate([np.ones((n, 1), dtype=bool), mu <= tol,
                             R & (con <= tol * np.maximum(1.0, np.abs(b_con)))], axis=1)
    n_active = active.sum(axis=-1)
    rank = np.zeros(n, dtype=np.intp)
    for k in np.unique(n_active):  # the active rows of the clients with k of them, one batched rank
        sel = np.flatnonzero(n_active == k)
        rank[sel] = np.linalg.matrix_rank(M[sel][active[sel]].reshape(sel.size, int(k), m))
    is_basis = (n_active == m) & (rank == m)
    kappa = np.full(n, np.nan)
    if is_basis.any():
        kappa[is_basis] = _kappa(M[is_basis][active[is_basis]].reshape(-1, m, m), C[is_basis])
    return _Classified(beta, A, CA, J, J_star, a_dep, present, M, b, slack, active, n_active, rank, is_basis,
                       kappa)


def _frozen(a: Any) -> Any:
    """``a`` made read-only in place (an array of this module's own, not the caller's)."""
    if a is not None:
        a.flags.writeable = False
    return a


def _lp_basis_of(c: _Classified, i: int, C: np.ndarray, sign_duals, constraint_duals,
                 dual_tol: float) -> LPBasis:
    """Client ``i`` of :func:`_classify` as an :class:`LPBasis` (rows of ``M``: the equality, the sign rows, then
    the rows ``j ∈ R``), with its complementarity from the duals given (both None: unknown)."""
    m = c.A.shape[1]
    keep = c.present[i]
    R = np.flatnonzero(keep[1 + m:])
    n_active, rank, is_basis = int(c.n_active[i]), int(c.rank[i]), bool(c.is_basis[i])
    reason = ""
    if n_active != m:
        reason = f"{n_active} active rows (need exactly m={m}): {'degenerate vertex' if n_active > m else 'not a vertex'}"
    elif rank != m:
        reason = f"active rows are linearly dependent (rank {rank} < m={m})"
    active = c.active[i][keep]
    strict, nondeg, reason = _complementarity(active, R, is_basis, reason, sign_duals, constraint_duals, dual_tol)
    k = keep.sum()
    M, b, slack = c.M[i][keep], c.b[i][keep], c.slack[i][keep]
    b_const = np.zeros(k)
    b_const[0] = 1.0
    S = np.zeros((k, m))
    S[1 + m + np.arange(R.size), R] = c.a_dep[i][R]
    basis_rows = M_B = b_B = b0_B = S_B = None
    kappa = None
    if is_basis:
        basis_rows = np.flatnonzero(active)
        M_B, b_B, b0_B, S_B = M[basis_rows], b[basis_rows], b_const[basis_rows], S[basis_rows]
        kappa = float(c.kappa[i])
    rows = (("eq", -1),) + tuple(("sign", j) for j in range(m)) + tuple(("con", int(j)) for j in R)
    ro = _frozen  # every array below is this call's own (C copied: it may be the caller's)
    return LPBasis(
        gram=ro(np.array(C)), beta=float(c.beta[i]), adjustment=ro(c.A[i]), CA=ro(c.CA[i]), J=ro(c.J[i]),
        J_bar=ro(~c.J[i]), J_star=ro(c.J_star[i]), rows=rows, M=ro(M), b=ro(b), b_const=ro(b_const), S=ro(S),
        slack=ro(slack), active=ro(active), n_active=n_active, rank_active=rank, is_basis=is_basis,
        strictly_complementary=strict, nondegenerate=nondeg, basis_rows=ro(basis_rows), M_B=ro(M_B),
        b_B=ro(b_B), b_const_B=ro(b0_B), S_B=ro(S_B), kappa_lp=kappa, reason=reason,
    )


def lp_basis(
    losses,
    prefs,
    gram,
    weights,
    tol: float = 1e-9,
    *,
    sign_duals=None,
    constraint_duals=None,
    dual_tol: float = 1e-10,
    eps_mode: float = 0.0,
    tol_Jstar: float = 0.0,
    feas_tol: float = 1e-7,
) -> LPBasis:
    """Build ``M``, ``b(A)`` of the balancing-mode EPO LP (§1.5) and classify the active rows at ``weights``.

    Inputs: one client (no batch axis): ``losses`` ``(m,)``, ``prefs`` ``(m,)``, ``gram`` ``C`` ``(m, m)`` and the
    LP weights ``μ*`` ``(m,)`` (e.g. from ``sim.direction.lp_direction``). The instance must be in balancing mode,
    ``β > eps_mode`` (H.6 implicitly requires it, O-24). Index sets as in the EPO code: ``J = {(CA)_j > 0}``,
    ``J* = {λ_j l_j ≥ ψ - tol_Jstar·ψ}``; ``R = J* ∪ (J̄∖J*)`` if ``J ≠ ∅`` (rhs ``(CA)_j`` on ``J̄∖J*``, 0 on ``J*``),
    else ``R = [m]`` with rhs 0 (the LP's ``J = ∅`` branch).

    Active (§1.5): constraint rows with slack ``≤ tol·max(1, |rhs|)``, sign rows with ``μ_j ≤ tol``; the equality
    always. ``is_basis`` iff exactly ``m`` active rows that are linearly independent (numerical rank). Strict
    complementarity needs the duals: ``sign_duals`` ``(m,)`` (reduced costs of ``μ ≥ 0``, HiGHS
    ``res.lower.marginals``) and ``constraint_duals`` ``(m,)`` indexed by objective ``j`` (multiplier of row
    ``(Cμ)_j ≥ rhs_j``; entries for ``j ∉ R`` ignored). Give both or neither; without them it is reported as
    unknown (``None``). ``weights`` must be feasible up to ``feas_tol`` (relative to
    ``max(1, max_k |C_jk|, |rhs_j|)``), else ValueError. Exact given the tolerances. :func:`client_bases`
    classifies a batch of clients the same way.
    """
    l = check_losses(losses)
    lam = check_preferences(prefs)
    C = check_gram(gram)
    check_shapes(l, lam, C)
    if l.ndim != 1 or lam.ndim != 1 or C.ndim != 2:
        raise ValueError(
            f"lp_basis takes one client: losses (m,), prefs (m,), gram (m, m); got {l.shape}, {lam.shape}, {C.shape}"
        )
    m = l.shape[0]
    mu = _arr(weights, "weights", ndim=1)
    if mu.shape != (m,):
        raise ValueError(f"weights must have shape ({m},); got {mu.shape}")
    tol = _scalar(tol, "tol", nonneg=True)
    dual_tol = _scalar(dual_tol, "dual_tol", nonneg=True)
    feas_tol = _scalar(feas_tol, "feas_tol", nonneg=True)
    eps_mode = _scalar(eps_mode, "eps_mode", nonneg=True)
    tol_Jstar = _scalar(tol_Jstar, "tol_Jstar", nonneg=True)
    c = _classify(l[None], lam[None], C[None], mu[None], tol, eps_mode, tol_Jstar, feas_tol, lambda i: "")
    if (sign_duals is None) != (constraint_duals is None):
        raise ValueError(
            "give both sign_duals and constraint_duals or neither; got "
            f"sign_duals={'None' if sign_duals is None else 'array'}, "
            f"constraint_duals={'None' if constraint_duals is None else 'array'}"
        )
    return _lp_basis_of(c, 0, C, sign_duals, constraint_duals, dual_tol)


def _duals(M_B: np.ndarray, CA: np.ndarray, ineq: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The unique duals ``y`` of bases ``M_B`` ``(n, m, m)`` (``CA = M_Bᵀ y``), whether they are dual feasible
    (``y_r ≤ 0`` on the inequality rows ``ineq`` ``(n, m)``, up to ``1e-12·max(1, max|CA|)``) and the smallest
    ``|y_r|`` over those rows (``inf`` without one): :func:`basis_duals` of each basis."""
    y = np.linalg.solve(np.swapaxes(M_B, -1, -2), CA[..., None])[..., 0]
    scale = np.maximum(1.0, np.abs(CA).max(axis=-1))
    feasible = np.all((y <= 1e-12 * scale[..., None]) | ~ineq, axis=-1)
    min_abs = np.where(ineq, np.abs(y), np.inf).min(axis=-1)
    return y, feasible, min_abs


def basis_duals(info: LPBasis) -> tuple[np.ndarray, np.ndarray, bool, float]:
    """Duals of the balancing LP at the basis of ``info``.

    At a basis (``m`` linearly independent active rows ``M_B``) the duals are unique: stationarity of
    ``max (CA)ᵀμ s.t. M_r μ ≥ b_r (r ≠ eq), 1ᵀμ = 1`` reads ``CA = M_Bᵀ y``; optimality needs ``y_r ≤ 0`` on every
    active inequality and strict complementarity ``y_r ≠ 0``. One ``m×m`` solve gives the numbers HiGHS reports
    as ``res.ineqlin.marginals`` / ``res.lower.marginals`` for that vertex, and certifies the vertex optimal.

    Returns ``(sign_duals (m,), constraint_duals (m,), dual_feasible, min |dual| over active inequalities)``,
    in the indexing :func:`lp_basis` expects (``constraint_duals[j]`` for row ``(Cμ)_j ≥ rhs_j``).
    """
    basis_rows, M_B, _, _ = info.basis("compute duals at")
    m = info.adjustment.shape[0]
    kinds = [info.rows[int(r)] for r in basis_rows]
    ineq = np.array([kind != "eq" for kind, _ in kinds])
    y, feasible, min_abs = _duals(M_B[None], info.CA[None], ineq[None])
    sign = np.zeros(m)
    con = np.zeros(m)
    for (kind, j), y_r in zip(kinds, y[0], strict=True):
        if kind == "sign":
            sign[j] = y_r
        elif kind == "con":
            con[j] = y_r
    return sign, con, bool(feasible[0]), float(min_abs[0])


@dataclass(frozen=True, eq=False)
class ClientBasis:
    """One client's LP vertex: the :class:`LPBasis` (with duals) and the dual certificate."""

    info: LPBasis | None  # None: dom mode (lp_basis is defined for balancing mode only)
    dual_feasible: bool
    min_dual: float

    @property
    def vertex(self) -> bool:
        """Non-degenerate *optimal* vertex: a basis, strictly complementary, dual feasible."""
        return bool(self.info is not None and self.info.is_basis and self.info.nondegenerate
                    and self.dual_feasible)

    @property
    def key(self) -> tuple | None:
        """Identity of the basis: the index sets and the labels of the basis rows."""
        if self.info is None or not self.info.is_basis:
            return None
        rows = tuple(self.info.rows[int(r)] for r in self.info.basis()[0])
        return (tuple(self.info.J.tolist()), tuple(self.info.J_star.tolist()), rows)

    @property
    def a_dependent(self) -> bool:
        """The basis holds an A-dependent row (``S_B ≠ 0``); otherwise consequence (a) of H.6: ``H = 0``."""
        return bool(self.info is not None and self.info.is_basis and np.any(self.info.S_B))


def client_bases(losses, prefs, gram, weights, modes, *, dual_tol: float = 1e-10) -> tuple[ClientBasis, ...]:
    """Classify the LP solutions of ``N`` clients at once: what :func:`client_basis` gives for each, from one
    batched build of the LPs' matrix forms, one rank, one ``κ_LP`` and one dual solve for the batch.

    ``losses`` ``(N, m)`` or ``(m,)`` (common), ``prefs`` ``(N, m)``, ``gram`` ``(N, m, m)`` or ``(m, m)``
    (common), ``weights`` ``(N, m)``, ``modes`` ``(N,)`` (the LP's ``"balance"``/``"descent"``: only balancing
    clients are classified). Errors name the client."""
    lam = check_preferences(prefs)
    if lam.ndim != 2:
        raise ValueError(f"prefs must have shape (N, m); got {lam.shape}")
    N, m = lam.shape
    l = check_losses(losses)
    C = check_gram(gram)
    check_shapes(l, lam, C)
    if l.ndim > 2 or C.ndim > 3:
        raise ValueError(f"losses must be (N, m) or (m,) and gram (N, m, m) or (m, m); got {l.shape}, {C.shape}")
    l = np.broadcast_to(l, (N, m))
    C = np.broadcast_to(C, (N, m, m))
    mu = _arr(weights, "weights", ndim=2)
    if mu.shape != (N, m):
        raise ValueError(f"weights must have shape ({N}, {m}); got {mu.shape}")
    md = np.asarray(modes).astype(str)
    if md.shape != (N,):
        raise ValueError(f"modes must have shape ({N},); got {md.shape}")
    dual_tol = _scalar(dual_tol, "dual_tol", nonneg=True)
    out: list[ClientBasis] = [ClientBasis(None, False, 0.0)] * N  # dom mode: lp_basis is for balancing mode
    bal = np.flatnonzero(md == "balance")
    if bal.size == 0:
        return tuple(out)
    c = _classify(l[bal], lam[bal], C[bal], mu[bal], 1e-9, 0.0, 0.0, 1e-7, lambda i: f"client {int(bal[i])}: ")
    sd = cd = np.zeros((bal.size, m))
    feasible = np.zeros(bal.size, dtype=bool)
    min_abs = np.zeros(bal.size)
    if c.is_basis.any():
        sel = c.is_basis
        act = c.active[sel]
        rows_ineq = np.broadcast_to(np.arange(1 + 2 * m) > 0, act.shape)[act].reshape(-1, m)
        y, feasible[sel], min_abs[sel] = _duals(c.M[sel][act].reshape(-1, m, m), c.CA[sel], rows_ineq)
        full = np.zeros(act.shape)
        full[act] = y.ravel()
        sd = np.zeros((bal.size, m))
        cd = np.zeros((bal.size, m))
        sd[sel], cd[sel] = full[:, 1:1 + m], full[:, 1 + m:]
    for k, i in enumerate(bal):
        if c.is_basis[k]:
            info = _lp_basis_of(c, k, C[i], sd[k], cd[k], dual_tol)
            out[i] = ClientBasis(info, bool(feasible[k]), float(min_abs[k]))
        else:
            out[i] = ClientBasis(_lp_basis_of(c, k, C[i], None, None, dual_tol), False, 0.0)
    return tuple(out)


def client_basis(losses, pref, gram, weights, mode: str, *, dual_tol: float = 1e-10) -> ClientBasis:
    """Classify one client's LP solution (:func:`lp_basis`, then :meth:`LPBasis.with_duals` with its duals)."""
    if mode != "balance":
        return ClientBasis(None, False, 0.0)
    info = lp_basis(losses, pref, gram, weights)
    if not info.is_basis:
        return ClientBasis(info, False, 0.0)
    sd, cd, feas, min_abs = basis_duals(info)
    info = info.with_duals(sd, cd, dual_tol)
    return ClientBasis(info, feas, min_abs)


def h11_constant(kappa_lp, gram, L_adj, *, half: bool = False) -> np.float64:
    """``C_1 = κ_LP² σ_max(C) L_adj²`` (H.11); ``half=True`` gives the also valid ``½ κ_LP² σ_max(C) L_adj²``.

    ``σ_max(C)`` is the largest eigenvalue of ``C`` (O-28). Exact given its inputs.
    """
    k = _scalar(kappa_lp, "kappa_lp", nonneg=True)
    La = _scalar(L_adj, "L_adj", nonneg=True)
    C = check_gram(gram)
    if C.ndim != 2:
        raise ValueError(f"gram must have shape (m, m); got {C.shape}")
    val = k * k * float(np.linalg.eigvalsh(C)[-1]) * La * La
    return np.float64(0.5 * val if half else val)


# ------------------------------------------------------------------------------------------------ H.17


@dataclass(frozen=True)
class RegularityConstants:
    """H.17 constants on a sample: ``kappa_beta = min γ*/β``, ``L_A = max ‖d_bal‖/√β`` over ``n_points`` points
    with ``β > beta_min``; ``holds`` iff ``kappa_beta > 0``."""

    kappa_beta: float
    L_A: float
    n_points: int
    holds: bool


def regularity_constants(gains, betas, dbal_norms, *, beta_min: float = 0.0) -> RegularityConstants:
    """H.17 (eq 49): ``κ_β := min γ_i*/β_i`` and ``L_A := max ‖d_bal,i‖/√β_i`` over the points with ``β > beta_min``.

    ``gains`` (``γ* = μᵀCA``), ``betas``, ``dbal_norms``: arrays of one shape. **Estimate over a finite sample**:
    both are optimistic (the infimum of ``γ/β`` is ≤ ``κ_β``, the supremum of ``‖d_bal‖/√β`` is ≥ ``L_A``).
    ``holds`` is ``κ_β > 0``; a non-positive ``κ_β`` is returned as is (H.17 fails on the sample).
    """
    g = _arr(gains, "gains")
    bt = _arr(betas, "betas", nonneg=True)
    dn = _arr(dbal_norms, "dbal_norms", nonneg=True)
    _same_shape(g, bt, "gains", "betas")
    _same_shape(g, dn, "gains", "dbal_norms")
    beta_min = _scalar(beta_min, "beta_min", nonneg=True)
    sel = bt > beta_min
    if not sel.any():
        raise ValueError(f"betas has no entry > beta_min={beta_min!r}; κ_β and L_A are undefined on this sample")
    kb = float(np.min(g[sel] / bt[sel]))
    la = float(np.max(dn[sel] / np.sqrt(bt[sel])))
    return RegularityConstants(kappa_beta=kb, L_A=la, n_points=int(sel.sum()), holds=kb > 0.0)


# ------------------------------------------------------------------------------------------ H.19 / eq 64


def _band_inputs(eta, prefs_max, B, L0, deviations, N: int | None):
    eta = _scalar(eta, "eta", positive=True)
    lam_max = _arr(prefs_max, "prefs_max", positive=True)
    if np.any(lam_max > 1.0 + 1e-12):
        raise ValueError(f"prefs_max (λ_max,i = ‖λ_i‖_∞) must lie in (0, 1]; got {lam_max!r}")
    B = _scalar(B, "B", nonneg=True)
    L0 = _scalar(L0, "L0", nonneg=True)
    dev = _arr(deviations, "deviations", nonneg=True)
    if dev.ndim > 2:
        raise ValueError(f"deviations must have shape (N,) or (N, T); got {dev.shape}")
    if dev.ndim == 2:
        dev = dev.max(axis=1)
    if N is not None:
        if lam_max.ndim not in (0, 1) or (lam_max.ndim == 1 and lam_max.shape[0] != N):
            raise ValueError(f"prefs_max must be a scalar or have shape ({N},); got {lam_max.shape}")
        if dev.ndim not in (0, 1) or (dev.ndim == 1 and dev.shape[0] != N):
            raise ValueError(f"deviations must be a scalar, (N,) or (N, T) with N={N}; got {dev.shape}")
    return eta, lam_max, B, L0, dev


def band_radius(c_d, b, eta, prefs_max, B, L0, deviations, *, eta_II=None) -> np.ndarray:
    """Band radius (eq 64): ``ε_{0,i} = (λ_max,i/c_d)(B Δ̄_i + L₀B²η/2) + b_i/c_d = κ_H,i Δ̄_i + κ_η,i η + b_i/c_d``.

    With ``eta_II`` the two-phase radius (eq 74) ``ε̂_{0,i}`` is returned: the same formula with
    ``max(η, η_II)`` (``eta`` = ``η_I``). ``b``: ``(N,)`` or scalar tolerances ``b_i ≥ 0``; ``prefs_max``:
    ``λ_max,i = ‖λ_i‖_∞``; ``deviations``: ``Δ̄_i`` ``(N,)`` or a trajectory ``(N, T)`` (its max over ``T`` is used).
    Returns ``(N,)`` (broadcast). Exact given the constants; ``η c_d ≤ 1`` (hypothesis of H.29) is not enforced.
    """
    c_d = _scalar(c_d, "c_d", positive=True)
    bb = _arr(b, "b", nonneg=True)
    eta, lam_max, B, L0, dev = _band_inputs(eta, prefs_max, B, L0, deviations, None)
    if eta_II is not None:
        eta = max(eta, _scalar(eta_II, "eta_II", positive=True))
    try:
        out = (lam_max / c_d) * (B * dev + 0.5 * L0 * B * B * eta) + bb / c_d
    except ValueError as exc:
        raise ValueError(
            f"b {bb.shape}, prefs_max {lam_max.shape} and deviations {dev.shape} do not broadcast"
        ) from exc
    return np.asarray(out, dtype=np.float64)


@dataclass(frozen=True, eq=False)
class DescentMarginConstants:
    """H.19 constants chosen on a log grid (§1.11).

    c_d : the chosen common ``c_d ∈ (0, 1/η]``; b : (N,) ``b_i(c_d)``; eps0 : (N,) ``ε_{0,i}`` (eq 64);
    eps0_max : ``ε_0 = max_i ε_{0,i}``; eps0_mean : ``ε̄_0 = (1/N) Σ_i ε_{0,i}`` (eq 92); deviation_bar : (N,)
    ``Δ̄_i`` used; c_grid, objective : the grid and ``max_i ε_{0,i}`` on it; residual_max : ``max_{i,w}
    (c_d r_i - b_i - m_i) ≤ 0`` (H.19 holds on the points by construction).
    """

    c_d: float
    b: np.ndarray
    eps0: np.ndarray
    eps0_max: float
    eps0_mean: float
    deviation_bar: np.ndarray
    c_grid: np.ndarray
    objective: np.ndarray
    residual_max: float


def descent_margin_constants(
    margins,
    gaps,
    eta,
    prefs_max,
    B,
    L0,
    deviations,
    *,
    c_grid=None,
    n_grid: int = 200,
    c_min: float = 1e-4,
) -> DescentMarginConstants:
    """H.19 ``(c_d, b_i)`` from margins ``m_i(w)`` and gaps ``r_i(w) = ψ_i(w) - ψ_i*`` on a point set (§1.11, O-8).

    ``margins``, ``gaps``: ``(N, T)`` (client ``i``, point ``w_t``). For a candidate ``c_d``,
    ``b_i(c_d) := max(0, max_w [c_d r_i(w) - m_i(w)])``, which makes eq 51 hold on the points by construction, and
    ``ε_{0,i} = (λ_max,i/c_d)(B Δ̄_i + L₀B²η/2) + b_i/c_d`` (eq 64). One common ``c_d`` is chosen on a log grid of
    ``n_grid`` points in ``[c_min, 1/η]`` (or the given ``c_grid``, whose points must lie in ``(0, 1/η]``)
    minimising ``max_i ε_{0,i}`` (first minimiser on ties). ``deviations``: ``Δ̄_i`` ``(N,)`` or a trajectory
    ``(N, T)`` (max over ``T``). For the two-phase radius pass ``eta = max(η_I, η_II)`` (O-23).

    **Exact on the given points** (H.19 holds there with these constants); as constants for a region they are an
    **estimate over a finite sample** (optimistic).
    """
    mg = _arr(margins, "margins", ndim=2)
    r = _gaps(gaps)
    _same_shape(mg, r, "margins", "gaps")
    N = mg.shape[0]
    eta, lam_max, B, L0, dev = _band_inputs(eta, prefs_max, B, L0, deviations, N)
    if c_grid is None:
        if isinstance(n_grid, bool) or not isinstance(n_grid, (int, np.integer)) or n_grid < 1:
            raise ValueError(f"n_grid must be a positive integer; got n_grid={n_grid!r}")
        c_min = _scalar(c_min, "c_min", positive=True)
        if c_min > 1.0 / eta:
            raise ValueError(f"c_min={c_min!r} exceeds 1/eta={1.0 / eta!r}; the grid (0, 1/η] would be empty")
        grid = np.geomspace(c_min, 1.0 / eta, int(n_grid))
    else:
        grid = _arr(c_grid, "c_grid", ndim=1, positive=True)
        if np.any(grid > (1.0 / eta) * (1 + 1e-12)):
            raise ValueError(f"c_grid must lie in (0, 1/eta={1.0 / eta!r}]; max is {float(grid.max())!r}")
    # b[g, i] = max(0, max_t (c_g r_it - m_it))
    b_grid = np.maximum(0.0, (grid[:, None, None] * r[None] - mg[None]).max(axis=2))
    base = np.broadcast_to(lam_max * (B * dev + 0.5 * L0 * B * B * eta), (N,))
    eps = (base[None, :] + b_grid) / grid[:, None]
    obj = eps.max(axis=1)
    g = int(first_min(obj, TIE_RTOL * np.abs(obj).max()))  # ties within the resolution: the smallest c_d
    c_d = float(grid[g])
    b = b_grid[g]
    eps0 = eps[g]
    resid = float(np.max(c_d * r - b[:, None] - mg))
    return DescentMarginConstants(
        c_d=c_d, b=b, eps0=eps0, eps0_max=float(eps0.max()), eps0_mean=float(eps0.mean()),
        deviation_bar=np.broadcast_to(dev, (N,)).astype(np.float64), c_grid=grid, objective=obj,
        residual_max=resid,
    )


@dataclass(frozen=True)
class StrictDescentConstant:
    """Strict H.19 on a sample: ``c_d = min m/r`` over points with ``r > 0`` (finite, possibly ≤ 0);
    ``holds`` iff ``c_d > 0`` and ``m ≥ -margin_tol`` at the points with ``r = 0``."""

    c_d: float
    holds: bool
    n_points: int
    min_margin_at_zero_gap: float | None


def strict_descent_constant(margins, gaps, *, margin_tol: float = 0.0) -> StrictDescentConstant:
    """Strict form of H.19 (``b_i = 0``): ``c_d := min_{w, r_i(w) > 0} m_i(w)/r_i(w)`` (§1.11).

    ``margins``, ``gaps``: arrays of one shape (any clients/points). The value is always finite; ``holds`` is
    False when ``c_d ≤ 0`` or when some point with ``r = 0`` has a negative margin (eq 51 with ``b = 0`` then
    needs ``m ≥ 0``). **Estimate over a finite sample** (optimistic). Raises if no point has ``r > 0``.
    """
    mg = _arr(margins, "margins")
    r = _gaps(gaps)
    _same_shape(mg, r, "margins", "gaps")
    margin_tol = _scalar(margin_tol, "margin_tol", nonneg=True)
    pos = r > 0.0
    if not pos.any():
        raise ValueError("gaps has no entry > 0; the strict descent constant c_d = min m/r is undefined")
    c_d = float(np.min(mg[pos] / r[pos]))
    zero = ~pos
    mz = float(np.min(mg[zero])) if zero.any() else None
    holds = c_d > 0.0 and (mz is None or mz >= -margin_tol)
    return StrictDescentConstant(c_d=c_d, holds=holds, n_points=int(pos.sum()), min_margin_at_zero_gap=mz)


# ------------------------------------------------------------------------------------------------ H.20


@dataclass(frozen=True)
class H20Constants:
    """H.20 constants on a sample.

    mu_psi : ``min ‖d_M‖²/(2r)`` over points with ``r > 0`` (0 if some such point has ``d_M = 0``).
    sigma : ``min m/‖d_M‖²`` over points with ``‖d_M‖² > zero_tol`` (0.0 if there are none; see n_sigma_points).
    c_d : ``2 σ μ_ψ``; holds : ``μ_ψ > 0`` and ``σ > 0``.
    n_gap_points, n_sigma_points : points used for ``μ_ψ`` and ``σ``.
    n_dM_zero : points with ``‖d_M‖² ≤ zero_tol``; n_dM_zero_positive_gap : those with ``r > 0`` ((i) fails there).
    min_margin_at_dM_zero : smallest margin at ``d_M = 0`` points (``None`` if none); (ii) needs it ``≥ 0``.
    """

    mu_psi: float
    sigma: float
    c_d: float
    holds: bool
    n_gap_points: int
    n_sigma_points: int
    n_dM_zero: int
    n_dM_zero_positive_gap: int
    min_margin_at_dM_zero: float | None


def h20_constants(dM_norms_sq, gaps, margins, *, zero_tol: float = 1e-20) -> H20Constants:
    """H.20: ``μ_ψ := min ‖d_M‖²/(2 r)`` (near-active PL, (i)) and ``σ := min m/‖d_M‖²`` (σ-comparability, (ii)).

    ``dM_norms_sq`` (``‖d_M,i(w)‖²``), ``gaps`` (``r_i(w)``), ``margins`` (``m_i(w)``): arrays of one shape.
    ``σ`` is taken over the points with ``d_M ≠ 0`` (``‖d_M‖² > zero_tol``), as §1.11 says. ``μ_ψ`` is taken over
    the points with ``r > 0`` *including* those with ``d_M = 0``: there (i) forces ``μ_ψ ≤ 0`` (example H.18(b)),
    and dropping them would hide the failure; points with ``r = 0`` impose nothing on (i). Strict H.19 then holds
    with ``c_d = 2σμ_ψ`` when ``holds``. **Estimate over a finite sample** (optimistic). Raises if no point has
    ``r > 0``.
    """
    dm = _arr(dM_norms_sq, "dM_norms_sq", nonneg=True)
    r = _gaps(gaps)
    mg = _arr(margins, "margins")
    _same_shape(dm, r, "dM_norms_sq", "gaps")
    _same_shape(dm, mg, "dM_norms_sq", "margins")
    zero_tol = _scalar(zero_tol, "zero_tol", nonneg=True)
    pos = r > 0.0
    if not pos.any():
        raise ValueError("gaps has no entry > 0; μ_ψ = min ‖d_M‖²/(2r) is undefined on this sample")
    nz = dm > zero_tol
    mu_psi = float(np.min(np.where(nz[pos], dm[pos], 0.0) / (2.0 * r[pos])))
    sigma = float(np.min(mg[nz] / dm[nz])) if nz.any() else 0.0
    holds = mu_psi > 0.0 and sigma > 0.0 and bool(nz.any())
    zero = ~nz
    return H20Constants(
        mu_psi=mu_psi,
        sigma=sigma,
        c_d=2.0 * sigma * mu_psi,
        holds=holds,
        n_gap_points=int(pos.sum()),
        n_sigma_points=int(nz.sum()),
        n_dM_zero=int(zero.sum()),
        n_dM_zero_positive_gap=int((zero & pos).sum()),
        min_margin_at_dM_zero=float(np.min(mg[zero])) if zero.any() else None,
    )


# ------------------------------------------------------------------------------------- H.34, H.39–H.41


def quadratic_growth(prefs, Qs) -> np.ndarray:
    """H.34 constant for strongly convex quadratics: ``μ_i = min_j λ_i^{(j)} λ_min(Q_j)``.

    ``prefs``: ``(..., m)``; ``Qs``: ``(m, n_w, n_w)`` symmetric. Then ``ψ_i`` is ``μ_i``-strongly convex and
    ``ψ_i - ψ_i* ≥ (μ_i/2)‖w - w_i*‖²`` globally. **Exact** (derived) when every ``Q_j`` is positive definite; a
    value ``≤ 0`` (some ``Q_j`` not PD) gives no guarantee. Returns shape ``(...)``.
    """
    lam = check_preferences(prefs)
    Q = _symmetric_stack(Qs, "Qs")
    if Q.ndim != 3 or Q.shape[0] != lam.shape[-1]:
        raise ValueError(f"Qs must have shape ({lam.shape[-1]}, n_w, n_w) to match prefs {lam.shape}; got {Q.shape}")
    lmin = np.linalg.eigvalsh(Q)[:, 0]
    return (lam * lmin).min(axis=-1)


def pl_constant_samples(grad_psi_norms_sq, gaps) -> np.float64:
    """``μ_PL := min ‖∇ψ(w)‖² / (2(ψ(w) - ψ*))`` over sampled points with ``ψ - ψ* > 0`` (H.39, eq 86).

    **Estimate over a finite sample** (optimistic for the infimum over ``𝒰``). Must satisfy ``μ_PL ≤ L₀``.
    """
    g2 = _arr(grad_psi_norms_sq, "grad_psi_norms_sq", nonneg=True)
    r = _gaps(gaps)
    _same_shape(g2, r, "grad_psi_norms_sq", "gaps")
    pos = r > 0.0
    if not pos.any():
        raise ValueError("gaps has no entry > 0; μ_PL = min ‖∇ψ‖²/(2(ψ-ψ*)) is undefined on this sample")
    return np.float64(np.min(g2[pos] / (2.0 * r[pos])))


def direction_variance(samples, *, mean=None) -> np.ndarray:
    """Per-sample direction variance ``σ₀² = E‖d̃₁ - E d̃₁‖² = tr Cov(d̃₁)`` (H.40) from ``S`` single-sample directions.

    ``samples``: ``(..., S, n_w)``, i.i.d. one-sample directions at a fixed ``w``. Method: without ``mean`` the
    unbiased estimator ``Σ_s ‖x_s - x̄‖² / (S - 1)`` (``S ≥ 2``); with the known population mean (e.g. ``∇ψ(w)``,
    shape ``(..., n_w)``) the unbiased ``Σ_s ‖x_s - mean‖² / S``. **Estimate over a finite sample** (unbiased,
    not a bound). Returns shape ``(...)``.
    """
    x = _arr(samples, "samples", min_ndim=2)
    S = x.shape[-2]
    if mean is None:
        if S < 2:
            raise ValueError(f"samples needs S >= 2 rows to estimate a variance without a known mean; got S={S}")
        xbar = x.mean(axis=-2, keepdims=True)
        return ((x - xbar) ** 2).sum(axis=(-2, -1)) / (S - 1)
    mu = _arr(mean, "mean", min_ndim=1)
    if mu.shape[-1] != x.shape[-1]:
        raise ValueError(f"mean must have last axis {x.shape[-1]} to match samples {x.shape}; got {mu.shape}")
    return ((x - mu[..., None, :]) ** 2).sum(axis=(-2, -1)) / S


def loss_bound_at_optima(loss_new_opt, client_opt_losses=None) -> np.float64:
    """``L* := max(‖l(w_new*)‖_∞, max_i ‖l(w_i*)‖_∞)`` (eq 80, §1.9 recommendation).

    ``loss_new_opt``: ``(m,)`` losses at the new client's optimum; ``client_opt_losses``: optional ``(N, m)`` losses at
    the cluster clients' optima. **Exact** given the optima.
    """
    ln = check_losses(loss_new_opt, "loss_new_opt")
    val = float(np.max(ln))
    if client_opt_losses is not None:
        lc = check_losses(client_opt_losses, "client_opt_losses")
        if lc.shape[-1] != ln.shape[-1]:
            raise ValueError(
                f"client_opt_losses must have m={ln.shape[-1]} objectives like loss_new_opt; got shape {lc.shape}"
            )
        val = max(val, float(np.max(lc)))
    return np.float64(val)
