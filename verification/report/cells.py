"""The report's statements and searches as cells of the Dask engine (``python -m verification report --workers K``
or ``--scheduler ADDRESS``, :mod:`verification.engine.dask_engine`).

A report of statements ``S`` at ``seed`` and ``scale`` is these cells, written to the report's folder ``DIR``:

* the search cells of each statement with a family box when the report's falsification search is on
  (:func:`search_cell_specs`): at the default scale one, ``cells/<id>/search.json`` (:func:`search_cell`: the
  stored search's short refinement, :func:`verification.core.registry.search_statement`); at the paper scale the
  parts of the ``paper`` budget's search (:func:`search_part_cell`, :func:`verification.core.search.search_parts`):
  ``search-design.json`` (the Halton design), ``search-de-<k>.json`` (island ``k`` of the differential evolution)
  and ``search-chain-<k>.json`` (the ``k``-th refinement chain, which starts when the design and the islands are
  done, from their best points);
* ``cells/<id>/check.json`` (:func:`statement_cell`): the check, its tight points and its negative control
  (:func:`verification.core.registry.run_statement`), the search of its search cells applied (the parts merged,
  :func:`merged_search`), and what the report
  writes for the statement (:func:`verification.report.files.statement_files`: its result row, its
  ``worst/`` and ``counterexamples/`` files, figure tables and rows of ``instances.csv``). It starts when its
  search cells are done (:attr:`~verification.engine.dask_engine.Cell.deps`).

Every cell records its cost (``cost``: CPU and wall seconds on the worker), from which :func:`cell_costs`,
:func:`critical_path` and :func:`predicted_wall` give what the report would take on more workers.

The random streams of a cell depend on the statement, the seed and the cell's index only: the check's come from
:func:`verification.core.registry.statement_rng` of the statement's seed, the stored search's refinement from its
own seed, and at the paper scale the design's scramble, island ``k``'s stream (``default_rng([seed, 3, k])``) and
chain ``k``'s (``default_rng([seed, 4, k])``) from the seed and ``k`` (:func:`verification.core.search.search_part`).
No cell depends on which worker runs it or in what order, so the report on any number of workers writes the
serial report's files (:func:`results_differences` compares two ``results.json``). The serial report (no
``--workers``) runs the same functions in its own process, statement after statement (:func:`run_statement`),
which is also what :func:`verification.core.search.falsify` computes. (The paper-scale numbers differ from those
of reports before the search was split: one DE of the whole population with one stream shared by the chains.)
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from verification.core import registry
from verification.core.evidence import to_jsonable
from verification.core.search import Budget
from verification.engine.dask_engine import (
    CELLS_DIR,
    PARAMS_NAME,
    Cell,
    check_params,
    folder_params,
    write_params,
)
from verification.engine.sweep import cell_path
from verification.report.files import statement_files

__all__ = ["CHECK_CELL", "REPORT_KIND", "report_params", "prepare_folder", "cell_file", "search_cell",
           "search_part_cell", "merged_search", "search_cell_specs", "statement_cell", "run_statement",
           "report_cells", "cell_costs", "critical_path", "predicted_wall", "results_differences", "VOLATILE_KEYS"]

CHECK_CELL = "check.json"
#: Identifies the cells of a report (``DIR/params.json``).
REPORT_KIND = "prefalign-verify report"


def report_params(*, seed: int, scale: str, budget: str | None) -> dict[str, Any]:
    """The ``params.json`` of a report's cells: what they depend on besides the statement."""
    return folder_params(REPORT_KIND, seed=int(seed), scale=scale, search=budget)


def prepare_folder(out: str | Path, params: dict[str, Any], *, resume: bool, write: bool = False) -> None:
    """Check (and with ``write`` prepare) the report folder ``out`` for cells of ``params``
    (:func:`report_params`): with ``resume`` its cells must have been made with the same parameters; without, the
    cells of an earlier report are removed (when ``write``). A folder whose ``cells/`` belong to something else (a
    sweep, a search) is refused (:class:`~verification.engine.dask_engine.CellFolderError`), nothing removed."""
    import shutil

    out = Path(out)
    p = out / PARAMS_NAME
    ours = False
    if p.is_file():
        try:
            ours = json.loads(p.read_text(encoding="utf-8")).get("sweep") == REPORT_KIND
        except (OSError, ValueError, AttributeError):
            ours = False
    if ours and not resume:  # an earlier report's cells, not to be resumed: they are made again
        if not write:
            return
        shutil.rmtree(out / CELLS_DIR, ignore_errors=True)
        p.unlink(missing_ok=True)
    (write_params if write else check_params)(out, params)


def _cost(t0: float, c0: float) -> dict[str, float]:
    return {"cpu_seconds": time.process_time() - c0, "wall_seconds": time.perf_counter() - t0}


def search_cell(stmt_id: str, seed: int, budget: str) -> dict[str, Any]:
    """The report's falsification search of ``stmt_id`` in one cell (runs on a worker; the ``stored`` budget of the
    default scale): ``{"search": the SearchResult's fields}``, or ``{"error": repr of the exception}`` (traceback
    on stderr) when it raised; with its ``cost``."""
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        res = registry.search_statement(registry.get_statement(stmt_id), budget, int(seed))
        rec: dict[str, Any] = {"search": to_jsonable(dataclasses.asdict(res))}
    except Exception as exc:  # noqa: BLE001 - the statement's row says it (an error row, as in the serial report)
        registry.print_traceback(exc)
        rec = {"error": repr(exc)}
    return {**rec, "cost": _cost(t0, c0)}


def search_part_cell(stmt_id: str, seed: int, budget: str | Budget, part: str, k: int,
                     *earlier: Mapping[str, Any]) -> dict[str, Any]:
    """Part ``(part, k)`` of the report's search of ``stmt_id`` at a search budget (the ``paper`` budget of the
    paper scale; :func:`verification.core.search.search_part`: the design, an island of the differential
    evolution, or a refinement chain from the records ``earlier`` of the design and the islands), on a worker:
    ``{"part": its record}``, or ``{"error": ...}`` when it raised (or when one of ``earlier`` is an error); with
    its ``cost``."""
    from verification.core.search import search_part

    t0, c0 = time.perf_counter(), time.process_time()
    failed = next((r for r in earlier if "error" in r), None)
    if failed is not None:
        return {"error": failed["error"], "cost": _cost(t0, c0)}
    try:
        rec: dict[str, Any] = {"part": search_part(stmt_id, seed, budget, part, k, *(r["part"] for r in earlier))}
    except Exception as exc:  # noqa: BLE001 - the statement's row says it (an error row, as in the serial report)
        registry.print_traceback(exc)
        rec = {"error": repr(exc)}
    return {**rec, "cost": _cost(t0, c0)}


def merged_search(stmt_id: str, seed: int, budget: str | Budget,
                  parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The search record of :func:`search_cell`'s form made of the records of the parts of a search
    (:func:`search_part_cell`, in :func:`verification.core.search.search_parts` order): the first error among them,
    or the :class:`~verification.core.search.SearchResult` of their merge
    (:func:`verification.core.search.search_result`)."""
    from verification.core.search import search_result

    failed = next((r for r in parts if "error" in r), None)
    if failed is not None:
        return {"error": failed["error"]}
    stmt = registry.get_statement(stmt_id)
    res = search_result(stmt, stmt.search, budget, seed, [r["part"] for r in parts])
    return {"search": to_jsonable(dataclasses.asdict(res))}


class _SearchRaised(Exception):
    """The exception of a search cell, known by its ``repr`` (the ``details.error`` of the statement's error row)."""

    def __repr__(self) -> str:
        return str(self.args[0])


def _given_search(record: Mapping[str, Any]):
    from verification.core.search import SearchResult

    def search(stmt, seed):
        if "error" in record:
            raise _SearchRaised(record["error"])
        return SearchResult(**record["search"])

    return search


def statement_cell(stmt_id: str, seed: int, scale: str, budget: str | Budget | None,
                   *search: Mapping[str, Any]) -> dict[str, Any]:
    """The report's work on statement ``stmt_id`` (runs on a worker): the check with its tight points and negative
    control, the search applied (the record of :func:`search_cell`, or the records of the search's parts,
    :func:`search_part_cell`, merged by :func:`merged_search`), the result ``row`` and what the report writes for
    it (:func:`verification.report.files.statement_files`), with its ``cost``."""
    t0, c0 = time.perf_counter(), time.process_time()
    stmt = registry.get_statement(stmt_id)
    how: Any = budget
    if search and budget is not None:
        one = search[0] if len(search) == 1 and "part" not in search[0] else merged_search(stmt_id, seed, budget,
                                                                                          search)
        how = _given_search(one)
    ev, row, res = registry.run_statement_row(stmt, int(seed), scale=scale, search=how,
                                              on_error=registry.print_traceback)
    return {"row": row, **statement_files(stmt, ev, res), "cost": _cost(t0, c0)}


def search_cell_specs(stmt: registry.Statement, budget: str | Budget | None) -> list[tuple[str, str, int]]:
    """The search cells of ``stmt`` at ``budget``, as ``(name, part, k)``: none without a search; one ``search``
    cell at the ``stored`` budget; otherwise one per part of :func:`verification.core.search.search_parts`
    (``search-design``, ``search-de-<k>``, ``search-chain-<k>``)."""
    from verification.core.search import STORED, search_parts

    if budget is None or stmt.search is None:
        return []
    if budget == STORED:
        return [("search", "", 0)]
    return [(f"search-{part}" + ("" if part == "design" else f"-{k}"), part, k)
            for part, k in search_parts(stmt.search.dim, budget)]


def run_statement(stmt: registry.Statement, seed: int, scale: str, budget: str | Budget | None) -> dict[str, Any]:
    """The cells of ``stmt`` run in this process, one after the other (the serial report): the same functions,
    with the same arguments, as the cells of :func:`report_cells`."""
    specs = search_cell_specs(stmt, budget)
    if budget is None or not specs:
        return statement_cell(stmt.id, seed, scale, budget)
    if isinstance(budget, str) and specs[0][1] == "":
        return statement_cell(stmt.id, seed, scale, budget, search_cell(stmt.id, seed, budget))
    base = [search_part_cell(stmt.id, seed, budget, part, k) for _, part, k in specs if part != "chain"]
    chains = [search_part_cell(stmt.id, seed, budget, part, k, *base) for _, part, k in specs if part == "chain"]
    return statement_cell(stmt.id, seed, scale, budget, *base, *chains)


def cell_file(out: str | Path, stmt_id: str, name: str) -> Path:
    """``DIR/cells/<id>/<name>``."""
    return cell_path(out, stmt_id, 0).parent / name


def report_cells(out: str | Path, stmts: Sequence[registry.Statement], *, seed: int, scale: str,
                 budget: str | Budget | None) -> list[Cell]:
    """The cells of a report into ``out``: every search cell first (they are the longest and the checks wait for
    them; at a search budget the design and DE islands of every statement, then its refinement chains, each
    depending on its statement's design and islands), then the statement cells, each depending on its statement's
    search cells (:func:`search_cell_specs`)."""
    base: list[Cell] = []
    chains: list[Cell] = []
    checks: list[Cell] = []
    for s in stmts:
        specs = search_cell_specs(s, budget)
        keys = {name: f"{s.id}/{name}" for name, _, _ in specs}
        first = [keys[name] for name, part, _ in specs if part != "chain"]
        for name, part, k in specs:
            path = cell_file(out, s.id, f"{name}.json")
            if part == "":
                base.append(Cell(keys[name], path, search_cell, (s.id, int(seed), budget)))
            elif part != "chain":
                base.append(Cell(keys[name], path, search_part_cell, (s.id, int(seed), budget, part, k)))
            else:
                chains.append(Cell(keys[name], path, search_part_cell, (s.id, int(seed), budget, part, k),
                                   tuple(first)))
        checks.append(Cell(f"{s.id}/check", cell_file(out, s.id, CHECK_CELL), statement_cell,
                           (s.id, int(seed), scale, budget), tuple(keys.values())))
    return base + chains + checks


# ------------------------------------------------------------------------------------------- costs, scaling


def cell_costs(cells: Iterable[Cell]) -> list[dict[str, Any]]:
    """Per cell of ``cells`` (all finished), in their order: ``key``, ``deps`` and the ``cpu_seconds`` and
    ``wall_seconds`` its worker spent on it."""
    out = []
    for c in cells:
        cost = json.loads(c.path.read_text(encoding="utf-8"))["cost"]
        out.append({"key": c.key, "deps": list(c.deps), "cpu_seconds": float(cost["cpu_seconds"]),
                    "wall_seconds": float(cost["wall_seconds"])})
    return out


def critical_path(costs: Sequence[Mapping[str, Any]], what: str = "cpu_seconds") -> tuple[float, list[str]]:
    """The longest chain of cells through their dependencies, by ``what``: its length and its keys (the wall
    time no number of workers goes below)."""
    best: dict[str, tuple[float, list[str]]] = {}
    for c in costs:
        before = max((best[d] for d in c["deps"]), key=lambda t: t[0], default=(0.0, []))
        best[c["key"]] = (before[0] + float(c[what]), [*before[1], c["key"]])
    return max(best.values(), key=lambda t: t[0], default=(0.0, []))


def predicted_wall(costs: Sequence[Mapping[str, Any]], workers: int, what: str = "cpu_seconds") -> float:
    """The wall time of ``costs`` on ``workers`` workers as the engine runs them: each cell starts, in the given
    order (its priority), on the first worker free once its dependencies are done (list scheduling; transfers
    and start-up not counted)."""
    if int(workers) < 1:
        raise ValueError(f"workers must be >= 1; got {workers!r}")
    free = [0.0] * int(workers)
    done: dict[str, float] = {}
    waiting = list(costs)
    while waiting:
        # the first waiting cell whose dependencies are done goes to the worker that frees first
        w = min(range(len(free)), key=free.__getitem__)
        ready = [c for c in waiting if all(d in done for d in c["deps"])]
        c = min(ready, key=lambda c: max([free[w], *(done[d] for d in c["deps"])]))
        start = max([free[w], *(done[d] for d in c["deps"])])
        done[c["key"]] = free[w] = start + float(c[what])
        waiting.remove(c)
    return max(done.values(), default=0.0)


# ------------------------------------------------------------------------------------------- comparing reports

#: Keys of a result row that measure a run rather than state its results: they may differ between two runs.
VOLATILE_KEYS = frozenset({"seconds", "cpu_seconds", "wall_seconds"})


def results_differences(a: Any, b: Any, where: str = "results.json", *,
                        volatile: frozenset[str] = VOLATILE_KEYS) -> list[str]:
    """Where two ``results.json`` (or any two JSON values) differ, field by field, apart from the timings
    (``volatile`` keys at any depth): one line per difference, naming its place (``results.json[3].details.x``).
    An empty list: the same results."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{where}.{k}: {'absent' if k not in a else 'present'} in the first, "
               f"{'absent' if k not in b else 'present'} in the second"
               for k in sorted(set(a) ^ set(b)) if k not in volatile]
        for k in a:
            if k in b and k not in volatile:
                out += results_differences(a[k], b[k], f"{where}.{k}", volatile=volatile)
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{where}: {len(a)} entries in the first, {len(b)} in the second"]
        return [d for k, (x, y) in enumerate(zip(a, b, strict=True))
                for d in results_differences(x, y, f"{where}[{k}]", volatile=volatile)]
    return [] if a == b and type(a) is type(b) else [f"{where}: {a!r} in the first, {b!r} in the second"]
