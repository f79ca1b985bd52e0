r"""The power report: does each conclusion detect a bound that is too small (``python -m verification power``)?

For every statement the check runs twice with the same seed: as is, and under
:func:`verification.core.evidence.bound_factor` ``(f)``, where every numeric bound of a conclusion becomes
``rhs − (1 − f)|rhs|`` (Monte Carlo bounds ``f·b``, with the cap scaled alike). A numeric conclusion *detects* the
weakened bound iff the re-run shows counterexamples of that conclusion that the plain run did not. The data of the
plain run predicts it — the conclusion's detection factor (``max 1 − (rhs − lhs)/|rhs|``, or the Monte Carlo
crossing factor) exceeds ``f`` — and the report says where re-run and prediction disagree. Identity residuals and
boolean conclusions have no bound to weaken: they are marked as such, not counted as weak.

A numeric conclusion that does not detect the weakened bound is listed with the falsification search's best
ratio on its family (:mod:`verification.core.search`) and the reason the statement gives (its ``REASONS``) why the bound
cannot be approached there. The command exits 0 iff every numeric conclusion detects the weakened bound or is
listed with a reason, no prediction disagrees with its re-run, and no check raised.
"""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from verification.core import registry
from verification.core.evidence import POWER_FACTOR, Evidence, bound_factor, to_jsonable

__all__ = ["PowerRow", "PowerReport", "power_report"]


@dataclass
class PowerRow:
    """One conclusion of one statement in the power report."""

    id: str
    conclusion: str
    kind: str
    role: str
    status: str  # detected / weak / identity residual / boolean conclusion / violated / literal (finding) / error
    detect_factor: float | None = None
    predicted: bool | None = None  # detect_factor > factor
    counterexamples: int = 0  # at factor 1
    counterexamples_scaled: int = 0  # at the factor
    search_best_ratio: float | None = None
    search_params: dict | None = None
    reason: str | None = None

    @property
    def mismatch(self) -> bool:
        return self.predicted is not None and self.status in ("detected", "weak") and \
            self.predicted != (self.status == "detected")


@dataclass
class PowerReport:
    factor: float
    seed: int
    search: str
    rows: list[PowerRow] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def weak_without_reason(self) -> list[PowerRow]:
        """Weak contract conclusions without a stated reason (soft rows are reported, not part of the contract)."""
        return [r for r in self.rows if r.status == "weak" and not r.reason and r.role == "contract"]

    @property
    def mismatches(self) -> list[PowerRow]:
        return [r for r in self.rows if r.mismatch]

    @property
    def ok(self) -> bool:
        return not (self.weak_without_reason or self.mismatches or self.errors)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.rows:
            out[r.status] = out.get(r.status, 0) + 1
        return out

    def table(self) -> str:
        head = ("id", "conclusion", "kind", "power", "ratio", "search best", "reason")
        cells = []
        for r in self.rows:
            cells.append([r.id, r.conclusion if len(r.conclusion) <= 60 else r.conclusion[:57] + "...",
                          r.kind, r.status + (" (soft)" if r.role == "soft" else "")
                          + (" (predicted otherwise)" if r.mismatch else ""),
                          _fmt(r.detect_factor), _fmt(r.search_best_ratio),
                          "" if r.status not in ("weak",) else (r.reason or "NO REASON GIVEN")[:90]])
        widths = [max(len(h), *(len(c[k]) for c in cells)) if cells else len(h) for k, h in enumerate(head)]

        def line(vals):
            return "  ".join(v.ljust(w) for v, w in zip(vals, widths, strict=True)).rstrip()

        return "\n".join([line(head), line(["-" * w for w in widths])] + [line(c) for c in cells])

    def summary(self) -> str:
        numeric = [r for r in self.rows if r.status in ("detected", "weak") and r.role == "contract"]
        det = sum(r.status == "detected" for r in numeric)
        lines = [f"power at factor {self.factor:g} (seed {self.seed}, search {self.search}) in {self.seconds:.1f} s: "
                 f"{det}/{len(numeric)} numeric conclusions detect the weakened bound; "
                 f"{len(numeric) - det} weak ({len(self.weak_without_reason)} without a reason)",
                 "  states: " + ", ".join(f"{k}: {v}" for k, v in sorted(self.counts().items()))]
        if self.mismatches:
            lines.append("  prediction and re-run disagree: " + ", ".join(f"{r.id}/{r.conclusion}"
                                                                         for r in self.mismatches))
        if self.errors:
            lines.append("  errors: " + ", ".join(f"{k} ({v})" for k, v in self.errors.items()))
        return "\n".join(lines)

    def to_json(self) -> list[dict[str, Any]]:
        return to_jsonable([{**asdict(r), "factor": self.factor, "mismatch": r.mismatch} for r in self.rows])


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.3g}"


def rows_of(base: Evidence, scaled: Evidence | None, factor: float, search=None) -> list[PowerRow]:
    """Power rows of one statement from its plain run ``base`` and its run under ``bound_factor(factor)``
    (``scaled``; ``None``: the prediction from ``base`` alone)."""
    out = []
    sc = {c.name: c for c in scaled.conclusions} if scaled is not None else {}
    for c in base.conclusions:
        st = c.power(factor)["status"]
        predicted = None
        n_scaled = 0
        if st in ("detected", "weak"):
            predicted = c.detect_factor is not None and c.detect_factor > factor
            if scaled is not None:
                n_scaled = sc[c.name].counterexamples if c.name in sc else 0
                st = "detected" if n_scaled > c.counterexamples else "weak"
        srec = (search.best.get(c.name) if search is not None else None) or c.search or {}
        out.append(PowerRow(
            id=base.id, conclusion=c.name, kind=c.kind, role=c.role, status=st, detect_factor=c.detect_factor,
            predicted=predicted, counterexamples=c.counterexamples, counterexamples_scaled=n_scaled,
            search_best_ratio=srec.get("best_ratio"), search_params=srec.get("params"), reason=c.reason,
        ))
    return out


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def power_report(ids=None, *, factor: float = POWER_FACTOR, seed: int = registry.DEFAULT_SEED,
                 search: str = "stored", progress: Callable[[str], None] = _progress) -> PowerReport:
    """Run the statements (all by default) plainly and under ``bound_factor(factor)``; search the family of every
    statement with a weak numeric conclusion (``search``: a budget of :data:`verification.core.search.BUDGETS`, or
    ``"none"``)."""
    from verification.core.search import BUDGETS, STORED

    if search not in ("none", STORED) and search not in BUDGETS:
        raise ValueError(f"search must be 'none', {STORED!r} or one of {sorted(BUDGETS)}; got {search!r}")
    if not 0.0 < float(factor) <= 1.0:
        raise ValueError(f"factor must lie in (0, 1]; got {factor!r}")
    stmts = registry.resolve(ids)
    rep = PowerReport(factor=float(factor), seed=int(seed), search=search)
    t0 = time.perf_counter()
    for k, s in enumerate(stmts, 1):
        try:
            base = registry.run_statement(s, seed=seed)
            with bound_factor(factor):
                scaled = registry.run_statement(s, seed=seed)
            rows = rows_of(base, scaled, factor)
            if search != "none" and s.search is not None and any(r.status == "weak" for r in rows):
                res = registry.search_statement(s, search, seed)
                rows = rows_of(base, scaled, factor, res)
        except Exception as exc:  # noqa: BLE001 - reported; the report goes on
            traceback.print_exc(file=sys.stderr)
            rep.errors[s.id] = repr(exc)
            continue
        rep.rows.extend(rows)
        weak = sum(r.status == "weak" for r in rows)
        progress(f"[{k:>2}/{len(stmts)}] {time.perf_counter() - t0:6.1f}s  {s.id:<8} "
                 f"{sum(r.status == 'detected' for r in rows)} detected, {weak} weak")
    rep.seconds = time.perf_counter() - t0
    return rep
