"""Bound regression: compare a run with an earlier ``results.json`` (the schema of ``python -m verification run``).

A comparison fails when, for a statement present in both runs,

* the verdict changes from ``holds`` (or ``finding``) to anything else (``violated``, ``vacuous``, ``error``),
  or from ``finding`` to ``holds`` (the expected counterexample is no longer shown);
* a negative control that was ``detected`` is no longer detected;
* the number of counterexamples changes (a finding that shows 189 counterexamples where the baseline showed 195
  has changed, even if the verdict has not);
* the tightness moves by more than ``atol + rtol·|baseline|`` (default ``rtol = 1e-3``, ``atol = 1e-9``): every
  check is deterministic given its seed, so a change past round-off means the numbers changed. A row that states a
  ``tightness_floor`` (an identity whose tightness is a residual, i.e. roundoff: H.5, H.6) is compared against that
  absolute floor instead: it fails only when the tightness rises above the floor; any two values below it are
  roundoff and compare equal.

Fields compared, and how: ``verdict`` (exactly, with the rules above), ``negative_control`` (detected must stay
detected), ``counterexamples`` (exactly), ``tightness`` (relative tolerance, or the row's absolute floor).
``instances``, ``excluded``, ``seconds`` and ``details`` are not compared.

Statements only in the current run are reported as new; statements only in the baseline are reported as not
run (a subset run is allowed). Neither fails the comparison.

The package ships the baseline of the default run (every statement, seed 0, the versions of ``constraints.txt``)
as :func:`shipped_baseline`; ``run --shipped-baseline`` compares with it, so an installation can check that it
reproduces the project's numbers.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from verification.core.evidence import NEGATIVE_CONTROL_STATES, VERDICTS

__all__ = ["TIGHTNESS_RTOL", "TIGHTNESS_ATOL", "Regression", "compare", "load_results", "check_rows",
           "shipped_baseline", "SHIPPED_BASELINE"]

#: Where the shipped baseline lives inside the package (``verification/data/``).
SHIPPED_BASELINE = "data/baseline_results.json"


def shipped_baseline() -> Path:
    """The path of the baseline shipped with the package: the results of the default run of every statement
    (``prefalign verify run --json``, seed 0) at the pinned versions of ``constraints.txt``, read from the installed
    package (``importlib.resources``), not from a checkout."""
    path = resources.files("verification").joinpath(SHIPPED_BASELINE)
    if not path.is_file():
        raise FileNotFoundError(f"the shipped baseline {SHIPPED_BASELINE!r} is missing from the verification "
                                "package: reinstall prefalign-verify")
    return Path(str(path))

TIGHTNESS_RTOL = 1e-3
TIGHTNESS_ATOL = 1e-9
_GOOD = ("holds", "finding")


@dataclass
class Regression:
    """Outcome of a comparison: ``failures`` (each a sentence), ``changes`` within tolerance, new/missing ids."""

    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    new: list[str] = field(default_factory=list)
    not_run: list[str] = field(default_factory=list)
    compared: int = 0

    @property
    def ok(self) -> bool:
        return not self.failures

    def summary(self) -> str:
        lines = [f"baseline comparison: {self.compared} statement(s) compared, "
                 f"{len(self.failures)} regression(s)"]
        lines += [f"  REGRESSION {f}" for f in self.failures]
        lines += [f"  note {n}" for n in self.notes]
        if self.new:
            lines.append(f"  new (not in the baseline): {', '.join(self.new)}")
        if self.not_run:
            lines.append(f"  in the baseline but not run: {', '.join(self.not_run)}")
        return "\n".join(lines)


def load_results(path: str | Path) -> list[dict[str, Any]]:
    """Read a results JSON list; raises ``ValueError`` naming the file (and, for a bad row, the statement id and the
    field) when it is not of the run schema (:func:`check_rows`)."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except OSError as exc:
        raise ValueError(f"cannot read baseline {str(p)!r}: {exc.strerror or exc}") from exc
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise ValueError(f"baseline {str(p)!r} is not JSON: {exc}") from exc
    if not isinstance(data, list) or not all(isinstance(r, dict) and "id" in r and "verdict" in r for r in data):
        raise ValueError(f"baseline {str(p)!r} is not a results list (objects with 'id' and 'verdict')")
    check_rows(data, f"baseline {str(p)!r}")
    return data


_VERDICTS = (*VERDICTS, "error")
_NONFINITE = ("nan", "inf", "-inf")


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _row_problem(row: dict[str, Any]) -> tuple[str, str] | None:
    """(field, what it must be) for the first field of ``row`` outside the run schema, or None."""
    if not isinstance(row["id"], str) or not row["id"]:
        return "id", "a non-empty string"
    if row["verdict"] not in _VERDICTS:
        return "verdict", f"one of {', '.join(_VERDICTS)}"
    if row.get("negative_control", "none") not in NEGATIVE_CONTROL_STATES:
        return "negative_control", f"one of {', '.join(NEGATIVE_CONTROL_STATES)}"
    t = row.get("tightness")
    if not (t is None or _is_number(t) or t in _NONFINITE):
        return "tightness", "a number, null or one of 'nan', 'inf', '-inf'"
    for name in ("instances", "excluded", "counterexamples"):
        v = row.get(name, 0)
        if not (isinstance(v, int) and not isinstance(v, bool) and v >= 0):
            return name, "an integer >= 0"
    v = row.get("seconds", 0.0)
    if not (_is_number(v) and math.isfinite(v) and v >= 0):
        return "seconds", "a finite number >= 0"
    return None


def check_rows(rows: list[dict[str, Any]], source: str) -> None:
    """Check result rows (objects with ``id`` and ``verdict``) against the schema of ``python -m verification
    run``; raises ``ValueError`` naming ``source``, the statement id and the field of the first bad value, or the
    first id that occurs twice. Fields other than the schema's are not checked."""
    seen: set[Any] = set()
    for k, row in enumerate(rows):
        problem = _row_problem(row)
        where = f"statement {row['id']!r}" if problem is None or problem[0] != "id" else f"row {k}"
        if problem is not None:
            name, must = problem
            raise ValueError(f"{source}: {where}: field {name!r} must be {must}; got {row.get(name)!r}")
        if row["id"] in seen:
            raise ValueError(f"{source}: statement {row['id']!r} occurs twice")
        seen.add(row["id"])


def _tightness(row: dict) -> float | None:
    """The row's tightness as a float (``"nan"``, ``"inf"``, ``"-inf"``: the JSON spelling of non-finite values);
    None when the row has none."""
    t = row.get("tightness")
    if t is None:
        return None
    return float(t)


def compare(current: list[dict[str, Any]], baseline: list[dict[str, Any]], *,
            rtol: float = TIGHTNESS_RTOL, atol: float = TIGHTNESS_ATOL) -> Regression:
    """Compare ``current`` with ``baseline`` result rows (see the module docstring for the rules)."""
    if rtol < 0 or atol < 0:
        raise ValueError(f"tolerances must be >= 0; got rtol={rtol!r}, atol={atol!r}")
    base = {r["id"]: r for r in baseline}
    cur = {r["id"]: r for r in current}
    out = Regression()
    out.new = [i for i in cur if i not in base]
    out.not_run = [i for i in base if i not in cur]
    for sid, row in cur.items():
        if sid not in base:
            continue
        b = base[sid]
        out.compared += 1
        v0, v1 = b["verdict"], row["verdict"]
        if v0 in _GOOD and v1 != v0:
            out.failures.append(f"{sid}: verdict {v0} -> {v1}")
        elif v0 != v1:
            out.notes.append(f"{sid}: verdict {v0} -> {v1}")
        n0, n1 = b.get("negative_control", "none"), row.get("negative_control", "none")
        if n0 == "detected" and n1 != "detected":
            out.failures.append(f"{sid}: negative control {n0} -> {n1}")
        c0, c1 = b.get("counterexamples"), row.get("counterexamples")
        if c0 is not None and c1 is not None and c0 != c1:
            out.failures.append(f"{sid}: counterexamples {c0} -> {c1}")
        t0, t1 = _tightness(b), _tightness(row)
        if t0 is None and t1 is None:
            continue
        floor = b.get("tightness_floor", row.get("tightness_floor"))
        if floor is not None and t0 is not None and t1 is not None and t0 <= floor:
            if t1 > floor:
                out.failures.append(
                    f"{sid}: tightness {t0:.6g} -> {t1:.6g} rose above the roundoff floor {floor:.3g} of this residual"
                )
            elif t1 != t0:
                out.notes.append(f"{sid}: tightness {t0:.3g} -> {t1:.3g} (both below the roundoff floor {floor:.3g})")
            continue
        if t0 is None or t1 is None:  # one row has a tightness, the other has none
            out.failures.append(f"{sid}: tightness {t0} -> {t1}")
            continue
        if not (math.isfinite(t0) and math.isfinite(t1)):
            if t0 != t1:
                out.failures.append(f"{sid}: tightness {t0} -> {t1}")
            continue
        allowed = atol + rtol * abs(t0)
        if abs(t1 - t0) > allowed:
            direction = "tighter (closer to the bound)" if t1 > t0 else "looser"
            out.failures.append(
                f"{sid}: tightness {t0:.6g} -> {t1:.6g} ({direction}; |change| {abs(t1 - t0):.3g} > "
                f"tolerance {allowed:.3g})"
            )
        elif t1 != t0:
            out.notes.append(f"{sid}: tightness {t0:.6g} -> {t1:.6g} (within tolerance)")
    return out
