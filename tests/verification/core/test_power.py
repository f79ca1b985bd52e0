"""The power report: a deliberately weakened check is reported weak, a sharp one detects a halved bound, the
prediction from the data agrees with the re-run under a scaled bound, and the command line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from verification.__main__ import main
from verification.core import registry
from verification.core.evidence import Evidence, bound_factor
from verification.core.power import PowerReport, PowerRow, rows_of


def _check(slack: float):
    """A check of ``x ≤ 1`` on x ~ U(0, 1): sharp with ``slack = 1``; ``slack = 3`` weakens the bound to
    ``x ≤ 3`` (a check whose instances never come near it). An identity residual rides along."""

    def run(config, rng):
        x = rng.uniform(0.0, 1.0, 400)
        names = np.array(["x <= bound"] * 400 + ["residual"] * 400, dtype=object)
        lhs = np.concatenate([x, np.full(400, 1e-16)])
        rhs = np.concatenate([np.full(400, slack), np.full(400, 1e-12)])
        return Evidence.from_implication("T.7", "toy", None, lhs, rhs, conclusion=names,
                                         kinds={"residual": "identity"})

    return registry.Statement("T.7", "7", "toy", run, module="tests")


def _power(stmt, factor=0.5, base=None):
    """The power rows of ``stmt`` from its run (``base``, or run here) and its run under ``bound_factor(factor)``."""
    base = registry.run_statement(stmt) if base is None else base
    with bound_factor(factor):
        scaled = registry.run_statement(stmt)
    return {r.conclusion: r for r in rows_of(base, scaled, factor)}


def test_a_deliberately_weakened_check_is_reported_weak():
    sharp = _power(_check(1.0))
    weak = _power(_check(3.0))
    assert sharp["x <= bound"].status == "detected" and sharp["x <= bound"].counterexamples_scaled > 0
    assert weak["x <= bound"].status == "weak" and weak["x <= bound"].counterexamples_scaled == 0
    assert weak["x <= bound"].detect_factor == pytest.approx(1.0 / 3.0, rel=0.01)
    for rows in (sharp, weak):  # identity residuals are marked, not counted as weak
        assert rows["residual"].status == "identity residual" and not rows["residual"].mismatch
    rep = PowerReport(factor=0.5, seed=0, search="none", rows=list(weak.values()))
    assert not rep.ok and [r.conclusion for r in rep.weak_without_reason] == ["x <= bound"]
    rep.rows[0] = PowerRow(**{**rep.rows[0].__dict__, "reason": "the bound is three times too large"})
    assert rep.ok  # a weak bound with its reason stated is listed, not a failure


@pytest.mark.parametrize("sid", ["H.14", "H.9", "H.17", "S3"])
def test_prediction_from_the_data_agrees_with_the_rerun(sid, default_run):
    rows = _power(registry.get_statement(sid), base=default_run(sid))
    numeric = [r for r in rows.values() if r.status in ("detected", "weak")]
    assert numeric and not [r for r in numeric if r.mismatch]


def test_power_command_line(tmp_path, capsys):
    out = tmp_path / "power.json"
    assert main(["power", "H.14", "S4", "--search", "none", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "H.14" in text and "detected" in text and "identity residual" in text
    rows = json.loads(out.read_text())
    assert {r["id"] for r in rows} == {"H.14", "S4"} and all(r["factor"] == 0.5 for r in rows)
    assert main(["power", "--factor", "1.5", "S4"]) == 2
    assert "--factor" in capsys.readouterr().err
