"""Executable statements of the cluster part of Appendix H: H.13–H.17 (docs/spec/statements.md#catalogue).

Each statement runs with its default ``Config`` and seed ``registry.DEFAULT_SEED`` through
:func:`verification.core.registry.run_statement` (check + negative control). Expected verdicts:

* H.13, H.14, H.15, H.17: ``"holds"``;
* H.16: ``"finding"`` — eq 48 as printed has a counterexample (shown), the repaired eq 48′ and eq 44–47 hold.
  Its negative control is the literal eq 48 counterexample itself (the ``J∖J*`` branch of eq 48′ removed, flagged
  by "every balancing client has J∖J* = ∅") together with an eq 47 control (hard uniform pull).

Every negative control must be ``"detected"``: the broken hypothesis is flagged and the conclusion fails.
"""

from __future__ import annotations

import numpy as np
import pytest

from verification.core import registry

EXPECTED = {
    "H.13": "holds",
    "H.14": "holds",
    "H.15": "holds",
    "H.16": "finding",
    "H.17": "holds",
}


@pytest.mark.parametrize("stmt_id", sorted(EXPECTED))
def test_cluster_statement(stmt_id, default_run):
    ev = default_run(stmt_id)
    assert ev.id == stmt_id
    assert ev.verdict == EXPECTED[stmt_id], (ev.verdict, ev.counterexamples[:2], ev.details.get("finding"))
    assert ev.negative_control == "detected", ev.control.to_record() if ev.control else None
    assert ev.instances > ev.excluded  # never vacuous
    if ev.tightness is not None:
        assert np.isfinite(ev.tightness)
    if stmt_id == "H.16":
        # the printed counterexample to eq 48 and the repaired statement holding on the same instances
        cex = ev.details["eq48_counterexample"]
        assert cex["dbar_g"] < cex["eq48_bound"]
        assert cex["dbar_g"] >= cex["eq48prime_bound"]
        assert any(b["j_in_J_minus_Jstar"] for b in cex["balancing_clients"])
        assert ev.repaired is not None and ev.repaired.verdict == "holds"
        assert ev.n_counterexamples > 0


def test_cluster_statements_are_deterministic():
    """Same seed, same numbers (H.14 is the cheapest to repeat)."""
    stmt = registry.get_statement("H.14")
    a = registry.run_statement(stmt, seed=3)
    b = registry.run_statement(stmt, seed=3)
    np.testing.assert_array_equal(a.lhs, b.lhs)
    np.testing.assert_array_equal(a.rhs, b.rhs)
    assert a.details == b.details
