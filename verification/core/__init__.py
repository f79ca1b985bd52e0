"""The core of a check: the evidence a statement returns (:mod:`~verification.core.evidence`), the registry that
finds and runs statements (:mod:`~verification.core.registry`), the results log (:mod:`~verification.core.resultlog`),
the Monte Carlo assertions and their budget (:mod:`~verification.core.montecarlo`), the falsification search
(:mod:`~verification.core.search`), power (:mod:`~verification.core.power`) and bound regression
(:mod:`~verification.core.regression`).

The bottom layer of :mod:`verification`: it imports :mod:`sim` and nothing else of :mod:`verification` (the
registry imports the statement modules by name, as plugins)."""
