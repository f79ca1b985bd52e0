r"""Theorem H.31 — convergence of the shared iteration to the band (docs/spec/statements.md#t-h31,
docs/spec/statements.md#t-h28, docs/spec/statements.md#t-h29, docs/spec/statements.md#t-cor-c,
docs/spec/open-points.md#o-8, docs/spec/open-points.md#o-26).

Setting
    The shared iteration eq 55 ``w^{t+1} = w^t − η d̄^t`` on a cluster ``C_n`` (one EPO LP step per client and
    round), ``r_i^t = ψ_i(w^t) − ψ_i*``, ray points ``q_i* = ψ_i* λ_i^{-1}``, ``λ_min,i = min_j λ_ij``, the band
    radius (eq 64) ``ε_{0,i} = (λ_max,i/c_d)(BΔ̄_i + L₀B²η/2) + b_i/c_d`` and ``q = 1 − ηc_d``.

Hypotheses
    H.1–H.3 and H.19 (``c_d``, ``b_i``) with ``0 < η ≤ 1/c_d``; (eq 71) for all ``t ≥ t0`` and ``i``:
    ``w^t ∈ 𝒩``, ``β_i(w^t) ≤ β̄``, ``Δ_i^t ≤ Δ̄_i``; every segment ``[w^t, w^{t+1}]`` in the H.1–H.3 region.

Guarantee
    1. ``r_i^T ≤ q^{T−t0} r_i^{t0} + ε_{0,i}`` for all ``T ≥ t0``.
    2. (eq 72) ``limsup r_i^T ≤ ε_{0,i}`` and ``limsup l_ij(w^T) ≤ q*_ij + ε_{0,i}/λ_min,i``; a limit point lies in
       ``𝒜^∞ = ⋂_i {w : l_i(w) ≤ q_i* + (ε_{0,i}/λ_min,i)1}``.
    3. (eq 73) under H.34 (``ψ_i − ψ_i* ≥ (μ/2)‖w − w_i*‖²`` near ``w_i*``), a limit point ``w*`` in that
       neighbourhood satisfies ``‖w* − w_i*‖² ≤ (2/μ)ε_{0,i}``.

What is checked
    The T-H31 runs shared with H.28/H.29 (F1, ``N = 3``, ``s_u ∈ {0, 0.02, 0.1}``, ``η ∈ {0.01, 0.03, 0.1}/L₀``,
    ``T = 400``, ``t0 = 50``; :func:`sim.algorithm.shared_iteration`). The verdict uses the **iterate constants**
    (``(c_d, b_i)`` by :func:`sim.constants.descent_margin_constants` on ``t ≥ t0``: the implication chain, O-8),
    plus ``n_sweep`` other grid values of ``c_d`` with their ``b_i(c_d)`` for item 1; the region constants (O-8)
    are reported with the iterates that violate them. Limits are not observable, so items 2–3 use the
    finite-horizon forms (O-26), valid by the same argument:

    * item 1 at every ``t0 < T ≤ T_end`` (hypotheses required at every step of ``[t0, T)``);
    * item 2 componentwise on the last ``n_tail`` rounds: ``l_ij(w^T) − q*_ij ≤ (q^{T−t0} r_i^{t0} + ε_{0,i})/λ_min,i``
      (the final iterate against ``𝒜^∞`` inflated by the remaining transient);
    * item 3 at the final iterate with the exact F1 quadratic-growth constant ``μ_i = min_j λ_ij λ_min(Q_j)``
      (:func:`sim.constants.quadratic_growth`; ``ψ_i`` is ``μ_i``-strongly convex, so H.34 holds globally — the
      monitor still checks the QG inequality at ``w^T``):
      ``‖w^T − w_i*‖² ≤ (2/μ_i)(q^{T−t0} r_i^{t0} + ε_{0,i})``.

    Reported: the tightness ``r_i^T/ε_{0,i}`` at the final round, the fraction of rounds outside the band, and how
    many runs select ``c_d = 1/η`` (``q = 0``: the band is reached in one step, O-22).

Negative control
    F4 double well (stuck at the spurious minimum, ``r_T ≈ 0.4998`` against ``ε_0 ≈ 0.060`` / ``0.018``; the QG
    constant ``l''(w*) ≈ 8.7`` of the left well fails at the final iterate too) and F5 kink (contraction slower than
    the claimed ``1 − ηc_d`` inside ``|w| < 0.2``); the monitor flags ``w^t ∉ 𝒩`` and eq 51.

Reference
    docs/spec/statements.md#t-h31, docs/spec/statements.md#t-cor-c, docs/spec/iteration.md#iteration,
    docs/spec/open-points.md#o-8, docs/spec/open-points.md#o-22, docs/spec/open-points.md#o-26.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.constants import quadratic_growth
from verification.statements import _chains as ch
from verification.statements import _one_dim_chains as od
from verification.statements import _trajectory_rows as trows

STATEMENT_ID = "H.31"
NAME = "Convergence of the shared iteration to the band eps_{0,i} (items 1-3, eq 72-73)"
NUMBER = "31"

STEP_NAMES = (ch.H_POS, ch.H_GRAD, ch.H_DBAR, ch.H_LP, ch.H_H19, ch.H_BETA, ch.H_DEV, ch.H_STEP)


@dataclass(frozen=True)
class Config(ch.ChainConfig):
    n_sweep: int = 6
    n_tail: int = 50

    @classmethod
    def paper(cls) -> Config:
        return cls(n_runs=40)


def _window(run: ch.ChainRun, cs: ch.ConstantSet) -> dict:
    hs = ch.step_hypotheses(run, cs)
    return ch.window_hypotheses({h: hs[h] for h in STEP_NAMES + (ch.H_REGION,) if h in hs}, run.t0)


def item1_rows(rows: trows.RowSet, run: ch.ChainRun, k: int, cs: ch.ConstantSet, eps0=None, label: str = "") -> None:
    """Item 1 (``r_i^T ≤ q^{T−t0} r_i^{t0} + ε_{0,i}``) at every ``t0 < T ≤ T_end`` with the constant set ``cs``
    (``eps0``: the band to use, default the set's ``ε_{0,i}``)."""
    pl, T, N, t0 = run.pl, run.T, run.N, run.t0
    win = _window(run, cs)
    eps0 = np.asarray(cs.eps0 if eps0 is None else eps0)
    Ts = np.arange(t0 + 1, T + 1)
    qT = cs.q(run.eta) ** (Ts - t0)
    rhs = qT[:, None] * pl.gap[t0][None] + eps0[None]
    rows.add(f"item 1 ({label or cs.label})", pl.gap[t0 + 1:], rhs, hyps=win,
             info={"run": k, "T": np.broadcast_to(Ts[:, None], rhs.shape),
                   "client": np.broadcast_to(np.arange(N)[None], rhs.shape)},
             repro=dict(ch.set_repro(run, k, cs), eps0_used=eps0))


def item2_rows(rows: trows.RowSet, run: ch.ChainRun, k: int, cs: ch.ConstantSet, n_tail: int, eps0=None,
               label: str = "") -> None:
    """Eq 72 componentwise on the last ``n_tail`` rounds (finite-horizon form of the limsup, O-26)."""
    P, pl, T, N, t0 = run.problem, run.pl, run.T, run.N, run.t0
    win = _window(run, cs)
    eps0 = np.asarray(cs.eps0 if eps0 is None else eps0)
    sel = np.arange(max(t0 + 1, T - n_tail + 1), T + 1)
    qstar = P.psi_star[:, None] / P.prefs  # (N, m)
    lhs = pl.losses[sel, 0][:, None, :] - qstar[None]  # common objectives (H.5)
    trans = (cs.q(run.eta) ** (sel - t0))[:, None] * pl.gap[t0][None] + eps0[None]
    rhs = np.broadcast_to((trans / run.lam_min[None])[..., None], lhs.shape)
    m = lhs.shape[-1]
    rows.add(f"eq 72 componentwise, last rounds ({label or cs.label})", lhs, rhs,
             hyps={h: np.repeat(v[sel - t0 - 1], m, axis=1) for h, v in win.items()},
             info={"run": k, "T": np.broadcast_to(sel[:, None, None], lhs.shape),
                   "client": np.broadcast_to(np.arange(N)[None, :, None], lhs.shape),
                   "j": np.broadcast_to(np.arange(m)[None, None], lhs.shape)},
             repro=dict(ch.set_repro(run, k, cs), eps0_used=eps0))


def item3_rows(rows: trows.RowSet, run: ch.ChainRun, k: int, cs: ch.ConstantSet) -> np.ndarray:
    """Eq 73 at the final iterate with the exact F1 quadratic-growth constants; returns ``μ_i``."""
    P, pl, T, N, t0 = run.problem, run.pl, run.T, run.N, run.t0
    mu = quadratic_growth(P.prefs, P.hessians)
    win = _window(run, cs)
    dist2 = np.sum((run.traj[-1][None] - P.w_star) ** 2, axis=1)
    r_T = pl.gap[-1]
    hyps = {h: v[-1] for h, v in win.items()}
    hyps[od.H_QG] = r_T - 0.5 * mu * dist2 + 1e-12
    rhs = (2.0 / mu) * (cs.q(run.eta) ** (T - t0) * pl.gap[t0] + np.asarray(cs.eps0))
    rows.add(f"eq 73 final iterate ({cs.label})", dist2, rhs, hyps=hyps,
             info={"run": k, "T": T, "client": np.arange(N), "mu": mu}, repro=dict(ch.set_repro(run, k, cs), mu=mu))
    return mu


SEARCH = ch.chain_search(Config, n_sweep=2, n_tail=20)

#: Found by the paper-scale falsification search (seed 0): eq 72 componentwise within 0.98 of its bound, eq 73 at
#: the final iterate within 0.55.
TIGHT_POINTS = ({"spread": 0.2786, "eta_factor": 0.0044, "start_noise": 0.5626, "m": 2, "n_w": 6, "n_clients": 4},
                {"spread": 0.3481, "eta_factor": 0.0038, "start_noise": 0.8529, "m": 2, "n_w": 4, "n_clients": 3})
# eq 73's best point in the stored falsification search (verification/data/search/H.31.json, 2026-12-02, rounded
# to 4 digits); each tight point runs at TIGHT_SEEDS seeds (registry.tight_point_seed).
TIGHT_POINTS += ({"spread": 0.01351, "eta_factor": 0.003719, "start_noise": 0.2914, "m": 2, "n_w": 7,
                  "n_clients": 2, "kappa_Q": 10.19, "s_c": 0.007578},)
TIGHT_SEEDS = 10

REASONS = {
    "eq 73 final iterate": (
        "a halved eq 73 is detected on single draws only: 10 seeds at each of the three tight points "
        "(registry.tight_point_seed) add few final iterates above 0.5 (the count is the row's detecting "
        "instances), and the default family's final iterates end far inside the bound (its factor is shown)"),
}


def run(config: Config | None, rng: np.random.Generator):
    cfg = config or Config()
    runs = ch.f1_chains(cfg, rng)
    rows = trows.RowSet()
    per_run = []
    for k, rn in enumerate(runs):
        for cs in rn.constant_sets() + ch.sweep_constants(rn, cfg.n_sweep):
            item1_rows(rows, rn, k, cs)
        for cs in rn.constant_sets():
            item2_rows(rows, rn, k, cs, cfg.n_tail)
            mu = item3_rows(rows, rn, k, cs)
        per_run.append({**rn.summary(), "mu_qg": mu, "final_r_over_eps0": rn.gap[-1] / rn.eps0,
                        "fraction_rounds_outside_band": float((rn.gap[rn.t0:] > rn.eps0[None]).mean()),
                        "final_transient_over_eps0": float(np.max(rn.q ** (rn.T - rn.t0) * rn.gap[rn.t0] / rn.eps0))})
    ratios = np.concatenate([np.asarray(p["final_r_over_eps0"]) for p in per_run])
    details = dict(
        verdict_constants="held-out constants (c_d, b_i, Delta_bar, beta_bar) on the iterates t >= t0 of a companion "
                          "run (same problem and eta, another start), on [c_min, 1/eta] and on [c_min, 1/(2 eta)]; "
                          "c_d sweep rows use other grid values; in-sample and region constants reported (per_run)",
        method=("shared iteration sim.algorithm.shared_iteration on F1; L0 = max_j ||Q_j|| (exact); B = max gradient "
                "norm over the iterates (exact on segments by convexity); (c_d, b_i) by "
                "sim.constants.descent_margin_constants on the held-out companion run's t >= t0; mu_i = sim.constants.quadratic_growth (exact)"),
        band_tightness_final_r_over_eps0=trows.summary(ratios),
        fraction_rounds_outside_band=trows.summary([p["fraction_rounds_outside_band"] for p in per_run]),
        runs_with_eta_c_d_equal_1=int(sum(abs(r.eta * r.c_d - 1.0) < 1e-9 for r in runs)),
        runs_with_eta_c_d_at_most_half=int(sum(r.eta * r.consts_half.c_d <= 0.5 + 1e-12 for r in runs)),
        iterates_violating_region_constants=int(sum(p["iterates_violating_region_constants"] for p in per_run)),
        per_run=per_run,
    )
    return rows.evidence(STATEMENT_ID, NAME, details)


def negative_control(config: Config | None, rng: np.random.Generator):
    cfg = config or Config()
    return od.one_dim_control(STATEMENT_ID, NAME, cfg, {"H.31 item 1", "eq 72", "eq 73"}, tail=cfg.n_tail)
