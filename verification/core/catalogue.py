"""The catalogue of executable statements: what a statement is (:class:`Statement`), where statements come from
and how one is found by its id. Running them is :mod:`verification.core.registry`'s.

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
  ``TIGHT_SEEDS`` (default 1), at how many seeds each tight point runs
  (:func:`verification.core.registry.tight_point_seed`), so that a detection at a tight point rests on more than
  one draw, and ``SEARCH_FINDINGS``, a mapping from a conclusion name to the documented finding that the
  falsification search refutes it on part of its box (an assumption whose region-sampled constants fail
  somewhere): counterexamples of those conclusions only make the verdict ``finding``, not ``violated``
  (:func:`verification.core.search.apply`). A module may instead expose ``STATEMENTS``, a list of
  :class:`Statement`;
* explicit registrations with :func:`register` (the symbolic identities S1–S26 of :mod:`verification.statements.symbolic`),
  and modules of the statement-module contract registered with :func:`register_module`;
* statements of other packages: every module named by an entry point of the group ``prefalign.statements`` (a
  package's ``[project.entry-points."prefalign.statements"]``) or listed in the environment variable
  ``PREFALIGN_STATEMENTS`` (comma-separated module names) is imported by :func:`discover`; a module that follows
  the statement-module contract is registered as above, one that calls :func:`register` when imported registers
  itself. So ``prefalign verify run MY.1`` runs a statement of yours (docs: "Write your own statement").

It sits below :mod:`verification.core.search` (whose cells find a statement by id here) and
:mod:`verification.core.registry` (which runs a statement and its search); :mod:`verification.core.registry`
re-exports every name of it.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from verification.core.evidence import Evidence

__all__ = [
    "Statement",
    "UnknownStatementError",
    "StatementImportError",
    "register",
    "register_module",
    "discover",
    "ENTRY_POINT_GROUP",
    "STATEMENTS_ENV",
    "STATEMENTS_PACKAGE",
    "SYMBOLIC_MODULE",
    "all_statements",
    "get_statement",
    "resolve",
]

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
