r"""Corollary H.37 — initializer gap for a new client (docs/spec/statements.md#t-h37, with L1/L2 of "H.35, H.36";
eq 92 of H.44(a); design docs/spec/statements.md#t-h37, docs/spec/open-points.md#o-12,
docs/spec/open-points.md#o-14).

Setting
    A cluster ``C_n`` (``N`` clients, preferences ``λ_i``, optima ``ψ_i*``) and a new client with preference
    ``λ_new`` that evaluates the same objectives ``l_j``; ``ψ_new = max_j λ_new,j l_j``, ``ψ_new* = ψ_new(w_new*)``,
    ``Δ_0(w_0) = ψ_new(w_0) − ψ_new*``, ``G_opt(w_0) = (1/N) Σ_i (ψ_i(w_0) − ψ_i*)`` (uniform average, O-14),
    ``δ_λ ≥ max_i ‖λ_new − λ_i‖`` (any norm ``≥ ‖·‖_∞``), ``L* ≥ ‖l(w_new*)‖_∞`` (eq 80).

Hypotheses
    Same objectives for the new client and the cluster; ``‖λ_new − λ_i‖ ≤ δ_λ`` for all ``i``; ``L* ≥ ‖l(w_new*)‖_∞``;
    for eq 82, H.34 (quadratic growth of ``ψ_new`` at ``w_new*`` with constant ``μ``); for the bound on ``G_opt`` at
    the shared-iteration output, the hypotheses of H.31 on the run (H.19 constants ``c_d``, ``b_i`` on the iterates,
    ``0 < ηc_d ≤ 1``, eq 71 from ``t0``).

Guarantee
    * (eq 81/92, first inequality) ``Δ_0(w_0) ≤ G_opt(w_0) + δ_λ‖l(w_0)‖_∞ + δ_λ L*`` for any ``w_0``;
    * (eq 92, second inequality, with the transient term of O-14) at ``w_0 = w_I`` (the output of ``R`` rounds of
      the shared iteration): ``G_opt(w_I) ≤ ε̄_0 + (1/N) Σ_i (1 − ηc_d)^{R−t0} r_i^{t0}``, ``ε̄_0 = (1/N) Σ_i ε_{0,i}``;
    * (eq 82) ``‖w_0 − w_new*‖² ≤ (2/μ) Δ_0(w_0)``; chained with eq 92 (eq 95):
      ``‖w_0 − w_new*‖² ≤ (2/μ)(G_opt(w_0) + δ_λ(‖l(w_0)‖_∞ + L*))``.

What is checked
    F1 clusters with ``N = 4`` clients (``s_u = 0.1``, common objectives, so the new client's objectives are the
    cluster's), ``n_new`` planted new clients per cluster (``s_u = 0.1`` around the cluster's ``u_0``:
    :meth:`sim.problems.PlantedQuadraticCluster.new_client`, exact ``w_new*``, ``ψ_new*``). Starting points:
    ``n_arbitrary`` arbitrary ``w_0 = mean_i w_i* + s ξ`` (``s ~ Unif(0, 1.5)``, ``ξ`` a unit vector) per new client,
    and ``w_I``: the final iterate of the T-H31 shared-iteration run on the cluster (``R = 400`` rounds,
    ``η = {0.01, 0.03, 0.1}/L₀``, :func:`sim.algorithm.shared_iteration`) with **held-out constants**: estimated on
    a companion run of the same problem and on the O-8 region sample (also capped at ``ηc_d ≤ ½``), never on the
    checked iterates; H.19 with them is monitored on the run.
    ``δ_λ`` in the 2-norm (the design's choice) and, as a stronger check, in the ∞-norm;
    ``L* = max(‖l(w_new*)‖_∞, max_i ‖l(w_i*)‖_∞)`` (:func:`sim.constants.loss_bound_at_optima`);
    ``μ = min_j λ_new,j λ_min(Q_j)`` (:func:`sim.constants.quadratic_growth`, exact: ``ψ_new`` is ``μ``-strongly convex).

Negative control
    Single-client cluster with ``w_0 = w_1*`` and the ``δ_λ`` terms dropped (``λ_new`` wrongly declared inside the
    cluster with ``δ_λ = 0``): the monitor flags ``‖λ_new − λ_1‖ ≤ δ_λ``, and eq 92 fails since
    ``G_opt(w_1*) = 0 < Δ_0(w_1*)``.

Reference
    docs/spec/statements.md#t-h35-36, docs/spec/statements.md#t-h37, docs/spec/statements.md#t-h44,
    docs/spec/iteration.md#new-client, docs/spec/open-points.md#o-12, docs/spec/open-points.md#o-14.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.constants import loss_bound_at_optima, quadratic_growth
from sim.preference import chebyshev
from sim.problems import PlantedQuadraticCluster
from verification.statements import _chains as ch
from verification.statements import _trajectory_rows as trows

STATEMENT_ID = "H.37"
NAME = "Initializer gap for a new client: eq 92 (with the O-14 transient at w_I) and eq 82"
NUMBER = "37"

H_DELTA = "||lambda_new - lambda_i|| <= delta_lambda for every i in C_n"
H_LSTAR = "L* >= ||l(w_new*)||_inf (eq 80)"
H_QGNEW = "H.34 for psi_new: psi_new(w0) - psi_new* >= (mu/2)||w0 - w_new*||^2"
_RUN_NAMES = (ch.H_POS, ch.H_GRAD, ch.H_DBAR, ch.H_LP, ch.H_H19, ch.H_BETA, ch.H_DEV, ch.H_STEP)


@dataclass(frozen=True)
class Config(ch.ChainConfig):
    n_runs: int = 6
    n_clients: int = 4
    spreads: tuple = (0.1,)
    new_spread: float = 0.1
    n_new: int = 5
    n_arbitrary: int = 10
    arbitrary_radius: float = 1.5
    # negative control
    control_instances: int = 200

    @classmethod
    def paper(cls) -> Config:
        return cls(n_runs=24, n_arbitrary=30)


def _gap_rows(rows: trows.RowSet, P, lam_new, w_new, psi_new, W0, *, kind: str, repro: dict, extra_hyps=None,
              info=None) -> dict:
    """Eq 92 (2-norm and ∞-norm δ_λ), eq 82 and the chained eq 95 at the starting points ``W0`` ``(n, n_w)``."""
    n = W0.shape[0]
    l0 = P.losses(W0)  # (n, m) common objectives
    psi_i = chebyshev(l0[:, None, :], P.prefs[None])  # (n, N)
    G_opt = (psi_i - P.psi_star[None]).mean(axis=1)
    delta0 = chebyshev(l0, lam_new) - psi_new
    L_star = float(loss_bound_at_optima(P.losses(w_new), P.losses(P.w_star)))
    linf0 = l0.max(axis=1)
    diffs = lam_new[None] - P.prefs
    mu = float(quadratic_growth(lam_new, P.hessians))
    dist2 = np.sum((W0 - w_new[None]) ** 2, axis=1)
    hyps_common = {H_LSTAR: np.full(n, L_star - float(P.losses(w_new).max()))}
    hyps_common.update(extra_hyps or {})
    info = dict(info or {})
    info["w0"] = W0
    for norm, dl in (("2-norm", float(np.linalg.norm(diffs, axis=1).max())),
                     ("inf-norm", float(np.abs(diffs).max()))):
        per_i = np.linalg.norm(diffs, axis=1) if norm == "2-norm" else np.abs(diffs).max(axis=1)
        hyps = dict(hyps_common)
        hyps[H_DELTA] = np.full(n, dl - float(per_i.max()))
        rows.add(f"eq 92 first inequality, delta_lambda {norm} ({kind})", delta0, G_opt + dl * linf0 + dl * L_star,
                 hyps=hyps, info={**info, "delta_lambda": dl, "L_star": L_star}, repro=repro)
    dl2 = float(np.linalg.norm(diffs, axis=1).max())
    hq = dict(hyps_common)
    hq[H_QGNEW] = delta0 - 0.5 * mu * dist2 + 1e-12
    rows.add(f"eq 82 ({kind})", dist2, (2.0 / mu) * delta0, hyps=hq, info={**info, "mu": mu}, repro=repro)
    hq[H_DELTA] = np.full(n, 0.0)
    rows.add(f"eq 95 chained: ||w0 - w_new*||^2 <= (2/mu)(G_opt + delta_lambda(...)) ({kind})", dist2,
             (2.0 / mu) * (G_opt + dl2 * (linf0 + L_star)), hyps=hq, info={**info, "mu": mu}, repro=repro)
    return dict(delta_lambda_2=dl2, L_star=L_star, mu=mu, G_opt=G_opt, Delta0=delta0)


SEARCH = ch.chain_search(Config, n_new=2, n_arbitrary=4)

#: Found by the falsification search (seed 0): eq 92 (second inequality, at w_I), eq 82 and eq 95 within 0.55-0.67
#: of their bounds (close preferences, a small step, m = 2).
TIGHT_POINTS = ({"spread": 0.1958, "eta_factor": 0.007, "start_noise": 0.2459, "m": 2, "n_w": 3, "n_clients": 2},)

# The best points, in the stored falsification search, of the conclusions whose detection rested on fewer
# than 10 instances (verification/data/search/H.37.json, 2026-12-02, rounded to 4 digits); each tight point
# runs at TIGHT_SEEDS seeds (registry.tight_point_seed), so that a halved bound is detected on at least 10
# instances rather than on a few draws.
TIGHT_POINTS += ({"spread": 0.1511, "eta_factor": 0.003755, "start_noise": 1.158, "m": 4, "n_w": 4, "n_clients": 5,
                   "kappa_Q": 40.28, "s_c": 0.0002692},
                 {"spread": 0.01653, "eta_factor": 0.003995, "start_noise": 0.3638, "m": 2, "n_w": 7,
                  "n_clients": 2, "kappa_Q": 2.901, "s_c": 0.01009},)
TIGHT_SEEDS = 5


def run(config: Config | None, rng: np.random.Generator):
    cfg = config or Config()
    runs = ch.f1_chains(cfg, rng)
    rows = trows.RowSet()
    per_run = []
    for k, rn in enumerate(runs):
        P, T, t0 = rn.problem, rn.T, rn.t0
        # --- eq 92 second inequality at w_I (with the O-14 transient), for every held-out constant set
        G_opt_I = float(rn.gap[-1].mean())
        transient = float((rn.q ** (T - t0) * rn.gap[t0]).mean())
        for cs in rn.constant_sets():
            hs = ch.step_hypotheses(rn, cs)
            win = ch.window_hypotheses({h: hs[h] for h in _RUN_NAMES + (ch.H_REGION,) if h in hs}, t0)
            last = {h: float(v[-1].min()) for h, v in win.items()}
            tr = float((cs.q(rn.eta) ** (T - t0) * rn.gap[t0]).mean())
            rows.add(f"eq 92 second inequality at w_I: G_opt <= eps0_bar + transient (O-14) ({cs.label})", G_opt_I,
                     float(np.mean(cs.eps0)) + tr, hyps=last, info={"run": k}, repro=ch.set_repro(rn, k, cs))
        # --- new clients: eq 92 first inequality, eq 82, eq 95 at arbitrary w0 and at w_I
        wbar = P.w_star.mean(axis=0)
        news = []
        for c in range(cfg.n_new):
            u_new, lam_new, w_new, psi_new = P.new_client(rng, spread=cfg.new_spread)
            xi = rng.standard_normal((cfg.n_arbitrary, P.n_params))
            xi /= np.linalg.norm(xi, axis=1, keepdims=True)
            W0 = wbar[None] + rng.uniform(0.0, cfg.arbitrary_radius, (cfg.n_arbitrary, 1)) * xi
            repro = dict(ch.run_repro(rn, k), new_client=c, u_new=u_new, lambda_new=lam_new, w_new_star=w_new,
                         psi_new_star=psi_new)
            _gap_rows(rows, P, lam_new, w_new, psi_new, W0, kind="arbitrary w0", repro=repro,
                      info={"run": k, "new_client": c})
            res = _gap_rows(rows, P, lam_new, w_new, psi_new, rn.traj[-1][None], kind="w0 = w_I", repro=repro,
                            info={"run": k, "new_client": c})
            news.append(dict(delta_lambda_2=res["delta_lambda_2"], Delta0_w_I=float(res["Delta0"][0]),
                             G_opt_w_I=float(res["G_opt"][0]), mu=res["mu"], L_star=res["L_star"]))
        per_run.append({**rn.summary(), "G_opt_w_I": G_opt_I, "eps0_bar": float(rn.consts.eps0_mean),
                        "transient_w_I": transient, "new_clients": news,
                        "seed_form_G_opt_le_eps0_bar_without_transient": bool(G_opt_I <= rn.consts.eps0_mean)})
    details = dict(
        verdict_constants="w_I bound: held-out constants (c_d, b_i) of the shared-iteration run (a companion run's "
                          "iterates t >= t0; the region sample; the region sample with eta c_d <= 1/2), H.19 "
                          "monitored on the checked run",
        method=("F1 clusters (common objectives) with planted new clients (PlantedQuadraticCluster.new_client: "
                "exact w_new*, psi_new*); L* = sim.constants.loss_bound_at_optima over w_new* and the w_i*; "
                "mu = sim.constants.quadratic_growth(lambda_new, Q) (exact); delta_lambda = max_i ||lambda_new - "
                "lambda_i|| in the 2-norm (design) and the inf-norm (stronger)"),
        per_run=per_run,
        seed_form_without_transient_violated=int(sum(not p["seed_form_G_opt_le_eps0_bar_without_transient"]
                                                     for p in per_run)),
        iterates_violating_region_constants=int(sum(p["iterates_violating_region_constants"] for p in per_run)),
    )
    return rows.evidence(STATEMENT_ID, NAME, details)


def negative_control(config: Config | None, rng: np.random.Generator):
    cfg = config or Config()
    rows = trows.RowSet()
    gaps = []
    for k in range(cfg.control_instances):
        P = PlantedQuadraticCluster.make(rng, m=cfg.m, n_w=cfg.n_w, n_clients=1, spread=0.0)
        u_new, lam_new, w_new, psi_new = P.new_client(rng, spread=cfg.new_spread)
        w0 = P.w_star[0]
        l0 = P.losses(w0)
        G_opt = float(chebyshev(l0, P.prefs[0]) - P.psi_star[0])
        delta0 = float(chebyshev(l0, lam_new) - psi_new)
        declared = 0.0
        actual = float(np.linalg.norm(lam_new - P.prefs[0]))
        rows.add("eq 92 with the delta_lambda terms dropped [single-client cluster]", delta0, G_opt + declared,
                 hyps={H_DELTA: declared - actual},
                 info={"instance": k, "G_opt": G_opt, "actual_delta_lambda": actual},
                 repro=dict(centres=P.centres, hessians=P.hessians, offsets=P.offsets, prefs=P.prefs[0],
                            w0=w0, lambda_new=lam_new, w_new_star=w_new, psi_new_star=psi_new))
        gaps.append(delta0)
    details = dict(control="N = 1, w0 = w_1*, lambda_new declared inside the cluster with delta_lambda = 0",
                   Delta0=trows.summary(gaps))
    return rows.control(STATEMENT_ID, NAME, H_DELTA, details)
