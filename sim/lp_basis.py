r"""The balancing-mode LP of a client in matrix form at its solution (docs/spec/lp.md#lp, "LP matrix form for
Assumption H.6"), and the constants read off it.

================================  =================================================================
``lp_basis``, ``basis_duals``     ``M, b(A), M_B, b_B, S_B`` and the duals of the active rows (docs/spec/lp.md#lp)
``client_basis(es)``              the basis of each client of a cluster at its LP weights (batched)
``lp_sensitivity``                ``κ_LP = ‖M_B⁻¹‖‖C‖``
``h11_constant``                  ``C_1 = κ_LP² σ_max(C) L_adj²`` (H.11)
================================  =================================================================

All exact given the LP weights, which are taken as arguments (from :mod:`sim.direction`); only
:mod:`sim.preference` is imported. Bad input raises :class:`ValueError` naming the argument and the value. Every name
is importable from :mod:`sim.constants` too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import numpy as np

from sim._checks import as_array as _arr
from sim._checks import as_scalar as _scalar
from sim.preference import (
    bottleneck_set,
    check_gram,
    check_losses,
    check_preferences,
    check_shapes,
    uniformity_and_adjustment,
)

__all__ = [
    "lp_sensitivity",
    "LPBasis",
    "lp_basis",
    "basis_duals",
    "ClientBasis",
    "client_basis",
    "client_bases",
    "h11_constant",
]


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
    """``κ_LP = ‖M_B⁻¹‖₂ ‖C‖₂`` (docs/spec/lp.md#lp), for a square non-singular basis matrix ``M_B`` ``(m,
    m)``. Exact."""
    MB = _arr(M_B, "M_B", ndim=2)
    if MB.shape[0] != MB.shape[1]:
        raise ValueError(f"M_B must be square; got shape {MB.shape}")
    Cm = check_gram(C, "C")
    if Cm.ndim != 2 or Cm.shape[0] != MB.shape[0]:
        raise ValueError(f"C must have shape {MB.shape}; got {Cm.shape}")
    return np.float64(_kappa(MB, Cm))


@dataclass(frozen=True, eq=False)
class LPBasis:
    """The balancing-mode LP of one client in matrix form (docs/spec/lp.md#lp, "LP matrix form for Assumption H.6").

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
    """The matrix form of the balancing LP (docs/spec/lp.md#lp) and the classification of its active rows at
    ``μ``, for ``n`` validated clients at once (``l``, ``lam``, ``mu`` ``(n, m)``, ``C`` ``(n, m, m)``):
    :func:`lp_basis` and
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
    """Build ``M``, ``b(A)`` of the balancing-mode EPO LP (docs/spec/lp.md#lp) and classify the active rows at
    ``weights``.

    Inputs: one client (no batch axis): ``losses`` ``(m,)``, ``prefs`` ``(m,)``, ``gram`` ``C`` ``(m, m)`` and the
    LP weights ``μ*`` ``(m,)`` (e.g. from ``sim.direction.lp_direction``). The instance must be in balancing mode,
    ``β > eps_mode`` (H.6 implicitly requires it, O-24). Index sets as in the EPO code: ``J = {(CA)_j > 0}``,
    ``J* = {λ_j l_j ≥ ψ - tol_Jstar·ψ}``; ``R = J* ∪ (J̄∖J*)`` if ``J ≠ ∅`` (rhs ``(CA)_j`` on ``J̄∖J*``, 0 on ``J*``),
    else ``R = [m]`` with rhs 0 (the LP's ``J = ∅`` branch).

    Active (docs/spec/lp.md#lp): constraint rows with slack ``≤ tol·max(1, |rhs|)``, sign rows with ``μ_j ≤
    tol``; the equality always. ``is_basis`` iff exactly ``m`` active rows that are linearly independent
    (numerical rank). Strict complementarity needs the duals: ``sign_duals`` ``(m,)`` (reduced costs of ``μ ≥
    0``, HiGHS ``res.lower.marginals``) and ``constraint_duals`` ``(m,)`` indexed by objective ``j``
    (multiplier of row ``(Cμ)_j ≥ rhs_j``; entries for ``j ∉ R`` ignored). Give both or neither; without them
    it is reported as unknown (``None``). ``weights`` must be feasible up to ``feas_tol`` (relative to
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
