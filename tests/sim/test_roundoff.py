"""sim.roundoff: resolution helpers and the jittered generator of the roundoff-sensitivity mode."""

from __future__ import annotations

import numpy as np
import pytest

from sim.roundoff import (
    TIE_RTOL,
    JitteredGenerator,
    child_generator,
    first_max,
    generator_state,
    libm,
    order_desc,
    set_generator_state,
)


def test_jittered_generator_with_zero_jitter_is_the_plain_generator():
    a, b = JitteredGenerator(5, 0.0), np.random.default_rng(5)
    np.testing.assert_array_equal(a.standard_normal(7), b.standard_normal(7))
    np.testing.assert_array_equal(a.dirichlet(np.ones(3), 4), b.dirichlet(np.ones(3), 4))
    np.testing.assert_array_equal(a.integers(0, 100, 9), b.integers(0, 100, 9))
    assert isinstance(a, np.random.Generator)


@pytest.mark.parametrize("method, args", [("standard_normal", (50,)), ("uniform", (-2, 3, 50)),
                                          ("dirichlet", (np.ones(4), 20)), ("normal", (1.0, 2.0, 50)),
                                          ("random", (50,)), ("exponential", (1.0, 50))])
def test_jitter_is_a_relative_perturbation_of_the_same_draws(method, args):
    rel = 1e-10
    a, b = JitteredGenerator(3, rel, jitter_seed=9), np.random.default_rng(3)
    x, y = getattr(a, method)(*args), getattr(b, method)(*args)
    r = np.abs(x - y) / np.abs(y)
    assert r.max() <= rel * (1 + 1e-6) and r.max() > 0.1 * rel
    # discrete draws are not perturbed and the streams stay aligned
    np.testing.assert_array_equal(a.integers(0, 1000, 20), b.integers(0, 1000, 20))


def test_jittered_state_round_trip_and_children():
    a = JitteredGenerator(1, 1e-12, jitter_seed=2)
    st = generator_state(a)
    x = a.standard_normal(5)
    set_generator_state(a, st)
    np.testing.assert_array_equal(a.standard_normal(5), x)
    c = child_generator(a)
    assert isinstance(c, JitteredGenerator) and c.rel == 1e-12
    assert not isinstance(child_generator(np.random.default_rng(0)), JitteredGenerator)
    with pytest.raises(ValueError, match="jitter rel must be a finite number >= 0; got -1.0"):
        JitteredGenerator(0, -1.0)


def test_ties_within_the_resolution_are_broken_by_index():
    v = np.array([[1.0, 1.0 + 0.5 * TIE_RTOL, 0.5], [2.0, 3.0, 3.0 * (1 - 0.1 * TIE_RTOL)]])
    np.testing.assert_array_equal(order_desc(v), [[0, 1, 2], [1, 2, 0]])
    assert first_max(v[0], TIE_RTOL) == 0
    # beyond the resolution the larger value wins
    assert order_desc(np.array([1.0, 1.0 + 10 * TIE_RTOL]))[0] == 1


@pytest.mark.parametrize("name", ["log", "exp", "expm1", "log1p"])
def test_libm_is_the_c_library_entry_by_entry(name):
    """``libm`` applies the scalar function of Python's math module (the C library's, which numba's compiled code
    calls too) to every entry, keeps the shape, and passes non-finite results through where math would raise."""
    import math

    rng = np.random.default_rng(0)
    lo = {"log": 0.25, "log1p": -0.99}.get(name, -30.0)
    x = rng.uniform(lo, 30.0, (50, 4))
    got = libm(name, x)
    assert got.shape == x.shape and got.dtype == np.float64
    np.testing.assert_array_equal(got, np.array([[getattr(math, name)(v) for v in row] for row in x]))
    if name == "exp":
        with np.errstate(over="ignore"):  # numpy's overflow warning, as np.exp gives it
            np.testing.assert_array_equal(libm(name, np.array([1e4, 0.0, np.nan])), [np.inf, 1.0, np.nan])
