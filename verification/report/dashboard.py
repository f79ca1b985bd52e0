"""The theorem dashboard and figure report (``python -m verification report``, ``make report``).

Runs every executable statement (and the studies of :mod:`verification.studies.synthetic`), then writes to ``out_dir``:

* ``results.json`` — one object per statement in the schema of ``python -m verification run`` (with each
  conclusion's power and, where the falsification search ran, its best ratio);
* ``instances.csv`` — the raw per-instance conclusion data ``(id, instance, lhs, rhs, ratio)`` of every check;
* ``counterexamples/<id>.json`` — the data to reproduce each counterexample (and each finding's literal and
  repaired evidence);
* ``data/<id>/<table>.csv`` — the figure data the statements and studies report;
* ``figures/*.png`` — seaborn figures, one message each;
* ``worst/<id>.json`` — per numeric conclusion the instance closest to (or beyond) its bound, from the check and
  from the falsification search (:mod:`verification.core.search`), with the data to reproduce it;
* ``README.md`` and ``index.html`` — the dashboard: one row per statement (verdict, tightness, ``power`` at factor
  0.5, …), its conclusions collapsed under it, the findings, the family-wise budget of the confidence-level
  assertions and how the constants were estimated;
* ``manifest.json`` — what made the report (:mod:`verification.report.manifest`);
* ``results.jsonl`` — the results log (:mod:`verification.core.resultlog`).

Each statement's own files (:mod:`verification.report.files`: its rows of ``instances.csv``, its
``counterexamples/`` and ``data/`` files) are written as soon as it finishes, and then its record is appended to
``results.jsonl``: its result row and what the dashboard needs besides (``"report": {"counterexample_file",
"repaired", "tables", "instance_rows"}``). The final files are then assembled from the log and those files (the
figure tables read back from ``data/``), the same way whether every statement ran now or a resumed report
(``resume=True``) kept the statements an interrupted one had finished. The studies are run again on a resume.

Progress goes to stderr while it runs; a one-screen summary is returned for the command line to print, with
what a user must act on (:func:`report_problems`: the command's exit status 1); a finding is a result.
"""

from __future__ import annotations

import dataclasses
import html
import json
import re
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from sim.cli import atomic_write_text
from verification.core import registry, resultlog
from verification.core.evidence import FEW_DETECTING, POWER_FACTOR, Evidence, to_jsonable
from verification.core.montecarlo import FAMILY_WISE_BUDGET
from verification.report import cells as report_cells
from verification.report.files import (
    check_statement_files,
    evidence_tables,
    read_tables,
    safe_name,
    start_instances,
    statement_files,
    write_json,
    write_statement_files,
    write_tables,
)
from verification.report.manifest import MANIFEST_NAME, report_manifest, scale_note, statement_entries
from verification.report.markup import figures_html, figures_markdown, fmt

__all__ = ["SCALES", "SEARCH_BUDGET", "LOG_NAME", "ReportResult", "ReportCellsFailed", "build_report",
           "statement_config", "evidence_tables", "confidence_budget", "statement_files", "write_statement_files"]

SCALES = registry.SCALES
statement_config = registry.statement_config
#: Falsification search per scale: the stored search's short refinement (:func:`verification.core.search.refine_stored`)
#: by default, the ``paper`` budget of :data:`verification.core.search.BUDGETS` at the paper scale.
SEARCH_BUDGET = {"default": "stored", "paper": "paper"}
#: The results log of a report, in its output folder.
LOG_NAME = "results.jsonl"


@dataclasses.dataclass
class ReportResult:
    out_dir: Path
    rows: list[dict[str, Any]]
    figures: dict[str, str]  # figure file -> caption
    missing_figures: dict[str, str]  # figure name -> why it was not drawn
    seconds: float
    problems: list[str]  # what a user must act on (:func:`report_problems`); the command exits 1 iff any
    sweep: dict[str, Any] | None = None  # the summary of the sweep shown (report --sweep DIR)
    sweep_figures: dict[str, str] = dataclasses.field(default_factory=dict)
    sweep_missing: dict[str, str] = dataclasses.field(default_factory=dict)
    budget: dict[str, Any] = dataclasses.field(default_factory=dict)
    llm: Any = None  # the LLM section (verification.report.llm_section.LLMSection), None when not made
    command: str = ""  # the command line that makes this report again (:func:`report_command`)
    cells: Any = None  # on Dask: what run_cells did (verification.engine.dask_engine.CellRun), None when serial

    @property
    def failed(self) -> bool:
        """True iff the report found something a user must act on (:func:`report_problems`)."""
        return bool(self.problems)

    def summary(self) -> str:
        counts: dict[str, int] = {}
        for r in self.rows:
            counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
        missed = [r["id"] for r in self.rows if r["negative_control"] == "missed"]
        bad = [f"{r['id']} ({r['verdict']})" for r in self.rows if r["verdict"] in ("violated", "vacuous", "error")]
        findings = [f"{r['id']} ({r['counterexamples']} counterexamples)" for r in self.rows
                    if r["verdict"] == "finding"]
        lines = [
            f"report written to {self.out_dir}/ in {self.seconds:.1f} s",
            f"  statements: {len(self.rows)}  " + "  ".join(f"{k}: {v}" for k, v in sorted(counts.items())),
            f"  negative controls detected: "
            f"{sum(r['negative_control'] == 'detected' for r in self.rows)}, missed: {len(missed)}"
            + (f" ({', '.join(missed)})" if missed else ""),
            f"  findings (documented counterexamples, shown; not a failure): {', '.join(findings) or 'none'}",
            f"  violated / vacuous / error: {', '.join(bad) or 'none'}",
            f"  power at factor {POWER_FACTOR}: {_power_totals(self.rows)}",
            f"  confidence-level assertions: {self.budget.get('assertions', 0)}, family-wise false failure <= "
            f"{self.budget.get('total', 0.0):.3g} (budget {FAMILY_WISE_BUDGET:g})",
            f"  figures: {len(self.figures)} written"
            + (f", {len(self.missing_figures)} missing: {', '.join(self.missing_figures)}" if self.missing_figures else ""),
            f"  dashboard: {self.out_dir / 'index.html'} and {self.out_dir / 'README.md'}",
        ]
        if self.llm is not None:
            lines.insert(-1, f"  LLM section: {self.llm.status} ({len(self.llm.figures)} figure(s)"
                             + (f", {len(self.llm.missing_figures)} missing" if self.llm.missing_figures else "")
                             + f"): {self.llm.message}")
        if self.sweep is not None:
            lines.insert(-1, f"  sweep section: {len(self.sweep['statements'])} statement(s) over seeds "
                             f"{self.sweep['seeds'][0]}..{self.sweep['seeds'][1] - 1}, "
                             f"{len(self.sweep_figures)} figure(s)")
        lines.append("  to act on (exit status 1): "
                     + ("; ".join(self.problems) if self.problems else "nothing (exit status 0)"))
        return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ running


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _progress_line(k: int, n: int, elapsed: float, stmt: registry.Statement, row: dict, source=None) -> str:
    took = f"({row['seconds']:.2f} s)" if source is None else f"(from {source})"
    return (f"[{k:>2}/{n}] {elapsed:6.1f}s  {stmt.id:<8} {row['verdict']:<9} "
            f"negative control: {row['negative_control']:<8} {took}")


def run_all(ids=None, *, seed: int = registry.DEFAULT_SEED, scale: str = "default", search: str | None = None,
            progress: Callable[[str], None] = _progress) -> list[tuple[registry.Statement, Evidence | None, dict]]:
    """Run the statements (all by default); returns (statement, evidence or None on error, result row).
    ``search``: a falsification-search budget (:data:`verification.core.search.BUDGETS`), or None for none."""
    stmts = registry.resolve(ids)
    out = []
    t_start = time.perf_counter()
    for k, s in enumerate(stmts, 1):
        ev, row, _ = registry.run_statement_row(s, seed, scale=scale, search=search)
        out.append((s, ev, row))
        progress(_progress_line(k, len(stmts), time.perf_counter() - t_start, s, row))
    return out



def confidence_budget(rows) -> dict[str, Any]:
    """Every confidence-level assertion of the run's result ``rows`` (``details["confidence_assertions"]``), per
    statement, and the family-wise false-failure bound they add up to (Bonferroni)."""
    per: dict[str, dict] = {}
    for row in rows:
        recs = (row.get("details") or {}).get("confidence_assertions") or []
        if recs:
            per[row["id"]] = {"assertions": len(recs), "delta": float(sum(r["delta"] for r in recs)),
                              "labels": [r["label"] for r in recs]}
    total = float(sum(v["delta"] for v in per.values()))
    return {"budget": FAMILY_WISE_BUDGET, "total": total, "assertions": sum(v["assertions"] for v in per.values()),
            "per_statement": per}


def _power_counts(row: dict) -> dict[str, Any]:
    concl = row.get("conclusions") or []
    numeric = [c for c in concl if c["kind"] in ("bound", "monte_carlo") and c.get("role", "contract") == "contract"]
    det = [c for c in numeric if c["power"]["status"] == "detected"]
    weak = [c for c in numeric if c["power"]["status"] == "weak"]
    return {"numeric": len(numeric), "detected": len(det), "weak": weak,
            "unexplained": [c for c in weak if not c["power"].get("reason")],
            "tight_point": [c for c in det if c["power"].get("detected_by") == "designed tight point"],
            "search": [c for c in numeric if "falsification search" in (c["power"].get("detection_sources") or ())],
            "few": [c for c in det if c["power"].get("few_instances")]}


def _power_cell(row: dict) -> str:
    pc = _power_counts(row)
    if not pc["numeric"]:
        return "no numeric bound"
    cell = f"{pc['detected']}/{pc['numeric']} detect"
    if pc["weak"]:
        cell += f" ({len(pc['weak'])} weak"
        cell += f", {len(pc['unexplained'])} without reason)" if pc["unexplained"] else ": reasons given)"
    return cell


def _power_totals(rows) -> str:
    tot = [_power_counts(r) for r in rows]
    n = sum(p["numeric"] for p in tot)
    d = sum(p["detected"] for p in tot)
    w = sum(len(p["weak"]) for p in tot)
    u = sum(len(p["unexplained"]) for p in tot)
    tp = sum(len(p["tight_point"]) for p in tot)
    tp_found = sum(sum("falsification search" in (c["power"].get("detection_sources") or ()) for c in p["tight_point"])
                   for p in tot)
    few = sum(len(p["few"]) for p in tot)
    found = sum(len(p["search"]) for p in tot)
    return (f"{d}/{n} numeric conclusions detect a halved bound ({tp} of them only at a designed tight point, of "
            f"which the falsification search finds {tp_found} on its own; {few} on fewer than {FEW_DETECTING} "
            f"instances); the search alone detects {found}/{n}; {w} weak ({u} without a stated reason)")


def report_command(ids: list[str], *, scale: str, seed: int, studies: bool, llm: bool = True,
                   llm_runs: list[str] | None = None, llm_sweep: str | None = None,
                   llm_gate: str | None = None) -> str:
    """The ``prefalign`` command line that makes the report of statements ``ids`` again (the ids are left out when
    they are every registered statement), with its LLM section: read from the sweep ``llm_sweep``
    (``--llm-sweep``) or from ``llm_runs`` (``--llm-run``), made by the smoke preset (``llm``) or skipped
    (``--no-llm``), opened by the gate folder ``llm_gate`` (``--llm-gate``)."""
    every = [s.id for s in registry.all_statements()]
    words = ["prefalign", "verify", "report", *([] if list(ids) == every else ids), "--scale", scale,
             "--seed", str(seed)]
    words += [] if studies else ["--no-studies"]
    if llm_sweep:
        words += ["--llm-sweep", str(llm_sweep)]
    elif llm_runs:
        words += [w for d in llm_runs for w in ("--llm-run", str(d))]
    elif not llm:
        words.append("--no-llm")
    if llm_gate:
        words += ["--llm-gate", str(llm_gate)]
    return shlex.join(words)


def build_report(out_dir: str | Path = "reports", *, scale: str = "default", seed: int = registry.DEFAULT_SEED,
                 ids=None, studies: bool = True, progress: Callable[[str], None] = _progress,
                 resume: bool = False, sweep: dict[str, Any] | None = None,
                 search: str | None = "auto", llm: bool = False, llm_runs=None, llm_sweep=None,
                 llm_gate=None, client=None) -> ReportResult:
    """Run every check (and the studies) and write the report to ``out_dir`` (see the module docstring).
    ``search``: the falsification-search budget (``"auto"``: by the scale, :data:`SEARCH_BUDGET`; ``None``: none).

    With ``resume=True`` the statements recorded in ``out_dir/results.jsonl`` by an interrupted report with the
    same ids, scale, seed and package version are not run again; a log that cannot be resumed raises
    :class:`~verification.core.resultlog.ResultLogError` before any statement runs. ``sweep``, the summary of a
    sweep (:func:`verification.engine.sweep.read_summary`), adds its section and figure to the dashboard.

    The "LLM run" section (:mod:`verification.report.llm_section`): with ``llm=True`` the LLM smoke preset runs now as a
    subprocess (``python -m llm_runs run``; the section says so when torch or the model is missing), with
    ``llm_runs`` (run directories) those runs are read; the synthetic smoke runs beside them, the run studies
    (:mod:`verification.llm.studies`, into ``studies.json``) and their figures follow. With ``llm_sweep`` (an LLM
    sweep folder, not with ``llm_runs``) the section opens with the sweep's pre-registered statistics and the
    hypotheses across its seeds (:mod:`verification.llm.sweep`) and shows its first seed's run in detail below;
    it reads them from ``out/llm-sweep/``, the copy of the sweep's summaries that
    :func:`verification.llm.sweep.export_sweep` makes (the per-pair margins, records and rewards, not the
    generated text), so the dashboard and what it shows stay together; when the sweep's runs hold the shots
    records, the shots curve and its pre-registered statistics come first (:mod:`verification.llm.answer`). With
    ``llm_gate`` (a folder of ``llm gate``) the section opens with its gate table, read from ``out/llm-gate/``,
    the copy :func:`verification.llm.answer.export_gate` makes. Otherwise the section says it was skipped.

    With ``client`` (a ``distributed.Client``, :func:`verification.engine.dask_engine.dask_client`) the statements
    and their searches run as cells on its cluster (:mod:`verification.report.cells`; written to ``out/cells/`` as
    they finish, a progress bar counting them), and the statements' files and the dashboard are written from the
    cells once they are all done, in the order of the statements, as the serial report writes them. Without
    ``resume`` the cells of an earlier report in ``out`` are removed first; with it the finished ones are kept
    (a killed report loses only the cells in flight). A cell that failed (its worker died more often than the
    scheduler allows) raises :class:`ReportCellsFailed` before the dashboard is written."""
    from verification.engine.dask_engine import read_cell
    from verification.report import figures  # plotting is imported only when a report is made

    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}; got {scale!r}")
    budget_name = SEARCH_BUDGET[scale] if search == "auto" else search
    stmts = registry.resolve(ids)
    t0 = time.perf_counter()
    out = Path(out_dir)
    log_file = out / LOG_NAME
    header = resultlog.log_header("report", SimpleNamespace(seed=seed, scale=scale), [s.id for s in stmts])
    out.mkdir(parents=True, exist_ok=True)
    log, kept = resultlog.open_log(log_file, header, resume=resume, fields=("row", "report"), note=progress)
    done = {r["id"]: r for r in kept}
    check_statement_files(out, {sid: r["report"] for sid, r in done.items()})
    start_instances(out / "instances.csv", {sid: r["report"] for sid, r in done.items()})
    progress(f"running the executable statements (scale {scale}, seed {seed}, falsification search "
             f"{budget_name or 'none'}) ..."
             + (f" {len(done)} of {len(stmts)} already finished in {log_file}" if done else ""))
    cells = _run_cells(client, out, [s for s in stmts if s.id not in done], seed=seed, scale=scale,
                       budget=budget_name, resume=resume) if client is not None else None
    results = []  # (statement, report record, result row)
    for k, s in enumerate(stmts, 1):
        rec = done.get(s.id)
        if rec is None:
            if cells is None:
                files = report_cells.run_statement(s, seed, scale, budget_name)
            else:
                files = read_cell(report_cells.cell_file(out, s.id, report_cells.CHECK_CELL))
            rec = {"id": s.id, "row": to_jsonable(files["row"]), "report": write_statement_files(out, s.id, files)}
            log.append(rec)
        results.append((s, rec["report"], rec["row"]))
        progress(_progress_line(k, len(stmts), time.perf_counter() - t0, s, rec["row"],
                                source=log_file if s.id in done else None))
    rows = [r for _, _, r in results]
    write_json(out / "results.json", rows)
    tables = {s.id: read_tables(out, s.id, rec["tables"]) for s, rec, _ in results if rec["tables"]}

    study_results = []
    if studies:
        try:
            from verification.studies import synthetic as studies_mod
        except ImportError:
            studies_mod = None
        if studies_mod is not None:
            progress("running the studies ...")
            for st in studies_mod.run_studies(seed=seed):
                study_results.append(st)
                tables[st.id] = dict(st.tables)
                write_tables(out, st.id, st.tables)
                progress(f"  {st.id}: {', '.join(st.tables)}")

    from verification.report.llm_section import LLMSection, build_llm_section

    if llm or llm_runs or llm_sweep:
        read_sweep_from = None
        if llm_sweep:  # the dashboard reads (and links) a copy of what it shows, inside its own folder
            from verification.llm.sweep import export_sweep

            progress(f"copying the LLM sweep's summaries to {out / LLM_SWEEP_DIR} ...")
            read_sweep_from = export_sweep(llm_sweep, out / LLM_SWEEP_DIR)
        read_gate_from = None
        if llm_gate:
            from verification.llm.answer import export_gate

            progress(f"copying the gate's summary to {out / LLM_GATE_DIR} ...")
            read_gate_from = export_gate(llm_gate, out / LLM_GATE_DIR)
        llm_sec = build_llm_section(out, llm_runs=llm_runs, seed=seed, progress=progress, tables=tables,
                                    llm_sweep=read_sweep_from, llm_sweep_source=llm_sweep,
                                    llm_gate=read_gate_from, llm_gate_source=llm_gate)
        for st in llm_sec.results:
            write_tables(out, st.id, st.tables)
    else:
        llm_sec = LLMSection("skipped", "The LLM section was skipped (--no-llm).")
    if studies or llm_sec.results:
        write_json(out / "studies.json", [{"id": st.id, "name": st.name, "summary": st.summary, "notes": st.notes}
                                           for st in study_results]
                    + [llm_sec.to_json()]
                    + [{"id": st.id, "name": st.name, "summary": st.summary, "notes": st.notes,
                        "runs": [r.describe() for r in llm_sec.llm_runs[:1] + [llm_sec.synthetic] if r is not None]}
                       for st in llm_sec.results])

    progress("drawing the figures ...")
    fig_dir = out / "figures"
    drawn, missing = figures.draw_all(fig_dir, rows, tables)
    sweep_drawn, sweep_missing = {}, {}
    if sweep is not None:
        from verification.engine.sweep import sweep_tables

        sweep_drawn, sweep_missing = figures.draw_all(fig_dir, rows, {"sweep": sweep_tables(sweep)},
                                                      figures=figures.SWEEP_FIGURES)
    seconds = time.perf_counter() - t0
    budget = confidence_budget(rows)
    res = ReportResult(out_dir=out, rows=rows, figures=drawn, missing_figures=missing, seconds=seconds,
                       command=report_command([s.id for s in stmts], scale=scale, seed=seed, studies=studies, llm=llm,
                                              llm_runs=[str(p) for p in llm_runs] if llm_runs else None,
                                              llm_sweep=str(llm_sweep) if llm_sweep else None,
                                              llm_gate=str(llm_gate) if llm_gate else None),
                       problems=report_problems(rows, budget, llm_sec), budget=budget, sweep=sweep,
                       sweep_figures=sweep_drawn, sweep_missing=sweep_missing, llm=llm_sec, cells=cells)
    llm_source = ({"source": "sweep", "path": str(llm_sweep)} if llm_sweep else
                  {"source": "runs", "paths": [str(p) for p in llm_runs]} if llm_runs else
                  {"source": "smoke" if llm else "none"})
    write_json(out / MANIFEST_NAME, report_manifest(
        stmts, command=res.command, scale=scale, seed=seed, search=budget_name,
        studies=[st.id for st in study_results] + [st.id for st in llm_sec.results], llm=llm_source))
    atomic_write_text(out / "README.md", dashboard_markdown(res, results, study_results, scale=scale, seed=seed))
    atomic_write_text(out / "index.html", dashboard_html(res, results, study_results, scale=scale, seed=seed))
    return res


def report_problems(rows, budget: dict[str, Any], llm=None) -> list[str]:
    """What a user must act on in a report, one line each (``python -m verification report`` exits 1 iff there is
    any): a verdict ``violated`` (a counterexample with every hypothesis held that no documented finding covers:
    the search's counterexamples of a statement's ``SEARCH_FINDINGS`` make a ``finding``, which is shown, not
    failed), ``vacuous`` or ``error``; a missed negative control; confidence-level assertions over the
    family-wise budget; an LLM section whose run failed (``unavailable``, torch or the model not installed, is
    said in the section and is not a failure). A finding, a weak conclusion, a missing figure are results."""
    out = [f"{r['id']}: " + ", ".join(([f"verdict {r['verdict']}"] if r["verdict"] not in ("holds", "finding") else [])
                                      + (["negative control missed"] if r["negative_control"] == "missed" else []))
           for r in rows if resultlog.row_failed(r)]
    if budget["total"] > FAMILY_WISE_BUDGET * (1 + 1e-12):
        out.append(f"confidence-level assertions: family-wise false failure {budget['total']:.3g} over the budget "
                   f"{FAMILY_WISE_BUDGET:g}")
    if llm is not None and llm.status == "failed":
        out.append(f"LLM section: {llm.message}")
    return out


class ReportCellsFailed(RuntimeError):
    """Cells of a report on Dask produced no result: the report is not written (the same command with
    ``--resume`` computes them again)."""


def _run_cells(client, out: Path, stmts, *, seed: int, scale: str, budget: str | None, resume: bool):
    """Run the cells of ``stmts`` on the cluster of ``client`` (:func:`build_report`); returns the run."""
    from verification.engine.dask_engine import run_cells

    report_cells.prepare_folder(out, report_cells.report_params(seed=seed, scale=scale, budget=budget),
                                resume=resume, write=True)
    cells = report_cells.report_cells(out, stmts, seed=seed, scale=scale, budget=budget)
    run = run_cells(client, cells, desc="report")
    if run.failed:
        raise ReportCellsFailed(f"{len(run.failed)} cell(s) of the report failed, the dashboard is not written: "
                                + "; ".join(f"{k}: {why}" for k, why in run.failed.items())
                                + " (the same command with --resume computes them)")
    return run


# --------------------------------------------------------------------------------------------- dashboard

#: The folder of the report that holds the copy of an ``--llm-sweep`` (:func:`verification.llm.sweep.export_sweep`).
LLM_SWEEP_DIR = "llm-sweep"
#: The folder of the report that holds the copy of an ``--llm-gate`` (:func:`verification.llm.answer.export_gate`).
LLM_GATE_DIR = "llm-gate"

VERDICT_HELP = {
    "holds": "the conclusion held on every instance where the monitored hypotheses held",
    "violated": "a counterexample with every hypothesis satisfied",
    "finding": "a documented result, not a failure: the literal statement is false and the repaired statement "
               "holds, or an assumption fails on part of the search's box while its default family holds "
               "(counterexamples shown)",
    "vacuous": "every instance was excluded: the check tested nothing (a failure of the test design)",
    "error": "the check raised an exception",
}


def _cex_text(found: int, kept: int | None) -> str:
    """The counterexamples of a statement, ``"194 (20 kept)"`` when its file keeps fewer than were found."""
    return f"{found} ({kept} kept)" if kept is not None and kept < found else str(found)


def _dashboard_rows(res: ReportResult, results) -> list[dict[str, str]]:
    """One dashboard row per (statement, report record, result row) of ``results``."""
    out = []
    for s, rec, row in results:
        has_file = rec["counterexample_file"]
        out.append({
            "number": s.number, "id": s.id, "name": s.name, "verdict": row["verdict"],
            "held": str(row["instances"] - row["excluded"]), "excluded": str(row["excluded"]),
            "tightness": fmt(row["tightness"]), "control": row["negative_control"],
            "cex": _cex_text(row["counterexamples"], rec.get("counterexamples_kept")),
            "cex_link": f"counterexamples/{safe_name(s.id)}.json" if has_file else "",
            "seconds": f"{row['seconds']:.2f}", "repaired": rec["repaired"], "power": _power_cell(row),
        })
    return out


def _control_rows(res: ReportResult, results) -> list[dict[str, str]]:
    """One row per statement with a negative control: what it breaks (its broken hypotheses and its description),
    flagged / instances and the number of flagged instances where the conclusion failed."""
    by_id = {row["id"]: row for row in res.rows}
    out = []
    for s, _, _ in results:
        row = by_id[s.id]
        d = row.get("negative_control_detail")
        if not d:
            continue
        what = "; ".join(x for x in (", ".join(d.get("breaks") or []), d.get("description") or "") if x)
        out.append({"id": s.id, "breaks": what or "(not described)", "flagged": str(d["flagged"]),
                    "instances": str(d["instances"]), "failed": str(d["failed"]), "state": row["negative_control"]})
    return out


SEARCH_INTRO = ("The falsification search (`python -m verification search --budget N --store`, "
                "`verification/data/search/`) tries to break every numeric conclusion on its family's box; the report "
                "re-evaluates its stored best points and refines those still below 0.5 by a few steps. A stored search "
                "counts only while its box and its check's code (the statement module and the modules of `sim/` and "
                "`verification/statements/` it imports) are those of today; otherwise the report searches here "
                "with the default budget and says why. Per statement: the stored search's budget and date, the "
                "evaluations the search's verdict rests on (made by this report now, and from the store), the "
                "counterexamples found, and whether the box reaches each stress corner (m >= 10, conditioning >= 1e6, "
                "lambda_min <= 1e-12, near-collinear Gram matrices) or why it does not.")


#: The columns of the falsification search's table.
SEARCH_COLUMNS = ("statement", "stored search: budget (date)", "evaluations: now + from the store",
                  "counterexamples", "box reaches")


def _search_rows(results) -> list[dict[str, str]]:
    """One row per statement with a search box: the stored search's budget and date (or why none counts), the
    evaluations made now and those from the store, counterexamples, and the box's reach of
    :data:`verification.core.search.REACH`."""
    out = []
    for s, _, row in results:
        if s.search is None:
            continue
        d = ((row.get("details") or {}).get("search")) or {}
        st = d.get("stored") or {}
        reach = s.search.reach()
        out.append({
            "id": s.id,
            "stored": ("none: " + st["missing"]) if st.get("missing") else
                      (f"{st.get('budget', '-')} ({st.get('date', '-')})" if st else
                       f"none, run here: {d.get('budget', '-')}"),
            "evaluations": _evaluations_text(d),
            "cex": (f"{st['counterexamples']} in the stored search; {d.get('counterexamples', 0)} at its re-evaluated "
                    "points" if "counterexamples" in st else str(d.get("counterexamples", "-"))),
            "reach": "; ".join(f"{k}: " + ("yes" if not v.startswith(("excluded", "NOT")) else v)
                               for k, v in reach.items()),
        })
    return out


def _evaluations_text(search: dict) -> str:
    """``"N now + M stored"``: the evaluations a search result rests on, made by this report and from the store
    (a result written before the split was recorded: the refinement's evaluations and the stored search's)."""
    now, stored = search.get("evaluations_now"), search.get("evaluations_stored")
    if now is None:
        st = search.get("stored") or {}
        now = st.get("refinement_evaluations", search.get("evaluations", "-"))
        stored = st.get("evaluations", 0)
    return f"{now} now + {stored} stored"


def _detect_cell(p: dict) -> str:
    """The detection factor, with where a detection comes from (the default family or a designed tight point)
    and, below :data:`FEW_DETECTING` instances, on how many it rests; then every source that detects the
    weakened bound (the falsification search among them) when the search ran."""
    cell = fmt(p.get("detect_factor"))
    by = p.get("detected_by")
    if by:
        n = p.get("detecting_instances")
        cell += f" ({by}" + (f", {n} instance{'s' * (n != 1)}" if n is not None else "") + ")"
    if p.get("few_instances"):
        cell += f"; {p['few_instances']}"
    if "detection_sources" in p:
        src = p["detection_sources"]
        cell += "; detected at the factor by: " + (", ".join(src) if src else "none")
    return cell


def _search_cell(search: dict) -> str:
    """The falsification search's best ratio with its budget: the evaluations (the stored search's and the
    refinement's) and the date of the stored search."""
    if not search:
        return "-"
    cell = fmt(search.get("best_ratio"))
    bits = [f"{_evaluations_text(search)} evaluations"] if search.get("evaluations") is not None else []
    if search.get("detecting_points") is not None:
        bits.append(f"above 0.5 at {search['detecting_points']} of its {search['design_points']} design points")
    if search.get("date"):
        bits.append(str(search["date"]))
    if search.get("missing"):
        bits.append(f"no stored search: {search['missing']}")
    return cell + (f" ({', '.join(bits)})" if bits else "")


def _conclusion_rows(row: dict) -> list[dict[str, str]]:
    out = []
    for c in row.get("conclusions") or []:
        p = c["power"]
        status = p["status"]
        if c.get("role") == "soft" and status in ("detected", "weak"):
            status += " (soft: reported, not part of the verdict)"
        search = c.get("search") or {}
        out.append({
            "name": c["name"], "kind": c["kind"], "tightness": fmt(c["tightness"]),
            "held": f"{c['instances'] - c['excluded']} / {c['excluded']}", "cex": str(c["counterexamples"]),
            "power": status, "detect": _detect_cell(p), "search": _search_cell(search),
            "reason": p.get("reason", "") if p["status"] == "weak" else "",
        })
    return out


_CONSTANT_KEYS = ("constants", "constants_method", "verdict_constants", "method")


def _constants_text(row: dict) -> str:
    d = row.get("details") or {}
    parts = []
    for k in _CONSTANT_KEYS:
        v = d.get(k)
        if v is None:
            continue
        if isinstance(v, dict):
            v = "; ".join(f"{a}: {b}" for a, b in v.items() if isinstance(b, str))
            if not v:
                continue
        parts.append(f"{k.replace('_', ' ')}: {v}")
    return " | ".join(parts)



#: A piece of inline text and its style: "" (plain), "b" (bold), "i" (italic) or "code".
Segment = tuple[str, str]


def _findings(results) -> list[list[Segment]]:
    """Every FINDING and every soft conclusion with counterexamples (results the verdict does not carry), and the
    findings a statement states in ``details["findings"]``; each as styled pieces of text, written out as Markdown
    by :func:`_segments_md` and as HTML by :func:`_segments_html` (a statement's own text is never parsed)."""
    out: list[list[Segment]] = []
    for s, rec, row in results:
        d = row.get("details") or {}
        concl = row.get("conclusions") or []
        if row["verdict"] == "finding":  # the literal conclusions, or those the search refutes (SEARCH_FINDINGS)
            literal = [c for c in concl if c.get("role") == "literal"
                       or (c.get("search") or {}).get("counterexamples")]
            segs: list[Segment] = [("b", s.id), ("", " (verdict "), ("i", "finding"),
                                   ("", f"): {d.get('finding', '')}; conclusion(s) shown false ")]
            for k, c in enumerate(literal):
                n = c["counterexamples"] or (c.get("search") or {}).get("counterexamples", 0)
                by = " found by the falsification search" if not c["counterexamples"] else ""
                segs += [("", ", " if k else ""), ("code", c["name"]), ("", f" ({n} counterexamples{by})")]
            if rec.get("repaired"):
                segs.append(("", f"; {rec['repaired']}"))
            out.append(segs)
        for c in concl:
            if c.get("role") == "soft" and c["counterexamples"]:
                df = c["power"].get("detect_factor")
                worst = "" if df is None else f", worst ratio {fmt(df)}"
                out.append([("b", s.id), ("", " "), ("code", c["name"]),
                            ("", f" (soft, not part of the verdict): {c['counterexamples']} of "
                                 f"{c['instances'] - c['excluded']} instances fail{worst}")])
        for text in d.get("findings") or []:
            out.append([("b", s.id), ("", f": {text}")])
    return out


def _segments_md(segs: list[Segment]) -> str:
    marks = {"": "", "b": "**", "i": "*", "code": "`"}
    return "".join(f"{marks[style]}{text}{marks[style]}" for style, text in segs if text)


def _segments_html(segs: list[Segment]) -> str:
    tags = {"b": "b", "i": "i", "code": "code"}
    return "".join(f"<{tags[style]}>{html.escape(text)}</{tags[style]}>" if style else html.escape(text)
                   for style, text in segs if text)


def _inline_html(text: str) -> str:
    """A sentence of this module written in Markdown (```code```, ``*emphasis*``) as HTML, the rest escaped."""
    text = re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text, quote=False))
    return re.sub(r"(?<![\w*])\*([^*\s][^*]*?)\*(?![\w*])", r"<i>\1</i>", text)


def _md(text: str) -> str:
    """A markdown table cell: ``|`` escaped."""
    return str(text).replace("|", "\\|")


def _budget_sentence(budget: dict) -> str:
    if not budget:
        return ""
    return (f"Confidence-level assertions: {budget['assertions']} in this run (Monte Carlo mean claims and H.17's "
            f"order-statistic tests), family-wise false-failure probability at most {budget['total']:.3g} "
            f"(Bonferroni; budget {budget['budget']:g}, `verification/core/montecarlo.py`).")


def _calibration() -> dict | None:
    """The committed Monte Carlo calibration (:func:`verification.engine.mc_calibration.load_calibration`), or None."""
    try:
        from verification.engine.mc_calibration import load_calibration

        return load_calibration()
    except (OSError, ValueError, KeyError):
        return None


def _calibration_sentence(cal: dict) -> str:
    fw = cal["family_wise"]
    sim = fw.get("simultaneous") or {}
    rt = cal.get("runtime") or {}
    return (f"Measured directly (`python -m verification mc-calibration`, `verification/data/mc_calibration.json`: "
            f"{int(cal['replications'])} replications per mean claim, {int(cal['order_statistic_replications'])} per "
            f"order-statistic test, seed {cal['seed']}, {rt.get('cpu_seconds', float('nan')):.0f} CPU s on "
            f"{rt.get('cpu_model', 'an unnamed CPU')}): every assertion on draws whose mean is exactly its bound; "
            f"the family-wise false-failure rate lies in [{fw['interval'][0]:.2g}, {fw['interval'][1]:.2g}] (sums of "
            f"the one-sided 95 % Clopper–Pearson bounds; exact rates sum to {fw['exact_sum']:.2g}): "
            f"{fw['status']}; with all {sim.get('bounds', '?')} bounds held at once (Bonferroni) the upper bound is "
            f"{sim.get('upper_sum', float('nan')):.2g}: {sim.get('status', '?')}.")


def _calibration_rows(cal: dict) -> list[dict[str, str]]:
    out = []
    for r in cal["rows"]:
        fams = "; ".join(f"{f}: {d['failures']}/{d['replications']}" for f, d in r["families"].items() if "failures" in d)
        out.append({"id": r["statement"], "label": r["label"], "N": str(r["N"]), "delta": f"{r['delta']:.3g}",
                    "failures": fams, "upper": f"{r['upper']:.3g}", "exact": f"{r['exact']:.3g}"})
    return out


def dashboard_markdown(res: ReportResult, results, study_results, *, scale: str, seed: int) -> str:
    rows = _dashboard_rows(res, results)
    lines = [
        "# Theorem dashboard",
        "",
        f"Generated by `{res.command}` in {res.seconds:.1f} s. "
        "One row per statement of the paper's appendix, by its numbering. Raw data: `results.json`, "
        "`worst/` (worst cases), `counterexamples/`; the figure data `data/` and the per-instance `instances.csv` "
        "are written by `make report` and not committed (they are large). "
        + scale_note(statement_entries(s for s, _, _ in results), scale),
        "",
        "| # | statement | verdict | hypotheses held / excluded | tightness | power | negative control | "
        "counterexamples | s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        verdict = f"**{r['verdict'].upper()}**" if r["verdict"] != "holds" else r["verdict"]
        if r["repaired"]:
            verdict += f" ({r['repaired']})"
        cex = f"[{r['cex']}]({r['cex_link']})" if r["cex_link"] else r["cex"]
        lines.append(f"| {r['id']} | {_md(r['name'])} | {verdict} | {r['held']} / {r['excluded']} | {r['tightness']} | "
                     f"{r['power']} | {r['control']} | {cex} | {r['seconds']} |")
    lines += ["", f"Power at factor {POWER_FACTOR}: {_power_totals(res.rows)} (every numeric bound scaled to "
              f"rhs − (1 − f)|rhs|; `python -m verification power` re-runs the checks so). "
              + _budget_sentence(res.budget), ""]
    findings = _findings(results)
    if findings:
        lines += ["## Findings", ""] + [f"* {_segments_md(f)}" for f in findings] + [""]
    controls = _control_rows(res, results)
    if controls:
        lines += ["## Negative controls", "",
                  "Each control breaks a hypothesis (or a constant) on purpose; it is *detected* when the monitor flags "
                  "the broken hypothesis and the conclusion fails on a flagged instance.", "",
                  "| statement | what it breaks | flagged / instances | conclusion failed | control |",
                  "|---|---|---|---|---|"]
        lines += [f"| {c['id']} | {_md(c['breaks'])} | {c['flagged']} / {c['instances']} | {c['failed']} | "
                  f"{c['state']} |" for c in controls]
        lines += [""]
    srows = _search_rows(results)
    if srows:
        lines += ["## Falsification search", "", SEARCH_INTRO, "",
                  "| " + " | ".join(SEARCH_COLUMNS) + " |", "|---" * len(SEARCH_COLUMNS) + "|"]
        lines += [f"| {c['id']} | {_md(c['stored'])} | {c['evaluations']} | {c['cex']} | {_md(c['reach'])} |"
                  for c in srows]
        lines += [""]
    lines += ["## Conclusions of each statement", "",
              "Per conclusion: kind, tightness (max lhs/rhs), hypotheses held / excluded, counterexamples, power at "
              f"factor {POWER_FACTOR} (the detection factor `1 − (rhs − lhs)/|rhs|`, or the Monte Carlo crossing "
              "factor; for a detection, whether it comes from the default family or a designed tight point "
              f"(`TIGHT_POINTS`), on how many instances it rests, and every source that detects it: default family, "
              "designed tight point, falsification search), the falsification search's best ratio on the family with "
              "its evaluations and date (`worst/<id>.json`) and, for a weak "
              "bound, the reason it cannot be approached there; then how the constants were estimated.", ""]
    by_id = {row["id"]: row for row in res.rows}
    for s, _, _ in results:
        row = by_id[s.id]
        crs = _conclusion_rows(row)
        if not crs:
            continue
        lines += [f"<details><summary>{s.id}: {len(crs)} conclusion(s), power {_power_cell(row)}</summary>", "",
                  "| conclusion | kind | tightness | held / excluded | counterexamples | power | detection factor | "
                  "search best | reason (weak bounds) |", "|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {_md(c['name'])} | {c['kind']} | {c['tightness']} | {c['held']} | {c['cex']} | {c['power']} | "
                  f"{c['detect']} | {c['search']} | {_md(c['reason'])} |" for c in crs]
        const = _constants_text(row)
        if const:
            lines += ["", f"Constants: {const}"]
        lines += ["", "</details>", ""]
    per_statement = res.budget.get("per_statement", {})
    lines += ["## Confidence-level assertions (one family-wise budget)", ""]
    if per_statement:
        lines += ["| statement | assertions | sum of delta |", "|---|---|---|"]
        lines += [f"| {sid} | {v['assertions']} | {v['delta']:.3g} |" for sid, v in per_statement.items()]
    lines += ["", _budget_sentence(res.budget), ""]
    cal = _calibration()
    if cal is not None:
        lines += [_calibration_sentence(cal), "",
                  "| statement | assertion | N | delta | failures / replications | upper bound | exact rate |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {c['id']} | {_md(c['label'])} | {c['N']} | {c['delta']} | {_md(c['failures'])} | {c['upper']} | "
                  f"{c['exact']} |" for c in _calibration_rows(cal)]
        lines += [""]
    lines += ["", "## How to read a verdict", ""]
    lines += [f"* **{k}**: {v}." for k, v in VERDICT_HELP.items()]
    lines += [
        "* **tightness**: the largest observed ratio lhs / rhs of the conclusion `lhs ≤ rhs` over the instances "
        "where the hypotheses held (1 means the bound is attained; above 1 means violated).",
        "* **negative control**: a setting that breaks a hypothesis on purpose; *detected* means the monitor "
        "flagged the hypothesis and the conclusion was seen to fail, so the check can fail.",
        f"* **power**: how many numeric conclusions would detect their bound made too small by half (factor "
        f"{POWER_FACTOR}); identity residuals and boolean conclusions have no bound to weaken and are not counted; "
        "a weak conclusion shows the falsification search's best ratio and the reason its bound cannot be "
        "approached on its family.",
        "",
        "## Figures",
        "",
    ]
    lines += figures_markdown(res.figures, res.missing_figures)
    if res.sweep is not None:
        lines += ["", *_sweep_markdown(res)]
    if res.llm is not None:
        from verification.report.llm_section import section_markdown

        lines += ["", *section_markdown(res.llm)]
    if study_results:
        lines += ["", "## Studies the paper did not carry out", ""]
        for st in study_results:
            lines += [f"### {st.id}: {st.name}", "", st.notes, "", "```",
                      json.dumps(to_jsonable(st.summary), indent=1)[:2000], "```", ""]
    return "\n".join(lines) + "\n"


_SWEEP_HEADER = ("statement", "seeds", "verdicts", "tightness min / median / max", "counterexamples (seeds)",
                 "negative control detected / missed", "Monte Carlo failures (CP upper bound vs budget)", "s")


def _sweep_cells(p: dict[str, Any], alpha: float) -> list[str]:
    """The cells of one statement's row in the sweep table."""
    t = p["tightness"]
    cex = p["counterexamples"]
    seeds = cex["seeds"]
    cex_cell = str(cex["total"]) + (f" (seeds {', '.join(map(str, seeds[:12]))}{', ...' if len(seeds) > 12 else ''})"
                                    if seeds else "")
    mc = p.get("monte_carlo")
    mc_cell = "–"
    if mc is not None:
        a = mc["any"]
        mc_cell = (f"{a['failures']} / {a['seeds']} seeds; {100 * (1 - alpha):.0f}% upper bound {a['cp_upper']:.3g} "
                   f"vs δ = {a['budget']:.3g} ({a['status']})")
    return [p["id"], str(p["seeds"]), ", ".join(f"{k} {v}" for k, v in p["verdicts"].items() if v),
            " / ".join(fmt(t[k]) for k in ("min", "median", "max")), cex_cell,
            f"{p['negative_control']['detected']} / {p['negative_control']['missed']}", mc_cell,
            f"{p['seconds']['total']:.1f}"]


def _sweep_intro(sw: dict[str, Any]) -> str:
    a, b = sw["seeds"] if sw["seeds"] else (0, 0)
    text = (f"A sweep over the seeds {a}..{b - 1} at scale {sw['scale']} (`python -m verification sweep`; "
            f"{sw['cells']['finished']} of {sw['cells']['requested']} cells finished). A Monte Carlo assertion may "
            f"fail with probability δ = {sw['budget']['delta']:g} when its claim holds (family-wise "
            f"{sw['budget']['family_wise']:g} over the default run); the failures are counted over the seeds and "
            f"bounded by a one-sided Clopper–Pearson bound at level {1 - sw['budget']['alpha']:g}: *confirmed* when "
            "the upper bound is within the budget, *exceeded* when the lower bound is above it, *not resolved* "
            "otherwise.")
    mc = sw.get("monte_carlo")
    if mc:
        text += (f" All {mc['assertions']} Monte Carlo assertions of {', '.join(mc['statements'])} together: a "
                 f"failure at {mc['failures']} of {mc['seeds']} seeds, upper bound {mc['cp_upper']:.3g} against "
                 f"their summed δ = {mc['budget']:.3g} ({mc['status']}; {mc['seeds_to_confirm']} failure-free seeds "
                 "would confirm it).")
    return text


def _sweep_markdown(res: ReportResult) -> list[str]:
    sw = res.sweep
    alpha = sw["budget"]["alpha"]
    lines = ["## Sweep over seeds", "", _sweep_intro(sw), "", "| " + " | ".join(_SWEEP_HEADER) + " |",
             "|" + "---|" * len(_SWEEP_HEADER)]
    lines += ["| " + " | ".join(_sweep_cells(p, alpha)) + " |" for p in sw["statements"]]
    lines.append("")
    lines += figures_markdown(res.sweep_figures, res.sweep_missing)
    return lines


def _sweep_html(res: ReportResult) -> str:
    esc = html.escape
    sw = res.sweep
    alpha = sw["budget"]["alpha"]
    parts = [f"<h2>Sweep over seeds</h2><p>{_inline_html(_sweep_intro(sw))}</p><div class='scroll'><table><tr>"
             + "".join(f"<th>{esc(h)}</th>" for h in _SWEEP_HEADER) + "</tr>"]
    parts += ["<tr>" + "".join(f"<td>{esc(c)}</td>" for c in _sweep_cells(p, alpha)) + "</tr>"
              for p in sw["statements"]]
    parts.append("</table></div>")
    parts += figures_html(res.sweep_figures, res.sweep_missing)
    return "\n".join(parts)


# Wide tables scroll inside their own box (.scroll), so that the page itself never overflows a phone's width.
_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px}
@media (max-width:700px){body{margin:.75em}}
.scroll{overflow-x:auto;max-width:100%}pre{overflow-x:auto}code{overflow-wrap:anywhere}
table{border-collapse:collapse;font-size:14px}td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}
th{background:#f0f0f0}.holds{background:#eaf7ea}.finding{background:#fff4d6;font-weight:bold}
.violated,.vacuous,.error{background:#fde0e0;font-weight:bold}.missed{background:#fde0e0}
figure{display:inline-block;margin:1em 0;max-width:min(640px,100%)}figure img{max-width:100%}
tr.conclusions td{background:#fafafa;font-size:13px}tr.conclusions table{margin:4px 0}
"""


def dashboard_html(res: ReportResult, results, study_results, *, scale: str, seed: int) -> str:
    esc = html.escape
    rows = _dashboard_rows(res, results)
    body = [f"<h1>Theorem dashboard</h1><p>Generated by <code>{esc(res.command)}</code> in {res.seconds:.1f} s. Raw data: <a href='results.json'>results.json</a>, "
            f"<code>worst/</code> (worst cases), <code>counterexamples/</code>; the figure data <code>data/</code> and "
            f"the per-instance <code>instances.csv</code> are written by <code>make report</code> and not committed. "
            f"{esc(scale_note(statement_entries(s for s, _, _ in results), scale))}</p>",
            "<div class='scroll'><table><tr><th>#</th><th>statement</th><th>verdict</th><th>held / excluded</th>"
            "<th>tightness</th>"
            "<th>power</th><th>negative control</th><th>counterexamples</th><th>s</th></tr>"]
    by_id = {row["id"]: row for row in res.rows}
    for r in rows:
        cex = f"<a href='{esc(r['cex_link'])}'>{r['cex']}</a>" if r["cex_link"] else r["cex"]
        rep = f"<br><small>{esc(r['repaired'])}</small>" if r["repaired"] else ""
        body.append(
            f"<tr class='{r['verdict']}'><td>{esc(r['id'])}</td><td>{esc(r['name'])}</td>"
            f"<td class='{r['verdict']}' title='{esc(VERDICT_HELP.get(r['verdict'], ''))}'>{esc(r['verdict'])}{rep}</td>"
            f"<td>{r['held']} / {r['excluded']}</td><td>{r['tightness']}</td><td>{esc(r['power'])}</td>"
            f"<td class='{r['control']}'>{r['control']}</td><td>{cex}</td><td>{r['seconds']}</td></tr>")
        crs = _conclusion_rows(by_id[r["id"]])
        if crs:
            inner = "".join(
                f"<tr><td>{esc(c['name'])}</td><td>{c['kind']}</td><td>{c['tightness']}</td><td>{c['held']}</td>"
                f"<td>{c['cex']}</td><td>{esc(c['power'])}</td><td>{c['detect']}</td><td>{c['search']}</td>"
                f"<td>{esc(c['reason'])}</td></tr>" for c in crs)
            const = _constants_text(by_id[r["id"]])
            body.append(
                f"<tr class='conclusions'><td></td><td colspan='8'><details><summary>{len(crs)} conclusion(s)"
                f"</summary><table><tr><th>conclusion</th><th>kind</th><th>tightness</th><th>held / excluded</th>"
                f"<th>counterexamples</th><th>power</th><th>detection factor</th><th>search best</th>"
                f"<th>reason (weak bounds)</th></tr>{inner}</table>"
                + (f"<p><small>Constants: {esc(const)}</small></p>" if const else "") + "</details></td></tr>")
    body.append("</table></div>")
    body.append(f"<p>Power at factor {POWER_FACTOR}: {esc(_power_totals(res.rows))}. "
                f"{_inline_html(_budget_sentence(res.budget))}</p>")
    findings = _findings(results)
    if findings:
        body.append("<h2>Findings</h2><ul>" + "".join(
            f"<li>{_segments_html(f)}</li>" for f in findings) + "</ul>")
    controls = _control_rows(res, results)
    if controls:
        body.append(
            "<h2>Negative controls</h2><p>Each control breaks a hypothesis (or a constant) on purpose; it is "
            "<i>detected</i> when the monitor flags the broken hypothesis and the conclusion fails on a flagged "
            "instance.</p><div class='scroll'><table><tr><th>statement</th><th>what it breaks</th>"
            "<th>flagged / instances</th><th>conclusion failed</th><th>control</th></tr>" + "".join(
                f"<tr><td>{esc(c['id'])}</td><td>{esc(c['breaks'])}</td><td>{c['flagged']} / {c['instances']}</td>"
                f"<td>{c['failed']}</td><td class='{c['state']}'>{c['state']}</td></tr>" for c in controls)
            + "</table></div>")
    srows = _search_rows(results)
    if srows:
        body.append(
            f"<h2>Falsification search</h2><p>{_inline_html(SEARCH_INTRO)}</p><div class='scroll'><table><tr>"
            + "".join(f"<th>{esc(h)}</th>" for h in SEARCH_COLUMNS) + "</tr>" + "".join(
                f"<tr><td>{esc(c['id'])}</td><td>{esc(c['stored'])}</td><td>{c['evaluations']}</td><td>{c['cex']}</td>"
                f"<td>{esc(c['reach'])}</td></tr>" for c in srows) + "</table></div>")
    per_statement = res.budget.get("per_statement", {})
    body.append("<h2>Confidence-level assertions (one family-wise budget)</h2>" + (
        "<div class='scroll'><table><tr><th>statement</th><th>assertions</th><th>sum of delta</th></tr>" + "".join(
            f"<tr><td>{esc(sid)}</td><td>{v['assertions']}</td><td>{v['delta']:.3g}</td></tr>"
            for sid, v in per_statement.items()) + "</table></div>" if per_statement
        else "<p>None in this run.</p>"))
    cal = _calibration()
    if cal is not None:
        body.append(f"<p>{_inline_html(_calibration_sentence(cal))}</p><div class='scroll'><table><tr><th>statement</th>"
                    "<th>assertion</th><th>N</th><th>delta</th><th>failures / replications</th><th>upper bound</th>"
                    "<th>exact rate</th></tr>" + "".join(
                        f"<tr><td>{esc(c['id'])}</td><td>{esc(c['label'])}</td><td>{c['N']}</td><td>{c['delta']}</td>"
                        f"<td>{esc(c['failures'])}</td><td>{c['upper']}</td><td>{c['exact']}</td></tr>"
                        for c in _calibration_rows(cal)) + "</table></div>")
    body.append("<h2>How to read a verdict</h2><ul>")
    body += [f"<li><b>{k}</b>: {esc(v)}.</li>" for k, v in VERDICT_HELP.items()]
    body.append("</ul><h2>Figures</h2>")
    body += figures_html(res.figures, res.missing_figures)
    if res.sweep is not None:
        body.append(_sweep_html(res))
    if res.llm is not None:
        from verification.report.llm_section import section_html

        body.append(section_html(res.llm))
    if study_results:
        body.append("<h2>Studies the paper did not carry out</h2>")
        for st in study_results:
            body.append(f"<h3>{esc(st.id)}: {esc(st.name)}</h3><p>{_inline_html(st.notes)}</p>"
                        f"<pre>{esc(json.dumps(to_jsonable(st.summary), indent=1)[:3000])}</pre>")
    return ("<!doctype html><html><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'><title>prefalign-verify dashboard</title>"
            f"<style>{_CSS}</style></head><body>" + "\n".join(body) + "</body></html>\n")
