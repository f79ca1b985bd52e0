r"""H.42 — Remark (AdamW differs from the idealised update of H.41), part (3): decoupled weight decay.

Setting
    The experiments adapt with AdamW, whereas H.41 (eq 88) assumes ``w_{k+1} = w_k − αP_k d̃_k`` with ``P_k``
    𝓕_k-measurable, ``p₋I ⪯ P_k ⪯ p₊I``, no momentum and no weight decay. The remark lists three differences:
    (1) momentum — the conditional mean of the direction is not ``∇ψ``; (2) measurability — AdamW's ``v_k`` contains
    the current stochastic gradient, so H.41(a) fails (a variant using ``v_{k−1}`` satisfies it); (3) decoupled
    weight decay.

Statement checked (part (3), with O-15's precision)
    For a symmetric ``P``, step ``α > 0`` and coefficients ``λ_wd, λ' > 0``, the decoupled update
    ``w⁺ = w − αPg − αλ_wd w`` and the L2-regularised preconditioned update ``w⁺ = w − αP(g + λ'w)`` differ by
    ``α(λ'P − λ_wd I)w``. Hence

    * **if** ``P = pI`` and ``λ' = λ_wd/p``, the two updates coincide for every ``w, g`` (with ``λ' = λ_wd``
      literally only when ``P = I``);
    * **only if**: when ``P`` is not a multiple of ``I`` no ``λ'`` makes them coincide for all ``w`` (at any ``w``
      that is not an eigenvector of ``P`` the smallest difference over ``λ'`` is positive).

How it is checked (docs/spec/statements.md#t-h42, docs/spec/identities.md#s17)
    * symbolically: the sympy identity S17 of :mod:`verification.statements.symbolic` (reused, not duplicated): the
      difference is ``α w ⊙ (λ'p − λ_wd)`` for ``P = diag(p₁, p₂)``, vanishing for all ``w`` iff ``p₁ = p₂ = p`` and
      ``λ' = λ_wd/p``; with ``λ' = λ_wd`` only ``P = I``;
    * numerically: the T-H42 numbers ``P = diag(1, 3)``, ``w = (1, 1)``, ``g = (0.2, −0.1)``, ``α = 0.1``,
      ``λ_wd = 0.01`` (the updates differ for every ``λ'``) and ``P = 2I`` (they coincide for ``λ' = λ_wd/2``), plus
      random ``w, g`` with ``P = pI``, ``p ∈ {0.5, 1, 2, 3}`` (coincide, ``‖difference‖ ≤ 1e-12``) and random SPD
      ``P`` not ``∝ I`` (the least-squares ``λ'`` leaves a positive residual).

    Parts (1) and (2) are exercised elsewhere: (2) by the H.39-41 negative control (AdamW-style ``P_k`` from the
    current sample) and the H.43 non-measurable control; (1) needs no computation (``E[βm_{k−1} + d̃_k | 𝓕_k] =
    βm_{k−1} + ∇ψ``).

Negative control
    ``P = diag(1, 3)`` declared to coincide with the L2 step for ``λ' = λ_wd/p̄`` (``p̄ = 2``, the mean eigenvalue):
    the hypothesis ``P ∝ I`` is flagged and the updates differ.

Reference: docs/spec/statements.md#t-h42, docs/spec/open-points.md#o-15, docs/spec/identities.md#s17.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from verification.core.evidence import Evidence
from verification.statements import _adaptation_evidence as AE
from verification.statements import _adaptation_theory as AT
from verification.statements import symbolic

STATEMENT_ID = "H.42"
NAME = "AdamW differs: decoupled weight decay equals L2 only for P = pI with lambda' = lambda_wd/p (S17)"

H_SCALAR = "P = pI and lambda' = lambda_wd/p"
H_NONSCALAR = "P is not a multiple of I"


@dataclass(frozen=True)
class Config:
    p_values: tuple = (0.5, 1.0, 2.0, 3.0)
    n_random: int = 20
    n_w: int = 3
    alpha: float = 0.1
    lambda_wd: float = 0.01

    @classmethod
    def paper(cls) -> Config:
        """The paper-scale preset (`--scale paper`): the samples the conclusions are counted over, larger."""
        return cls(n_random=80)


def decoupled(w, g, P, alpha, lam_wd):
    """AdamW-style decoupled weight decay: ``w − αPg − αλ_wd w``."""
    return w - alpha * P @ g - alpha * lam_wd * w


def l2_step(w, g, P, alpha, lam_prime):
    """L2-regularised preconditioned step: ``w − αP(g + λ'w)``."""
    return w - alpha * P @ (g + lam_prime * w)


def best_residual(w, P, alpha, lam_wd) -> tuple[float, float]:
    """``min_{λ'} ‖decoupled − L2‖ = min_{λ'} α‖λ'Pw − λ_wd w‖`` (least squares) and the minimiser."""
    Pw = P @ w
    lp = lam_wd * float(w @ Pw) / float(Pw @ Pw)
    return float(alpha * np.linalg.norm(lp * Pw - lam_wd * w)), lp


def _rows(cfg: Config, rng, s17: Evidence) -> AE.Rows:
    rows = AE.Rows()
    rows.add("S17 (sympy): difference = alpha w (lambda' p - lambda_wd); vanishes iff p1 = p2, lambda' = lambda_wd/p",
             0.0, 0.0, ok=s17.verdict == "holds", hyp={H_SCALAR: True}, s17_verdict=s17.verdict, ckind="boolean")
    a, lwd = cfg.alpha, cfg.lambda_wd
    # T-H42(3) numbers
    w0, g0 = np.array([1.0, 1.0]), np.array([0.2, -0.1])
    P2 = 2.0 * np.eye(2)
    rows.add("T-H42(3): P = 2I, lambda' = lambda_wd/2: updates coincide",
             np.linalg.norm(decoupled(w0, g0, P2, a, lwd) - l2_step(w0, g0, P2, a, lwd / 2)), 0.0,
             hyp={H_SCALAR: True}, P="2I", ckind="identity")
    Pd = np.diag([1.0, 3.0])
    res, lp = best_residual(w0, Pd, a, lwd)
    rows.add("T-H42(3): P = diag(1,3): min over lambda' of ||difference|| > 0", 0.0, 0.0,
             ok=res > 1e-12 * a * lwd * np.linalg.norm(w0), hyp={H_NONSCALAR: True}, P="diag(1,3)", residual=res,
             lambda_prime=lp, ckind="boolean")
    # random w, g with P = pI
    for p in cfg.p_values:
        P = p * np.eye(cfg.n_w)
        W = rng.standard_normal((cfg.n_random, cfg.n_w))
        G = rng.standard_normal((cfg.n_random, cfg.n_w))
        diff = [np.linalg.norm(decoupled(w, g, P, a, lwd) - l2_step(w, g, P, a, lwd / p)) for w, g in zip(W, G,
                                                                                                          strict=True)]
        rows.add("P = pI, lambda' = lambda_wd/p: ||decoupled - L2|| <= 0", np.array(diff), 0.0, hyp={H_SCALAR: True},
                 p=p, ckind="identity")
    # random SPD P not proportional to I
    res_all = []
    for _ in range(cfg.n_random):
        U = AT.random_orthogonal(rng, cfg.n_w)
        P = (U * rng.uniform(0.5, 2.0, cfg.n_w)) @ U.T
        P = 0.5 * (P + P.T)
        w = rng.standard_normal(cfg.n_w)
        r, _ = best_residual(w, P, a, lwd)
        res_all.append(r)
    res_all = np.array(res_all)
    rows.add("P not prop. to I: min over lambda' of ||difference|| > 0 (random SPD P, random w)", 0.0, 0.0,
             ok=res_all > 1e-12 * a * lwd, hyp={H_NONSCALAR: True}, residual=res_all, ckind="boolean")
    return rows


def run(config: Config | None, rng: np.random.Generator) -> Evidence:
    cfg = config or Config()
    s17 = symbolic.s17()
    rows = _rows(cfg, rng, s17)
    lhs, rhs, ok = rows.arrays()
    a, lwd = cfg.alpha, cfg.lambda_wd
    w0, g0 = np.array([1.0, 1.0]), np.array([0.2, -0.1])
    Pd = np.diag([1.0, 3.0])
    details = {
        "s17": {"verdict": s17.verdict, "checks": s17.details.get("checks")},
        "t_h42_3": {
            "decoupled_diag13": decoupled(w0, g0, Pd, a, lwd), "l2_diag13_lambda_wd": l2_step(w0, g0, Pd, a, lwd),
            "min_residual_over_lambda_prime_diag13": best_residual(w0, Pd, a, lwd)[0],
            "decoupled_2I": decoupled(w0, g0, 2 * np.eye(2), a, lwd),
            "l2_2I_lambda_wd_over_2": l2_step(w0, g0, 2 * np.eye(2), a, lwd / 2)},
        "o15": "coincidence 'only for P prop. to I' holds up to rescaling lambda' = lambda_wd/p; with lambda' = lambda_wd "
               "literally only for P = I (S17)",
        "parts_1_2": "(2) exercised by the H.39-41 and H.43 negative controls; (1) needs no computation",
        "mc_assertions": {"count": 0, "assertions": []},
    }
    return Evidence.from_implication(STATEMENT_ID, NAME, rows.monitor(), lhs, rhs, ok=ok, tightness=None,
                                     instance_data=rows.instance_data(), details=details, **rows.evidence_args())


def negative_control(config: Config | None, rng: np.random.Generator) -> Evidence:
    cfg = config or Config()
    a, lwd = cfg.alpha, cfg.lambda_wd
    Pd = np.diag([1.0, 3.0])
    W = np.concatenate([[[1.0, 1.0]], rng.standard_normal((cfg.n_random, 2))])
    G = np.concatenate([[[0.2, -0.1]], rng.standard_normal((cfg.n_random, 2))])
    diff = np.array([np.linalg.norm(decoupled(w, g, Pd, a, lwd) - l2_step(w, g, Pd, a, lwd / 2.0))
                     for w, g in zip(W, G, strict=True)])
    rows = AE.Rows()
    rows.add("P = diag(1,3) declared to coincide with L2 for lambda' = lambda_wd/2", diff, 0.0,
             hyp={H_SCALAR: False}, P="diag(1,3)", ckind="identity")
    lhs, rhs, _ = rows.arrays()
    return Evidence.from_control(STATEMENT_ID, NAME, rows.monitor(), H_SCALAR, lhs, rhs,
                                 instance_data=rows.instance_data(),
                                 details={"control": "P = diag(1, 3) is not a multiple of I"})
