r"""Theorem H.28 — one-step bound and inflated admissibility (docs/spec/statements.md#t-h28,
docs/spec/statements.md#t-h29, docs/spec/statements.md#t-h31, docs/spec/statements.md#t-cor-c).

Setting
    A cluster ``C_n`` with aggregation weights ``ρ_i`` and the shared iteration (eq 55)
    ``w^{t+1} = w^t − η d̄^t``, ``d̄^t = Σ_i ρ_i d_i(w^t)`` (one EPO LP step per client and round);
    ``r_i^t = ψ_i(w^t) − ψ_i*``, ``Δ_i^t = ‖d̄^t − d_i(w^t)‖``, ``λ_max,i = ‖λ_i‖_∞``; admissible boxes
    ``A_i^t(ε) = {l : max_j λ_ij l_j ≤ ψ_i(w^t) + ε} = {l ≤ q_i^t + ελ_i^{-1}}``
    (docs/spec/iteration.md#iteration, docs/spec/open-points.md#o-10).

Hypotheses
    H.1–H.3 on the segment ``[w^t, w^{t+1}]`` (losses ``> 0``, ``L₀``-smooth, gradients bounded by ``B``) and
    ``‖d̄^t‖ ≤ B``; H.19 at ``w^t`` with constants ``c_d > 0``, ``b_i ≥ 0`` (eq 51:
    ``m_i(w^t) ≥ c_d r_i^t − b_i``, ``J*_ε`` of width ``ε_act = 2ηλ_max,i B²``); ``w^t ∈ 𝒩`` and
    ``β_i(w^t) ≤ β̄`` for every ``i``.

Guarantee
    * (eq 62) ``r_i^{t+1} ≤ (1 − ηc_d) r_i^t + η[λ_max,i(BΔ_i^t + L₀B²η/2) + b_i]``;
    * (eq 63) ``l_i(w^{t+1}) ∈ A_i^t(ε_{i,t})`` with ``ε_{i,t} = η[λ_max,i(BΔ_i^t + L₀B²η/2) + b_i − c_d r_i^t]_+``,
      i.e. ``ψ_i^{t+1} ≤ ψ_i^t + ε_{i,t}``; exact (``ε_{i,t} = 0``) whenever
      ``c_d r_i^t ≥ λ_max,i(BΔ_i^t + L₀B²η/2) + b_i``.

What is checked
    The T-H31 runs (:class:`._chains.ChainConfig`): F1 clusters (``N = 3``, ``s_u ∈ {0, 0.02, 0.1}``,
    uniform ``ρ``, ``η ∈ {0.01, 0.03, 0.1}/L₀``, ``w^0 = u_0ᵀ[c_j] + 0.5ξ``, ``T = 400``) through
    :func:`sim.algorithm.shared_iteration`. ``L₀ = max_j ‖Q_j‖`` (exact); ``B`` = largest gradient norm over the
    iterates (exact on every segment by convexity); ``(c_d, b_i)``:

    * **verdict constants — on the iterates** ``t ≥ t0 = 50`` (the implication chain, per the design and O-8):
      :func:`sim.constants.descent_margin_constants` (``c_d`` on a 200-point log grid of ``[1e-4, 1/η]``
      minimising ``max_i ε_{0,i}``; ``b_i = max(0, max_t(c_d r_i^t − m_i^t))``); ``β̄_i = max_{t≥t0} β_i^t``;
    * ``n_sweep`` further grid values of ``c_d`` with their ``b_i(c_d)`` (every one makes H.19 hold on the
      iterates, so eq 62 must hold for each; this guards against the selected ``c_d`` sitting at ``1/η``);
    * **region constants** (O-8, reported, not the verdict): the same procedure on an independent uniform sample
      of ``𝒩 = B(mean_i w_i*, R)`` with the exact ball bound ``B``; iterates violating them are counted.

    Eq 62 and eq 63 are checked at **every** step ``t = 0..T−1`` where the monitor says the hypotheses hold
    (H.19 at ``w^t`` is checked directly; steps before ``t0`` count where it happens to hold). Eq 63 is the
    literal box membership ``max_j λ_ij l_j(w^{t+1}) − ψ_i^t ≤ ε_{i,t}``, written as ``ψ_i^{t+1} − ψ_i^t ≤ ε_{i,t}``.
    A sanity row per run checks that the directions analysed (one batched LP over all iterates) reproduce the
    iteration's steps (relative error ``≤ 1e-10``; left out of the headline tightness).

Negative control
    H.18 examples through the same iteration: the F4 double well (``η ∈ {0.01, 0.003}``, ``w^0 = 1.2``; strict
    ``c_d ≈ 6.21`` estimated on the claimed region ``𝒩 = [−1.4, −0.6]``; ``B``, ``L₀`` on the visited interval) is
    stuck at the spurious minimum (``r ≈ 0.5``), where the monitor flags ``w^t ∉ 𝒩`` and eq 51 (margin ``≈ 0``,
    ``c_d r ≈ 3.1``) and eq 62 fails; the F5 kink (``η = 0.1``, strict ``c_d`` on ``{0.2 ≤ |w| ≤ 0.9}``, ``B = 1``,
    ``L₀ = 0``) contracts more slowly than ``1 − ηc_d`` once ``|w| < 0.2`` (flagged ``w ∉ 𝒩``; inside the
    ``ε_act`` band the margin is ``−d/2 < 0``). Both families must show the failure.

Reference
    docs/spec/statements.md#t-h28, docs/spec/iteration.md#iteration, docs/spec/statements.md#t-h31,
    docs/spec/identities.md#s11, docs/spec/open-points.md#o-8, docs/spec/open-points.md#o-10.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from verification.statements import _chains as ch
from verification.statements import _one_dim_chains as od
from verification.statements import _trajectory_rows as trows

STATEMENT_ID = "H.28"
NAME = "One-step bound (eq 62) and inflated admissibility l_i(w^{t+1}) in A_i^t(eps_{i,t}) (eq 63)"
NUMBER = "28"

_STEP_NAMES = (ch.H_POS, ch.H_GRAD, ch.H_DBAR, ch.H_LP, ch.H_H19, ch.H_BETA)


@dataclass(frozen=True)
class Config(ch.ChainConfig):
    n_sweep: int = 6

    @classmethod
    def paper(cls) -> Config:
        return cls(n_runs=40)


def _rows_for(rows: trows.RowSet, run: ch.ChainRun, k: int, cs: ch.ConstantSet) -> dict:
    pl, T, N = run.pl, run.T, run.N
    hs = ch.step_hypotheses(run, cs)
    hyps = {h: hs[h] for h in _STEP_NAMES + (ch.H_REGION,) if h in hs}
    r = pl.gap
    b, c_d = np.asarray(cs.b), cs.c_d
    base = run.lam_max[None] * (cs.B * pl.deviation[:-1] + 0.5 * run.L0 * cs.B**2 * run.eta)
    rhs62 = (1.0 - run.eta * c_d) * r[:-1] + run.eta * (base + b[None])
    slack = run.slack(cs)[:-1]
    tt = np.broadcast_to(np.arange(T)[:, None], (T, N))
    ii = np.broadcast_to(np.arange(N)[None], (T, N))
    repro = ch.set_repro(run, k, cs)
    info = {"run": k, "t": tt, "client": ii, "r": r[:-1], "margin": cs.margin[:-1], "Delta": pl.deviation[:-1]}
    rows.add(f"eq 62 ({cs.label})", r[1:], rhs62, hyps=hyps, info=info, repro=repro)
    rows.add(f"eq 63 ({cs.label})", pl.psi[1:] - pl.psi[:-1], slack, hyps=hyps, info=info, repro=repro)
    exact = slack == 0.0
    return dict(exact_inclusion_rounds=int(exact.sum()), rounds=int(exact.size))


SEARCH = ch.chain_search(Config, n_sweep=2)

#: Found by the paper-scale falsification search (seed 0): the inflated admissibility eq 63 within 0.73 of its
#: slack (close preferences, a large step, a start near the optimum, m = 4).
TIGHT_POINTS = ({"spread": 0.0013, "eta_factor": 0.1178, "start_noise": 0.044, "m": 4, "n_w": 5, "n_clients": 3},)

REASONS = {
    "eq 63": (
        "a halved eq 63 is detected at the designed tight point's seed only: 10 seeds there "
        "(registry.tight_point_seed) and at the stored search's best point add no instance above 0.5 "
        "(measured 2026-12-02), so the detection rests on that one run's iterates and is not widened"),
}


def run(config: Config | None, rng: np.random.Generator):
    cfg = config or Config()
    runs = ch.f1_chains(cfg, rng)
    rows = trows.RowSet()
    exact = {"exact_inclusion_rounds": 0, "rounds": 0}
    for k, rn in enumerate(runs):
        for j, cs in enumerate(rn.constant_sets() + ch.sweep_constants(rn, cfg.n_sweep)):
            e = _rows_for(rows, rn, k, cs)
            if j == 0:
                for key in exact:
                    exact[key] += e[key]
        rows.add("the analysed directions reproduce the iteration: |w^{t+1} - (w^t - eta dbar^t)| (relative)",
                 rn.step_residual / max(1.0, float(np.abs(rn.traj).max())), 1e-10, info={"run": k},
                 repro=ch.run_repro(rn, k), kind="identity")
    details = dict(
        verdict_constants="held-out constants (c_d, b_i) estimated on the iterates t >= t0 of a companion run (same "
                          "problem and eta, another start), on [c_min, 1/eta] and on [c_min, 1/(2 eta)]; c_d sweep "
                          "rows use other grid values with their held-out b_i(c_d); H.19 monitored on the checked "
                          "iterates; in-sample and region constants reported only",
        method=("shared iteration sim.algorithm.shared_iteration on F1; L0 = max_j ||Q_j|| (exact); B = max "
                "gradient norm over the iterates (exact on segments by convexity); (c_d, b_i) by "
                "sim.constants.descent_margin_constants on the held-out companion run's t >= t0 (log grid [c_min, 1/eta]); region constants by "
                "the same procedure on a uniform sample of B(mean w_i*, R) with the exact ball bound"),
        runs=[r.summary() for r in runs],
        runs_with_c_d_at_grid_end=int(sum(abs(r.eta * r.c_d - 1.0) < 1e-9 for r in runs)),
        runs_with_eta_c_d_at_most_half=int(sum(r.eta * r.consts_half.c_d <= 0.5 + 1e-12 for r in runs)),
        iterates_violating_region_constants=int(sum(r.summary()["iterates_violating_region_constants"]
                                                    for r in runs)),
        **exact,
    )
    return rows.evidence(STATEMENT_ID, NAME, details, tightness_exclude=("analysed directions",))


def negative_control(config: Config | None, rng: np.random.Generator):
    cfg = config or Config()
    return od.one_dim_control(STATEMENT_ID, NAME, cfg, {"eq 62", "eq 63"})
