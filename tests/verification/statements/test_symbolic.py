"""docs/spec/identities.md#identities: every identity S1–S26 verifies."""

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


def test_taylor_coefficients_are_the_series_coefficients():
    """S3's coefficients (derivatives at 0) against sympy's series, on sums of products of logarithms like S3's."""
    t, e, lam = sp.symbols("t e lambda", real=True)
    f = lam**2 * (sp.log(1 + t * e) - (1 + 2 * t * e) * sp.log(1 + 2 * t * e) / 3) ** 2 + sp.exp(t) * sp.log(1 + t)
    ser = sp.expand(sp.series(f, t, 0, 4).removeO())
    got = symbolic.taylor_coefficients(f, t, 4)
    assert len(got) == 4 and all(sp.expand(got[k] - ser.coeff(t, k)) == 0 for k in range(4))
    assert symbolic.taylor_coefficients(sp.log(1 + t), t, 4) == [0, 1, sp.Rational(-1, 2), sp.Rational(1, 3)]
