"""Evidence record: verdict logic, tolerances, hypothesis monitor, negative controls, JSON schema."""

from __future__ import annotations

import json

import numpy as np
import pytest

from verification.core import registry
from verification.core.evidence import (
    ATOL,
    RTOL,
    Evidence,
    HypothesisMonitor,
    active_bound_factor,
    bound_factor,
    check_inequality,
    detection_factor,
    is_strictly_positive,
    scaled_bound,
)

SCHEMA = {"id", "name", "verdict", "tightness", "instances", "excluded", "negative_control", "counterexamples",
          "seconds", "conclusions"}
CONCLUSION_SCHEMA = {"name", "kind", "role", "tightness", "instances", "excluded", "counterexamples", "power"}


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
    assert cex == {"instance": 1, "conclusion": "conclusion", "lhs": 3.0, "rhs": 2.0, "w": [2.0, 3.0], "seed": 8}
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
    (c,) = d["conclusions"]
    assert set(c) == CONCLUSION_SCHEMA
    assert (c["name"], c["instances"], c["counterexamples"]) == ("conclusion", 2, 1)
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


# -- named conclusions, kinds, power ----------------------------------------------------------------------------


def _three_conclusions(**kw):
    mon = _monitor([True, True, True, False, True, True])
    names = ["eq 1", "eq 1", "eq 2", "eq 2", "residual", "sign"]
    lhs = [0.9, 0.2, 0.3, 50.0, 1e-13, -1.0]
    rhs = [1.0, 1.0, 1.0, 1.0, 1e-12, 0.0]
    return Evidence.from_implication("X.3", "x", mon, lhs, rhs, conclusion=names,
                                     kinds={"residual": "identity", "sign": "boolean"} | kw.pop("kinds", {}), **kw)


def test_conclusions_keep_their_own_counts_and_tightness():
    ev = _three_conclusions()
    assert [c.name for c in ev.conclusions] == ["eq 1", "eq 2", "residual", "sign"]
    e1, e2, res, sign = ev.conclusions
    assert (e1.instances, e1.excluded, e1.counterexamples) == (2, 0, 0)
    assert (e2.instances, e2.excluded) == (2, 1)
    assert e1.tightness == pytest.approx(0.9) and e2.tightness == pytest.approx(0.3)
    assert ev.tightness == pytest.approx(0.9)  # the headline stays the maximum (over the numeric conclusions)
    assert e1.worst["instance"] == 0 and e1.worst["ratio"] == pytest.approx(0.9)
    assert res.kind == "identity" and sign.kind == "boolean"
    assert list(ev.labels) == ["eq 1", "eq 1", "eq 2", "residual", "sign"]


def test_power_status_per_conclusion_and_identity_marked():
    ev = _three_conclusions()
    st = {c.name: c.power(0.5)["status"] for c in ev.conclusions}
    assert st == {"eq 1": "detected", "eq 2": "weak", "residual": "identity residual", "sign": "boolean conclusion"}
    summ = ev.power_summary(0.5)
    assert summ["numeric"] == 2 and summ["detected"] == 1 and summ["weak"] == ["eq 2"]
    assert summ["weak_without_reason"] == ["eq 2"]
    ev2 = ev.with_reasons({"eq 2": "the constant is a product of two worst cases"})
    assert ev2.power_summary(0.5)["weak_without_reason"] == []
    assert ev2.conclusion("eq 2").power(0.5)["reason"].startswith("the constant")


def test_bound_factor_scales_every_numeric_bound_and_nothing_else():
    with bound_factor(0.5):
        ev = _three_conclusions()
    assert active_bound_factor() == 1.0
    e1, e2, res, sign = ev.conclusions
    assert e1.counterexamples == 1  # 0.9 > 0.5: a halved bound is detected
    assert e2.counterexamples == 0  # 0.3 < 0.5: not detected
    assert res.counterexamples == 0  # identity residuals are not scaled
    assert ev.verdict == "violated"
    assert scaled_bound(-2.0, 0.5) == pytest.approx(-3.0)  # rhs − (1 − f)|rhs| makes a negative bound smaller too
    np.testing.assert_allclose(detection_factor([0.9, -3.0], [1.0, -2.0]), [0.9, 0.5])
    with pytest.raises(ValueError, match="bound factor"):
        with bound_factor(0.0):
            pass


def test_detection_factor_predicts_the_rerun():
    """The analytic detection factor and a re-run under bound_factor agree on random data."""
    rng = np.random.default_rng(4)
    lhs, rhs = rng.uniform(-1, 1, 200), rng.uniform(-2, 2, 200)
    lhs = np.minimum(lhs, rhs)  # holds at factor 1
    base = Evidence.from_implication("X", "x", None, lhs, rhs)
    for f in (0.9, 0.5, 0.1):
        with bound_factor(f):
            ev = Evidence.from_implication("X", "x", None, lhs, rhs)
        assert (ev.n_counterexamples > 0) == (base.conclusions[0].detect_factor > f)


def test_soft_conclusion_reported_not_decisive():
    mon = _monitor([True, True])
    ev = Evidence.from_implication("X.4", "x", mon, [0.5, 2.0], [1.0, 1.0], conclusion=["eq 1", "eq 46 tau>1"],
                                   soft=["eq 46 tau>1"])
    assert ev.verdict == "holds" and ev.n_counterexamples == 0
    soft = ev.conclusion("eq 46 tau>1")
    assert soft.role == "soft" and soft.counterexamples == 1
    assert ev.details["soft_counterexamples"]["eq 46 tau>1"][0]["lhs"] == 2.0
    assert ev.tightness == pytest.approx(0.5)  # soft rows stay out of the headline


def test_finding_keeps_literal_conclusions_marked():
    repaired = Evidence.from_implication("H.16b", "rep", None, [0.1, 0.5], [1.0, 1.0], conclusion="eq 48'")
    lit = Evidence.from_implication("H.16b", "lit", None, [2.0, 0.0], [1.0, 1.0], conclusion="eq 48")
    ev = Evidence.finding("H.16b", "x", lit, repaired)
    roles = {c.name: (c.role, c.power()["status"]) for c in ev.conclusions}
    assert roles == {"eq 48'": ("contract", "weak"), "eq 48": ("literal", "literal (finding)")}


def test_monte_carlo_detection_factor_given_per_instance():
    ev = Evidence.from_implication("X.5", "x", None, [0.4, 0.1], [1.0, 1.0], conclusion=["mc", "b"],
                                   kinds={"mc": "monte_carlo"}, detect=[0.8, np.nan])
    assert ev.conclusion("mc").detect_factor == pytest.approx(0.8)
    assert ev.conclusion("b").detect_factor == pytest.approx(0.1)
    with bound_factor(0.5):  # Monte Carlo bounds are scaled in montecarlo.mean_claim, not here
        ev2 = Evidence.from_implication("X.5", "x", None, [0.4], [1.0], kinds="monte_carlo")
    assert ev2.rhs[0] == 1.0


def test_conclusion_argument_errors():
    with pytest.raises(ValueError, match="conclusion names"):
        Evidence.from_implication("X", "x", None, [1.0, 1.0], [2.0, 2.0], conclusion=["a"])
    with pytest.raises(ValueError, match="kind"):
        Evidence.from_implication("X", "x", None, [1.0], [2.0], kinds="tight")
    with pytest.raises(ValueError, match="needs lhs and rhs"):
        Evidence.from_implication("X", "x", None, ok=[True], kinds="bound")


def test_boolean_part_as_its_own_conclusion():
    ev = Evidence.from_implication("X.6", "x", _monitor([True, True, False]), [0.9, 0.2, 5.0], [1.0, 1.0, 1.0],
                                   ok=[True, False, False], conclusion="P-d", ok_conclusion="P-a, P-b")
    pd, pab = ev.conclusions
    assert (pd.name, pd.kind, pd.counterexamples, pd.excluded) == ("P-d", "bound", 0, 1)
    assert (pab.name, pab.kind, pab.counterexamples, pab.instances) == ("P-a, P-b", "boolean", 1, 3)
    assert ev.verdict == "violated" and ev.counterexamples[0]["conclusion"] == "P-a, P-b"


def test_power_says_where_a_detection_comes_from_and_on_how_many_instances():
    """A detection at factor 0.5 is attributed to the default family when the statement's own instances detect it,
    to a designed tight point when only a merged point does; the count of detecting instances (ratio > 0.5) is
    summed over the parts, and a detection on fewer than FEW_DETECTING instances says so."""
    fam = Evidence.from_implication("X.8", "x", None, [0.2, 0.3, 0.7], [1.0, 1.0, 1.0], conclusion="eq 1")
    point = Evidence.from_implication("X.8", "x", None, [0.9, 0.95, 0.1], [1.0, 1.0, 1.0], conclusion="eq 1")
    own = fam.conclusion("eq 1").power()
    assert own["status"] == "detected" and own["detected_by"] == "default family"
    assert own["detecting_instances"] == 1 and "rests on 1 instance " in own["few_instances"]
    weak = Evidence.from_implication("X.8", "x", None, [0.2, 0.3], [1.0, 1.0], conclusion="eq 1")
    merged = Evidence.merged(weak, [({"p": 1}, point.at_designed_point())]).conclusion("eq 1").power()
    assert merged["status"] == "detected" and merged["detected_by"] == "designed tight point"
    assert merged["detecting_instances"] == 2
    both = Evidence.merged(fam, [({"p": 1}, point.at_designed_point())]).conclusion("eq 1").power()
    assert both["detected_by"] == "default family" and both["detecting_instances"] == 3
    many = Evidence.from_implication("X.8", "x", None, np.full(12, 0.9), np.ones(12), conclusion="eq 1")
    assert "few_instances" not in many.conclusion("eq 1").power()
    assert "detected_by" not in weak.conclusion("eq 1").power()


def test_merged_evidence_keeps_each_parts_detection_facts():
    """A part that is more of the default family (H.13's tau > 1 part) keeps its detection on the family when it is
    merged: a conclusion only that part has, or that it detects better, is detected by the default family; a part
    run at a designed point (at_designed_point) adds its detection as the designed tight point's."""
    main = Evidence.from_implication("X.9", "x", None, [0.2, 0.3], [1.0, 1.0], conclusion="eq 1")
    part = Evidence.from_implication("X.9", "x", None, [0.1, 0.8, 0.3], [1.0, 1.0, 1.0],
                                     conclusion=["eq 1", "eq 1", "eq 2"])
    tight = Evidence.from_implication("X.9", "x", None, [0.95, 0.9], [1.0, 1.0], conclusion=["eq 1", "eq 2"])
    m = Evidence.merged(main, [({"part": "tau > 1"}, part)])
    e1, e2 = m.conclusion("eq 1"), m.conclusion("eq 2")
    assert e1.family_detect_factor == pytest.approx(0.8) and e2.family_detect_factor == pytest.approx(0.3)
    assert e1.power()["detected_by"] == "default family" and e1.power()["detecting_instances"] == 1
    both = Evidence.merged(m, [({"p": 1}, tight.at_designed_point())])
    e1, e2 = both.conclusion("eq 1"), both.conclusion("eq 2")
    assert (e1.detect_factor, e1.family_detect_factor) == (pytest.approx(0.95), pytest.approx(0.8))
    assert e1.power()["detected_by"] == "default family" and e1.power()["detecting_instances"] == 2
    assert (e2.detect_factor, e2.family_detect_factor) == (pytest.approx(0.9), pytest.approx(0.3))
    assert e2.power()["detected_by"] == "designed tight point"


def test_h13_tau_part_is_detected_by_its_default_family(default_run):
    """H.13 merges its tau > 1 part, made on the default clusters, into its check: the repaired eq 46 allowance,
    halved, is detected on that family (factor 0.803 on the default clusters), not only at a designed tight
    point."""
    c = default_run("H.13").conclusion("eq 46, tau > 1, repaired allowance ||d_bal|| ((tau - 1)/tau D + L0 B eta "
                                       "(tau - 1)/2)")
    assert c.family_detect_factor == pytest.approx(0.8026, abs=1e-3) and c.detect_factor > c.family_detect_factor
    assert c.power()["detected_by"] == "default family"


def test_merged_evidence_adds_instances_by_conclusion():
    a = Evidence.from_implication("X.8", "x", _monitor([True, False]), [0.2, 9.0], [1.0, 1.0], conclusion="eq 1")
    b = Evidence.from_implication("X.8", "x", None, [0.8, 0.1], [1.0, 1.0], conclusion=["eq 1", "eq 2"])
    m = Evidence.merged(a, [({"p": 1}, b)])
    assert m.instances == 4 and m.excluded == 1 and m.verdict == "holds"
    e1 = m.conclusion("eq 1")
    assert (e1.instances, e1.excluded, e1.detect_factor) == (3, 1, pytest.approx(0.8))
    assert m.tightness == pytest.approx(0.8) and m.details["added_points"][0]["point"] == {"p": 1}
    bad = Evidence.from_implication("X.8", "x", None, [2.0], [1.0], conclusion="eq 1")
    assert Evidence.merged(a, [({}, bad)]).verdict == "violated"
    with pytest.raises(ValueError, match="cannot merge"):
        Evidence.merged(a, [({}, Evidence.from_implication("Y", "y", None, [0.0], [1.0]))])


def test_ok_conclusion_none_marks_rows_without_a_boolean_part():
    """Rows whose ok_conclusion is None are left out of the boolean conclusion (its instance count is the other
    rows'); such a row with ok False is refused."""
    ev = Evidence.from_implication("X.8", "x", None, [0.2, 0.3, 0.4, 0.5], [1.0, 1.0, 1.0, 1.0],
                                   ok=[True, True, True, True], conclusion=["a", "a", "b", "b"],
                                   ok_conclusion=["flag", "flag", None, None])
    assert [c.name for c in ev.conclusions] == ["a", "b", "flag"]
    assert ev.conclusion("flag").instances == 2
    with pytest.raises(ValueError, match="without a boolean part"):
        Evidence.from_implication("X.8", "x", None, [0.2, 0.3], [1.0, 1.0], ok=[True, False],
                                  conclusion="a", ok_conclusion=["flag", None])
