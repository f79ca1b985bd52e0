r"""Lemma H.15 — all-uniform cluster (docs/spec/statements.md#t-h15, docs/spec/open-points.md#o-11,
docs/spec/open-points.md#o-19, docs/spec/open-points.md#o-21).

Setting
    A cluster ``C_n`` of ``N`` clients, client ``i`` with its own objectives ``l_i^{(j)}`` (H.5 not assumed), weights
    ``ρ`` (Definition H.12), at a point ``w_0``. Every client is *uniform*: ``β_i(l_i(w_0)) = 0``, so its EPO LP is in
    uniform-descent ("dom") mode (docs/spec/lp.md#lp s.t. ``Cμ ≥ 0``, restricted first, relaxed on infeasibility,
    O-21). ``d̄ := Σρ_i d_i``; the gradient dissimilarity (eq 40, O-11)
    ``δ_g := max_i max_j Σ_{i'} ρ_{i'}‖g_i^{(j)} − g_{i'}^{(j)}‖``.

Hypotheses
    * every client in dom mode (``β_i ≤ ε_mode``, ``ε_mode = 1e-12``: O-19);
    * the LP returned a feasible solution of the dom LP (status optimal or relaxed: then ``Cμ ≥ 0``);
    * H.1–H.3 at ``w_0``: losses ``> 0``; ``‖g_i^{(j)}(w_0)‖ ≤ B`` (hence ``‖d_i‖ ≤ B``).

Guarantee
    * (eq 41) ``d_iᵀg_i^{(j)} ≥ 0`` for all ``i, j`` (own descent);
    * (eq 42) ``d̄ᵀg_i^{(j)} ≥ −Bδ_g`` for all ``i, j`` (approximate simultaneous descent); exact (``≥ 0``) if
      ``δ_g = 0``, e.g. under H.5.

What is checked
    Family F2 (docs/spec/problems.md#families) with ``N = 4`` clients, shifts ``s_e`` cycling over
    ``Config.shifts`` (0 gives H.5), every client made uniform at ``w_0 = w*(u_0) + r ξ`` (``λ_i :=
    normalize(1/l_i(w_0))``, ``r ~ Unif(0.05, 1)``), ``ρ ~ Dirichlet(5·1)``. Instances are clusters.
    Constants: ``B`` = the largest gradient norm at ``w_0`` over all clients and objectives (exact on the
    point used); ``δ_g`` exact for F2 (``PerturbedClients.delta_g``, constant in ``w``), cross-checked against
    :func:`sim.cluster.gradient_dissimilarity`; ``δ_g^max`` reported. Conclusion per cluster: ``lhs =
    max_{i,j}(−d̄ᵀg_i^{(j)}) ≤ rhs = Bδ_g`` (eq 42; tightness reported where ``δ_g > 0``), and (boolean)
    ``min_{i,j} d_iᵀg_i^{(j)} ≥ −LP_TOL·max(1, max_i‖C_i‖)`` (eq 41).

Negative control
    Shift ``s_e = 0.3`` with ``δ_g`` declared 0 (H.5 wrongly assumed): the monitor flags "H.5 / δ_g as declared"
    and eq 42 without the ``δ_g`` term fails on some clusters.

Reference
    docs/spec/statements.md#t-h15, docs/spec/aggregation.md#aggregation, docs/spec/open-points.md#o-11,
    docs/spec/open-points.md#o-19, docs/spec/open-points.md#o-21, docs/spec/observations.md#obs-5,
    docs/spec/observations.md#obs-17.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.cluster import gradient_dissimilarity, shared_direction
from sim.constants import gradient_bound
from sim.problems import PerturbedClients
from sim.problems._quadratic import planted_point
from verification.core.evidence import LP_TOL, Evidence, HypothesisMonitor
from verification.core.search import F1_SHAPE, LAMBDA_MIN, Param, SearchSpace

from . import _cluster_common as cc

STATEMENT_ID = "H.15"
NAME = "All-uniform cluster: own descent (eq 41) and approximate simultaneous descent (eq 42)"
NUMBER = "15"

HYP_DOM = "all clients uniform (beta_i <= eps_mode, dom mode)"
HYP_LP = "dom LP solved with C mu >= 0 (status optimal or relaxed)"
HYP_POS = "H.1-H.3: losses > 0 at w0"
HYP_DG = "delta_g as declared equals the measured delta_g (H.5 when declared 0)"
C_EQ42 = "eq 42: dbar^T g_i^(j) >= -B delta_g"
C_EQ41 = "eq 41: d_i^T g_i^(j) >= 0"


@dataclass(frozen=True)
class Config:
    kappa_Q: float = 3.0  # F1 conditioning of each Q_j (the search box varies it)
    s_c: float = 1.0  # F1 centre spread (small with kappa_Q = 1: nearly collinear gradients)
    n_clusters: int = 300
    n_clients: int = 4
    shifts: tuple = (0.0, 0.02, 0.2)
    m_choices: tuple = (2, 3, 4)
    n_w_max: int = 6
    radius: tuple = (0.05, 1.0)
    rho_alpha: float = 5.0
    eps_mode: float = 1e-12
    control_shift: float = 0.3
    control_clusters: int = 300

    @classmethod
    def paper(cls) -> Config:
        """The paper-scale preset (`--scale paper`): the samples the conclusions are counted over, larger."""
        return cls(n_clusters=1200)


def _evaluate(cfg: Config, rng, shifts, n_clusters: int, declare_zero: bool):
    N = cfg.n_clients
    rows, records = [], []
    for k in range(n_clusters):
        s_e = float(shifts[k % len(shifts)])
        m, n_w = cc.draw_dims(rng, cfg.m_choices, cfg.n_w_max)
        P = PerturbedClients.make(rng, m, n_w, N, shift=s_e, prefs="random", kappa_Q=cfg.kappa_Q, s_c=cfg.s_c)
        u0 = rng.dirichlet(3.0 * np.ones(m))
        w0 = planted_point(u0, P.centres, P.hessians) + rng.uniform(*cfg.radius) * cc.unit_vectors(rng, 1, n_w)[0]
        for i in range(N):
            P = P.with_uniform_client(i, w0)
        rho = rng.dirichlet(np.full(N, cfg.rho_alpha))
        L = P.losses(w0)  # (N, m)
        G = P.grads(w0)  # (N, n_w, m)
        lp = cc.client_lp(L, P.prefs, G, eps_mode=cfg.eps_mode)
        dbar = shared_direction(lp.d, rho)
        own = np.einsum("nw,nwm->nm", lp.d, G)  # d_i^T g_i^(j)
        shared = np.einsum("w,nwm->nm", dbar, G)  # dbar^T g_i^(j)
        B = float(gradient_bound(G))
        dg = P.delta_g(rho)
        dg_kernel = float(gradient_dissimilarity(G, rho))
        dg_max = P.delta_g_max()
        dg_declared = 0.0 if declare_zero else dg
        Cn = np.linalg.norm(np.einsum("nwa,nwb->nab", G, G), ord=2, axis=(1, 2)).max()
        records.append(dict(P=P, w0=w0, rho=rho, s_e=s_e))
        rows.append(dict(
            cluster=k, s_e=s_e, m=m, n_w=n_w, max_beta=float(lp.beta.max()),
            all_dom=bool((lp.res.mode == "descent").all()), solved=bool(lp.solved.all()),
            statuses=",".join(sorted(set(lp.res.status.tolist()))), min_loss=float(L.min()),
            eq41_min=float(own.min()), eq41_tol=LP_TOL * max(1.0, float(Cn)),
            eq42_lhs=float((-shared).max()), B=B, delta_g=dg, delta_g_kernel=dg_kernel, delta_g_max=dg_max,
            delta_g_declared=dg_declared, d_norm_max=float(np.linalg.norm(lp.d, axis=1).max()),
        ))
    a = {key: np.array([r[key] for r in rows]) for key in rows[0]}
    mon = HypothesisMonitor(len(rows))
    mon.record(HYP_DOM, a["all_dom"], margin=cfg.eps_mode - a["max_beta"])
    mon.record(HYP_LP, a["solved"])
    mon.require_positive(HYP_POS, a["min_loss"])
    mon.require_inequality("P-d: ||d_i|| <= B", a["d_norm_max"], a["B"])
    gap = np.abs(a["delta_g_declared"] - a["delta_g"])
    mon.record(HYP_DG, gap <= 1e-12 * np.maximum(1.0, a["delta_g"]), margin=-gap)
    lhs = a["eq42_lhs"]
    rhs = a["B"] * a["delta_g_declared"]
    ok = a["eq41_min"] >= -a["eq41_tol"]

    def data(i):
        r = records[int(a["cluster"][i])]
        rec = {key: a[key][i] for key in a}
        rec.update(w0=r["w0"], rho=r["rho"], eps_mode=cfg.eps_mode, **cc.problem_record(r["P"]))
        return rec

    return mon, a, lhs, rhs, ok, data


SEARCH = SearchSpace(
    params=(Param("shift", 1e-3, 1.0, "log"), Param("m", 2, 12, "int"), Param("n_w_max", 2, 12, "int"),
            Param("radius", 0.01, 2.0, "log"), Param("rho_alpha", 0.2, 20.0, "log"), Param("n_clients", 2, 6, "int"), *F1_SHAPE),
    config=lambda p: Config(kappa_Q=p["kappa_Q"], s_c=p["s_c"], n_clusters=24, n_clients=p["n_clients"], shifts=(p["shift"],), m_choices=(p["m"],),
                            n_w_max=max(p["n_w_max"], p["m"]), radius=(p["radius"], p["radius"]),
                            rho_alpha=p["rho_alpha"]),
    family="F2 all-uniform clusters: client shift s_e, m, n_w, radius of w0, rho concentration, N",
    excluded={LAMBDA_MIN: "lambda is drawn 0.95 Dirichlet(1) + 0.05/m (prefs=\"random\"): lambda_min >= 0.05/m; tiny lambda_min is searched on the LP families (H.4, H.10)"},
)
#: Found by the falsification search (seed 0): two clients, m = 2, w0 near the planted point, uneven rho.
TIGHT_POINTS = ({"shift": 0.3527, "m": 2, "n_w_max": 4, "radius": 0.0266, "rho_alpha": 0.7396, "n_clients": 2},)

# The best points, in the stored falsification search, of the conclusions whose detection rested on fewer
# than 10 instances (verification/data/search/H.15.json, 2026-12-02, rounded to 4 digits); each tight point
# runs at TIGHT_SEEDS seeds (registry.tight_point_seed), so that a halved bound is detected on at least 10
# instances rather than on a few draws.
TIGHT_POINTS += ({"shift": 0.02803, "m": 2, "n_w_max": 8, "radius": 0.01087, "rho_alpha": 2.359, "n_clients": 2,
                   "kappa_Q": 4.224, "s_c": 0.01074},)
TIGHT_SEEDS = 20


def run(config: Config | None, rng: np.random.Generator) -> Evidence:
    cfg = config or Config()
    mon, a, lhs, rhs, ok, data = _evaluate(cfg, rng, cfg.shifts, cfg.n_clusters, declare_zero=False)
    held = mon.mask
    details = {
        "instances_are": "F2 clusters, every client uniform at w0",
        "constants": {"B": "max gradient norm at w0 over clients and objectives (sim.constants.gradient_bound)",
                      "delta_g": "exact for F2 (PerturbedClients.delta_g), cross-checked with sim.cluster",
                      "eps_mode": cfg.eps_mode},
        "delta_g_kernel_max_abs_diff": float(np.max(np.abs(a["delta_g"] - a["delta_g_kernel"]))),
        "delta_g_max_vs_delta_g": cc.summary(a["delta_g_max"] / np.where(a["delta_g"] > 0, a["delta_g"], np.nan)),
        "eq41_min_over_held": float(a["eq41_min"][held].min()) if held.any() else None,
        "eq42_exact_case_s_e_0": {"clusters": int((held & (a["s_e"] == 0)).sum()),
                                  "max_lhs": float(lhs[held & (a["s_e"] == 0)].max())
                                  if (held & (a["s_e"] == 0)).any() else None},
        "tightness_by_shift": {str(s): (float(np.max(lhs[sel] / rhs[sel])) if sel.any() else None)
                               for s in cfg.shifts for sel in [held & (a["s_e"] == s) & (rhs > 0)]},
        "lp_statuses": sorted(set(a["statuses"].tolist())),
    }
    return Evidence.from_implication(STATEMENT_ID, NAME, mon, lhs, rhs, ok=ok, instance_data=data, details=details,
                                     conclusion=C_EQ42, ok_conclusion=C_EQ41)


def negative_control(config: Config | None, rng: np.random.Generator) -> Evidence:
    """``s_e = 0.3`` with ``δ_g`` declared 0: flagged by the H.5 / δ_g monitor; eq 42 without δ_g fails."""
    cfg = config or Config()
    mon, a, lhs, rhs, ok, data = _evaluate(cfg, rng, (cfg.control_shift,), cfg.control_clusters, declare_zero=True)
    return Evidence.from_control(
        STATEMENT_ID, NAME, mon, HYP_DG, lhs, rhs, ok=ok, instance_data=data, conclusion=C_EQ42,
        details={"setting": f"F2, s_e = {cfg.control_shift}, delta_g declared 0 (H.5 wrongly assumed)"},
    )
