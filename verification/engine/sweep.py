r"""Statement × seed sweeps on Dask (``python -m verification sweep``) and their summary.

.. code-block:: text

    python -m verification sweep [ID ...] --seeds A:B [--scale default|paper] [--workers K | --scheduler ADDRESS]
                                 --out DIR

Every (statement, seed) cell is a Dask task (:mod:`verification.engine.dask_engine`) that runs the statement's check and
negative control with ``numpy.random.default_rng(seed)`` (seeds ``A, A+1, ..., B-1``) and returns its result row,
made by the code ``python -m verification run`` uses (:func:`verification.core.registry.run_statement_row`); with the
default scale a cell equals the row of ``run ID --seed SEED`` except for ``seconds``. The folder ``DIR`` holds

* ``cells/<id>/<seed>.json``: one result row per cell, written atomically as the cell finishes;
* ``params.json``: what the cells depend on besides the statement and the seed (the scale, the package version).
  A sweep into a folder whose cells were made with other parameters is refused; other statements or seeds may
  be added to a folder (their cells are new files), and a rerun of the same command recomputes nothing;
* ``sweep.json`` and ``sweep.csv``: the summary (:func:`summarize`) of the requested cells: per statement the
  verdict counts over the seeds, tightness min / median / max, counterexamples in total with the seeds that
  produced them, negative controls detected / missed, seconds, and for the Monte Carlo assertions the observed
  false-failure count with its Clopper–Pearson upper bound set against the budget the dashboard states
  (:mod:`verification.core.montecarlo`).

``python -m verification report --sweep DIR`` adds the sweep to the dashboard (:func:`sweep_tables`).

**Monte Carlo assertions.** A Monte Carlo assertion (docs/spec/tolerances.md#monte-carlo) fails iff its lower
confidence bound exceeds the bound; if the claim is true this happens with probability at most ``δ`` per
assertion (``δ = 1e-4``) and at most ``1e-3`` over the whole default run (Bonferroni). Over ``n`` seeds the
sweep counts the seeds at which an assertion failed, ``k``, and reports the one-sided Clopper–Pearson upper
bound at level ``1 − α`` (:data:`CP_ALPHA` = 0.05) of the per-seed failure probability ``p``: ``p_up =
Beta⁻¹(1 − α; k + 1, n − k)`` (``1`` when ``k = n``); with ``k = 0`` it is ``1 − α^{1/n}``. The status of the
budget ``b``: ``exceeded`` when the lower bound ``Beta⁻¹(α; k, n − k + 1)`` is above ``b`` (the failures are
too many for a true claim with the stated ``δ``), ``confirmed`` when ``p_up ≤ b``, and otherwise ``not
resolved``, with the number of failure-free seeds that would confirm it, ``⌈ln α / ln(1 − b)⌉`` (about 30 000
for ``b = 1e-4``). A failure is a *false* failure only if the claim is true: the failing seeds are listed for
study. :func:`monte_carlo_assertions` is the one place that finds a row's Monte Carlo assertions.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sim.cli import atomic_write_text
from verification.core import montecarlo, registry
from verification.core.evidence import to_jsonable
from verification.engine.dask_engine import (
    CELLS_DIR,
    Cell,
    CellFolderError,
    CellRun,
    folder_params,
    read_cell,
    read_summary_file,
    run_cells,
    write_params,
)

__all__ = ["SUMMARY_JSON", "SUMMARY_CSV", "CP_ALPHA", "cell_path", "sweep_params", "statement_cell", "sweep_cells", "run_sweep", "read_cells", "summarize",
           "write_summary", "read_summary", "monte_carlo_assertions", "monte_carlo_statements", "mc_budget",
           "clopper_pearson", "budget_status", "sweep_tables"]

SUMMARY_JSON = "sweep.json"
SUMMARY_CSV = "sweep.csv"
#: Identifies a statement sweep's folder (params.json) and summary (sweep.json).
SWEEP_KIND = "prefalign-verify statement sweep"
#: One-sided level of the Clopper–Pearson bounds on the Monte Carlo failure rates.
CP_ALPHA = 0.05
_VERDICTS = ("holds", "finding", "violated", "vacuous", "error")
_CONTROLS = ("detected", "missed", "none")


# ------------------------------------------------------------------------------------------------ the cells


def cell_path(out: str | Path, stmt_id: str, seed: int) -> Path:
    """``DIR/cells/<id>/<seed>.json``."""
    if not stmt_id or any(not (ch.isalnum() or ch in "-_.()") for ch in stmt_id) or stmt_id.startswith("."):
        raise ValueError(f"statement id {stmt_id!r} cannot name a folder")
    return Path(out) / CELLS_DIR / stmt_id / f"{int(seed)}.json"


def sweep_params(scale: str) -> dict[str, Any]:
    """The ``params.json`` of a statement sweep: what its cells depend on besides statement and seed."""
    return folder_params(SWEEP_KIND, scale=scale)


def statement_cell(stmt_id: str, seed: int, scale: str = "default") -> dict[str, Any]:
    """The result row of statement ``stmt_id`` at ``seed`` and ``scale`` (runs on a worker): the row ``python -m
    verification run ID --seed SEED`` makes (at the default scale), or an ``error`` row (traceback on the
    worker's stderr) when the check raised."""
    stmt = registry.get_statement(stmt_id)
    return registry.run_statement_row(stmt, seed, scale=scale, on_error=registry.print_traceback)[1]


def sweep_cells(out: str | Path, stmts: Sequence[registry.Statement], seeds: Sequence[int],
                scale: str = "default") -> list[Cell]:
    """The cells of a sweep, seed by seed (they start in this order, so an interrupted sweep has whole seeds but
    for the cells in flight)."""
    return [Cell(f"{s.id}/{seed}", cell_path(out, s.id, seed), statement_cell, (s.id, int(seed), scale))
            for seed in seeds for s in stmts]


def _check_row(row: Any, path: Path, stmt_id: str) -> dict[str, Any]:
    from verification.core.resultlog import RESULT_ROW_KEYS as keys

    if not isinstance(row, dict) or any(k not in row for k in keys):
        raise CellFolderError(f"{str(path)!r} is not a result row (it needs the keys {', '.join(keys)}): remove it "
                              "to compute the cell again")
    if row["id"] != stmt_id:
        raise CellFolderError(f"{str(path)!r} holds a row of {row['id']!r}, not of {stmt_id!r}: remove it to compute "
                              "the cell again")
    return row


def read_cells(out: str | Path, stmt_ids: Sequence[str], seeds: Sequence[int]
               ) -> dict[str, dict[int, dict[str, Any]]]:
    """The finished cells among ``stmt_ids`` × ``seeds``: ``{id: {seed: row}}``. Raises :class:`CellFolderError` for a
    cell file that is not a result row of its statement."""
    found: dict[str, dict[int, dict[str, Any]]] = {sid: {} for sid in stmt_ids}
    for sid in stmt_ids:
        for seed in seeds:
            p = cell_path(out, sid, seed)
            if not p.is_file():
                continue
            row = read_cell(p)
            found[sid][int(seed)] = _check_row(row, p, sid)
    return found


def run_sweep(client, out: str | Path, stmts: Sequence[registry.Statement], seeds: Sequence[int], *,
              scale: str = "default", progress: bool = True,
              on_written: Callable[[Cell, Any], None] | None = None) -> CellRun:
    """Run the cells of ``stmts`` × ``seeds`` not yet in ``out`` on the cluster of ``client`` (writing
    ``params.json`` first, after :func:`~verification.engine.dask_engine.check_params`); the summary is written by :func:`write_summary`."""
    out = Path(out)
    write_params(out, sweep_params(scale))
    read_cells(out, [s.id for s in stmts], seeds)  # a bad cell file is refused before any work
    return run_cells(client, sweep_cells(out, stmts, seeds, scale), desc="sweep", progress=progress,
                     on_written=on_written)


# ---------------------------------------------------------------------------------------- Monte Carlo


def mc_budget() -> dict[str, float]:
    """The false-failure budget the dashboard states (:mod:`verification.core.montecarlo`): ``delta`` per assertion and
    ``family_wise`` for every Monte Carlo assertion of the default run together (Bonferroni)."""
    return {"delta": float(montecarlo.DELTA), "family_wise": float(montecarlo.FAMILY_WISE_BUDGET)}


def monte_carlo_assertions(row: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The Monte Carlo assertions of result ``row``: ``[{"name", "failed", "delta"}]``, or None when the row has
    none (a statement without Monte Carlo, or a check that raised).

    The one place that reads them: the entries of ``row["conclusions"]`` of kind ``monte_carlo`` where a row
    names its conclusions (``failed``: the conclusion has a counterexample), otherwise
    ``row["details"]["mc_assertions"]["assertions"]`` (the record of :func:`verification.statements.
    _adaptation_evidence.mc_record`: ``label``, ``failed``, with ``delta_each`` beside it). ``delta`` is the level
    the assertion was tested at (``None`` when the row does not say)."""
    concl = row.get("conclusions")
    if isinstance(concl, list):
        mc = [c for c in concl if isinstance(c, dict) and c.get("kind") == "monte_carlo"]
        if not mc:
            return None
        return [{"name": str(c["name"]), "failed": int(c.get("counterexamples", 0)) > 0,
                 "delta": c.get("delta")} for c in mc]
    rec = (row.get("details") or {}).get("mc_assertions")
    if not isinstance(rec, dict) or not rec.get("assertions"):
        return None
    delta = rec.get("delta_each")
    return [{"name": str(a.get("label", f"assertion {k + 1}")), "failed": bool(a["failed"]),
             "delta": a.get("delta", delta)} for k, a in enumerate(rec["assertions"])]


def monte_carlo_statements() -> list[registry.Statement]:
    """The statements with confidence-level (Monte Carlo) assertions, before running them: those of the family-wise
    budget table :data:`verification.core.montecarlo.ASSERTIONS` (H.17, H.39-41, H.43, H.44, H.45, Thm-A). After a run,
    :func:`monte_carlo_assertions` reads the assertions themselves from the rows."""
    return registry.resolve(sorted(montecarlo.ASSERTIONS))


def clopper_pearson(k: int, n: int, alpha: float = CP_ALPHA) -> tuple[float, float]:
    """One-sided Clopper–Pearson bounds ``(lower, upper)``, each at level ``1 − alpha``, of a binomial probability
    from ``k`` successes in ``n`` trials (``n >= 1``)."""
    from scipy import stats

    if not (0 <= k <= n and n >= 1):
        raise ValueError(f"need 0 <= k <= n and n >= 1; got k={k!r}, n={n!r}")
    lower = 0.0 if k == 0 else float(stats.beta.ppf(alpha, k, n - k + 1))
    upper = 1.0 if k == n else float(stats.beta.ppf(1 - alpha, k + 1, n - k))
    return lower, upper


def budget_status(k: int, n: int, budget: float, alpha: float = CP_ALPHA) -> dict[str, Any]:
    """``k`` failures in ``n`` seeds against a failure-probability ``budget``: the observed rate, the
    Clopper–Pearson bounds and the status ``exceeded`` / ``confirmed`` / ``not resolved`` (module docstring)."""
    lower, upper = clopper_pearson(k, n, alpha)
    if lower > budget:
        status = "exceeded"
    elif upper <= budget:
        status = "confirmed"
    else:
        status = "not resolved"
    return {"seeds": n, "failures": k, "rate": k / n, "cp_lower": lower, "cp_upper": upper, "alpha": alpha,
            "budget": budget, "status": status,
            "seeds_to_confirm": math.ceil(math.log(alpha) / math.log1p(-budget)) if 0 < budget < 1 else None}


def _mc_summary(stmt_id: str, rows: dict[int, dict[str, Any]], budget: dict[str, float]) -> dict[str, Any] | None:
    """Failure counts of the Monte Carlo conclusions of one statement over its seeds, each against the level it was
    tested at, and of "any of them" against the statement's share of the family-wise budget: ``δ`` times the
    number of confidence-level tests :data:`verification.core.montecarlo.ASSERTIONS` budgets for it (a conclusion may
    hold several tests, e.g. H.17's six problems, or restate one, e.g. a ``[soft]`` reading; the budget counts
    tests), or the sum of the conclusions' levels for a statement outside the table."""
    per_seed = {seed: monte_carlo_assertions(row) for seed, row in rows.items()}
    per_seed = {seed: a for seed, a in per_seed.items() if a is not None}
    if not per_seed:
        return None
    names = list(dict.fromkeys(a["name"] for lst in per_seed.values() for a in lst))
    assertions = []
    for name in names:
        seen = {seed: a for seed, lst in per_seed.items() for a in lst if a["name"] == name}
        delta = next((a["delta"] for a in seen.values() if a["delta"] is not None), budget["delta"])
        fails = sorted(seed for seed, a in seen.items() if a["failed"])
        assertions.append({"name": name, **budget_status(len(fails), len(seen), float(delta)),
                           "failure_seeds": fails})
    any_fail = sorted(seed for seed, lst in per_seed.items() if any(a["failed"] for a in lst))
    n_tests = montecarlo.ASSERTIONS.get(stmt_id)
    total_delta = float(n_tests * budget["delta"]) if n_tests else float(sum(a["budget"] for a in assertions))
    return {"assertions": assertions, "tests": n_tests if n_tests else len(assertions),
            "any": {**budget_status(len(any_fail), len(per_seed), min(total_delta, 1.0)),
                    "failure_seeds": any_fail}}


# ------------------------------------------------------------------------------------------------ summary


def _tightness_value(t: Any) -> float | None:
    if t is None:
        return None
    v = float(t)  # a number, or the strings "nan", "inf", "-inf" of a JSON row
    return None if math.isnan(v) else v


def _statement_summary(stmt: registry.Statement, rows: dict[int, dict[str, Any]],
                       budget: dict[str, float]) -> dict[str, Any]:
    seeds = sorted(rows)
    ordered = [rows[s] for s in seeds]
    verdicts = Counter(r["verdict"] for r in ordered)
    controls = Counter(r["negative_control"] for r in ordered)
    tight = [_tightness_value(r["tightness"]) for r in ordered]
    vals = np.array([t for t in tight if t is not None], dtype=np.float64)
    cex = {s: int(rows[s]["counterexamples"]) for s in seeds if int(rows[s]["counterexamples"])}
    secs = np.array([float(r["seconds"]) for r in ordered])
    out: dict[str, Any] = {
        "id": stmt.id, "name": stmt.name, "seeds": len(seeds),
        "verdicts": {v: verdicts.get(v, 0) for v in (*_VERDICTS, *sorted(set(verdicts) - set(_VERDICTS)))},
        "tightness": {"min": float(vals.min()) if vals.size else None,
                      "median": float(np.median(vals)) if vals.size else None,
                      "max": float(vals.max()) if vals.size else None, "seeds": int(vals.size)},
        "counterexamples": {"total": int(sum(cex.values())), "seeds": sorted(cex), "by_seed": cex},
        "negative_control": {c: controls.get(c, 0) for c in _CONTROLS},
        "seconds": {"total": float(secs.sum()), "median": float(np.median(secs)), "max": float(secs.max())},
        "by_seed": {"seed": seeds, "verdict": [r["verdict"] for r in ordered], "tightness": tight,
                    "negative_control": [r["negative_control"] for r in ordered]},
    }
    mc = _mc_summary(stmt.id, rows, budget)
    if mc is not None:
        out["monte_carlo"] = mc
    return out


def summarize(stmts: Sequence[registry.Statement], seeds: Sequence[int],
              rows: dict[str, dict[int, dict[str, Any]]], *, scale: str = "default",
              run: CellRun | None = None) -> dict[str, Any]:
    """The summary of a sweep (the object of ``sweep.json``) from its rows ``{id: {seed: row}}``: per statement
    (those with at least one finished cell) the fields of the module docstring, and ``monte_carlo`` over the
    whole sweep: the seeds at which some Monte Carlo assertion of the swept statements failed against the sum of
    their ``δ`` (Bonferroni; the dashboard's family-wise budget ``mc_budget()["family_wise"]`` covers the whole
    default run)."""
    budget = mc_budget()
    per = [_statement_summary(s, rows[s.id], budget) for s in stmts if rows.get(s.id)]
    mc_ids = [p["id"] for p in per if "monte_carlo" in p]
    summary: dict[str, Any] = {
        **folder_params(SWEEP_KIND, scale=scale),
        "ids": [s.id for s in stmts], "seeds": [int(seeds[0]), int(seeds[-1]) + 1] if len(seeds) else [],
        "cells": {"requested": len(stmts) * len(seeds), "finished": sum(len(rows.get(s.id, {})) for s in stmts)},
        "statements": per,
        "budget": {**budget, "alpha": CP_ALPHA},
    }
    if mc_ids:
        common = sorted(set.intersection(*(set(rows[i]) for i in mc_ids)))
        fails = [seed for seed in common if any(a["failed"] for i in mc_ids
                                                for a in (monte_carlo_assertions(rows[i][seed]) or []))]
        total_delta = sum(p["monte_carlo"]["any"]["budget"] for p in per if "monte_carlo" in p)
        if common:
            summary["monte_carlo"] = {"statements": mc_ids,
                                      "assertions": sum(p["monte_carlo"]["tests"] for p in per
                                                        if "monte_carlo" in p),
                                      "conclusions": sum(len(p["monte_carlo"]["assertions"]) for p in per
                                                         if "monte_carlo" in p),
                                      **budget_status(len(fails), len(common), min(float(total_delta), 1.0)),
                                      "failure_seeds": fails,
                                      "family_wise_budget_of_the_default_run": budget["family_wise"]}
    if run is not None:
        summary["last_run"] = {"computed": len(run.written), "kept": len(run.kept), "failed": run.failed,
                               "wall_seconds": run.seconds}
    return to_jsonable(summary)


CSV_COLUMNS = ("id", "name", "seeds", *_VERDICTS, "tightness_min", "tightness_median", "tightness_max",
               "counterexamples", "counterexample_seeds", "control_detected", "control_missed", "control_none",
               "seconds_total", "seconds_median", "mc_assertions", "mc_seeds", "mc_failures", "mc_failure_seeds",
               "mc_cp_upper", "mc_budget", "mc_status")


def csv_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """One flat row per statement of ``summary`` (the rows of ``sweep.csv``; Monte Carlo: any assertion of the
    statement failing at a seed counts as a failure of that seed, against the sum of its assertions' ``δ``)."""
    out = []
    for p in summary["statements"]:
        mc = p.get("monte_carlo")
        row = {"id": p["id"], "name": p["name"], "seeds": p["seeds"], **{v: p["verdicts"].get(v, 0) for v in _VERDICTS},
               "tightness_min": p["tightness"]["min"], "tightness_median": p["tightness"]["median"],
               "tightness_max": p["tightness"]["max"], "counterexamples": p["counterexamples"]["total"],
               "counterexample_seeds": " ".join(map(str, p["counterexamples"]["seeds"])),
               "control_detected": p["negative_control"]["detected"], "control_missed": p["negative_control"]["missed"],
               "control_none": p["negative_control"]["none"], "seconds_total": p["seconds"]["total"],
               "seconds_median": p["seconds"]["median"],
               "mc_assertions": mc["tests"] if mc else "", "mc_seeds": mc["any"]["seeds"] if mc else "",
               "mc_failures": mc["any"]["failures"] if mc else "",
               "mc_failure_seeds": " ".join(map(str, mc["any"]["failure_seeds"])) if mc else "",
               "mc_cp_upper": mc["any"]["cp_upper"] if mc else "", "mc_budget": mc["any"]["budget"] if mc else "",
               "mc_status": mc["any"]["status"] if mc else ""}
        out.append(row)
    return out


def write_summary(out: str | Path, summary: dict[str, Any]) -> tuple[Path, Path]:
    """Write ``sweep.json`` and ``sweep.csv`` to ``out`` (atomically); returns their paths."""
    import pandas as pd

    out = Path(out)
    pj, pc = out / SUMMARY_JSON, out / SUMMARY_CSV
    atomic_write_text(pj, json.dumps(to_jsonable(summary), indent=1, allow_nan=False) + "\n")
    atomic_write_text(pc, pd.DataFrame(csv_rows(summary), columns=list(CSV_COLUMNS)).to_csv(index=False))
    return pj, pc


def read_summary(out: str | Path) -> dict[str, Any]:
    """The ``sweep.json`` of folder ``out``; raises :class:`CellFolderError` when there is none or it is not one."""
    return read_summary_file(Path(out) / SUMMARY_JSON, kind=SWEEP_KIND, list_key="statements",
                             what="the summary of a statement sweep", folder="the --out folder of a finished sweep")


def screen(summary: dict[str, Any], out: Path, run: CellRun | None) -> str:
    """The one-screen summary the command line prints."""
    lines = []
    if run is not None:
        lines += run.screen_lines("sweep", out / CELLS_DIR)
    w = max([len(p["id"]) for p in summary["statements"]] + [2])
    lines.append(f"  {'id':<{w}}  seeds  verdicts                 tightness min / median / max   cex  controls  MC "
                 "failures (CP upper vs budget)")
    for p in summary["statements"]:
        verd = ", ".join(f"{k} {v}" for k, v in p["verdicts"].items() if v)
        t = p["tightness"]
        tt = " / ".join("-" if t[k] is None else f"{t[k]:.4g}" for k in ("min", "median", "max"))
        nc = p["negative_control"]
        ctl = ("none" if nc["none"] == p["seeds"] else
               f"{nc['detected']} det" + (f", {nc['missed']} MISSED" if nc["missed"] else ""))
        mc = p.get("monte_carlo")
        mct = (f"{mc['any']['failures']}/{mc['any']['seeds']} ({mc['any']['cp_upper']:.3g} vs "
               f"{mc['any']['budget']:.3g}: {mc['any']['status']})") if mc else "-"
        lines.append(f"  {p['id']:<{w}}  {p['seeds']:>5}  {verd:<24} {tt:<30} {p['counterexamples']['total']:>4}  "
                     f"{ctl:<9} {mct}")
    if "monte_carlo" in summary:
        m = summary["monte_carlo"]
        lines.append(f"  Monte Carlo, all {m['assertions']} assertions of {', '.join(m['statements'])}: a failure at "
                     f"{m['failures']} of {m['seeds']} seeds; Clopper–Pearson {100 * (1 - m['alpha']):.0f}% upper "
                     f"bound {m['cp_upper']:.3g} against the budget {m['budget']:.3g} ({m['status']})")
    lines.append(f"  wrote {out / SUMMARY_JSON} and {out / SUMMARY_CSV}")
    return "\n".join(lines)


def failed(summary: dict[str, Any], run: CellRun | None) -> bool:
    """True iff the sweep fails: a cell failed or is missing, a verdict is violated / vacuous / error, or a negative
    control was missed (the rule of ``run``, over every cell)."""
    if run is not None and not run.complete:
        return True
    if summary["cells"]["finished"] < summary["cells"]["requested"]:
        return True
    for p in summary["statements"]:
        if any(p["verdicts"].get(v, 0) for v in ("violated", "vacuous", "error")) or p["negative_control"]["missed"]:
            return True
    return False


def sweep_tables(summary: dict[str, Any]):
    """The figure table of the report's sweep section: one row per (statement, seed) with ``id``, ``seed``,
    ``tightness`` (None left out) and ``verdict``."""
    import pandas as pd

    recs = [{"id": p["id"], "seed": s, "tightness": float(t), "verdict": v}
            for p in summary["statements"]
            for s, t, v in zip(p["by_seed"]["seed"], p["by_seed"]["tightness"], p["by_seed"]["verdict"], strict=True)
            if t is not None]
    return {"tightness": pd.DataFrame(recs, columns=["id", "seed", "tightness", "verdict"])}


def parse_ids_or_mc(ids: Iterable[str], mc: bool) -> list[registry.Statement]:
    """The statements of a sweep: ``ids`` (all when empty), or with ``mc`` the Monte Carlo statements."""
    if mc:
        if list(ids):
            raise ValueError("give statement ids or --mc, not both")
        return monte_carlo_statements()
    return registry.resolve(list(ids))
