"""Evidence record: verdict logic, tolerances, hypothesis monitor, negative controls, JSON schema."""

from __future__ import annotations

import json

import numpy as np
import pytest

from verification import registry
from verification.evidence import (
    ATOL,
    RTOL,
    Evidence,
    HypothesisMonitor,
    check_inequality,
    is_strictly_positive,
)

SCHEMA = {"id", "name", "verdict", "tightness", "instances", "excluded", "negative_control", "counterexamples",
          "seconds"}


def test_tolerance_constants_match_spec():
    assert (ATOL, RTOL) == (1e-12, 1e-9)


@pytest.mark.parametrize(
    "lhs, rhs, expected",
    [
        (1.0, 1.0, True),
        (1.0 + 0.9e-9, 1.0, True),  # within rtol·|rhs|
        (1.0 + 1.1e-9 + 1e-12, 1.0, False),
        (0.9e-12, 0.0, True),  # atol at rhs = 0
        (1.1e-12, 0.0, False),
        (-1.0 + 0.9e-9, -1.0, True),  # rtol uses |rhs|
        (np.nan, 1.0, False),  # NaN never passes
        (1.0, np.nan, False),
    ],
)
def test_check_inequality_tolerance(lhs, rhs, expected):
    assert bool(check_inequality(lhs, rhs)) is expected


def test_strict_positivity_is_relative():
    assert is_strictly_positive(1e-11, scale=1.0)
    assert not is_strictly_positive(1e-13, scale=1.0)
    assert is_strictly_positive(1e-13, scale=1e-3)


def _monitor(held):
    mon = HypothesisMonitor(len(held))
    mon.record("H", np.asarray(held))
    return mon


def test_holds():
    ev = Evidence.from_implication("X.1", "x", _monitor([True, True, False]), [1.0, 2.0, 99.0], [2.0, 2.0, 1.0])
    assert ev.verdict == "holds"
    assert ev.instances == 3 and ev.excluded == 1
    assert ev.exclusion_reasons == {"H": 1}
    assert ev.tightness == pytest.approx(1.0)
    np.testing.assert_array_equal(ev.lhs, [1.0, 2.0])
    assert ev.n_counterexamples == 0


def test_violated_records_reproducible_counterexample():
    data = {"w": np.array([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]), "seed": np.array([7, 8, 9])}
    ev = Evidence.from_implication("X.1", "x", _monitor([True, True, True]), [1.0, 3.0, 0.0], [2.0, 2.0, 1.0],
                                   instance_data=data)
    assert ev.verdict == "violated"
    assert ev.n_counterexamples == 1
    (cex,) = ev.counterexamples
    assert cex == {"instance": 1, "lhs": 3.0, "rhs": 2.0, "w": [2.0, 3.0], "seed": 8}
    json.dumps(ev.counterexamples)  # serialisable


def test_violation_on_excluded_instance_does_not_count():
    ev = Evidence.from_implication("X.1", "x", _monitor([True, False]), [0.0, 5.0], [1.0, 1.0])
    assert ev.verdict == "holds" and ev.excluded == 1


@pytest.mark.parametrize("held", [[False, False], []])
def test_vacuous_when_every_instance_excluded(held):
    n = len(held)
    mon = HypothesisMonitor(n)
    mon.record("H", np.asarray(held, dtype=bool))
    ev = Evidence.from_implication("X.1", "x", mon, np.zeros(n), np.ones(n))
    assert ev.verdict == "vacuous"
    assert ev.excluded == n


def test_boolean_conclusion_and_mask_monitor():
    ev = Evidence.from_implication("X.2", "x", np.array([True, True]), ok=np.array([True, False]))
    assert ev.verdict == "violated" and ev.tightness is None


def test_shape_mismatch_raises():
    with pytest.raises(ValueError, match="lhs"):
        Evidence.from_implication("X.1", "x", _monitor([True, True]), [1.0], [1.0])


def test_invalid_verdict_rejected():
    with pytest.raises(ValueError, match="verdict"):
        Evidence(id="X", name="x", verdict="passed")


def test_monitor_accumulates_and_margins():
    mon = HypothesisMonitor(3)
    mon.require_nonnegative("gap", [0.5, -0.1, 2.0])
    mon.require_nonnegative("gap", [0.2, 1.0, 1.0])  # same hypothesis at a second point: AND, min margin
    mon.require_positive("gamma", [1.0, 1.0, 0.0])
    (gap, gamma) = mon.hypotheses()
    assert (gap.name, gap.held, gap.failed, gap.min_margin) == ("gap", 2, 1, -0.1)
    assert (gamma.held, gamma.failed) == (2, 1)
    np.testing.assert_array_equal(mon.mask, [True, False, False])
    assert mon.exclusion_reasons() == {"gap": 1, "gamma": 1}


def test_monitor_per_instance_and_explicit_exclusion():
    mon = HypothesisMonitor()
    for i, ok in enumerate([True, False, True]):
        (k,) = mon.add_instances(1)
        assert k == i
        mon.record("H", ok, margin=1.0 if ok else -1.0, index=k)
    mon.exclude("LP infeasible", [False, False, True])
    np.testing.assert_array_equal(mon.mask, [True, False, False])
    assert mon.exclusion_reasons() == {"H": 1, "LP infeasible": 1}
    ev = Evidence.from_implication("X", "x", mon, [0.0, 0.0, 0.0], [1.0, 1.0, 1.0])
    assert ev.excluded == 2 and sum(ev.exclusion_reasons.values()) == 2


def test_negative_control_detected_and_missed():
    mon = HypothesisMonitor(3)
    mon.record("floor", [True, False, False])
    det = Evidence.from_control("X", "x", mon, "floor", [0.0, 2.0, 0.0], [1.0, 1.0, 1.0])
    assert det.control_detected is True and det.verdict == "violated"
    missed = Evidence.from_control("X", "x", mon, "floor", [0.0, 0.0, 0.0], [1.0, 1.0, 1.0])
    assert missed.control_detected is False
    # the conclusion failing where the broken hypothesis held does not count as detection
    not_flagged = Evidence.from_control("X", "x", mon, "floor", [2.0, 0.0, 0.0], [1.0, 1.0, 1.0])
    assert not_flagged.control_detected is False
    with pytest.raises(ValueError, match="never recorded"):
        Evidence.from_control("X", "x", mon, "other", [0.0] * 3, [1.0] * 3)


def _literal(violations: int) -> Evidence:
    lhs = np.array([0.0] * 3 + [2.0] * violations)
    return Evidence.from_implication("H.16b", "lit", None, lhs, np.ones(lhs.size))


def test_finding():
    repaired = Evidence.from_implication("H.16b", "rep", None, [0.1, 0.5], [1.0, 1.0])
    ev = Evidence.finding("H.16b", "mixed cluster", _literal(2), repaired)
    assert ev.verdict == "finding"
    assert ev.n_counterexamples == 2
    assert ev.repaired is repaired and ev.tightness == pytest.approx(0.5)
    assert ev.to_dict()["details"]["repaired"]["verdict"] == "holds"
    assert not ev.failed


def test_finding_not_reproduced_or_repair_broken():
    ok_rep = Evidence.from_implication("H.16b", "rep", None, [0.1], [1.0])
    bad_rep = Evidence.from_implication("H.16b", "rep", None, [2.0], [1.0])
    assert Evidence.finding("H.16b", "x", _literal(0), ok_rep).verdict == "vacuous"
    assert Evidence.finding("H.16b", "x", _literal(1), bad_rep).verdict == "violated"


def test_to_dict_schema_exact():
    ev = Evidence.from_implication("X.1", "x", _monitor([True, True]), [1.0, 3.0], [2.0, 2.0])
    d = ev.to_dict()
    assert set(d) == SCHEMA  # no details when empty
    assert d["counterexamples"] == 1 and isinstance(d["counterexamples"], int)
    assert d["negative_control"] == "none"
    ev2 = ev.with_details(kappa=np.float64(2.5), arr=np.arange(2), bad=np.inf)
    d2 = ev2.to_dict()
    assert set(d2) == SCHEMA | {"details"}
    assert d2["details"] == {"kappa": 2.5, "arr": [0, 1], "bad": "inf"}
    json.dumps(d2, allow_nan=False)


# -- registry.run_statement fills negative_control and seconds --------------------------------------------------


def _run(config, rng):
    x = rng.random(5)
    return Evidence.from_implication("T.1", "toy", None, x, np.ones(5))


def _control(detect):
    def ctrl(config, rng):
        mon = HypothesisMonitor(2)
        mon.record("bound", [False, True])
        lhs = [2.0, 0.0] if detect else [0.0, 0.0]
        return Evidence.from_control("T.1", "toy", mon, "bound", lhs, [1.0, 1.0])

    return ctrl


@pytest.mark.parametrize("control, expected", [(None, "none"), (_control(True), "detected"),
                                               (_control(False), "missed")])
def test_run_statement_negative_control(control, expected):
    stmt = registry.Statement("T.1", "1", "toy", _run, control, module="tests")
    ev = registry.run_statement(stmt, seed=3)
    assert ev.negative_control == expected
    assert ev.seconds >= 0.0
    assert ev.failed is (expected == "missed")
    again = registry.run_statement(stmt, seed=3)
    np.testing.assert_array_equal(ev.lhs, again.lhs)  # same seed, same numbers


def test_run_statement_rejects_wrong_id():
    stmt = registry.Statement("T.2", "2", "toy", _run, module="tests")
    with pytest.raises(ValueError, match="T.1"):
        registry.run_statement(stmt)
