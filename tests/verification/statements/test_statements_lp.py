"""Executable statements of the LP layer (docs/spec/statements.md#t-h1-3, docs/spec/statements.md#t-h4,
docs/spec/statements.md#t-h5, docs/spec/statements.md#t-h6, docs/spec/statements.md#t-h7,
docs/spec/statements.md#t-h9, docs/spec/statements.md#t-h10, docs/spec/statements.md#t-h11).

Each statement is run with its default Config through :func:`verification.core.registry.run_statement` (check and
negative control, each with a fresh ``default_rng(0)``): the verdict must be "holds" and the negative control
must be "detected" (every one of these statements has a negative control).
"""

from __future__ import annotations

import numpy as np
import pytest

from sim.preference import adjustment
from verification.core.evidence import bound_factor
from verification.statements import h10_adjustment_lipschitz as H10

LP_STATEMENTS = ["H.1-3", "H.4", "H.5", "H.6", "H.7", "H.9", "H.10", "H.11"]


@pytest.mark.parametrize("stmt_id", LP_STATEMENTS)
def test_lp_statement_holds_and_control_detected(stmt_id, default_run):
    ev = default_run(stmt_id)
    assert ev.id == stmt_id
    assert ev.verdict == "holds", (ev.verdict, ev.counterexamples[:1], ev.details)
    assert ev.instances - ev.excluded > 0
    assert ev.negative_control == "detected", (ev.control.to_dict() if ev.control else None)
    if stmt_id == "H.4":  # recorded frequencies, expected > 0 on F6 (O-9, O-21)
        assert ev.details["gamma_nonpositive_balancing"] > 0
        assert ev.details["restricted_descent_infeasible"] > 0


# ------------------------------------------------------------------------------ H.10 mean-value link


def test_h10_adjustment_jacobian_matches_finite_differences():
    """J_A(λ) = diag(1 + s) − λvᵀ (I6, S6) on tangent directions of the simplex, by central differences."""
    rng = np.random.default_rng(3)
    for m in (2, 3, 5, 7):
        for _ in range(5):
            l = np.exp(rng.uniform(-3, 3, m))
            lam = 0.9 * rng.dirichlet(np.ones(m)) + 0.1 / m
            u = rng.standard_normal(m)
            u -= u.mean()
            h = 1e-6
            fd = (adjustment(l, lam + h * u) - adjustment(l, lam - h * u)) / (2 * h)
            Ju = H10.adjustment_jacobian(l, lam) @ u
            assert np.allclose(Ju, fd, rtol=1e-6, atol=1e-8 * np.abs(fd).max())


def test_h10_segment_sup_bound_covers_the_segment():
    """The cell bound of sup_θ ‖J_A(λ_θ)P‖ is above the maximum on a 16x denser grid, above the grid maximum it
    starts from, and the mean-value inequality ‖A − A'‖ ≤ bound·‖λ − λ'‖ holds with it."""
    pairs = H10._pairs(np.random.default_rng(5), H10.Config(n_pairs=400))
    for m in range(2, 8):
        idx = [i for i, p in enumerate(pairs) if p[0].size == m]
        L, P1, P2 = (np.stack([pairs[i][k] for i in idx]) for k in range(3))
        gmax, bound, cells = H10.segment_sup_bound(L, P1, P2)
        assert np.all(bound >= gmax) and set(cells.tolist()) <= {16, 32, 64}
        dense = H10._points(L, P1, P2, np.broadcast_to(np.linspace(0, 1, 1025), (len(idx), 1025)))[0].max(axis=1)
        assert np.all(dense <= bound * (1 + 1e-12)), (m, float(np.max(dense / bound)))
        dA = np.linalg.norm(adjustment(L, P1) - adjustment(L, P2), axis=1)
        assert np.all(dA <= bound * np.linalg.norm(P1 - P2, axis=1) * (1 + 1e-9) + 1e-12)


def test_h10_mean_value_link_is_tight_where_eq15_is_weak():
    """The mean-value link holds with a detection factor near 1 (near pairs, m = 2) and is detected at factor 0.5,
    while eq 15 keeps its own, smaller factor; sup ‖J_A P‖ stays below L_adj (the proof's second link)."""
    cfg = H10.Config(n_pairs=2000)
    ev = H10.run(cfg, np.random.default_rng(0))
    assert ev.verdict == "holds"
    mv, eq15 = ev.conclusion(H10.C_MV), ev.conclusion(H10.C_EQ15)
    assert mv.kind == "bound" and mv.role == "contract" and mv.instances == eq15.instances == 2000
    assert 0.99 < mv.detect_factor <= 1.0 + 1e-6
    assert mv.power()["status"] == "detected"
    assert eq15.detect_factor < 0.5
    assert ev.details["mean_value_link"]["max_sup_JP_over_L_adj"] <= 1.0
    with bound_factor(0.5):
        half = H10.run(cfg, np.random.default_rng(0))
    assert half.verdict == "violated"
    assert half.conclusion(H10.C_MV).counterexamples > 0 and half.conclusion(H10.C_EQ15).counterexamples == 0


def test_h10_endpoint_constant_control_fails_the_link():
    """Negative control of the link: the constant at the endpoints only fails (l = (1, 1), λ = (0.3, 0.7) against
    its reversal: slope 0.89 > 0.66), the sup over the segment (≥ 1, at λ = (½, ½)) does not."""
    ev = H10._control_mean_value(H10.Config(), np.random.default_rng(0))
    assert ev.control_detected
    ref = ev.details["reference_instance"]
    assert ref["slope"] == pytest.approx(0.8897, abs=1e-3)
    assert ref["endpoint_constant"] == pytest.approx(0.6611, abs=1e-3)
    assert ref["sup_JP_bound"] >= 1.0
    assert ev.details["sup_bound_holds"]
    full = H10.negative_control(None, np.random.default_rng(0))
    assert full.control_detected and set(full.details["controls"]) == {"wrong_floor", "endpoint_constant"}
