r"""H.4 — properties of the EPO direction LP ("property (b)"); docs/spec/statements.md#t-h4, docs/spec/lp.md#lp.

Setting
    One client at one point ``w``: positive losses ``l`` (m), preference ``λ`` in the open simplex, gradients
    ``G = [g_1 … g_m]`` (``n_w × m``), ``C = GᵀG``, adjustment ``A``, ``β``
    (docs/spec/notation.md#uniformity), index sets ``J = {(CA)_j > 0}``, ``J̄ = [m]∖J``, ``J* = argmax_j λ_j
    l_j``. The EPO LP (docs/spec/lp.md#lp) in balancing mode (``β > 0``) and in uniform-descent mode
    (restricted ``prob_dom`` / relaxed ``prob_rel``) returns ``μ*``; ``d = Gμ*``, ``γ* := dᵀd_bal = μ*ᵀCA``
    (computed explicitly in both modes).

Hypotheses
    ``l > 0``, ``λ`` in the open simplex, ``C`` symmetric PSD (the LP inputs are valid).

Guarantee (derived from the LP, docs/spec/lp.md#lp)
    (P-a) balancing mode: ``dᵀg_j ≥ 0`` on ``J*`` (bottleneck non-increase to first order) and
          ``dᵀg_j ≥ d_balᵀg_j = (CA)_j`` on ``J̄∖J*``; nothing on ``J∖J*``.
    (P-b) descent mode: ``dᵀg_j ≥ 0`` for every ``j`` (restricted LP, relaxed on infeasibility, and relaxed LP).
    (P-d) ``‖d‖ ≤ max_j ‖g_j‖`` (``d`` is a convex combination of the gradients).
    Feasibility: the balancing LP and the relaxed descent LP are always feasible; the MGDA weights ``μ_M``
          (minimum-norm point of ``conv{g_j}``) are feasible for the balancing LP. The *restricted* descent LP
          can be infeasible (recorded, not a failure).
    (I4)  ``d/ds β(l(w − s d))|_{s=0} = −γ*/Z``: if ``γ* > 0`` a small step along ``−d`` decreases ``β``.
    ``γ*`` equals ``μ*ᵀCA`` in both modes (EPO's ``gamma`` is the LP objective, which differs in descent mode).
    NOT guaranteed (P-c, O-9): "``γ* > 0`` whenever ``β > 0``" — false (always when ``J = ∅``).

Check
    Family F6 (docs/spec/problems.md#families): random quadratics (the F1 objective generator: ``c_j ~ N(0,
    I)``, ``κ_Q = 3``, ``b_j = 0.3 + U(0,1)``), ``m`` cycling over 2..6, ``n_w ~ U{1..6}``, ``λ =
    0.95·Dirichlet(1) + 0.05/m``, ``w ~ N(0, I)``; the loss functions are kept so that I4 is checked on the
    true ``β(l(w − s d))``. Every instance is solved in balancing mode (``eps_mode = 0``) and in descent mode
    (``eps_mode = 10 > log m``) with the restricted and with the relaxed LP. Tolerance of LP rows:
    ``LP_TOL·max(1, max_k |C_jk|, |rhs_j|)``. The conclusion is ``lhs = max(‖d_bal-mode‖, ‖d_descent‖) ≤ rhs =
    max_j ‖g_j‖`` (P-d, tightness) and the boolean of every other property. I4: on the grid ``s = 2^{-k}/‖d‖``
    (k = 4..50) the decrease is required at every step that is (i) resolvable (``s γ*/Z ≥ 1e-12``, above
    round-off of β), (ii) small (``s‖d‖ ≤ 1e-3``) and (iii) first-order dominated (``s ≤ 0.1 (γ*/Z)/β''``,
    ``β''`` by second differences at step lengths 1e-3 and 1e-2), and the observed rate ``−Δβ/(s γ*/Z)`` must
    lie in [0.5, 1.5]; instances with no such step are counted ("γ* below resolution"), not failed.

Negative control
    The balancing-mode instances with ``γ* ≤ 0`` (the same F6 generator, the first ``control_instances`` draws of
    the seed; the run itself records their frequency over all its instances): the hypothesis "``γ* > 0``"
    (property (b), an explicit hypothesis of H.13/H.17) is flagged, and the I4 decrease fails there (β increases
    along ``−d``): the unproved claim "γ* > 0 whenever β > 0" is falsifiable and falsified on F6 with a fixed
    seed.

Reference: docs/spec/statements.md#t-h4, docs/spec/lp.md#lp, docs/spec/lp.md#guarantees,
docs/spec/open-points.md#o-9, docs/spec/open-points.md#o-21, docs/spec/observations.md#obs-2,
docs/spec/observations.md#obs-15.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.direction import lp_direction
from sim.hull import min_norm_weights_from_gram
from sim.preference import normalizer, preference_uniformity
from sim.problems import PlantedQuadraticCluster, with_min_entry
from verification.core.evidence import LP_TOL, POSITIVITY_RTOL, Evidence, HypothesisMonitor
from verification.core.search import F1_SHAPE, Param, SearchSpace

STATEMENT_ID = "H.4"
NUMBER = "4"
NAME = "EPO LP properties (P-a, P-b, P-d), feasibility, MGDA feasibility, first-order balancing (I4)"


@dataclass(frozen=True)
class Config:
    lambda_min: float = 0.0  # > 0: every preference's smallest entry set to it (the search box varies it)
    kappa_Q: float = 3.0  # F1 conditioning of each Q_j (the search box varies it)
    s_c: float = 1.0  # F1 centre spread (small with kappa_Q = 1: nearly collinear gradients)
    n_instances: int = 3000
    control_instances: int = 600  # the negative control re-draws this many (γ* ≤ 0 in ~15%)
    m_values: tuple = (2, 3, 4, 5, 6)
    n_w_max: int = 6
    i4_k_range: tuple = (4, 50)  # grid s = 2^-k / ‖d‖
    i4_resolution: float = 1e-12  # smallest predicted |Δβ| that counts as resolvable
    i4_max_step: float = 1e-3  # largest step length s‖d‖ used
    i4_curvature_factor: float = 0.1  # s ≤ factor·(γ/Z)/β''
    i4_rate_band: tuple = (0.5, 1.5)

    @classmethod
    def paper(cls) -> Config:
        """The paper-scale preset (`--scale paper`): the samples the conclusions are counted over, larger."""
        return cls(n_instances=12000)


@dataclass(frozen=True, eq=False)
class _Instance:
    problem: PlantedQuadraticCluster
    w: np.ndarray
    pref: np.ndarray

    def losses(self, W):
        return self.problem.losses(W)


def _instances(cfg: Config, rng: np.random.Generator, n: int) -> list[_Instance]:
    out = []
    for k in range(n):
        m = int(cfg.m_values[k % len(cfg.m_values)])
        n_w = int(rng.integers(1, cfg.n_w_max + 1))
        prob = PlantedQuadraticCluster.make(rng, m, n_w, 1, kappa_Q=cfg.kappa_Q, s_c=cfg.s_c)
        pref = 0.95 * rng.dirichlet(np.ones(m)) + 0.05 / m
        pref = pref / pref.sum()
        if cfg.lambda_min > 0:  # the smallest entry set to lambda_min, the others scaled to keep the sum 1
            pref = with_min_entry(pref, cfg.lambda_min)
        w = rng.standard_normal(n_w)
        out.append(_Instance(prob, w, pref))
    return out


def _solve_all(insts: list[_Instance]):
    """Group by m, solve every LP batched; returns per-instance dicts."""
    rows = [None] * len(insts)
    by_m: dict[int, list[int]] = {}
    for i, it in enumerate(insts):
        by_m.setdefault(it.pref.size, []).append(i)
    for idx in by_m.values():
        L = np.stack([insts[i].losses(insts[i].w) for i in idx])
        lam = np.stack([insts[i].pref for i in idx])
        Gs = [insts[i].problem.grads(insts[i].w) for i in idx]
        C = np.stack([g.T @ g for g in Gs])
        C = 0.5 * (C + np.swapaxes(C, -1, -2))
        bal = lp_direction(L, lam, C, eps_mode=0.0)
        res_dom = lp_direction(L, lam, C, eps_mode=10.0, descent="restricted", on_infeasible="relaxed")
        rel = lp_direction(L, lam, C, eps_mode=10.0, descent="relaxed")
        mgda = min_norm_weights_from_gram(C)
        for k, i in enumerate(idx):
            rows[i] = dict(
                l=L[k], lam=lam[k], G=Gs[k], C=C[k],
                bal=_pick(bal, k), dom=_pick(res_dom, k), rel=_pick(rel, k), mgda=mgda[k],
            )
    return rows


def _pick(res, k):
    return {f: np.asarray(getattr(res, f))[k] for f in ("weights", "mode", "status", "gain", "beta", "adjustment",
                                                         "J", "J_star", "objective")}


def _row_tol(C, rhs):
    return LP_TOL * np.maximum(1.0, np.maximum(np.abs(C).max(axis=1), np.abs(rhs)))


def _balancing_rows(C, A, J, Js):
    """Rows ``(Cμ)_j ≥ rhs_j`` of the balancing LP: mask of constrained j and the rhs (docs/spec/lp.md#lp)."""
    CA = C @ A
    if J.any():
        con = Js | ~J
        rhs = np.where(Js, 0.0, CA)
    else:
        con = np.ones_like(J)
        rhs = np.zeros_like(CA)
    return con, rhs


_I4_STATES = ("decrease", "increase", "rate_mismatch", "unresolved")


def _i4(inst: _Instance, dirs, gains, cfg: Config):
    """First-order balancing along ``−d`` for each direction ``d`` of ``dirs`` with gain ``γ`` of ``gains``.

    Returns, per direction, ``(status, detail)`` with status in :data:`_I4_STATES` ("rate_mismatch": β decreased
    but the observed rate ``−Δβ/(sγ/Z)`` left the band, i.e. the derivative is not ``−γ*/Z``). All
    points (curvature probes and the step grid of every direction) are evaluated in one batched call.
    """
    lam = inst.pref
    l0 = inst.losses(inst.w)
    Z = float(normalizer(l0, lam))
    k = np.arange(cfg.i4_k_range[0], cfg.i4_k_range[1] + 1)
    probes = np.array([1e-3, -1e-3, 1e-2, -1e-2])
    nds = [float(np.linalg.norm(d)) for d in dirs]
    steps = [np.concatenate([probes, 2.0 ** (-k)]) / nd if nd > 0 else np.zeros(probes.size + k.size)
             for nd in nds]
    W = np.concatenate([inst.w[None, :]] + [inst.w[None, :] - s[:, None] * d[None, :]
                                            for s, d in zip(steps, dirs, strict=True)])
    beta = preference_uniformity(inst.losses(W), lam)
    b0 = float(beta[0])
    out = []
    off = 1
    for nd, s_all, gain in zip(nds, steps, gains, strict=True):
        bb = beta[off:off + s_all.size] - b0
        off += s_all.size
        slope = gain / Z  # predicted −dβ/ds
        if nd == 0.0 or slope == 0.0:
            out.append(("unresolved", {}))
            continue
        h1, h2 = s_all[0], s_all[2]
        curv = max(abs(bb[0] + bb[1]) / h1**2, abs(bb[2] + bb[3]) / h2**2)
        s, db = s_all[4:], bb[4:]
        q = (s * abs(slope) >= cfg.i4_resolution) & (s * nd <= cfg.i4_max_step)
        q &= s <= cfg.i4_curvature_factor * abs(slope) / max(curv, 1e-300)
        if not q.any():
            out.append(("unresolved", {"curvature": curv, "slope": slope}))
            continue
        sq, dq = s[q], db[q]
        rate = -dq / (sq * slope)  # ≈ 1 when dβ/ds = −γ/Z
        lo, hi = cfg.i4_rate_band
        ok_rate = bool(np.all((rate >= lo) & (rate <= hi)))
        if slope > 0:
            status = ("decrease" if ok_rate else "rate_mismatch") if np.all(dq < 0) else "increase"
        else:  # γ < 0: the first-order change is an increase; report whether β went up
            status = "increase" if np.any(dq > 0) else "decrease"
        out.append((status, {"rate_min": float(rate.min()), "rate_max": float(rate.max()),
                             "n_steps": int(q.sum()), "max_delta_beta": float(dq.max()), "slope": slope,
                             "curvature": curv}))
    return out


def _evaluate(cfg: Config, rng: np.random.Generator, n: int):
    insts = _instances(cfg, rng, n)
    rows = _solve_all(insts)
    n = len(insts)
    out = dict(
        insts=insts, rows=rows,
        pa=np.ones(n, bool), pb=np.ones(n, bool), feas_bal=np.ones(n, bool), feas_rel=np.ones(n, bool),
        restricted_row=np.ones(n, bool), mgda=np.ones(n, bool), gain_ok=np.ones(n, bool),
        i4_ok=np.ones(n, bool), restricted_infeasible=np.zeros(n, bool), bal_mode=np.zeros(n, bool),
        gamma_bal=np.zeros(n), J_empty=np.zeros(n, bool), lhs=np.zeros(n), rhs=np.zeros(n),
        i4_status_bal=np.empty(n, dtype=object), i4_status_dom=np.empty(n, dtype=object),
        i4_sign_bal=np.empty(n, dtype=object), i4_sign_dom=np.empty(n, dtype=object),
        i4_detail_bal=[None] * n, valid=np.ones(n, bool),
    )
    rate_lo, rate_hi = np.inf, -np.inf
    for i, (inst, r) in enumerate(zip(insts, rows, strict=True)):
        C, G, lam, l = r["C"], r["G"], r["lam"], r["l"]
        out["valid"][i] = bool(np.all(l > 0) and np.all(lam > 0) and abs(lam.sum() - 1) < 1e-9
                               and np.linalg.eigvalsh(C)[0] >= -1e-10 * max(1.0, np.abs(C).max()))
        b, dm, rl = r["bal"], r["dom"], r["rel"]
        A = b["adjustment"]
        CA = C @ A
        out["bal_mode"][i] = b["mode"] == "balance"
        # feasibility
        out["feas_bal"][i] = b["status"] == "optimal"
        out["feas_rel"][i] = rl["status"] == "optimal"
        out["restricted_infeasible"][i] = dm["status"] == "relaxed"
        # P-a (balancing mode)
        mu = b["weights"]
        Cmu = C @ mu
        con, rhs = _balancing_rows(C, A, b["J"], b["J_star"])
        tol = _row_tol(C, rhs)
        out["pa"][i] = bool(np.all(Cmu[con] >= rhs[con] - tol[con])) if out["bal_mode"][i] else True
        out["J_empty"][i] = not b["J"].any()
        # MGDA weights feasible for the balancing LP
        um = r["mgda"]
        out["mgda"][i] = bool(abs(um.sum() - 1) <= 1e-12 and np.all(um >= -1e-12)
                              and np.all((C @ um)[con] >= rhs[con] - tol[con]))
        # P-b (descent mode: restricted with relaxed fallback, and the relaxed LP)
        ok_b = True
        for res in (dm, rl):
            ok_b &= bool(np.all(C @ res["weights"] >= -_row_tol(C, np.zeros_like(CA))))
        out["pb"][i] = ok_b
        # restriction row μᵀCA ≥ min(max CA, 0) where the restricted LP was feasible
        if dm["status"] == "optimal":
            thr = min(CA.max(), 0.0)
            out["restricted_row"][i] = bool(dm["weights"] @ CA >= thr - LP_TOL * max(1.0, np.abs(CA).max()))
        # γ* = μᵀCA in both modes
        ok_g = True
        for res in (b, dm, rl):
            g = float(res["weights"] @ CA)
            ok_g &= abs(float(res["gain"]) - g) <= 1e-12 * max(1.0, float(np.abs(CA).sum()))
        ok_g &= abs(float(b["objective"]) - float(b["gain"])) <= 1e-12 * max(1.0, float(np.abs(CA).sum()))
        out["gain_ok"][i] = ok_g
        out["gamma_bal"][i] = float(b["gain"])
        # P-d
        d_bal, d_dom = G @ mu, G @ dm["weights"]
        out["lhs"][i] = max(np.linalg.norm(d_bal), np.linalg.norm(d_dom))
        out["rhs"][i] = float(np.linalg.norm(G, axis=0).max())
        # I4 along the balancing direction and the descent direction
        ok4 = True
        i4 = _i4(inst, (d_bal, d_dom), (float(b["gain"]), float(dm["gain"])), cfg)
        for (key, res), (st, det) in zip((("bal", b), ("dom", dm)), i4, strict=True):
            gam = float(res["gain"])
            thr_pos = POSITIVITY_RTOL * max(1.0, float(np.abs(CA).max()))
            out[f"i4_sign_{key}"][i] = "positive" if gam > thr_pos else ("negative" if gam < -thr_pos else "zero")
            out[f"i4_status_{key}"][i] = st
            if key == "bal":
                out["i4_detail_bal"][i] = det
            if gam > thr_pos:
                if st in ("increase", "rate_mismatch"):
                    ok4 = False
                elif st == "decrease":
                    rate_lo = min(rate_lo, det["rate_min"])
                    rate_hi = max(rate_hi, det["rate_max"])
        out["i4_ok"][i] = ok4
    out["rate_range"] = (rate_lo, rate_hi)
    return out


def _record(out, i):
    inst, r = out["insts"][i], out["rows"][i]
    p = inst.problem
    return {"centres": p.centres, "hessians": p.hessians, "offsets": p.offsets, "w": inst.w, "pref": inst.pref,
            "mu_balance": r["bal"]["weights"], "mu_descent": r["dom"]["weights"], "gamma": r["bal"]["gain"],
            "P-a": out["pa"][i], "P-b": out["pb"][i], "feasible_balancing": out["feas_bal"][i],
            "feasible_relaxed": out["feas_rel"][i], "MGDA_feasible": out["mgda"][i], "gamma_formula": out["gain_ok"][i],
            "I4": out["i4_ok"][i], "restriction_row": out["restricted_row"][i]}


def _i4_table(out, key):
    sign, st = out[f"i4_sign_{key}"], out[f"i4_status_{key}"]
    return {f"gamma {g}": {s: int(np.sum((sign == g) & (st == s))) for s in _I4_STATES if np.any((sign == g) & (st == s))}
            for g in ("positive", "negative", "zero")}


SEARCH = SearchSpace(
    params=(Param("m", 2, 12, "int"), Param("n_w_max", 1, 12, "int"), *F1_SHAPE,
            Param("lambda_min", 1e-13, 1e-2, "log", default=0.0)),
    config=lambda p: Config(kappa_Q=p["kappa_Q"], s_c=p["s_c"], lambda_min=p["lambda_min"], n_instances=60, control_instances=10, m_values=(p["m"],), n_w_max=p["n_w_max"]),
    family="F6 random LP instances: m, n_w",
)


def run(config: Config | None, rng: np.random.Generator) -> Evidence:
    cfg = config or Config()
    out = _evaluate(cfg, rng, cfg.n_instances)
    n = len(out["insts"])
    mon = HypothesisMonitor(n)
    mon.record("LP inputs valid (l > 0, λ in the open simplex, C PSD)", out["valid"])
    ok = (out["pa"] & out["pb"] & out["feas_bal"] & out["feas_rel"] & out["mgda"] & out["gain_ok"]
          & out["i4_ok"] & out["restricted_row"])
    bal = out["bal_mode"]
    gamma_nonpos = bal & (out["i4_sign_bal"] != "positive")
    details = {
        "family": "F6: F1 objective generator, random interior λ, w ~ N(0, I); m cycles 2..6, n_w ~ U{1..6}",
        "n_balancing_mode": int(bal.sum()),
        "gamma_nonpositive_balancing": int(gamma_nonpos.sum()),
        "gamma_nonpositive_frequency": float(gamma_nonpos.sum() / max(1, bal.sum())),
        "gamma_nonpositive_with_J_empty": int((gamma_nonpos & out["J_empty"]).sum()),
        "restricted_descent_infeasible": int(out["restricted_infeasible"].sum()),
        "restricted_descent_infeasible_frequency": float(out["restricted_infeasible"].mean()),
        "failures": {
            "P-a": int((~out["pa"]).sum()), "P-b": int((~out["pb"]).sum()),
            "balancing LP infeasible": int((~out["feas_bal"]).sum()),
            "relaxed descent LP infeasible": int((~out["feas_rel"]).sum()),
            "MGDA weights infeasible": int((~out["mgda"]).sum()),
            "gamma != mu^T C A": int((~out["gain_ok"]).sum()),
            "I4 (beta not decreasing although gamma > 0)": int((~out["i4_ok"]).sum()),
            "restriction row violated": int((~out["restricted_row"]).sum()),
        },
        "I4_balancing": _i4_table(out, "bal"),
        "I4_descent": _i4_table(out, "dom"),
        "I4_note": "by the sign of gamma* (|gamma*| <= 1e-12 scale: zero); only gamma* > 0 must 'decrease'",
        "I4_observed_rate_range(-dbeta/(s*gamma/Z))": list(out["rate_range"]),
        "tightness_is": "max ‖d‖ / max_j ‖g_j‖ (P-d)",
    }
    return Evidence.from_implication(STATEMENT_ID, NAME, mon, out["lhs"], out["rhs"], ok=ok,
                                     conclusion="P-d: ||d|| <= max_j ||g_j||",
                                     ok_conclusion="P-a, P-b, feasibility, MGDA feasible, gamma = mu^T C A, I4",
                                     instance_data=lambda i: _record(out, i), details=details)


def negative_control(config: Config | None, rng: np.random.Generator) -> Evidence:
    """Balancing-mode instances with ``γ* ≤ 0``: flagged by the hypothesis "γ* > 0"; β does not decrease."""
    cfg = config or Config()
    out = _evaluate(cfg, rng, cfg.control_instances)
    n = len(out["insts"])
    mon = HypothesisMonitor(n)
    bal = out["bal_mode"]
    mon.record("balancing mode (β > 0)", bal)
    scale = np.array([max(1.0, float(np.abs(r["C"] @ r["bal"]["adjustment"]).max())) for r in out["rows"]])
    mon.require_positive("gamma* > 0 (property (b): hypothesis of H.13 / H.17)", np.where(bal, out["gamma_bal"], 1.0),
                         scale=scale)
    # conclusion "β decreases along −d to first order": fails where β was seen to increase
    ok = out["i4_status_bal"] != "increase"
    flagged = bal & (out["gamma_bal"] <= POSITIVITY_RTOL * scale)
    ev = Evidence.from_control(
        STATEMENT_ID, NAME, mon, "gamma* > 0 (property (b): hypothesis of H.13 / H.17)", ok=ok,
        instance_data=lambda i: _record(out, i) | {"I4": out["i4_detail_bal"][i]},
        details={
            "claim_falsified": "gamma* > 0 whenever beta > 0 (O-9, P-c)",
            "gamma_nonpositive_balancing": int(flagged.sum()),
            "with_J_empty": int((flagged & out["J_empty"]).sum()),
            "beta_increase_seen": int((flagged & (out["i4_status_bal"] == "increase")).sum()),
            "unresolved (|gamma| below resolution)": int((flagged & (out["i4_status_bal"] == "unresolved")).sum()),
        },
    )
    return ev
