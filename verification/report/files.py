"""What the report writes for one finished statement, and reads back: its result files in the report's folder.

A statement cell (:mod:`verification.report.cells`) and the serial report (:mod:`verification.report.dashboard`)
both end a statement with :func:`statement_files` (its ``worst/`` and ``counterexamples/`` records, its figure
tables as CSV text, its rows of ``instances.csv``: JSON-ready, so that a Dask worker can return it), and the
report writes them with :func:`write_statement_files`. Below both of them and above the checks: it imports
:mod:`verification.core` only.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.cli import atomic_write_text
from verification.core import registry
from verification.core.evidence import POWER_FACTOR, Evidence, kept_counterexamples, to_jsonable
from verification.core.resultlog import ResultLogError
from verification.report.markup import fmt

__all__ = ["INSTANCE_COLUMNS", "evidence_tables", "statement_files", "write_statement_files", "safe_name",
           "write_json", "table_path", "write_tables", "read_tables", "start_instances", "check_statement_files"]

INSTANCE_COLUMNS = ("id", "instance", "lhs", "rhs", "ratio", "conclusion")
# read_csv parses floats exactly by default from pandas 3 on; before, only with float_precision="round_trip"
_EXACT_FLOATS: dict[str, Any] = {} if int(pd.__version__.split(".")[0]) >= 3 else {"float_precision": "round_trip"}


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


def safe_name(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)


def write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(to_jsonable(obj), indent=2, allow_nan=False) + "\n")


def table_path(out: Path, sid: str, name: str) -> Path:
    return out / "data" / safe_name(sid) / f"{safe_name(name)}.csv"


def write_tables(out: Path, sid: str, tables: Mapping[str, pd.DataFrame]) -> None:
    for name, df in tables.items():
        p = table_path(out, sid, name)
        p.parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(p, index=False)


def read_tables(out: Path, sid: str, names) -> dict[str, pd.DataFrame]:
    """The tables ``names`` of ``sid`` as :func:`write_tables` wrote them (floats read back exactly)."""
    tables = {}
    for name in names:
        try:
            tables[name] = pd.read_csv(table_path(out, sid, name), **_EXACT_FLOATS)
        except pd.errors.EmptyDataError:  # a table without columns
            tables[name] = pd.DataFrame()
    return tables


def _instances_frame(sid: str, ev: Evidence) -> pd.DataFrame:
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(ev.rhs > 0, ev.lhs / ev.rhs, np.nan)
    return pd.DataFrame({"id": sid, "instance": np.arange(ev.lhs.size), "lhs": ev.lhs, "rhs": ev.rhs,
                         "ratio": ratio, "conclusion": ev.labels})


def _csv_floats(x: np.ndarray) -> list[str]:
    """``x`` as ``DataFrame.to_csv(float_format="%.10g")`` writes it: ``%.10g`` per entry, NaN as an empty field."""
    return ["" if v != v else f"{v:.10g}" for v in np.asarray(x, dtype=np.float64).tolist()]


def _instances_text(sid: str, ev: Evidence) -> str:
    """The rows of ``sid`` in ``instances.csv``: the bytes of ``_instances_frame(sid, ev).to_csv(...,
    float_format="%.10g")`` without the header (a test holds them equal), written by the csv module from
    preformatted columns, several times faster than pandas' per-cell formatter on the report's 10⁶ rows."""
    frame = _instances_frame(sid, ev)
    cols = [[sid] * len(frame), frame["instance"].tolist(), _csv_floats(frame["lhs"].to_numpy()),
            _csv_floats(frame["rhs"].to_numpy()), _csv_floats(frame["ratio"].to_numpy()),
            ["" if c is None or c != c else c for c in frame["conclusion"].tolist()]]
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(zip(*cols, strict=True))
    return buf.getvalue()


def _append_text(path: Path, text: str) -> None:
    """Append ``text`` to the file ``path`` and flush it to disk."""
    with open(path, "a", encoding="utf-8", newline="") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


def start_instances(path: Path, done: Mapping[str, Mapping[str, Any]]) -> None:
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


def check_statement_files(out: Path, done: Mapping[str, Mapping[str, Any]]) -> None:
    """Raise :class:`ResultLogError` when a file that the log records for a finished statement is missing."""
    for sid, rec in done.items():
        paths = [table_path(out, sid, name) for name in rec["tables"]]
        if rec["counterexample_file"]:
            paths.append(out / "counterexamples" / f"{safe_name(sid)}.json")
        for p in paths:
            if not p.is_file():
                raise ResultLogError(f"{str(p)!r}, written for {sid} by the interrupted report, is missing "
                                     "(run without --resume to start again)")


def statement_files(stmt: registry.Statement, ev: Evidence | None, search=None) -> dict[str, Any]:
    """What the report writes for one finished statement, JSON-ready (a statement cell's result,
    :mod:`verification.report.cells`): ``report``, its report record (what the dashboard needs); ``json``, the
    JSON files (path in the report folder -> object); ``tables``, the figure tables as the text of their CSV files;
    ``instances``, its rows of ``instances.csv``. :func:`write_statement_files` writes them."""
    rec: dict[str, Any] = {"counterexample_file": False, "repaired": "", "tables": [], "instance_rows": 0,
                           "worst_file": False}
    files: dict[str, Any] = {"report": rec, "json": {}, "tables": {}, "instances": ""}
    if ev is None:
        return to_jsonable(files)
    if any(c.numeric for c in ev.conclusions):
        files["json"][f"worst/{safe_name(stmt.id)}.json"] = _worst_record(ev, search)
        rec["worst_file"] = True
    if ev.n_counterexamples or ev.repaired is not None or ev.control is not None:
        files["json"][f"counterexamples/{safe_name(stmt.id)}.json"] = _counterexample_record(ev)
        rec["counterexample_file"] = True
        rec["counterexamples_kept"] = len(ev.counterexamples)
    tables = evidence_tables(ev)
    files["tables"] = {name: df.to_csv(index=False) for name, df in tables.items()}
    rec["tables"] = list(tables)
    if ev.lhs.size:
        files["instances"] = _instances_text(stmt.id, ev)
        rec["instance_rows"] = int(ev.lhs.size)
    rec["repaired"] = repaired_cell(ev)
    return to_jsonable(files)


def write_statement_files(out: Path, stmt_id: str, files: Mapping[str, Any]) -> dict[str, Any]:
    """Write the files of one finished statement (:func:`statement_files`): its JSON files, its figure tables under
    ``data/<id>/``, its rows appended to ``instances.csv``; returns its report record."""
    for rel, obj in files["json"].items():
        write_json(out / rel, obj)
    for name, text in files["tables"].items():
        p = table_path(out, stmt_id, name)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
    if files["instances"]:
        _append_text(out / "instances.csv", files["instances"])
    return dict(files["report"])


def _counterexample_record(ev: Evidence) -> dict[str, Any]:
    rec = {"id": ev.id, "name": ev.name, "verdict": ev.verdict, "n_counterexamples": ev.n_counterexamples,
           **kept_counterexamples(ev.n_counterexamples, len(ev.counterexamples)),
           "counterexamples": ev.counterexamples}
    if ev.repaired is not None:
        rec["repaired"] = {"verdict": ev.repaired.verdict, "tightness": ev.repaired.tightness,
                           "n_counterexamples": ev.repaired.n_counterexamples,
                           **kept_counterexamples(ev.repaired.n_counterexamples, len(ev.repaired.counterexamples)),
                           "counterexamples": ev.repaired.counterexamples}
    if ev.control is not None:
        kept = ev.control.counterexamples[:5]
        rec["negative_control"] = {"detected": ev.control.control_detected,
                                   "n_counterexamples": ev.control.n_counterexamples,
                                   **kept_counterexamples(ev.control.n_counterexamples, len(kept)),
                                   "counterexamples": kept,
                                   "details": ev.control.details}
    return rec


def _worst_record(ev: Evidence, search) -> dict[str, Any]:
    """``worst/<id>.json``: per numeric conclusion the check's instance with the largest detection factor and, when
    the falsification search ran, its best point (parameters, Config, seed and instance)."""
    rec: dict[str, Any] = {"id": ev.id, "name": ev.name, "power_factor": POWER_FACTOR, "conclusions": {}}
    for c in ev.conclusions:
        if not c.numeric:
            continue
        entry: dict[str, Any] = {"kind": c.kind, "role": c.role, "check": {"detect_factor": c.detect_factor,
                                                                           "instance": c.worst}}
        if search is not None and c.name in search.best:
            entry["search"] = search.best[c.name]
        if c.reason:
            entry["reason"] = c.reason
        rec["conclusions"][c.name] = entry
    if search is not None:
        rec["search"] = search.summary()
        if search.stored is not None and "date" in search.stored:  # the stored search's date and budget, at the top
            rec["search"]["date"] = search.stored["date"]
            rec["search"]["stored_budget"] = search.stored["budget"]
        stmt = registry.get_statement(ev.id)
        if stmt.search is not None:
            rec["search"]["reach"] = stmt.search.reach()
        rec.update(kept_counterexamples(search.n_counterexamples, len(search.counterexamples)))
        rec["search_counterexamples"] = search.counterexamples
        rec["reproduce"] = ("verification.core.registry.get_statement(id).run(Config(**config), "
                            "numpy.random.default_rng(seed)) with the module's Config")
    return rec


def repaired_cell(ev: Evidence | None) -> str:
    """The dashboard's note on a finding's repaired statement: its verdict and tightness (empty without one)."""
    if ev is None or ev.repaired is None:
        return ""
    r = ev.repaired
    return f"repaired: {r.verdict}, tightness {fmt(r.tightness)}"
