"""Registry of executable statements: the catalogue of statements and how a check is run.

The statements, where they come from (the statement-module contract, :func:`register`, the statements of other
packages) and how one is found by its id are :mod:`verification.core.catalogue`'s; every name of it is importable
from here too (:class:`Statement`, :func:`register`, :func:`register_module`, :func:`discover`,
:func:`all_statements`, :func:`get_statement`, :func:`resolve`, ...).

:func:`run_statement` runs a check and its negative control, each with a fresh
``numpy.random.default_rng(seed)``, and records the wall time; the check also runs at the statement's
``TIGHT_POINTS``, ``TIGHT_SEEDS`` seeds each (:func:`tight_point_seed`: the run's seed, then streams derived from
it). :func:`run_statement_row` adds the falsification search (:mod:`verification.core.search`).
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from sim import cli
from sim.roundoff import JitteredGenerator
from verification.core import catalogue as _catalogue
from verification.core import search as _search
from verification.core.catalogue import *  # noqa: F403 - every name of the catalogue is the registry's too
from verification.core.catalogue import Statement
from verification.core.evidence import Evidence, to_jsonable
from verification.core.resultlog import error_row

__all__ = [
    *_catalogue.__all__,
    "DEFAULT_SEED",
    "SCALES",
    "run_statement",
    "run_statement_row",
    "run_statements",
    "StatementRow",
    "print_traceback",
    "search_statement",
    "statement_config",
    "statement_rng",
    "tight_point_seed",
]

#: Seed used when none is given (docs/spec/tolerances.md#seeds: all seeds fixed).
DEFAULT_SEED = 0
#: Scales of a check: ``default`` (its Config's defaults, seconds) or ``paper`` (its ``Config.paper()`` preset).
SCALES = ("default", "paper")


def _check_evidence(ev: Any, stmt: Statement, what: str) -> Evidence:
    if not isinstance(ev, Evidence):
        raise TypeError(f"{stmt.module}: {what} of statement {stmt.id} returned {type(ev).__name__}, not Evidence")
    if ev.id != stmt.id:
        raise ValueError(f"{stmt.module}: {what} of statement {stmt.id} returned Evidence with id {ev.id!r}")
    return ev


def tight_point_seed(seed: int, j: int) -> int | list[int]:
    """The seed of the ``j``-th run (``j = 0, 1, …``) at a tight point of a check run with ``seed``: ``seed`` itself
    for ``j = 0`` (so one seed per point is the plain run), else ``[seed, j]``, which :func:`statement_rng` turns
    into an independent stream (``numpy.random.SeedSequence([seed, j])``)."""
    return seed if j == 0 else [int(seed), int(j)]


def statement_rng(seed: int | list[int] = DEFAULT_SEED, jitter: float = 0.0, jitter_seed: int = 0) -> np.random.Generator:
    """The generator a check receives: ``numpy.random.default_rng(seed)``, or with ``jitter > 0`` the same stream with
    every continuous draw perturbed by the relative amount ``jitter`` (:class:`sim.roundoff.JitteredGenerator`,
    jitter stream seeded by ``jitter_seed``): the roundoff-sensitivity mode of ``run --jitter``."""
    if jitter == 0.0:
        return np.random.default_rng(seed)
    return JitteredGenerator(seed, jitter, jitter_seed)


def run_statement(stmt: Statement, seed: int = DEFAULT_SEED, config: Any = None, *, jitter: float = 0.0,
                  jitter_seed: int = 0) -> Evidence:
    """Run the check and its negative control of ``stmt``.

    Each gets a fresh :func:`statement_rng` ``(seed, jitter, jitter_seed)`` (so either can be reproduced alone) and
    the same config (``config`` or ``stmt.config_factory()``); the check also runs at the statement's
    ``TIGHT_POINTS`` (each with a fresh generator of the same seed and jitter, and of ``TIGHT_SEEDS - 1`` seeds
    derived from it, :func:`tight_point_seed`) and their instances join its evidence. The returned Evidence
    carries ``negative_control`` ("detected" iff the control's ``control_detected`` is True, "missed" otherwise,
    "none" without a control), the control's own Evidence in ``control``, and ``seconds`` (check + control wall
    time).
    """
    if config is None and stmt.config_factory is not None:
        config = stmt.config_factory()
    t0 = time.perf_counter()
    ev = _check_evidence(stmt.run(config, statement_rng(seed, jitter, jitter_seed)), stmt, "run")
    if stmt.tight_points:
        if stmt.search is None:
            raise ValueError(f"{stmt.module}: TIGHT_POINTS need a SEARCH space (their Config comes from it)")
        parts = []
        for p in stmt.tight_points:
            for j in range(stmt.tight_seeds):
                s = tight_point_seed(seed, j)
                parts.append((dict(p), _check_evidence(
                    stmt.run(stmt.search.make_config(dict(p)), statement_rng(s, jitter, jitter_seed)),
                    stmt, f"run at the tight point {p} (seed {s})").at_designed_point(), s))
        ev = Evidence.merged(ev, parts)
    control = None
    state = "none"
    if stmt.negative_control is not None:
        control = _check_evidence(
            stmt.negative_control(config, statement_rng(seed, jitter, jitter_seed)), stmt, "negative_control"
        )
        state = "detected" if control.control_detected else "missed"
        doc = inspect.getdoc(stmt.negative_control)
        if doc and "description" not in control.details:
            control = dataclasses.replace(control, details={**control.details,
                                                            "description": " ".join(doc.split("\n\n")[0].split())})
    seconds = time.perf_counter() - t0
    ev = ev.with_reasons(stmt.reasons or {})
    return dataclasses.replace(ev, negative_control=state, control=control, seconds=seconds)


def statement_config(stmt: Statement, scale: str = "default") -> Any:
    """The Config of ``stmt`` at ``scale``: the default Config, or its ``paper()`` preset where one exists.

    Every statement module of :mod:`verification.statements` has a ``paper()`` preset (its conclusions are
    counted over samples, runs or Monte Carlo replications); the symbolic identities S1–S26 have no Config: they
    are exact (sympy), with no sample size or run length to scale."""
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}; got {scale!r}")
    factory = stmt.config_factory
    if factory is None:
        return None
    if scale == "paper" and hasattr(factory, "paper"):
        return factory.paper()
    return factory()


def print_traceback(exc: BaseException) -> None:
    """Print the traceback of ``exc`` on stderr: the ``on_error`` of :func:`run_statement_row` on a command line."""
    traceback.print_exception(exc, file=sys.stderr)


class StatementRow(NamedTuple):
    """What :func:`run_statement_row` returns: the Evidence (None when the check raised), the JSON-ready row of
    results.json, and the falsification-search result (None without a search)."""

    evidence: Evidence | None
    row: dict[str, Any]
    search: Any = None


def run_statement_row(stmt: Statement, seed: int = DEFAULT_SEED, *, scale: str = "default", jitter: float = 0.0,
                      jitter_seed: int = 0, search: str | Callable[[Statement, int], Any] | None = None,
                      on_error: Callable[[BaseException], None] | None = None) -> StatementRow:
    """Run ``stmt`` (:func:`run_statement` with the Config of ``scale``) and, with a ``search`` budget
    (:data:`verification.core.search.BUDGETS`) where the statement declares a family box, its falsification search
    applied to the Evidence (:func:`verification.core.search.apply`); make its result row. ``search`` may also be a
    function ``(stmt, seed) -> SearchResult`` that gives a search made elsewhere (the report's search cells,
    :mod:`verification.report.cells`); it is called after the check, where the search would run. Returns a
    :class:`StatementRow`; when the check raised, ``(None, an error row, None)``, after ``on_error(exc)`` (e.g. to
    print the traceback), and the caller goes on. ``python -m verification run``, ``report`` and ``sweep`` all make
    their rows here. A Ctrl-C that Python swallowed while the statement's modules imported is raised here, before
    or after the statement (:func:`sim.cli.raise_if_interrupted`)."""
    cli.raise_if_interrupted()
    try:
        ev = run_statement(stmt, seed=seed, config=statement_config(stmt, scale), jitter=jitter,
                           jitter_seed=jitter_seed)
        res = None
        if search is not None and stmt.search is not None:
            res = search(stmt, seed) if callable(search) else search_statement(stmt, search, seed)
            ev = _search.apply(ev, res, findings=stmt.search_findings)
    except Exception as exc:  # noqa: BLE001 - an error row; the caller's run goes on
        if on_error is not None:
            on_error(exc)
        return StatementRow(None, to_jsonable(error_row(stmt, exc)), None)
    cli.raise_if_interrupted()
    return StatementRow(ev, to_jsonable(ev.to_dict()), res)


def search_statement(stmt: Statement, budget: str = "stored", seed: int = DEFAULT_SEED,
                     progress: Callable[[str], None] | None = None) -> Any:
    """The falsification search of ``stmt`` over its declared family box (:func:`verification.core.search.search_statement`:
    the stored search refined, or a budget of :data:`verification.core.search.BUDGETS` run here); ``None`` for a statement
    without a ``SEARCH`` space."""
    return _search.search_statement(stmt, budget, seed, progress=progress)


def run_statements(stmts: Sequence[Statement], seed: int = DEFAULT_SEED,
                   on_result: Callable[[Statement, Evidence], None] | None = None) -> list[Evidence]:
    """Run several statements in order; ``on_result`` is called after each (progress reporting)."""
    out = []
    for s in stmts:
        ev = run_statement(s, seed)
        if on_result is not None:
            on_result(s, ev)
        out.append(ev)
    return out
