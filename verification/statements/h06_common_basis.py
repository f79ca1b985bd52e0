r"""H.6 — common non-degenerate optimal LP basis; eq 8 ``μ_i* = M_B⁻¹ b_B(A_i)``;
docs/spec/statements.md#t-h6.

Setting
    Fix ``w``; assume H.5 (common ``l``, ``G``, ``C``). Each client ``i ∈ C_n`` solves the balancing EPO LP with
    its adjustment ``A_i`` (docs/spec/lp.md#lp). In matrix form (docs/spec/lp.md#lp "LP matrix form") the LP is ``max (CA)ᵀμ`` over
    ``{μ : M μ ≥ b(A)}`` (the equality row ``1ᵀμ = 1`` included) with rows: the equality, the signs ``μ_j ≥ 0``
    and ``(Cμ)_j ≥ rhs_j`` for ``j ∈ R``; only the rows ``j ∈ J̄∖J*`` have an A-dependent rhs
    ``b(A) = b_const + S C A``.

Hypotheses (checklist)
    H.5; every client in balancing mode (``β_i > 0``, O-24); equal index sets ``(J, J̄, J*)``; every client's
    optimal vertex is non-degenerate (exactly ``m`` active rows, rank ``m``, every active inequality with a
    non-zero dual, |dual| > 1e-10; and the duals are sign-feasible, i.e. the vertex is optimal); one common
    basis ``B`` (the same active rows for every client).

Guarantee
    (eq 8) ``μ_i* = M_B⁻¹ b_B(A_i)`` for every client, so ``A ↦ μ*`` is affine on the cluster:
    ``μ*(θA_1 + (1−θ)A_2) = θμ_1* + (1−θ)μ_2*``. Consequence (a): if ``B`` holds no A-dependent row, all
    ``μ_i*`` coincide (and ``H_{C_n} = 0``).
    Conclusion evaluated: ``lhs = max_i ‖μ_i* − M_B⁻¹ b_B(A_i)‖ ≤ rhs = 1e-9`` (``B`` = client 0's basis), and as a
    boolean: the affinity for ``θ ∈ {0.25, 0.5}`` (HiGHS solves the LP at the blended ``A`` with the same index
    sets; compared when its vertex has the basis ``B``) and consequence (a).

Check (T-H6)
    F1 clusters of ``N = 5`` planted clients, spreads ``s_u ∈ {1e-3, 1e-2, 0.05, 0.2}``, ``m ∈ {2,3,4}``,
    ``n_w ∈ {m..6}``, ``w = w*(u_0) + U(0.02, 0.5)·ξ/‖ξ‖``. Duals of a basis: ``CA = M_Bᵀ y`` (unique at a basis;
    see :mod:`verification.statements._lp_common`).

Negative control (T-H6 (e))
    Large spread ``s_u = 1``: the clients' LPs select different bases (hypothesis "common basis" flagged, among
    clusters where every client is at a non-degenerate vertex) and eq 8 with client 0's basis applied to another
    client's ``A_i`` misses ``μ_i*`` by ``≫ 1e-9``.

Reference: docs/spec/statements.md#t-h6, docs/spec/lp.md#lp, docs/spec/open-points.md#o-20,
docs/spec/open-points.md#o-24, docs/spec/observations.md#obs-6.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from verification.core.evidence import RESIDUAL_TIGHTNESS_FLOOR, Evidence, HypothesisMonitor
from verification.statements import _lp_common as LC

STATEMENT_ID = "H.6"
NUMBER = "6"
NAME = "Common non-degenerate optimal LP basis: mu_i = M_B^-1 b_B(A_i) (eq 8), affine in A"

HYP_H5 = "H.5 common objectives (per-client gradients equal)"
HYP_BAL = "all clients in balancing mode (beta_i > 0, O-24)"
HYP_SETS = "common index sets (J, Jbar, J*)"
HYP_VERTEX = "every client's LP at a non-degenerate optimal vertex"
HYP_BASIS = "common basis B (same active rows for every client)"


@dataclass(frozen=True)
class Config:
    kappa_Q: float = 3.0  # F1 conditioning of each Q_j (the search box varies it)
    s_c: float = 1.0  # F1 centre spread (small with kappa_Q = 1: nearly collinear gradients)
    n_clusters: int = 400
    spreads: tuple = (1e-3, 1e-2, 0.05, 0.2)
    n_clients: int = 5
    m_values: tuple = (2, 3, 4)
    n_w_max: int = 6
    radius: tuple = (0.02, 0.5)
    thetas: tuple = (0.25, 0.5)
    control_spread: float = 1.0
    control_clusters: int = 100

    @classmethod
    def paper(cls) -> Config:
        """The paper-scale preset (`--scale paper`): the samples the conclusions are counted over, larger."""
        return cls(n_clusters=1600)


def clusters(rng, n: int, spreads, cfg) -> list[LC.ClusterLP]:
    """The T-H6/T-H7 cluster instances (spreads cycled)."""
    return [LC.random_cluster(rng, spreads[k % len(spreads)], cfg.n_clients, cfg.m_values, cfg.n_w_max, cfg.radius,
                              kappa_Q=cfg.kappa_Q, s_c=cfg.s_c)
            for k in range(n)]


def monitor(cls: list[LC.ClusterLP], basis_only_where_vertices: bool = False) -> HypothesisMonitor:
    """The H.6 checklist for each cluster (used by H.6, H.7 and H.11)."""
    n = len(cls)
    mon = HypothesisMonitor(n)
    gaps = np.array([c.grad_gap for c in cls])
    scale = np.array([1e-12 * max(1.0, float(np.linalg.norm(c.grads, axis=0).max())) for c in cls])
    mon.record(HYP_H5, gaps <= scale, margin=scale - gaps)
    mon.record(HYP_BAL, [c.all_balance for c in cls])
    mon.record(HYP_SETS, [c.common_index_sets for c in cls])
    mon.record(HYP_VERTEX, [c.all_vertices for c in cls],
               margin=[min((b.min_dual for b in c.bases), default=0.0) - LC.DUAL_TOL if c.all_vertices else -1.0
                       for c in cls])
    if basis_only_where_vertices:
        idx = np.flatnonzero([c.all_vertices for c in cls])
        if idx.size:
            mon.record(HYP_BASIS, [cls[i].common_basis for i in idx], index=idx)
        else:
            mon.record(HYP_BASIS, np.ones(0, bool), index=idx)
    else:
        mon.record(HYP_BASIS, [c.common_basis for c in cls])
    return mon


def _affinity(c: LC.ClusterLP, thetas) -> tuple[bool, float, int, int]:
    """Affinity of A ↦ μ* on the common basis (clients 0 and 1). Returns (ok, max error, checked, basis changed)."""
    info = c.bases[0].info
    basis = tuple(info.rows[int(r)] for r in info.basis_rows)
    ok, err, checked, changed = True, 0.0, 0, 0
    for th in thetas:
        A = th * c.adjustment[0] + (1 - th) * c.adjustment[1]
        mu = LC.solve_fixed_index_lp(info, A)
        if mu is None:
            return False, np.inf, checked, changed
        if LC.active_rows(info, A, mu) != basis:
            changed += 1
            continue
        e = float(np.linalg.norm(mu - (th * c.weights[0] + (1 - th) * c.weights[1])))
        err = max(err, e)
        checked += 1
        ok &= e <= LC.EQ8_TOL
    return ok, err, checked, changed


def run(config: Config | None, rng: np.random.Generator) -> Evidence:
    cfg = config or Config()
    cls = clusters(rng, cfg.n_clusters, cfg.spreads, cfg)
    mon = monitor(cls)
    n = len(cls)
    lhs = np.full(n, np.nan)
    ok = np.ones(n, dtype=bool)
    aff_err, aff_checked, aff_changed, cons_a = 0.0, 0, 0, 0
    for i, c in enumerate(cls):
        if not c.common_basis:
            continue
        lhs[i] = float(c.eq8_errors(0).max())
        a_ok, e, chk, chg = _affinity(c, cfg.thetas)
        aff_err, aff_checked, aff_changed = max(aff_err, e), aff_checked + chk, aff_changed + chg
        ok[i] &= a_ok
        if not c.bases[0].a_dependent:  # consequence (a): all μ_i coincide
            cons_a += 1
            ok[i] &= bool(np.linalg.norm(c.weights - c.weights[:1], axis=1).max() <= LC.EQ8_TOL)
    held = mon.mask
    ev = Evidence.from_implication(
        STATEMENT_ID, NAME, mon, lhs, np.full(n, LC.EQ8_TOL), ok=ok,
        instance_data=lambda i: cls[i].record(),
        conclusion="eq 8: ||mu_i - M_B^-1 b_B(A_i)|| <= 1e-9", kinds="identity",
        ok_conclusion="affinity of A -> mu on the common basis; equal mu_i without A-dependent row",
        details={
            "common_basis_by_spread": {str(s): int(sum(held[k] for k in range(n) if cls[k].spread == s))
                                       for s in cfg.spreads},
            "max_eq8_error": float(np.nanmax(np.where(held, lhs, np.nan))) if held.any() else None,
            "affinity_checks": aff_checked, "affinity_max_error": aff_err,
            "affinity_basis_changed_at_blend": aff_changed,
            "consequence_a_instances (basis without A-dependent row)": cons_a,
            "duals": "unique basis duals from CA = M_B^T y (dual feasibility = optimality certificate)",
            "tightness_is": "max_i ||mu_i - M_B^-1 b_B(A_i)|| / 1e-9",
        },
    )    # the conclusion is an identity: its tightness is a residual (roundoff), compared against the floor
    return dataclasses.replace(ev, tightness_floor=RESIDUAL_TIGHTNESS_FLOOR)



def negative_control(config: Config | None, rng: np.random.Generator) -> Evidence:
    cfg = config or Config()
    cls = clusters(rng, cfg.control_clusters, (cfg.control_spread,), cfg)
    mon = monitor(cls, basis_only_where_vertices=True)
    n = len(cls)
    lhs = np.array([float(c.eq8_errors(0).max()) if c.all_vertices else np.nan for c in cls])
    flagged = mon.failed(HYP_BASIS)
    return Evidence.from_control(
        STATEMENT_ID, NAME, mon, HYP_BASIS, lhs, np.full(n, LC.EQ8_TOL), instance_data=lambda i: cls[i].record(),
        details={"different_bases": int(flagged.sum()),
                 "eq8_with_client0_basis_median_error_where_flagged":
                     float(np.median(lhs[flagged])) if flagged.any() else None},
    )
