r"""H.7 — direction dispersion (eq 9 identity, eq 10 bound); docs/spec/statements.md#t-h7.

Setting
    Assume H.5 (common ``G``, ``C = GᵀG``). Weights ``ρ_i > 0``, ``Σρ_i = 1``; LP weights ``μ_i*`` of the clients,
    ``μ̄* = Σρ_iμ_i*``, directions ``d_i = Gμ_i*``, ``d̄ = Σρ_i d_i``; adjustments ``A_i``, ``Ā = Σρ_iA_i``.

Hypotheses
    eq 9: H.5. eq 10: H.5 and H.6 (every client in balancing mode, common index sets, one common
    non-degenerate optimal basis ``B``; the same monitor as :mod:`h06_common_basis`).

Guarantee
    (eq 9)  ``H_{C_n}(w) = Σ_i ρ_i‖d_i − d̄‖² = Σ_i ρ_i (μ_i* − μ̄*)ᵀ C (μ_i* − μ̄*)``;
    (eq 10) ``H_{C_n}(w) ≤ κ_LP² σ_max(C) Σ_i ρ_i ‖A_i − Ā‖²``, ``κ_LP = ‖M_B⁻¹‖‖C‖`` at the common basis
            (:func:`sim.constants.lp_basis` / :func:`sim.constants.lp_sensitivity`), ``σ_max(C)`` the largest
            eigenvalue of ``C`` (O-28).
    Conclusion evaluated. Instances ``0..n−1`` are eq 9 (hypothesis H.5):
    ``lhs = |H − H_9| ≤ rhs = 1e-10·max(1, H)``. Instances ``n..2n−1`` are eq 10 on the same clusters
    (hypotheses H.5 + H.6): ``lhs = H ≤ rhs = κ_LP² σ_max(C) Σρ_i‖A_i − Ā‖²`` (with the deterministic tolerance
    ``1e-12 + 1e-9·|rhs|``). ``tightness`` is the eq-10 ratio ``max H/RHS_10``.

Check (T-H7)
    400 F1 clusters as T-H6 (``N = 5``, spreads ``{1e-3, 1e-2, 0.05, 0.2}``), ``ρ ~ Dirichlet(5·1)``.

Negative control (T-H7 (e))
    Clusters whose clients' LPs select different (each non-degenerate) bases, with ``κ_LP`` taken as the max over
    the clients' own bases: the hypothesis "common basis" is flagged and eq 10 fails in some of them. Two sources:
    random clusters with larger spreads ``{0.05, 0.2, 0.5, 1}``, and pairs of clients straddling a basis switch
    (``δ_λ ≈ 1e-9`` but ``‖μ_1 − μ_2‖ = O(1)``, consequence (b) of H.6).

Reference: docs/spec/statements.md#t-h7, docs/spec/statements.md#t-h8, docs/spec/open-points.md#o-3,
docs/spec/open-points.md#o-20, docs/spec/open-points.md#o-28, docs/spec/observations.md#obs-6.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from verification.core.evidence import Evidence, HypothesisMonitor
from verification.core.search import F1_SHAPE, LAMBDA_MIN, PLANTED_LAMBDA, Param, SearchSpace
from verification.statements import _lp_common as LC
from verification.statements import h06_common_basis as H6

STATEMENT_ID = "H.7"
NUMBER = "7"
NAME = "Direction dispersion: eq 9 identity (H.5) and eq 10 bound kappa_LP^2 sigma_max(C) var(A) (H.6)"

C_EQ9 = "eq 9 identity"
C_EQ10 = "eq 10: H <= kappa_LP^2 sigma_max(C) var(A)"


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
    eq9_rtol: float = 1e-10
    control_spreads: tuple = (0.05, 0.2, 0.5, 1.0)
    control_clusters: int = 120
    control_switch_pairs: int = 4

    @classmethod
    def paper(cls) -> Config:
        """The paper-scale preset (`--scale paper`): the samples the conclusions are counted over, larger."""
        return cls(n_clusters=1600)


def _rhs10(c: LC.ClusterLP, kappa: float) -> float:
    return kappa**2 * c.sigma_max * c.adjustment_variance


SEARCH = SearchSpace(
    params=(Param("spread", 1e-4, 0.5, "log"), Param("m", 2, 12, "int"), Param("n_w_max", 2, 12, "int"),
            Param("radius", 0.005, 1.0, "log"), Param("n_clients", 2, 8, "int"), *F1_SHAPE),
    config=lambda p: Config(kappa_Q=p["kappa_Q"], s_c=p["s_c"], n_clusters=24, spreads=(p["spread"],), n_clients=p["n_clients"], m_values=(p["m"],),
                            n_w_max=max(p["n_w_max"], p["m"]), radius=(p["radius"], 1.5 * p["radius"])),
    family="F1 clusters at w = w*(u_0) + r xi: preference spread s_u, m, n_w, radius r, N",
    excluded={LAMBDA_MIN: PLANTED_LAMBDA},
)

# The best points, in the stored falsification search, of the conclusions whose detection rested on fewer
# than 10 instances (verification/data/search/H.7.json, 2026-12-02, rounded to 4 digits); each tight point
# runs at TIGHT_SEEDS seeds (registry.tight_point_seed), so that a halved bound is detected on at least 10
# instances rather than on a few draws.
TIGHT_POINTS = ({"spread": 0.01774, "m": 2, "n_w_max": 10, "radius": 0.006822, "n_clients": 2, "kappa_Q": 137.8,
                 "s_c": 0.006642},)
TIGHT_SEEDS = 10


def run(config: Config | None, rng: np.random.Generator) -> Evidence:
    cfg = config or Config()
    cls = H6.clusters(rng, cfg.n_clusters, cfg.spreads, cfg)
    n = len(cls)
    m6 = H6.monitor(cls)
    mon = HypothesisMonitor(2 * n)
    h5 = m6.held(H6.HYP_H5)
    mon.record(H6.HYP_H5, np.concatenate([h5, h5]))
    idx10 = np.arange(n, 2 * n)
    for name in (H6.HYP_BAL, H6.HYP_SETS, H6.HYP_VERTEX, H6.HYP_BASIS):
        mon.record(name, m6.held(name), index=idx10)
    H = np.array([c.dispersion for c in cls])
    H9 = np.array([c.dispersion_eq9 for c in cls])
    rhs10 = np.array([_rhs10(c, c.kappa_common()) if c.common_basis else np.nan for c in cls])
    lhs = np.concatenate([np.abs(H - H9), H])
    rhs = np.concatenate([cfg.eq9_rtol * np.maximum(1.0, H), rhs10])
    held10 = m6.mask
    ratio = np.where(held10 & (rhs10 > 0), H / np.where(rhs10 > 0, rhs10, 1.0), np.nan)
    tight = float(np.nanmax(ratio)) if np.isfinite(ratio).any() else None

    def data(i):
        c = cls[i % n]
        rec = c.record() | {"part": "eq9" if i < n else "eq10", "H": H[i % n], "H9": H9[i % n]}
        if c.common_basis:
            rec |= {"kappa_LP": c.kappa_common(), "sigma_max_C": c.sigma_max, "var_A": c.adjustment_variance}
        return rec

    return Evidence.from_implication(
        STATEMENT_ID, NAME, mon, lhs, rhs, tightness=tight, instance_data=data,
        conclusion=np.array([C_EQ9] * n + [C_EQ10], dtype=object).repeat([1] * n + [n]),
        kinds={C_EQ9: "identity", C_EQ10: "bound"},
        details={
            "instances": f"0..{n - 1}: eq 9 (hypothesis H.5); {n}..{2 * n - 1}: eq 10 (H.5 + H.6), same clusters",
            "eq9_max_relative_error": float(np.max(np.abs(H - H9) / np.maximum(1.0, H))),
            "eq10_instances_with_H6": int(held10.sum()),
            "eq10_ratio_max": tight,
            "eq10_ratio_median": float(np.nanmedian(ratio)) if np.isfinite(ratio).any() else None,
            "constants": "kappa_LP = ||M_B^-1|| ||C|| at the common basis (sim.constants.lp_basis); "
                         "sigma_max(C) = largest eigenvalue of C",
            "tightness_is": "max H / RHS_10 over the eq-10 instances",
        },
    )


def negative_control(config: Config | None, rng: np.random.Generator) -> Evidence:
    cfg = config or Config()
    cls = H6.clusters(rng, cfg.control_clusters, cfg.control_spreads, cfg)
    for _ in range(cfg.control_switch_pairs):
        sp = LC.switch_pair_cluster(rng)
        if sp is not None:
            cls.append(sp)
    mon = H6.monitor(cls, basis_only_where_vertices=True)
    lhs = np.array([c.dispersion for c in cls])
    rhs = np.array([_rhs10(c, c.kappa_max_own()) if c.all_vertices else np.nan for c in cls])
    flagged = mon.failed(H6.HYP_BASIS)
    fails = flagged & ~(lhs <= rhs + 1e-12 + 1e-9 * np.abs(rhs))
    return Evidence.from_control(
        STATEMENT_ID, NAME, mon, H6.HYP_BASIS, lhs, rhs, conclusion=C_EQ10,
        instance_data=lambda i: cls[i].record() | {"H": lhs[i], "RHS10_kappa_max_own": rhs[i]},
        details={"different_bases": int(flagged.sum()), "eq10_failures": int(fails.sum()),
                 "eq10_failures_random_clusters": int(fails[:cfg.control_clusters].sum()),
                 "switch_pairs": len(cls) - cfg.control_clusters,
                 "kappa": "max over the clients' own bases"},
    )
