"""Executable statements of THEOREMS.md: evidence records, the statement registry and the command line.

Run ``python -m verification list`` / ``python -m verification run [ID ...] [--json PATH] [--seed N]``.
"""

from .evidence import Evidence, Hypothesis, HypothesisMonitor, check_inequality

__all__ = ["Evidence", "Hypothesis", "HypothesisMonitor", "check_inequality"]
