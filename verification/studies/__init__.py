"""The four reported studies the paper did not carry out, on synthetic problems
(:mod:`~verification.studies.synthetic`). Imports :mod:`verification.core` only.

The names of :mod:`verification.studies.synthetic` are also attributes of this package (``verification.studies.X``,
as before the studies became a package), imported when first used."""

from __future__ import annotations

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    module = importlib.import_module("verification.studies.synthetic")
    if name in module.__all__:
        return getattr(module, name)
    raise AttributeError(f"module 'verification.studies' has no attribute {name!r}")
