r"""H.22 — Lemma (preference-heterogeneity floor): where the range condition fails, ``β_i`` is small.

Setting
    A cluster ``C_n`` under H.1–H.3 (``L₀``-smooth, ``‖g‖ ≤ B``), ``τ`` local steps of size ``η``, EPO LP directions
    ``d_i``, shared direction ``d̄ = Σ_i ρ_i d_i``, deviation ``Δ_i = ‖d̄ − d_i‖``, balancing direction
    ``d_bal,i = G_i A_i`` and gain ``γ_i* = d_iᵀd_bal,i``.

Hypotheses
    * H.17 at ``w`` (eq 49): ``γ_i* ≥ κ_β β_i`` and ``‖d_bal,i‖ ≤ L_A √β_i`` with ``κ_β > 0``;
    * ``i ∈ C_n^+`` (balancing mode, ``β_i > 0``);
    * eq 52 — the range condition eq 23 **fails** at ``w``: ``γ_i* ≤ Δ_i ‖d_bal,i‖ + L₀B²τη``.

Guarantee (eq 53)
    ``β_i ≤ β̄_i := ( [L_AΔ_i + √(L_A²Δ_i² + 4κ_β L₀B²τη)] / (2κ_β) )² ≤ 2L_A²Δ_i²/κ_β² + 2L₀B²τη/κ_β``.
    (Proof: with ``x = √β_i``, ``κ_β x² ≤ γ ≤ Δ L_A x + L₀B²τη``; solve the quadratic. The second inequality is
    ``(a + √(a² + 4c))² ≤ 4a² + 8c``.)

How it is checked (docs/spec/statements.md#t-h22)
    F1 clusters (docs/spec/problems.md#families uniform), points ``w = w*(u_0) + s ξ`` with
    ``s ~ Unif(0.005, 0.3)`` and ``ξ ~ N(0, I)``, ``η = 0.05/L₀``, ``τ = 1``, ``ε_mode = 1e-10``.
    ``L₀ = max_j ‖Q_j‖`` is exact. ``B`` (``B_mode``): ``"pointwise"`` (default) takes at each point the smallest
    valid gradient bound *at the current point*, ``B(w) = max_{i,j} ‖g_i^{(j)}(w)‖`` (the reading of H.1–H.3 in
    Lemma H.25); ``"ball"`` takes the exact F1 bound on the ball ``B(w*(u_0), 0.3)``. Eq 53 holds for every valid
    ``B``, and the smallest one gives the smallest floor, i.e. the most stringent check (with the ball bound the
    drift ``L₀B²τη`` dominates and eq 52 holds at every point); the ball is the smallest one around ``w*(u_0)``
    that contains both samples.
    The H.17 constants are estimated by :func:`sim.constants.regularity_constants` (``κ_β = min γ/β``,
    ``L_A = max ‖d_bal‖/√β`` over balancing points) on an **estimation** sample, never tuned; a problem with
    ``κ_β ≤ 0`` fails H.17 (docs/spec/observations.md#observations: 4/40) and all its rows are excluded. The
    lemma is checked on an **independent check** sample of the same law, where H.17 is *monitored* at each
    point with those constants (points where the sampled constants do not hold are excluded and counted).
    Given the hypotheses at a point, eq 53 is an implication at that point (the quadratic inequality above):
    the check tests the reconstructed eq 53 and the computation of ``γ``, ``β``, ``d_bal``, ``Δ``; it fails if
    the floor formula is wrong.

    Rows: ``floor`` (conclusion ``β_i ≤ β̄_i``; tightness ``β/β̄``) and ``simplified`` (``β̄_i ≤
    2L_A²Δ²/κ_β² + 2L₀B²τη/κ_β``), both under all hypotheses.

Negative control (T-H22(e))
    The same check sample with ``κ_β`` doubled (H.17's lower bound is then violated at many points, which the
    monitor flags): the floor ``β ≤ β̄(2κ_β)`` fails at some flagged points
    (docs/spec/observations.md#observations: 270 of 29400).

Reference: docs/spec/statements.md#t-h22, docs/spec/statements.md#t-h17, docs/spec/constants.md#constants,
docs/spec/observations.md#obs-13.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.constants import regularity_constants
from sim.problems import PlantedQuadraticCluster
from verification.core.evidence import Evidence, HypothesisMonitor
from verification.core.search import F1_SHAPE, LAMBDA_MIN, PLANTED_LAMBDA, Param, SearchSpace
from verification.statements._regularity_helpers import (
    SOLVED_STATUSES,
    cluster_quantities,
    gaussian_offsets,
    summary,
)

STATEMENT_ID = "H.22"
NAME = "Preference-heterogeneity floor: failing range condition implies beta_i <= beta_bar_i (eq 52-53)"

C_FLOOR = "eq 53: beta_i <= beta_bar_i"
C_SIMPLE = "eq 53 simplified: beta_bar_i <= 2 L_A^2 Delta^2/kappa^2 + 2 L0 B^2 tau eta/kappa"
H_KAPPA = "kappa_beta > 0 on the estimation sample (H.17 holds there)"
H_BAL = "i in C_n^+ (balancing mode, beta_i > eps_mode)"
H_LOWER = "H.17 lower: gamma_i >= kappa_beta beta_i"
H_UPPER = "H.17 upper: ||d_bal,i|| <= L_A sqrt(beta_i)"
H_EQ52 = "eq 52: gamma_i <= Delta_i ||d_bal,i|| + L0 B^2 tau eta (range condition fails)"
H_GRAD = "H.1-H.3 gradient bound: ||g_j(w)|| <= B"


@dataclass(frozen=True)
class Config:
    kappa_Q: float = 3.0  # F1 conditioning of each Q_j (the search box varies it)
    s_c: float = 1.0  # F1 centre spread (small with kappa_Q = 1: nearly collinear gradients)
    n_problems: int = 40
    m: int = 3
    n_w: int = 4
    n_clients: int = 3
    spread: float = 0.2
    n_points: int = 300
    radius: tuple = (0.005, 0.3)
    eta_factor: float = 0.05  # η = factor / L₀
    tau: int = 1
    B_mode: str = "pointwise"  # or "ball"
    eps_mode: float = 1e-10
    control_kappa_factor: float = 2.0

    @classmethod
    def paper(cls) -> Config:
        """The paper-scale preset (`--scale paper`): the samples the conclusions are counted over, larger."""
        return cls(n_problems=160)


def beta_floor(kappa, L_A, Delta, drift):
    """``β̄ = ((L_AΔ + √(L_A²Δ² + 4κ_β·drift)) / (2κ_β))²`` with ``drift = L₀B²τη`` (eq 53)."""
    a = L_A * Delta
    return ((a + np.sqrt(a * a + 4.0 * kappa * drift)) / (2.0 * kappa)) ** 2


def _problem(cfg: Config, rng: np.random.Generator, k: int) -> dict:
    P = PlantedQuadraticCluster.make(rng, m=cfg.m, n_w=cfg.n_w, n_clients=cfg.n_clients, spread=cfg.spread, kappa_Q=cfg.kappa_Q, s_c=cfg.s_c)
    center = P.planted_client(P.u0)[1]  # w*(u_0)
    L0 = P.L0
    eta = cfg.eta_factor / L0
    est = gaussian_offsets(rng, center, cfg.radius[0], cfg.radius[1], cfg.n_points)
    chk = gaussian_offsets(rng, center, cfg.radius[0], cfg.radius[1], cfg.n_points)
    B_ball = P.gradient_bound(center, float(np.linalg.norm(np.vstack([est, chk]) - center, axis=1).max()))
    qa = cluster_quantities(P, est, eta=eta, B=B_ball, eps_mode=cfg.eps_mode)
    qb = cluster_quantities(P, chk, eta=eta, B=B_ball, eps_mode=cfg.eps_mode)
    sel = (qa.mode == "balance") & np.isin(qa.status, SOLVED_STATUSES)
    rc = regularity_constants(qa.gain[sel], qa.beta[sel], qa.dbal_norm[sel], beta_min=cfg.eps_mode)
    T, N = qb.beta.shape
    gnorm = np.linalg.norm(qb.grads, axis=1).max(axis=1)
    if cfg.B_mode == "pointwise":
        B = np.repeat(gnorm, N)
    elif cfg.B_mode == "ball":
        B = np.full(T * N, B_ball)
    else:
        raise ValueError(f"B_mode must be 'pointwise' or 'ball'; got {cfg.B_mode!r}")
    drift = L0 * B * B * cfg.tau * eta
    return dict(
        problem=k, L0=L0, eta=eta, B=B, B_ball=B_ball, drift=drift, kappa_beta=rc.kappa_beta, L_A=rc.L_A,
        n_estimation_points=rc.n_points,
        beta=qb.beta.ravel(), gain=qb.gain.ravel(), dbal=qb.dbal_norm.ravel(), Delta=qb.deviation.ravel(),
        balance=(qb.mode == "balance").ravel(), solved=np.isin(qb.status, SOLVED_STATUSES).ravel(),
        gnorm=np.repeat(gnorm, N), client=np.tile(np.arange(N), T), point=np.repeat(np.arange(T), N),
    )


def _collect(cfg: Config, rng: np.random.Generator) -> tuple[list[dict], dict]:
    probs = [_problem(cfg, rng, k) for k in range(cfg.n_problems)]
    keys = ("beta", "gain", "dbal", "Delta", "balance", "solved", "gnorm", "client", "point", "B", "drift")
    flat = {k: np.concatenate([p[k] for p in probs]) for k in keys}
    for k in ("problem", "kappa_beta", "L_A", "B_ball"):
        flat[k] = np.concatenate([np.full(p["beta"].size, p[k]) for p in probs])
    return probs, flat


def _monitor(flat: dict, kappa: np.ndarray, cfg: Config, rows: int) -> HypothesisMonitor:
    """Hypotheses of every row (the point data is tiled ``rows`` times: one copy per conclusion row)."""
    t = lambda x: np.tile(x, rows)  # noqa: E731
    mon = HypothesisMonitor(flat["beta"].size * rows)
    mon.require_positive(H_KAPPA, t(kappa))
    mon.require_positive(H_BAL, t(flat["beta"]) - cfg.eps_mode, rtol=0.0)
    mon.record(H_BAL, t(flat["balance"]).astype(bool))
    mon.require_inequality(H_LOWER, t(kappa * flat["beta"]), t(flat["gain"]))
    mon.require_inequality(H_UPPER, t(flat["dbal"]), t(flat["L_A"] * np.sqrt(flat["beta"])))
    mon.require_inequality(H_EQ52, t(flat["gain"]), t(flat["Delta"] * flat["dbal"] + flat["drift"]))
    mon.require_inequality(H_GRAD, t(flat["gnorm"]), t(flat["B"]))
    mon.exclude("LP without solution", ~t(flat["solved"]).astype(bool))
    return mon


def _floors(flat: dict, kappa: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    safe = np.where(kappa > 0, kappa, np.nan)
    bbar = beta_floor(safe, flat["L_A"], flat["Delta"], flat["drift"])
    simple = 2.0 * flat["L_A"] ** 2 * flat["Delta"] ** 2 / safe**2 + 2.0 * flat["drift"] / safe
    return bbar, simple


SEARCH = SearchSpace(
    params=(Param("spread", 1e-3, 1.0, "log"), Param("eta_factor", 1e-3, 0.5, "log"),
            Param("radius_hi", 0.01, 1.0, "log"), Param("m", 2, 12, "int"), Param("n_w", 2, 12, "int"),
            Param("n_clients", 2, 5, "int"), *F1_SHAPE),
    config=lambda p: Config(kappa_Q=p["kappa_Q"], s_c=p["s_c"], n_problems=3, m=p["m"], n_w=max(p["n_w"], p["m"]), n_clients=p["n_clients"],
                            spread=p["spread"], n_points=80, radius=(0.005 * p["radius_hi"] / 0.3, p["radius_hi"]),
                            eta_factor=p["eta_factor"]),
    family="F1 clusters around w*(u_0): preference spread, step size (drift), radius, m, n_w, N",
    excluded={LAMBDA_MIN: PLANTED_LAMBDA},
)


def run(config: Config | None, rng: np.random.Generator) -> Evidence:
    cfg = config or Config()
    probs, flat = _collect(cfg, rng)
    kappa = flat["kappa_beta"]
    bbar, simple = _floors(flat, kappa)
    mon = _monitor(flat, kappa, cfg, rows=2)
    lhs = np.concatenate([flat["beta"], bbar])
    rhs = np.concatenate([bbar, simple])
    n = flat["beta"].size
    kind = np.array(["floor"] * n + ["simplified"] * n)
    held = mon.mask[:n]
    ratio = flat["beta"][held] / bbar[held]
    details = {
        "method": ("kappa_beta, L_A by sim.constants.regularity_constants on an estimation sample (balancing points); "
                   "H.17 monitored pointwise on an independent check sample; L0 exact; B per B_mode"),
        "B_mode": cfg.B_mode,
        "per_problem": [{k: p[k] for k in ("problem", "L0", "eta", "B_ball", "kappa_beta", "L_A",
                                           "n_estimation_points")} for p in probs],
        "drift_L0_B2_tau_eta": summary(flat["drift"]),
        "problems_with_kappa_nonpositive": int(sum(p["kappa_beta"] <= 0 for p in probs)),
        "kappa_beta": summary([p["kappa_beta"] for p in probs]),
        "L_A": summary([p["L_A"] for p in probs]),
        "points_checked_floor": int(held.sum()),
        "eq52_points": int((~mon.failed(H_EQ52)[:n]).sum()),
        "beta_over_beta_bar": summary(ratio),
        "beta_bar_over_simplified_bound": summary(bbar[held] / simple[held]),
        "tightness": "max beta/beta_bar over the floor rows",
    }
    return Evidence.from_implication(
        STATEMENT_ID, NAME, mon, lhs, rhs, tightness=float(ratio.max()) if ratio.size else None,
        conclusion=np.where(kind == "floor", C_FLOOR, C_SIMPLE),
        instance_data={"kind": kind, "problem": np.tile(flat["problem"], 2), "point": np.tile(flat["point"], 2),
                       "client": np.tile(flat["client"], 2), "beta": np.tile(flat["beta"], 2),
                       "gamma": np.tile(flat["gain"], 2), "Delta": np.tile(flat["Delta"], 2),
                       "dbal": np.tile(flat["dbal"], 2), "kappa_beta": np.tile(kappa, 2),
                       "L_A": np.tile(flat["L_A"], 2), "drift": np.tile(flat["drift"], 2)},
        details=details,
    )


def negative_control(config: Config | None, rng: np.random.Generator) -> Evidence:
    cfg = config or Config()
    probs, flat = _collect(cfg, rng)
    kappa = cfg.control_kappa_factor * flat["kappa_beta"]
    bbar, _ = _floors(flat, kappa)
    mon = _monitor(flat, kappa, cfg, rows=1)
    # the broken hypothesis is H.17's lower bound with the overestimated κ_β; the other hypotheses must hold
    others_ok = np.ones(flat["beta"].size, dtype=bool)
    for h in (H_KAPPA, H_BAL, H_UPPER, H_EQ52, H_GRAD):
        others_ok &= mon.held(h)
    mon.record("other hypotheses of H.22 hold (control isolates H.17 lower)", others_ok)
    mon.exclude("LP without solution", ~flat["solved"].astype(bool))
    lhs = np.where(others_ok, flat["beta"], 0.0)
    rhs = np.where(others_ok, bbar, 1.0)
    return Evidence.from_control(
        STATEMENT_ID, NAME, mon, H_LOWER, lhs, rhs, conclusion=C_FLOOR,
        instance_data={"problem": flat["problem"], "point": flat["point"], "client": flat["client"],
                       "beta": flat["beta"], "gamma": flat["gain"], "kappa_beta": kappa},
        details={"kappa_factor": cfg.control_kappa_factor},
    )
