"""Executable statements of the new-client adaptation part of Appendix H: H.39–H.45 and Thm-A (THEOREMS.md §2,
§3.1 T-H39/H.40/H.41, T-H42(3), T-H43, T-H44, T-H45).

Each statement runs with its default ``Config`` and seed ``registry.DEFAULT_SEED`` through
:func:`verification.registry.run_statement` (check + negative control); every verdict must be ``"holds"`` and
every negative control ``"detected"`` (the broken hypothesis is flagged and the conclusion fails). The suite's
family-wise budget of confidence-level assertions (``verification.montecarlo.FAMILY_WISE_BUDGET``) is checked
here, with H.17's order-statistic tests, and the Monte Carlo rows' power against a deliberately halved bound.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from verification import registry
from verification.evidence import bound_factor, to_jsonable
from verification.montecarlo import ASSERTIONS, FAMILY_WISE_BUDGET

IDS = ("H.39-41", "H.42", "H.43", "H.44", "H.45", "ThmA")
MONTE_CARLO = {"H.39-41", "H.43", "H.44", "H.45", "ThmA"}
_RESULTS: dict = {}


def _run(stmt_id):
    if stmt_id not in _RESULTS:
        _RESULTS[stmt_id] = registry.run_statement(registry.get_statement(stmt_id), seed=registry.DEFAULT_SEED)
    return _RESULTS[stmt_id]


@pytest.mark.parametrize(
    "stmt_id", [pytest.param(s, marks=pytest.mark.mc) if s in MONTE_CARLO else s for s in IDS]
)
def test_adaptation_statement(stmt_id):
    ev = _run(stmt_id)
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
def test_family_wise_budget_adds_up():
    """Every confidence-level assertion of the default run is in one budget: each budgeted statement makes exactly
    the declared number of assertions, and their δ add up to at most FAMILY_WISE_BUDGET = 1e-3."""
    spent = {}
    for sid in sorted(ASSERTIONS):
        recs = _run(sid).details["confidence_assertions"]
        assert len(recs) == ASSERTIONS[sid], (sid, [r["label"] for r in recs])
        spent[sid] = sum(r["delta"] for r in recs)
    assert sum(spent.values()) <= FAMILY_WISE_BUDGET * (1 + 1e-12), spent
    for sid in sorted(set(IDS) - set(ASSERTIONS)):
        assert not _run(sid).details.get("confidence_assertions")


@pytest.mark.mc
def test_monte_carlo_detects_a_halved_bound():
    """Under bound_factor(0.5) every tight Monte Carlo row fails (and its crossing factor said it would); the
    lagged-RMSprop rows, far from their bound, do not."""
    base = _run("H.43")
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
def test_adaptation_statements_are_deterministic():
    """Same seed, same numbers (H.39-41 draws Monte Carlo samples; cheap to repeat)."""
    stmt = registry.get_statement("H.39-41")
    a = registry.run_statement(stmt, seed=3)
    b = registry.run_statement(stmt, seed=3)
    np.testing.assert_array_equal(a.lhs, b.lhs)
    np.testing.assert_array_equal(a.rhs, b.rhs)
