r"""The EPO direction LP (docs/spec/lp.md#lp), batched exact solver and HiGHS reference.

Inputs per instance: losses ``l`` (m), preference ``λ`` (m, open simplex) and Gram matrix ``C = GᵀG`` (m×m).
Output: LP weights ``μ`` (m); the caller forms the direction ``d = G μ`` (numpy, or torch on a GPU).

With ``A`` the adjustment and ``β`` the preference uniformity (:mod:`sim.preference`), and the index sets

* ``J  = {j : (CA)_j > 0}``, ``J̄ = [m] ∖ J``,
* ``J* = {j : λ_j l_j >= ψ - tol_Jstar·ψ}`` (``tol_Jstar = 0``: the maximisers; ties as in (R2) below),

the **balancing** LP (mode ``"balance"``, chosen iff ``β > eps_mode``; EPO ``prob_bal``, paper eq 4/5) is

.. code-block:: text

    maximise  μᵀ C A                      (the correction gain γ)
    s.t.      μ >= 0, 1ᵀμ = 1
    if J ≠ ∅: (Cμ)_j >= (CA)_j  for j ∈ J̄ ∖ J*      (4b)
              (Cμ)_j >= 0       for j ∈ J*          (4c)   (also for j ∈ J ∩ J*: EPO sets rhs[J*] = 0 last)
    if J = ∅: (Cμ)_j >= 0       for all j

and the **uniform-descent** LP (mode ``"descent"``, EPO ``dom``) is

.. code-block:: text

    maximise  1ᵀ C μ
    s.t.      μ >= 0, 1ᵀμ = 1, Cμ >= 0                             ("relaxed",    EPO prob_rel)
              and μᵀCA >= min(max_j (CA)_j, 0)                      ("restricted", EPO prob_dom, default)

**Data at the resolution.** The LP data are built from floating-point ``l, λ, C``; the builder takes every
decision so that data differing only by roundoff give the same LP (:mod:`sim.roundoff`, resolution
``TIE_RTOL = 1e-12``):

* (R1) *on the ray*: where ``log(max_j λ_j l_j / min_j λ_j l_j) <= TIE_RTOL`` the weighted losses are equal to
  within the resolution and ``β = 0``, ``A = 0`` exactly (computed, ``A`` would be roundoff of order
  ``1e-16``, and every row built from it — the restriction row ``μᵀCA >= min(max_j (CA)_j, 0)`` is invariant
  to the scale of ``A`` — would be a random O(1) constraint);
* (R2) *ties in J\**: ``λ_j l_j >= ψ - tol_Jstar·ψ`` with ratios within ``TIE_RTOL`` counted as ties (so
  ``tol_Jstar = 0`` means the maximisers up to the resolution; on the ray ``J* = [m]``);
* (R3) *zero entries of CA*: ``(CA)_j = 0`` where ``|(CA)_j| <= Σ_k |C_jk| (e_k + 4mε|a_k|)``, with ``e_k`` the
  roundoff of computing ``a_k`` from the float data (:attr:`sim.preference.PreferenceParts.adjustment_roundoff`):
  an error bound of the computed entry at or above its magnitude, so the float data do not decide its sign (hence
  ``J``). Where they do, the entry is kept, however small; if it is within ``3·res_j``, ``res_j = Σ_k |C_jk| (r_k
  + 4mε|a_k|)`` with ``r_k`` the first-order change of ``a_k`` under relative perturbations of the weighted losses
  of size ``TIE_RTOL`` plus that roundoff (:attr:`sim.preference.PreferenceParts.adjustment_resolution`), the
  instance is flagged ``ambiguous`` (data that differ by the resolution could give the other sign);
* (R4) the restriction row of the descent LP is left out where ``CA = 0`` (it reads ``0 >= 0``);
* (R5) *ties in the simplex*: the start vertex ``k = argmax_j c_j``, the leaving row of Dantzig's rule and the
  entering column of the ratio test break ties within the resolution by the smallest index, so degenerate LPs
  with several optimal vertices end at the same one for data that differ by roundoff.

Every instance where a rule changed an entry — (R1) a spread in ``(0, TIE_RTOL]`` set to the ray, (R2) an objective
in ``J*`` only by the widening to ``TIE_RTOL``, (R3) a nonzero computed ``(CA)_j`` set to 0 — is reported in
``ambiguous``: the LP solved there is not the LP of the rounded weighted losses ``fl(λ_j l_j)``. (A log spread of
exactly 0, the rounded products equal, is the on-ray LP and is not flagged, although the exact products of the float
inputs may differ in their last bit: see :attr:`DirectionResult.ambiguous`.) So are the decisions that no rule can
make robust — ``β`` within its own resolution of ``eps_mode``, a datum just outside a tie band or within ``3·res_j``
of the sign change of ``(CA)_j`` — and, after the solve, every LP solution whose weights the float data do not
certify (the **post-solve check**: a row ``D_j μ >= e_j`` of the LP solved violated by more than ``TIE_RTOL·(max_k
|D_jk|·Σ_k μ_k + |e_j|)``, a row-wise backward error beyond the resolution; it happens where the optimal basis is
ill-conditioned, with gradient norms ``1e12`` apart: ``cond(C)`` up to ``1e24``) and every verdict of infeasibility
that roundoff decides (the LP, re-solved with every right-hand side loosened by that tolerance, is feasible). Whether
the optimum is unique (so that the weights, not only the objective, are stable) is reported in ``unique``.

The restricted descent LP can be infeasible (docs/spec/lp.md#lp). ``on_infeasible`` says what happens then:
``"relaxed"`` re-solves the relaxed LP (status ``"relaxed"``), ``"fallback_preference"`` returns ``μ = λ``
(the EPO training scripts' fallback; status ``"fallback"``), ``"raise"`` raises :class:`LPInfeasibleError`.
Nothing falls back silently: every instance carries its status.

Solver. :func:`lp_direction` solves all instances at once with a vectorised **dual simplex** in tableau form.
Write the LP as ``max cᵀμ`` over the simplex with rows ``Dμ >= e`` and slacks ``s = Dμ - e >= 0``. The basis
``{μ_k} ∪ {all slacks}`` with ``k = argmax_j c_j`` is dual feasible (the reduced costs are ``c_j - c_k <= 0``), so
no phase 1 is needed: the dual simplex restores primal feasibility, pivoting on the most negative basic
variable (Dantzig) and switching to Bland's rule after a few iterations, which rules out cycling. Rows are
scaled to unit max-norm first. Infeasibility is declared only with a proof: a leaving row without a pivot entry
below ``-1e-11`` proves it where its basic value stays below ``-1e-12`` however the nonbasic variables move within
their bounds (``μ_j <= 1``, slack ``s_i <= max_j D_ij - e_i``), entries below the pivot tolerance included. A row
without a pivot and without that proof (data of mixed magnitude: its violation, at most ``1e-12 + 1e-11·(m + 2k)``
in row-scaled units for ``k`` rows, could only be repaired by pivots below the tolerance) is left as it is and the
leaving row is chosen among the other infeasible rows; where none is left, the basis is accepted and its violation
is reported by the certificate (``feasibility_residual``, ``kkt_residual``). Each result is certified on the data: the duals are read off the final
reduced costs and the primal infeasibility, dual infeasibility and duality gap are recomputed from ``c, D, e``;
a basis whose certificate exceeds 1e-13 has its weights re-solved from the data (``B x_B = b``, Gaussian elimination
with partial pivoting; where ``B`` is exactly singular in the data the tableau's weights are kept and their
certificate is reported).
:func:`lp_direction_reference` solves the same LPs one by one with ``scipy.optimize.linprog(method="highs")``.

Backends. The code above is the **numpy reference**. :mod:`sim._lp_compiled` is its **compiled twin** (numba,
``cache=True``): the same checks, builder, rules (R1)-(R5), simplex, certificate, post-solve check and policy, one
instance at a time in one compiled call, performing the same rounded operations in the same order (sums over the
objective axis in numpy's pairwise order; the re-solve by the Gaussian elimination of :func:`_lu_solve`; ``log``,
``exp``, ``expm1`` and ``log1p`` from the C math library in both, :func:`sim.roundoff.libm`, not numpy's SIMD loops),
so that both return bit-identical results: the same status, flags and weights on every instance.
``lp_direction(..., backend="auto")`` runs the twin where numba can be imported (:func:`backend_status`,
:func:`resolve_backend`); every result names its backend; nothing switches backends silently.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import warnings
from dataclasses import dataclass

import numpy as np

from sim.preference import (
    _LN2,
    _MEAN_CENTRE_MAX_SPREAD,
    GRAM_RTOL,
    SIMPLEX_ATOL,
    bottleneck_from_log_ratios,
    check_gram,
    check_losses,
    check_preferences,
    check_shapes,
    jstar_log_tolerance,
    preference_parts,
)
from sim.roundoff import EPS, TIE_RTOL, first_max, first_min

__all__ = [
    "BACKENDS",
    "BackendUnavailableError",
    "DirectionResult",
    "LPDataOverflowError",
    "LPInfeasibleError",
    "STATUSES",
    "backend_status",
    "lp_direction",
    "lp_direction_reference",
    "resolve_backend",
    "HIGHS_OPTIONS",
]

#: Every status a result can carry.
STATUSES = ("optimal", "relaxed", "fallback", "infeasible", "iteration_limit", "solver_error")
_DESCENT = ("restricted", "relaxed")
_ON_INFEASIBLE = ("relaxed", "fallback_preference", "raise")

# Tolerances of the dual simplex, in the units of the row-scaled problem (rows and objective of max-norm 1).
_PRIMAL_TOL = 1e-12  # a basic variable below -tol is primal infeasible
_PIVOT_TOL = 1e-11  # |pivot| must exceed this
_RATIO_TIE = 1e-13  # ratio-test ties are broken by the smallest column index


class LPInfeasibleError(RuntimeError):
    """Raised with ``on_infeasible="raise"`` when an LP has no feasible point."""


class LPDataOverflowError(ValueError, OverflowError):
    """The LP data of an instance with finite inputs are not finite: ``C·A`` or the column sums of ``C`` overflow
    float64 (a Gram matrix near 1e306 with log weights hundreds apart). The direction does not change when the Gram
    matrix is multiplied by a positive constant, so a rescaled one solves it."""


def _check_lp_data(c, CA, l, lam, C, batch) -> None:
    """Raise :class:`LPDataOverflowError` naming the first instance whose objective ``c`` or ``CA`` is not finite
    (both backends: the same instance, the same message)."""
    bad = ~(np.isfinite(c).all(axis=-1) & np.isfinite(CA).all(axis=-1))
    if bad.any():
        raise _overflow_error(int(np.flatnonzero(bad)[0]), l, lam, C, batch)


def _overflow_error(t: int, l, lam, C, batch) -> LPDataOverflowError:
    A = preference_parts(l[t], lam[t], validate=False, libm=True).adjustment
    where = f" at index {tuple(int(i) for i in np.unravel_index(t, batch))}" if batch else ""
    return LPDataOverflowError(
        f"the LP data overflow float64{where}: gram @ adjustment or the column sums of gram are not finite "
        f"(max |gram| {float(np.abs(C[t]).max()):.3g}, max |adjustment| {float(np.abs(A).max()):.3g}); the direction "
        "does not change when gram is multiplied by a positive constant: pass gram / max|gram|")


@dataclass(frozen=True)
class DirectionResult:
    """Result of the EPO direction LP, batched over the leading axes of the input (none for one instance).

    Attributes
    ----------
    weights : (..., m) LP multipliers ``μ`` (EPO ``alpha``); the direction is ``d = G μ``. NaN only where
        ``status`` is ``"infeasible"``, ``"iteration_limit"`` or ``"solver_error"``.
    mode : (...) ``"balance"`` or ``"descent"``.
    status : (...) one of :data:`STATUSES`.
    gain : (...) ``γ* = μᵀ C A = dᵀ d_bal``, computed explicitly in both modes.
    beta : (...) preference uniformity ``β``.
    adjustment : (..., m) adjustment ``A``.
    J : (..., m) bool mask of ``J = {j : (CA)_j > 0}``.
    J_star : (..., m) bool mask of the bottleneck set ``J*``.
    objective : (...) LP objective at ``weights`` (``μᵀCA`` in balance mode, ``1ᵀCμ`` in descent mode).
    feasibility_residual : (...) max violation of ``μ >= 0``, ``1ᵀμ = 1`` and the constraint rows, each row
        divided by ``max(1, max_k |C_jk|, |rhs_j|)``.
    kkt_residual : (...) optimality certificate of the returned basis on the row-scaled problem: the max of
        the dual infeasibility, the duality gap and the primal infeasibility, recomputed from the data (0 for
        the HiGHS reference, which reports no basis; NaN for the EPO fallback, which is not an LP solution).
    iterations : (...) simplex pivots (the reference reports HiGHS's iteration count).
    unique : (...) bool: the optimum is certified unique — every nonbasic reduced cost of the final basis is below
        ``-1e-9`` (row-scaled units), so the optimal vertex, hence ``weights``, is stable under small perturbations
        of the data. False where several (or nearly several) vertices are optimal: the objective is then stable, the
        weights need not be; False for the HiGHS reference (no basis to certify) and for unsolved instances.
        Uniqueness is not conditioning: at a unique optimum whose basis is ill-conditioned (nearly dependent
        gradients) the weights move by up to ``‖B⁻¹‖`` times the change of the data.
    ambiguous : (...) bool: float64 does not decide this instance. Set where a roundoff rule of the LP data builder
        changed an entry (so the LP solved is not the LP of the rounded weighted losses ``fl(λ_j l_j)``: a nonzero
        log spread up to ``TIE_RTOL`` put on the ray, an objective in ``J*`` only by the tie widening, an entry of
        ``CA`` whose sign the float data do not decide set to 0), where a decision lies within the resolution band of
        its threshold (module docstring, "Data at the resolution"): ``β`` within its own resolution of ``eps_mode``,
        a weighted loss just outside the ``J*`` tie band, an entry of ``CA`` within 3 resolutions of 0, a spread just
        above the on-ray resolution; and where the post-solve check does not certify an LP solution (status
        ``"optimal"`` or ``"relaxed"``): its weights violate a row of the LP solved by more than ``TIE_RTOL·(max_k
        |D_jk|·Σ_k μ_k + |e_j|)`` (row ``D_j μ >= e_j``; for ``Cμ >= 0``: ``TIE_RTOL·max_k |C_jk|``), so no data
        within the resolution of the float data admit them (ill-conditioned bases: gradient norms ``1e12`` apart);
        and where a verdict of infeasibility is not decided: the LP the simplex proved infeasible (the restricted LP
        of a ``"relaxed"`` or ``"fallback"`` result, the LP of an ``"infeasible"`` one) is feasible once every row is
        loosened by that tolerance, so a point exists that the post-solve check would certify.
        Such an instance's mode, index sets or weights can change under a relative perturbation of the data of order
        ``TIE_RTOL``; elsewhere they cannot, and every unflagged LP solution satisfies its rows within that
        tolerance. An instance of log spread exactly 0 (the rounded weighted losses equal) is not flagged: its LP is
        the on-ray LP (``β = 0``, ``A = 0``, ``J* = [m]``, no restriction row) by design, although the exact
        products ``λ_j l_j`` of the float inputs may differ in their last bit, and the exact LP of those (an ``A``
        of order ``1e-16`` with a scale-invariant restriction row) can differ from it: the flag marks data that the
        rules moved beyond the one rounding of the products, not that rounding.
    backend : the solver that produced the result: ``"numpy"`` (the reference), ``"compiled"`` (the numba twin)
        or ``"highs"`` (:func:`lp_direction_reference`); see :func:`backend_status`.
    """

    weights: np.ndarray
    mode: np.ndarray
    status: np.ndarray
    gain: np.ndarray
    beta: np.ndarray
    adjustment: np.ndarray
    J: np.ndarray
    J_star: np.ndarray
    objective: np.ndarray
    feasibility_residual: np.ndarray
    kkt_residual: np.ndarray
    iterations: np.ndarray
    unique: np.ndarray
    ambiguous: np.ndarray
    backend: str = "numpy"

    def status_counts(self) -> dict[str, int]:
        """Number of instances per status (every status of :data:`STATUSES`, zeros included)."""
        st = np.atleast_1d(self.status)
        return {s: int(np.count_nonzero(st == s)) for s in STATUSES}

    def direction(self, grads) -> np.ndarray:
        """``d = G μ`` for gradients ``G`` of shape ``(..., n_w, m)`` (columns are the objective gradients)."""
        G = np.asarray(grads, dtype=np.float64)
        return np.einsum("...nm,...m->...n", G, self.weights)


# --------------------------------------------------------------------------------------------------------
# Building the LP
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _LP:
    """``max cᵀμ`` s.t. ``μ >= 0, 1ᵀμ = 1, D μ >= e`` on the rows where ``active``; shapes (N,m), (N,k,m), (N,k).

    Inactive rows hold ``D = 0, e = -1`` (always satisfied, never binding).
    """

    c: np.ndarray
    D: np.ndarray
    e: np.ndarray
    active: np.ndarray


def _real_option(value, name: str) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a real number; got {value!r} ({type(value).__name__})")
    v = float(value)
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"{name} must be a finite number >= 0; got {value!r}")
    return v


def _validate_options(eps_mode, descent, on_infeasible, tol_Jstar, max_iter=None) -> None:
    _real_option(eps_mode, "eps_mode")
    if descent not in _DESCENT:
        raise ValueError(f"descent must be one of {_DESCENT}; got {descent!r}")
    if on_infeasible not in _ON_INFEASIBLE:
        raise ValueError(f"on_infeasible must be one of {_ON_INFEASIBLE}; got {on_infeasible!r}")
    _real_option(tol_Jstar, "tol_Jstar")
    if max_iter is not None and (
        isinstance(max_iter, (bool, np.bool_)) or not isinstance(max_iter, (int, np.integer)) or max_iter < 1
    ):
        raise ValueError(f"max_iter must be an integer >= 1 or None; got {max_iter!r}")


def _prepare(losses, prefs, gram, validate: bool):
    if validate:
        l = check_losses(losses)
        lam = check_preferences(prefs)
        C = check_gram(gram)
        check_shapes(l, lam, C)
    else:
        l = np.asarray(losses, dtype=np.float64)
        lam = np.asarray(prefs, dtype=np.float64)
        C = np.asarray(gram, dtype=np.float64)
    m = l.shape[-1]
    batch = np.broadcast_shapes(l.shape[:-1], lam.shape[:-1], C.shape[:-2])
    l = np.broadcast_to(l, batch + (m,)).reshape(-1, m)
    lam = np.broadcast_to(lam, batch + (m,)).reshape(-1, m)
    C = np.broadcast_to(C, batch + (m, m)).reshape(-1, m, m)
    return l, lam, C, batch


def _build(l, lam, C, eps_mode, descent, tol_Jstar):
    """Index sets, mode and the LP data of every instance (rows 0..m-1: ``Cμ``; row m: ``μᵀCA``).

    Inactive rows are stored as ``0·μ >= -1`` so that every instance has the same ``m + 1`` rows. The roundoff
    rules of the module docstring ("Data at the resolution") are applied here, and nowhere else.
    """
    N, m = l.shape
    parts = preference_parts(l, lam, validate=False, libm=True)
    beta, A, x, spread = parts.beta, parts.adjustment, parts.x, parts.spread
    # (R1) on the ray within the resolution: β = 0 and A = 0 exactly.
    on_ray = spread <= TIE_RTOL
    if on_ray.any():
        beta = np.where(on_ray, 0.0, beta)
        A = np.where(on_ray[:, None], 0.0, A)
    # (R2) J*: weighted losses within the resolution of the maximum are ties.
    J_star = bottleneck_from_log_ratios(x, tol_Jstar)
    # (R3) (CA)_j whose computed value does not decide its sign (|CA_j| within the error bound of computing it from
    # the float data: the roundoff of A and of the product) is exactly 0.
    res_beta = parts.beta_resolution
    res_A = parts.adjustment_resolution
    err_A = parts.adjustment_roundoff
    CA = (C * A[:, None, :]).sum(axis=2)
    absA = 4.0 * m * EPS * np.abs(A)
    res_CA = (np.abs(C) * (res_A + absA)[:, None, :]).sum(axis=2)
    err_CA = (np.abs(C) * (err_A + absA)[:, None, :]).sum(axis=2)
    undecided = np.abs(CA) <= err_CA
    zeroed = undecided & (CA != 0.0)
    CA = np.where(undecided, 0.0, CA)
    J = CA > 0.0
    balance = beta > eps_mode
    # Reported (DirectionResult.ambiguous): every entry a rule changed — (R1) β and A of a spread in (0, TIE_RTOL],
    # (R2) an objective in J* only by the widening to TIE_RTOL, (R3) an entry of CA set to 0 — and every decision
    # within the resolution band of its threshold (a perturbation of the losses at TIE_RTOL could change it).
    xgap = x.max(axis=1, keepdims=True) - x
    tlog = jstar_log_tolerance(tol_Jstar)
    ambiguous = (
        ((spread > 0.0) & (spread <= 3.0 * TIE_RTOL))
        | ((xgap > jstar_log_tolerance(tol_Jstar, widen=False)) & (xgap <= tlog + 2.0 * TIE_RTOL)).any(axis=1)
        | zeroed.any(axis=1)
        | ((CA != 0.0) & (np.abs(CA) <= 3.0 * res_CA)).any(axis=1)
        | ((beta > 0.0) & (np.abs(beta - eps_mode) <= res_beta))
    )

    active = np.ones((N, m + 1), dtype=bool)
    e = np.zeros((N, m + 1))
    # Balancing mode: with J ≠ ∅, rows J̄ ∪ J* (rhs (CA)_j on J̄ ∖ J*, 0 on J*); with J = ∅, all rows, rhs 0.
    anyJ = J.any(axis=1, keepdims=True)
    bal = balance[:, None] & anyJ
    active[:, :m] = ~bal | ~J | J_star
    e[:, :m] = np.where(bal & ~J_star, CA, 0.0)
    # Uniform-descent mode: all rows Cμ >= 0; the restricted LP adds μᵀCA >= min(max CA, 0), a row that is
    # vacuous (0 >= 0, so left out) where CA = 0.
    active[:, m] = (~balance & (CA != 0.0).any(axis=1)) if descent == "restricted" else False
    e[:, m] = np.minimum(CA.max(axis=1), 0.0)
    D = np.concatenate([C, CA[:, None, :]], axis=1)
    D[~active] = 0.0
    e[~active] = -1.0
    c = np.where(balance[:, None], CA, C.sum(axis=1))
    return _LP(c=c, D=D, e=e, active=active), beta, A, CA, J, J_star, balance, ambiguous


# --------------------------------------------------------------------------------------------------------
# Batched dual simplex
# --------------------------------------------------------------------------------------------------------

_OPTIMAL, _INFEASIBLE, _ITERLIMIT = 0, 1, 2  # solver codes; 3 = solver error
_CONTINUE = -1  # inside the simplex loop: the instance pivots again
_CODE_NAMES = np.array(["optimal", "infeasible", "iteration_limit", "solver_error"], dtype="<U15")
_MODE_NAMES = np.array(["descent", "balance"])


def _scale_lp(lp: _LP):
    """Scale each row and the objective to max-norm 1 (the LP's solutions do not change)."""
    rs = np.maximum(np.abs(lp.D).max(axis=2), np.abs(lp.e))
    rs[rs == 0] = 1.0
    cs = np.abs(lp.c).max(axis=1, keepdims=True)
    cs[cs == 0] = 1.0
    return lp.c / cs, lp.D / rs[:, :, None], lp.e / rs


def _dual_simplex(c, D, e, max_iter: int, bland_after: int):
    """Solve ``max cᵀμ, μ >= 0, 1ᵀμ = 1, Dμ >= e`` for every instance.

    Returns ``(basis, code, iterations, reduced_costs, basic_values)``.

    Variables are ``x = (μ_1..μ_m, s_1..s_k)``; rows are the equality and the ``k`` constraint rows. Rows
    ``0..k`` of the tableau hold ``B⁻¹[A | b]``; its last row holds the reduced costs ``c_j - c_Bᵀ B⁻¹ a_j``
    (all ``<= 0``: dual feasibility, kept by the ratio test), so one rank-one update pivots both.
    """
    N, k, m = D.shape
    n, p = m + k, k + 1
    kstar = first_max(c, TIE_RTOL)  # c has max-norm 1: objective entries within TIE_RTOL are ties
    ar = np.arange(N)
    Dk = D[ar, :, kstar]  # (N, k): column k* of D

    T = np.zeros((N, p + 1, n + 1))
    T[:, 0, :m] = 1.0
    T[:, 0, n] = 1.0
    T[:, 1:p, :m] = Dk[:, :, None] - D
    T[:, 1:p, m:n] = np.eye(k)
    T[:, 1:p, n] = Dk - e
    T[:, p, :m] = c - c[ar, kstar][:, None]
    basis = np.empty((N, p), dtype=np.intp)
    basis[:, 0] = kstar
    basis[:, 1:] = m + np.arange(k)

    code = np.full(N, _ITERLIMIT, dtype=np.int8)
    iters = np.zeros(N, dtype=np.intp)
    zfin = np.zeros((N, n))
    xfin = np.zeros((N, p))
    # Upper bounds of the variables over the feasible set: μ_j <= 1 and s_i = D_i μ - e_i <= max_j D_ij - e_i.
    U = np.concatenate([np.ones((N, m)), np.maximum(D.max(axis=2) - e, 0.0)], axis=1)
    idx = np.arange(N)  # instances still running, and their tableaux and bases
    Tw, bw = T, basis.copy()
    for it in range(max_iter):
        bland = it >= bland_after
        vals = Tw[:, :p, n]
        wa = np.arange(len(idx))
        done = vals.min(axis=1) >= -_PRIMAL_TOL
        if bland:  # Bland: the infeasible basic variable with the smallest variable index leaves
            r = np.argmin(np.where(vals < -_PRIMAL_TOL, bw, n + 1), axis=1)
        else:  # Dantzig: the most negative basic variable leaves (ties within TIE_RTOL: the first row)
            r = first_min(vals, TIE_RTOL)
        row = Tw[wa, r, :n]
        cand = row < -_PIVOT_TOL
        fcode = np.where(done, _OPTIMAL, _CONTINUE)
        stuck = ~done & ~cand.any(axis=1)
        if stuck.any():  # the leaving row has no pivot: a proof of infeasibility, or a violation below resolution
            s = np.flatnonzero(stuck)
            r[s], fcode[s] = _reselect(Tw[s], bw[s], U[idx[s]], p, n, bland)
            row[s] = Tw[s, r[s], :n]
            cand[s] = row[s] < -_PIVOT_TOL
        finished = fcode != _CONTINUE
        if finished.any():
            fi = idx[finished]
            code[fi] = fcode[finished]
            basis[fi] = bw[finished]
            zfin[fi] = Tw[finished, p, :n]
            xfin[fi] = Tw[finished, :p, n]
            keep = ~finished
            if not keep.any():
                break
            idx, Tw, bw = idx[keep], Tw[keep], bw[keep]
            r, row, cand = r[keep], row[keep], cand[keep]
            wa = np.arange(len(idx))
        ratio = np.where(cand, np.minimum(Tw[:, p, :n], 0.0) / np.where(cand, row, -1.0), np.inf)
        # ratio ties within _RATIO_TIE: the smallest column index enters (Dantzig and Bland alike)
        q = np.argmax(cand & (ratio <= ratio.min(axis=1, keepdims=True) + _RATIO_TIE), axis=1)
        # Pivot on (r, q) with one rank-one update: T -= f ⊗ (T_r / T_rq), f = T[:, q] - e_r.
        prow = Tw[wa, r, :] / row[wa, q][:, None]
        f = Tw[wa, :, q]
        f[wa, r] -= 1.0
        Tw -= f[:, :, None] * prow[:, None, :]
        bw[wa, r] = q
        iters[idx] += 1
    else:
        basis[idx] = bw
        zfin[idx] = Tw[:, p, :n]
        xfin[idx] = Tw[:, :p, n]
    return basis, code, iters, zfin, xfin


def _reselect(T, basis, U, p, n, bland):
    """Leaving row of the running instances whose chosen row has no pivot entry below ``-_PIVOT_TOL``.

    A basic variable ``x_i = b_i - Σ_j T_ij x_j`` (nonbasic ``0 <= x_j <= U_j``) is at most
    ``b_i + Σ_j max(-T_ij, 0) U_j``: where that bound is below ``-_PRIMAL_TOL`` the row proves the LP infeasible
    (a Farkas certificate that counts the entries below the pivot tolerance). A row without a pivot whose bound is not
    below ``-_PRIMAL_TOL`` proves nothing: its violation is within what pivots below the tolerance could repair, so it
    is left as it is (feasible to within the resolution; the certificate reports it). The leaving row is chosen
    among the other infeasible rows by the same rule (Dantzig or Bland); returns ``(rows, codes)``, code
    ``_INFEASIBLE`` where the chosen row proves infeasibility, ``_OPTIMAL`` where no infeasible row can pivot or
    prove anything, else ``_CONTINUE``.
    """
    vals = T[:, :p, n]
    pivots = (T[:, :p, :n] < -_PIVOT_TOL).any(axis=2)
    reach = vals + (np.maximum(-T[:, :p, :n], 0.0) * U[:, None, :]).sum(axis=2)
    infeasible = vals < -_PRIMAL_TOL
    proof = infeasible & ~pivots & (reach < -_PRIMAL_TOL)
    eligible = infeasible & (pivots | proof)
    if bland:
        r = np.argmin(np.where(eligible, basis, n + 1), axis=1)
    else:
        r = first_min(np.where(eligible, vals, np.inf), TIE_RTOL)
    ar = np.arange(len(r))
    code = np.where(~eligible.any(axis=1), _OPTIMAL, np.where(proof[ar, r], _INFEASIBLE, _CONTINUE))
    return r, code


#: A nonbasic reduced cost above ``-_UNIQUE_TOL`` (row-scaled units) means the optimal vertex may not be unique.
_UNIQUE_TOL = 1e-9

#: Certificate threshold (row-scaled units): a basis whose tableau solution has primal infeasibility, dual
#: infeasibility and duality gap all below it is accepted as is; any other is re-solved from the data.
_CERT_TOL = 1e-13


def _certificate(c, D, e, mu, y):
    """KKT residual ``max(max_j (c - Aᵀy)_j, max_i y_i, |cᵀμ - bᵀy|, 0)`` of ``(μ, y)`` on the scaled data."""
    N = len(c)
    zmu = c - y[:, :1] - (y[:, 1:, None] * D).sum(axis=1)
    gap = np.abs((c * mu).sum(axis=1) - y[:, 0] - (e * y[:, 1:]).sum(axis=1))
    return np.maximum(np.maximum(zmu.max(axis=1), y[:, 1:].max(axis=1)), np.maximum(gap, np.zeros(N)))


def _resolve_basis(D, e, basis):
    """``x_B`` solving ``B x_B = b`` from the data (:func:`_basis_system`), and a mask of the instances whose ``B``
    is exactly singular (no solution; :func:`_lu_solve`)."""
    return _lu_solve(*_basis_system(D, e, basis))


def _basis_system(D, e, basis):
    """The basis matrix ``B`` (columns ``[1; D_j]`` for μ_j, ``[0; -e_i]`` for s_i) and right-hand side
    ``b = [1; e]`` of every instance."""
    N, k, m = D.shape
    is_mu = basis < m
    B = np.empty((N, k + 1, k + 1))
    B[:, 0, :] = is_mu
    B[:, 1:, :] = np.where(
        is_mu[:, None, :],
        np.take_along_axis(D, np.minimum(basis, m - 1)[:, None, :], axis=2),
        np.where(np.arange(k)[None, :, None] == (basis - m)[:, None, :], -1.0, 0.0),
    )
    return B, np.concatenate([np.ones((N, 1)), e], axis=1)


def _lu_solve(B, b):
    """Solve ``B x = b`` for every instance (``B`` (N, p, p), ``b`` (N, p)) by Gaussian elimination with partial
    pivoting (ties: the first row), written out so that the compiled twin performs the same rounded operations in
    the same order. Returns ``(x, singular)``; ``singular`` marks an exactly zero pivot (``x`` is then meaningless).
    """
    A, x = B.copy(), b.copy()
    N, p = x.shape
    ar = np.arange(N)
    singular = np.zeros(N, dtype=bool)
    for j in range(p):
        piv = j + np.argmax(np.abs(A[:, j:, j]), axis=1)
        A[ar, j], A[ar, piv] = A[ar, piv], A[ar, j].copy()
        x[ar, j], x[ar, piv] = x[ar, piv], x[ar, j].copy()
        d = A[:, j, j]
        singular |= d == 0.0
        f = A[:, j + 1 :, j] / np.where(d == 0.0, 1.0, d)[:, None]
        A[:, j + 1 :, j + 1 :] -= f[:, :, None] * A[:, None, j, j + 1 :]
        x[:, j + 1 :] -= f * x[:, j, None]
    for j in range(p - 1, -1, -1):
        s = x[:, j].copy()
        for t in range(j + 1, p):
            s -= A[:, j, t] * x[:, t]
        x[:, j] = s / np.where(singular, 1.0, A[:, j, j])
    return x, singular


def _weights(xB, basis, m):
    x = np.zeros((len(xB), basis.max(initial=m) + 1))
    np.put_along_axis(x, basis, xB, axis=1)
    mu = np.maximum(x[:, :m], 0.0)  # round-off can leave -1e-17 entries: clip and renormalise
    return mu / mu.sum(axis=1, keepdims=True)


def _recover(c, D, e, basis, reduced, xB):
    """Weights of the final bases with their KKT residual, certified on the (scaled) data.

    The duals are read off the simplex's reduced costs (``y_{1+i}`` is the reduced cost of slack ``i``; ``y_0``
    follows from a basic ``μ_j``). The tableau's basic values give ``μ``; where ``(μ, y)`` is not certified
    to :data:`_CERT_TOL` (primal and dual feasibility, duality gap, recomputed from the data), ``x_B`` is
    re-solved from the data by ``B x_B = b`` and the certificate recomputed (unless ``B`` is exactly singular).
    """
    N, k, m = D.shape
    ar = np.arange(N)
    y = np.empty((N, k + 1))
    y[:, 1:] = reduced[:, m:]
    jb = basis[ar, np.argmax(basis < m, axis=1)]  # a basic μ_j (a feasible basis has one)
    y[:, 0] = c[ar, jb] - (y[:, 1:] * D[ar, :, jb]).sum(axis=1)
    mu = _weights(xB, basis, m)
    kkt = np.maximum(_certificate(c, D, e, mu, y), _feasibility_residual(D, e, mu))
    redo = kkt > _CERT_TOL
    if redo.any():
        xB_r, singular = _resolve_basis(D[redo], e[redo], basis[redo])
        redo[redo] = ~singular  # an exactly singular basis cannot be re-solved: the tableau's weights stay
        if redo.any():
            mu_r = _weights(xB_r[~singular], basis[redo], m)
            mu[redo] = mu_r
            kkt[redo] = np.maximum(_certificate(c[redo], D[redo], e[redo], mu_r, y[redo]),
                                   _feasibility_residual(D[redo], e[redo], mu_r))
    nonbasic = np.ones(reduced.shape, dtype=bool)
    np.put_along_axis(nonbasic, basis, False, axis=1)
    unique = np.all(~nonbasic | (reduced < -_UNIQUE_TOL), axis=1)
    return mu, kkt, unique


def _solve_batched(lp: _LP, scaled, max_iter: int | None):
    c, D, e = scaled
    N, k, m = D.shape
    p = k + 1
    max_iter = max_iter if max_iter is not None else 50 * (m + p)
    basis, code, iters, reduced, xB = _dual_simplex(c, D, e, max_iter=max_iter, bland_after=4 * p)
    mu = np.full((N, m), np.nan)
    kkt = np.full(N, np.nan)
    unique = np.zeros(N, dtype=bool)
    ok = code == _OPTIMAL
    if ok.all():
        mu, kkt, unique = _recover(c, D, e, basis, reduced, xB)
    elif ok.any():
        mu[ok], kkt[ok], unique[ok] = _recover(c[ok], D[ok], e[ok], basis[ok], reduced[ok], xB[ok])
    return mu, code, iters, kkt, unique


#: Relative tolerance of the post-solve feasibility check (:func:`_uncertified`): a returned ``μ`` counts as feasible
#: where it is feasible for data whose every row is moved by at most this fraction of its own size.
_FEAS_RTOL = TIE_RTOL


def _uncertified(D, e, mu) -> np.ndarray:
    """Per instance: the weights ``μ`` are not certified feasible on the (row-scaled) LP data, i.e. some row has
    ``e_j - D_j μ > _FEAS_RTOL·(max_k |D_jk|·Σ_k μ_k + |e_j|)``: no data within the resolution of the float data
    (each row moved by at most ``_FEAS_RTOL`` of its own norm, a row-wise normwise backward error) admit ``μ``, so
    the answer is not one a backward-stable solve of these data can return; float64 has not decided it. The same
    rounded operations as the compiled twin's ``_uncertified`` (products, numpy's pairwise sums)."""
    rows = e - (D * mu[:, None, :]).sum(axis=2)
    tol = _FEAS_RTOL * (np.abs(D).max(axis=2) * mu.sum(axis=1)[:, None] + np.abs(e))
    return (rows > tol).any(axis=1)


def _loosened(D, e) -> np.ndarray:
    """Right-hand sides of the (row-scaled) rows ``D_j μ >= e_j`` moved down by the post-solve check's tolerance at a
    point of the simplex, ``_FEAS_RTOL·(max_k |D_jk| + |e_j|)``: the LP whose feasible points are exactly those the
    check certifies (the compiled twin's ``_loosened``, the same operations)."""
    return e - _FEAS_RTOL * (np.abs(D).max(axis=2) + np.abs(e))


def _feasibility_residual(D, e, mu) -> np.ndarray:
    """``max(max_j (e_j - D_j μ), max_j -μ_j, |1ᵀμ - 1|, 0)`` on the row-scaled data (relative violation)."""
    rows = (e - (D * mu[:, None, :]).sum(axis=2)).max(axis=1)
    return np.maximum(np.maximum(rows, -mu.min(axis=1)), np.maximum(np.abs(mu.sum(axis=1) - 1.0), 0.0))


# --------------------------------------------------------------------------------------------------------
# Results and the infeasibility policy
# --------------------------------------------------------------------------------------------------------


def _raise_restricted_infeasible(redo: np.ndarray) -> None:
    bad = np.flatnonzero(redo)
    raise LPInfeasibleError(
        f"restricted descent LP infeasible for {bad.size} instance(s) (flat indices {bad[:10].tolist()}"
        f"{' ...' if bad.size > 10 else ''}); use on_infeasible='relaxed' or 'fallback_preference'"
    )


def _raise_unsolved(status: np.ndarray) -> None:
    bad = np.flatnonzero(status != "optimal")
    if bad.size:
        raise LPInfeasibleError(
            f"LP not solved for {bad.size} instance(s) (flat indices {bad[:10].tolist()}, statuses "
            f"{sorted(set(status[bad].tolist()))})"
        )


def _result(batch, backend: str, **out) -> DirectionResult:
    """The result of every backend; its float zeros are +0.0 (``x + 0.0``): numpy's ``maximum`` returns either
    zero of a ``(-0.0, 0.0)`` pair depending on the CPU's SIMD path, so the sign of a zero is not a result."""
    for name, v in out.items():
        if v.dtype.kind == "f":
            v = v + 0.0
        out[name] = v.reshape(batch + v.shape[1:])
    return DirectionResult(backend=backend, **out)


def _finish(lp_fn, backend, losses, prefs, gram, eps_mode, descent, on_infeasible, tol_Jstar, validate,
            **solver_kw):
    l, lam, C, batch = _prepare(losses, prefs, gram, validate)
    lp, beta, A, CA, J, J_star, balance, ambiguous = _build(l, lam, C, eps_mode, descent, tol_Jstar)
    _check_lp_data(lp.c, CA, l, lam, C, batch)
    scaled = _scale_lp(lp)
    mu, code, iters, kkt, unique = lp_fn(lp, scaled, **solver_kw)
    status = _CODE_NAMES[code]
    # An infeasibility verdict is decided only where no point passes the post-solve check: re-solve with every row
    # loosened by the check's tolerance; a feasible point there means that roundoff decided the verdict.
    inf = np.flatnonzero(code == _INFEASIBLE)
    if inf.size:
        c_s, D_s, e_s = (a[inf] for a in scaled)
        sub = _LP(c=lp.c[inf], D=lp.D[inf], e=lp.e[inf], active=lp.active[inf])
        code_l = lp_fn(sub, (c_s, D_s, _loosened(D_s, e_s)), **solver_kw)[1]
        ambiguous = ambiguous.copy()
        ambiguous[inf] |= code_l == _OPTIMAL

    # The restricted descent LP may be infeasible: apply the policy, never silently.
    redo = (code == _INFEASIBLE) & ~balance & lp.active[:, -1]
    if redo.any():
        if on_infeasible == "raise":
            _raise_restricted_infeasible(redo)
        if on_infeasible == "relaxed":
            # Drop the restriction row μᵀCA >= min(max CA, 0) and solve the relaxed LP.
            active, D, e = lp.active.copy(), lp.D.copy(), lp.e.copy()
            active[redo, -1] = False
            D[redo, -1] = 0.0
            e[redo, -1] = -1.0
            lp = _LP(c=lp.c, D=D, e=e, active=active)
            scaled = _scale_lp(lp)
            sub = _LP(c=lp.c[redo], D=D[redo], e=e[redo], active=active[redo])
            mu2, code2, it2, kkt2, unique2 = lp_fn(sub, tuple(a[redo] for a in scaled), **solver_kw)
            mu[redo], kkt[redo], unique[redo] = mu2, kkt2, unique2
            iters[redo] += it2
            status[redo] = np.where(code2 == _OPTIMAL, "relaxed", "infeasible")
        else:  # fallback_preference: the EPO training scripts' μ = λ / Σλ
            mu[redo] = lam[redo] / lam[redo].sum(axis=1, keepdims=True)
            kkt[redo] = np.nan
            unique[redo] = False
            status[redo] = "fallback"
    if on_infeasible == "raise":
        _raise_unsolved(status)

    solved = np.isfinite(mu).all(axis=1)
    mu0 = mu if solved.all() else np.where(solved[:, None], mu, 0.0)
    gain = (mu0 * CA).sum(axis=1)
    objective = (mu0 * lp.c).sum(axis=1)
    feas = _feasibility_residual(scaled[1], scaled[2], mu0)
    if not solved.all():
        gain[~solved] = objective[~solved] = feas[~solved] = np.nan
    # The post-solve check: an LP solution (optimal or relaxed) that the float data do not certify feasible is
    # reported, never passed off as decided.
    lp_solution = (status == "optimal") | (status == "relaxed")
    ambiguous = ambiguous | (lp_solution & _uncertified(scaled[1], scaled[2], mu0))
    return _result(
        batch, backend, weights=mu, mode=_MODE_NAMES[balance.view(np.int8)], status=status, gain=gain, beta=beta,
        adjustment=A, J=J, J_star=J_star, objective=objective, feasibility_residual=feas, kkt_residual=kkt,
        iterations=iters, unique=unique & solved, ambiguous=ambiguous,
    )


# --------------------------------------------------------------------------------------------------------
# Backends: the numpy reference and its compiled twin
# --------------------------------------------------------------------------------------------------------

#: Values of ``lp_direction(..., backend=...)``: ``"numpy"`` (the reference), ``"compiled"`` (the numba twin, the
#: same decisions: see the module docstring) and ``"auto"`` (``"compiled"`` where numba can be imported).
BACKENDS = ("auto", "numpy", "compiled")


class BackendUnavailableError(RuntimeError):
    """Raised by ``backend="compiled"`` where numba cannot be imported (the message says why)."""


@functools.cache
def _load_compiled():
    """``(module, None)`` with the compiled kernels, or ``(None, reason)`` where they cannot be loaded."""
    if importlib.util.find_spec("numba") is None:
        return None, "numba is not installed"
    try:
        import numba

        if numba.config.DISABLE_JIT:
            return None, "NUMBA_DISABLE_JIT is set (the twin would run interpreted)"
        from sim import _lp_compiled
    except Exception as exc:  # numba installed but broken (e.g. built for another numpy): say so
        reason = f"numba is installed but cannot be imported: {type(exc).__name__}: {exc}"
        warnings.warn(f"sim.direction: {reason}; backend='auto' uses the numpy solver", RuntimeWarning,
                      stacklevel=3)
        return None, reason
    return _lp_compiled, None


def backend_status() -> dict:
    """Which backend ``backend="auto"`` runs, and why: ``{"auto": "compiled" | "numpy", "compiled_available": bool,
    "reason": None | str, "numba": version or None}``. ``reason`` says why the compiled twin is unavailable (numba not
    installed, not importable, or ``NUMBA_DISABLE_JIT`` set); ``auto`` then runs the numpy reference, and every
    result says which backend produced it (:attr:`DirectionResult.backend`)."""
    mod, reason = _load_compiled()
    version = None
    if mod is not None:
        import numba

        version = numba.__version__
    return {"auto": "compiled" if mod is not None else "numpy", "compiled_available": mod is not None,
            "reason": reason, "numba": version}


def resolve_backend(backend: str = "auto") -> str:
    """The backend that ``backend`` runs: ``"numpy"`` or ``"compiled"``. ``"compiled"`` where numba cannot be
    imported raises :class:`BackendUnavailableError`; ``"auto"`` then resolves to ``"numpy"`` (see
    :func:`backend_status`). Anything else raises ``ValueError``."""
    if backend == "numpy":
        return "numpy"
    if backend not in ("auto", "compiled"):
        raise ValueError(f"backend must be one of {BACKENDS}; got {backend!r}")
    mod, reason = _load_compiled()
    if mod is not None:
        return "compiled"
    if backend == "compiled":
        raise BackendUnavailableError(
            f"backend='compiled' needs numba, which is unavailable here ({reason}); install the project's "
            "dependencies (numba is one of them) or pass backend='numpy'"
        )
    return "numpy"


@functools.cache
def _compiled_params() -> np.ndarray:
    """Every constant the compiled twin uses, from its single definition (passed in at each call: numba would
    freeze module globals into its cache)."""
    from sim import _lp_compiled as k

    P = np.empty(k.N_PARAMS)
    P[k.P_TIE], P[k.P_EPS], P[k.P_PRIMAL], P[k.P_PIVOT], P[k.P_RATIO] = TIE_RTOL, EPS, _PRIMAL_TOL, _PIVOT_TOL, _RATIO_TIE
    P[k.P_CERT], P[k.P_UNIQUE], P[k.P_SIMPLEX], P[k.P_GRAM] = _CERT_TOL, _UNIQUE_TOL, SIMPLEX_ATOL, GRAM_RTOL
    P[k.P_LN2], P[k.P_CENTRE], P[k.P_FEAS] = _LN2, _MEAN_CENTRE_MAX_SPREAD, _FEAS_RTOL
    P.flags.writeable = False
    return P


_POLICIES = {"relaxed": 0, "fallback_preference": 1, "raise": 2}
_STATUS_NAMES = np.array(STATUSES, dtype="<U15")


def _jstar_tol(tol_Jstar) -> tuple[float, float]:
    """``J*``'s tolerance in log units for the compiled builder: ``(widened, exact)``
    (:func:`sim.preference.jstar_log_tolerance` with ``widen`` True and False)."""
    if tol_Jstar == 0:
        return TIE_RTOL, 0.0
    return float(jstar_log_tolerance(tol_Jstar)), float(jstar_log_tolerance(tol_Jstar, widen=False))


def _kernel_input(a: np.ndarray) -> np.ndarray:
    """``a`` as the one kind of array the compiled twin receives: C-contiguous, writeable float64. numba compiles
    (and caches) a specialisation per layout and read-only flag of each argument, about 12 s each; a read-only or
    broadcast input is copied instead (the kernel never writes its inputs)."""
    a = np.ascontiguousarray(a, dtype=np.float64)
    return a if a.flags.writeable else a.copy()


def _direction_compiled(losses, prefs, gram, eps_mode, descent, on_infeasible, tol_Jstar, validate, max_iter):
    """The compiled twin: checks, builder, solver and policy in one compiled call (:mod:`sim._lp_compiled`).

    float64 inputs of one batch shape are checked in the compiled pass; an instance that fails a check is named by
    the numpy checks of :mod:`sim.preference` (the same messages as the reference). Other inputs (other dtypes,
    broadcasting) go through the numpy checks and conversion first.
    """
    kern, _ = _load_compiled()
    f8 = np.float64
    try:
        l, lam, C = np.asarray(losses), np.asarray(prefs), np.asarray(gram)
    except (TypeError, ValueError, RuntimeError):  # ragged lists, tensors that require grad: the checks name them
        simple = False
    else:
        simple = (l.dtype == f8 and lam.dtype == f8 and C.dtype == f8 and l.ndim >= 1 and l.shape == lam.shape
                  and C.shape == l.shape + l.shape[-1:] and l.shape[-1] > 0)
    if simple:
        batch, m = l.shape[:-1], l.shape[-1]
        l2, lam2, C2 = _kernel_input(l.reshape(-1, m)), _kernel_input(lam.reshape(-1, m)), _kernel_input(
            C.reshape(-1, m, m))
    else:
        l2, lam2, C2, batch = _prepare(losses, prefs, gram, validate)
        l2, lam2, C2 = (_kernel_input(a) for a in (l2, lam2, C2))
    args = (float(eps_mode), descent == "restricted", _jstar_tol(tol_Jstar), _POLICIES[on_infeasible],
            -1 if max_iter is None else int(max_iter), _compiled_params())
    bad, code, F, Fl, I = kern.directions(l2, lam2, C2, *args, simple and validate)
    if bad >= 0 and code != kern.CHECK_OVERFLOW:  # name the bad value (the numpy checks raise); a PSD test the
        # Cholesky proof could not pass is decided there by the eigenvalues, and the checked data are solved
        l2, lam2, C2, batch = _prepare(losses, prefs, gram, True)
        l2, lam2, C2 = (_kernel_input(a) for a in (l2, lam2, C2))
        bad, code, F, Fl, I = kern.directions(l2, lam2, C2, *args, False)
    if bad >= 0:  # checked inputs whose LP data overflow
        raise _overflow_error(bad, l2, lam2, C2, batch)
    m = l2.shape[1]
    if on_infeasible == "raise" and Fl[:, 2 * m + kern.B_REDO].any():
        _raise_restricted_infeasible(Fl[:, 2 * m + kern.B_REDO])
    status = _STATUS_NAMES[I[:, 0]]
    if on_infeasible == "raise":
        _raise_unsolved(status)
    mode = _MODE_NAMES[Fl[:, 2 * m + kern.B_BALANCE].view(np.int8)]
    F += 0.0  # its zeros as +0.0, as _result makes them
    # Columns of the kernel's outputs as the result's arrays: views, shaped as the reference shapes them.
    if batch == ():  # one instance: 0-d and (m,) arrays
        F, Fl, I, mode, status = F[0], Fl[0], I[0], mode.reshape(()), status.reshape(())

        def col(a, j):
            return a[j, ...]

        def blk(a, lo):
            return a[lo : lo + m]
    else:
        shape, shape_m = batch, batch + (m,)

        def col(a, j):
            return a[:, j].reshape(shape)

        def blk(a, lo):
            return a[:, lo : lo + m].reshape(shape_m)

        mode, status = mode.reshape(shape), status.reshape(shape)
    f, b = 2 * m, 2 * m
    return DirectionResult(
        weights=blk(F, 0), mode=mode, status=status, gain=col(F, f + kern.F_GAIN), beta=col(F, f + kern.F_BETA),
        adjustment=blk(F, m), J=blk(Fl, 0), J_star=blk(Fl, m), objective=col(F, f + kern.F_OBJ),
        feasibility_residual=col(F, f + kern.F_FEAS), kkt_residual=col(F, f + kern.F_KKT), iterations=col(I, 1),
        unique=col(Fl, b + kern.B_UNIQUE), ambiguous=col(Fl, b + kern.B_AMBIGUOUS), backend="compiled",
    )


# --------------------------------------------------------------------------------------------------------
# Public entry points
# --------------------------------------------------------------------------------------------------------


def lp_direction(
    losses,
    prefs,
    gram,
    *,
    eps_mode: float = 1e-4,
    descent: str = "restricted",
    on_infeasible: str = "relaxed",
    tol_Jstar: float = 0.0,
    validate: bool = True,
    max_iter: int | None = None,
    backend: str = "auto",
) -> DirectionResult:
    """EPO direction weights for a batch of instances, by the exact dual simplex.

    Parameters
    ----------
    losses : (..., m) positive losses ``l``.
    prefs : (..., m) preferences ``λ`` in the open simplex.
    gram : (..., m, m) Gram matrices ``C = GᵀG`` (symmetric PSD).
    eps_mode : balancing mode iff ``β > eps_mode`` (EPO default 1e-4; the theory uses 0).
    descent : ``"restricted"`` (EPO default ``prob_dom``) or ``"relaxed"`` (``prob_rel``).
    on_infeasible : ``"relaxed"``, ``"fallback_preference"`` or ``"raise"`` (see the module docstring).
    tol_Jstar : relative tie tolerance of the bottleneck set ``J*`` (0: exact ties).
    validate : check the inputs (positivity, simplex, PSD, shapes); ``False`` skips the checks.
    max_iter : pivot limit per instance (default ``50·(2m+2)``); instances that reach it get status
        ``"iteration_limit"``.
    backend : ``"auto"`` (default: the compiled twin where numba can be imported, else numpy), ``"numpy"`` (the
        vectorised reference) or ``"compiled"`` (raises :class:`BackendUnavailableError` without numba). Both
        backends take the same decisions (module docstring); ``result.backend`` says which one ran.

    Returns
    -------
    DirectionResult, batched over the broadcast leading axes of the inputs.

    Example
    -------
    >>> import numpy as np
    >>> from sim.direction import lp_direction
    >>> G = np.array([[1.0, 0.0], [0.0, 1.0]])              # n_w x m, columns are gradients
    >>> res = lp_direction([1.0, 2.0], [0.5, 0.5], G.T @ G)
    >>> str(res.mode), str(res.status), res.weights.round(6).tolist()
    ('balance', 'optimal', [0.0, 1.0])
    """
    _validate_options(eps_mode, descent, on_infeasible, tol_Jstar, max_iter)
    if resolve_backend(backend) == "compiled":
        return _direction_compiled(losses, prefs, gram, eps_mode, descent, on_infeasible, tol_Jstar, validate,
                                   max_iter)
    return _finish(
        _solve_batched, "numpy", losses, prefs, gram, eps_mode, descent, on_infeasible, tol_Jstar, validate,
        max_iter=max_iter,
    )


#: HiGHS at its tightest feasibility tolerances (its defaults, 1e-7, are loose for an oracle of a solver that
#: is exact to round-off: near-stationary instances have LP values of order 1e-7).
HIGHS_OPTIONS = {"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10, "presolve": False}


def _solve_highs(lp: _LP, scaled):
    from scipy.optimize import linprog

    # HiGHS gets the row-scaled data (rows and objective of max-norm 1: the same LP), so that its absolute
    # feasibility tolerance means the same relative accuracy on every row.
    c, D, e = scaled
    N, k, m = D.shape
    mu = np.full((N, m), np.nan)
    code = np.full(N, 3, dtype=np.int8)
    iters = np.zeros(N, dtype=np.intp)
    for i in range(N):
        act = lp.active[i]
        res = linprog(
            -c[i],
            A_ub=-D[i][act] if act.any() else None,
            b_ub=-e[i][act] if act.any() else None,
            A_eq=np.ones((1, m)),
            b_eq=np.ones(1),
            bounds=[(0, None)] * m,
            method="highs",
            options=HIGHS_OPTIONS,
        )
        iters[i] = getattr(res, "nit", 0)
        if res.status == 0:
            mu[i] = res.x
            code[i] = _OPTIMAL
        elif res.status == 2:
            code[i] = _INFEASIBLE
        elif res.status == 1:
            code[i] = _ITERLIMIT
    return mu, code, iters, np.where(code == _OPTIMAL, 0.0, np.nan), np.zeros(N, dtype=bool)


def lp_direction_reference(
    losses,
    prefs,
    gram,
    *,
    eps_mode: float = 1e-4,
    descent: str = "restricted",
    on_infeasible: str = "relaxed",
    tol_Jstar: float = 0.0,
    validate: bool = True,
) -> DirectionResult:
    """The same LPs as :func:`lp_direction`, solved instance by instance with HiGHS (the test oracle).

    ``scipy.optimize.linprog(method="highs")`` on ``min -cᵀμ`` with the active rows as ``-Dμ <= -e``. HiGHS
    status 2 is reported as ``"infeasible"`` (then ``on_infeasible`` applies), other failures as
    ``"iteration_limit"`` / ``"solver_error"``. ``kkt_residual`` is 0 for solved instances (HiGHS does not
    return a basis).
    """
    _validate_options(eps_mode, descent, on_infeasible, tol_Jstar)
    return _finish(_solve_highs, "highs", losses, prefs, gram, eps_mode, descent, on_infeasible, tol_Jstar,
                   validate)
