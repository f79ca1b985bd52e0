"""Argument checks of :mod:`sim.constants`, :mod:`sim.lp_basis` and :mod:`sim.cluster`: a finite float64 array (or
scalar) with the required dimensions and sign, else :class:`ValueError` naming the argument and the value."""

from __future__ import annotations

import numpy as np

__all__ = ["as_array", "as_scalar"]


def as_array(x, name: str, *, ndim: int | None = None, min_ndim: int = 0, nonneg: bool = False,
             positive: bool = False, nonempty: bool = True) -> np.ndarray:
    """``x`` as a finite float64 array: ``ndim`` dimensions (at least ``min_ndim``), not empty unless ``nonempty``
    is False, every entry ``>= 0`` (``nonneg``) or ``> 0`` (``positive``)."""
    try:
        a = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError, RuntimeError) as exc:  # RuntimeError: a tensor needing grad
        raise ValueError(f"{name} must be a numeric array; got {x!r}") from exc
    if ndim is not None and a.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s); got shape {a.shape}")
    if a.ndim < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimension(s); got shape {a.shape}")
    if nonempty and a.size == 0:
        raise ValueError(f"{name} must not be empty; got shape {a.shape}")
    bad = ~np.isfinite(a)
    if bad.any():
        at = tuple(int(i) for i in np.argwhere(bad)[0]) if a.ndim else ()
        raise ValueError(f"{name} contains a non-finite entry {a[at]!r} at index {at}")
    if positive and np.any(a <= 0):
        at = tuple(int(i) for i in np.argwhere(a <= 0)[0]) if a.ndim else ()
        raise ValueError(f"{name} must be strictly positive; entry {at} is {a[at]!r}")
    if nonneg and np.any(a < 0):
        at = tuple(int(i) for i in np.argwhere(a < 0)[0]) if a.ndim else ()
        raise ValueError(f"{name} must be >= 0; entry {at} is {a[at]!r}")
    return a


def as_scalar(x, name: str, *, positive: bool = False, nonneg: bool = False) -> float:
    """``x`` as a finite float (a 0-dimensional array), ``>= 0`` (``nonneg``) or ``> 0`` (``positive``)."""
    a = as_array(x, name, ndim=0, positive=positive, nonneg=nonneg)
    return float(a)
