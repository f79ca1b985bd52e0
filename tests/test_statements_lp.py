"""Executable statements of the LP layer (THEOREMS.md §2 H.1–H.3, H.4, H.5, H.6, H.7, H.9, H.10, H.11).

Each statement is run with its default Config through :func:`verification.registry.run_statement` (check and
negative control, each with a fresh ``default_rng(0)``): the verdict must be "holds" and the negative control
must be "detected" (every one of these statements has a negative control).
"""

from __future__ import annotations

import pytest

from verification import registry

LP_STATEMENTS = ["H.1-3", "H.4", "H.5", "H.6", "H.7", "H.9", "H.10", "H.11"]


@pytest.mark.parametrize("stmt_id", LP_STATEMENTS)
def test_lp_statement_holds_and_control_detected(stmt_id):
    stmt = registry.get_statement(stmt_id)
    ev = registry.run_statement(stmt)
    assert ev.id == stmt_id
    assert ev.verdict == "holds", (ev.verdict, ev.counterexamples[:1], ev.details)
    assert ev.instances - ev.excluded > 0
    assert ev.negative_control == "detected", (ev.control.to_dict() if ev.control else None)
    if stmt_id == "H.4":  # recorded frequencies, expected > 0 on F6 (O-9, O-21)
        assert ev.details["gamma_nonpositive_balancing"] > 0
        assert ev.details["restricted_descent_infeasible"] > 0
