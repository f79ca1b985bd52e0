r"""Constants of the theory and how they are computed or estimated on a point set
(docs/spec/constants.md#constants).

Every function states whether its value is

* **exact** — true by construction (a closed form for the problem family, or a quantity that is *defined* on
  the given points, such as ``c = m·min ĺ`` over the visited points), or
* **an estimate over a finite sample** — a ``min`` (``max``) over sampled points of a ratio whose infimum
  (supremum) over a region is the constant. Such an estimate is **optimistic**: the true infimum can only be
  smaller (the true supremum only larger) than the sampled value (O-8).

Symbols (docs/spec/notation.md#notation) next to the code names:

================================  =================================================================
``smoothness_quadratic``          ``L₀ = max_j ‖Q_j‖₂`` (quadratic family, exact)
``smoothness_hessian_max``        ``L₀ ≈ max ‖∇²l‖₂`` over sampled Hessians (estimate)
``gradient_bound``                ``B = max ‖g_i^{(j)}(w)‖`` over the given points
``gradient_bound_quadratic_ball`` ``B = max_j ‖Q_j‖ (R + ‖w̄ - c_j‖)`` on a ball (exact upper bound)
``floor_constant``                ``c = m · min ĺ`` (H.9)
``normalizer_min``                ``Z_min = min_i Z_i``
``adjustment_lipschitz``          ``L_adj = (1 + log(m/c))(1 + √m ‖l‖_∞ / Z_min)`` (eq 14, O-5)
``lp_basis``, ``lp_sensitivity``  ``M, b(A), M_B, b_B, S_B`` (docs/spec/lp.md#lp LP matrix form) and ``κ_LP = ‖M_B⁻¹‖‖C‖``
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

The LP matrix form and the constants read off it (``lp_basis``, ``lp_sensitivity``, ``client_bases``,
``h11_constant``) are :mod:`sim.lp_basis`'s, importable from here too. Only :mod:`sim.preference` is imported; LP
weights are taken as arguments. Bad input raises :class:`ValueError` naming the argument and the value.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim import lp_basis as _lp_basis
from sim._checks import as_array as _arr
from sim._checks import as_scalar as _scalar
from sim.lp_basis import *  # noqa: F403 - every name of the LP matrix form is importable from here too
from sim.preference import (
    check_losses,
    check_preferences,
    check_shapes,
    normalized_losses,
    normalizer,
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
    *_lp_basis.__all__,
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

    **Exact on the given points** (iterates and segment points, docs/spec/constants.md#constants); as a bound
    on a region it is an **estimate over a finite sample** (optimistic).
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

    **Exact** as a proved upper bound (derived from I6; docs/spec/statements.md#t-h10) for any two preferences
    on the segment between points covered by ``c`` and ``Z_min``.
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
    """H.19 constants chosen on a log grid (docs/spec/constants.md#constants).

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
    """H.19 ``(c_d, b_i)`` from margins ``m_i(w)`` and gaps ``r_i(w) = ψ_i(w) - ψ_i*`` on a point set
    (docs/spec/constants.md#constants, docs/spec/open-points.md#o-8).

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
    """Strict form of H.19 (``b_i = 0``): ``c_d := min_{w, r_i(w) > 0} m_i(w)/r_i(w)``
    (docs/spec/constants.md#constants).

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
    ``σ`` is taken over the points with ``d_M ≠ 0`` (``‖d_M‖² > zero_tol``), as
    docs/spec/constants.md#constants says. ``μ_ψ`` is taken over the points with ``r > 0`` *including* those
    with ``d_M = 0``: there (i) forces ``μ_ψ ≤ 0`` (example H.18(b)), and dropping them would hide the
    failure; points with ``r = 0`` impose nothing on (i). Strict H.19 then holds with ``c_d = 2σμ_ψ`` when
    ``holds``. **Estimate over a finite sample** (optimistic). Raises if no point has ``r > 0``.
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
    """``L* := max(‖l(w_new*)‖_∞, max_i ‖l(w_i*)‖_∞)`` (eq 80, docs/spec/iteration.md#new-client
    recommendation).

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
