"""The dashboard (``python -m verification report``, ``make report``): the report itself
(:mod:`~verification.report.dashboard`), what it writes for each statement (:mod:`~verification.report.files`),
the statements as cells of the Dask engine (:mod:`~verification.report.cells`), what made it
(:mod:`~verification.report.manifest`), its figures (:mod:`~verification.report.figures`), the per-statement docs
sections (:mod:`~verification.report.docsections`) and the LLM section with its figures
(:mod:`~verification.report.llm_section`, :mod:`~verification.report.llm_figures`). Each imports only the modules
of this package listed after it (``files`` and ``manifest`` below ``cells``, ``cells`` below ``dashboard``).

The top layer below the command line: it imports every other sub-package of :mod:`verification`. The names of
:mod:`verification.report.dashboard` are also attributes of this package (``verification.report.build_report``, as
before the report became a package), imported when first used."""

from __future__ import annotations

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    module = importlib.import_module("verification.report.dashboard")
    if name in module.__all__:
        return getattr(module, name)
    raise AttributeError(f"module 'verification.report' has no attribute {name!r}")
