r"""Lemma H.16 — mixed cluster; part (b), eq 48, is a FINDING (docs/spec/statements.md#t-h16,
docs/spec/open-points.md#o-7, docs/spec/open-points.md#o-21).

Setting
    A cluster ``C_n`` of ``N`` clients at a point ``w_0`` with weights ``ρ`` (Definition H.12), split by eq 39 (in code:
    the LP mode, ``β_i > ε_mode``) into balancing clients ``C^+`` and uniform clients ``C^0`` (dom mode). Block masses
    ``ρ^± `` and block means ``d̄^±`` (eq 43), so ``d̄ = ρ^+d̄^+ + ρ^0d̄^0``; ``D̄_bal^+ := Σ_{C^+}(ρ_i/ρ^+)‖d_bal,i‖``;
    ``δ_g`` the gradient dissimilarity (eq 40); ``J_i, J_i^*`` the LP index sets (docs/spec/lp.md#lp).

Hypotheses
    H.1–H.3 at the points used (losses ``> 0``; ``‖g_i^{(j)}‖ ≤ B`` so ``‖d_i‖ ≤ B``); every LP solved (balancing LP;
    dom LP restricted, relaxed on infeasibility so that ``Cμ ≥ 0``: O-21). For (47): the mixed range condition.

Guarantee (as printed / reconstructed)
    * (eq 44) ``d̄ − d_i = ρ^+(d̄^+ − d_i) + ρ^0(d̄^0 − d_i)``;
    * (eq 45) ``Δ_i ≤ ρ^+‖d̄^+ − d_i‖ + ρ^0‖d̄^0 − d_i‖`` (the triangle inequality; both sides are computed from
      the same directions by sums of at most ``N`` terms, so the comparison allows the rounding error bound
      ``4 γ_{N+n_w+2} max_i ‖d_i‖``, ``γ_n = nε/(1 − nε)``: instances where every deviation is of roundoff size
      decide nothing; eq 48 and eq 48' allow ``2 γ_{N+n_w} max_i ‖d_i‖ B`` for the rounding of ``d̄ᵀg`` and what
      the LP's certificate allows in ``d_kᵀg^(j) ≥ 0`` (its feasibility residual in the row's units, ``_lp48``),
      which decide only at high conditioning, where ``B`` and the Gram matrix are large);
    * (a, eq 46) for ``i ∈ C^+``: ``d̄ᵀd_bal,i ≥ γ_i* − Δ_i‖d_bal,i‖ − L₀B²τη``;
    * (a, eq 47) if ``γ_i* > (ρ^0‖d̄^0−d_i‖ + ρ^+‖d̄^+−d_i‖)‖d_bal,i‖ + L₀B²τη`` then eq 23 holds and the conclusion of
      H.13 follows: ``d̄ᵀd_bal,i > 0`` and ``β_i`` decreases along ``−d̄`` for small steps;
    * (b, eq 48, LITERAL) for ``i ∈ C^0`` and all ``j``: ``d̄ᵀg_i^{(j)} ≥ −Bδ_g − ρ^+BD̄_bal^+``.  **FALSE** (O-7): the
      step ``d_{i'}ᵀg_{i'}^{(j)} ≥ −‖d_bal,i'‖B`` is guaranteed by the LP only for ``j ∈ J̄_{i'} ∪ J^*_{i'}``; objectives
      in ``J_{i'}∖J^*_{i'}`` are unconstrained.
    * (b, eq 48′, REPAIRED, the contract) for all ``i`` and ``j``:
      ``d̄ᵀg_i^{(j)} ≥ −Bδ_g − BΣ_{i'∈C^+}ρ_{i'}s_{i'}^{(j)}`` with ``s_{i'}^{(j)} = ‖d_bal,i'‖`` if ``j ∈ J̄_{i'} ∪ J^*_{i'}`` and
      ``‖d_{i'}‖`` if ``j ∈ J_{i'}∖J^*_{i'}``; and eq 48 as printed whenever every balancing client has
      ``J_{i'}∖J^*_{i'} = ∅``.

What is checked
    Three instance sets: (A) F2 mixtures (docs/spec/problems.md#families), ``N = 5``, ``n_+ ~ Unif{0..5}``
    balancing clients with random interior ``λ``, the rest uniform at ``w_0`` (``λ_i :=
    normalize(1/l_i(w_0))``), ``ρ ~ Dirichlet(5·1)``, shifts cycling over ``Config.shifts``; (B) F1 near a
    planted point (``w_0 = w*(u_0) + rξ``, ``r ~ Unif(0.005, 0.3)``), same split; (C) the targeted
    construction of docs/spec/observations.md#obs-5b: common objectives (F1, ``δ_g = 0``), one balancing
    client (planted ``λ``, ``w_0`` near its optimum, ``r ~ Unif(0.001, 0.3)``) and one uniform client, ``ρ =
    (½, ½)``. ``ε_mode = 1e-12`` (O-19). Constants: ``B`` in eq 48/48′ is the largest gradient norm at ``w_0``
    (the only point they use; the tightest valid value); in eq 46/47 ``B`` is the largest gradient norm over
    ``w_0`` and the step grid (as in H.13), ``L₀ = max_j‖Q_j‖`` exact, ``τ = 1``, ``η =
    Config.eta_factor/L₀``; ``δ_g`` by :func:`sim.cluster.gradient_dissimilarity` (exact, it is evaluated at
    ``w_0``).

    The verdict is built with :meth:`Evidence.finding`: the **literal** check is eq 48 on every ``(i ∈ C^0, j)``
    (expected violated: the counterexample is printed in ``details["eq48_counterexample"]``); the **repaired**
    check, which must hold, concatenates the parts eq 44 (residual ``≤ 1e-12``), eq 45, eq 46, eq 47 ⇒ (eq 23,
    ``d̄ᵀd_bal,i > 0``, β decreases at the smallest resolvable grid steps), eq 48′ (all ``i, j``) and eq 48 under
    ``J∖J^* = ∅``. Its headline tightness is that of eq 48′; per-part counts and tightness are in ``details``.

Negative control (decided: the literal eq 48 counterexample itself, plus the eq 47 control of T-H16 (e))
    (i) Remove the ``J∖J^*`` branch, i.e. use eq 48: the monitor flags "every balancing client has
    ``J∖J^* = ∅``" and the inequality fails on flagged instances. (ii) The uniform block pulls hard (``ρ^0 = 0.9``):
    eq 47 is flagged and ``d̄ᵀd_bal,i < 0`` with β increasing. Detected iff both are detected.

Reference
    docs/spec/statements.md#t-h16, docs/spec/open-points.md#o-7, docs/spec/open-points.md#o-21,
    docs/spec/observations.md#obs-5b.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from sim.cluster import gradient_dissimilarity, gradient_dissimilarity_max, mixed_cluster_blocks
from sim.constants import gradient_bound, smoothness_quadratic
from sim.problems import PerturbedClients, PlantedQuadraticCluster
from sim.problems._quadratic import interior_preferences, normalize, planted_point
from sim.roundoff import gamma
from verification.core.evidence import ATOL, POSITIVITY_RTOL, Evidence, HypothesisMonitor, check_inequality
from verification.core.search import F1_SHAPE, LAMBDA_MIN, PLANTED_LAMBDA, Param, SearchSpace

from . import _cluster_common as cc

STATEMENT_ID = "H.16"
NAME = "Mixed cluster: eq 44-47 and repaired eq 48' (eq 48 as printed is a FINDING)"
NUMBER = "16"

HYP_LP = "all LPs solved (balancing; dom with C mu >= 0)"
HYP_POS = "H.1-H.3: losses > 0 at w0 and on the step grid"
HYP_DNORM = "P-d: ||d_i|| <= B"
HYP_EQ47 = "eq 47: mixed range condition"
HYP_JFREE = "every balancing client has J \\ J* = {} (the seed's sacrifice step)"


@dataclass(frozen=True)
class Config:
    kappa_Q: float = 3.0  # F1 conditioning of each Q_j (the search box varies it)
    s_c: float = 1.0  # F1 centre spread (small with kappa_Q = 1: nearly collinear gradients)
    n_clients: int = 5
    n_f2: int = 200
    shifts: tuple = (0.0, 0.02, 0.2)
    n_f1: int = 200
    n_targeted: int = 300
    m_choices: tuple = (2, 3, 4)
    n_w_max: int = 6
    radius_f2: tuple = (0.05, 1.0)
    radius_f1: tuple = (0.005, 0.3)
    radius_targeted: tuple = (0.001, 0.3)
    rho_alpha: float = 5.0
    spread_f1: float = 0.1
    eps_mode: float = 1e-12
    eta_factor: float = 0.01
    grid_k: tuple = (8, 29)
    n_smallest: int = 5
    # negative control (ii): the uniform block pulls hard
    control_clusters: int = 200
    control_rho_zero: float = 0.9

    @classmethod
    def paper(cls) -> Config:
        """The paper-scale preset (`--scale paper`): the samples the conclusions are counted over, larger."""
        return cls(n_f2=400, n_f1=400, n_targeted=600)


# ------------------------------------------------------------------------------------------ instance sets


def _set_f2(rng, cfg: Config):
    N = cfg.n_clients
    for k in range(cfg.n_f2):
        s_e = float(cfg.shifts[k % len(cfg.shifts)])
        m, n_w = cc.draw_dims(rng, cfg.m_choices, cfg.n_w_max)
        P = PerturbedClients.make(rng, m, n_w, N, shift=s_e, prefs="random")
        u0 = rng.dirichlet(3.0 * np.ones(m))
        w0 = planted_point(u0, P.centres, P.hessians) + rng.uniform(*cfg.radius_f2) * cc.unit_vectors(rng, 1, n_w)[0]
        n_plus = int(rng.integers(0, N + 1))
        for i in rng.permutation(N)[: N - n_plus]:
            P = P.with_uniform_client(int(i), w0)
        rho = rng.dirichlet(np.full(N, cfg.rho_alpha))
        yield "F2-mixture", P, P.prefs, w0, rho


def _f1_uniform_prefs(P, w0) -> np.ndarray:
    return normalize(1.0 / P.losses(w0))


def _set_f1(rng, cfg: Config):
    N = cfg.n_clients
    for _ in range(cfg.n_f1):
        m, n_w = cc.draw_dims(rng, cfg.m_choices, cfg.n_w_max)
        P = PlantedQuadraticCluster.make(rng, m, n_w, N, spread=cfg.spread_f1, kappa_Q=cfg.kappa_Q, s_c=cfg.s_c)
        w0 = P.planted_client(P.u0)[1] + rng.uniform(*cfg.radius_f1) * cc.unit_vectors(rng, 1, n_w)[0]
        n_plus = int(rng.integers(0, N + 1))
        prefs = P.prefs.copy()
        prefs[rng.permutation(N)[: N - n_plus]] = _f1_uniform_prefs(P, w0)
        rho = rng.dirichlet(np.full(N, cfg.rho_alpha))
        yield "F1-near-planted", P, prefs, w0, rho


def _set_targeted(rng, cfg: Config):
    for _ in range(cfg.n_targeted):
        m, n_w = cc.draw_dims(rng, cfg.m_choices, cfg.n_w_max)
        P = PlantedQuadraticCluster.make(rng, m, n_w, 1, spread=0.0)
        w0 = P.w_star[0] + rng.uniform(*cfg.radius_targeted) * cc.unit_vectors(rng, 1, n_w)[0]
        prefs = np.stack([P.prefs[0], _f1_uniform_prefs(P, w0)])
        yield "targeted-chk5b", P, prefs, w0, np.array([0.5, 0.5])


def _set_control(rng, cfg: Config):
    """Negative control (ii): one balancing client (random interior λ) and four uniform clients with ρ^0 = 0.9."""
    N = cfg.n_clients
    rho = np.concatenate([[1.0 - cfg.control_rho_zero], np.full(N - 1, cfg.control_rho_zero / (N - 1))])
    for _ in range(cfg.control_clusters):
        m, n_w = cc.draw_dims(rng, cfg.m_choices, cfg.n_w_max)
        P = PlantedQuadraticCluster.make(rng, m, n_w, 1, spread=0.0)
        w0 = P.w_star[0] + rng.uniform(*cfg.radius_f2) * cc.unit_vectors(rng, 1, n_w)[0]
        prefs = np.vstack([interior_preferences(rng, 1, m), np.repeat(_f1_uniform_prefs(P, w0)[None], N - 1, 0)])
        yield "control-uniform-pull", P, prefs, w0, rho


# ------------------------------------------------------------------------------------------ one cluster


def _cluster(P, prefs, w0, rho, cfg: Config, s) -> dict:
    N = prefs.shape[0]
    lfn = cc.cluster_losses_fn(P, prefs_count=N)
    G = cc.cluster_grads(P, w0, N)
    L = lfn(w0)
    lp = cc.client_lp(L, prefs, G, eps_mode=cfg.eps_mode)
    plus = lp.res.mode == "balance"
    blk = mixed_cluster_blocks(lp.d, lp.dbal, rho, plus)
    dbar = blk.dbar
    dev = np.linalg.norm(dbar[None, :] - lp.d, axis=1)
    split = blk.rho_plus * (blk.dbar_plus[None, :] - lp.d) + blk.rho_zero * (blk.dbar_zero[None, :] - lp.d)
    res44 = np.linalg.norm((dbar[None, :] - lp.d) - split, axis=1)
    B0 = float(gradient_bound(G))
    dg = float(gradient_dissimilarity(G, rho))
    pts = w0[None, :] - s[:, None] * dbar[None, :]
    Bgrid = float(max(B0, gradient_bound(P.grads(pts))))  # F1: (S, n_w, m); F2: (S, N, n_w, m)
    L0 = float(smoothness_quadratic(P.hessians))
    eta = cfg.eta_factor / L0
    drift = L0 * Bgrid**2 * 1 * eta  # τ = 1
    proj = lp.dbal @ dbar
    slope = -proj / lp.Z
    dec = cc.decrease_check(lp.beta, cc.beta_along(lfn, prefs, w0, dbar, s), slope, s, cfg.n_smallest)
    own = np.einsum("nw,nwm->nm", lp.d, G)  # d_i'ᵀ g_i'^(j)
    shared = np.einsum("w,nwm->nm", dbar, G)  # d̄ᵀ g_i^(j)
    free = lp.res.J & ~lp.res.J_star  # unconstrained objectives J ∖ J* of a balancing client
    s_rep = np.where(free, np.linalg.norm(lp.d, axis=1)[:, None], lp.dbal_norm[:, None])  # (N, m)
    rhs48p = B0 * dg + B0 * (rho[plus][:, None] * s_rep[plus]).sum(axis=0)  # (m,)
    rhs48 = B0 * dg + B0 * blk.rho_plus * blk.D_bal_plus
    jfree = not bool(free[plus].any())
    return dict(
        lp=lp, plus=plus, blk=blk, dbar=dbar, dev=dev, res44=res44, B0=B0, Bgrid=Bgrid, L0=L0, eta=eta,
        drift=drift, dg=dg, dg_max=float(gradient_dissimilarity_max(G)), proj=proj, dec=dec, own=own,
        shared=shared, free=free, rhs48p=rhs48p, rhs48=rhs48, jfree=jfree,
        min_loss=float(min(L.min(), lfn(pts).min())), dnorm_max=float(np.linalg.norm(lp.d, axis=1).max()),
        solved=bool(lp.solved.all()), scale44=float(max(1.0, np.linalg.norm(lp.d, axis=1).max())),
        round45=_round45(lp.d), round48=_round48(lp.d, B0), lp48=_lp48(lp, G, rho),
    )


def _round45(d: np.ndarray) -> float:
    """The rounding error bound of eq 45's two sides: ``4 γ_{N+n_w+2} max_i ‖d_i‖`` (``γ_n = nε/(1 − nε)``,
    :func:`sim.roundoff.gamma`, the standard bound of a sum of ``n`` terms; four such sums and norms enter the
    difference)."""
    return float(4.0 * gamma(d.shape[0] + d.shape[1] + 2) * np.linalg.norm(d, axis=1).max())


def _lp48(lp, G: np.ndarray, rho: np.ndarray) -> np.ndarray:
    """What the LP's own certificate allows in ``d̄ᵀg^(j)`` (eq 48): ``Σ_k ρ_k (r_k + γ_{n_w+m}) max(1, max_l
    |C_k,jl|)``, with ``r_k`` client ``k``'s ``feasibility_residual`` (recomputed from the data by
    :func:`sim.direction.lp_direction`, each constraint row divided by ``max(1, max_l |C_jl|)``) turned back into
    row ``j``'s units, plus the rounding of ``d_k = G_kμ_k`` and of its products with the gradients: a direction
    certified feasible to ``1e-16`` of a Gram matrix of ``1e11`` meets ``d_kᵀg^(j) ≥ 0`` only to ``1e-5``."""
    C = np.einsum("nwj,nwl->njl", G, G)  # per client: C_k = G_kᵀG_k
    rowscale = np.maximum(1.0, np.abs(C).max(axis=2))  # (N, m)
    r = np.nan_to_num(np.asarray(lp.res.feasibility_residual, dtype=np.float64), nan=0.0)
    return (rho * (r + gamma(G.shape[1] + G.shape[2]))) @ rowscale  # (m,)


def _round48(d: np.ndarray, B0: float) -> float:
    """The rounding error bound of ``d̄ᵀg_i^(j)`` in eq 48: ``2 γ_{N+n_w} max_i ‖d_i‖ B`` (``d̄`` a sum of ``N``
    directions, then a dot product of ``n_w`` terms with ``‖g‖ ≤ B``); it decides only where the shared direction
    and the gradients are large and the bound is of roundoff size (``δ_g = 0`` without balancing clients)."""
    return float(2.0 * gamma(d.shape[0] + d.shape[1]) * np.linalg.norm(d, axis=1).max() * B0)


def _collect(gen, cfg: Config):
    s = cc.step_grid(*cfg.grid_k)
    out = []
    for set_name, P, prefs, w0, rho in gen:
        c = _cluster(P, prefs, w0, rho, cfg, s)
        c.update(set=set_name, P=P, prefs=prefs, w0=w0, rho=rho)
        out.append(c)
    return out


# ------------------------------------------------------------------------------------------ checks


class _Rows:
    """Sub-instances of a concatenated check (one row per (part, cluster, client, objective))."""

    def __init__(self):
        self.rows: list[dict] = []

    def add(self, **kw):
        self.rows.append(kw)

    def arrays(self, keys):
        return {k: np.array([r.get(k, d) for r in self.rows]) for k, d in keys.items()}


_KEYS = {"part": "", "k": -1, "i": -1, "j": -1, "lhs": np.nan, "rhs": np.nan, "ok": True, "ok_core": True,
         "eq47": True, "jfree": True}


def _monitor(a, clusters, extra: bool):
    n = len(a["part"])
    mon = HypothesisMonitor(n)
    k = a["k"]
    solved = np.array([clusters[x]["solved"] for x in k])
    mon.exclude(HYP_LP, ~solved)
    mon.require_positive(HYP_POS, np.array([clusters[x]["min_loss"] for x in k]))
    mon.require_inequality(HYP_DNORM, np.array([clusters[x]["dnorm_max"] for x in k]),
                           np.array([clusters[x]["B0"] for x in k]))
    if extra:
        idx47 = np.flatnonzero(a["part"] == "eq47")
        mon.record(HYP_EQ47, a["eq47"][idx47], index=idx47)
        idxj = np.flatnonzero(a["part"] == "eq48|J\\J*=0")
        mon.record(HYP_JFREE, a["jfree"][idxj], index=idxj)
    return mon


def _repaired_rows(clusters, cfg: Config) -> _Rows:
    R = _Rows()
    for k, c in enumerate(clusters):
        lp, blk = c["lp"], c["blk"]
        N = len(c["plus"])
        for i in range(N):
            R.add(part="eq44", k=k, i=i, lhs=c["res44"][i], rhs=1e-12 * c["scale44"])
            R.add(part="eq45", k=k, i=i, lhs=c["dev"][i], rhs=blk.deviation_bound[i] + c["round45"])
            for j in range(c["shared"].shape[1]):
                allow = c["round48"] + c["lp48"][j]
                R.add(part="eq48'", k=k, i=i, j=j, lhs=-c["shared"][i, j], rhs=c["rhs48p"][j] + allow)
                if not c["plus"][i]:
                    R.add(part="eq48|J\\J*=0", k=k, i=i, j=j, lhs=-c["shared"][i, j], rhs=c["rhs48"] + allow,
                          jfree=c["jfree"])
            if not c["plus"][i]:
                continue
            lhs46 = lp.gamma[i] - c["dev"][i] * lp.dbal_norm[i] - c["drift"]
            R.add(part="eq46", k=k, i=i, lhs=lhs46, rhs=c["proj"][i])
            bound47 = blk.rho_zero * blk.dist_zero[i] + blk.rho_plus * blk.dist_plus[i]
            m47 = lp.gamma[i] - bound47 * lp.dbal_norm[i] - c["drift"]
            sc = max(abs(lp.gamma[i]), bound47 * lp.dbal_norm[i], c["drift"], 1e-300)
            eq47 = bool(m47 > POSITIVITY_RTOL * sc)
            eq23 = bool(lp.gamma[i] - c["dev"][i] * lp.dbal_norm[i] - c["drift"] > POSITIVITY_RTOL * sc)
            pos = bool(c["proj"][i] > POSITIVITY_RTOL * max(lp.dbal_norm[i] * np.linalg.norm(c["dbar"]), 1e-300))
            core = pos and bool(c["dec"].ok_small[i])  # the H.13 conclusion: d̄ᵀd_bal,i > 0 and β decreases
            R.add(part="eq47", k=k, i=i, lhs=m47 + c["drift"], rhs=c["proj"][i], ok=eq23 and core, ok_core=core,
                  eq47=eq47)
    return R


def _literal_rows(clusters) -> _Rows:
    R = _Rows()
    for k, c in enumerate(clusters):
        for i in np.flatnonzero(~c["plus"]):
            for j in range(c["shared"].shape[1]):
                R.add(part="eq48", k=k, i=int(i), j=j, lhs=-c["shared"][i, j], rhs=c["rhs48"], jfree=c["jfree"])
    return R


def _record(clusters, cfg: Config):
    def f(a):
        def g(x):
            k = int(a["k"][x])
            c = clusters[k]
            lp = c["lp"]
            rec = {"part": a["part"][x], "set": c["set"], "cluster": k, "client": int(a["i"][x]),
                   "objective": int(a["j"][x]), "lhs": a["lhs"][x], "rhs": a["rhs"][x],
                   "balancing": c["plus"], "J": lp.res.J, "J_star": lp.res.J_star, "rho_plus": c["blk"].rho_plus,
                   "B": c["B0"], "delta_g": c["dg"], "D_bal_plus": c["blk"].D_bal_plus,
                   "w0": c["w0"], "rho": c["rho"], "eps_mode": cfg.eps_mode}
            rec.update(cc.problem_record(c["P"]))
            rec["prefs"] = c["prefs"]
            return rec
        return g
    return f


def _part_summary(a, mask, parts) -> dict:
    out = {}
    for p in parts:
        sel = mask & (a["part"] == p)
        good = check_inequality(a["lhs"][sel], a["rhs"][sel]) & a["ok"][sel]
        r = a["rhs"][sel]
        pos = r > ATOL  # ratios of rounding-level quantities carry no information
        out[p] = {"checked": int(sel.sum()), "violations": int((~good).sum()),
                  "tightness": float(np.max(a["lhs"][sel][pos] / r[pos])) if pos.any() else None}
    return out


def _counterexample_text(clusters, a, bad_idx) -> dict | None:
    """The literal eq 48 counterexample to print: the largest violation ``lhs − rhs``, targeted set first."""
    if bad_idx.size == 0:
        return None
    sets = np.array([clusters[int(a["k"][x])]["set"] for x in bad_idx])
    pool = bad_idx[sets == "targeted-chk5b"] if np.any(sets == "targeted-chk5b") else bad_idx
    x = int(pool[np.argmax(a["lhs"][pool] - a["rhs"][pool])])
    k, i, j = int(a["k"][x]), int(a["i"][x]), int(a["j"][x])
    c = clusters[k]
    lp = c["lp"]
    bal = [int(t) for t in np.flatnonzero(c["plus"])]
    per_bal = [{
        "client": b, "J": lp.res.J[b], "J_star": lp.res.J_star[b], "j_in_J_minus_Jstar": bool(c["free"][b, j]),
        "d_g_own": float(c["own"][b, j]), "minus_dbal_norm_B": float(-lp.dbal_norm[b] * c["B0"]),
        "dbal_norm": float(lp.dbal_norm[b]), "d_norm": float(np.linalg.norm(lp.d[b])), "beta": float(lp.beta[b]),
        "gamma": float(lp.gamma[b]),
    } for b in bal]
    rec = {
        "text": (f"eq 48 violated: set {c['set']}, m={c['P'].n_objectives}, n_w={c['P'].n_params}, "
                 f"uniform client {i}, objective j={j}: dbar^T g_i^(j) = {-a['lhs'][x]:.6g} < "
                 f"-B*delta_g - rho+*B*Dbal+ = {-a['rhs'][x]:.6g} (rho+={c['blk'].rho_plus:.4g}, "
                 f"B={c['B0']:.6g}, delta_g={c['dg']:.3g}, Dbal+={c['blk'].D_bal_plus:.6g}); repaired bound "
                 f"eq 48' = {-c['rhs48p'][j]:.6g} holds"),
        "set": c["set"], "cluster": k, "uniform_client": i, "objective": j,
        "dbar_g": float(-a["lhs"][x]), "eq48_bound": float(-a["rhs"][x]), "eq48prime_bound": float(-c["rhs48p"][j]),
        "rho_plus": c["blk"].rho_plus, "B": c["B0"], "delta_g": c["dg"], "D_bal_plus": c["blk"].D_bal_plus,
        "balancing_clients": per_bal,
        "reproduce": {"w0": c["w0"], "prefs": c["prefs"], "rho": c["rho"], "eps_mode": 1e-12,
                      "lp": "sim.direction.lp_direction(l_i(w0), prefs_i, G_i^T G_i, eps_mode=1e-12)",
                      **cc.problem_record(c["P"])},
    }
    rec["reproduce"]["prefs"] = c["prefs"]
    return rec


def _all_clusters(rng, cfg: Config):
    clusters = _collect(_set_f2(rng, cfg), cfg)
    clusters += _collect(_set_f1(rng, cfg), cfg)
    clusters += _collect(_set_targeted(rng, cfg), cfg)
    return clusters


SEARCH = SearchSpace(
    params=(Param("shift", 1e-3, 0.5, "log"), Param("spread_f1", 1e-3, 1.0, "log"), Param("m", 2, 12, "int"),
            Param("n_w_max", 2, 12, "int"), Param("radius", 1e-3, 1.0, "log"), Param("rho_alpha", 0.2, 20.0, "log"),
            Param("n_clients", 2, 6, "int"), *F1_SHAPE),
    config=lambda p: Config(kappa_Q=p["kappa_Q"], s_c=p["s_c"], n_clients=p["n_clients"], n_f2=8, shifts=(p["shift"],), n_f1=8, n_targeted=8,
                            m_choices=(p["m"],), n_w_max=max(p["n_w_max"], p["m"]),
                            radius_f2=(p["radius"], 1.5 * p["radius"]), radius_f1=(p["radius"], 1.5 * p["radius"]),
                            radius_targeted=(p["radius"], 1.5 * p["radius"]), rho_alpha=p["rho_alpha"],
                            spread_f1=p["spread_f1"]),
    family="F2 mixtures, F1 near a planted point and the targeted pair: shift, spread, m, n_w, radius, rho, N",
    excluded={LAMBDA_MIN: PLANTED_LAMBDA},
)


def run(config: Config | None, rng: np.random.Generator) -> Evidence:
    cfg = config or Config()
    clusters = _all_clusters(rng, cfg)
    mk = _record(clusters, cfg)
    # repaired statement (the contract)
    rep = _repaired_rows(clusters, cfg).arrays(_KEYS)
    mon_r = _monitor(rep, clusters, extra=True)
    repaired = Evidence.from_implication(STATEMENT_ID, NAME + " [repaired]", mon_r, rep["lhs"], rep["rhs"],
                                         ok=rep["ok"], instance_data=mk(rep), conclusion=rep["part"],
                                         kinds={"eq44": "identity"})
    parts = ("eq44", "eq45", "eq46", "eq47", "eq48'", "eq48|J\\J*=0")
    per_part = _part_summary(rep, mon_r.mask, parts)
    t48p = per_part["eq48'"]["tightness"]
    repaired = dataclasses.replace(repaired, tightness=t48p, details={"parts": per_part})
    # literal eq 48
    lit = _literal_rows(clusters).arrays(_KEYS)
    mon_l = _monitor(lit, clusters, extra=False)
    literal = Evidence.from_implication(STATEMENT_ID, NAME + " [literal eq 48]", mon_l, lit["lhs"], lit["rhs"],
                                        instance_data=mk(lit), conclusion=lit["part"])
    held = mon_l.mask
    bad = np.flatnonzero(held & ~check_inequality(lit["lhs"], lit["rhs"]))
    sets = np.array([clusters[int(x)]["set"] for x in lit["k"]])
    sets_all = [c["set"] for c in clusters]
    details = {
        "eq48_counterexample": _counterexample_text(clusters, lit, bad),
        "eq48_literal_violations_by_set": {s: int(np.sum(sets[bad] == s)) for s in sorted(set(sets_all))},
        "eq48_literal_violations_with_J_minus_Jstar_empty": int(np.sum(lit["jfree"][bad])),
        "eq48_literal_checked_by_set": {s: int(np.sum(held & (sets == s))) for s in sorted(set(sets_all))},
        "clusters_by_set": {s: sets_all.count(s) for s in sorted(set(sets_all))},
        "seed_sacrifice_step_false": int(sum(
            np.sum(c["free"][c["plus"]] & (c["own"][c["plus"]] < -(c["lp"].dbal_norm[c["plus"]] * c["B0"])[:, None]))
            for c in clusters)),
        "repaired_parts": per_part,
        "eq48prime_for_uniform_clients_only": _part_summary(
            {**rep, "part": np.where((rep["part"] == "eq48'") & _is_uniform(rep, clusters), "u", "x")},
            mon_r.mask, ("u",))["u"],
        "constants": {"B (eq 48/48')": "max gradient norm at w0 (sim.constants.gradient_bound)",
                      "B (eq 46/47)": "max gradient norm over w0 and the step grid",
                      "L0": "max_j ||Q_j|| (exact)", "tau": 1, "eta": f"{cfg.eta_factor}/L0",
                      "delta_g": "sim.cluster.gradient_dissimilarity at w0 (exact)", "eps_mode": cfg.eps_mode},
        "delta_g_max_over_delta_g": cc.summary([c["dg_max"] / c["dg"] for c in clusters if c["dg"] > 0]),
        "figure_data": {"penalty": _penalty_table(clusters, lit, held, rep, mon_r.mask, rng)},
    }
    return Evidence.finding(STATEMENT_ID, NAME, literal, repaired, details=details)


def _penalty_table(clusters, lit, lit_held, rep, rep_held, rng, max_rows: int = 3000) -> dict:
    """Figure data: the objective ascent ``-d̄ᵀg_i^(j)`` over the eq 48 and eq 48′ bounds, against ρ⁺.

    One row per checked (cluster, uniform client, objective) of each bound; every violation is kept, the rest
    is subsampled to ``max_rows`` rows per bound."""
    cols: dict[str, list] = {"bound": [], "rho_plus": [], "ratio": [], "violated": [], "set": []}
    for label, a, held, part in (("eq 48 (literal)", lit, lit_held, "eq48"),
                                 ("eq 48' (repaired)", rep, rep_held, "eq48'")):
        sel = np.flatnonzero(held & (a["part"] == part) & (a["rhs"] > ATOL))
        bad = ~check_inequality(a["lhs"][sel], a["rhs"][sel])
        keep = np.concatenate([sel[bad], rng.permutation(sel[~bad])[: max(0, max_rows - int(bad.sum()))]])
        for x in keep:
            c = clusters[int(a["k"][x])]
            cols["bound"].append(label)
            cols["rho_plus"].append(float(c["blk"].rho_plus))
            cols["ratio"].append(float(a["lhs"][x] / a["rhs"][x]))
            cols["violated"].append(bool(not check_inequality(a["lhs"][x], a["rhs"][x])))
            cols["set"].append(c["set"])
    return cols


def _is_uniform(a, clusters):
    return np.array([(not clusters[int(k)]["plus"][int(i)]) if i >= 0 else False for k, i in zip(a["k"], a["i"], strict=True)])


def negative_control(config: Config | None, rng: np.random.Generator) -> Evidence:
    """(i) eq 48 without the J∖J* branch, flagged by "J∖J* = ∅"; (ii) eq 47 broken by a hard uniform pull."""
    cfg = config or Config()
    clusters = _all_clusters(rng, cfg)
    lit = _literal_rows(clusters).arrays(_KEYS)
    mon = _monitor(lit, clusters, extra=False)
    mon.record(HYP_JFREE, lit["jfree"])
    ev1 = Evidence.from_control(STATEMENT_ID, NAME, mon, HYP_JFREE, lit["lhs"], lit["rhs"],
                                instance_data=_record(clusters, cfg)(lit),
                                details={"control": "(i) eq 48' with the J\\J* branch removed (= eq 48)"})
    # (ii) eq 47 with a hard uniform pull
    ctl = _collect(_set_control(rng, cfg), cfg)
    rows = _repaired_rows(ctl, cfg).arrays(_KEYS)
    sel = rows["part"] == "eq47"
    rows = {k: v[sel] for k, v in rows.items()}
    mon2 = _monitor(rows, ctl, extra=True)
    ev2 = Evidence.from_control(STATEMENT_ID, NAME, mon2, HYP_EQ47, rows["lhs"], rows["rhs"], ok=rows["ok_core"],
                                instance_data=_record(ctl, cfg)(rows),
                                details={"control": f"(ii) eq 47 broken: rho0 = {cfg.control_rho_zero}"})
    flagged2 = mon2.failed(HYP_EQ47)
    neg_proj = np.array([ctl[int(k)]["proj"][int(i)] < 0 for k, i in zip(rows["k"], rows["i"], strict=True)])
    up = np.array([bool(ctl[int(k)]["dec"].up_small[int(i)]) for k, i in zip(rows["k"], rows["i"], strict=True)])
    details = dict(ev1.details)
    details["control_ii_eq47"] = {
        "instances": ev2.instances, "flagged": int(flagged2.sum()), "conclusion_failed": ev2.n_counterexamples,
        "flagged_dbar_dbal_negative_and_beta_increases": int((flagged2 & neg_proj & up).sum()),
        "detected": bool(ev2.control_detected),
    }
    details["control_i_detected"] = bool(ev1.control_detected)
    return dataclasses.replace(ev1, control_detected=bool(ev1.control_detected and ev2.control_detected),
                               details=details)
