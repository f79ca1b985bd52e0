r"""EX.1 — the Chebyshev scalarisation is Lipschitz in the losses: ``|ψ(l) − ψ(l')| ≤ λ_max ‖l − l'‖_∞``.

Setting
    A client with preference ``λ`` in the open simplex and two loss vectors ``l, l'`` (m objectives, positive);
    ``ψ_λ(l) = max_j λ_j l_j`` (:func:`sim.preference.chebyshev`).

Hypotheses
    The same preference ``λ`` at both points (a client whose preference moved between the two points is another
    statement).

Guarantee
    ``|ψ_λ(l) − ψ_λ(l')| ≤ λ_max ‖l − l'‖_∞``, since ``max_j a_j − max_j b_j ≤ max_j (a_j − b_j)``.

What is checked
    ``n_instances`` random instances: ``m`` cycling over ``m_values``, ``λ`` from ``Dirichlet(1)`` pulled into the
    open simplex, ``l`` log-uniform over four decades and ``l' = l·exp(s ξ)`` with ``ξ ~ N(0, 1)`` and ``s`` cycling
    over ``scales``; ``lhs = |ψ(l) − ψ(l')|``, ``rhs = λ_max‖l − l'‖_∞``. The bound is attained when one objective
    is the bottleneck at both points and moves the most, so the tightness is 1 up to sampling.

Negative control
    The preference moves between the two points (``λ'`` drawn afresh) and the same bound is claimed: the monitor
    flags "same preference", and with ``l' = l`` the bound (zero) fails wherever ``ψ_λ(l) ≠ ψ_λ'(l)``.

Reference
    A worked example of the documentation ("Write your own statement"); not a statement of the specification.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.preference import chebyshev
from verification.core.evidence import Evidence, HypothesisMonitor

STATEMENT_ID = "EX.1"
NAME = "Chebyshev scalarisation is Lipschitz in the losses: |psi(l) - psi(l')| <= lambda_max ||l - l'||_inf"

HYP_SAME = "same preference at both points"
CONCLUSION = "|psi(l) - psi(l')| <= lambda_max ||l - l'||_inf"


@dataclass(frozen=True)
class Config:
    """Defaults run in well under a second."""

    n_instances: int = 2000
    m_values: tuple = (2, 3, 5)
    scales: tuple = (1e-6, 1e-2, 1.0)


def _instances(cfg: Config, rng: np.random.Generator, *, new_preference: bool):
    """Per instance: ``(λ at l, λ at l', l, l')``."""
    out = []
    for k in range(cfg.n_instances):
        m = cfg.m_values[k % len(cfg.m_values)]
        lam = 0.9 * rng.dirichlet(np.ones(m)) + 0.1 / m
        lam2 = 0.9 * rng.dirichlet(np.ones(m)) + 0.1 / m if new_preference else lam
        loss = 10.0 ** rng.uniform(-2, 2, m)
        scale = 0.0 if new_preference else cfg.scales[k % len(cfg.scales)]
        loss2 = loss * np.exp(scale * rng.standard_normal(m))
        out.append((lam, lam2, loss, loss2))
    return out


def _measure(cfg: Config, rng: np.random.Generator, *, new_preference: bool):
    """The instances, the monitor of the hypothesis and the two sides of the conclusion."""
    inst = _instances(cfg, rng, new_preference=new_preference)
    mon = HypothesisMonitor(len(inst))
    mon.record(HYP_SAME, [np.array_equal(a, b) for a, b, _, _ in inst])
    lhs = np.array([abs(float(chebyshev(l1, a)) - float(chebyshev(l2, b))) for a, b, l1, l2 in inst])
    rhs = np.array([a.max() * np.abs(l1 - l2).max() for a, b, l1, l2 in inst])
    return inst, mon, lhs, rhs


def run(config: Config | None, rng: np.random.Generator) -> Evidence:
    inst, mon, lhs, rhs = _measure(config or Config(), rng, new_preference=False)
    return Evidence.from_implication(STATEMENT_ID, NAME, mon, lhs, rhs, conclusion=CONCLUSION,
                                     instance_data=lambda i: {"prefs": inst[i][0], "l": inst[i][2],
                                                              "l_prime": inst[i][3]})


def negative_control(config: Config | None, rng: np.random.Generator) -> Evidence:
    _, mon, lhs, rhs = _measure(config or Config(), rng, new_preference=True)
    return Evidence.from_control(STATEMENT_ID, NAME, mon, HYP_SAME, lhs, rhs, conclusion=CONCLUSION)
