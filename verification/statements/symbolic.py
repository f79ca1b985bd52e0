r"""The symbolic identities S1–S26 of docs/spec/identities.md#identities, checked with sympy (S22 and a few
side parts numerically).

Each ``sK()`` returns an :class:`~verification.core.evidence.Evidence` with id ``"SK"``: verdict "holds" iff every
sub-check of the identity is verified, "violated" otherwise. ``details["checks"]`` maps each sub-check to
``{"ok": bool, "residual": str}``; numeric sub-checks also report their worst ratio ``lhs/rhs``.

Method. An identity ``E = 0`` is verified by expanding logarithms (``expand_log(force=True)``), replacing every
remaining ``log(·)`` by an independent symbol and cancelling the resulting rational function: if that is zero,
``E`` is identically zero (logs treated as algebraically independent is a stronger statement). Only if this
fails is ``sympy.simplify`` tried (the residual it leaves is reported). Power series use ``series``; S3's
coefficients of ``‖A‖²`` and ``β`` are Taylor's, ``f⁽ᵏ⁾(0)/k!`` (:func:`taylor_coefficients`: the same polynomial as
``series`` for functions analytic at 0, in a tenth of the time).
Inequalities are reduced to identities ``rhs − lhs = (manifestly non-negative expression)`` whose sign sympy
decides from symbol assumptions.

Notation (docs/spec/notation.md#uniformity): ``Z = Σλ_j l_j``, ``ĺ_j = λ_j l_j/Z``, ``β = Σ ĺ_j log(m ĺ_j)``,
``a_j = λ_j(log(m ĺ_j) − β)``.
"""

from __future__ import annotations

import itertools
import time

import numpy as np
import sympy as sp

from verification.core.evidence import (
    ATOL,
    POWER_FACTOR,
    Conclusion,
    Evidence,
    _tightness,
    check_inequality,
    detection_factor,
    scaled_bound,
    to_jsonable,
)
from verification.core.registry import register

__all__ = [f"s{k}" for k in range(1, 27)] + ["IDENTITIES", "is_zero", "beta_expr", "adjustment_expr"]

#: Seed of the numerical parts when no generator is passed.
NUMERIC_SEED = 20240417


# --------------------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------------------


def is_zero(expr) -> tuple[bool, str]:
    """Decide ``expr ≡ 0``; returns ``(ok, residual_as_string)``."""
    e = sp.expand_log(sp.sympify(expr), force=True)
    logs = sorted(e.atoms(sp.log), key=sp.default_sort_key)
    reps = {L: sp.Dummy(f"log{k}") for k, L in enumerate(logs)}
    ed = e.xreplace(reps)
    r = sp.cancel(ed)
    if r != 0:
        r = sp.cancel(sp.together(sp.expand(ed)))
    if r == 0:
        return True, "0"
    r2 = sp.simplify(e)
    return (r2 == 0), str(r2)


def beta_expr(lam, loss):
    """β and the normalised losses for symbolic ``λ`` and ``l`` (lists)."""
    m = len(lam)
    Z = sum(lj * l for lj, l in zip(lam, loss, strict=True))
    lhat = [lj * l / Z for lj, l in zip(lam, loss, strict=True)]
    beta = sum(h * sp.log(m * h) for h in lhat)
    return beta, lhat, Z


def adjustment_expr(lam, loss):
    """The adjustments ``a_j = λ_j(log(m ĺ_j) − β)`` (list), with β and Z."""
    m = len(lam)
    beta, lhat, Z = beta_expr(lam, loss)
    return [lj * (sp.log(m * h) - beta) for lj, h in zip(lam, lhat, strict=True)], beta, Z


class _Checks:
    """Accumulates the sub-checks of one identity and builds its Evidence."""

    def __init__(self, sid: str):
        self.sid, self.name = sid, _NAMES[sid]
        self.items: list[tuple[str, bool, str]] = []
        self.lhs: list[np.ndarray] = []
        self.rhs: list[np.ndarray] = []
        self.numeric: dict[str, dict] = {}
        self.conclusions: list[Conclusion] = []
        self.extra: dict = {}
        self.t0 = time.perf_counter()

    def zero(self, label: str, expr) -> bool:
        ok, res = is_zero(expr)
        self.items.append((label, ok, res))
        return ok

    def equal(self, label: str, a, b) -> bool:
        return self.zero(label, sp.sympify(a) - sp.sympify(b))

    def true(self, label: str, cond, residual="") -> bool:
        ok = bool(cond is True or cond is sp.true or (isinstance(cond, (bool, np.bool_)) and cond))
        self.items.append((label, ok, str(residual) if residual != "" else str(cond)))
        return ok

    def inequality(self, label: str, lhs, rhs, atol: float = 1e-12, rtol: float = 1e-9,
                   ratio_meaningful: bool = True, kind: str | None = None) -> bool:
        """A numeric cross-check ``lhs ≤ rhs`` of kind ``bound`` (its rhs passes through
        :func:`verification.core.evidence.scaled_bound`) or ``identity`` (a residual against a tolerance, e.g. the
        remainder of an expansion; default when the ratio is not meaningful)."""
        kind = kind or ("bound" if ratio_meaningful else "identity")
        lhs = np.asarray(lhs, dtype=np.float64).ravel()
        rhs = np.asarray(rhs, dtype=np.float64).ravel()
        if kind == "bound":
            rhs = scaled_bound(rhs)
        good = check_inequality(lhs, rhs, atol, rtol)
        pos = rhs > ATOL
        ratio = float(np.max(lhs[pos] / rhs[pos])) if (pos.any() and ratio_meaningful) else None
        worst = int(np.argmax(lhs - rhs))
        self.numeric[label] = {
            "samples": int(lhs.size),
            "failed": int((~good).sum()),
            "max_ratio": ratio,
            "max_excess": float(np.max(lhs - rhs)),
            "worst": {"lhs": float(lhs[worst]), "rhs": float(rhs[worst])},
        }
        df = detection_factor(lhs, rhs)
        k = int(np.nanargmax(df)) if (kind == "bound" and np.isfinite(df).any()) else None
        self.conclusions.append(Conclusion(
            name=label, kind=kind,
            tightness=_tightness(lhs, rhs) if ratio_meaningful else None, instances=int(lhs.size), excluded=0,
            counterexamples=int((~good).sum()), detect_factor=None if k is None else float(df[k]),
            n_detecting=None if k is None else int(np.sum(df > POWER_FACTOR)),
            worst=None if k is None else {"sample": k, "lhs": float(lhs[k]), "rhs": float(rhs[k]),
                                          "ratio": float(df[k])}))
        self.lhs.append(lhs)
        self.rhs.append(rhs)
        return bool(good.all())

    def evidence(self) -> Evidence:
        checks = {label: {"ok": ok, "residual": res} for label, ok, res in self.items}
        bad = [{"check": label, "residual": res} for label, ok, res in self.items if not ok]
        for label, info in self.numeric.items():
            if info["failed"]:
                bad.append({"check": label, **info})
        n_num = sum(v["samples"] for v in self.numeric.values())
        lhs = np.concatenate(self.lhs) if self.lhs else np.zeros(0)
        rhs = np.concatenate(self.rhs) if self.rhs else np.zeros(0)
        ratios = [v["max_ratio"] for v in self.numeric.values() if v["max_ratio"] is not None]
        details = {"checks": checks}
        if self.numeric:
            details["numeric"] = self.numeric
        details.update(self.extra)
        symbolic = Conclusion(name="symbolic identities (sympy)", kind="identity", instances=len(self.items),
                              counterexamples=sum(not ok for _, ok, _ in self.items))
        conclusions = ([symbolic] if self.items else []) + self.conclusions
        return Evidence(
            conclusions=tuple(conclusions),
            id=self.sid,
            name=self.name,
            verdict="violated" if bad else "holds",
            lhs=lhs,
            rhs=rhs,
            tightness=max(ratios) if ratios else None,
            instances=len(self.items) + n_num,
            excluded=0,
            counterexamples=to_jsonable(bad),
            details=to_jsonable(details),
            seconds=time.perf_counter() - self.t0,
        )


def _rng(rng):
    return rng if rng is not None else np.random.default_rng(NUMERIC_SEED)


def _pos(names):
    return sp.symbols(names, positive=True)


# --------------------------------------------------------------------------------------------------------------
# S1–S6: Preference Uniformity, adjustments
# --------------------------------------------------------------------------------------------------------------


def taylor_coefficients(f, x, n: int) -> list:
    """The coefficients of ``x⁰, …, xⁿ⁻¹`` in the Taylor expansion of ``f`` about ``x = 0``, ``f⁽ᵏ⁾(0)/k!``, expanded
    (``f`` analytic at 0: its series about 0 has the same coefficients; sympy's ``series`` of a sum of squared
    logarithms took 1.7 s where the derivatives take 0.15)."""
    out, d = [], sp.sympify(f)
    for k in range(n):
        out.append(sp.expand(d.subs(x, 0) / sp.factorial(k)))
        d = sp.diff(d, x)
    return out


def _beta_eps(t, eps):
    m = len(eps)
    return sum((1 + t * e) / m * sp.log(1 + t * e) for e in eps)


def s1(rng=None) -> Evidence:
    """S1: β = t²Σε_j²/(2m) + O(t³) for ĺ_j = (1+tε_j)/m, Σε_j = 0 (m = 3 symbolically; m = 2, 4, 5
    numerically); the t³ coefficient is ε₁ε₂(ε₁+ε₂)/6 ≠ 0 (remainder o(‖ε‖²), not O(‖ε‖⁴))."""
    ck = _Checks("S1")
    t, e1, e2 = sp.symbols("t e1 e2", real=True)
    eps = [e1, e2, -e1 - e2]
    m = 3
    beta = _beta_eps(t, eps)
    ser3 = sp.series(beta, t, 0, 3).removeO()
    ck.equal("series(beta, t, 0, 3) == t^2 sum(eps^2)/(2m)  [m=3]", ser3, t**2 * sum(e**2 for e in eps) / (2 * m))
    ser4 = sp.expand(sp.series(beta, t, 0, 4).removeO())
    c3 = ser4.coeff(t, 3)
    ck.equal("t^3 coefficient == e1 e2 (e1+e2)/6", c3, e1 * e2 * (e1 + e2) / 6)
    ck.true("t^3 coefficient is not identically zero", sp.expand(c3) != 0, c3)
    # numerical, m in {2, 4, 5}: relative error of the quadratic term <= t·max|ε| (third order ~ tΣε³/(3Σε²))
    g = _rng(rng)
    for mm in (2, 4, 5):
        e = g.standard_normal((200, mm))
        e -= e.mean(axis=1, keepdims=True)
        e /= np.max(np.abs(e), axis=1, keepdims=True)  # max|ε| = 1: keeps tε well above rounding
        lhs, rhs = [], []
        for tt in (1e-2, 1e-3, 1e-4):
            b = np.sum((1 + tt * e) * np.log1p(tt * e), axis=1) / mm
            quad = tt**2 * np.sum(e**2, axis=1) / (2 * mm)
            lhs.append(np.abs(b - quad) / quad)
            rhs.append(tt * np.max(np.abs(e), axis=1))
        ck.inequality(f"|beta - t^2 sum eps^2/(2m)| / (t^2 sum eps^2/(2m)) <= t max|eps|  [m={mm}]",
                      np.concatenate(lhs), np.concatenate(rhs), kind="identity")
    return ck.evidence()


def s2() -> Evidence:
    """S2: series(λ₁(log(1+tε₁) − β), t, 0, 2) = λ₁tε₁, i.e. a_j = λ_jε_j + O(t²)."""
    ck = _Checks("S2")
    t, e1, e2 = sp.symbols("t e1 e2", real=True)
    lam1 = sp.Symbol("lambda1", positive=True)
    eps = [e1, e2, -e1 - e2]
    beta = _beta_eps(t, eps)
    for j, ej in enumerate(eps, 1):
        ser = sp.series(lam1 * (sp.log(1 + t * ej) - beta), t, 0, 2).removeO()
        ck.equal(f"series(a_{j}, t, 0, 2) == lambda t eps_{j}", ser, lam1 * t * ej)
    return ck.evidence()


def s3(rng=None) -> Evidence:
    """S3: lim_{t→0} ‖A‖²/β = 2mΣλ_j²ε_j²/Σε_j² ∈ [2mλ_min², 2mλ_max²] (m = 3)."""
    ck = _Checks("S3")
    t, e1, e2 = sp.symbols("t e1 e2", real=True)
    lam = _pos("lambda1 lambda2 lambda3")
    eps = [e1, e2, -e1 - e2]
    m = 3
    beta = _beta_eps(t, eps)
    A2 = sum(lj**2 * (sp.log(1 + t * e) - beta) ** 2 for lj, e in zip(lam, eps, strict=True))
    num, den = taylor_coefficients(A2, t, 3), taylor_coefficients(beta, t, 3)
    for k in (0, 1):
        ck.zero(f"||A||^2 has no t^{k} term", num[k])
        ck.zero(f"beta has no t^{k} term", den[k])
    S2 = sum(e**2 for e in eps)
    target = 2 * m * sum(lj**2 * e**2 for lj, e in zip(lam, eps, strict=True)) / S2
    ck.equal("lim ||A||^2/beta = ratio of t^2 coefficients == 2m sum(l^2 e^2)/sum(e^2)", num[2] / den[2], target)
    lmin = sp.Symbol("lambda_min", positive=True)
    s = _pos("s1 s2 s3")
    # target - 2mλ_min² = 2mΣ(λ_j² − λ_min²)ε_j²/Σε² with λ_j² − λ_min² =: s_j ≥ 0
    low = (target - 2 * m * lmin**2).subs({lj: sp.sqrt(lmin**2 + sj) for lj, sj in zip(lam, s, strict=True)})
    ck.equal("limit - 2m lambda_min^2 == 2m sum(s_j e_j^2)/sum(e^2), s_j = lambda_j^2 - lambda_min^2 >= 0",
             low, 2 * m * sum(sj * e**2 for sj, e in zip(s, eps, strict=True)) / S2)
    # numerical: the limit formula against ‖A‖²/β at t = 1e-5, and the bracket
    g = _rng(rng)
    L = 0.95 * g.dirichlet(np.ones(m), size=500) + 0.05 / m
    E = g.standard_normal((500, m))
    E -= E.mean(axis=1, keepdims=True)
    tt = 1e-5
    b = np.sum((1 + tt * E) * np.log1p(tt * E), axis=1) / m
    Anum = L * (np.log1p(tt * E) - b[:, None])
    ratio = np.sum(Anum**2, axis=1) / b
    lim = 2 * m * np.sum(L**2 * E**2, axis=1) / np.sum(E**2, axis=1)
    ck.inequality("| ||A||^2/beta (t=1e-5) / limit - 1 | <= 1e-3", np.abs(ratio / lim - 1), np.full(500, 1e-3),
                  kind="identity")
    ck.inequality("2m lambda_min^2 <= limit", 2 * m * L.min(axis=1) ** 2, lim)
    ck.inequality("limit <= 2m lambda_max^2", lim, 2 * m * L.max(axis=1) ** 2)
    return ck.evidence()


def s4() -> Evidence:
    """S4: ∂β/∂l_k = a_k/Z for every k, and Σ_j a_j l_j = 0 (Euler), m = 3."""
    ck = _Checks("S4")
    lam = _pos("lambda1:4")
    loss = _pos("l1:4")
    a, beta, Z = adjustment_expr(lam, loss)
    for k in range(3):
        ck.equal(f"d beta / d l_{k + 1} == a_{k + 1}/Z", sp.diff(beta, loss[k]), a[k] / Z)
    ck.zero("sum_j a_j l_j == 0", sum(aj * lj for aj, lj in zip(a, loss, strict=True)))
    return ck.evidence()


def _generic_losses(m: int, nw: int):
    w = sp.symbols(f"w1:{nw + 1}", real=True)
    funcs = [sp.Function(f"l{j + 1}")(*w) for j in range(m)]
    return w, funcs


def _freeze(expr, funcs, w):
    """Replace derivatives ∂l_j/∂w_k by symbols g_jk and l_j(w) by positive symbols L_j."""
    reps = {}
    for j, f in enumerate(funcs):
        for k, wk in enumerate(w):
            reps[sp.Derivative(f, wk)] = sp.Symbol(f"g{j + 1}{k + 1}", real=True)
    expr = expr.xreplace(reps)
    return expr.xreplace({f: sp.Symbol(f"L{j + 1}", positive=True) for j, f in enumerate(funcs)})


def s5() -> Evidence:
    """S5: ∇_w β(l(w)) = Σ_k (a_k/Z)∇_w l_k = G A/Z, n_w = 2, m = 2, generic l_j(w)."""
    ck = _Checks("S5")
    w, funcs = _generic_losses(2, 2)
    lam = _pos("lambda1:3")
    a, beta, Z = adjustment_expr(lam, funcs)
    for k, wk in enumerate(w):
        grad = sp.diff(beta, wk)
        GA = sum(sp.diff(f, wk) * aj for f, aj in zip(funcs, a, strict=True))
        ck.zero(f"d beta/d w_{k + 1} - (G A)_{k + 1}/Z", _freeze(grad - GA / Z, funcs, w))
    return ck.evidence()


def s6() -> Evidence:
    """S6: ∂a_j/∂λ_k = δ_jk(1+s_j) − λ_j(l_k/Z)(1+s_k), s_j = log(mĺ_j) − β, unnormalised λ, m = 3."""
    ck = _Checks("S6")
    lam = _pos("lambda1:4")
    loss = _pos("l1:4")
    a, beta, Z = adjustment_expr(lam, loss)
    s = [sp.log(3 * lj * l / Z) - beta for lj, l in zip(lam, loss, strict=True)]
    for j in range(3):
        for k in range(3):
            target = (1 + s[j]) * (1 if j == k else 0) - lam[j] * loss[k] / Z * (1 + s[k])
            ck.equal(f"d a_{j + 1}/d lambda_{k + 1}", sp.diff(a[j], lam[k]), target)
    return ck.evidence()


# --------------------------------------------------------------------------------------------------------------
# S7–S9: dispersion algebra
# --------------------------------------------------------------------------------------------------------------


def s7() -> Evidence:
    """S7 (eq 9): ‖Gμ_i − Σ_kρ_kGμ_k‖² = (μ_i − μ̄)ᵀGᵀG(μ_i − μ̄), n_w = m = N = 2, ρ₂ = 1 − ρ₁."""
    ck = _Checks("S7")
    G = sp.Matrix(2, 2, sp.symbols("G11 G12 G21 G22", real=True))
    mu = [sp.Matrix(sp.symbols(f"mu{i}1 mu{i}2", real=True)) for i in (1, 2)]
    r1 = sp.Symbol("rho1", real=True)
    rho = [r1, 1 - r1]
    mubar = rho[0] * mu[0] + rho[1] * mu[1]
    H_lhs = 0
    H_rhs = 0
    for i in range(2):
        v = G * mu[i] - (rho[0] * G * mu[0] + rho[1] * G * mu[1])
        lhs = (v.T * v)[0]
        dm = mu[i] - mubar
        rhs = (dm.T * G.T * G * dm)[0]
        ck.equal(f"||G mu_{i + 1} - sum rho G mu|| ^2 == (mu_{i + 1}-mubar)^T C (mu_{i + 1}-mubar)", lhs, rhs)
        H_lhs += rho[i] * lhs
        H_rhs += rho[i] * rhs
    ck.equal("H_C = sum rho_i ||d_i - dbar||^2 == sum rho_i (mu_i-mubar)^T C (mu_i-mubar)", H_lhs, H_rhs)
    return ck.evidence()


def s8() -> Evidence:
    """S8 (eq 44): d̄ − d_i = ρ⁺(d̄⁺ − d_i) + ρ⁰(d̄⁰ − d_i) with d̄ = ρ⁺d̄⁺ + ρ⁰d̄⁰, ρ⁺ + ρ⁰ = 1."""
    ck = _Checks("S8")
    di = sp.Matrix(sp.symbols("d_i1:4", real=True))
    dp = sp.Matrix(sp.symbols("dplus1:4", real=True))
    d0 = sp.Matrix(sp.symbols("dzero1:4", real=True))
    rp = sp.Symbol("rho_plus", real=True)
    r0 = 1 - rp
    dbar = rp * dp + r0 * d0
    diff = (dbar - di) - (rp * (dp - di) + r0 * (d0 - di))
    for k in range(3):
        ck.zero(f"component {k + 1}", diff[k])
    return ck.evidence()


def s9() -> Evidence:
    """S9: Σ_iρ_i(x_i − x̄)² = ½Σ_iΣ_kρ_iρ_k(x_i − x_k)² when Σρ = 1 (N = 3 scalars)."""
    ck = _Checks("S9")
    x = sp.symbols("x1:4", real=True)
    r1, r2 = sp.symbols("rho1 rho2", real=True)
    rho = [r1, r2, 1 - r1 - r2]
    xbar = sum(r * xi for r, xi in zip(rho, x, strict=True))
    lhs = sum(r * (xi - xbar) ** 2 for r, xi in zip(rho, x, strict=True))
    rhs = sp.Rational(1, 2) * sum(rho[i] * rho[k] * (x[i] - x[k]) ** 2 for i in range(3) for k in range(3))
    ck.equal("sum rho (x - xbar)^2 == 1/2 sum sum rho rho (x_i - x_k)^2", lhs, rhs)
    return ck.evidence()


# --------------------------------------------------------------------------------------------------------------
# S10–S16: one-step bounds and recursions
# --------------------------------------------------------------------------------------------------------------


def s10() -> Evidence:
    """S10 (Lemma H.25): the eq-58 bound minus the bound for j ∉ J*_ε equals η(λ_maxB² − m_min) ≥ 0."""
    ck = _Checks("S10")
    psi, eta, mmin, lmax, L0, B = sp.symbols("psi eta m_min lambda_max L0 B", real=True)
    first = psi - eta * mmin + lmax * L0 * B**2 * eta**2 / 2
    second = psi - 2 * eta * lmax * B**2 + eta * lmax * B**2 + lmax * L0 * B**2 * eta**2 / 2
    ck.equal("difference == eta (lambda_max B^2 - m_min)", first - second, eta * (lmax * B**2 - mmin))
    etap, s = _pos("eta s")
    lp, Bp = _pos("lambda_max B")
    diff = sp.expand((first - second).subs({eta: etap, lmax: lp, B: Bp}).subs(mmin, lp * Bp**2 - s))
    ck.true("difference >= 0 when m_min = lambda_max B^2 - s, s >= 0, eta > 0", diff.is_nonnegative, diff)
    return ck.evidence()


def s11() -> Evidence:
    """S11 (Theorem H.28): r − η(c_d r − b − λ_maxBΔ) + λ_maxL₀B²η²/2 = (1 − ηc_d)r + ηc_dε₀."""
    ck = _Checks("S11")
    r, eta, cd, b, lmax, B, Delta, L0 = _pos("r eta c_d b lambda_max B Delta L0")
    eps0 = (lmax / cd) * (B * Delta + L0 * B**2 * eta / 2) + b / cd
    lhs = r - eta * (cd * r - b - lmax * B * Delta) + lmax * L0 * B**2 * eta**2 / 2
    ck.equal("rearrangement", lhs, (1 - eta * cd) * r + eta * cd * eps0)
    return ck.evidence()


def s12() -> Evidence:
    """S12 (eq 66): r(T+1) = q r(T) + (1−q)ε, r(0) = r₀ solves to ε + q^T(r₀ − ε); inequality version,
    band never entered for q ∈ (0,1), r₀ > ε; one step for q = 0."""
    ck = _Checks("S12")
    T = sp.Symbol("T", integer=True, nonnegative=True)
    q, eps, r0 = sp.symbols("q epsilon r0", real=True)
    r = sp.Function("r")
    sol = sp.rsolve(r(T + 1) - q * r(T) - (1 - q) * eps, r(T), {r(0): r0})
    ck.equal("rsolve == eps + q^T (r0 - eps)", sol, eps + q**T * (r0 - eps))
    # inequality version by induction: if r_t <= q^t r0 + (1-q^t) eps and q >= 0, then
    # q r_t + (1-q) eps <= q^{t+1} r0 + (1-q^{t+1}) eps, with equality at the bound:
    bound = lambda tt: q**tt * r0 + (1 - q**tt) * eps  # noqa: E731
    ck.equal("q*bound(T) + (1-q) eps == bound(T+1)", q * bound(T) + (1 - q) * eps, bound(T + 1))
    qn, epsn, x = sp.symbols("q epsilon x", nonnegative=True)
    ck.true("(1 - q^T) eps <= eps for q, eps >= 0  (eps - (1-q^T)eps = q^T eps >= 0)",
            sp.expand(epsn - (1 - qn**T) * epsn).is_nonnegative, sp.expand(epsn - (1 - qn**T) * epsn))
    qp, xp = _pos("q x")
    gap = (sol - eps).subs({q: qp, r0: eps + xp})
    ck.true("q in (0,1), r0 > eps: r(T) - eps = q^T (r0 - eps) > 0", sp.simplify(gap).is_positive, gap)
    ck.equal("q = 0: r(1) == eps (band reached in one step)", sol.subs(T, 1).subs(q, 0), eps)
    return ck.evidence()


def s13(rng=None) -> Evidence:
    """S13 (H.32): r_{t+1} ≤ (1−η_tc)r_t + η_tcε̂ ⇒ r_T − ε̂ ≤ Π(1−η_tc)(r₀−ε̂)₊ ≤ (1−η_minc)^T r₀."""
    ck = _Checks("S13")
    c, eh, r = sp.symbols("c epsilon_hat r", real=True)
    etas = sp.symbols("eta_I eta_II", positive=True)
    et = sp.Symbol("eta_t", positive=True)
    ck.equal("x_{t+1} = (1-eta_t c) r_t + eta_t c eps - eps == (1-eta_t c)(r_t - eps)",
             (1 - et * c) * r + et * c * eh - eh, (1 - et * c) * (r - eh))
    r0 = sp.Symbol("r0", real=True)
    for T in (2, 3):
        for seq in itertools.product(etas, repeat=T):
            rt = r0
            for e in seq:
                rt = (1 - e * c) * rt + e * c * eh
            prod = sp.prod([(1 - e * c) for e in seq])
            ck.equal(f"equality unrolled T={T}, steps {[str(e) for e in seq]}", rt - eh, prod * (r0 - eh))
    # numerical: random sub-recursions with slack, 0 < eta_t c <= 1
    g = _rng(rng)
    n, T = 2000, 6
    cc = g.uniform(0.1, 2.0, n)
    etaI = g.uniform(0.01, 1.0, n) / cc
    etaII = g.uniform(0.01, 1.0, n) / cc
    ehat = g.uniform(0.0, 1.0, n)
    r0n = g.uniform(0.0, 3.0, n)
    choice = g.integers(0, 2, (n, T))
    rt = r0n.copy()
    prod = np.ones(n)
    for t in range(T):
        e = np.where(choice[:, t] == 0, etaI, etaII)
        # any r_{t+1} in [0, (1 - η_t c) r_t + η_t c ε̂] satisfies the hypothesis (suboptimality r ≥ 0)
        slack = g.uniform(0, 0.2, n) * (1 + rt) * (g.random(n) < 0.3)
        rt = np.maximum(0.0, (1 - e * cc) * rt + e * cc * ehat - slack)
        prod *= 1 - e * cc
    mid = prod * np.maximum(r0n - ehat, 0)
    ck.inequality("r_T - eps_hat <= prod(1 - eta_t c)(r0 - eps_hat)_+", rt - ehat, mid)
    etamin = np.minimum(etaI, etaII)
    ck.inequality("prod(1-eta_t c)(r0-eps_hat)_+ <= (1 - eta_min c)^T r0", mid, (1 - etamin * cc) ** T * r0n)
    return ck.evidence()


def s14() -> Evidence:
    """S14 (H.22): roots of κx² − L_AΔx − c; √β ≤ larger root; (larger root)² ≤ 2L_A²Δ²/κ² + 2c/κ."""
    ck = _Checks("S14")
    x = sp.Symbol("x", real=True)
    kappa, LA, Delta, c = _pos("kappa L_A Delta c")
    poly = kappa * x**2 - LA * Delta * x - c
    disc = sp.sqrt(LA**2 * Delta**2 + 4 * kappa * c)
    xp = (LA * Delta + disc) / (2 * kappa)
    xm = (LA * Delta - disc) / (2 * kappa)
    roots = sp.solve(poly, x)
    ok = len(roots) == 2 and all(any(is_zero(rt - cand)[0] for cand in (xp, xm)) for rt in roots)
    ck.true("solve(kappa x^2 - L_A Delta x - c) == (L_A Delta +- sqrt(L_A^2 Delta^2 + 4 kappa c))/(2 kappa)",
            ok, roots)
    ck.equal("poly == kappa (x - x_+)(x - x_-)", poly, kappa * (x - xp) * (x - xm))
    ck.true("x_- <= 0 (so x >= 0 and poly(x) <= 0 imply x <= x_+)", (disc**2 - (LA * Delta) ** 2).is_nonnegative,
            disc**2 - (LA * Delta) ** 2)
    a = LA * Delta / (2 * kappa)
    b = disc / (2 * kappa)
    rhs = 2 * LA**2 * Delta**2 / kappa**2 + 2 * c / kappa
    ck.equal("rhs - x_+^2 == (a - b)^2 + 4 a^2  (a = L_A Delta/2kappa, b = sqrt(.)/2kappa)",
             rhs - xp**2, (a - b) ** 2 + 4 * a**2)
    ck.true("hence x_+^2 <= 2 L_A^2 Delta^2/kappa^2 + 2c/kappa", ((a - b) ** 2 + 4 * a**2).is_nonnegative)
    return ck.evidence()


def s15() -> Evidence:
    """S15 (H.43): α = xp₋/(L₀p₊²) gives αp₋ − L₀α²p₊²/2 − αp₋/2 = p₋²x(1−x)/(2L₀p₊²) ≥ 0 on (0,1]; PL step."""
    ck = _Checks("S15")
    x, pm, pp, L0, mu, gap, s, alpha = _pos("x p_minus p_plus L0 mu_PL gap s alpha")
    al = x * pm / (L0 * pp**2)
    expr = al * pm - L0 * al**2 * pp**2 / 2 - al * pm / 2
    target = pm**2 * x * (1 - x) / (2 * L0 * pp**2)
    ck.equal("alpha p_- - L0 alpha^2 p_+^2/2 - alpha p_-/2 == p_-^2 x(1-x)/(2 L0 p_+^2)", expr, target)
    sub = sp.factor(target.subs(x, 1 / (1 + s)))  # x in (0, 1]  <=>  x = 1/(1+s), s >= 0
    ck.true("nonnegative for x = 1/(1+s) in (0,1]", sub.is_nonnegative, sub)
    ck.zero("x = 1: coefficient vanishes (alpha = p_-/(L0 p_+^2) is the largest step)", target.subs(x, 1))
    # PL: ‖g‖² = 2μ_PL(ψ−ψ*) + s, s ≥ 0  ⇒  −(αp₋/2)‖g‖² + αμ_PLp₋(ψ−ψ*) = −αp₋s/2 ≤ 0
    g2 = 2 * mu * gap + s
    d = sp.expand(-(alpha * pm / 2) * g2 + alpha * mu * pm * gap)
    ck.equal("-(alpha p_-/2)||g||^2 + alpha mu_PL p_- (psi-psi*) == -alpha p_- s/2", d, -alpha * pm * s / 2)
    ck.true("PL step: -(alpha p_-/2)||g||^2 <= -alpha mu_PL p_- (psi - psi*)", d.is_nonpositive, d)
    return ck.evidence()


def s16() -> Evidence:
    """S16 (H.43): Σ_{k<K}ρ^k = (1−ρ^K)/(1−ρ); c/(1−ρ) = L₀αp₊²σ₀²/(2μ_PLp₋S); E_K ≤ ρ^KE₀ + c/(1−ρ)."""
    ck = _Checks("S16")
    rho = sp.Symbol("rho", positive=True)
    K = sp.Symbol("K", integer=True, positive=True)
    k = sp.Symbol("k", integer=True, nonnegative=True)
    ssum = sp.summation(rho**k, (k, 0, K - 1))
    closed = (1 - rho**K) / (1 - rho)
    generic = ssum.args[-1][0] if isinstance(ssum, sp.Piecewise) else ssum
    ck.equal("sum_{k<K} rho^k == (1 - rho^K)/(1 - rho)  (rho != 1 branch)", generic, closed)
    for KK in range(1, 6):
        ck.equal(f"K = {KK} explicitly", sum(rho**j for j in range(KK)), closed.subs(K, KK))
    alpha, mu, pm, pp, L0, sig2, S = _pos("alpha mu_PL p_minus p_plus L0 sigma0sq S")
    rho_v = 1 - alpha * mu * pm
    c = L0 * alpha**2 * pp**2 * sig2 / (2 * S)
    ck.equal("c/(1 - rho) == L0 alpha p_+^2 sigma0^2/(2 mu_PL p_- S)", c / (1 - rho_v),
             L0 * alpha * pp**2 * sig2 / (2 * mu * pm * S))
    T = sp.Symbol("T", integer=True, nonnegative=True)
    E = sp.Function("E")
    E0, cs = sp.symbols("E0 c", real=True)
    sol = sp.rsolve(E(T + 1) - rho * E(T) - cs, E(T), {E(0): E0})
    ck.equal("E_{k+1} = rho E_k + c unrolls to rho^K E0 + c (1 - rho^K)/(1 - rho)", sol,
             rho**T * E0 + cs * (1 - rho**T) / (1 - rho))
    rp, cp = _pos("rho c")
    slack = cp / (1 - rp) - cp * (1 - rp**T) / (1 - rp)
    ck.equal("c/(1-rho) - c(1-rho^K)/(1-rho) == c rho^K/(1-rho) (>= 0 for rho in [0,1))", slack,
             cp * rp**T / (1 - rp))
    return ck.evidence()


# --------------------------------------------------------------------------------------------------------------
# S17–S18
# --------------------------------------------------------------------------------------------------------------


def s17() -> Evidence:
    """S17 (Remark H.42(3)): decoupled weight decay vs L2 with P = diag(p₁, p₂): difference α w ⊙ (λ'p − λ_wd),
    vanishing for all w iff p₁ = p₂ = p and λ' = λ_wd/p; with λ' = λ_wd it needs P = I."""
    ck = _Checks("S17")
    alpha, lwd, lp = sp.symbols("alpha lambda_wd lambda_prime", nonzero=True)
    p1, p2 = sp.symbols("p1 p2", positive=True)
    w = sp.Matrix(sp.symbols("w1 w2", real=True))
    g = sp.Matrix(sp.symbols("g1 g2", real=True))
    P = sp.diag(p1, p2)
    decoupled = w - alpha * P * g - alpha * lwd * w
    l2 = w - alpha * P * (g + lp * w)
    target = sp.Matrix([alpha * w[0] * (lp * p1 - lwd), alpha * w[1] * (lp * p2 - lwd)])
    for k in range(2):
        ck.equal(f"component {k + 1}: difference == alpha w (lambda' p - lambda_wd)", (decoupled - l2)[k],
                 target[k])
    sol = sp.solve([lp * p1 - lwd, lp * p2 - lwd], [lp, p2], dict=True)
    ck.true("vanishes for all w  iff  p2 = p1 and lambda' = lambda_wd/p1",
            len(sol) == 1 and is_zero(sol[0][p2] - p1)[0] and is_zero(sol[0][lp] - lwd / p1)[0], sol)
    sol2 = sp.solve([lwd * p1 - lwd, lwd * p2 - lwd], [p1, p2], dict=True)
    ck.true("with lambda' = lambda_wd: only P = I", sol2 == [{p1: 1, p2: 1}], sol2)
    return ck.evidence()


def _mgda2(v1, v2):
    d = v1 - v2
    theta = ((v2 - v1).T * v2)[0] / (d.T * d)[0]
    return theta, theta * v1 + (1 - theta) * v2


def s18(rng=None) -> Evidence:
    """S18 (Lemma H.20): m_i ≥ σ‖d_M‖² ≥ 2σμ_ψ r = c_d r; min-norm KKT for two vectors: v_jᵀd_M = ‖d_M‖²
    for interior θ, v_jᵀd_M ≥ ‖d_M‖² with clipping (numerically)."""
    ck = _Checks("S18")
    sigma, mupsi, r, s1_, s2_ = _pos("sigma mu_psi r s1 s2")
    dM2 = 2 * mupsi * r + s1_  # definition of μ_ψ: ‖d_M‖² ≥ 2μ_ψ r
    mi = sigma * dM2 + s2_  # definition of σ: m_i ≥ σ‖d_M‖²
    cd = 2 * sigma * mupsi
    ck.equal("m_i - c_d r == sigma s1 + s2 (c_d = 2 sigma mu_psi)", mi - cd * r, sigma * s1_ + s2_)
    ck.true("m_i - c_d r >= 0", sp.expand(mi - cd * r).is_nonnegative)
    v1 = sp.Matrix(sp.symbols("v11 v12", real=True))
    v2 = sp.Matrix(sp.symbols("v21 v22", real=True))
    theta, dM = _mgda2(v1, v2)
    nd = (dM.T * dM)[0]
    ck.zero("v_1^T d_M - ||d_M||^2 == 0 (interior theta)", (v1.T * dM)[0] - nd)
    ck.zero("v_2^T d_M - ||d_M||^2 == 0 (interior theta)", (v2.T * dM)[0] - nd)
    lhs, rhs = _mgda_numeric(_rng(rng))
    ck.inequality("clipped theta: ||d_M||^2 <= v_j^T d_M (random n_w in 1..4)", lhs, rhs)
    return ck.evidence()


def _mgda_numeric(g, n=2000):
    lhs, rhs = [], []
    for _ in range(n):
        nw = int(g.integers(1, 5))
        v1, v2 = g.standard_normal(nw), g.standard_normal(nw)
        if g.random() < 0.2:  # nearly aligned pairs exercise the clipping
            v2 = v1 * g.uniform(0.2, 3.0) + 0.05 * g.standard_normal(nw)
        dd = v1 - v2
        theta = float(np.clip((v2 - v1) @ v2 / (dd @ dd), 0.0, 1.0))
        dM = theta * v1 + (1 - theta) * v2
        scale = max(v1 @ v1, v2 @ v2)
        for v in (v1, v2):
            lhs.append((dM @ dM) / scale)
            rhs.append((v @ dM) / scale)
    return np.array(lhs), np.array(rhs)


# --------------------------------------------------------------------------------------------------------------
# S19–S26
# --------------------------------------------------------------------------------------------------------------


def s19() -> Evidence:
    """S19 (I4): d/ds β(l(w − s v))|_{s=0} = −vᵀGA/Z, n_w = 2, m = 2, generic l_j(w)."""
    ck = _Checks("S19")
    w, funcs = _generic_losses(2, 2)
    v = sp.symbols("v1 v2", real=True)
    s = sp.Symbol("s", real=True)
    lam = _pos("lambda1:3")
    a, beta, Z = adjustment_expr(lam, funcs)
    shifted = beta.subs({wk: wk - s * vk for wk, vk in zip(w, v, strict=True)}, simultaneous=True)
    dd = sp.diff(shifted, s).subs(s, 0).doit()
    GA = [sum(sp.diff(f, wk) * aj for f, aj in zip(funcs, a, strict=True)) for wk in w]
    target = -sum(vk * GAk for vk, GAk in zip(v, GA, strict=True)) / Z
    ck.zero("d/ds beta(l(w - s v)) at s=0 + v^T G A / Z", _freeze(dd - target, funcs, w))
    return ck.evidence()


def s20() -> Evidence:
    """S20: κ_HΔ̄ + κ_ηη + b/c_d ≡ (λ_max/c_d)(BΔ̄ + L₀B²η/2) + b/c_d, and (2/μ)ε₀ ≡ eq 73."""
    ck = _Checks("S20")
    lmax, B, cd, L0, eta, Dbar, b, mu = _pos("lambda_max B c_d L0 eta Delta_bar b mu")
    kH = lmax * B / cd
    keta = lmax * L0 * B**2 / (2 * cd)
    eps0 = kH * Dbar + keta * eta + b / cd
    ck.equal("kappa_H Dbar + kappa_eta eta + b/c_d == (lmax/c_d)(B Dbar + L0 B^2 eta/2) + b/c_d", eps0,
             (lmax / cd) * (B * Dbar + L0 * B**2 * eta / 2) + b / cd)
    ck.equal("(2/mu) eps_0 == eq 73", 2 / mu * eps0,
             2 * lmax / (mu * cd) * (B * Dbar + L0 * B**2 * eta / 2) + 2 * b / (mu * cd))
    return ck.evidence()


def s21() -> Evidence:
    """S21 (example H.18(b)): l₁ = 1+w, l₂ = 1−w, λ = (½,½): ψ = (1+|w|)/2, λ₁l₁ − λ₂l₂ = w,
    J*_ε = {1,2} iff |w| ≤ ε_act, 0 ∈ conv{½,−½}, a₁ − a₂ = ½log((1+w)/(1−w)) = w + w³/3 + O(w⁴),
    LP direction d = min(1, a₁−a₂) (= a₁ − a₂ for 0 < w ≤ tanh 1)."""
    ck = _Checks("S21")
    w = sp.Symbol("w", real=True)
    half = sp.Rational(1, 2)
    lam = [half, half]
    loss = [1 + w, 1 - w]
    wl = [lj * l for lj, l in zip(lam, loss, strict=True)]
    ck.equal("lambda_1 l_1 - lambda_2 l_2 == w", wl[0] - wl[1], w)
    for sign, ws in (("w > 0", sp.Symbol("u", positive=True)), ("w < 0", -sp.Symbol("u", positive=True))):
        psi = sp.Max(*[e.subs(w, ws) for e in wl])
        ck.equal(f"psi == (1+|w|)/2  [{sign}]", psi, (1 + sp.Abs(ws)) / 2)
        gap = psi - sp.Min(*[e.subs(w, ws) for e in wl])
        ck.equal(f"psi - min_j lambda_j l_j == |w|, so J*_eps = {{1,2}} iff |w| <= eps_act  [{sign}]", gap,
                 sp.Abs(ws))
    th = sp.Symbol("theta", nonnegative=True)
    sol = sp.solve(th * half * 1 + (1 - th) * half * (-1), th)
    ck.true("0 in conv{lambda_1 g_1, lambda_2 g_2} = conv{1/2, -1/2} (theta = 1/2)", sol == [half], sol)
    # adjustments on the open interval |w| < 1
    u = sp.Symbol("u", positive=True)
    lampos = _pos("lam1 lam2")
    a, beta, Z = adjustment_expr(list(lampos), loss)
    a = [aj.subs({lampos[0]: half, lampos[1]: half}) for aj in a]
    d12 = a[0] - a[1]
    ck.equal("a_1 - a_2 == 1/2 log((1+w)/(1-w))", d12, half * sp.log((1 + w) / (1 - w)))
    ser = sp.series(half * sp.log((1 + w) / (1 - w)), w, 0, 4).removeO()
    ck.equal("series(a_1 - a_2, w, 0, 4) == w + w^3/3", ser, w + w**3 / 3)
    # LP at 0 < w < 1: G = [1, -1], C = [[1,-1],[-1,1]]; delta = mu_1 - mu_2 in [-1, 1]
    mu1 = sp.Symbol("mu1", nonnegative=True)
    mu = sp.Matrix([mu1, 1 - mu1])
    C = sp.Matrix([[1, -1], [-1, 1]])
    A = sp.Matrix(a)
    CA = C * A
    Cmu = C * mu
    ck.equal("(C A)_1 == a_1 - a_2 > 0 for w in (0,1): J = {1}, Jbar = {2}", CA[0], d12)
    ck.equal("(C A)_2 == -(a_1 - a_2)", CA[1], -d12)
    ratio = sp.cancel(((1 + w) / (1 - w)).subs(w, u / (1 + u)))  # w = u/(1+u) ranges over (0, 1)
    ck.true("a_1 - a_2 > 0 for w in (0,1): (1+w)/(1-w) = 1 + 2u > 1 with w = u/(1+u), u > 0",
            (ratio - 1).is_positive, ratio)
    ck.equal("(C mu)_1 == delta: J* = {1} row gives delta >= 0", Cmu[0], 2 * mu1 - 1)
    ck.equal("(C mu)_2 >= (C A)_2  <=>  delta <= a_1 - a_2", Cmu[1] - CA[1], d12 - (2 * mu1 - 1))
    ck.equal("objective mu^T C A == delta (a_1 - a_2), increasing in delta", (mu.T * CA)[0], (2 * mu1 - 1) * d12)
    thr = sp.solve(sp.Eq(sp.atanh(w), 1), w)
    ck.true("so d = G mu* = delta* = min(1, a_1 - a_2); a_1 - a_2 <= 1 iff w <= tanh(1)",
            len(thr) == 1 and is_zero(thr[0] - sp.tanh(1))[0], thr)
    ck.extra["lp_direction_cap"] = {
        "note": "d = a_1 - a_2 only for 0 < w <= tanh(1) ~ 0.7616; for larger w the simplex caps d at 1",
        "tanh(1)": float(sp.tanh(1)),
    }
    return ck.evidence()


def s22(rng=None, n: int = 100_000) -> Evidence:
    """S22 (numeric, 10⁵ samples): |max_j λ_jl_j − max_j λ'_jl_j| ≤ max_j |λ_j − λ'_j| l_j, m = 2."""
    ck = _Checks("S22")
    g = _rng(rng)
    lam = 0.95 * g.dirichlet(np.ones(2), size=n) + 0.05 / 2
    lam2 = 0.95 * g.dirichlet(np.ones(2), size=n) + 0.05 / 2
    near = g.random(n) < 0.3  # also nearby preferences and equal weighted losses (ties)
    lam2[near] = lam[near] + 1e-3 * g.standard_normal((int(near.sum()), 1)) * np.array([1.0, -1.0])
    lam2 = np.clip(lam2, 1e-6, None)
    lam2 /= lam2.sum(axis=1, keepdims=True)
    loss = np.exp(g.uniform(-3, 3, (n, 2)))
    tie = g.random(n) < 0.1
    loss[tie, 1] = lam[tie, 0] * loss[tie, 0] / lam[tie, 1]
    lhs = np.abs(np.max(lam * loss, axis=1) - np.max(lam2 * loss, axis=1))
    rhs = np.max(np.abs(lam - lam2) * loss, axis=1)
    ck.inequality("|psi_lambda(l) - psi_lambda'(l)| <= max_j |lambda_j - lambda'_j| l_j", lhs, rhs)
    return ck.evidence()


def s23() -> Evidence:
    """S23: L₀αp₊²σ₀²/(2μ_PLp₋S) ≤ ε ⟺ S ≥ L₀αp₊²σ₀²/(2μ_PLp₋ε); dimensional check ([ψ]=F, [w]=W,
    [μ_PL]=[L₀]=F/W², [α]=W²/F, P and S dimensionless, [σ₀²]=[∇ψ]²=F²/W²): the floor has units F, the
    threshold is dimensionless; the seed's μ_PL² version is not."""
    ck = _Checks("S23")
    L0, alpha, pp, pm, sig2, mu, S, eps = _pos("L0 alpha p_plus p_minus sigma0sq mu_PL S epsilon")
    floor = L0 * alpha * pp**2 * sig2 / (2 * mu * pm * S)
    Sstar = L0 * alpha * pp**2 * sig2 / (2 * mu * pm * eps)
    ck.equal("(floor - eps)(2 mu p_- S) == 2 mu p_- eps (S* - S)", (floor - eps) * (2 * mu * pm * S),
             2 * mu * pm * eps * (Sstar - S))
    ck.true("2 mu p_- S > 0 and 2 mu p_- eps > 0, hence floor <= eps <=> S >= S*",
            (2 * mu * pm * S).is_positive and (2 * mu * pm * eps).is_positive)
    sol = sp.solve_univariate_inequality(floor <= eps, S, relational=False)
    # sympy solves over all real S; the part S < 0 is outside the domain S > 0
    ck.true("solve_univariate_inequality(floor <= eps, S) == (-oo, 0) U [S*, oo), i.e. [S*, oo) on S > 0",
            sol in (sp.Interval(Sstar, sp.oo), sp.Union(sp.Interval.open(-sp.oo, 0), sp.Interval(Sstar, sp.oo))),
            sol)
    F, W = _pos("F W")
    units = {L0: F / W**2, mu: F / W**2, alpha: W**2 / F, sig2: F**2 / W**2, pp: 1, pm: 1, S: 1, eps: F}

    def unit(e):  # units of a monomial, numerical constants dropped
        return sp.powsimp(sp.cancel(e.subs(units, simultaneous=True) / e.subs({k: 1 for k in units})))

    uf, ut = unit(floor), unit(Sstar)
    seed_thr = L0 * alpha * pp**2 * sig2 / (mu**2 * pm * eps)
    us = unit(seed_thr)
    ck.equal("[floor] == F", uf, F)
    ck.equal("[S*] == 1 (dimensionless)", ut, 1)
    ck.true("[seed threshold with mu_PL^2] != 1", not is_zero(us - 1)[0], us)
    ck.extra["units"] = {"floor": str(uf), "threshold": str(ut), "seed_threshold_mu_PL^2": str(us)}
    return ck.evidence()


def s24() -> Evidence:
    """S24 (family F3): E ψ(w − αPd̃) = ψ(w − αPg) + ½λ_{j*}·α²λ_{j*}²·tr(QPΣ_ξP)/S, n_w = 2."""
    ck = _Checks("S24")
    n = 2
    lj, t, alpha, S = _pos("lambda_jstar t alpha S")
    w = sp.Matrix(sp.symbols("w1:3", real=True))
    c = sp.Matrix(sp.symbols("c1:3", real=True))
    xi = sp.Matrix(sp.symbols("xi1:3", real=True))
    q11, q12, q22, p11, p12, p22 = sp.symbols("q11 q12 q22 p11 p12 p22", real=True)
    s11, s12, s22_ = sp.symbols("s11 s12 s22", real=True)
    Q = sp.Matrix([[q11, q12], [q12, q22]])
    P = sp.Matrix([[p11, p12], [p12, p22]])
    Sig = sp.Matrix([[s11, s12], [s12, s22_]])

    def psi(v):
        e = v - c
        return t + lj * (e.T * Q * e)[0] / 2

    g = lj * Q * (w - c)
    dtil = lj * (Q * (w - c) + xi)  # ξ = ξ̄_S: mean zero, covariance Σ_ξ/S
    after = sp.Poly(sp.expand(psi(w - alpha * P * dtil)), *xi)
    expect = 0
    for monom, coeff in after.terms():
        deg = sum(monom)
        if deg == 0:
            expect += coeff
        elif deg == 2:
            idx = [k for k in range(n) for _ in range(monom[k])]
            expect += coeff * Sig[idx[0], idx[1]] / S
        # degree 1: zero mean
    ck.true("psi(w - alpha P dtilde) is quadratic in xi", after.total_degree() <= 2, after.total_degree())
    target = psi(w - alpha * P * g) + lj / 2 * alpha**2 * lj**2 * (Q * P * Sig * P).trace() / S
    ck.equal("E psi(w - alpha P dtilde) == psi(w - alpha P g) + 1/2 lambda alpha^2 lambda^2 tr(Q P Sigma P)/S",
             expect, target)
    return ck.evidence()


def s25(rng=None) -> Evidence:
    """S25: the MGDA weights are feasible in the balancing LP: (Cμ_M)_j = g_jᵀd_M ≥ ‖d_M‖² ≥ 0 ≥ (CA)_j for
    j ∈ J̄ (m = 2: symbolic for interior and clipped θ; numeric on random instances)."""
    ck = _Checks("S25")
    g1 = sp.Matrix(sp.symbols("g11 g12", real=True))
    g2 = sp.Matrix(sp.symbols("g21 g22", real=True))
    G = g1.row_join(g2)
    theta, dM = _mgda2(g1, g2)
    mu = sp.Matrix([theta, 1 - theta])
    C = G.T * G
    nd = (dM.T * dM)[0]
    for j in range(2):
        ck.zero(f"(C mu_M)_{j + 1} == g_{j + 1}^T d_M", (C * mu)[j] - (G[:, j].T * dM)[0])
        ck.zero(f"interior theta: (C mu_M)_{j + 1} - ||d_M||^2 == 0", (C * mu)[j] - nd)
    dd = g1 - g2
    n2 = (dd.T * dd)[0]
    # θ_raw ≥ 1 ⇒ θ = 1, d_M = g1: g2ᵀg1 − ‖g1‖² = (θ_raw − 1)‖g1 − g2‖² ≥ 0
    ck.zero("theta_raw >= 1: g_2^T g_1 - ||g_1||^2 == (theta_raw - 1)||g_1 - g_2||^2",
            (g2.T * g1)[0] - (g1.T * g1)[0] - (theta - 1) * n2)
    # θ_raw ≤ 0 ⇒ θ = 0, d_M = g2: g1ᵀg2 − ‖g2‖² = −θ_raw‖g1 − g2‖² ≥ 0
    ck.zero("theta_raw <= 0: g_1^T g_2 - ||g_2||^2 == -theta_raw ||g_1 - g_2||^2",
            (g1.T * g2)[0] - (g2.T * g2)[0] + theta * n2)
    # numeric: every balancing-LP row at μ_M, with random A (the argument needs only (CA)_j ≤ 0 on J̄)
    gen = _rng(rng)
    lhs, rhs, kl, kr = [], [], [], []
    for _ in range(2000):
        nw = int(gen.integers(1, 5))
        Gn = gen.standard_normal((nw, 2))
        if gen.random() < 0.2:
            Gn[:, 1] = Gn[:, 0] * gen.uniform(0.2, 3.0) + 0.05 * gen.standard_normal(nw)
        A = gen.standard_normal(2)
        Cn = Gn.T @ Gn
        dvec = Gn[:, 0] - Gn[:, 1]
        th = float(np.clip((Gn[:, 1] - Gn[:, 0]) @ Gn[:, 1] / (dvec @ dvec), 0.0, 1.0))
        muM = np.array([th, 1 - th])
        CA, Cmu = Cn @ A, Cn @ muM
        J = CA > 0
        Jstar = np.zeros(2, dtype=bool)
        Jstar[int(gen.integers(0, 2))] = True
        rows = np.where(Jstar, 0.0, np.where(J, -np.inf, CA)) if J.any() else np.zeros(2)
        scale = max(np.abs(Cn).max(), 1e-300)
        dM = Gn @ muM
        kl += [dM @ dM / scale] * 2
        kr += list(Cmu / scale)
        for j in range(2):
            if np.isfinite(rows[j]):
                lhs.append(rows[j] / scale)
                rhs.append(Cmu[j] / scale)
    ck.inequality("random m=2 instances: ||d_M||^2 <= (C mu_M)_j = g_j^T d_M", kl, kr)
    ck.inequality("random m=2 instances: every balancing-LP row (C mu_M)_j >= rhs_j", lhs, rhs,
                  ratio_meaningful=False)
    return ck.evidence()


def s26() -> Evidence:
    """S26 (family F1, n_w = 1, m = 2): w(u) = Σu_jq_jc_j/Σu_jq_j is stationary for Σu_jl_j; with
    λ ∝ 1/l(w(u)) the normalised weights u_j/λ_j lie in the simplex and give 0 ∈ conv{λ_jg_j}."""
    ck = _Checks("S26")
    w = sp.Symbol("w", real=True)
    u1 = sp.Symbol("u1", positive=True)
    q1, q2, b1, b2 = _pos("q1 q2 b1 b2")
    c1, c2 = sp.symbols("c1 c2", real=True)
    u = [u1, 1 - u1]
    ls = [q1 * (w - c1) ** 2 / 2 + b1, q2 * (w - c2) ** 2 / 2 + b2]
    gs = [sp.diff(lj, w) for lj in ls]
    wu = (u[0] * q1 * c1 + u[1] * q2 * c2) / (u[0] * q1 + u[1] * q2)
    ck.zero("sum_j u_j l_j'(w(u)) == 0", sum(uj * gj.subs(w, wu) for uj, gj in zip(u, gs, strict=True)))
    # λ ∝ 1/l(w(u)): only the positivity of the loss values matters for the rest, so they are kept as
    # positive symbols L_j = l_j(w(u)) (the identities below hold for all such values).
    lvals = list(_pos("L1 L2"))
    inv = [1 / lv for lv in lvals]
    lam = [iv / sum(inv) for iv in inv]
    ck.zero("sum_j lambda_j == 1", sum(lam) - 1)
    ck.zero("lambda_1 l_1(w(u)) == lambda_2 l_2(w(u)) (on the ray, beta = 0)", lam[0] * lvals[0] - lam[1] * lvals[1])
    kw = [uj / lj for uj, lj in zip(u, lam, strict=True)]
    theta = [k / sum(kw) for k in kw]
    ck.zero("sum_j theta_j == 1", sum(theta) - 1)
    v = sp.Symbol("v", positive=True)  # u_1 = 1/(1+v) ranges over (0, 1)
    ck.true("theta_j > 0 for u_1 in (0,1) (u_j > 0, lambda_j > 0)",
            all(sp.factor(th.subs(u1, 1 / (1 + v))).is_positive for th in theta))
    ck.zero("sum_j theta_j lambda_j g_j(w(u)) == 0  (0 in conv{lambda_j g_j})",
            sum(th * lj * gj.subs(w, wu) for th, lj, gj in zip(theta, lam, gs, strict=True)))
    return ck.evidence()


# --------------------------------------------------------------------------------------------------------------
# registration
# --------------------------------------------------------------------------------------------------------------

IDENTITIES: dict[str, tuple[str, object]] = {}


def _register_all() -> None:
    for k in range(1, 27):
        fn = globals()[f"s{k}"]
        sid = f"S{k}"
        name = _NAMES[sid]
        IDENTITIES[sid] = (name, fn)
        takes_rng = "rng" in fn.__code__.co_varnames[: fn.__code__.co_argcount]

        def run(config, rng, fn=fn, takes_rng=takes_rng):
            return fn(rng) if takes_rng else fn()

        run.__module__ = __name__
        register(sid, name, number=str(k))(run)


_NAMES = {
    "S1": "Second-order expansion of beta",
    "S2": "First order of the adjustments",
    "S3": "Norm of A against beta near uniformity",
    "S4": "Gradient of beta in the losses; Euler identity",
    "S5": "Gradient of beta in the parameters",
    "S6": "Jacobian of A in lambda",
    "S7": "Equation 9: dispersion in multiplier space",
    "S8": "Deviation split, eq 44",
    "S9": "Weighted variance as pairwise sum",
    "S10": "Lemma H.25: non-near-active objectives stay below the bound",
    "S11": "Rearrangement in Theorem H.28",
    "S12": "Unrolled recursion, eq 66",
    "S13": "Two-phase recursion (H.32)",
    "S14": "Floor of H.22",
    "S15": "Step-size condition of H.43",
    "S16": "Telescoping of H.43",
    "S17": "Decoupled weight decay against L2 (Remark H.42(3))",
    "S18": "Lemma H.20 chain and two-vector min-norm KKT",
    "S19": "Directional derivative of beta (I4)",
    "S20": "Band-radius consistency",
    "S21": "Example H.18(b) closed form",
    "S22": "Chebyshev perturbation (L1), numeric",
    "S23": "Adaptation-floor threshold and dimensions",
    "S24": "Exact one-step expectation for family F3",
    "S25": "Feasibility of the MGDA weights in the balancing LP",
    "S26": "Planted-optimum certificate (family F1)",
}

_register_all()
