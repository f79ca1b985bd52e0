r"""Corollary H.29 — contraction, band, nesting and limiting band (docs/spec/statements.md#t-h29,
docs/spec/statements.md#t-h28, docs/spec/statements.md#t-h31, docs/spec/statements.md#t-cor-c).

Setting
    The shared iteration eq 55 on a cluster ``C_n`` (as in H.28), ``r_i^t = ψ_i(w^t) − ψ_i*``, the ray points
    ``q_i* = ψ_i* λ_i^{-1}``, the admissible sets ``A_i^t(ε) = {l : max_j λ_ij l_j ≤ ψ_i^t + ε}`` and
    ``𝒜^t(ε) = ⋂_i {w : l_i(w) ∈ A_i^t(ε)}`` (``𝒜^t := 𝒜^t(0)``), the per-step slack
    ``ε_{i,t} = η[λ_max,i(BΔ_i^t + L₀B²η/2) + b_i − c_d r_i^t]_+`` and the band radius (eq 64)
    ``ε_{0,i} = (λ_max,i/c_d)(BΔ̄_i + L₀B²η/2) + b_i/c_d``; ``q := 1 − ηc_d``.

Hypotheses
    H.1–H.3 and H.19 (``c_d``, ``b_i``); ``0 < η ≤ 1/c_d``; from ``t0`` on, for all ``i``: ``w^t ∈ 𝒩``,
    ``β_i(w^t) ≤ β̄`` and ``Δ_i^t ≤ Δ̄_i``.

Guarantee (for all ``t, T ≥ t0``)
    1. (eq 65) ``r_i^{t+1} ≤ q r_i^t + ηc_d ε_{0,i}``; hence ``ψ_i^{t+1} ≤ ψ_i^t`` when ``r_i^t ≥ ε_{0,i}``
       (strictly when ``r_i^t > ε_{0,i}``).
    2. (eq 66) ``r_i^T ≤ q^{T−t0} r_i^{t0} + (1 − q^{T−t0}) ε_{0,i} ≤ q^{T−t0} r_i^{t0} + ε_{0,i}``.
    3. (eq 67) ``A_i^{t+1}(ε) ⊆ A_i^t(ε + ε_{i,t})`` and ``𝒜^{t+1}(ε) ⊆ 𝒜^t(ε + max_i ε_{i,t})``;
       (eq 68) exact nesting ``𝒜^{t+1} ⊆ 𝒜^t`` whenever ``r_i^t ≥ ε_{0,i}`` for all ``i``.
    4. (eq 69) ``𝒜^t ⊆ ⋂_i {w : l_i(w) ≤ q_i* + (1/λ_min,i)(q^{t−t0} r_i^{t0} + ε_{0,i}) 1}``; these sets
       decrease to (eq 70) ``𝒜^∞ = ⋂_i {w : l_i(w) ≤ q_i* + (ε_{0,i}/λ_min,i) 1}``.

What is checked
    The T-H31 runs of H.28 (same runs, same constants: the verdict uses the **iterate** constants, the
    implication chain; region constants are reported with the iterates that violate them, O-8), plus
    ``n_sweep`` further grid values of ``c_d`` with their ``b_i(c_d)`` for items 1–2. Rows:

    * eq 65 at every ``t0 ≤ t < T``; the monotonicity consequence ``ψ_i^{t+1} − ψ_i^t ≤ 0`` on rounds with
      ``r_i^t ≥ ε_{0,i}``;
    * eq 66 (sharp form, which implies the weak one) at every ``t0 < T ≤ T_end``, with the hypotheses required at
      every step of ``[t0, T)``;
    * eq 67 per client as ``ψ_i^{t+1} − ψ_i^t ≤ ε_{i,t}`` and, for the cluster sets, a membership Monte Carlo:
      on ``n_mc_rounds`` rounds per run, ``n_mc_points`` random ``w = w^{t+1} + s v`` (``v`` uniform on the
      sphere, ``s = 10^{Unif(−4, 0)}``); for ``ε ∈ {0, 0.1}`` every sample in ``𝒜^{t+1}(ε)`` must lie in
      ``𝒜^t(ε + max_i ε_{i,t})`` (rows: ``max_i(ψ_i(w) − ψ_i^t) − ε ≤ max_i ε_{i,t}``);
    * eq 68 on the rounds with all ``r_i^t ≥ ε_{0,i}``: ``ψ_i^{t+1} ≤ ψ_i^t`` and the membership Monte Carlo with
      slack 0;
    * eq 69 at ``w = w^t`` (``t ≥ t0``) and for Monte-Carlo samples ``w = w^t + s v`` in ``𝒜^t``:
      ``l_j(w) − q*_ij ≤ (q^{t−t0} r_i^{t0} + ε_{0,i})/λ_min,i`` for every ``i, j``;
    * eq 70 at the final iterate (the finite-horizon form, O-26) and the size of the remaining transient
      ``q^{T−t0} r^{t0}`` relative to ``ε_0`` (details).

Negative control
    F4 double well and F5 kink (as in H.28; see :mod:`._one_dim_chains`): the monitor flags ``w^t ∉ 𝒩`` and
    eq 51, and the contraction/band (eq 65, 66) fail — the double well stays at ``r ≈ 0.5`` against a claimed band
    ``ε_0 ≈ 0.06`` (``η = 0.01``) or ``0.018`` (``η = 0.003``).

Figure data (``details["figure_data"]``)
    ``band``: one representative run and constant set (not fitted on the run, hypotheses holding at every step from
    ``t0``; median final ``r/ε_0`` among those with ``ηc_d < 1`` and ``s_u > 0``), per client:
    ``t, client, r, bound, band, constants``;
    ``nesting``: the same run per round: ``t, client, psi_increase, slack``; the control: ``double_well``.

Reference
    docs/spec/statements.md#t-h29, docs/spec/iteration.md#iteration, docs/spec/statements.md#t-h31,
    docs/spec/identities.md#s11, docs/spec/identities.md#s12, docs/spec/open-points.md#o-8,
    docs/spec/open-points.md#o-10, docs/spec/open-points.md#o-22, docs/spec/open-points.md#o-26.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.roundoff import child_generator
from verification.statements import _chains as ch
from verification.statements import _one_dim_chains as od
from verification.statements import _trajectory_rows as trows

STATEMENT_ID = "H.29"
NAME = "Contraction (eq 65), band (eq 66), nesting (eq 67-68) and limiting band (eq 69-70)"
NUMBER = "29"

_STEP_NAMES = (ch.H_POS, ch.H_GRAD, ch.H_DBAR, ch.H_LP, ch.H_H19, ch.H_BETA, ch.H_DEV, ch.H_STEP)
H_MEMBER = "sample w in A^{t+1}(eps) (premise of the inclusion)"


@dataclass(frozen=True)
class Config(ch.ChainConfig):
    n_sweep: int = 6
    n_mc_rounds: int = 10
    n_mc_points: int = 50
    mc_eps: tuple = (0.0, 0.1)
    mc_log10_radius: tuple = (-4.0, 0.0)

    @classmethod
    def paper(cls) -> Config:
        return cls(n_runs=40, n_mc_points=500)


def _items_1_2(rows: trows.RowSet, run: ch.ChainRun, k: int, cs: ch.ConstantSet) -> None:
    pl, T, N, t0 = run.pl, run.T, run.N, run.t0
    hs = ch.step_hypotheses(run, cs)
    hs = {h: hs[h] for h in _STEP_NAMES + (ch.H_REGION,) if h in hs}
    c_d, eps0, label = cs.c_d, np.asarray(cs.eps0), cs.label
    q = 1.0 - run.eta * c_d
    r = pl.gap
    repro = ch.set_repro(run, k, cs)
    late = {h: v[t0:] for h, v in hs.items()}
    tt = np.broadcast_to(np.arange(t0, T)[:, None], (T - t0, N))
    ii = np.broadcast_to(np.arange(N)[None], (T - t0, N))
    rows.add(f"eq 65 ({label})", r[t0 + 1:], q * r[t0:-1] + run.eta * c_d * eps0[None], hyps=late,
             info={"run": k, "t": tt, "client": ii, "r": r[t0:-1]}, repro=repro)
    outside = r[t0:-1] >= eps0[None]
    if outside.any():
        rows.add(f"eq 65: psi non-increasing when r >= eps0 ({label})", (pl.psi[t0 + 1:] - pl.psi[t0:-1])[outside],
                 0.0, hyps={h: v[outside] for h, v in late.items()},
                 info={"run": k, "t": tt[outside], "client": ii[outside]}, repro=repro, kind="boolean")
    win = ch.window_hypotheses(hs, t0)
    Ts = np.arange(t0 + 1, T + 1)
    qT = q ** (Ts - t0)
    rhs66 = qT[:, None] * r[t0][None] + (1 - qT)[:, None] * eps0[None]
    rows.add(f"eq 66 ({label})", r[t0 + 1:], rhs66, hyps=win,
             info={"run": k, "T": np.broadcast_to(Ts[:, None], rhs66.shape), "client": ii}, repro=repro)


def _sphere(rng, n, dim):
    v = rng.standard_normal((n, dim))
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _nesting(rows: trows.RowSet, run: ch.ChainRun, k: int, cfg: Config, mc_rng: np.random.Generator) -> dict:
    P, T, t0 = run.problem, run.T, run.t0
    # membership Monte Carlo samples (drawn once; checked against every constant set)
    rounds = np.sort(mc_rng.choice(np.arange(t0, T), size=min(cfg.n_mc_rounds, T - t0), replace=False))
    samples = []
    for t in rounds:
        for kind, center in (("next", run.traj[t + 1]), ("cur", run.traj[t])):
            s = 10.0 ** mc_rng.uniform(*cfg.mc_log10_radius, cfg.n_mc_points)
            W = center[None] + s[:, None] * _sphere(mc_rng, cfg.n_mc_points, P.n_params)
            samples.append((int(t), kind, W, P.chebyshev(W)))  # psi of every client at W: (n, N)
    out = {}
    for cs in run.constant_sets():
        out[cs.label] = _nesting_rows(rows, run, k, cs, cfg, samples)
    return out


def _nesting_rows(rows: trows.RowSet, run: ch.ChainRun, k: int, cs: ch.ConstantSet, cfg: Config, samples) -> dict:
    P, pl, T, N, t0 = run.problem, run.pl, run.T, run.N, run.t0
    hs = ch.step_hypotheses(run, cs)
    hs = {h: hs[h] for h in _STEP_NAMES + (ch.H_REGION,) if h in hs}
    late = {h: v[t0:] for h, v in hs.items()}
    slack = run.slack(cs)[:-1]  # (T, N) ε_{i,t}
    eps0, q = np.asarray(cs.eps0), cs.q(run.eta)
    repro = ch.set_repro(run, k, cs)
    label = cs.label
    tt = np.broadcast_to(np.arange(t0, T)[:, None], (T - t0, N))
    ii = np.broadcast_to(np.arange(N)[None], (T - t0, N))
    dpsi = pl.psi[1:] - pl.psi[:-1]
    rows.add(f"eq 67 (per client, {label})", dpsi[t0:], slack[t0:], hyps=late,
             info={"run": k, "t": tt, "client": ii, "r": pl.gap[t0:-1]}, repro=repro)
    all_out = (pl.gap[t0:-1] >= eps0[None]).all(axis=1)
    if all_out.any():
        rows.add(f"eq 68 (per client, rounds with every r_i >= eps0_i, {label})", dpsi[t0:][all_out], 0.0,
                 hyps={h: v[all_out] for h, v in late.items()},
                 info={"run": k, "t": tt[all_out], "client": ii[all_out]}, repro=repro, kind="boolean")
    # ---- eq 69 at the iterates themselves (w^t ∈ 𝒜^t)
    lam_min = run.lam_min
    qstar = P.psi_star[:, None] / P.prefs  # (N, m)
    Ts = np.arange(t0, T + 1)
    trans = (q ** (Ts - t0))[:, None] * pl.gap[t0][None] + eps0[None]  # (T-t0+1, N)
    l_t = pl.losses[t0:, 0]  # common objectives: (T-t0+1, m)
    lhs69 = l_t[:, None, :] - qstar[None]
    rhs69 = np.broadcast_to((trans / lam_min[None])[..., None], lhs69.shape)
    win = ch.window_hypotheses(hs, t0)
    win0 = {h: np.concatenate([np.broadcast_to(v[:1] * 0 + np.inf, (1, N)), v]) for h, v in win.items()}
    m = lhs69.shape[-1]
    rows.add(f"eq 69 (w = w^t, {label})", lhs69, rhs69, hyps={h: np.repeat(v, m, axis=1).reshape(lhs69.shape)
                                                             for h, v in win0.items()},
             info={"run": k, "t": np.broadcast_to(Ts[:, None, None], lhs69.shape),
                   "client": np.broadcast_to(np.arange(N)[None, :, None], lhs69.shape),
                   "j": np.broadcast_to(np.arange(m)[None, None], lhs69.shape)}, repro=repro)
    # ---- eq 70: final iterate against the limiting band (finite-horizon form)
    rows.add(f"eq 70 (final iterate, limiting band + transient, {label})", lhs69[-1], rhs69[-1],
             hyps={h: np.repeat(v[-1], m) for h, v in win0.items()},
             info={"run": k, "T": T, "client": np.repeat(np.arange(N), m), "j": np.tile(np.arange(m), N)},
             repro=repro)
    # ---- membership Monte Carlo (eq 67 cluster sets, eq 68, eq 69)
    acc = {"eq67": [0, 0], "eq68": [0, 0], "eq69": [0, 0]}
    for t, kind, W, psiW in samples:
        hyp_t = {h: float(v[t].min()) for h, v in hs.items()}
        if kind == "next":
            for eps in cfg.mc_eps:
                member = (psiW <= pl.psi[t + 1][None] + eps).all(axis=1)
                acc["eq67"][0] += int(member.sum())
                acc["eq67"][1] += member.size
                if member.any():
                    lhs = (psiW[member] - pl.psi[t][None]).max(axis=1) - eps
                    rows.add(f"eq 67 (cluster sets, membership MC, {label})", lhs, float(slack[t].max()),
                             hyps=hyp_t, info={"run": k, "t": int(t), "eps": eps, "w": W[member]}, repro=repro)
                    if all_out[t - t0]:
                        acc["eq68"][0] += int(member.sum())
                        acc["eq68"][1] += member.size
                        rows.add(f"eq 68 (cluster sets, membership MC, {label})", lhs, 0.0, hyps=hyp_t,
                                 info={"run": k, "t": int(t), "eps": eps, "w": W[member]}, repro=repro,
                                 kind="boolean")
        else:
            member = (psiW <= pl.psi[t][None]).all(axis=1)
            acc["eq69"][0] += int(member.sum())
            acc["eq69"][1] += member.size
            if member.any():
                lW = P.losses(W[member])  # (n, m)
                lhs = lW[:, None, :] - qstar[None]
                rhs = np.broadcast_to((trans[t - t0] / lam_min)[None, :, None], lhs.shape)
                wh = {h: float(v[t - t0].min()) for h, v in win0.items()}
                rows.add(f"eq 69 (membership MC, {label})", lhs, rhs, hyps=wh,
                         info={"run": k, "t": int(t), "w": np.repeat(W[member], N * m, axis=0)}, repro=repro)
    final_transient = (q ** (T - t0)) * pl.gap[t0]
    return dict(mc_members_over_samples={key: v for key, v in acc.items()},
                rounds_all_outside_band=int(all_out.sum()),
                final_transient_over_eps0=float(np.max(final_transient / eps0)))


def _holding_sets(run: ch.ChainRun) -> list[ch.ConstantSet]:
    """The constant sets whose hypotheses hold at every step ``t ≥ t0`` of the run: the ones the figure may draw
    the contraction bound with (elsewhere the bound is not claimed)."""
    out = []
    for cs in run.constant_sets():
        hs = ch.step_hypotheses(run, cs)
        if all(float(np.min(v[run.t0:])) >= 0 for h, v in hs.items() if h in _STEP_NAMES + (ch.H_REGION,)):
            out.append(cs)
    return out


def _figure(run: ch.ChainRun, cs: ch.ConstantSet) -> dict:
    pl, T, N, t0 = run.pl, run.T, run.N, run.t0
    Ts = np.arange(t0, T + 1)
    eps0 = np.asarray(cs.eps0)
    bound = (cs.q(run.eta) ** (Ts - t0))[:, None] * pl.gap[t0][None] + eps0[None]
    band = {"t": np.repeat(Ts, N), "client": np.tile(np.arange(N), Ts.size), "r": pl.gap[t0:].ravel(),
            "bound": bound.ravel(), "band": np.tile(eps0, Ts.size), "constants": np.full(Ts.size * N, cs.label)}
    tt = np.arange(t0, T)
    nest = {"t": np.repeat(tt, N), "client": np.tile(np.arange(N), tt.size),
            "psi_increase": (pl.psi[t0 + 1:] - pl.psi[t0:-1]).ravel(), "slack": run.slack(cs)[t0:-1].ravel()}
    return {"band": trows.downsample(band), "nesting": trows.downsample(nest)}


SEARCH = ch.chain_search(Config, n_sweep=2, n_mc_rounds=3, n_mc_points=20)

#: Found by the paper-scale falsification search (seed 0): the nesting slack eq 67 within 0.75 of its bound, the
#: limiting band eq 70 within 0.98.
TIGHT_POINTS = ({"spread": 0.4658, "eta_factor": 0.019, "start_noise": 0.0421, "m": 2, "n_w": 4, "n_clients": 3},
                {"spread": 0.2938, "eta_factor": 0.007, "start_noise": 0.0528, "m": 3, "n_w": 3, "n_clients": 4})

# The best points, in the stored falsification search, of the conclusions whose detection rested on fewer
# than 10 instances (verification/data/search/H.29.json, 2026-12-02, rounded to 4 digits); each tight point
# runs at TIGHT_SEEDS seeds (registry.tight_point_seed), so that a halved bound is detected on at least 10
# instances rather than on a few draws.
TIGHT_POINTS += ({"spread": 0.001663, "eta_factor": 0.004233, "start_noise": 0.02635, "m": 5, "n_w": 5,
                   "n_clients": 2, "kappa_Q": 74160.0, "s_c": 0.07105},)
TIGHT_SEEDS = 5


def run(config: Config | None, rng: np.random.Generator):
    cfg = config or Config()
    runs = ch.f1_chains(cfg, rng)
    mc_rng = child_generator(rng)
    rows = trows.RowSet()
    per_run = []
    for k, rn in enumerate(runs):
        for cs in rn.constant_sets() + ch.sweep_constants(rn, cfg.n_sweep):
            _items_1_2(rows, rn, k, cs)
        per_run.append({**rn.summary(), **_nesting(rows, rn, k, cfg, mc_rng),
                        "final_r_over_eps0": rn.gap[-1] / rn.eps0,
                        "fraction_rounds_outside_band": float((rn.gap[rn.t0:] > rn.eps0[None]).mean())})
    ratios = np.concatenate([np.asarray(p["final_r_over_eps0"]) for p in per_run])
    # representative run and constants: among the (run, constant set) pairs whose hypotheses hold at every step from
    # t0 on and that show a visible contraction (eta c_d < 1 and some client outside its band at t0), the median
    # final r/eps0, preferring constants not fitted on the run (held-out, region) and distinct client preferences
    # (spread > 0); on the default runs the held-out sets never show one (the region band already covers r^{t0}, and
    # the companion's constants fail H.19 on the early iterates), so the in-sample set is drawn, and said so
    pairs = [(k, cs) for k, r in enumerate(runs) for cs in _holding_sets(r)]
    contracting = [(k, cs) for k, cs in pairs if runs[k].eta * cs.c_d < 1.0 - 1e-9
                   and np.any(runs[k].gap[runs[k].t0] > np.asarray(cs.eps0))]  # some client starts outside the band
    held_out = [x for x in contracting if x[1].label != "in-sample"]
    cand = ([x for x in held_out if runs[x[0]].params["spread"] > 0] or held_out
            or [x for x in contracting if runs[x[0]].params["spread"] > 0] or contracting or pairs)
    order = sorted(cand, key=lambda x: float(np.max(runs[x[0]].gap[-1] / np.asarray(x[1].eps0))))
    rep, rep_cs = order[len(order) // 2] if order else (0, runs[0].constant_sets()[0])
    details = dict(
        verdict_constants="held-out constants (c_d, b_i, Delta_bar, beta_bar) on the iterates t >= t0 of a companion "
                          "run (same problem and eta, another start), on [c_min, 1/eta] and on [c_min, 1/(2 eta)] "
                          "(eta c_d <= 1/2: q >= 1/2); c_d sweep rows use other grid values; in-sample and region "
                          "constants reported (per_run)",
        method=("as H.28: shared iteration on F1, L0 exact, B = max gradient norm over the iterates of both runs, "
                "sim.constants.descent_margin_constants on the held-out companion run's t >= t0; membership MC: w = center + s v, "
                "s = 10^Unif({:g}, {:g}), v uniform on the sphere".format(*tuple(cfg.mc_log10_radius))),
        band_tightness_final_r_over_eps0=trows.summary(ratios),
        runs_with_eta_c_d_equal_1=int(sum(abs(r.eta * r.c_d - 1.0) < 1e-9 for r in runs)),
        runs_with_eta_c_d_at_most_half=int(sum(r.eta * r.consts_half.c_d <= 0.5 + 1e-12 for r in runs)),
        iterates_violating_region_constants=int(sum(p["iterates_violating_region_constants"] for p in per_run)),
        representative_run=rep, representative_constants=rep_cs.label,
        per_run=per_run,
        figure_data=_figure(runs[rep], rep_cs),
    )
    return rows.evidence(STATEMENT_ID, NAME, details)


def negative_control(config: Config | None, rng: np.random.Generator):
    cfg = config or Config()
    return od.one_dim_control(STATEMENT_ID, NAME, cfg, {"eq 65", "eq 66", "eq 63"})
