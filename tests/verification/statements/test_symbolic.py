"""THEOREMS.md §4: every identity S1–S26 verifies."""

from __future__ import annotations

import pytest
import sympy as sp

from verification.statements import symbolic


@pytest.mark.parametrize("k", range(1, 27), ids=[f"S{k}" for k in range(1, 27)])
def test_identity_holds(k):
    ev = getattr(symbolic, f"s{k}")()
    assert ev.id == f"S{k}"
    failing = {name: c["residual"] for name, c in ev.details["checks"].items() if not c["ok"]}
    assert ev.verdict == "holds", (failing, ev.counterexamples)
    assert ev.instances > 0 and ev.excluded == 0


def test_is_zero_rejects_false_identities():
    x, y = sp.symbols("x y", positive=True)
    assert symbolic.is_zero(sp.log(x * y) - sp.log(x) - sp.log(y))[0]
    ok, residual = symbolic.is_zero(sp.log(2 * x) - sp.log(x))
    assert not ok and "log(2)" in residual
    assert not symbolic.is_zero(x / (x + y) - 1)[0]


def test_all_identities_registered():
    from verification.core import registry

    ids = [s.id for s in registry.all_statements() if s.module == "verification.statements.symbolic"]
    assert ids == [f"S{k}" for k in range(1, 27)]
