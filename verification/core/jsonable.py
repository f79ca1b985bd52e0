"""Plain JSON values of the records of a check: numpy scalars and arrays, tuples, sets and dataclasses converted, and
non-finite floats as strings (strict JSON has no NaN). Every name is importable from
:mod:`verification.core.evidence` too."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["JsonRecord", "json_float", "to_jsonable"]


class JsonRecord:
    """A record that writes itself (:meth:`to_dict`): :func:`to_jsonable` converts it so, not field by field
    (:class:`verification.core.evidence.Evidence`)."""

    def to_dict(self) -> dict[str, Any]:
        raise NotImplementedError


def json_float(x: float) -> float | str:
    """``x`` as a float, or the string ``"nan"``, ``"inf"`` or ``"-inf"`` where it is not finite."""
    x = float(x)
    if math.isfinite(x):
        return x
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


def to_jsonable(obj: Any) -> Any:
    """Convert numpy scalars/arrays, tuples, sets and dataclasses to plain JSON types.

    Non-finite floats become the strings ``"nan"``, ``"inf"``, ``"-inf"`` (strict JSON has no NaN); other
    objects (e.g. sympy expressions) become their ``str``.
    """
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, (np.bool_,)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return json_float(float(obj))
    if isinstance(obj, np.ndarray):
        return [to_jsonable(v) for v in obj.tolist()] if obj.ndim else to_jsonable(obj.item())
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, JsonRecord):
        return obj.to_dict()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return to_jsonable(dataclasses.asdict(obj))
    return str(obj)
