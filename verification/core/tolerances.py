r"""Tolerances of the checks (docs/spec/tolerances.md#tolerances), the deterministic inequality every check
uses, and the bound factor through which every numeric bound passes (power).

Deterministic inequalities use ``lhs ≤ rhs + ATOL + RTOL·|rhs|`` with ``ATOL = 1e-12`` and ``RTOL = 1e-9``.

**Power.** Every numeric bound of a conclusion passes through :func:`scaled_bound`, which applies the active *bound
factor* ``f`` (:func:`bound_factor`, 1 by default): ``rhs ↦ rhs − (1 − f)|rhs|``, a bound too small by the factor
``f``. The *detection factor* of an instance is ``1 − (rhs − lhs)/|rhs|`` (:func:`detection_factor`), the largest
``f`` at which the scaled bound is still violated there.

Every name is importable from :mod:`verification.core.evidence` too.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import numpy as np
import numpy.typing as npt

__all__ = [
    "ATOL",
    "RTOL",
    "LP_TOL",
    "ACTIVE_SET_TOL",
    "POSITIVITY_RTOL",
    "FD_STEP_LOSSES",
    "FD_STEP_PARAMS",
    "FD_RTOL",
    "check_inequality",
    "inequality_margin",
    "is_strictly_positive",
    "bound_factor",
    "active_bound_factor",
    "scaled_bound",
    "detection_factor",
]

#: Deterministic inequalities: absolute slack in ``lhs ≤ rhs + ATOL + RTOL·|rhs|``.
ATOL = 1e-12
#: Deterministic inequalities: relative slack in ``lhs ≤ rhs + ATOL + RTOL·|rhs|``.
RTOL = 1e-9
#: LP feasibility / optimality tolerance.
LP_TOL = 1e-9
#: Active-set tolerance (slack ``≤ tol·max(1, |rhs|)`` or ``μ_j ≤ tol``).
ACTIVE_SET_TOL = 1e-9
#: Strict positivity (``γ > 0``, ``κ_β > 0``): ``x > POSITIVITY_RTOL · scale``.
POSITIVITY_RTOL = 1e-12
#: Central finite differences: step for derivatives in the losses.
FD_STEP_LOSSES = 1e-6
#: Central finite differences: step for derivatives in the parameters.
FD_STEP_PARAMS = 1e-7
#: Central finite differences: accepted relative error.
FD_RTOL = 1e-5


def check_inequality(lhs, rhs, atol: float = ATOL, rtol: float = RTOL) -> npt.NDArray[np.bool_]:
    """Elementwise ``lhs ≤ rhs + atol + rtol·|rhs|`` (broadcast); NaN on either side counts as *failed*."""
    lhs = np.asarray(lhs, dtype=np.float64)
    rhs = np.asarray(rhs, dtype=np.float64)
    return np.asarray(lhs <= rhs + atol + rtol * np.abs(rhs))


def inequality_margin(lhs, rhs, atol: float = ATOL, rtol: float = RTOL) -> np.ndarray:
    """Margin ``rhs + atol + rtol·|rhs| − lhs`` of ``lhs ≤ rhs``: ``≥ 0`` iff :func:`check_inequality` holds."""
    lhs = np.asarray(lhs, dtype=np.float64)
    rhs = np.asarray(rhs, dtype=np.float64)
    return rhs + atol + rtol * np.abs(rhs) - lhs


def is_strictly_positive(x, scale=1.0, rtol: float = POSITIVITY_RTOL) -> np.ndarray:
    """Elementwise ``x > rtol·|scale|`` (strict positivity relative to a scale,
    docs/spec/tolerances.md#tolerances)."""
    x = np.asarray(x, dtype=np.float64)
    return np.asarray(x > rtol * np.abs(np.asarray(scale, dtype=np.float64)))


# ------------------------------------------------------------------------------------------ bound scaling (power)
_BOUND_FACTOR: ContextVar[float] = ContextVar("bound_factor", default=1.0)


def _check_factor(factor) -> float:
    f = float(factor)
    if not (math.isfinite(f) and 0.0 < f <= 1.0):
        raise ValueError(f"bound factor must lie in (0, 1]; got {factor!r}")
    return f


@contextmanager
def bound_factor(factor: float) -> Iterator[float]:
    """Within the block every numeric bound is scaled to ``rhs − (1 − factor)|rhs|`` (see :func:`scaled_bound`)."""
    token = _BOUND_FACTOR.set(_check_factor(factor))
    try:
        yield _BOUND_FACTOR.get()
    finally:
        _BOUND_FACTOR.reset(token)


def active_bound_factor() -> float:
    """The bound factor in force (1 outside :func:`bound_factor`)."""
    return _BOUND_FACTOR.get()


def scaled_bound(rhs, factor: float | None = None):
    """``rhs − (1 − f)|rhs|`` with ``f`` the active bound factor (or ``factor``): the bound made too small by
    ``f``. The one function through which every numeric bound of a conclusion passes (:meth:`Evidence.
    from_implication` for ``bound`` conclusions, :func:`verification.core.montecarlo.mean_claim` for Monte Carlo
    bounds); the identity at ``f = 1``."""
    f = active_bound_factor() if factor is None else _check_factor(factor)
    r = np.asarray(rhs, dtype=np.float64)
    out = r if f == 1.0 else r - (1.0 - f) * np.abs(r)
    return float(out) if np.ndim(rhs) == 0 else out


def detection_factor(lhs, rhs) -> np.ndarray:
    """Per instance ``1 − (rhs − lhs)/|rhs|``: the largest ``f`` with ``lhs > rhs − (1 − f)|rhs|``, i.e. the factor
    down to which a scaled bound is still violated there (``lhs/rhs`` when ``rhs > 0``). NaN where
    ``|rhs| ≤ ATOL`` (a zero bound cannot be scaled)."""
    lhs = np.asarray(lhs, dtype=np.float64)
    rhs = np.asarray(rhs, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = 1.0 - (rhs - lhs) / np.abs(rhs)
    return np.where(np.abs(rhs) > ATOL, out, np.nan)
