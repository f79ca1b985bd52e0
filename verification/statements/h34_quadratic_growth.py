r"""H.34 — Assumption (local quadratic growth) and its derived constant on strongly convex quadratics.

Setting
    Client ``i`` with Chebyshev function ``ψ_i(w) = max_j λ_i^{(j)} l_j(w)``, minimum ``ψ_i*`` at ``w_i*``.

Assumption (eq 77)
    There are ``μ > 0`` and a neighbourhood ``𝒰_i*`` of ``w_i*`` with
    ``ψ_i(w) − ψ_i* ≥ (μ/2) ‖w − w_i*‖²`` for ``w ∈ 𝒰_i*`` (also applied to ``ψ_new`` at ``w_new*``).

Guarantee checked [derived, docs/spec/constants.md#constants]
    For F1 objectives ``l_j = ½(w − c_j)ᵀQ_j(w − c_j) + b_j`` with ``Q_j ≻ 0``, every ``λ_j l_j`` is
    ``λ_j λ_min(Q_j)``-strongly convex, hence so is their maximum ``ψ_i``, with
    ``μ_i = min_j λ_i^{(j)} λ_min(Q_j)`` (:func:`sim.constants.quadratic_growth`); since ``w_i*`` minimises ``ψ_i``
    (``0 ∈ ∂ψ_i(w_i*)``), ``ψ_i(w) − ψ_i* ≥ (μ_i/2)‖w − w_i*‖²`` for **all** ``w`` (``𝒰_i* = R^{n_w}``).

How it is checked (docs/spec/statements.md#t-h34)
    F1 clusters (docs/spec/problems.md#families) with ``m`` cycling over ``{2, 3, 4}``, ``n_w = m + 1``,
    planted optima; for every client ``n_points`` points ``w = w_i* + s v`` with ``v`` uniform on the sphere
    and ``s`` log-uniform in ``[1e-3, 2]``. The constant is exact (no estimation, hence no circularity).
    Hypotheses monitored: ``μ_i > 0`` (every ``Q_j`` positive definite), ``w_i*`` is the minimiser (KKT
    certificate: ``‖min-norm point of conv{λ_j g_j(w_i*)}‖ ≤ 1e-7`` over the active set, a global certificate
    by convexity), ``w ∈ 𝒰_i*`` (all of ``R^{n_w}`` here). Conclusion ``lhs = (μ_i/2)‖w − w_i*‖² ≤ rhs =
    ψ_i(w) − ψ_i*``; tightness ``max lhs/rhs``.

Negative control (T-H34(e))
    * μ overestimated: the same F1 sampling with ``μ̃_i = min_j λ_i^{(j)} λ_max(Q_j)`` (largest instead of smallest
      eigenvalue). The monitor flags ``μ ≤ μ_i`` (the derived constant) and the growth inequality fails at some
      points.
    * F4 double well (non-convex): ``μ`` estimated as ``min 2(ψ − ψ*)/(w − w*)²`` on a dense sample of the left
      well ``𝒰 = [−1.4, −0.6]``; on a grid of ``[−2, 2]`` the monitor flags ``w ∉ 𝒰`` and the inequality fails
      near the spurious minimum ``w ≈ 0.967`` (``ψ − ψ* ≈ 0.4998`` while ``‖w − w*‖² ≈ 3.99``: it needs ``μ ≤ 0.25``).

Reference: docs/spec/statements.md#t-h34, docs/spec/constants.md#constants, docs/spec/problems.md#f1,
docs/spec/problems.md#f4.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.constants import quadratic_growth
from sim.hull import min_norm_element
from sim.problems import DoubleWell, PlantedQuadraticCluster
from verification.core.evidence import Evidence, HypothesisMonitor
from verification.core.search import F1_SHAPE, LAMBDA_MIN, PLANTED_LAMBDA, Param, SearchSpace
from verification.statements._regularity_helpers import unit_directions

STATEMENT_ID = "H.34"
NAME = "Local quadratic growth psi_i - psi_i* >= (mu_i/2)||w - w_i*||^2 with mu_i = min_j lambda_ij lambda_min(Q_j)"

H_PD = "mu_i > 0 (every Q_j positive definite)"
H_OPT = "w_i* minimises psi_i (KKT certificate <= 1e-7)"
H_REGION = "w in U_i* (region of the growth constant)"
H_MU = "mu <= derived constant min_j lambda_ij lambda_min(Q_j)"
KKT_TOL = 1e-7
ACTIVE_TOL = 1e-9


@dataclass(frozen=True)
class Config:
    kappa_Q: float = 3.0  # F1 conditioning of each Q_j (the search box varies it)
    s_c: float = 1.0  # F1 centre spread (small with kappa_Q = 1: nearly collinear gradients)
    n_problems: int = 20
    ms: tuple = (2, 3, 4)
    n_clients: int = 2
    spread: float = 0.1
    n_points: int = 1000
    s_range: tuple = (1e-3, 2.0)
    # negative control
    control_problems: int = 6
    dw_region: tuple = (-1.4, -0.6)
    n_dw_region: int = 20001
    dw_grid: tuple = (-2.0, 2.0)
    n_dw_grid: int = 401

    @classmethod
    def paper(cls) -> Config:
        """The paper-scale preset (`--scale paper`): the samples the conclusions are counted over, larger."""
        return cls(n_problems=80)


def _samples(cfg: Config, rng: np.random.Generator, n_problems: int, use_lambda_max: bool) -> dict:
    rec = {k: [] for k in ("lhs", "rhs", "mu", "mu_true", "kkt", "problem", "client", "s")}
    for k in range(n_problems):
        m = int(cfg.ms[k % len(cfg.ms)])
        P = PlantedQuadraticCluster.make(rng, m=m, n_w=m + 1, n_clients=cfg.n_clients, spread=cfg.spread, kappa_Q=cfg.kappa_Q, s_c=cfg.s_c)
        ev = np.linalg.eigvalsh(P.hessians)
        mu_true = quadratic_growth(P.prefs, P.hessians)
        mu_used = (P.prefs * ev[:, -1]).min(axis=-1) if use_lambda_max else mu_true
        for i in range(P.n_clients):
            ws = P.w_star[i]
            vals = P.prefs[i] * P.losses(ws)
            active = vals >= vals.max() - ACTIVE_TOL
            kkt = float(min_norm_element(P.grads(ws) * P.prefs[i], active).norm)
            s = np.exp(rng.uniform(np.log(cfg.s_range[0]), np.log(cfg.s_range[1]), cfg.n_points))
            W = ws + s[:, None] * unit_directions(rng, cfg.n_points, P.n_params)
            gap = P.chebyshev(W, i) - P.psi_star[i]
            n = cfg.n_points
            rec["lhs"].append(0.5 * mu_used[i] * s**2)
            rec["rhs"].append(gap)
            rec["mu"].append(np.full(n, mu_used[i]))
            rec["mu_true"].append(np.full(n, mu_true[i]))
            rec["kkt"].append(np.full(n, kkt))
            rec["problem"].append(np.full(n, k))
            rec["client"].append(np.full(n, i))
            rec["s"].append(s)
    return {k: np.concatenate(v) for k, v in rec.items()}


SEARCH = SearchSpace(
    params=(Param("m", 2, 12, "int"), Param("spread", 1e-3, 1.0, "log"), Param("s_lo", 1e-4, 1.0, "log"),
            Param("n_clients", 1, 4, "int"), *F1_SHAPE),
    config=lambda p: Config(kappa_Q=p["kappa_Q"], s_c=p["s_c"], n_problems=2, ms=(p["m"],), n_clients=p["n_clients"], spread=p["spread"],
                            n_points=200, s_range=(p["s_lo"], 2.0 * p["s_lo"])),
    family="F1 clients: m, preference spread, distance from the optimum, N",
    excluded={LAMBDA_MIN: PLANTED_LAMBDA},
)


def run(config: Config | None, rng: np.random.Generator) -> Evidence:
    cfg = config or Config()
    f = _samples(cfg, rng, cfg.n_problems, use_lambda_max=False)
    n = f["lhs"].size
    mon = HypothesisMonitor(n)
    mon.require_positive(H_PD, f["mu"], rtol=0.0)
    mon.require_nonnegative(H_OPT, KKT_TOL - f["kkt"])
    mon.record(H_REGION, np.ones(n, dtype=bool))  # 𝒰_i* = R^{n_w} for strongly convex ψ_i
    small = f["s"] < 1e-2
    ratio = f["lhs"] / f["rhs"]
    details = {
        "mu_i": {"min": float(f["mu"].min()), "max": float(f["mu"].max())},
        "max_kkt_norm_at_optima": float(f["kkt"].max()),
        "tightness_small_radius_s_lt_1e-2": float(ratio[small].max()) if small.any() else None,
        "min_gap": float(f["rhs"].min()),
    }
    return Evidence.from_implication(
        STATEMENT_ID, NAME, mon, f["lhs"], f["rhs"], conclusion="QG: (mu_i/2)||w - w_i*||^2 <= psi_i - psi_i*",
        instance_data={"problem": f["problem"], "client": f["client"], "s": f["s"], "mu": f["mu"]},
        details=details,
    )


def negative_control(config: Config | None, rng: np.random.Generator) -> Evidence:
    cfg = config or Config()
    # block 1: μ overestimated with λ_max(Q_j)
    f = _samples(cfg, rng, cfg.control_problems, use_lambda_max=True)
    region1 = np.ones(f["lhs"].size)
    # block 2: F4 double well, μ from the left well, evaluated on [-2, 2]
    dw = DoubleWell()
    mins = dw.minima()
    w_star, psi_star = mins.global_w, mins.global_value
    lo, hi = cfg.dw_region
    U = np.linspace(lo, hi, cfg.n_dw_region)
    U = U[np.abs(U - w_star) > 1e-3]
    mu_dw = float(np.min(2.0 * (dw.chebyshev(U[:, None]) - psi_star) / (U - w_star) ** 2))
    Wg = np.linspace(cfg.dw_grid[0], cfg.dw_grid[1], cfg.n_dw_grid)
    lhs2 = 0.5 * mu_dw * (Wg - w_star) ** 2
    rhs2 = dw.chebyshev(Wg[:, None]) - psi_star
    region2 = np.minimum(Wg - lo, hi - Wg)
    lhs = np.concatenate([f["lhs"], lhs2])
    rhs = np.concatenate([f["rhs"], rhs2])
    n1, n2 = f["lhs"].size, Wg.size
    mon = HypothesisMonitor(n1 + n2)
    mon.require_inequality(H_MU, np.concatenate([f["mu"], np.zeros(n2)]),
                           np.concatenate([f["mu_true"], np.ones(n2)]))
    mon.require_nonnegative(H_REGION, np.concatenate([region1, region2]))
    fails = lhs > rhs + 1e-12 + 1e-9 * np.abs(rhs)
    block = np.array(["F1 mu from lambda_max"] * n1 + ["F4 double well"] * n2)
    i_sp = int(np.argmin(np.abs(Wg - mins.w[1])))
    details = {
        "block_mu_lambda_max": {"flagged": int((f["mu"] > f["mu_true"]).sum()), "conclusion_failed": int(fails[:n1].sum())},
        "block_double_well": {"mu_left_well": mu_dw, "w_star": w_star, "psi_star": psi_star,
                              "spurious_minimum": [float(mins.w[1]), float(mins.values[1])],
                              "at_spurious": {"gap": float(rhs2[i_sp]), "dist_sq": float((Wg[i_sp] - w_star) ** 2)},
                              "flagged": int((region2 < 0).sum()), "conclusion_failed": int(fails[n1:].sum())},
    }
    return Evidence.from_control(
        STATEMENT_ID, NAME, mon, [H_MU, H_REGION], lhs, rhs,
        instance_data={"block": block, "w_grid_or_s": np.concatenate([f["s"], Wg])}, details=details,
    )
