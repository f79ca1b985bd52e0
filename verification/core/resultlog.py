"""Results logs: JSON-lines files that keep a run's results as each statement finishes, read back by ``--resume``.

``python -m verification run --json PATH`` writes its log to ``PATH.jsonl`` (:func:`log_path`) and ``report --out
DIR`` to ``DIR/results.jsonl``. A log holds

* on line 1, the header (:func:`log_header`): ``{"log": "prefalign-verify results", "format": 1, "command":
  "run", "version": "0.1.0", "ids": [...], "seed": 0, "scale": "default"}``: the statements requested, the package
  version and every option that changes the computed rows (:data:`RUN_PARAMETERS`);
* one line per finished statement, in the order they finished: ``{"id": "H.9", "row": {...}}``, where ``row`` is
  the statement's object of ``results.json`` (``report`` adds what it needs to redraw the dashboard, see
  :mod:`verification.report.dashboard`).

Each line is appended with one write, flushed and fsynced before the next statement starts, so a run that is
killed or fails keeps every statement it finished, and leaves at most a truncated last line. :func:`read_log`
reads a log for ``--resume``: it refuses a log whose header differs from the resumed run's (naming what differs),
ignores a truncated last line with a note, and returns the finished records; the resumed run runs the other
statements and writes the same final results as an uninterrupted run.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from sim.cli import atomic_write_text
from verification.core.evidence import to_jsonable

__all__ = [
    "LOG_KIND",
    "LOG_FORMAT",
    "RUN_PARAMETERS",
    "ResultLogError",
    "ResultLog",
    "log_path",
    "log_header",
    "package_version",
    "read_log",
    "open_log",
    "error_row",
    "row_failed",
]

LOG_KIND = "prefalign-verify results"
LOG_FORMAT = 1

#: Options of a command line that change the computed rows: each is recorded in a log's header when the command's
#: arguments have it (the value given: the value there when the command has no such option; ``None``: left out)
#: and a resume refuses a log written with another value. An option that changes results is added here.
RUN_PARAMETERS: dict[str, Any] = {"seed": None, "scale": "default", "jitter": 0.0, "jitter_seed": None}


#: The keys every result row has (``Evidence.to_dict`` and the error rows of :mod:`verification.core.registry`).
RESULT_ROW_KEYS = ("id", "verdict", "tightness", "negative_control", "counterexamples", "seconds")


class ResultLogError(ValueError):
    """A results log that cannot be resumed: unreadable, not a log, corrupt, or written with other parameters."""


def log_path(json_path: str | Path) -> Path:
    """The log of ``run --json PATH``: ``PATH.jsonl`` next to it (``out.json`` -> ``out.json.jsonl``)."""
    p = Path(json_path)
    return p.with_name(p.name + ".jsonl")


def package_version() -> str:
    """The installed version of prefalign-verify (``"unknown"`` when it is not installed)."""
    try:
        return metadata.version("prefalign-verify")
    except metadata.PackageNotFoundError:
        return "unknown"


def log_header(command: str, args: Any, ids: Sequence[str]) -> dict[str, Any]:
    """The header of a log of ``command`` run with the parsed arguments ``args`` (an ``argparse.Namespace`` or any
    object with the attributes of :data:`RUN_PARAMETERS`) on the statements ``ids`` (resolved, in run order)."""
    header: dict[str, Any] = {"log": LOG_KIND, "format": LOG_FORMAT, "command": command,
                              "version": package_version(), "ids": list(ids)}
    for name, default in RUN_PARAMETERS.items():
        value = getattr(args, name, default)
        if value is not None:
            header[name] = value
    return to_jsonable(header)


def _show_ids(ids: Any) -> str:
    if not isinstance(ids, list):
        return repr(ids)
    if len(ids) <= 8:
        return "[" + ", ".join(map(str, ids)) + "]"
    return f"[{len(ids)} statements: {', '.join(map(str, ids[:4]))}, ..., {ids[-1]}]"


_ABSENT = "(absent)"


def _header_differences(found: dict[str, Any], wanted: dict[str, Any]) -> list[str]:
    out = []
    for key in dict.fromkeys([*wanted, *found]):
        a, b = found.get(key, _ABSENT), wanted.get(key, _ABSENT)
        if a == b:
            continue
        if key == "ids":
            out.append(f"statements {_show_ids(a)} in the log, {_show_ids(b)} now")
        else:
            out.append(f"{key} {a!r} in the log, {b!r} now")
    return out


def read_log(path: str | Path, header: dict[str, Any], *, fields: Iterable[str] = ("row",),
             note: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """The finished records of the log ``path`` for a resume of the run described by ``header``.

    Returns ``[]`` (with a note) when there is no log yet. Raises :class:`ResultLogError`, naming the file and
    the line, when the log cannot be read, its header differs from ``header`` (every difference is named), or a
    complete line is not a record of a requested statement with the keys ``fields``. A truncated last line (a run
    killed while writing it) is ignored with a note: its statement runs again."""
    note = note or (lambda _msg: None)
    p = Path(path)
    if not p.exists():
        note(f"note: no results log {str(p)!r} yet: starting from the first statement")
        return []
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise ResultLogError(f"cannot read results log {str(p)!r}: {exc.strerror or exc}") from None
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline
    if tail:
        note(f"note: ignoring the truncated last line of {str(p)!r} ({len(tail)} bytes, left by a run that was "
             "stopped while writing it); its statement runs again")

    def parse(k: int) -> Any:
        try:
            return json.loads(lines[k])
        except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
            raise ResultLogError(f"{str(p)!r} line {k + 1} is not JSON ({exc})") from None

    if not lines:
        raise ResultLogError(f"{str(p)!r} has no header line: not a results log of this program")
    found = parse(0)
    if not isinstance(found, dict) or found.get("log") != LOG_KIND:
        raise ResultLogError(f"{str(p)!r} line 1 is not the header of a {LOG_KIND} log")
    diffs = _header_differences(found, header)
    if diffs:
        raise ResultLogError(f"{str(p)!r} was written with other parameters: {'; '.join(diffs)} "
                             "(run without --resume to start again)")
    wanted = set(header["ids"])
    fields = ("id", *fields)
    records: list[dict[str, Any]] = []
    seen: set[str] = set()
    for k in range(1, len(lines)):
        rec = parse(k)
        missing = [f for f in fields if not isinstance(rec, dict) or f not in rec]
        if missing:
            raise ResultLogError(f"{str(p)!r} line {k + 1} is not a statement record (lacks {', '.join(missing)})")
        sid = rec["id"]
        if "row" in fields:
            row = rec["row"]
            lacks = [f for f in RESULT_ROW_KEYS if not isinstance(row, dict) or f not in row]
            if lacks or row.get("id") != sid:
                raise ResultLogError(f"{str(p)!r} line {k + 1}: its row is not a result row of {sid!r} ("
                                     + (f"lacks {', '.join(lacks)}" if lacks else f"its id is {row.get('id')!r}")
                                     + "); the log is left as it is: run without --resume to start again")
        if sid not in wanted or sid in seen:
            why = "a second record of" if sid in seen else "a record of the unrequested statement"
            raise ResultLogError(f"{str(p)!r} line {k + 1} is {why} {sid!r}")
        seen.add(sid)
        records.append(rec)
    return records


def _line(obj: Any) -> str:
    return json.dumps(to_jsonable(obj), allow_nan=False) + "\n"


class ResultLog:
    """An open results log: created with its header and the records kept from a resumed log (written
    atomically, so a truncated last line is dropped), then one :meth:`append` per finished statement."""

    def __init__(self, path: str | Path, header: dict[str, Any], records: Iterable[dict[str, Any]] = ()):
        self.path = Path(path)
        atomic_write_text(self.path, "".join(_line(x) for x in (header, *records)))

    def append(self, record: dict[str, Any]) -> None:
        """Append ``record`` as one line, flushed and fsynced before returning."""
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(_line(record))
            fh.flush()
            os.fsync(fh.fileno())


def open_log(path: str | Path, header: dict[str, Any], *, resume: bool, fields: Iterable[str] = ("row",),
             note: Callable[[str], None] | None = None) -> tuple[ResultLog, list[dict[str, Any]]]:
    """Start the results log ``path`` of the run described by ``header``: (the open log, the finished records).

    With ``resume`` the finished records of the log there are kept (:func:`read_log`, which may raise
    :class:`ResultLogError`); otherwise a new log replaces any earlier one (with a note when it held records)."""
    p = Path(path)
    if resume:
        kept = read_log(p, header, fields=fields, note=note)
    else:
        kept = []
        if note is not None and p.is_file() and p.stat().st_size and p.read_bytes().count(b"\n") > 1:
            note(f"note: replacing the results log {str(p)!r} of an earlier run (--resume would have continued it)")
    return ResultLog(p, header, kept), kept


def error_row(stmt: Any, exc: BaseException) -> dict[str, Any]:
    """The result row of statement ``stmt`` whose check raised ``exc`` (verdict ``error``)."""
    return {
        "id": stmt.id, "name": stmt.name, "verdict": "error", "tightness": None, "instances": 0, "excluded": 0,
        "negative_control": "none", "counterexamples": 0, "seconds": 0.0, "details": {"error": repr(exc)},
    }


def row_failed(row: dict[str, Any]) -> bool:
    """True iff result ``row`` fails a run: verdict violated, vacuous or error, or a missed negative control."""
    return row["verdict"] in ("violated", "vacuous", "error") or row["negative_control"] == "missed"
