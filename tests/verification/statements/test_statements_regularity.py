"""Executable statements H.19, H.20, H.22, H.27, H.30, H.34 (docs/spec/statements.md#catalogue): each runs
with its default
Config and seed, must hold, and its negative control must be detected (the check can fail)."""

from __future__ import annotations

import pytest

REGULARITY_IDS = ["H.19", "H.20", "H.22", "H.27", "H.30", "H.34"]


@pytest.mark.parametrize("stmt_id", REGULARITY_IDS)
def test_statement_holds_and_control_detected(stmt_id, default_run):
    ev = default_run(stmt_id)
    assert ev.id == stmt_id
    assert ev.verdict == "holds", (ev.verdict, ev.counterexamples[:3], ev.exclusion_reasons)
    assert ev.instances - ev.excluded > 0
    assert ev.negative_control == "detected", ev.control.to_record() if ev.control is not None else None
