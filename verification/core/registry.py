"""Registry of executable statements.

Statements come from two sources:

* modules in :mod:`verification.statements` (one per statement, e.g. ``h13_simultaneous_balancing.py``), each
  exposing ``STATEMENT_ID`` (e.g. ``"H.13"``), ``NAME``, ``run(config, rng) -> Evidence`` and optionally
  ``negative_control(config, rng) -> Evidence``, a frozen dataclass ``Config`` (its defaults run in seconds)
  and ``NUMBER`` (the catalogue number shown by ``list``; default derived from the id); optionally ``SEARCH``, the
  :class:`verification.core.search.SearchSpace` of its family for the falsification search, and ``REASONS``, a
  mapping from a conclusion name to the reason its numeric bound cannot be approached on the family (shown next
  to a weak conclusion in the power report), and ``TIGHT_POINTS``, points of its search box where the
  falsification search found the bound approached: the check runs there too (the search's ``Config`` at each
  point, the same seed) and the instances join the statement's evidence (:meth:`Evidence.merged`), and
  ``TIGHT_SEEDS`` (default 1), at how many seeds each tight point runs (:func:`tight_point_seed`: the run's seed,
  then streams derived from it), so that a detection at a tight point rests on more than one draw, and
  ``SEARCH_FINDINGS``, a mapping from a conclusion name to the documented finding that the falsification search
  refutes it on part of its box (an assumption whose region-sampled constants fail somewhere): counterexamples
  of those conclusions only make the verdict ``finding``, not ``violated`` (:func:`verification.core.search.apply`).
  A module may instead expose ``STATEMENTS``, a list of :class:`Statement`;
* explicit registrations with :func:`register` (the symbolic identities S1–S26 of :mod:`verification.statements.symbolic`),
  and modules of the statement-module contract registered with :func:`register_module`;
* statements of other packages: every module named by an entry point of the group ``prefalign.statements`` (a
  package's ``[project.entry-points."prefalign.statements"]``) or listed in the environment variable
  ``PREFALIGN_STATEMENTS`` (comma-separated module names) is imported by :func:`discover`; a module that follows
  the statement-module contract is registered as above, one that calls :func:`register` when imported registers
  itself. So ``prefalign verify run MY.1`` runs a statement of yours (docs: "Write your own statement").

:func:`run_statement` runs a check and its negative control, each with a fresh
``numpy.random.default_rng(seed)``, and records the wall time.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import pkgutil
import re
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

from sim import cli
from sim.roundoff import JitteredGenerator
from verification.core.evidence import Evidence, to_jsonable
from verification.core.resultlog import error_row

__all__ = [
    "DEFAULT_SEED",
    "Statement",
    "UnknownStatementError",
    "StatementImportError",
    "register",
    "register_module",
    "discover",
    "ENTRY_POINT_GROUP",
    "STATEMENTS_ENV",
    "all_statements",
    "get_statement",
    "resolve",
    "run_statement",
    "run_statement_row",
    "StatementRow",
    "print_traceback",
    "search_statement",
    "statement_rng",
    "SCALES",
    "statement_config",
]

#: Seed used when none is given (THEOREMS.md §3.0: all seeds fixed).
DEFAULT_SEED = 0
#: Scales of a check: ``default`` (its Config's defaults, seconds) or ``paper`` (its ``Config.paper()`` preset).
SCALES = ("default", "paper")

STATEMENTS_PACKAGE = "verification.statements"
SYMBOLIC_MODULE = "verification.statements.symbolic"
#: Entry-point group of statement modules of other packages.
ENTRY_POINT_GROUP = "prefalign.statements"
#: Environment variable: comma-separated names of statement modules to import.
STATEMENTS_ENV = "PREFALIGN_STATEMENTS"


class UnknownStatementError(ValueError):
    """An id that no registered statement has."""


class StatementImportError(ImportError):
    """A module under ``verification/statements`` could not be imported or lacks the required names."""


def _default_number(stmt_id: str) -> str:
    m = re.fullmatch(r"[A-Za-z]+[.\-]?(\d+[a-z]?(?:\([a-z]\))?)", stmt_id)
    return m.group(1) if m else stmt_id


@dataclass(frozen=True)
class Statement:
    """One executable statement.

    ``id`` is the statement id used on the command line and in results ("H.13", "S4"); ``number`` its catalogue
    number as shown by ``list`` ("13", "4"); ``run(config, rng) -> Evidence``; ``negative_control(config, rng)
    -> Evidence`` or None; ``module`` the defining module; ``config_factory()`` builds the default config
    (None: the check takes ``config=None``).
    """

    id: str
    number: str
    name: str
    run: Callable[[Any, np.random.Generator], Evidence]
    negative_control: Callable[[Any, np.random.Generator], Evidence] | None = None
    module: str = ""
    config_factory: Callable[[], Any] | None = None
    search: Any = None  # verification.core.search.SearchSpace
    reasons: Any = None  # conclusion name -> why its bound cannot be approached (Mapping[str, str])
    tight_points: tuple = ()  # points of the search box the check also runs at (dicts of parameters)
    tight_seeds: int = 1  # seeds per tight point (tight_point_seed)
    search_findings: Any = None  # conclusion name -> the documented finding the search refutes (Mapping[str, str])

    def __post_init__(self) -> None:
        if isinstance(self.tight_seeds, bool) or not isinstance(self.tight_seeds, int) or self.tight_seeds < 1:
            raise ValueError(f"statement {self.id}: TIGHT_SEEDS must be an integer >= 1; got {self.tight_seeds!r}")

    @property
    def sort_key(self) -> tuple:
        """Appendix-H statements by number, then other statements, then S1..S26."""
        m = re.match(r"\d+", self.number)
        num = int(m.group(0)) if m else 10**9
        if self.module == SYMBOLIC_MODULE:
            group = 2
        elif re.match(r"H[.\-]?\d", self.id):
            group = 0
        else:
            group = 1
        return (group, num, self.number, self.id)


_EXPLICIT: list[Statement] = []


def register(
    id: str,
    name: str,
    *,
    number: str | None = None,
    negative_control: Callable[[Any, np.random.Generator], Evidence] | None = None,
    config_factory: Callable[[], Any] | None = None,
) -> Callable:
    """Decorator registering ``run(config, rng) -> Evidence`` as statement ``id``; returns the function.

    ``negative_control(config, rng) -> Evidence`` breaks a hypothesis on purpose; ``config_factory()`` builds the
    Config both receive (None: they receive ``config=None``). The statement is listed by :func:`all_statements`
    from then on."""

    def deco(fn: Callable) -> Callable:
        global _CACHE
        _CACHE = None
        _EXPLICIT.append(
            Statement(
                id=id,
                number=number if number is not None else _default_number(id),
                name=name,
                run=fn,
                negative_control=negative_control,
                module=getattr(fn, "__module__", ""),
                config_factory=config_factory,
            )
        )
        return fn

    return deco


def _from_module(mod: ModuleType) -> list[Statement]:
    if hasattr(mod, "STATEMENTS"):
        stmts = list(mod.STATEMENTS)
        for s in stmts:
            if not isinstance(s, Statement):
                raise StatementImportError(f"{mod.__name__}.STATEMENTS must hold Statement objects; got {s!r}")
        return stmts
    missing = [a for a in ("STATEMENT_ID", "NAME", "run") if not hasattr(mod, a)]
    if missing:
        raise StatementImportError(f"statement module {mod.__name__} lacks {', '.join(missing)}")
    sid = str(mod.STATEMENT_ID)
    return [
        Statement(
            id=sid,
            number=str(getattr(mod, "NUMBER", _default_number(sid))),
            name=str(mod.NAME),
            run=mod.run,
            negative_control=getattr(mod, "negative_control", None),
            module=mod.__name__,
            config_factory=getattr(mod, "Config", None),
            search=getattr(mod, "SEARCH", None),
            reasons=dict(getattr(mod, "REASONS", {}) or {}),
            tight_points=tuple(getattr(mod, "TIGHT_POINTS", ()) or ()),
            tight_seeds=getattr(mod, "TIGHT_SEEDS", 1),
            search_findings=dict(getattr(mod, "SEARCH_FINDINGS", {}) or {}),
        )
    ]


def register_module(module: ModuleType | str) -> list[Statement]:
    """Register the statement(s) of ``module`` (a module object or its importable name) that follows the
    statement-module contract: ``STATEMENT_ID``, ``NAME``, ``run(config, rng) -> Evidence`` and optionally
    ``negative_control``, ``Config``, ``NUMBER``, ``SEARCH``, ``REASONS``, ``TIGHT_POINTS``, ``TIGHT_SEEDS``,
    ``SEARCH_FINDINGS`` (or
    ``STATEMENTS``, a list of :class:`Statement`), exactly as a module of :mod:`verification.statements`. Returns
    the statements.

    Raises :class:`StatementImportError` when the module cannot be imported or lacks the required names."""
    global _CACHE
    if isinstance(module, str):
        module = _import_statement_module(module)
    stmts = _from_module(module)
    _EXPLICIT.extend(s for s in stmts if s not in _EXPLICIT)
    _CACHE = None
    return stmts


def _import_statement_module(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - re-raised with the module named
        raise StatementImportError(f"cannot import statement module {name}: {exc!r}") from exc


def _plugin_modules() -> list[str]:
    """Names of the statement modules of other packages: entry points of :data:`ENTRY_POINT_GROUP`, then the
    modules listed in :data:`STATEMENTS_ENV`."""
    from importlib.metadata import entry_points

    names = [ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)]
    names += [n.strip() for n in os.environ.get(STATEMENTS_ENV, "").split(",") if n.strip()]
    return list(dict.fromkeys(names))


def _load_plugins() -> None:
    for name in _plugin_modules():
        mod = _import_statement_module(name)  # a module that calls @register registers itself on import
        if not any(s.module == mod.__name__ for s in _EXPLICIT):
            register_module(mod)  # raises StatementImportError when the module lacks the contract


def discover() -> list[Statement]:
    """Import every module of :mod:`verification.statements`, the symbolic identities and the statement modules of
    other packages (entry points of :data:`ENTRY_POINT_GROUP`, :data:`STATEMENTS_ENV`); return all statements
    sorted by :attr:`Statement.sort_key`. Raises on an import error or a duplicate id."""
    importlib.import_module(SYMBOLIC_MODULE)  # registers S1..S26 via @register
    _load_plugins()
    pkg = importlib.import_module(STATEMENTS_PACKAGE)
    found: list[Statement] = list(_EXPLICIT)
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda i: i.name):
        modname = f"{STATEMENTS_PACKAGE}.{info.name}"
        if info.name.startswith("_") or modname == SYMBOLIC_MODULE:  # helpers; the identities registered above
            continue
        try:
            mod = importlib.import_module(modname)
        except Exception as exc:  # noqa: BLE001 - re-raised with the module named
            raise StatementImportError(f"cannot import statement module {modname}: {exc!r}") from exc
        found.extend(_from_module(mod))
    seen: dict[str, str] = {}
    for s in found:
        if s.id in seen and seen[s.id] != s.module:
            raise ValueError(f"duplicate statement id {s.id!r} in {seen[s.id]} and {s.module}")
        seen[s.id] = s.module
    unique = {s.id: s for s in found}
    return sorted(unique.values(), key=lambda s: s.sort_key)


_CACHE: list[Statement] | None = None


def all_statements(refresh: bool = False) -> list[Statement]:
    """All statements (discovered once and cached)."""
    global _CACHE
    if _CACHE is None or refresh:
        _CACHE = discover()
    return list(_CACHE)


def _norm(s: str) -> str:
    return s.strip().lower()


def get_statement(stmt_id: str) -> Statement:
    """The statement with this id (case-insensitive); raises :class:`UnknownStatementError`."""
    return resolve([stmt_id])[0]


def resolve(ids: Iterable[str] | None) -> list[Statement]:
    """Statements for ``ids`` in the given order (all statements if ``ids`` is empty or None).

    Raises :class:`UnknownStatementError` naming the unknown ids and listing the valid ones."""
    stmts = all_statements()
    ids = list(ids or [])
    if not ids:
        return stmts
    by_id = {_norm(s.id): s for s in stmts}
    unknown = [i for i in ids if _norm(i) not in by_id]
    if unknown:
        valid = ", ".join(s.id for s in stmts)
        raise UnknownStatementError(f"unknown statement id(s): {', '.join(unknown)}. Valid ids: {valid}")
    out: list[Statement] = []
    for i in ids:
        s = by_id[_norm(i)]
        if s not in out:
            out.append(s)
    return out


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
            from verification.core.search import apply

            res = search(stmt, seed) if callable(search) else search_statement(stmt, search, seed)
            ev = apply(ev, res, findings=stmt.search_findings)
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
    from verification.core.search import search_statement as _search

    return _search(stmt, budget, seed, progress=progress)


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
