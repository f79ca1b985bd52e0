"""The theorem dashboard and figure report (``python -m verification report``, ``make report``).

Runs every executable statement (and the studies of :mod:`verification.studies`), then writes to ``out_dir``:

* ``results.json`` — one object per statement in the schema of ``python -m verification run``;
* ``instances.csv`` — the raw per-instance conclusion data ``(id, instance, lhs, rhs, ratio)`` of every check;
* ``counterexamples/<id>.json`` — the data to reproduce each counterexample (and each finding's literal and
  repaired evidence);
* ``data/<id>/<table>.csv`` — the figure data the statements and studies report;
* ``figures/*.png`` — seaborn figures, one message each;
* ``README.md`` and ``index.html`` — the dashboard: one row per statement;
* ``results.jsonl`` — the results log (:mod:`verification.resultlog`).

Each statement's own files (its rows of ``instances.csv``, its ``counterexamples/`` and ``data/`` files) are
written as soon as it finishes, and then its record is appended to ``results.jsonl``: its result row and what the
dashboard needs besides (``"report": {"counterexample_file", "repaired", "tables", "instance_rows"}``). The
final files are then assembled from the log and those files (the figure tables read back from ``data/``), the
same way whether every statement ran now or a resumed report (``resume=True``) kept the statements an
interrupted one had finished. The studies are run again on a resume.

Progress goes to stderr while it runs; a one-screen summary is returned for the command line to print.
"""

from __future__ import annotations

import dataclasses
import html
import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd

from sim.cli import atomic_write_text

from . import registry, resultlog
from .evidence import Evidence, to_jsonable
from .resultlog import ResultLogError

__all__ = ["SCALES", "LOG_NAME", "ReportResult", "build_report", "statement_config", "evidence_tables"]

SCALES = ("default", "paper")
#: The results log of a report, in its output folder.
LOG_NAME = "results.jsonl"
INSTANCE_COLUMNS = ("id", "instance", "lhs", "rhs", "ratio")
# read_csv parses floats exactly by default from pandas 3 on; before, only with float_precision="round_trip"
_EXACT_FLOATS: dict[str, Any] = {} if int(pd.__version__.split(".")[0]) >= 3 else {"float_precision": "round_trip"}


@dataclasses.dataclass
class ReportResult:
    out_dir: Path
    rows: list[dict[str, Any]]
    figures: dict[str, str]  # figure file -> caption
    missing_figures: dict[str, str]  # figure name -> why it was not drawn
    seconds: float
    failed: bool

    def summary(self) -> str:
        counts: dict[str, int] = {}
        for r in self.rows:
            counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
        missed = [r["id"] for r in self.rows if r["negative_control"] == "missed"]
        bad = [f"{r['id']} ({r['verdict']})" for r in self.rows if r["verdict"] in ("violated", "vacuous", "error")]
        findings = [r["id"] for r in self.rows if r["verdict"] == "finding"]
        lines = [
            f"report written to {self.out_dir}/ in {self.seconds:.1f} s",
            f"  statements: {len(self.rows)}  " + "  ".join(f"{k}: {v}" for k, v in sorted(counts.items())),
            f"  negative controls detected: "
            f"{sum(r['negative_control'] == 'detected' for r in self.rows)}, missed: {len(missed)}"
            + (f" ({', '.join(missed)})" if missed else ""),
            f"  findings (literal statement false, repaired statement checked): {', '.join(findings) or 'none'}",
            f"  violated / vacuous / error: {', '.join(bad) or 'none'}",
            f"  figures: {len(self.figures)} written"
            + (f", {len(self.missing_figures)} missing: {', '.join(self.missing_figures)}" if self.missing_figures else ""),
            f"  dashboard: {self.out_dir / 'index.html'} and {self.out_dir / 'README.md'}",
        ]
        return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ running


def statement_config(stmt: registry.Statement, scale: str):
    """The Config of ``stmt`` at ``scale``: the default Config, or its ``paper()`` preset where one exists."""
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}; got {scale!r}")
    factory = stmt.config_factory
    if factory is None:
        return None
    if scale == "paper" and hasattr(factory, "paper"):
        return factory.paper()
    return factory()


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _run_one(stmt: registry.Statement, seed: int, scale: str) -> tuple[Evidence | None, dict[str, Any]]:
    """Run one statement: (its Evidence, its result row), or (None, an ``error`` row) when the check raised."""
    try:
        ev = registry.run_statement(stmt, seed=seed, config=statement_config(stmt, scale))
        return ev, ev.to_dict()
    except Exception as exc:  # noqa: BLE001 - reported as an error row; the report goes on
        return None, resultlog.error_row(stmt, exc)


def _progress_line(k: int, n: int, elapsed: float, stmt: registry.Statement, row: dict, source=None) -> str:
    took = f"({row['seconds']:.2f} s)" if source is None else f"(from {source})"
    return (f"[{k:>2}/{n}] {elapsed:6.1f}s  {stmt.id:<8} {row['verdict']:<9} "
            f"negative control: {row['negative_control']:<8} {took}")


def run_all(ids=None, *, seed: int = registry.DEFAULT_SEED, scale: str = "default",
            progress: Callable[[str], None] = _progress) -> list[tuple[registry.Statement, Evidence | None, dict]]:
    """Run the statements (all by default); returns (statement, evidence or None on error, result row)."""
    stmts = registry.resolve(ids)
    out = []
    t_start = time.perf_counter()
    for k, s in enumerate(stmts, 1):
        ev, row = _run_one(s, seed, scale)
        out.append((s, ev, row))
        progress(_progress_line(k, len(stmts), time.perf_counter() - t_start, s, row))
    return out


# ----------------------------------------------------------------------------------------------- writing


def evidence_tables(ev: Evidence) -> dict[str, pd.DataFrame]:
    """Figure-data tables of an Evidence and of its negative control (``details['figure_data']``).

    Tables of the control are prefixed ``control_``; tables of a finding's repaired evidence ``repaired_``."""
    tables: dict[str, pd.DataFrame] = {}

    def grab(e: Evidence | None, prefix: str) -> None:
        if e is None:
            return
        for name, cols in (e.details.get("figure_data") or {}).items():
            try:
                tables[prefix + name] = pd.DataFrame(cols)
            except ValueError:
                continue

    grab(ev, "")
    grab(ev.control, "control_")
    grab(ev.repaired, "repaired_")
    return tables


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)


def _write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(to_jsonable(obj), indent=2, allow_nan=False) + "\n")


def _table_path(out: Path, sid: str, name: str) -> Path:
    return out / "data" / _safe(sid) / f"{_safe(name)}.csv"


def _write_tables(out: Path, sid: str, tables: Mapping[str, pd.DataFrame]) -> None:
    for name, df in tables.items():
        p = _table_path(out, sid, name)
        p.parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(p, index=False)


def _read_tables(out: Path, sid: str, names) -> dict[str, pd.DataFrame]:
    """The tables ``names`` of ``sid`` as :func:`_write_tables` wrote them (floats read back exactly)."""
    tables = {}
    for name in names:
        try:
            tables[name] = pd.read_csv(_table_path(out, sid, name), **_EXACT_FLOATS)
        except pd.errors.EmptyDataError:  # a table without columns
            tables[name] = pd.DataFrame()
    return tables


def _instances_frame(sid: str, ev: Evidence) -> pd.DataFrame:
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(ev.rhs > 0, ev.lhs / ev.rhs, np.nan)
    return pd.DataFrame({"id": sid, "instance": np.arange(ev.lhs.size), "lhs": ev.lhs, "rhs": ev.rhs,
                         "ratio": ratio})


def _append_instances(path: Path, sid: str, ev: Evidence) -> None:
    with open(path, "a", encoding="utf-8", newline="") as fh:
        _instances_frame(sid, ev).to_csv(fh, index=False, header=False, float_format="%.10g", lineterminator="\n")
        fh.flush()
        os.fsync(fh.fileno())


def _start_instances(path: Path, done: Mapping[str, Mapping[str, Any]]) -> None:
    """Begin ``instances.csv``: its header line, then, on a resume, the rows of the finished statements ``done``
    (id -> report record) kept from the earlier file, checked against the row counts the log records."""
    want = {sid: rec["instance_rows"] for sid, rec in done.items() if rec["instance_rows"]}
    counts = dict.fromkeys(want, 0)
    kept = []
    if want:
        try:
            with open(path, encoding="utf-8") as fh:
                fh.readline()  # the header
                for line in fh:
                    sid = line.split(",", 1)[0]
                    if line.endswith("\n") and sid in counts:
                        counts[sid] += 1
                        kept.append(line)
        except OSError as exc:
            raise ResultLogError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from None
    for sid, n in want.items():
        if counts[sid] != n:
            raise ResultLogError(f"{str(path)!r} holds {counts[sid]} rows of {sid}, the results log records {n} "
                                 "(run without --resume to start again)")
    atomic_write_text(path, ",".join(INSTANCE_COLUMNS) + "\n" + "".join(kept))


def _check_statement_files(out: Path, done: Mapping[str, Mapping[str, Any]]) -> None:
    """Raise :class:`ResultLogError` when a file that the log records for a finished statement is missing."""
    for sid, rec in done.items():
        paths = [_table_path(out, sid, name) for name in rec["tables"]]
        if rec["counterexample_file"]:
            paths.append(out / "counterexamples" / f"{_safe(sid)}.json")
        for p in paths:
            if not p.is_file():
                raise ResultLogError(f"{str(p)!r}, written for {sid} by the interrupted report, is missing "
                                     "(run without --resume to start again)")


def _write_statement_files(out: Path, stmt: registry.Statement, ev: Evidence | None) -> dict[str, Any]:
    """Write the files of one finished statement; returns its report record (what the dashboard needs)."""
    rec: dict[str, Any] = {"counterexample_file": False, "repaired": "", "tables": [], "instance_rows": 0}
    if ev is None:
        return rec
    if ev.n_counterexamples or ev.repaired is not None or ev.control is not None:
        _write_json(out / "counterexamples" / f"{_safe(stmt.id)}.json", _counterexample_record(ev))
        rec["counterexample_file"] = True
    tables = evidence_tables(ev)
    _write_tables(out, stmt.id, tables)
    rec["tables"] = list(tables)
    if ev.lhs.size:
        _append_instances(out / "instances.csv", stmt.id, ev)
        rec["instance_rows"] = int(ev.lhs.size)
    rec["repaired"] = _repaired_cell(ev)
    return rec


def _counterexample_record(ev: Evidence) -> dict[str, Any]:
    rec = {"id": ev.id, "name": ev.name, "verdict": ev.verdict, "n_counterexamples": ev.n_counterexamples,
           "counterexamples": ev.counterexamples}
    if ev.repaired is not None:
        rec["repaired"] = {"verdict": ev.repaired.verdict, "tightness": ev.repaired.tightness,
                           "n_counterexamples": ev.repaired.n_counterexamples,
                           "counterexamples": ev.repaired.counterexamples}
    if ev.control is not None:
        rec["negative_control"] = {"detected": ev.control.control_detected,
                                   "n_counterexamples": ev.control.n_counterexamples,
                                   "counterexamples": ev.control.counterexamples[:5],
                                   "details": ev.control.details}
    return rec


def build_report(out_dir: str | Path = "reports", *, scale: str = "default", seed: int = registry.DEFAULT_SEED,
                 ids=None, studies: bool = True, progress: Callable[[str], None] = _progress,
                 resume: bool = False) -> ReportResult:
    """Run every check (and the studies) and write the report to ``out_dir`` (see the module docstring).

    With ``resume=True`` the statements recorded in ``out_dir/results.jsonl`` by an interrupted report with the
    same ids, scale, seed and package version are not run again; a log that cannot be resumed raises
    :class:`~verification.resultlog.ResultLogError` before any statement runs."""
    from . import figures  # plotting is imported only when a report is made

    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}; got {scale!r}")
    stmts = registry.resolve(ids)
    t0 = time.perf_counter()
    out = Path(out_dir)
    log_file = out / LOG_NAME
    header = resultlog.log_header("report", SimpleNamespace(seed=seed, scale=scale), [s.id for s in stmts])
    out.mkdir(parents=True, exist_ok=True)
    log, kept = resultlog.open_log(log_file, header, resume=resume, fields=("row", "report"), note=progress)
    done = {r["id"]: r for r in kept}
    _check_statement_files(out, {sid: r["report"] for sid, r in done.items()})
    _start_instances(out / "instances.csv", {sid: r["report"] for sid, r in done.items()})
    progress(f"running the executable statements (scale {scale}, seed {seed}) ..."
             + (f" {len(done)} of {len(stmts)} already finished in {log_file}" if done else ""))
    results = []  # (statement, report record, result row)
    for k, s in enumerate(stmts, 1):
        rec = done.get(s.id)
        if rec is None:
            ev, row = _run_one(s, seed, scale)
            rec = {"id": s.id, "row": to_jsonable(row), "report": _write_statement_files(out, s, ev)}
            log.append(rec)
        results.append((s, rec["report"], rec["row"]))
        progress(_progress_line(k, len(stmts), time.perf_counter() - t0, s, rec["row"],
                                source=log_file if s.id in done else None))
    rows = [r for _, _, r in results]
    _write_json(out / "results.json", rows)
    tables = {s.id: _read_tables(out, s.id, rec["tables"]) for s, rec, _ in results if rec["tables"]}

    study_results = []
    if studies:
        try:
            from . import studies as studies_mod
        except ImportError:
            studies_mod = None
        if studies_mod is not None:
            progress("running the studies ...")
            for st in studies_mod.run_studies(seed=seed):
                study_results.append(st)
                tables[st.id] = dict(st.tables)
                _write_tables(out, st.id, st.tables)
                progress(f"  {st.id}: {', '.join(st.tables)}")
            _write_json(out / "studies.json", [{"id": st.id, "name": st.name, "summary": st.summary,
                                                "notes": st.notes} for st in study_results])

    progress("drawing the figures ...")
    fig_dir = out / "figures"
    drawn, missing = figures.draw_all(fig_dir, rows, tables)
    seconds = time.perf_counter() - t0
    res = ReportResult(out_dir=out, rows=rows, figures=drawn, missing_figures=missing, seconds=seconds,
                       failed=any(map(resultlog.row_failed, rows)))
    atomic_write_text(out / "README.md", dashboard_markdown(res, results, study_results, scale=scale, seed=seed))
    atomic_write_text(out / "index.html", dashboard_html(res, results, study_results, scale=scale, seed=seed))
    return res


# --------------------------------------------------------------------------------------------- dashboard

VERDICT_HELP = {
    "holds": "the conclusion held on every instance where the monitored hypotheses held",
    "violated": "a counterexample with every hypothesis satisfied",
    "finding": "the literal statement is false (counterexample shown); the repaired statement holds",
    "vacuous": "every instance was excluded: the check tested nothing (a failure of the test design)",
    "error": "the check raised an exception",
}


def _fmt(t) -> str:
    if t is None:
        return "–"
    if isinstance(t, str):
        return t
    return f"{t:.4g}"


def _repaired_cell(ev: Evidence | None) -> str:
    if ev is None or ev.repaired is None:
        return ""
    r = ev.repaired
    return f"repaired: {r.verdict}, tightness {_fmt(r.tightness)}"


def _dashboard_rows(res: ReportResult, results) -> list[dict[str, str]]:
    """One dashboard row per (statement, report record, result row) of ``results``."""
    out = []
    for s, rec, row in results:
        has_file = rec["counterexample_file"]
        out.append({
            "number": s.number, "id": s.id, "name": s.name, "verdict": row["verdict"],
            "held": str(row["instances"] - row["excluded"]), "excluded": str(row["excluded"]),
            "tightness": _fmt(row["tightness"]), "control": row["negative_control"],
            "cex": str(row["counterexamples"]),
            "cex_link": f"counterexamples/{_safe(s.id)}.json" if has_file else "",
            "seconds": f"{row['seconds']:.2f}", "repaired": rec["repaired"],
        })
    return out


def _scale_note(results, scale: str) -> str:
    with_paper = [s.id for s, _, _ in results if s.config_factory is not None and hasattr(s.config_factory, "paper")]
    if scale == "paper":
        return (f"Paper-scale presets were used for {', '.join(with_paper) or 'no statement'}; the other checks ran "
                "at their default configuration.")
    return f"Default configurations (paper-scale presets exist for {', '.join(with_paper) or 'no statement'})."


def dashboard_markdown(res: ReportResult, results, study_results, *, scale: str, seed: int) -> str:
    rows = _dashboard_rows(res, results)
    lines = [
        "# Theorem dashboard",
        "",
        f"Generated by `python -m verification report --scale {scale} --seed {seed}` in {res.seconds:.1f} s. "
        "One row per statement of the appendix (THEOREMS.md numbering). Raw data: `results.json`, "
        "`instances.csv`, `data/`; counterexamples: `counterexamples/`. " + _scale_note(results, scale),
        "",
        "| # | statement | verdict | hypotheses held / excluded | tightness | negative control | counterexamples | s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        verdict = f"**{r['verdict'].upper()}**" if r["verdict"] != "holds" else r["verdict"]
        if r["repaired"]:
            verdict += f" ({r['repaired']})"
        cex = f"[{r['cex']}]({r['cex_link']})" if r["cex_link"] else r["cex"]
        lines.append(f"| {r['id']} | {r['name']} | {verdict} | {r['held']} / {r['excluded']} | {r['tightness']} | "
                     f"{r['control']} | {cex} | {r['seconds']} |")
    lines += ["", "## How to read a verdict", ""]
    lines += [f"* **{k}**: {v}." for k, v in VERDICT_HELP.items()]
    lines += [
        "* **tightness**: the largest observed ratio lhs / rhs of the conclusion `lhs ≤ rhs` over the instances "
        "where the hypotheses held (1 means the bound is attained; above 1 means violated).",
        "* **negative control**: a setting that breaks a hypothesis on purpose; *detected* means the monitor "
        "flagged the hypothesis and the conclusion was seen to fail, so the check can fail.",
        "",
        "## Figures",
        "",
    ]
    for f, cap in res.figures.items():
        lines += [f"![{cap}](figures/{f})", "", f"*{cap}*", ""]
    for f, why in res.missing_figures.items():
        lines += [f"* figure `{f}` not drawn: {why}"]
    if study_results:
        lines += ["", "## Studies the paper did not carry out", ""]
        for st in study_results:
            lines += [f"### {st.id}: {st.name}", "", st.notes, "", "```",
                      json.dumps(to_jsonable(st.summary), indent=1)[:2000], "```", ""]
    return "\n".join(lines) + "\n"


_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px}
table{border-collapse:collapse;font-size:14px}td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}
th{background:#f0f0f0}.holds{background:#eaf7ea}.finding{background:#fff4d6;font-weight:bold}
.violated,.vacuous,.error{background:#fde0e0;font-weight:bold}.missed{background:#fde0e0}
figure{display:inline-block;margin:1em;max-width:640px}figure img{max-width:100%}
"""


def dashboard_html(res: ReportResult, results, study_results, *, scale: str, seed: int) -> str:
    esc = html.escape
    rows = _dashboard_rows(res, results)
    body = [f"<h1>Theorem dashboard</h1><p>Generated by <code>python -m verification report --scale {esc(scale)} "
            f"--seed {seed}</code> in {res.seconds:.1f} s. Raw data: <a href='results.json'>results.json</a>, "
            f"<a href='instances.csv'>instances.csv</a>, <code>data/</code>. {esc(_scale_note(results, scale))}</p>",
            "<table><tr><th>#</th><th>statement</th><th>verdict</th><th>held / excluded</th><th>tightness</th>"
            "<th>negative control</th><th>counterexamples</th><th>s</th></tr>"]
    for r in rows:
        cex = f"<a href='{esc(r['cex_link'])}'>{r['cex']}</a>" if r["cex_link"] else r["cex"]
        rep = f"<br><small>{esc(r['repaired'])}</small>" if r["repaired"] else ""
        body.append(
            f"<tr class='{r['verdict']}'><td>{esc(r['id'])}</td><td>{esc(r['name'])}</td>"
            f"<td class='{r['verdict']}' title='{esc(VERDICT_HELP.get(r['verdict'], ''))}'>{esc(r['verdict'])}{rep}</td>"
            f"<td>{r['held']} / {r['excluded']}</td><td>{r['tightness']}</td>"
            f"<td class='{r['control']}'>{r['control']}</td><td>{cex}</td><td>{r['seconds']}</td></tr>")
    body.append("</table><h2>How to read a verdict</h2><ul>")
    body += [f"<li><b>{k}</b>: {esc(v)}.</li>" for k, v in VERDICT_HELP.items()]
    body.append("</ul><h2>Figures</h2>")
    body += [f"<figure><img src='figures/{esc(f)}' alt='{esc(c)}'><figcaption>{esc(c)}</figcaption></figure>"
             for f, c in res.figures.items()]
    if res.missing_figures:
        body.append("<ul>" + "".join(f"<li>figure <code>{esc(f)}</code> not drawn: {esc(w)}</li>"
                                     for f, w in res.missing_figures.items()) + "</ul>")
    if study_results:
        body.append("<h2>Studies the paper did not carry out</h2>")
        for st in study_results:
            body.append(f"<h3>{esc(st.id)}: {esc(st.name)}</h3><p>{esc(st.notes)}</p>"
                        f"<pre>{esc(json.dumps(to_jsonable(st.summary), indent=1)[:3000])}</pre>")
    return ("<!doctype html><html><head><meta charset='utf-8'><title>prefalign-verify dashboard</title>"
            f"<style>{_CSS}</style></head><body>" + "\n".join(body) + "</body></html>\n")
