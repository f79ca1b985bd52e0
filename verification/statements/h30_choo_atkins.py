r"""H.30 — Theorem (Choo & Atkins 1983, Thm 3.1): weak Pareto optimality ⇔ Chebyshev optimality.

Setting
    Objectives ``l_1..l_m`` on ``R^{n_w}`` (here convex quadratics, F1), a reference point ``z ∈ R^m`` and the
    weighted Chebyshev function ``ψ_{λ,z}(w) = max_j λ_j (l_j(w) − z_j)``. The theorem is stated with ``z = l*``,
    the ideal point (``l*_j = min l_j``); the rest of the appendix uses ``z = 0`` (O-13).

Statement
    A feasible ``w`` is weakly Pareto optimal iff there is a weight vector ``λ`` such that ``w`` minimises
    ``ψ_{λ,z}``.

    * (⇐) holds for every ``λ ≥ 0, λ ≠ 0`` (tested with ``λ`` in the open simplex) and every ``z``.
    * (⇒) holds with ``λ_j ∝ 1/(l_j(w) − z_j)`` **provided** ``z < l(w)`` componentwise. With ``z = l*`` this needs
      ``l(w) > l*``; for losses bounded below by ``b_min > 0``, ``z = 0`` is utopian and the condition holds.

How it is checked (docs/spec/statements.md#t-h30, docs/spec/open-points.md#o-13)
    F1 objectives, ``m ∈ {2, 3}`` alternating, ``n_w ∈ [m, 5]``, ideal point ``l* = (b_j)`` (``l_j`` is minimal at
    ``c_j`` with value ``b_j``). Rows, for each of ``n_instances`` problems and each ``z ∈ {l*, 0}``:

    * ``if``   — random interior ``λ`` (``0.95·Dirichlet(1) + 0.05/m``); ``w_λ`` = F-OPT minimiser of
      ``ψ_{λ,z}`` (:func:`sim.problems.chebyshev_optimum`, SLSQP from ``c̄`` and every ``c_j``, Newton polish with
      the exact Hessians). Hypothesis: F-OPT certified (KKT norm ``≤ 1e-7``, a global certificate since the
      problem is convex). Conclusion: the weak-Pareto gap ``s* = max_{w',s} s`` s.t. ``l_j(w') ≤ l_j(w_λ) − s``
      (convex programme, SLSQP from ``(w_λ, 0)`` and from ``(c̄, min_j(l_j(w_λ) − l_j(c̄)))``) is ``≤ 1e-6``.
    * ``only_if`` — a planted Pareto-optimal point ``w(u) = (Σu_jQ_j)^{-1}Σu_jQ_jc_j``, ``u ~ Dirichlet(3·1)``.
      Hypotheses: ``w`` weakly Pareto optimal (gap ``s* ≤ 1e-6``) and ``z < l(w)`` strictly (margin
      ``min_j (l_j(w) − z_j) > 0``). Conclusion: with ``λ ∝ 1/(l(w) − z)``, ``w`` minimises ``ψ_{λ,z}``:
      the KKT certificate ``‖min-norm point of conv{λ_j g_j(w) : j active}‖ ≤ 1e-7`` (active: within ``1e-9`` of the
      max; all ``j`` by construction).
    * ``only_if_value`` — same hypotheses: ``ψ_{λ,z}(w) ≤ min ψ_{λ,z} + 1e-9·max(1, |ψ|)`` with the F-OPT
      minimum (an independent cross-check of the certificate).

    Also reported: the Pareto-criticality norm ``‖min-norm point of conv{g_j(w)}‖`` (0 iff weakly PO for convex
    objectives) at every point.

Negative control (the reference point breaks "only if")
    Planted Pareto-optimal ``w(u)`` (the weak-PO hypothesis holds) and a reference ``z`` with ``z = l*`` except
    one coordinate ``z_{j0} = 1.1·l_{j0}(w) > l_{j0}(w)`` — not strictly below ``l(w)``; the monitor flags
    ``z < l(w)``. Conclusion evaluated: *some* ``λ ≥ 0, λ ≠ 0`` makes ``w`` a minimiser of ``ψ_{λ,z}``. For convex
    objectives this holds iff ``0 ∈ conv{g_j(w) : j ∈ S}`` for some non-empty ``S`` on which the terms
    ``l_j(w) − z_j`` have one sign (the possible argmax sets); the smallest such min-norm distance (relative to
    ``max_j ‖g_j‖``) must be ``≤ 1e-7``. At an interior Pareto point only ``S = [m]`` contains 0, and ``S = [m]`` is
    excluded because ``l_{j0} − z_{j0} < 0 < l_j − z_j`` — so no weight works and the conclusion fails (the
    formula ``λ ∝ 1/(l − z)`` has a negative entry).

    Second block (T-H30(e)): ``w = w(u) + 0.3ξ`` off the Pareto set with ``z = 0``: the weak-PO test gives
    ``s* > 0`` (flagged) and no ``λ`` makes ``w`` a Chebyshev minimiser (``conv{g_j(w)}`` does not contain 0).

Reference: docs/spec/statements.md#t-h30, docs/spec/notation.md#chebyshev, docs/spec/open-points.md#o-13; Choo
& Atkins (1983), Thm 3.1.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

import numpy as np
from scipy.optimize import minimize

from sim.hull import min_norm_element
from sim.problems import PlantedQuadraticCluster, chebyshev_optimum
from sim.problems._quadratic import interior_preferences, planted_point
from verification.core.evidence import Evidence, HypothesisMonitor

STATEMENT_ID = "H.30"
NAME = "Choo-Atkins: weakly Pareto optimal iff a weighted Chebyshev minimiser (both directions, z = l* and z = 0)"

H_CERT = "w minimises psi_{lambda,z} (F-OPT KKT certificate)"
H_WPO = "w weakly Pareto optimal (gap s* <= 1e-6)"
H_BELOW = "reference strictly below l(w): z < l(w)"
WPO_TOL = 1e-6
KKT_TOL = 1e-7
ACTIVE_TOL = 1e-9


@dataclass(frozen=True)
class Config:
    n_instances: int = 100
    ms: tuple = (2, 3)
    n_w_max: int = 5
    control_instances: int = 20
    control_factor: float = 1.1
    off_pareto_step: float = 0.3

    @classmethod
    def paper(cls) -> Config:
        """The paper-scale preset (`--scale paper`): the samples the conclusions are counted over, larger."""
        return cls(n_instances=200)


def weak_pareto_gap(problem, w: np.ndarray) -> float:
    """``s* = max_{w', s} s`` s.t. ``l_j(w') + s ≤ l_j(w)`` (``s* = 0`` iff ``w`` is weakly Pareto optimal).

    Convex programme (convex ``l_j``) solved by SLSQP from ``(w, 0)`` and ``(c̄, min_j(l_j(w) − l_j(c̄)))``
    (both feasible); the value of a returned point is reduced by its constraint violation."""
    lw = problem.losses(w)
    n, m = w.size, lw.size

    def cons(x):
        return lw - problem.losses(x[:-1]) - x[-1]

    def cons_jac(x):
        return np.hstack([-problem.grads(x[:-1]).T, -np.ones((m, 1))])

    grad = np.append(np.zeros(n), -1.0)
    cbar = problem.centres.mean(axis=0)
    starts = [np.append(w, 0.0), np.append(cbar, float(np.min(lw - problem.losses(cbar))))]
    best = 0.0
    for x0 in starts:
        res = minimize(lambda x: -x[-1], x0, jac=lambda x: grad, method="SLSQP",
                       constraints=[{"type": "ineq", "fun": cons, "jac": cons_jac}],
                       options={"ftol": 1e-14, "maxiter": 500})
        viol = max(0.0, float(-cons(res.x).min()))
        best = max(best, float(res.x[-1]) - viol)
    return best


def _pareto_criticality(problem, w: np.ndarray) -> float:
    return float(min_norm_element(problem.grads(w)).norm)


def _kkt_norm(problem, w, lam, z) -> float:
    vals = lam * (problem.losses(w) - z)
    active = vals >= vals.max() - ACTIVE_TOL
    return float(min_norm_element(problem.grads(w) * lam, active).norm)


def _fopt(problem, lam, z):
    lf, gf = problem.loss_fn()
    starts = np.vstack([problem.centres.mean(axis=0)[None], problem.centres])
    return chebyshev_optimum(lf, gf, lam, starts, reference=z, hess_fn=lambda w: problem.hessians)


def _problem(rng: np.random.Generator, k: int, cfg: Config) -> PlantedQuadraticCluster:
    m = int(cfg.ms[k % len(cfg.ms)])
    n_w = int(rng.integers(m, cfg.n_w_max + 1))
    return PlantedQuadraticCluster.make(rng, m=m, n_w=n_w, n_clients=1, spread=0.0)


def run(config: Config | None, rng: np.random.Generator) -> Evidence:
    cfg = config or Config()
    rec = {k: [] for k in ("kind", "ref", "problem", "lhs", "rhs", "cert", "wpo", "below", "crit")}

    def add(kind, ref, k, lhs, rhs, cert=np.inf, wpo=np.inf, below=np.inf, crit=np.nan):
        for key, val in (("kind", kind), ("ref", ref), ("problem", k), ("lhs", lhs), ("rhs", rhs),
                         ("cert", cert), ("wpo", wpo), ("below", below), ("crit", crit)):
            rec[key].append(val)

    for k in range(cfg.n_instances):
        P = _problem(rng, k, cfg)
        m = P.n_objectives
        ideal = P.offsets.copy()
        lam = interior_preferences(rng, (), m)
        u = rng.dirichlet(3.0 * np.ones(m))
        w_po = planted_point(u, P.centres, P.hessians)
        l_po = P.losses(w_po)
        gap_po = weak_pareto_gap(P, w_po)
        crit_po = _pareto_criticality(P, w_po)
        for ref_name, z in (("z=l*", ideal), ("z=0", np.zeros(m))):
            # (⇐) Chebyshev minimiser ⇒ weakly Pareto optimal
            opt = _fopt(P, lam, z)
            add("if", ref_name, k, weak_pareto_gap(P, opt.w), WPO_TOL, cert=KKT_TOL - opt.kkt_norm,
                crit=_pareto_criticality(P, opt.w))
            # (⇒) weakly Pareto optimal and z < l(w) ⇒ minimiser of ψ_{λ,z} with λ ∝ 1/(l(w) − z)
            below = float(np.min(l_po - z))
            lam_w = 1.0 / np.where(l_po - z > 0, l_po - z, np.nan)
            if below > 0:
                lam_w = lam_w / lam_w.sum()
                kkt = _kkt_norm(P, w_po, lam_w, z)
                psi_w = float(np.max(lam_w * (l_po - z)))
                psi_opt = _fopt(P, lam_w, z).psi
            else:  # hypothesis fails; the row is excluded
                kkt, psi_w, psi_opt = np.inf, np.inf, 0.0
            add("only_if", ref_name, k, kkt, KKT_TOL, wpo=WPO_TOL - gap_po, below=below, crit=crit_po)
            add("only_if_value", ref_name, k, psi_w - psi_opt, 1e-9 * max(1.0, abs(psi_opt)),
                wpo=WPO_TOL - gap_po, below=below, crit=crit_po)

    f = {k: np.asarray(v) for k, v in rec.items()}
    n = f["lhs"].size
    mon = HypothesisMonitor(n)
    mon.require_nonnegative(H_CERT, f["cert"])
    mon.require_nonnegative(H_WPO, f["wpo"])
    mon.require_positive(H_BELOW, f["below"], rtol=0.0)
    kinds = f["kind"]
    details = {
        "rows": {kd: int((kinds == kd).sum()) for kd in ("if", "only_if", "only_if_value")},
        "if_max_weak_pareto_gap": float(f["lhs"][kinds == "if"].max()),
        "only_if_max_kkt_norm": float(f["lhs"][(kinds == "only_if") & mon.mask].max()),
        "pareto_criticality_max": float(np.nanmax(f["crit"])),
        "tolerances": {"weak_pareto_gap": WPO_TOL, "kkt": KKT_TOL, "active": ACTIVE_TOL},
    }
    return Evidence.from_implication(
        STATEMENT_ID, NAME, mon, f["lhs"], f["rhs"], tightness=None, conclusion=kinds, kinds="identity",
        instance_data={"kind": kinds, "reference": f["ref"], "problem": f["problem"]}, details=details,
    )


def _exists_weight_distance(G: np.ndarray, terms: np.ndarray) -> float:
    """min over non-empty sign-homogeneous ``S`` of ``‖min-norm point of conv{g_j : j∈S}‖ / max_j‖g_j‖``.

    ``w`` minimises ``ψ_{λ,z}`` for some ``λ ≥ 0, λ ≠ 0`` iff this is 0 (convex objectives, KKT): the argmax set
    ``S`` of ``λ_j(l_j − z_j)`` consists of indices whose terms ``l_j − z_j`` share a sign (> 0, = 0 or < 0) and
    ``0 ∈ conv{λ_j g_j : j ∈ S}`` iff ``0 ∈ conv{g_j : j ∈ S}``."""
    m = terms.size
    scale = float(np.linalg.norm(G, axis=0).max())
    sign = np.sign(terms)
    best = np.inf
    for size in range(1, m + 1):
        for S in combinations(range(m), size):
            S = list(S)
            if np.unique(sign[S]).size != 1:
                continue
            mask = np.zeros(m, dtype=bool)
            mask[S] = True
            best = min(best, float(min_norm_element(G, mask).norm) / scale)
    return best


def negative_control(config: Config | None, rng: np.random.Generator) -> Evidence:
    cfg = config or Config()
    lhs, below, wpo, data = [], [], [], []
    # block 1: Pareto-optimal w, reference not strictly below l(w) (breaks "only if")
    for k in range(cfg.control_instances):
        P = _problem(rng, k, cfg)
        m = P.n_objectives
        u = rng.dirichlet(3.0 * np.ones(m))
        w = planted_point(u, P.centres, P.hessians)
        l = P.losses(w)
        j0 = int(rng.integers(m))
        z = P.offsets.copy()
        z[j0] = cfg.control_factor * l[j0]
        lhs.append(_exists_weight_distance(P.grads(w), l - z))
        below.append(float(np.min(l - z)))
        wpo.append(WPO_TOL - weak_pareto_gap(P, w))
        data.append({"block": "reference not below", "problem": k, "j0": j0, "z": z, "losses": l,
                     "formula_weights": (1.0 / (l - z)).tolist()})
    n1 = len(lhs)
    # block 2 (T-H30(e)): w = w(u) + 0.3ξ off the Pareto set, z = 0 (breaks the weak-PO hypothesis)
    for k in range(cfg.control_instances):
        P = _problem(rng, k, cfg)
        m = P.n_objectives
        w = planted_point(rng.dirichlet(3.0 * np.ones(m)), P.centres, P.hessians)
        w = w + cfg.off_pareto_step * rng.standard_normal(P.n_params)
        l = P.losses(w)
        lhs.append(_exists_weight_distance(P.grads(w), l))  # z = 0 < l: every term is positive
        below.append(float(np.min(l)))
        gap = weak_pareto_gap(P, w)
        wpo.append(WPO_TOL - gap)
        data.append({"block": "off Pareto", "problem": k, "w": w, "losses": l, "weak_pareto_gap": gap})
    lhs, below, wpo = np.asarray(lhs), np.asarray(below), np.asarray(wpo)
    mon = HypothesisMonitor(lhs.size)
    mon.require_nonnegative(H_WPO, wpo)
    mon.require_positive(H_BELOW, below, rtol=0.0)
    fails = lhs > KKT_TOL
    details = {
        "conclusion": "exists lambda >= 0, lambda != 0, with w a minimiser of psi_{lambda,z}",
        "block_reference_not_below": {"flagged": int((below[:n1] <= 0).sum()), "conclusion_failed": int(fails[:n1].sum()),
                                      "min_distance": float(lhs[:n1].min())},
        "block_off_pareto": {"flagged": int((wpo[n1:] < 0).sum()), "conclusion_failed": int(fails[n1:].sum()),
                             "min_weak_pareto_gap": float(WPO_TOL - wpo[n1:].max()),
                             "min_distance": float(lhs[n1:].min())},
    }
    return Evidence.from_control(
        STATEMENT_ID, NAME, mon, [H_BELOW, H_WPO], lhs, np.full(lhs.size, KKT_TOL),
        instance_data=lambda i: data[i], details=details,
    )
