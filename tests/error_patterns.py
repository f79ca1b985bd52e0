"""Regex helpers for ``pytest.raises(..., match=...)``: an error message must name the argument, the bad value and,
in a batch, the row. numpy's own ValueErrors (what a deleted check leaves behind) name none of them, so a test
written with these fails when a check is removed."""

from __future__ import annotations

import re


def names(*fragments: str) -> str:
    """Regex matching a message that contains every fragment (each itself a regex), in any order."""
    return "(?s)" + "".join(f"(?=.*(?:{f}))" for f in fragments)


def float_value(value: str) -> str:
    """A float as a message may show it: ``-1.0`` or numpy's repr ``np.float64(-1.0)``."""
    return rf"(?:np\.float64\()?{re.escape(value)}\)?"
