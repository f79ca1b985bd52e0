r"""H.5 — common objective functions within a cluster; docs/spec/statements.md#t-h5.

Setting
    A cluster ``C_n`` of ``N`` clients with losses ``l_i^{(j)}``, gradients ``G_i(w)``, ``C_i = G_iᵀG_i``,
    preferences ``λ_i``, LP weights ``μ_i`` (EPO LP of each client at its own ``(l_i, λ_i, C_i)``), directions
    ``d_i = G_i μ_i``, weights ``ρ`` (``ρ_i > 0``, ``Σρ_i = 1``), ``H_{C_n} = Σ_i ρ_i ‖d_i − d̄‖²``.

Hypothesis (Assumption H.5, checklist)
    All clients optimise the same population objectives: ``l_i ≡ l`` and ``G_i(w) = G(w)`` at the common point,
    measured as ``max_{i,j} ‖g_i^{(j)}(w) − g_1^{(j)}(w)‖ ≤ 1e-12·max(1, max‖g‖)`` and
    ``max_i ‖l_i(w) − l_1(w)‖_∞ ≤ 1e-12·max(1, ‖l‖_∞)`` (zero to rounding).

Guarantee (what H.5 provides to Prop. H.7 / Cor. H.11)
    ``C_i = C`` for every client, and heterogeneity enters only through ``λ_i`` (hence ``A_i``, ``μ_i``): the
    dispersion equals its eq-9 form with the one common Gram matrix,
    ``H_{C_n} = Σ_i ρ_i (μ_i − μ̄)ᵀ C_1 (μ_i − μ̄)`` (relative error ≤ 1e-10·max(1, H)).
    Conclusion evaluated: ``lhs = |H − H_9(C_1)| ≤ rhs = 1e-10·max(1, H)`` and the boolean ``C_i = C_1``.

Check
    F1 clusters (common objectives) and F2 clusters with ``s_e = 0`` (the shift code path with zero shifts): H.5
    holds; F2 with ``s_e ∈ {0.02, 0.2, 0.3}``: H.5 fails and those instances are excluded (counted). ``N = 4``,
    ``ρ ~ Dirichlet(5·1)``, ``w`` = the cluster's mean optimum ``+ r ξ/‖ξ‖``, ``r ~ U(0.05, 1)``.

Negative control (T-H5 (e))
    F2 with ``s_e > 0``: the monitor flags H.5 (``max ‖g_i − g_1‖ > 0``), and the eq-9 form with a common ``C``
    no longer equals ``H_{C_n}`` (the H.7 identity has no meaning without H.5).

Reference: docs/spec/statements.md#t-h5.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from sim import cluster as cl
from sim.direction import lp_direction
from sim.problems import PerturbedClients, PlantedQuadraticCluster
from verification.core.evidence import RESIDUAL_TIGHTNESS_FLOOR, Evidence, HypothesisMonitor

STATEMENT_ID = "H.5"
NUMBER = "5"
NAME = "Common objective functions: G_i = G, so H_Cn is the C-weighted dispersion of the multipliers"

H5_NAME = "H.5 common objectives: max ||g_i - g_1|| = 0 and l_i = l_1 (to rounding)"


@dataclass(frozen=True)
class Config:
    n_per_family: int = 60
    shifts: tuple = (0.0, 0.02, 0.2, 0.3)  # F2 shift scales s_e (0: H.5 holds)
    n_clients: int = 4
    m_values: tuple = (2, 3, 4)
    n_w_max: int = 6
    radius: tuple = (0.05, 1.0)
    eq9_rtol: float = 1e-10

    @classmethod
    def paper(cls) -> Config:
        """The paper-scale preset (`--scale paper`): the samples the conclusions are counted over, larger."""
        return cls(n_per_family=240)


def _instance(rng, family: str, shift: float, cfg: Config, k: int) -> dict:
    m = int(cfg.m_values[k % len(cfg.m_values)])
    n_w = int(rng.integers(m, cfg.n_w_max + 1))
    if family == "F1":
        prob = PlantedQuadraticCluster.make(rng, m, n_w, cfg.n_clients, spread=0.2)
    else:
        prob = PerturbedClients.make(rng, m, n_w, cfg.n_clients, shift=shift, spread=0.2)
    N = prob.n_clients
    xi = rng.standard_normal(n_w)
    w = prob.w_star.mean(axis=0) + rng.uniform(*cfg.radius) * xi / np.linalg.norm(xi)
    Wc = np.broadcast_to(w, (N, n_w))
    L = prob.losses_per_client(Wc)  # (N, m): each client's own losses
    G = prob.grads_per_client(Wc)  # (N, n_w, m)
    C = prob.gram_per_client(Wc)  # (N, m, m)
    rho = rng.dirichlet(np.full(N, 5.0))
    res = lp_direction(L, prob.prefs, C, eps_mode=0.0)
    d = np.einsum("inm,im->in", G, res.weights)
    H = float(cl.dispersion(d, rho))
    H9 = float(cl.dispersion_from_weights(res.weights, C[0], rho))
    gscale = max(1.0, float(np.linalg.norm(G, axis=1).max()))
    lscale = max(1.0, float(np.abs(L).max()))
    grad_gap = float(np.linalg.norm(G - G[:1], axis=1).max())
    loss_gap = float(np.abs(L - L[:1]).max())
    return dict(
        family=family, shift=float(shift), w=w, losses=L, prefs=prob.prefs, rho=rho, weights=res.weights,
        H=H, H9=H9, grad_gap=grad_gap, grad_margin=1e-12 * gscale - grad_gap, loss_gap=loss_gap,
        loss_margin=1e-12 * lscale - loss_gap, gram_equal=bool(np.all(np.abs(C - C[:1]) <= 1e-12 * max(1.0, np.abs(C).max()))),
        centres=prob.centres, hessians=prob.hessians, offsets=prob.offsets,
        shifts=getattr(prob, "shifts", None),
    )


def _instances(rng, cfg: Config, families) -> list[dict]:
    out = []
    for fam, shift in families:
        for k in range(cfg.n_per_family):
            out.append(_instance(rng, fam, shift, cfg, k))
    return out


def _monitor(recs) -> HypothesisMonitor:
    mon = HypothesisMonitor(len(recs))
    margin = np.array([min(r["grad_margin"], r["loss_margin"]) for r in recs])
    mon.record(H5_NAME, margin >= 0, margin=margin)
    return mon


def _conclusion(recs, cfg: Config):
    H = np.array([r["H"] for r in recs])
    lhs = np.abs(H - np.array([r["H9"] for r in recs]))
    rhs = cfg.eq9_rtol * np.maximum(1.0, H)
    ok = np.array([r["gram_equal"] for r in recs])
    return lhs, rhs, ok


def run(config: Config | None, rng: np.random.Generator) -> Evidence:
    cfg = config or Config()
    fams = [("F1", 0.0)] + [("F2", s) for s in cfg.shifts]
    recs = _instances(rng, cfg, fams)
    mon = _monitor(recs)
    lhs, rhs, ok = _conclusion(recs, cfg)
    held = mon.mask
    ev = Evidence.from_implication(
        STATEMENT_ID, NAME, mon, lhs, rhs, ok=ok, instance_data=lambda i: recs[i],
        conclusion="eq 9 identity: |H - H_9| <= 1e-10 max(1, H)", kinds="identity",
        ok_conclusion="common Gram matrix C_i = C",
        details={
            "instances_by_family": {f"{f} s_e={s}": cfg.n_per_family for f, s in fams},
            "H5_held_by_family": {f"{f} s_e={s}": int(sum(held[i] for i, r in enumerate(recs)
                                                        if r["family"] == f and r["shift"] == s)) for f, s in fams},
            "max_grad_gap_where_H5_held": float(max([r["grad_gap"] for r, h in zip(recs, held, strict=True) if h],
                                                    default=0.0)),
            "max_eq9_relative_error_where_H5_held": float(max(
                [abs(r["H"] - r["H9"]) / max(1.0, r["H"]) for r, h in zip(recs, held, strict=True) if h], default=0.0)),
            "eq9_relative_error_where_H5_failed (report only)": float(max(
                [abs(r["H"] - r["H9"]) / max(1.0, r["H"]) for r, h in zip(recs, held, strict=True) if not h],
                default=0.0)),
            "tightness_is": "|H - H_9| / (1e-10 max(1, H))",
        },
    )    # the conclusion is an identity: its tightness is a residual (roundoff), compared against the floor
    return dataclasses.replace(ev, tightness_floor=RESIDUAL_TIGHTNESS_FLOOR)



def negative_control(config: Config | None, rng: np.random.Generator) -> Evidence:
    cfg = config or Config()
    fams = [("F2", s) for s in cfg.shifts if s > 0]
    recs = _instances(rng, cfg, fams)
    mon = _monitor(recs)
    lhs, rhs, ok = _conclusion(recs, cfg)
    return Evidence.from_control(
        STATEMENT_ID, NAME, mon, H5_NAME, lhs, rhs, ok=ok, instance_data=lambda i: recs[i],
        details={"min_grad_gap": float(min(r["grad_gap"] for r in recs)),
                 "eq9_with_common_C_failures": int(np.sum(lhs > rhs))},
    )
