r"""Rows, statistics and hypotheses of the new-client adaptation statements (private module): the per-instance rows
and the evidence they make (:class:`Rows`, :func:`combine_controls`), a Hotelling test of a mean vector and the
Monte Carlo bookkeeping (:func:`mc_record`, :func:`mc_claim`, :func:`tight_mc`), H.39 along the iterates
(:func:`h39_along`) and the hypothesis names with their monitors (:func:`h19_hyps`, :func:`adaptation_hyps`).
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy import stats

from sim.problems import CommonMinimizer
from verification.core.evidence import Evidence, check_inequality, to_jsonable
from verification.core.montecarlo import (
    CAP_FACTOR,
    MCResult,
    assertion_record,
    chi2_capped_mean,
    mean_claim,
    required_runs,
)
from verification.statements._adaptation_runs import ClusterStarts, run_adaptation
from verification.statements._adaptation_theory import alpha_max, gap_of, one_dim_instance, rhs_91

# ----------------------------------------------------------------------------------------------- statistics


def hotelling(X: np.ndarray, mean0, delta: float) -> dict:
    """Hotelling T² test of ``E X = mean0`` from i.i.d. rows ``X`` ``(N, p)`` (exact for Gaussian rows):
    ``F = (N − p)/(p(N − 1)) · N(x̄ − mean0)ᵀŜ⁻¹(x̄ − mean0) ~ F(p, N − p)``; reject iff ``F > F_{1−δ}``."""
    X = np.asarray(X, dtype=np.float64)
    N, p = X.shape
    d = X.mean(axis=0) - np.asarray(mean0, dtype=np.float64)
    Sh = np.atleast_2d(np.cov(X, rowvar=False))
    T2 = float(N * d @ np.linalg.solve(Sh, d))
    F = (N - p) / (p * (N - 1)) * T2
    crit = float(stats.f.ppf(1.0 - delta, p, N - p))
    return {"F": F, "F_crit": crit, "p_value": float(stats.f.sf(F, p, N - p)), "N": N, "dim": p,
            "delta": float(delta), "max_abs_mean_error": float(np.abs(d).max()), "rejected": bool(F > crit)}


def mc_record(label: str, res: MCResult, **extra) -> dict:
    """One Monte Carlo assertion for ``details["mc_assertions"]``."""
    d = res.to_dict()
    d.update(label=label, **extra)
    return to_jsonable(d)


def mc_claim(label: str, samples, bound: float, *, delta: float, **extra) -> tuple[MCResult, dict]:
    res = mean_claim(samples, bound, delta=delta)
    return res, mc_record(label, res, **extra)


#: Why the lagged-RMSprop Monte Carlo rows cannot approach their bound (power report and dashboard).
MC_RMSPROP_REASON = (
    "the bound's floor L0 alpha p+^2 sigma0^2/(2 mu_PL p- S) with alpha = p-/(L0 p+^2) equals sigma0^2/(2 mu_PL S) "
    "whatever the preconditioner, while the realised steps alpha P_k <= p-/(L0 p+) are shorter by up to p+/p-, and "
    "on the reference F3 instance (kappa_Q = 6) contraction at mu_PL and noise at L0 cost another factor (the "
    "stored falsification search's best ratio over (p+/p-, S, K) is shown beside this reason). The tight instance of the same claim (Q = I, P = I, "
    "alpha = 1/L0: E X = b) is run by Monte Carlo in this statement and detects a bound too small by 2")


#: ``ν = E min(X, κ_M b')/b'`` of the tight instance against a halved bound ``b' = b/2``: ``X = bξ²`` with
#: ``ξ ~ N(0, 1)``, so ``ν = 2 E min(χ²₁, κ_M/2)`` (:func:`verification.core.montecarlo.chi2_capped_mean`) ``≈ 1.618``.
TIGHT_NU = 2.0 * chi2_capped_mean(CAP_FACTOR / 2.0)
TIGHT_K = 5


def tight_mc(rows: Rows, rng, label: str, *, quantity: str, delta: float, conclusion: str | None = None,
             K: int = TIGHT_K, soft: bool = False) -> tuple[dict, dict]:
    """A Monte Carlo assertion on an instance where the expectation *equals* its bound, with a sample size that
    detects a bound too small by 2 with probability ``>= 0.99`` at the assertion's ``δ``.

    Instance: the 1-D F3 problem ``ψ = 1 + ½w²`` (``L₀ = μ_PL = μ = σ₀² = 1``), ``S = 1``, ``P = I``
    (``p₋ = p₊ = 1``), ``α = p₋/(L₀p₊²) = 1``: then ``w_{k+1} = w_k − (w_k + ξ_k) = −ξ_k``, so for every ``K ≥ 1``
    ``ψ(w_K) − ψ* = ½ξ²`` with mean ``½`` = RHS91 (``(1 − αμp₋)^K Δ₀ = 0`` plus the floor ``½``), and
    ``‖w_K − c‖² = ξ²`` with mean ``1 = (2/μ)·RHS91``. Both are ``X = bξ²``: ``ν`` = :data:`TIGHT_NU` and
    ``N = required_runs(ν, δ)`` (:func:`verification.core.montecarlo.required_runs`: ``N ≥ κ_M²(√(ln(2/δ)/2) +
    √(ln 100/2))²/(ν − 1)²``). ``quantity``: ``"gap"`` (eq 90/91/Thm-A's δ₀) or ``"sq_dist"`` (eq 93/96).
    The run uses :func:`run_adaptation` (the engine of every other Monte Carlo row)."""
    if quantity not in ("gap", "sq_dist"):
        raise ValueError(f"quantity must be 'gap' or 'sq_dist'; got {quantity!r}")
    p1 = one_dim_instance(w0=3.0, noise_var=1.0)
    n_runs = required_runs(TIGHT_NU, delta)
    runs = run_adaptation(p1, rng, alpha=1.0, S=1, K=K, n_runs=n_runs, kind="identity", p_minus=1.0, p_plus=1.0)
    b91 = float(rhs_91(p1, 1.0, 1, K, 1.0, 1.0, float(gap_of(p1, p1.w0)))[-1])
    if quantity == "gap":
        X, b = runs.gaps[-1], b91
    else:
        X, b = np.sum((runs.w_K - p1.centre) ** 2, axis=1), 2.0 / p1.mu_pl * b91
    res, rec = mc_claim(label, X, b, delta=delta, N=n_runs, nu=TIGHT_NU)
    hyp, mg = adaptation_hyps(p1, alpha=1.0, p_minus=1.0, p_plus=1.0, spec_min=runs.p_min.min(),
                              spec_max=runs.p_max.max())
    h39 = h39_along(p1, runs.W)
    hyp.update({H_BN: bool(h39["bottleneck_ok"].all()), H_PL: bool(pl_ok(h39).all())})
    rows.add_mc(label, res, conclusion=conclusion, hyp=hyp, margins=mg, P="identity", S=1, K=K, alpha=1.0,
                N=n_runs, soft=soft)
    power = {"instance": "psi = 1 + w^2/2, alpha = S = P = 1: X = b xi^2, E X = b (tight)", "N": n_runs,
             "nu": TIGHT_NU, "delta": delta,
             "rule": "N >= kappa_M^2 (sqrt(ln(2/delta)/2) + sqrt(ln(100)/2))^2 / (nu - 1)^2 detects b/2 w.p. >= 0.99"}
    return rec | {"power": power}, assertion_record(label, delta, N=n_runs, tight=True)


# ----------------------------------------------------------------------------------------------- H.39 along iterates


def h39_along(prob: CommonMinimizer, W) -> dict:
    """H.39 at the points ``W`` ``(..., n)``: bottleneck ``argmax_j λ_j l_j = j*`` where ``q > 0``; PL in the form
    ``2μ_PL(ψ − ψ*) ≤ ‖∇ψ‖²`` (eq 86); the exact gap identity ``ψ − t = λ_{j*}q`` (round-off check)."""
    W = np.asarray(W, dtype=np.float64).reshape(-1, prob.n_params)
    L = prob.losses(W)
    wl = prob.prefs * L
    gap = gap_of(prob, W)
    grad = prob.direction(W)
    return {
        "bottleneck_ok": (np.argmax(wl, axis=1) == prob.j_star) | (gap == 0.0),
        "pl_lhs": 2.0 * prob.mu_pl * gap,
        "pl_rhs": np.einsum("na,na->n", grad, grad),
        "gap_identity_err": float(np.max(np.abs(wl.max(axis=1) - prob.t - gap))) if W.size else 0.0,
    }


def pl_ok(h39: dict) -> np.ndarray:
    """eq 86 at each point of :func:`h39_along` (deterministic tolerance)."""
    return check_inequality(h39["pl_lhs"], h39["pl_rhs"])


# ----------------------------------------------------------------------------------------------- controls


def combine_controls(sid: str, name: str, parts: dict) -> Evidence:
    """One negative-control Evidence from several: detected iff *every* part is detected; the first part's
    arrays are kept, every part is summarised in ``details["controls"]``, and ``details["broken_hypotheses"]``
    (``"<part>: <hypothesis>"``) and ``details["flagged_instances"]`` (summed) say what the parts break and saw."""
    first = next(iter(parts.values()))
    summary = {
        k: {"detected": bool(ev.control_detected), "instances": ev.instances,
            "flagged": ev.details.get("flagged_instances"), "conclusion_failed": ev.n_counterexamples,
            "broken": ev.details.get("broken_hypotheses"), "details": ev.details,
            "counterexamples": ev.counterexamples[:3]}
        for k, ev in parts.items()
    }
    n_cex = sum(ev.n_counterexamples for ev in parts.values())
    cex = [dict(c, control=k) for k, ev in parts.items() for c in ev.counterexamples[:5]]
    broken = [f"{k}: {b}" for k, ev in parts.items() for b in (ev.details.get("broken_hypotheses") or [k])]
    flagged = sum(ev.control_summary()["flagged"] for ev in parts.values())
    return dataclasses.replace(
        first, control_detected=all(bool(ev.control_detected) for ev in parts.values()),
        counterexamples=to_jsonable(cex), n_counterexamples=n_cex,
        instances=sum(ev.instances for ev in parts.values()),
        excluded=sum(ev.excluded for ev in parts.values()),
        exclusion_reasons={f"{k}: {r}": c for k, ev in parts.items() for r, c in ev.exclusion_reasons.items()},
        details=to_jsonable({"controls": summary, "broken_hypotheses": broken, "flagged_instances": flagged}),
    )


class Rows:
    """Accumulates conclusion rows (``lhs``, ``rhs``, optional boolean ``ok``) with per-row hypotheses
    (name → bool) and per-row data, to build a :class:`HypothesisMonitor` and an Evidence.

    Every block belongs to a named conclusion (``conclusion``, default: the block's label) of a kind
    (:data:`verification.core.evidence.CONCLUSION_KINDS`); :meth:`add_mc` adds a Monte Carlo assertion with its
    crossing factor. :meth:`evidence_args` gives the ``conclusion``/``kinds``/``detect`` arguments of
    :meth:`Evidence.from_implication`."""

    def __init__(self):
        self.lhs: list[np.ndarray] = []
        self.rhs: list[np.ndarray] = []
        self.ok: list[np.ndarray] = []
        self.hyp: list[dict] = []
        self.margins: list[dict] = []
        self.data: list[dict] = []
        self.sizes: list[int] = []
        self.names: list[str] = []
        self.kinds: dict[str, str] = {}
        self.detect: list[np.ndarray] = []
        self.soft: set[str] = set()

    def add(self, kind: str, lhs, rhs, *, ok=None, hyp: dict | None = None, margins: dict | None = None,
            conclusion: str | None = None, ckind: str = "bound", detect=None, soft: bool = False, **data) -> None:
        lhs = np.asarray(lhs, dtype=np.float64).ravel()
        rhs = np.asarray(rhs, dtype=np.float64).ravel()
        n = max(lhs.size, rhs.size, 1 if ok is None else np.asarray(ok).size)
        lhs = np.broadcast_to(lhs, (n,)).copy()
        rhs = np.broadcast_to(rhs, (n,))
        name = kind if conclusion is None else conclusion
        if self.kinds.get(name, ckind) != ckind:
            raise ValueError(f"conclusion {name!r} given as {ckind!r} and as {self.kinds[name]!r}")
        self.kinds[name] = ckind
        self.names.append(name)
        if soft:
            self.soft.add(name)
        self.detect.append(np.full(n, np.nan) if detect is None
                           else np.broadcast_to(np.asarray(detect, np.float64), (n,)).copy())
        self.lhs.append(lhs)
        self.rhs.append(np.array(rhs))
        self.ok.append(np.ones(n, bool) if ok is None else np.broadcast_to(np.asarray(ok, bool), (n,)).copy())
        self.hyp.append({k: np.broadcast_to(np.asarray(v, bool), (n,)).copy() for k, v in (hyp or {}).items()})
        self.margins.append({k: np.broadcast_to(np.asarray(v, np.float64), (n,)).copy()
                             for k, v in (margins or {}).items()})
        d = {"kind": np.full(n, kind, dtype=object)}
        for k, v in data.items():
            a = np.asarray(v)
            d[k] = np.broadcast_to(a, (n,)).copy() if a.ndim == 0 or a.shape == (n,) else np.full(n, str(v),
                                                                                                  dtype=object)
        self.data.append(d)
        self.sizes.append(n)

    def add_mc(self, label: str, res: MCResult, *, conclusion: str | None = None, soft: bool = False,
               **kw) -> None:
        """A Monte Carlo assertion ``LCB ≤ b`` (``b`` as scaled by the power factor) with its crossing factor;
        ``soft``: reported, not part of the verdict (and so outside the family-wise budget)."""
        self.add(label, res.lcb, res.bound, conclusion=conclusion, ckind="monte_carlo", detect=res.crossing,
                 soft=soft, **kw)

    @property
    def n(self) -> int:
        return int(sum(self.sizes))

    def evidence_args(self) -> dict:
        """``conclusion``, ``kinds`` and ``detect`` for :meth:`Evidence.from_implication`."""
        names = np.concatenate([np.full(s, nm, dtype=object) for nm, s in zip(self.names, self.sizes, strict=True)])
        det = np.concatenate(self.detect) if self.detect else np.zeros(0)
        return {"conclusion": names, "kinds": dict(self.kinds), "detect": det, "soft": sorted(self.soft)}

    def arrays(self):
        lhs = np.concatenate(self.lhs) if self.lhs else np.zeros(0)
        rhs = np.concatenate(self.rhs) if self.rhs else np.zeros(0)
        ok = np.concatenate(self.ok) if self.ok else np.zeros(0, bool)
        return lhs, rhs, ok

    def monitor(self, order=()):
        """A monitor over all rows: a hypothesis not given for a block counts as not applicable (held)."""
        from verification.core.evidence import HypothesisMonitor

        names = list(order)
        for h in self.hyp:
            for k in h:
                if k not in names:
                    names.append(k)
        mon = HypothesisMonitor(self.n)
        for name in names:
            held = np.concatenate([h.get(name, np.ones(s, bool)) for h, s in zip(self.hyp, self.sizes, strict=True)])
            mg = np.concatenate([m.get(name, np.full(s, np.inf)) for m, s in zip(self.margins, self.sizes,
                                                                                  strict=True)])
            mon.record(name, held, margin=np.where(np.isinf(mg), np.where(held, np.inf, -1.0), mg))
        return mon

    def instance_data(self):
        keys: list[str] = []
        for d in self.data:
            for k in d:
                if k not in keys:
                    keys.append(k)
        out = {}
        for k in keys:
            out[k] = np.concatenate([d.get(k, np.full(s, None, dtype=object)) for d, s in
                                     zip(self.data, self.sizes, strict=True)])
        return out


# ----------------------------------------------------------------------------------------------- hypothesis names

H_F3 = "H.39 by construction: F3 (Q > 0, unique largest lambda_new entry; stable bottleneck j*, PL with mu_PL <= L0)"
H_BN = "H.39(i): bottleneck argmax_j lambda_j l_j(w_k) = j* at the iterates"
H_PL = "H.39(ii) eq 86: ||grad psi||^2 >= 2 mu_PL (psi - psi*) at the iterates"
H_UNB = "H.40: unbiased direction, fresh batch of S samples per step (construction)"
H_MEAS = "H.41(a): P_k F_k-measurable (computed before the step's batch is drawn)"
H_SPEC = "H.41(b): P_k symmetric with spectrum in [p_-, p_+]"
H_NOMOM = "H.41(c),(d): no momentum, no weight decay"
H_STEP = "step condition 0 < alpha <= p_-/(L0 p_+^2)"
H_H19 = "H.19 on the shared iterates with the estimated (c_d, b_i) (residual <= 0)"
H_ETA = "eta c_d <= 1 (H.29)"
H_NEW = "new client: same l_j, not in training, ||lambda_new - lambda_i|| <= delta_lambda"


def h19_hyps(cs: ClusterStarts, key: str) -> tuple[dict, dict]:
    """Hypotheses of the eq 92 / eq 95 bound at ``w_I`` or ``w_II`` (H.19 on the recorded iterates with the
    estimated constants; ``η c_d ≤ 1``, with ``η = max(η_I, η_II)`` for ``w_II``) and their margins."""
    c = cs.constants
    if key == "w_I":
        cd, eta, res = c["c_d_I"], c["eta_I"], c["residual_I"]
    else:
        cd, eta, res = c["c_d_II"], max(c["eta_I"], c["eta_II"]), c["residual_II"]
    return ({H_NEW: True, H_H19: res <= 1e-12, H_ETA: eta * cd <= 1 + 1e-12},
            {H_H19: -res, H_ETA: 1.0 - eta * cd})
H_QG = "H.34: psi_new - psi* >= (mu/2)||w - w*||^2 on the region (QG)"


def adaptation_hyps(prob: CommonMinimizer, *, alpha: float, p_minus: float, p_plus: float, spec_min, spec_max,
                    measurable=True, unbiased=True, no_momentum=True, f3=True) -> tuple[dict, dict]:
    """Per-row hypotheses of H.43/H.44 (construction flags, spectrum and step condition with margins)."""
    amax = alpha_max(prob, p_minus, p_plus)
    smin = np.asarray(spec_min, dtype=np.float64)
    smax = np.asarray(spec_max, dtype=np.float64)
    spec_margin = np.minimum(smin - p_minus, p_plus - smax)
    f3_ok = bool(f3) and prob.mu_pl > 0 and prob.mu_pl <= prob.L0 * (1 + 1e-12)
    hyp = {H_F3: f3_ok, H_UNB: unbiased, H_MEAS: measurable, H_SPEC: spec_margin >= -1e-12 * max(1.0, p_plus),
           H_NOMOM: no_momentum, H_STEP: (alpha > 0) and (alpha <= amax * (1 + 1e-12))}
    margins = {H_SPEC: spec_margin, H_STEP: amax - alpha}
    return hyp, margins
