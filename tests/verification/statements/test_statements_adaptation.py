"""Executable statements of the new-client adaptation part of Appendix H: H.39–H.45 and Thm-A
(docs/spec/statements.md#catalogue, docs/spec/statements.md#t-h39, docs/spec/statements.md#t-h40,
docs/spec/statements.md#t-h41, docs/spec/statements.md#t-h42, docs/spec/statements.md#t-h43,
docs/spec/statements.md#t-h44, docs/spec/statements.md#t-h45).

Each statement runs with its default ``Config`` and seed ``registry.DEFAULT_SEED`` through
:func:`verification.core.registry.run_statement` (check + negative control); every verdict must be ``"holds"`` and
every negative control ``"detected"`` (the broken hypothesis is flagged and the conclusion fails). The suite's
family-wise budget of confidence-level assertions (``verification.core.montecarlo.FAMILY_WISE_BUDGET``) is checked
here, with H.17's order-statistic tests, and the Monte Carlo rows' power against a deliberately halved bound.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from sim.preference import adjustment, normalizer
from sim.problems import CommonMinimizer
from verification.core import registry
from verification.core.evidence import bound_factor, to_jsonable
from verification.core.montecarlo import ASSERTIONS, FAMILY_WISE_BUDGET
from verification.statements import _adaptation_theory as AT
from verification.statements import h44_pipeline_comparison as H44

IDS = ("H.39-41", "H.42", "H.43", "H.44", "H.45", "ThmA")
MONTE_CARLO = {"H.39-41", "H.43", "H.44", "H.45", "ThmA"}


@pytest.mark.parametrize(
    "stmt_id", [pytest.param(s, marks=pytest.mark.mc) if s in MONTE_CARLO else s for s in IDS]
)
def test_adaptation_statement(stmt_id, default_run):
    ev = default_run(stmt_id)
    assert ev.id == stmt_id
    assert ev.verdict == "holds", (ev.verdict, ev.counterexamples[:3])
    assert ev.negative_control == "detected", ev.control.details if ev.control else None
    assert ev.instances > ev.excluded  # never vacuous
    assert ev.n_counterexamples == 0
    if ev.tightness is not None:
        assert np.isfinite(ev.tightness) and ev.tightness <= 1.0 + 1e-9
    mc = ev.details["mc_assertions"]
    assert mc["count"] == (0 if stmt_id not in MONTE_CARLO else len(mc["assertions"]))
    if stmt_id in MONTE_CARLO:  # every Monte Carlo statement has a tight row that detects a halved bound
        tight = [c for c in ev.conclusions if c.kind == "monte_carlo" and "tight" in c.name]
        if stmt_id != "H.39-41":
            assert tight and all(c.power(0.5)["status"] == "detected" for c in tight)
    for a in mc["assertions"]:
        assert not a["failed"], a
    # every negative-control part detected
    for name, part in ev.control.details.get("controls", {"single": {"detected": True}}).items():
        assert part["detected"], name
    json.dumps(to_jsonable(ev.to_dict()))  # results file is JSON-serialisable
    if stmt_id == "H.43":  # the tight one-dimensional instance: the constant of eq 90 is sharp
        assert ev.details["tight_instance"]["max_abs_ratio_minus_1"] <= 1e-12
        assert abs(ev.tightness - 1.0) <= 1e-12
        nm = ev.control.details["controls"]["non_measurable"]["details"]["mc"]
        assert nm["n"] == 10_000 and nm["failed"] and nm["lcb"] > nm["bound"]
    if stmt_id in ("H.44", "ThmA"):
        fig = ev.details["figure_data"]["adaptation_gap"]
        assert set(fig) == {"K", "S", "preconditioner", "gap", "bound"}
        assert len({len(v) for v in fig.values()}) == 1


@pytest.mark.mc
def test_family_wise_budget_adds_up(default_run):
    """Every confidence-level assertion of the default run is in one budget: each budgeted statement makes exactly
    the declared number of assertions, and their δ add up to at most FAMILY_WISE_BUDGET = 1e-3."""
    spent = {}
    for sid in sorted(ASSERTIONS):
        recs = default_run(sid).details["confidence_assertions"]
        assert len(recs) == ASSERTIONS[sid], (sid, [r["label"] for r in recs])
        spent[sid] = sum(r["delta"] for r in recs)
    assert sum(spent.values()) <= FAMILY_WISE_BUDGET * (1 + 1e-12), spent
    for sid in sorted(set(IDS) - set(ASSERTIONS)):
        assert not default_run(sid).details.get("confidence_assertions")


@pytest.mark.mc
def test_monte_carlo_detects_a_halved_bound(default_run):
    """Under bound_factor(0.5) every tight Monte Carlo row fails (and its crossing factor said it would); the
    lagged-RMSprop rows, far from their bound, do not."""
    base = default_run("H.43")
    with bound_factor(0.5):
        halved = registry.run_statement(registry.get_statement("H.43"), seed=registry.DEFAULT_SEED)
    assert halved.verdict == "violated"
    for c in base.conclusions:
        if c.kind != "monte_carlo":
            continue
        h = halved.conclusion(c.name)
        assert (h.counterexamples > 0) is (c.detect_factor > 0.5), c.name
        if "tight" in c.name:
            assert h.counterexamples > 0


@pytest.mark.mc
def test_adaptation_statements_are_deterministic(default_run):
    """Same seed, same numbers (H.39-41 draws Monte Carlo samples): a run now against the session's run of the same
    seed, made earlier (the statements run in between would show if state leaked from one run to the next)."""
    a = default_run("H.39-41")
    b = registry.run_statement(registry.get_statement("H.39-41"), seed=registry.DEFAULT_SEED)
    np.testing.assert_array_equal(a.lhs, b.lhs)
    np.testing.assert_array_equal(a.rhs, b.rhs)


def test_beta_segment_constant_bounds_the_gradient_on_the_segment():
    """F3: the per-sample mean-value constant of β_new on [c, w] is above ‖∇β‖ = ‖GA/Z‖ (identity I3) on a dense
    grid of the segment and within 1% of its maximum there; near c (β ≈ κq², quartic) β(w)/(M(w)‖w − c‖) → 1/4
    along an eigen-direction of Q."""
    prob = CommonMinimizer.reference()
    rng = np.random.default_rng(2)
    W = prob.centre + np.r_[0.01, 0.3, 1.0, 3.0][:, None, None] * rng.standard_normal((4, 50, prob.n_params))
    W = W.reshape(-1, prob.n_params)
    seg = AT.beta_segment_constant(prob, W)
    tau = np.linspace(0.0, 1.0, 2001)
    pts = prob.centre + tau[:, None, None] * (W - prob.centre)[None]
    L = prob.losses(pts)
    g = np.einsum("...am,...m->...a", prob.grads(pts), adjustment(L, prob.prefs)) / normalizer(L, prob.prefs)[..., None]
    dense = np.linalg.norm(g, axis=-1).max(axis=0)
    assert np.all(dense <= seg["M"] * (1 + 1e-9))
    assert np.all(seg["M"] <= dense * 1.01)
    d = np.linalg.norm(W - prob.centre, axis=1)
    assert np.all(prob.beta(W) <= seg["M"] * d * (1 + 1e-9))
    u = np.linalg.eigh(prob.hessian)[1][:, 0]
    near = prob.centre + np.array([1e-3, 1e-2])[:, None] * u
    r = prob.beta(near) / (AT.beta_segment_constant(prob, near)["M"] * np.array([1e-3, 1e-2]))
    assert np.allclose(r, 0.25, atol=2e-3)


@pytest.mark.mc
def test_h44_per_sample_segment_constant_and_chain_links(default_run):
    """H.44(b): the per-sample mean-value constant of [c, w_K] gives a valid and tighter per-sample bound than the
    ball constant L_beta (same samples); the chain is checked link by link (link 2, Jensen, detected at factor 0.5;
    link 3 is the Monte Carlo eq 93 row); the chain's Monte Carlo assertion stays, so the budget is unchanged; the
    controls of the new rows are detected (the half segment, the small ball; link 1 fails there)."""
    ev = default_run("H.44")
    per, seg = ev.conclusion(H44.C_PER_SAMPLE), ev.conclusion(H44.C_SEGMENT)
    assert seg.instances == per.instances > 0 and seg.counterexamples == 0 and seg.kind == "bound"
    assert seg.detect_factor > per.detect_factor
    assert 0.25 < seg.detect_factor <= 0.5  # quartic beta at c: 1/4 near c, more only far from it
    l1, l2 = ev.conclusion(H44.C_LINK1), ev.conclusion(H44.C_LINK2)
    assert l1.counterexamples == l2.counterexamples == 0 and l1.instances == l2.instances >= 5
    assert l2.power()["status"] == "detected" and l1.detect_factor < 0.5
    assert ev.conclusion(H44.C_CHAIN).kind == "monte_carlo"
    assert len(ev.details["confidence_assertions"]) == ASSERTIONS["H.44"] == 5
    assert {x["endpoints"] for x in ev.details["chain_b_c"]["links"]} >= {"w_I/rmsprop_lagged (MC)"}
    parts = ev.control.details["controls"]
    assert parts["half_segment_b"]["detected"] and parts["small_ball_L_beta_b"]["detected"]
    small = parts["small_ball_L_beta_b"]["details"]
    assert small["link1_lhs"] > small["link1_rhs"]
