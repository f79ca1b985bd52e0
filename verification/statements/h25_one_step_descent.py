r"""Lemma H.25 — one-step descent for any bounded direction (docs/spec/statements.md#t-h25).

Setting
    Clients ``i`` with objectives ``l_i^{(j)}`` and preferences ``λ_i`` in the open simplex; ``ψ_i = max_j λ_ij l_ij``;
    ``λ_max,i = ‖λ_i‖_∞``. A point ``w``, a direction ``d̄`` and a step ``η > 0``.

Hypotheses
    * ``‖d̄‖ ≤ B``;
    * H.1–H.3 on the segment ``{w − s d̄ : s ∈ [0, η]}``: losses ``> 0``, every ``l_ij`` ``L₀``-smooth along it, and
      ``‖g_ij(w)‖ ≤ B`` at the current point;
    * the near-active set (eq 57) ``J*_{i,ε}(w) = {j : λ_ij l_ij(w) ≥ ψ_i(w) − ε_act}`` has width
      ``ε_act = 2 η λ_max,i B²``.

Guarantee
    * (eq 56) ``l_ij(w − ηd̄) ≤ l_ij(w) − η d̄ᵀg_ij(w) + (L₀B²/2)η²`` for every ``i, j``;
    * (eq 58) ``ψ_i(w − ηd̄) ≤ ψ_i(w) − η min_{j ∈ J*_{i,ε}(w)} λ_ij d̄ᵀg_ij(w) + λ_max,i L₀B²η²/2``.

What is checked
    Both inequalities, written as changes (``lhs = l_ij(w−ηd̄) − l_ij(w)``, ``rhs = −ηd̄ᵀg_ij + L₀B²η²/2``; the same
    for ``ψ_i``), on

    1. the F1 shared-iteration trajectories of T-H31 (``d̄ = d̄^t``, ``w = w^t``, ``w − ηd̄ = w^{t+1}``; every step
       ``t = 0..T−1``, every objective and client; ``L₀ = max_j‖Q_j‖`` exact, ``B`` = largest gradient norm over
       the run's iterates, valid on every segment because ``w ↦ ‖Q_j(w − c_j)‖`` is convex);
    2. ``n_random`` one-step instances: an F1 problem (``m ∈ {2,3,4}``, ``n_w ∈ {m..6}``), ``λ`` planted (half:
       the point is near the ray point, many near-active objectives) or random interior (half),
       ``w = w* + r ξ/√n_w`` (``r ~ Unif(0.01, 1)``), ``d̄ = Gμ`` with ``μ ~ Dirichlet(1)`` (a random convex
       combination of the gradients, so ``‖d̄‖ ≤ max_j‖g_j(w)‖``), ``η = 10^{Unif(−3,0)}/L₀``; ``B = max_j ‖g_j(w)‖``
       at the current point (the lemma's gradient bound; the smallest valid ``B``, hence the strongest check).

    The monitor records ``‖d̄‖ ≤ B``, ``‖g_ij(w)‖ ≤ B``, positivity at both ends of the segment (the losses are
    convex quadratics plus ``b_j > 0``: positive everywhere) and the width of ``J*_ε``.

Negative control
    The same instances with ``ε_act = 0`` (exact bottleneck set only): the width hypothesis is flagged, and eq 58
    fails where a non-bottleneck objective overtakes the bottleneck within one step. Also reported (not part
    of the detection): eq 56/58 without the ``η²`` term.

Reference
    docs/spec/statements.md#t-h25, docs/spec/near-active.md#near-active, docs/spec/identities.md#s10,
    docs/spec/observations.md#obs-8, docs/spec/observations.md#obs-17.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.constants import gradient_bound, smoothness_quadratic
from sim.hull import descent_margin, eps_act, near_active_set
from sim.preference import chebyshev
from sim.problems import PlantedQuadraticCluster
from verification.core.search import F1_SHAPE, LAMBDA_MIN, PLANTED_LAMBDA, Param, SearchSpace
from verification.statements import _chains as ch
from verification.statements import _trajectory_rows as trows

STATEMENT_ID = "H.25"
NAME = "One-step descent for any bounded direction (eq 56-58, near-active width eps_act = 2 eta lam_max B^2)"
NUMBER = "25"

H_WIDTH = "near-active width eps_act >= 2 eta lam_max B^2 (eq 57)"
H_DNORM = "||dbar|| <= B"
H_GCUR = "||g_ij(w)|| <= B at the current point"
H_POS1 = "H.1-H.3 positivity: losses > 0 at w and w - eta dbar"


@dataclass(frozen=True)
class Config(ch.ChainConfig):
    n_random: int = 3000
    m_choices: tuple = (2, 3, 4)
    n_w_max: int = 6
    radius: tuple = (0.01, 1.0)
    log10_eta_factor: tuple = (-3.0, 0.0)

    @classmethod
    def paper(cls) -> Config:
        return cls(n_runs=40, n_random=10000)


# ------------------------------------------------------------------------------------------------ instances


@ch.memo_rng
def _random_instances(rng: np.random.Generator, *, n, m_choices, n_w_max, radius, log10_eta_factor, kappa_Q=3.0,
                      s_c=1.0) -> list[dict]:
    out = []
    for k in range(n):
        m = int(m_choices[int(rng.integers(0, len(m_choices)))])
        n_w = int(rng.integers(m, max(m, n_w_max) + 1))
        P = PlantedQuadraticCluster.make(rng, m=m, n_w=n_w, n_clients=1, spread=0.0, kappa_Q=kappa_Q, s_c=s_c)
        planted = k % 2 == 0
        lam = P.prefs[0] if planted else 0.95 * rng.dirichlet(np.ones(m)) + 0.05 / m
        w = P.w_star[0] + rng.uniform(*radius) * rng.standard_normal(n_w) / np.sqrt(n_w)
        mu = rng.dirichlet(np.ones(m))
        L0 = float(smoothness_quadratic(P.hessians))
        eta = 10.0 ** rng.uniform(*log10_eta_factor) / L0
        G = P.grads(w)
        d = G @ mu
        out.append(dict(P=P, lam=lam, w=w, mu=mu, eta=eta, L0=L0, G=G, d=d, l0=P.losses(w), l1=P.losses(w - eta * d),
                        B=float(gradient_bound(G)), planted=planted))
    return out


def _blocks(cfg: Config, rng: np.random.Generator, *, zero_width: bool) -> tuple[trows.RowSet, dict]:
    rows = trows.RowSet()
    runs = ch.f1_chains(cfg, rng)
    inst = _random_instances(rng, n=cfg.n_random, m_choices=tuple(cfg.m_choices), n_w_max=cfg.n_w_max,
                            kappa_Q=cfg.kappa_Q, s_c=cfg.s_c,
                             radius=tuple(cfg.radius), log10_eta_factor=tuple(cfg.log10_eta_factor))
    no_eta2 = {"eq 56": 0, "eq 58": 0, "rows": 0}

    def eq58(l0, l1, G, d, lam, eta, B, L0):
        """Per client: (lhs, rhs, width margin, rhs without the η² term) of eq 58 at one or many points."""
        ea_req = eps_act(eta, lam, B)
        ea = np.zeros_like(ea_req) if zero_width else ea_req
        mask = near_active_set(l0, lam, ea)
        mbar = descent_margin(d, G, lam, mask)
        lhs = chebyshev(l1, lam) - chebyshev(l0, lam)
        quad = lam.max(axis=-1) * L0 * B**2 * eta**2 / 2
        return lhs, -eta * mbar + quad, ea - ea_req, -eta * mbar

    # --- trajectories
    for k, run in enumerate(runs):
        pl, T, N = run.pl, run.T, run.N
        l0, l1 = pl.losses[:-1, 0], pl.losses[1:, 0]  # common objectives (H.5): (T, m)
        G, d = pl.grads[:-1, 0], pl.dbar[:-1]
        gmax = pl.grad_norm[:-1, 0].max(axis=1)
        dn = np.linalg.norm(d, axis=1)
        minloss = np.minimum(l0.min(axis=1), l1.min(axis=1))
        repro = dict(source="f1_chain", run=k, **run.params, eta=run.eta, B=run.B, L0=run.L0)
        tt = np.arange(T)
        hyps = {H_DNORM: run.B - dn, H_GCUR: run.B - gmax, H_POS1: minloss}
        if not zero_width:
            dg = np.einsum("tw,twm->tm", d, G)
            lhs56 = l1 - l0
            rhs56 = -run.eta * dg + run.L0 * run.B**2 * run.eta**2 / 2
            m = l0.shape[1]
            rows.add("eq 56 (trajectories)", lhs56, rhs56,
                     hyps={h: np.repeat(v, m) for h, v in hyps.items()},
                     info={"run": k, "t": np.repeat(tt, m), "j": np.tile(np.arange(m), T)}, repro=repro)
            no_eta2["eq 56"] += int(np.sum(lhs56 > -run.eta * dg + 1e-12))
        lam = np.broadcast_to(run.problem.prefs[None], (T, N, run.problem.n_objectives))
        lb = np.broadcast_to(l0[:, None], lam.shape)
        lhs, rhs, wm, rhs_lin = eq58(lb, np.broadcast_to(l1[:, None], lam.shape),
                                     np.broadcast_to(G[:, None], (T, N) + G.shape[1:]),
                                     np.broadcast_to(d[:, None], (T, N, d.shape[1])), lam, run.eta, run.B, run.L0)
        rows.add("eq 58 (trajectories)", lhs, rhs,
                 hyps={**{h: np.repeat(v, N) for h, v in hyps.items()}, H_WIDTH: wm},
                 info={"run": k, "t": np.repeat(tt, N), "client": np.tile(np.arange(N), T)}, repro=repro)
        no_eta2["eq 58"] += int(np.sum(lhs > rhs_lin + 1e-12))
        no_eta2["rows"] += lhs.size

    # --- random one-step instances
    for k, x in enumerate(inst):
        P = x["P"]
        repro = dict(source="random one-step instance", index=k, centres=P.centres, hessians=P.hessians,
                     offsets=P.offsets, prefs=x["lam"], w=x["w"], mu=x["mu"], eta=x["eta"], B=x["B"], L0=x["L0"],
                     planted_prefs=x["planted"])
        hyps = {H_DNORM: x["B"] - float(np.linalg.norm(x["d"])), H_GCUR: x["B"] - float(gradient_bound(x["G"])),
                H_POS1: float(min(x["l0"].min(), x["l1"].min()))}
        if not zero_width:
            dg = x["d"] @ x["G"]
            rows.add("eq 56 (random)", x["l1"] - x["l0"], -x["eta"] * dg + x["L0"] * x["B"] ** 2 * x["eta"] ** 2 / 2,
                     hyps=hyps, info={"instance": k, "j": np.arange(P.n_objectives)}, repro=repro)
        lhs, rhs, wm, rhs_lin = eq58(x["l0"], x["l1"], x["G"], x["d"], x["lam"], x["eta"], x["B"], x["L0"])
        rows.add("eq 58 (random)", lhs, rhs, hyps={**hyps, H_WIDTH: wm}, info={"instance": k}, repro=repro)
        no_eta2["eq 58"] += int(lhs > rhs_lin + 1e-12)
        no_eta2["rows"] += 1
    meta = dict(
        n_runs=len(runs), n_random=len(inst),
        runs=[dict(spread=r.params["spread"], eta=r.eta, B=r.B, L0=r.L0, step_residual=r.step_residual)
              for r in runs],
        method=("trajectories: F1 shared iteration (sim.algorithm.shared_iteration), L0 = max_j ||Q_j|| "
                "(sim.constants.smoothness_quadratic, exact), B = max gradient norm over the run's iterates "
                "(sim.constants.gradient_bound; exact on segments by convexity of ||Q_j(w - c_j)||); random "
                "instances: B = max_j ||g_j(w)|| at the current point; both sides written as changes"),
        rows_violated_without_eta2_term=no_eta2,
    )
    return rows, meta


SEARCH = SearchSpace(
    params=(Param("spread", 1e-3, 0.3, "log"), Param("eta_factor", 1e-3, 0.5, "log"), Param("m", 2, 12, "int"),
            Param("n_w", 2, 12, "int"), Param("radius_hi", 0.01, 2.0, "log"), *F1_SHAPE),
    config=lambda p: Config(kappa_Q=p["kappa_Q"], s_c=p["s_c"], n_runs=1, m=p["m"], n_w=max(p["n_w"], p["m"]), spreads=(p["spread"],),
                            eta_factors=(p["eta_factor"],), rounds=40, t0=10, n_region=100, n_random=80,
                            m_choices=(p["m"],), radius=(0.01, p["radius_hi"])),
    family="F1 shared-iteration runs and random one-step instances: spread, step size, m, n_w, radius",
    excluded={LAMBDA_MIN: PLANTED_LAMBDA},
)


def run(config: Config | None, rng: np.random.Generator):
    cfg = config or Config()
    rows, meta = _blocks(cfg, rng, zero_width=False)
    return rows.evidence(STATEMENT_ID, NAME, meta)


def negative_control(config: Config | None, rng: np.random.Generator):
    cfg = config or Config()
    rows, meta = _blocks(cfg, rng, zero_width=True)
    meta["control"] = "eps_act = 0 (exact bottleneck set J* instead of J*_eps) in eq 58"
    return rows.control(STATEMENT_ID, NAME, H_WIDTH, meta)
