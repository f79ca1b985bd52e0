"""Executable statements of the specification (docs/spec/index.md): evidence records, the statement registry
and the command line.

Run ``python -m verification list`` / ``python -m verification run [ID ...] [--json PATH] [--seed N]``.

The package is layered by role, each layer importing only those below it:

* :mod:`verification.core` — evidence, registry, results log, Monte Carlo, falsification search, power, regression;
* :mod:`verification.statements` — one module per statement of the specification and the symbolic identities S1–S26;
* :mod:`verification.studies` — the four reported studies on synthetic problems;
* :mod:`verification.engine` — the Dask engine, sweeps, grids, the Monte Carlo calibration, the search's cells;
* :mod:`verification.llm` — the records, studies, statistics, sweeps and regression of LLM runs;
* :mod:`verification.report` — the dashboard, its figures and sections;
* ``python -m verification`` (:mod:`verification.__main__`) — the command line.

The modules that sat side by side in ``verification/`` before this layout are still importable under their old
names (``verification.registry``, ``verification.sweep``, …; :data:`MOVED`): the old name is the new module itself,
with a :class:`DeprecationWarning` naming where it is now.
"""

# ruff: noqa: E402 - the start handler comes before the imports
from __future__ import annotations

from sim.interrupts import quiet_if_started_as

# the command `python -m verification`: a Ctrl-C from here until it handles it is one line and exit 130
quiet_if_started_as("verification", "python -m verification")

from sim.moved import keep_old_names
from verification.core.evidence import Evidence, Hypothesis, HypothesisMonitor, check_inequality

__all__ = ["Evidence", "Hypothesis", "HypothesisMonitor", "check_inequality", "MOVED"]

#: Old module name -> the module it is now (the layout by role; CHANGELOG). ``verification.report`` and
#: ``verification.studies`` are packages of their own now, whose attributes are those of the old modules.
MOVED = {
    "verification.evidence": "verification.core.evidence",
    "verification.resultlog": "verification.core.resultlog",
    "verification.registry": "verification.core.registry",
    "verification.search": "verification.core.search",
    "verification.montecarlo": "verification.core.montecarlo",
    "verification.power": "verification.core.power",
    "verification.regression": "verification.core.regression",
    "verification.symbolic": "verification.statements.symbolic",
    "verification.dask_engine": "verification.engine.dask_engine",
    "verification.sweep": "verification.engine.sweep",
    "verification.grid": "verification.engine.grid",
    "verification.mc_calibration": "verification.engine.mc_calibration",
    "verification.run_records": "verification.llm.records",
    "verification.llm_studies": "verification.llm.studies",
    "verification.llm_personalisation": "verification.llm.personalisation",
    "verification.llm_sweep": "verification.llm.sweep",
    "verification.llm_regression": "verification.llm.regression",
    "verification.figures": "verification.report.figures",
    "verification.docsections": "verification.report.docsections",
    "verification.llm_section": "verification.report.llm_section",
    "verification.llm_figures": "verification.report.llm_figures",
}


keep_old_names(MOVED)
