"""Fixtures of the Algorithm 1 tests (tests/sim/test_algorithm_*.py), one per module that uses it: the F1 samples
and the adaptation set-up of :mod:`tests.algorithm_helpers`."""

from __future__ import annotations

import pytest

from tests import algorithm_helpers


@pytest.fixture(scope="module")
def f1_samples():
    return algorithm_helpers.f1_samples()


@pytest.fixture(scope="module")
def adaptation_setup():
    return algorithm_helpers.adaptation_setup()
