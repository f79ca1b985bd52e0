r"""Corollary H.14 — dispersion controls deviation (docs/spec/statements.md#t-h14,
docs/spec/open-points.md#o-3).

Setting
    A cluster of ``N`` clients with directions ``d_i`` (any vectors; in the theory the LP directions) and
    aggregation weights ``ρ`` (Definition H.12). ``d̄ := Σρ_i d_i``, ``Δ_i := ‖d̄ − d_i‖`` and the direction
    dispersion ``H_{C_n} := Σ_i ρ_i‖d_i − d̄‖²`` (O-3: the ρ-weighted form).

Hypotheses
    Definition H.12: ``ρ_i > 0`` and ``Σ_i ρ_i = 1``.

Guarantee
    ``Δ_i ≤ √(H_{C_n}/ρ_i) ≤ √(H_{C_n}/ρ_min)`` (proof: ``ρ_iΔ_i² ≤ Σ_kρ_kΔ_k² = H``). Hence eq 23 holds whenever
    ``γ_i* > √(H_{C_n}/ρ_min)·‖d_bal,i‖ + L₀B²τη``.

What is checked
    Instances are clients of two sets: (a) ``Config.n_random`` random clusters of ``N = 5`` Gaussian directions in
    ``R^3`` with ``ρ ~ Dirichlet(0.5·1)`` (small weights occur); (b) ``Config.n_lp_clusters`` F1 clusters
    (docs/spec/problems.md#families) with the EPO LP directions at ``w_0 = w*(u_0) + r ξ`` (as in T-H13), ``ρ
    ~ Dirichlet(0.5·1)``. Conclusion: ``lhs = Δ_i ≤ rhs = √(H/ρ_i)`` and, a numeric conclusion of its own,
    ``Δ_i ≤ √(H/ρ_min)`` (the same clients again, with their tightness and power); on set (b) also the
    (boolean) implication "``γ_i* > √(H/ρ_min)‖d_bal,i‖ + L₀B²τη`` ⇒ eq 23" with ``L₀ = max_j‖Q_j‖`` (exact), ``B`` the largest gradient
    norm at ``w_0``, ``τ = 1``, ``η = Config.eta_factor/L₀``. ``H`` and ``Δ_i`` come from :mod:`sim.cluster`.

Negative control
    Drop the ``1/ρ`` factor (the bound uses weight 1 instead of client ``i``'s ``ρ_i``, which the monitor flags
    as a violation of Definition H.12's role in the bound): ``max_iΔ_i ≤ √H`` fails, since ``H = Σρ_kΔ_k² ≤
    max_kΔ_k²`` with equality only if all deviations are equal.

Reference
    docs/spec/statements.md#t-h14, docs/spec/aggregation.md#aggregation, docs/spec/open-points.md#o-3,
    docs/spec/observations.md#obs-17.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.cluster import check_aggregation_weights, deviations, dispersion
from sim.constants import gradient_bound, smoothness_quadratic
from sim.problems import PlantedQuadraticCluster
from verification.core.evidence import POSITIVITY_RTOL, Evidence, HypothesisMonitor
from verification.core.search import F1_SHAPE, LAMBDA_MIN, PLANTED_LAMBDA, Param, SearchSpace

from . import _cluster_common as cc

STATEMENT_ID = "H.14"
NAME = "Dispersion controls deviation: Delta_i <= sqrt(H/rho_i) <= sqrt(H/rho_min)"
NUMBER = "14"

HYP_RHO = "Definition H.12: rho_i > 0 and sum rho = 1"
HYP_OWN_WEIGHT = "bound uses client i's own aggregation weight rho_i"
C_DEV = "Delta_i <= sqrt(H/rho_i)"
C_MIN = "Delta_i <= sqrt(H/rho_min)"
C_IMPL = "gamma > sqrt(H/rho_min)||d_bal|| + L0 B^2 tau eta implies eq 23"


@dataclass(frozen=True)
class Config:
    kappa_Q: float = 3.0  # F1 conditioning of each Q_j (the search box varies it)
    s_c: float = 1.0  # F1 centre spread (small with kappa_Q = 1: nearly collinear gradients)
    n_random: int = 1000
    n_clients: int = 5
    dim: int = 3
    rho_alpha: float = 0.5
    n_lp_clusters: int = 200
    spreads: tuple = (0.01, 0.05, 0.3, 1.0)
    m_choices: tuple = (2, 3, 4)
    n_w_max: int = 6
    radius: tuple = (0.05, 1.0)
    eta_factor: float = 0.01
    eps_mode: float = 0.0
    control_random: int = 1000

    @classmethod
    def paper(cls) -> Config:
        """The paper-scale preset (`--scale paper`): the samples the conclusions are counted over, larger."""
        return cls(n_random=4000, n_lp_clusters=800)


def _rho_ok(rho) -> tuple[bool, float]:
    try:
        check_aggregation_weights(rho)
    except ValueError:
        return False, float(np.min(rho))
    return True, float(np.min(rho))


def _random_set(rng, cfg: Config, n: int):
    d = rng.standard_normal((n, cfg.n_clients, cfg.dim))
    rho = rng.dirichlet(np.full(cfg.n_clients, cfg.rho_alpha), size=n)
    return d, rho


SEARCH = SearchSpace(
    params=(Param("rho_alpha", 0.05, 20.0, "log"), Param("n_clients", 2, 8, "int"), Param("dim", 1, 6, "int"),
            Param("spread", 1e-3, 1.0, "log"), Param("m", 2, 12, "int", default=3),
            *F1_SHAPE),
    config=lambda p: Config(kappa_Q=p["kappa_Q"], s_c=p["s_c"], m_choices=(p["m"],), n_w_max=max(6, p["m"]), n_random=60, n_clients=p["n_clients"], dim=p["dim"], rho_alpha=p["rho_alpha"],
                            n_lp_clusters=10, spreads=(p["spread"],), control_random=10),
    family="random and LP-direction clusters: rho concentration, N, dimension, preference spread",
    excluded={LAMBDA_MIN: PLANTED_LAMBDA},
)


def run(config: Config | None, rng: np.random.Generator) -> Evidence:
    cfg = config or Config()
    N = cfg.n_clients
    rows = []
    # (a) random directions
    d_all, rho_all = _random_set(rng, cfg, cfg.n_random)
    for k in range(cfg.n_random):
        d, rho = d_all[k], rho_all[k]
        ok_rho, rmin = _rho_ok(rho)
        dev = deviations(d, rho) if ok_rho else np.full(N, np.nan)
        H = float(dispersion(d, rho)) if ok_rho else np.nan
        for i in range(N):
            rows.append(dict(set="random", cluster=k, client=i, rho_ok=ok_rho, rho_i=rho[i], rho_min=rmin,
                             dev=dev[i], H=H, implication_ok=True, cond14=False, rc23=False))
    # (b) EPO LP directions on F1 clusters
    lp_records = []
    for k in range(cfg.n_lp_clusters):
        spread = float(cfg.spreads[k % len(cfg.spreads)])
        m, n_w = cc.draw_dims(rng, cfg.m_choices, cfg.n_w_max)
        P = PlantedQuadraticCluster.make(rng, m, n_w, N, spread=spread, kappa_Q=cfg.kappa_Q, s_c=cfg.s_c)
        w0 = P.planted_client(P.u0)[1] + rng.uniform(*cfg.radius) * cc.unit_vectors(rng, 1, n_w)[0]
        rho = rng.dirichlet(np.full(N, cfg.rho_alpha))
        G = cc.cluster_grads(P, w0, N)
        lp = cc.client_lp(cc.cluster_losses_fn(P)(w0), P.prefs, G, eps_mode=cfg.eps_mode)
        ok_rho, rmin = _rho_ok(rho)
        dev = deviations(lp.d, rho) if ok_rho else np.full(N, np.nan)
        H = float(dispersion(lp.d, rho)) if ok_rho else np.nan
        L0 = float(smoothness_quadratic(P.hessians))
        B = float(gradient_bound(G))
        drift = L0 * B**2 * cfg.eta_factor / L0
        lp_records.append(dict(P=P, w0=w0, rho=rho, spread=spread))
        for i in range(N):
            scale = max(abs(lp.gamma[i]), 1e-300)
            cond14 = bool(lp.gamma[i] - np.sqrt(H / rmin) * lp.dbal_norm[i] - drift > POSITIVITY_RTOL * scale)
            rc23 = bool(lp.gamma[i] - dev[i] * lp.dbal_norm[i] - drift > POSITIVITY_RTOL * scale)
            rows.append(dict(set="lp", cluster=k, client=i, rho_ok=ok_rho and bool(lp.solved[i]), rho_i=rho[i],
                             rho_min=rmin, dev=dev[i], H=H, implication_ok=(not cond14) or rc23,
                             cond14=cond14, rc23=rc23))
    a = {key: np.array([r[key] for r in rows]) for key in rows[0]}
    n = len(rows)
    # rows 0..n-1: Delta_i <= sqrt(H/rho_i); n..2n-1: Delta_i <= sqrt(H/rho_min), the implication as their boolean
    mon = HypothesisMonitor(2 * n)
    mon.record(HYP_RHO, np.tile(a["rho_ok"], 2), margin=np.tile(a["rho_min"], 2))
    lhs = a["dev"]
    rhs = np.sqrt(a["H"] / a["rho_i"])
    rhs_min = np.sqrt(a["H"] / a["rho_min"])
    ok = np.concatenate([np.ones(n, dtype=bool), a["implication_ok"]])
    held = mon.mask[:n]

    def data(i):
        i = i % n
        rec = {key: a[key][i] for key in a}
        if a["set"][i] == "random":
            k = int(a["cluster"][i])
            rec.update(directions=d_all[k], rho=rho_all[k])
        else:
            r = lp_records[int(a["cluster"][i])]
            rec.update(w0=r["w0"], rho=r["rho"], spread=r["spread"], eps_mode=cfg.eps_mode,
                       **cc.problem_record(r["P"]))
        return rec

    pos = held & (rhs_min > 0)
    details = {
        "sets": {"random": f"{cfg.n_random} clusters, N={N}, R^{cfg.dim}, rho ~ Dirichlet({cfg.rho_alpha})",
                 "lp": f"{cfg.n_lp_clusters} F1 clusters, EPO LP directions, rho ~ Dirichlet({cfg.rho_alpha})"},
        "tightness_rho_min": float(np.max(lhs[pos] / rhs_min[pos])) if pos.any() else None,
        "tightness_by_set": {s: float(np.max(lhs[m] / rhs[m]))
                             for s in ("random", "lp") for m in [held & (a["set"] == s) & (rhs > 0)]},
        "sufficient_condition_held": int((a["cond14"] & held).sum()),
        "eq23_held_lp_clients": int((a["rc23"] & held).sum()),
        "constants": {"L0": "max_j ||Q_j|| (exact)", "B": "max gradient norm at w0", "tau": 1,
                      "eta": f"{cfg.eta_factor}/L0"},
    }
    return Evidence.from_implication(
        STATEMENT_ID, NAME, mon, np.concatenate([lhs, lhs]), np.concatenate([rhs, rhs_min]), ok=ok,
        instance_data=data, details=details, conclusion=np.array([C_DEV] * n + [C_MIN] * n, dtype=object),
        ok_conclusion=np.array([None] * n + [C_IMPL] * n, dtype=object))


def negative_control(config: Config | None, rng: np.random.Generator) -> Evidence:
    """``max_i Δ_i ≤ √H`` (the bound with weight 1 instead of ρ_i): flagged and violated."""
    cfg = config or Config()
    d_all, rho_all = _random_set(rng, cfg, cfg.control_random)
    n = cfg.control_random
    mon = HypothesisMonitor(n)
    lhs = np.empty(n)
    rhs = np.empty(n)
    w_used = np.ones(n)  # the weight the modified bound uses
    own = np.empty(n)
    for k in range(n):
        dev = deviations(d_all[k], rho_all[k])
        i = int(np.argmax(dev))
        lhs[k] = dev[i]
        rhs[k] = np.sqrt(float(dispersion(d_all[k], rho_all[k])) / w_used[k])
        own[k] = rho_all[k][i]
    mon.record(HYP_RHO, np.ones(n, bool))
    mon.record(HYP_OWN_WEIGHT, np.abs(w_used - own) <= 1e-15, margin=-np.abs(w_used - own))

    def data(k):
        return {"directions": d_all[k], "rho": rho_all[k], "weight_used": w_used[k]}

    return Evidence.from_control(
        STATEMENT_ID, NAME, mon, HYP_OWN_WEIGHT, lhs, rhs, instance_data=data, conclusion=C_DEV,
        details={"setting": f"{n} random clusters, bound sqrt(H) (factor 1/rho dropped)"},
    )
