r"""Theorem H.13 — simultaneous balancing direction (THEOREMS.md §2 H.13, design §3.1 T-H13, O-6, O-9, O-29).

Setting
    A cluster ``C_n`` of ``N`` clients with aggregation weights ``ρ_i > 0``, ``Σρ_i = 1`` (Definition H.12). At a
    point ``w_0`` each client solves the EPO LP (§1.5; mode by ``β_i > ε_mode``, the theory's ``ε_mode = 0``) and
    gets ``d_i = G_i μ_i``; ``d_bal,i = G_i A_i``, ``γ_i* := d_iᵀd_bal,i = μ_iᵀC_iA_i`` (computed, never assumed
    positive: O-9), ``d̄ := Σ_i ρ_i d_i`` and ``Δ_i := ‖d̄ − d_i‖``. Each client runs ``τ`` local steps of size
    ``η`` before aggregation.

Hypotheses
    * H.1–H.3 on the points used (``w_0`` and the step grid ``w_0 − s d̄``): losses ``> 0``; ``L₀``-smooth; gradients
      bounded by ``B``.
    * Range condition (eq 23), for the client: ``γ_i* > Δ_i‖d_bal,i‖ + L₀B²τη``.

Guarantee
    * ``d̄ᵀd_bal,i(w_0) > 0`` (``d̄`` is a simultaneous balancing direction), via
      ``d̄ᵀd_bal,i ≥ γ_i* − Δ_i‖d_bal,i‖`` (Cauchy–Schwarz);
    * there is ``η_0 > 0`` with ``β_i(l_i(w_0 − η d̄)) < β_i(l_i(w_0))`` for ``η ∈ (0, η_0]``; by (I4) the derivative
      of ``s ↦ β_i(w_0 − s d̄)`` at 0 is ``−d̄ᵀd_bal,i/Z_i``. (O-29: ``l_i`` is the client's own loss.)

What is checked (the contract is ``τ = 1``, O-6)
    Family F1 (planted quadratic cluster, §3.0) with ``N`` clients, spreads ``s_u`` cycling over ``Config.spreads``,
    uniform ``ρ``, ``w_0 = w*(u_0) + r·ξ`` (``r ~ Unif(0.05, 1)``, ``ξ`` a uniform unit vector). Instances are
    clients. Constants: ``L₀ = max_j ‖Q_j‖`` exact (:func:`sim.constants.smoothness_quadratic`); ``B`` = the
    largest gradient norm over ``w_0`` and every step-grid point (:func:`sim.constants.gradient_bound`, exact on the
    points used); ``τ = 1``, ``η = Config.eta_factor / L₀`` (eq 23 literally, with the drift term; the count with
    ``η → 0`` is reported). On every client with eq 23 the conclusion is ``lhs ≤ rhs`` with
    ``lhs = γ_i* − Δ_i‖d_bal,i‖``, ``rhs = d̄ᵀd_bal,i`` (tightness ``≤ 1``), **and** ``d̄ᵀd_bal,i > 0`` strictly,
    **and** ``β_i`` decreases at the ``n_smallest`` smallest resolvable grid values ``s ∈ {2^{-k}: k = 8..29}``
    (existence of ``η_0``; a grid value is resolvable when the predicted change exceeds float64 rounding, see
    :mod:`._cluster_common`), **and** the finite-difference derivative matches ``−d̄ᵀd_bal,i/Z_i`` (I4).
    Reported: ``ŝ_0`` (largest grid value below which β decreases everywhere) and whether β decreases on the
    whole grid.

    ``τ > 1`` (soft, reconstructed, **not part of the verdict**): ``τ ∈ {2,5,10}`` local LP steps of size
    ``η ∈ {0.01, 0.05, 0.2}/L₀``; ``d̄_τ := Σρ_i(w_0 − w_{i,τ})/(τη)``, ``Δ_i`` from the one-step aggregate at ``w_0``,
    ``B`` over ``w_0`` and all local iterates; eq 46 ``d̄_τᵀd_bal,i ≥ γ_i* − Δ_i‖d_bal,i‖ − L₀B²τη`` is counted,
    with and without the drift term, in ``details["tau_gt_1"]``.

Negative control
    Spread ``s_u = 1`` (clients far apart): the monitor flags eq 23, and on flagged clients ``d̄ᵀd_bal,i < 0``
    and β increases at the smallest grid values (the conclusion fails).

Reference
    THEOREMS.md §2 "H.13 Theorem — simultaneous balancing direction", §3.1 T-H13, §5 O-6, O-9, O-29, §6 chk4/chk12.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.cluster import deviations, shared_direction
from sim.constants import gradient_bound, smoothness_quadratic
from sim.problems import PlantedQuadraticCluster
from verification.evidence import POSITIVITY_RTOL, Evidence, HypothesisMonitor, check_inequality

from . import _cluster_common as cc

STATEMENT_ID = "H.13"
NAME = "Simultaneous balancing direction (range condition eq 23)"
NUMBER = "13"

HYP_POSITIVE = "H.1-H.3: losses > 0 at w0 and on the step grid"
HYP_RC = "eq 23: gamma* > Delta*||d_bal|| + L0*B^2*tau*eta"
HYP_LP = "LP solved (optimal or relaxed)"


@dataclass(frozen=True)
class Config:
    n_clusters: int = 300
    n_clients: int = 4
    spreads: tuple = (0.01, 0.05, 0.3, 1.0)
    m_choices: tuple = (2, 3, 4)
    n_w_max: int = 6
    radius: tuple = (0.05, 1.0)
    eta_factor: float = 0.01  # τ = 1, η = eta_factor / L0 in eq 23
    eps_mode: float = 0.0  # the theory's mode threshold (β > 0)
    grid_k: tuple = (8, 29)  # s ∈ {2^-k}
    n_smallest: int = 5
    # τ > 1 soft check (reported only)
    tau_values: tuple = (2, 5, 10)
    tau_eta_factors: tuple = (0.01, 0.05, 0.2)
    tau_clusters: int = 100
    # negative control
    control_spread: float = 1.0
    control_clusters: int = 100


def _draw_cluster(rng, cfg: Config, spread: float):
    m, n_w = cc.draw_dims(rng, cfg.m_choices, cfg.n_w_max)
    P = PlantedQuadraticCluster.make(rng, m, n_w, cfg.n_clients, spread=spread)
    w_center = P.planted_client(P.u0)[1]
    r = rng.uniform(*cfg.radius)
    w0 = w_center + r * cc.unit_vectors(rng, 1, n_w)[0]
    return P, w0


def _evaluate(cfg: Config, rng, spreads, n_clusters: int):
    """All clusters and their per-client quantities; returns (monitor, arrays, records, clusters)."""
    s = cc.step_grid(*cfg.grid_k)
    N = cfg.n_clients
    rho = np.full(N, 1.0 / N)
    rows = []
    clusters = []
    for k in range(n_clusters):
        spread = float(spreads[k % len(spreads)])
        P, w0 = _draw_cluster(rng, cfg, spread)
        clusters.append((P, w0, spread))
        lfn = cc.cluster_losses_fn(P)
        G = cc.cluster_grads(P, w0, N)
        L = lfn(w0)
        lp = cc.client_lp(L, P.prefs, G, eps_mode=cfg.eps_mode)
        d = lp.d
        dbar = shared_direction(d, rho)
        dev = deviations(d, rho)
        proj = lp.dbal @ dbar
        pts = w0[None, :] - s[:, None] * dbar[None, :]
        L0 = float(smoothness_quadratic(P.hessians))
        B = float(max(gradient_bound(G), gradient_bound(P.grads(pts))))
        eta = cfg.eta_factor / L0
        min_loss = float(min(L.min(), lfn(pts).min()))
        slope = -proj / lp.Z
        bgrid = cc.beta_along(lfn, P.prefs, w0, dbar, s)
        dec = cc.decrease_check(lp.beta, bgrid, slope, s, cfg.n_smallest)
        fd_ok, fd_rel = cc.fd_directional(lfn, P.prefs, w0, dbar, slope)
        for i in range(N):
            rows.append(dict(
                cluster=k, client=i, spread=spread, m=P.n_objectives, n_w=P.n_params,
                gamma=lp.gamma[i], dev=dev[i], dbal_norm=lp.dbal_norm[i], proj=proj[i], beta=lp.beta[i],
                Z=lp.Z[i], L0=L0, B=B, eta=eta, min_loss=min_loss, solved=bool(lp.solved[i]),
                mode=str(lp.res.mode[i]), J_empty=not bool(lp.res.J[i].any()),
                ok_small=bool(dec.ok_small[i]), up_small=bool(dec.up_small[i]), whole=bool(dec.whole[i]),
                s0_hat=float(dec.s0_hat[i]), n_resolved=int(dec.n_resolved[i]), fd_ok=bool(fd_ok[i]),
                fd_rel=float(fd_rel[i]), dbar_norm=float(np.linalg.norm(dbar)),
            ))
    a = {key: np.array([r[key] for r in rows]) for key in rows[0]}
    mon = HypothesisMonitor(len(rows))
    mon.exclude(HYP_LP, ~a["solved"])
    mon.require_positive(HYP_POSITIVE, a["min_loss"])
    drift = a["L0"] * a["B"] ** 2 * 1 * a["eta"]  # τ = 1
    rc_margin = a["gamma"] - a["dev"] * a["dbal_norm"] - drift
    scale = np.maximum.reduce([np.abs(a["gamma"]), a["dev"] * a["dbal_norm"], drift, np.full(len(rows), 1e-300)])
    sol = np.flatnonzero(a["solved"])  # eq 23 is evaluated where the LP was solved (others are excluded)
    mon.require_positive(HYP_RC, rc_margin[sol], scale=scale[sol], index=sol)
    a["rc_margin"] = rc_margin
    a["rc_eta0"] = a["gamma"] > a["dev"] * a["dbal_norm"] + POSITIVITY_RTOL * scale
    return mon, a, clusters


def _conclusion(a):
    lhs = a["gamma"] - a["dev"] * a["dbal_norm"]
    rhs = a["proj"]
    pos = a["proj"] > POSITIVITY_RTOL * np.maximum(a["dbal_norm"] * a["dbar_norm"], 1e-300)
    ok = pos & a["ok_small"] & a["fd_ok"]
    return lhs, rhs, ok


def _instance_data(a, clusters, cfg: Config):
    def f(i):
        k = int(a["cluster"][i])
        P, w0, spread = clusters[k]
        rec = {key: a[key][i] for key in ("cluster", "client", "gamma", "dev", "dbal_norm", "proj", "beta", "Z",
                                           "L0", "B", "eta", "s0_hat", "ok_small", "fd_ok", "fd_rel", "mode")}
        rec.update(spread=spread, w0=w0, rho="uniform", eps_mode=cfg.eps_mode, **cc.problem_record(P))
        return rec
    return f


def _tau_soft_check(cfg: Config, clusters) -> dict:
    """τ > 1 reconstruction of eq 46 (soft, reported only; THEOREMS.md §2 H.13, O-6)."""
    N = cfg.n_clients
    rho = np.full(N, 1.0 / N)
    combos = [(int(t), float(e)) for t in cfg.tau_values for e in cfg.tau_eta_factors]
    taus = np.array([c[0] for c in combos])
    n_checked = n_viol = n_viol_nodrift = n_lp_fail = 0
    n_rc = n_rc_pos = 0
    used = []
    viol_records = []
    for ci, (P, w0, spread) in enumerate(clusters[: cfg.tau_clusters]):
        L0 = float(smoothness_quadratic(P.hessians))
        etas = np.array([c[1] for c in combos]) / L0
        lfn = cc.cluster_losses_fn(P)
        G0 = cc.cluster_grads(P, w0, N)
        lp0 = cc.client_lp(lfn(w0), P.prefs, G0, eps_mode=cfg.eps_mode)
        dev = deviations(lp0.d, rho)
        W = np.broadcast_to(w0, (len(combos), N, w0.size)).copy()
        Bsq = np.full(len(combos), float(gradient_bound(G0)) ** 2)
        failed = np.zeros(len(combos), bool)
        for k in range(int(taus.max())):
            act = np.flatnonzero(taus > k)
            Wa = W[act]  # (a, N, n_w)
            La = P.losses(Wa)  # (a, N, m): client i at its own local iterate
            Ga = P.grads(Wa)  # (a, N, n_w, m)
            Bsq[act] = np.maximum(Bsq[act], (np.linalg.norm(Ga, axis=-2) ** 2).max(axis=(1, 2)))
            prefs = np.broadcast_to(P.prefs, La.shape)
            lpk = cc.client_lp(La.reshape(-1, La.shape[-1]), prefs.reshape(-1, La.shape[-1]),
                               Ga.reshape((-1,) + Ga.shape[-2:]), eps_mode=cfg.eps_mode)
            failed[act] |= ~lpk.solved.reshape(len(act), N).all(axis=1)
            W[act] = Wa - etas[act][:, None, None] * lpk.d.reshape(Wa.shape)
        Bsq_final = Bsq
        for c in range(len(combos)):
            if failed[c]:
                n_lp_fail += 1
                continue
            tau, eta = taus[c], etas[c]
            dbar_tau = rho @ ((w0[None, :] - W[c]) / (tau * eta))
            drift = L0 * Bsq_final[c] * tau * eta
            for i in range(N):
                if not (lp0.solved[i] and lp0.beta[i] > cfg.eps_mode):
                    continue
                lhs0 = lp0.gamma[i] - dev[i] * lp0.dbal_norm[i]
                rhs = float(lp0.dbal[i] @ dbar_tau)
                n_checked += 1
                bad = not bool(check_inequality(lhs0 - drift, rhs))
                n_viol += bad
                if bad and len(viol_records) < 5:
                    viol_records.append(dict(
                        cluster=ci, client=i, spread=spread, tau=int(tau), eta=float(eta), L0=L0,
                        B=float(np.sqrt(Bsq_final[c])), gamma=lp0.gamma[i], dev=dev[i],
                        dbal_norm=lp0.dbal_norm[i], drift=drift, lhs=lhs0 - drift, rhs=rhs, w0=w0,
                        rho="uniform", **cc.problem_record(P)))
                n_viol_nodrift += not bool(check_inequality(lhs0, rhs))
                used.append(max(0.0, (lhs0 - rhs) / drift))
                if lp0.gamma[i] > dev[i] * lp0.dbal_norm[i] + drift:
                    n_rc += 1
                    n_rc_pos += rhs > 0
    return {
        "soft": True,
        "part_of_verdict": False,
        "status": "reconstructed, not proved (LP switching along the local path, O-6)",
        "combinations": combos,
        "clusters": min(cfg.tau_clusters, len(clusters)),
        "eq46_checked": n_checked,
        "eq46_violations": n_viol,
        "eq46_violations_without_drift_term": n_viol_nodrift,
        "max_fraction_of_drift_allowance_used": float(max(used)) if used else None,
        "range_condition_tau_held": n_rc,
        "range_condition_tau_dbar_tau_positive": int(n_rc_pos),
        "combos_with_lp_failure": n_lp_fail,
        "eq46_violation_records": viol_records,
        "B_method": "max gradient norm over w0 and all local iterates",
    }


def _common_details(a, mon, cfg: Config) -> dict:
    held = mon.mask
    return {
        "instances_are": "clients of F1 clusters (common objectives)",
        "constants": {
            "L0": "max_j ||Q_j|| (exact, sim.constants.smoothness_quadratic)",
            "B": "max gradient norm over w0 and the step-grid points (sim.constants.gradient_bound)",
            "tau": 1,
            "eta": f"{cfg.eta_factor}/L0",
            "eps_mode": cfg.eps_mode,
        },
        "L0": cc.summary(a["L0"]),
        "B": cc.summary(a["B"]),
        "range_condition_held": int(held.sum()),
        "range_condition_eta_to_0_held": int((a["rc_eta0"] & a["solved"]).sum()),
        "conclusion_fail_under_eta_to_0_condition": int(
            (a["rc_eta0"] & a["solved"] & ~_conclusion(a)[2]).sum()),
        "gamma_nonpositive_balance_mode": int(((a["gamma"] <= 0) & (a["mode"] == "balance")).sum()),
        "J_empty": int(a["J_empty"].sum()),
        "s0_hat_on_held": cc.summary(a["s0_hat"][held]),
        "beta_decreases_on_whole_grid_held": int(a["whole"][held].sum()),
        "fd_max_rel_err_held": float(np.max(a["fd_rel"][held])) if held.any() else None,
        "unresolved_grid_points_held": int((len(cc.step_grid(*cfg.grid_k)) - a["n_resolved"][held]).sum()),
        "grid": f"s = 2^-k, k = {cfg.grid_k[0]}..{cfg.grid_k[1]}; conclusion at the {cfg.n_smallest} smallest resolvable",
    }


def run(config: Config | None, rng: np.random.Generator) -> Evidence:
    cfg = config or Config()
    mon, a, clusters = _evaluate(cfg, rng, cfg.spreads, cfg.n_clusters)
    lhs, rhs, ok = _conclusion(a)
    details = _common_details(a, mon, cfg)
    details["tau_gt_1"] = _tau_soft_check(cfg, clusters)
    return Evidence.from_implication(
        STATEMENT_ID, NAME, mon, lhs, rhs, ok=ok, instance_data=_instance_data(a, clusters, cfg), details=details,
    )


def negative_control(config: Config | None, rng: np.random.Generator) -> Evidence:
    """Spread ``s_u = 1``: eq 23 fails (flagged) and the conclusion fails on flagged clients."""
    cfg = config or Config()
    mon, a, clusters = _evaluate(cfg, rng, (cfg.control_spread,), cfg.control_clusters)
    lhs, rhs, ok = _conclusion(a)
    flagged = mon.failed(HYP_RC)
    details = {
        "setting": f"F1, spread s_u = {cfg.control_spread}, {cfg.control_clusters} clusters",
        "flagged": int(flagged.sum()),
        "flagged_with_dbar_dbal_negative": int((flagged & (a["proj"] < 0)).sum()),
        "flagged_with_beta_increase_at_smallest_steps": int((flagged & a["up_small"]).sum()),
    }
    return Evidence.from_control(
        STATEMENT_ID, NAME, mon, HYP_RC, lhs, rhs, ok=ok, instance_data=_instance_data(a, clusters, cfg),
        details=details,
    )
