"""The falsification search (:mod:`verification.core.search`) as cells of the Dask engine
(``python -m verification search``): per statement a design in cells of :data:`~verification.core.search.DESIGN_CELL`
points, then one refinement cell from the design's best points, each written atomically to
``DIR/cells/<id>/<code>/design-<k>.json`` and ``refine.json`` (:func:`verification.engine.dask_engine.run_cells`: a
second run computes only the missing cells; ``<code>``: the first 16 hex digits of the check's code digest,
:func:`~verification.core.search.check_code`, so that a changed check computes its cells afresh instead of reusing
those of its old code); then ``DIR/worst/<id>.json`` and ``DIR/search.json``
(:func:`write_results`). The cells' own computations (:func:`~verification.core.search.design_cell`,
:func:`~verification.core.search.refine_cell`, :func:`~verification.core.search.merge_records`) are in the core."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

from sim.cli import atomic_write_text
from verification.core.evidence import kept_counterexamples, to_jsonable
from verification.core.search import (
    DEFAULT_EVALUATIONS,
    DESIGN_CELL,
    SEARCH_KIND,
    SUMMARY_NAME,
    check_code,
    design_cell,
    design_size,
    merge_records,
    refine_cell,
    refine_plan,
)
from verification.engine.dask_engine import Cell, folder_params, read_cell, run_cells, write_params
from verification.engine.sweep import cell_path

__all__ = ["search_params", "design_cells", "refine_cells", "run_search", "pending_cells", "statement_record",
           "write_results"]


def search_params(evaluations: int, seed: int) -> dict[str, Any]:
    """The ``params.json`` of a search folder."""
    return folder_params(SEARCH_KIND, evaluations=int(evaluations), seed=int(seed), design_cell=DESIGN_CELL)


def _cell_dir(out: Path, stmt) -> Path:
    """``DIR/cells/<id>/<code>/``: the cells of ``stmt`` made by its code of today."""
    return cell_path(out, stmt.id, 0).parent / check_code(stmt.module)["digest"][:16]


def design_cells(out: str | Path, stmts, evaluations: int, seed: int) -> list:
    """The design cells of a search (``cells/<id>/<code>/design-<k>.json``), statement by statement."""
    n = design_size(evaluations)
    return [Cell(f"{s.id}/design-{k}", _cell_dir(Path(out), s) / f"design-{k}.json", design_cell,
                 (s.id, int(seed), start, min(DESIGN_CELL, n - start)))
            for s in stmts for k, start in enumerate(range(0, n, DESIGN_CELL))]


def _read_records(cells) -> list[dict] | None:
    if not all(c.path.is_file() for c in cells):
        return None
    return [read_cell(c.path) for c in cells]


def refine_cells(out: str | Path, stmts, evaluations: int, seed: int) -> list:
    """The refinement cells (``cells/<id>/<code>/refine.json``) of the statements whose design cells are all
    written."""
    cells = []
    by_stmt: dict[str, list] = {}
    for c in design_cells(out, stmts, evaluations, seed):
        by_stmt.setdefault(c.args[0], []).append(c)
    for s in stmts:
        recs = _read_records(by_stmt[s.id])
        if recs is None:
            continue
        starts, steps = refine_plan(merge_records(recs), evaluations)
        cells.append(Cell(f"{s.id}/refine", _cell_dir(Path(out), s) / "refine.json", refine_cell,
                          (s.id, int(seed), starts, steps)))
    return cells


def run_search(client, out: str | Path, stmts, *, evaluations: int = DEFAULT_EVALUATIONS, seed: int = 0,
               progress: bool = True):
    """The search of every statement of ``stmts`` at ``evaluations`` evaluations each, as cells on the Dask
    cluster of ``client`` (:func:`verification.engine.dask_engine.run_cells`: atomic, resumable): the design cells of
    every statement, then the refinement cells, each from its statement's design. Returns the two
    :class:`~verification.engine.dask_engine.CellRun` (design, refinement)."""
    write_params(out, search_params(evaluations, seed))
    first = run_cells(client, design_cells(out, stmts, evaluations, seed), desc="search design", progress=progress)
    second = run_cells(client, refine_cells(out, stmts, evaluations, seed), desc="search refinement",
                       progress=progress)
    return first, second


def pending_cells(out: str | Path, stmts, evaluations: int, seed: int) -> int:
    """Cells a search into ``out`` has left to compute (a refinement cell counts once per statement)."""
    d = design_cells(out, stmts, evaluations, seed)
    refined = sum((_cell_dir(Path(out), s) / "refine.json").is_file() for s in stmts)
    return sum(not c.path.is_file() for c in d) + len(stmts) - refined


def statement_record(out: str | Path, stmt, evaluations: int, seed: int, date: str) -> dict[str, Any] | None:
    """The result of one statement's search (its ``worst/<id>.json``): the box, the check's code
    (:func:`~verification.core.search.check_code`: ``code_digest`` and ``code_modules``), the budget, the evaluations
    spent, the date, per conclusion the best ratio with the point, ``Config``, seed and instance to reproduce it,
    and the counterexamples found (``counterexamples``: how many; ``search_counterexamples``: the first
    :data:`~verification.core.evidence.MAX_STORED_COUNTEREXAMPLES` of them,
    :func:`~verification.core.evidence.kept_counterexamples` saying how many); None while a cell is missing."""
    cells = design_cells(out, [stmt], evaluations, seed)
    recs = _read_records(cells)
    ref = _cell_dir(Path(out), stmt) / "refine.json"
    if recs is None or not ref.is_file():
        return None
    m = merge_records(recs + [read_cell(ref)])
    code = check_code(stmt.module)
    return to_jsonable({
        "statement": stmt.id, "family": stmt.search.family, "box": stmt.search.describe(),
        "code_digest": code["digest"], "code_modules": code["modules"],
        "params": [p.name for p in stmt.search.params], "budget": int(evaluations), "seed": int(seed), "date": date,
        "evaluations": m["evaluations"], "cpu_seconds": m["cpu_seconds"], "design_points": design_size(evaluations),
        "counterexamples": m["n_counterexamples"], "errors": m["errors"][:20],
        "best_ratio": {k: v["best_ratio"] for k, v in m["best"].items()},
        # per conclusion, the design points (space-filling, independent of the chains) with a ratio above TARGET
        "detecting_points": {k: m["detecting"].get(k, 0) for k in m["best"] if not k.startswith("score: ")},
        **kept_counterexamples(m["n_counterexamples"], len(m["counterexamples"])),
        "conclusions": m["best"], "search_counterexamples": m["counterexamples"],
        "reproduce": ("verification.core.registry.get_statement(statement).search.make_config(params) gives the Config; "
                      "run(config, numpy.random.default_rng(seed))"),
    })


def refuted_conclusions(rec: dict[str, Any], findings: Any = None) -> tuple[list[str], list[str]]:
    """The conclusions a statement's search record ``rec`` (``worst/<id>.json``) holds counterexamples of, split
    into those the statement documents (``findings``: its ``SEARCH_FINDINGS``, a finding with its counterexamples,
    not a failure) and the undocumented ones (to be acted on), each sorted."""
    refuted = sorted(k for k, v in (rec.get("conclusions") or {}).items() if v.get("counterexamples"))
    documented = dict(findings or {})
    return [k for k in refuted if k in documented], [k for k in refuted if k not in documented]


def write_results(out: str | Path, stmts, evaluations: int, seed: int) -> dict[str, Any]:
    """Write ``worst/<id>.json`` for every statement whose cells are complete and ``search.json`` (per statement:
    budget, evaluations, date, counterexamples, best ratio per conclusion, the refuted conclusions it documents,
    ``findings``, and those it does not, ``undocumented``; ``undocumented`` per statement at the top); returns the
    summary."""
    out = Path(out)
    date = datetime.datetime.now(datetime.UTC).date().isoformat()
    summary: dict[str, Any] = {"kind": SEARCH_KIND, "budget": int(evaluations), "seed": int(seed), "statements": {}}
    for s in stmts:
        path = out / "worst" / f"{s.id}.json"
        rec = statement_record(out, s, evaluations, seed, date)
        if rec is None:
            summary["statements"][s.id] = {"complete": False}
            continue
        if path.is_file():  # the date of a statement's result is the day its cells were first summarised
            try:
                old = json.loads(path.read_text(encoding="utf-8"))
                if old.get("evaluations") == rec["evaluations"] and old.get("best_ratio") == rec["best_ratio"]:
                    rec["date"] = old.get("date", date)
            except (OSError, ValueError):
                pass
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(rec, indent=1, allow_nan=False) + "\n")
        findings, undocumented = refuted_conclusions(rec, s.search_findings)
        summary["statements"][s.id] = {k: rec[k] for k in ("budget", "evaluations", "date", "counterexamples",
                                                           "cpu_seconds", "best_ratio", "box")} | {
            "complete": True, "findings": findings, "undocumented": undocumented}
    summary["counterexamples"] = sum(v.get("counterexamples", 0) for v in summary["statements"].values())
    # counterexamples of conclusions no statement documents: what a user must act on (the command's exit status 1)
    summary["undocumented"] = {sid: v["undocumented"] for sid, v in summary["statements"].items()
                               if v.get("undocumented")}
    atomic_write_text(out / SUMMARY_NAME, json.dumps(to_jsonable(summary), indent=1, allow_nan=False) + "\n")
    return summary
