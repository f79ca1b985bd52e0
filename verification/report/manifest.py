"""What made a report (``manifest.json`` in its folder): the command line, the statements with their modules and
presets, the studies and the versions of the project and of the libraries its numbers come from.

A committed dashboard is the output of one checkout's code: ``tests/verification/report/test_committed_reports.py``
compares the committed ``reports/manifest.json`` with :func:`statement_entries` of the checkout's registry and
with the versions it pins (``constraints.txt``), so that a change of the statement set, of a module name or of a
preset fails the default tier until ``make report`` regenerates ``reports/``. Nothing in it depends on the machine,
the day or the time the report took: a report made again by the same code writes the same manifest.
"""

from __future__ import annotations

import importlib.metadata
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import sim
from verification.core import registry

__all__ = ["MANIFEST_NAME", "MANIFEST_KIND", "VERSIONED", "statement_entry", "statement_entries",
           "library_versions", "report_manifest", "scale_note"]

MANIFEST_NAME = "manifest.json"
MANIFEST_KIND = "prefalign-verify report manifest"
#: The distributions whose versions the report's numbers and figures depend on (their exact versions are pinned
#: in ``constraints.txt``; a report records the installed ones).
VERSIONED = ("numpy", "scipy", "numba", "pandas", "sympy", "matplotlib", "seaborn")


def statement_entry(stmt: registry.Statement) -> dict[str, Any]:
    """One statement as the manifest records it: ``id``, ``number``, ``name``, ``module``, its ``presets``
    (``[]`` for an exact identity without a configuration, ``["default"]``, or ``["default", "paper"]`` when its
    ``Config`` has a paper-scale preset) and whether it has a falsification-search box (``search``)."""
    factory = stmt.config_factory
    presets = [] if factory is None else ["default", "paper"] if hasattr(factory, "paper") else ["default"]
    return {"id": stmt.id, "number": stmt.number, "name": stmt.name, "module": stmt.module, "presets": presets,
            "search": stmt.search is not None}


def statement_entries(stmts: Iterable[registry.Statement]) -> list[dict[str, Any]]:
    """:func:`statement_entry` of each of ``stmts``, in their order."""
    return [statement_entry(s) for s in stmts]


def library_versions(names: Sequence[str] = VERSIONED) -> dict[str, str]:
    """The installed version of each distribution of ``names`` (``"not installed"`` where it is not)."""
    out = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def report_manifest(stmts: Sequence[registry.Statement], *, command: str, scale: str, seed: int,
                    search: str | None, studies: Sequence[str], llm: Mapping[str, Any]) -> dict[str, Any]:
    """The manifest of a report of ``stmts`` made by ``command``: its ``scale``, ``seed`` and search budget, the
    ids of the ``studies`` it ran, its LLM section's source (``llm``: ``{"source": "sweep" | "runs" | "smoke" |
    "none", ...}``), the project's version, Python's major.minor version and :func:`library_versions`."""
    return {"kind": MANIFEST_KIND, "command": command, "scale": scale, "seed": int(seed), "search": search,
            "version": sim.__version__, "python": f"{sys.version_info.major}.{sys.version_info.minor}",
            "libraries": library_versions(), "statements": statement_entries(stmts), "studies": list(studies),
            "llm": dict(llm)}


def _id_ranges(ids: list[str]) -> str:
    """``S1, S2, S3, S7`` as ``S1–S3, S7`` (runs of consecutive numbers of one prefix)."""
    out: list[list] = []
    for sid in ids:
        head, num = sid.rstrip("0123456789"), sid[len(sid.rstrip("0123456789")):]
        if num and out and out[-1][0] == head and out[-1][2] + 1 == int(num):
            out[-1][2] = int(num)
        else:
            out.append([head, int(num), int(num)] if num else [sid, None, None])
    return ", ".join(h if a is None else f"{h}{a}" if a == b else f"{h}{a}–{h}{b}" for h, a, b in out)


def scale_note(entries: Sequence[Mapping[str, Any]], scale: str) -> str:
    """The dashboard's sentence on the configurations of the statements ``entries`` (:func:`statement_entry`) at
    ``scale``: which have paper-scale presets, and which have no configuration."""
    with_paper = [e["id"] for e in entries if "paper" in e["presets"]]
    configured = [e["id"] for e in entries if e["presets"]]
    exact = [e["id"] for e in entries if not e["presets"]]
    none = (f" {_id_ranges(exact)} have no configuration (exact identities: no sample size or run length)."
            if exact else "")
    which = (f"every statement with a configuration ({len(with_paper)})" if with_paper and with_paper == configured
             else ", ".join(with_paper) or "no statement")
    if scale == "paper":
        return f"Paper-scale presets were used for {which}; the other checks ran at their default configuration." + none
    return f"Default configurations (paper-scale presets exist for {which})." + none
