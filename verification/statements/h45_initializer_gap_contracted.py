r"""H.45 — Remark (the initializer gap is contracted by adaptation), eq 95–96.

Setting
    As H.44: a cluster trained by Phase 1 / Phase 2 (outputs ``w_I``, ``w_II``), a new client with ``λ_new``,
    ``‖λ_new − λ_i‖ ≤ δ_λ``, the same objectives ``l_j``, Pipeline 1 from ``w_0 ∈ {w_I, w_II}``.

Hypotheses
    Those of H.37 (for eq 95: H.19 on the shared iterates, ``ηc_d ≤ 1``, ``L* ≥ ‖l(w_new*)‖_∞``), H.34 for ``ψ_new``
    (``ψ_new − ψ* ≥ (μ/2)‖w − w_new*‖²``), and those of H.43 (H.39–H.41, ``0 < α ≤ p₋/(L₀p₊²)``) for eq 96.

Guarantee
    (eq 95) ``Δ₀(w_0) ≤ ε̄_0 + δ_λ(‖l(w_0)‖_∞ + L*)`` in objective space — checked with the transient term
    ``(1/N)Σ_iΠ_t(1 − η_tc_d) r_i^{t_0}`` that the finite-``R`` outputs need (O-14; two-phase ``ε̂`` for ``w_II``) —
    and ``‖w_0 − w_new*‖² ≤ (2/μ)Δ₀(w_0)``;
    (eq 96, before/after) ``E[ψ_new(w_K) − ψ*] ≤ (1 − αμ_PL p₋)^K(ψ_new(w_0) − ψ*) + L₀αp₊²σ₀²/(2μ_PL p₋ S)``;
    the RMS distance contracts accordingly: ``(E‖w_K − w_new*‖²)^{1/2} ≤ ((2/μ)[(1 − αμ_PL p₋)^K(ψ_new(w_0) − ψ*) +
    floor])^{1/2}`` (from ``√((2/μ)Δ₀)`` before adaptation).

How it is checked (docs/spec/statements.md#t-h45: same data as T-H44)
    F3 reference new client and the F3-compatible cluster of T-H44(a) (``w_I``, ``w_II`` from
    :func:`sim.algorithm.phase1` / :func:`sim.algorithm.phase2`; H.19 constants by
    :func:`sim.constants.descent_margin_constants`). Exact expectations for fixed ``P ∈ {I, U diag(linspace(0.5,
    2))Uᵀ}``, ``S ∈ {1, 4, 16}``, ``K = 0..200``: eq 96, eq 96 with ``ψ(w_0) − ψ*`` replaced by the eq 95 bound
    (the full chain "initializer gap → contracted gap"), and the RMS distance. ``μ = λ_{j*}λ_min(Q)`` (exact).
    Monte Carlo (2 assertions of the suite's budget): lagged RMSprop clipped to ``[0.5, 2]``, ``S = 4``, ``K = 60``,
    ``N = 4000`` from ``w_II``: ``E‖w_K − c‖² ≤ (2/μ)[ρ^K(ψ(w_II) − ψ*) + floor]`` (rule of
    docs/spec/tolerances.md#checks, cap 5b), and the same claim on the tight 1-D instance (``E X = b``; ``N``
    detects a bound too small by 2 with probability ``≥ 0.99``, :func:`._adaptation_evidence.tight_mc`).

Negative controls
    * eq 95 (second part) under quartic growth ``ψ = t + λ_{j*}‖w − c‖⁴`` with ``μ = 2λ_{j*}`` declared from
      ``‖w − c‖ ≥ 1``: at starts ``‖w_0 − c‖ < 1`` the QG monitor flags H.34 and ``‖w_0 − c‖² > (2/μ)Δ₀``;
    * eq 96 with the step too large (``α = 3/L₀``, ``P = I``; exact): the step condition is flagged and the gap
      grows.

Reference: docs/spec/statements.md#t-h45, docs/spec/statements.md#t-h37, docs/spec/statements.md#t-h43,
docs/spec/open-points.md#o-14, docs/spec/statements.md#t-h44.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.problems import CommonMinimizer
from verification.core.evidence import Evidence, HypothesisMonitor
from verification.core.montecarlo import assertion_delta, assertion_record
from verification.core.search import Param, SearchSpace
from verification.statements import _adaptation_evidence as AE
from verification.statements import _adaptation_runs as AR
from verification.statements import _adaptation_theory as AT
from verification.statements import h43_expected_contraction as H43

STATEMENT_ID = "H.45"
NAME = "Initializer gap contracted by adaptation: eq 95 (objective/parameter space) and eq 96 (before/after)"


@dataclass(frozen=True)
class Config:
    n_clients: int = 4
    spread: float = 0.05
    rounds_I: int = 20
    rounds_II: int = 20
    eta_I_factor: float = 0.1
    eta_II_factor: float = 0.2
    S_values: tuple = (1, 4, 16)
    K_exact: int = 200
    settings: tuple = (("identity", 1.0, 1.0), ("spectral", 0.5, 2.0))
    mc_runs: int = 4000
    mc_K: int = 60
    mc_S: int = 4
    mc_p: tuple = (0.5, 2.0)
    delta: float = assertion_delta("H.45")
    # False: the Monte Carlo assertions are soft rows (the falsification search and its tight points: their many
    # evaluations must not add false failures, and they stay outside the family-wise budget)
    confidence_contract: bool = True
    n_region: int = 2000
    quartic_radii: tuple = (0.1, 0.3, 0.5, 0.7, 0.9)

    @classmethod
    def paper(cls) -> Config:
        """The paper-scale preset (`--scale paper`): the samples the conclusions are counted over, larger."""
        return cls(mc_runs=16000)


def _eq96_rows(rows: AE.Rows, prob: CommonMinimizer, cs, b95: dict, U, cfg: Config, qg: dict, qg_m: dict,
               label: str) -> dict:
    """eq 96 (exact expectations), its chain with eq 95 and the RMS distance, from ``w_I`` and ``w_II``."""
    mu = prob.mu_pl
    worst = {}
    for key in ("w_I", "w_II"):
        w0 = cs.starts[key]
        for kind, pm, pp in cfg.settings:
            P = np.eye(prob.n_params) if kind == "identity" else AT.spectral_preconditioner(U, pm, pp)
            ev = np.linalg.eigvalsh(P)
            alpha = AT.alpha_max(prob, pm, pp)
            hyp, mg = AE.adaptation_hyps(prob, alpha=alpha, p_minus=pm, p_plus=pp, spec_min=ev[0], spec_max=ev[-1])
            for S in cfg.S_values:
                gap = AT.exact_gap(prob, alpha, S, cfg.K_exact, P, w0)
                after = AT.rhs_91(prob, alpha, S, cfg.K_exact, pm, pp, cs.delta0[key])
                chain = AT.rhs_91(prob, alpha, S, cfg.K_exact, pm, pp, b95[key])
                rms = np.sqrt(AT.exact_sq_dist(prob, alpha, S, cfg.K_exact, P, w0))
                tag = dict(new_client=label, start=key, P=kind, S=S, K=np.arange(cfg.K_exact + 1), alpha=alpha)
                rows.add("eq 96: E gap_K <= rho^K (psi(w0) - psi*) + floor", gap, after, hyp=hyp, margins=mg, **tag)
                h19, m19 = AE.h19_hyps(cs, key)
                rows.add("eq 96 with eq 95: E gap_K <= rho^K (eq 95 bound) + floor", gap, chain,
                         hyp={**hyp, **h19}, margins={**mg, **m19}, **tag)
                rows.add("RMS distance: sqrt(E||w_K - w*||^2) <= sqrt((2/mu)(rho^K Delta0 + floor))", rms,
                         np.sqrt(2.0 / mu * after), hyp={**hyp, **qg}, margins={**mg, **qg_m}, **tag)
                worst[f"{key}/{kind}/S={S}"] = {"eq96": float(np.max(gap / after)),
                                                "rms": float(np.max(rms / np.sqrt(2.0 / mu * after)))}
    return worst


SEARCH = SearchSpace(
    params=(Param("p_ratio", 1.0, 8.0, "log"), Param("S", 1, 16, "int"), Param("K", 5, 80, "int"),
            Param("spread", 1e-3, 0.5, "log"), Param("rounds_I", 2, 40, "int"), Param("eta_I_factor", 0.01, 0.5, "log")),
    config=lambda p: Config(spread=p["spread"], rounds_I=p["rounds_I"], eta_I_factor=p["eta_I_factor"],
                            S_values=(p["S"],), K_exact=p["K"],
                            settings=(("spectral", p["p_ratio"] ** -0.5, p["p_ratio"] ** 0.5),), mc_runs=300,
                            mc_K=p["K"], mc_S=p["S"], mc_p=(p["p_ratio"] ** -0.5, p["p_ratio"] ** 0.5), n_region=300,
                            confidence_contract=False),
    family="F3 new client and its cluster: preconditioner spread p+/p-, S, K, cluster preference spread, Phase-1 "
           "rounds and step size",
    excluded=AR.F3_FIXED,
)


#: Why a numeric conclusion cannot approach its bound on the family (power report and dashboard).
REASONS = {
    "Monte Carlo eq 96 distance from w_II, lagged RMSprop (LCB <= b)": AE.MC_RMSPROP_REASON,
}

#: Found by the falsification search (seed 0): a short Phase 1 with a small step, where the band eps0_bar + transient
#: of eq 92/95 is nearly attained (within 0.98).
TIGHT_POINTS = ({"p_ratio": 1.0, "S": 4, "K": 20, "spread": 0.01, "rounds_I": 5, "eta_I_factor": 0.02},)

# The best points, in the stored falsification search, of the conclusions whose detection rested on fewer
# than 10 instances (verification/data/search/H.45.json, 2026-12-02, rounded to 4 digits); each tight point
# runs at TIGHT_SEEDS seeds (registry.tight_point_seed), so that a halved bound is detected on at least 10
# instances rather than on a few draws.
TIGHT_POINTS += ({"p_ratio": 3.903, "S": 9, "K": 17, "spread": 0.001326, "rounds_I": 3, "eta_I_factor": 0.01001},
                 {"p_ratio": 3.484, "S": 2, "K": 45, "spread": 0.003503, "rounds_I": 40, "eta_I_factor": 0.5},)
TIGHT_SEEDS = 6


def run(config: Config | None, rng: np.random.Generator) -> Evidence:
    cfg = config or Config()
    prob = CommonMinimizer.reference()
    cs = AR.cluster_starts(prob, rng, n_clients=cfg.n_clients, spread=cfg.spread, rounds_I=cfg.rounds_I,
                          rounds_II=cfg.rounds_II, eta_I_factor=cfg.eta_I_factor, eta_II_factor=cfg.eta_II_factor)
    U = AT.random_orthogonal(rng, prob.n_params)
    mu = prob.mu_pl
    rows = AE.Rows()
    # QG (H.34) monitored on a region sample around c containing every start
    Rmax = max(float(np.linalg.norm(w - prob.centre)) for w in cs.starts.values())
    u = rng.standard_normal((cfg.n_region, prob.n_params))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    reg = prob.centre + (Rmax * rng.random(cfg.n_region))[:, None] * u
    qg_margin = AT.gap_of(prob, reg) - 0.5 * mu * np.sum((reg - prob.centre) ** 2, axis=1)
    qg = {AE.H_QG: bool(np.all(qg_margin >= -1e-12))}
    qg_m = {AE.H_QG: float(qg_margin.min())}
    # ---- eq 95
    b95 = {}
    for key in ("w_I", "w_II"):
        b95[key] = cs.eps0_bar[key] + cs.transient[key] + cs.delta_lambda * (cs.linf[key] + cs.L_star)
        h19, m19 = AE.h19_hyps(cs, key)
        rows.add("eq 95 (objective space, with transient O-14): Delta0 <= eps0_bar + transient + dl(||l||+L*)",
                 cs.delta0[key], b95[key], hyp=h19, margins=m19, start=key)
    for key, w in cs.starts.items():
        rows.add("eq 95 (parameter space): ||w0 - w*||^2 <= (2/mu) Delta0", float(np.sum((w - prob.centre) ** 2)),
                 2.0 / mu * cs.delta0[key], hyp=qg, margins=qg_m, start=key)
    # ---- eq 96, exact: the reference new client and the isotropic one (Q = I: equality for K >= 1 with P = I)
    worst = _eq96_rows(rows, prob, cs, b95, U, cfg, qg, qg_m, "reference")
    iso = AT.isotropic(prob)
    cs_iso = AR.cluster_starts(iso, rng, n_clients=cfg.n_clients, spread=cfg.spread, rounds_I=cfg.rounds_I,
                              rounds_II=cfg.rounds_II, eta_I_factor=cfg.eta_I_factor,
                              eta_II_factor=cfg.eta_II_factor)
    b95_iso = {k: cs_iso.eps0_bar[k] + cs_iso.transient[k] + cs_iso.delta_lambda * (cs_iso.linf[k] + cs_iso.L_star)
               for k in ("w_I", "w_II")}
    worst_iso = _eq96_rows(rows, iso, cs_iso, b95_iso, U, cfg, qg, qg_m, "isotropic (Q = I)")
    # ---- Monte Carlo: RMS distance from w_II, lagged RMSprop
    pm, pp = cfg.mc_p
    alpha = AT.alpha_max(prob, pm, pp)
    runs = AR.run_adaptation(prob, rng, alpha=alpha, S=cfg.mc_S, K=cfg.mc_K, n_runs=cfg.mc_runs,
                            kind="rmsprop_lagged", p_minus=pm, p_plus=pp, w0=cs.starts["w_II"])
    h39 = AE.h39_along(prob, runs.W)
    b = 2.0 / mu * float(AT.rhs_91(prob, alpha, cfg.mc_S, cfg.mc_K, pm, pp, cs.delta0["w_II"])[-1])
    res, rec = AE.mc_claim("E||w_K - c||^2 <= (2/mu)[rho^K (psi(w_II) - psi*) + floor] [lagged RMSprop, w_II, S=4, "
                          "K=60]", np.sum((runs.w_K - prob.centre) ** 2, axis=1), b, delta=cfg.delta)
    hyp, mg = AE.adaptation_hyps(prob, alpha=alpha, p_minus=pm, p_plus=pp, spec_min=runs.p_min.min(),
                                spec_max=runs.p_max.max())
    hyp.update({AE.H_BN: bool(h39["bottleneck_ok"].all()), AE.H_PL: bool(AE.pl_ok(h39).all()), **qg})
    rows.add_mc("Monte Carlo eq 96 distance from w_II, lagged RMSprop (LCB <= b)", res, hyp=hyp,
                soft=not cfg.confidence_contract,
                margins={**mg, **qg_m}, start="w_II", P="rmsprop_lagged")
    tight, tight_budget = AE.tight_mc(rows, rng, "Monte Carlo eq 96 distance, tight 1-D instance (LCB <= b)",
                                     quantity="sq_dist", delta=cfg.delta, soft=not cfg.confidence_contract)
    lhs, rhs, ok = rows.arrays()
    details = {
        "instance": "F3 reference new client; F3-compatible cluster of T-H44(a)",
        "constants": {"L0": prob.L0, "mu_PL": prob.mu_pl, "mu_QG": mu, "sigma0_sq": prob.sigma0_sq,
                      "cluster": cs.constants,
                      "method": "F3 exact; H.19 constants by sim.constants.descent_margin_constants (docs/spec/constants.md#constants)"},
        "starts": {k: {"Delta0": cs.delta0[k], "dist_sq": float(np.sum((w - prob.centre) ** 2)),
                       "rms_before": float(np.sqrt(2.0 / mu * cs.delta0[k]))} for k, w in cs.starts.items()},
        "eq95_bound": b95, "eq95_literal_without_transient (O-14)": {
            k: bool(cs.delta0[k] <= cs.eps0_bar[k] + cs.delta_lambda * (cs.linf[k] + cs.L_star)) for k in b95},
        "max_ratios_exact": worst, "max_ratios_exact_isotropic": worst_iso, "qg_region_min_margin": float(qg_margin.min()),
        "mc_assertions": {"count": 2, "delta_each": cfg.delta, "assertions": [rec, tight]},
        "confidence_assertions": [assertion_record(rec["label"], cfg.delta), tight_budget]
        if cfg.confidence_contract else [],
    }
    return Evidence.from_implication(STATEMENT_ID, NAME, rows.monitor(), lhs, rhs, ok=ok,
                                     instance_data=rows.instance_data(), details=details, **rows.evidence_args())


def _control_quartic(prob, rng, cfg: Config) -> Evidence:
    lam, t, c = prob.lam_star, prob.t, prob.centre
    mu = 2.0 * lam
    u = rng.standard_normal((len(cfg.quartic_radii), prob.n_params))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    W0 = c + np.asarray(cfg.quartic_radii)[:, None] * u
    d0 = AT.quartic_psi(lam, t, W0, c) - t
    sq = np.sum((W0 - c) ** 2, axis=1)
    reg = c + np.linspace(0.02, 1.5, 300)[:, None] * rng.standard_normal((300, prob.n_params))
    qg_margin = AT.quartic_psi(lam, t, reg, c) - t - 0.5 * mu * np.sum((reg - c) ** 2, axis=1)
    mon = HypothesisMonitor(sq.size)
    mon.record(AE.H_QG, bool(np.all(qg_margin >= -1e-12)), margin=float(qg_margin.min()))
    return Evidence.from_control(STATEMENT_ID, NAME, mon, AE.H_QG, sq, 2.0 / mu * d0,
                                 instance_data={"radius": np.asarray(cfg.quartic_radii)},
                                 details={"control": "eq 95 (parameter space) under quartic growth, mu = 2 lam*"})


def negative_control(config: Config | None, rng: np.random.Generator) -> Evidence:
    cfg = config or Config()
    prob = CommonMinimizer.reference()
    parts = {"quartic_growth_eq95": _control_quartic(prob, rng, cfg),
             "step_too_large_eq96": H43.control_step_too_large(prob, H43.Config(), STATEMENT_ID, NAME)}
    return AE.combine_controls(STATEMENT_ID, NAME, parts)
