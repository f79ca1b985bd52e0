r"""Evidence records of executable statements: their conclusions, verdicts, negative controls and power.

The hypothesis monitor (:mod:`verification.core.hypotheses`), the tolerances and the bound factor
(:mod:`verification.core.tolerances`) and the JSON conversion (:mod:`verification.core.jsonable`) sit below this
module; every name of them is importable from here too.

Every statement check (docs/write-your-own.md, docs/spec/tolerances.md#implication-test) is an *implication
test*:

1. a :class:`HypothesisMonitor` evaluates each checklist item at the points actually used and records, per
   instance, whether it held (with a margin where one exists);
2. the conclusion is evaluated as an inequality ``lhs ≤ rhs`` (or as a boolean) on the instances where every
   monitored hypothesis held;
3. the verdict is

   - ``"violated"`` iff some instance with all hypotheses held breaks the conclusion,
   - ``"vacuous"``  iff every instance was excluded (a failure of the test design),
   - ``"holds"``    otherwise,
   - ``"finding"``  for a statement that the suite shows false *as printed*: the expected counterexample to the
     literal statement was reproduced and the repaired statement holds (:meth:`Evidence.finding`).

4. a negative control breaks a hypothesis on purpose (:meth:`Evidence.from_control`); it is *detected* iff the
   monitor flags the broken hypothesis and the conclusion is seen to fail on a flagged instance.

Deterministic inequalities use ``lhs ≤ rhs + ATOL + RTOL·|rhs|`` with ``ATOL = 1e-12`` and ``RTOL = 1e-9``.

**Conclusions.** A statement usually has several conclusions (eq 91, eq 92, …). Every instance belongs to one
named conclusion, and :class:`Conclusion` keeps, per name, its own tightness, instance and exclusion counts,
counterexamples and *power*. Each conclusion says its kind (:data:`CONCLUSION_KINDS`): a numeric ``bound``, an
``identity`` residual (the right-hand side is a tolerance), a ``boolean`` conclusion, or a ``monte_carlo``
(confidence-level) assertion. The headline tightness stays the maximum over the conclusions.

**Power.** A check whose instances never come near the bound proves little. Every numeric bound of a conclusion
passes through :func:`scaled_bound`, which applies the active *bound factor* ``f`` (:func:`bound_factor`, 1 by
default): ``rhs ↦ rhs − (1 − f)|rhs|``, a bound too small by the factor ``f``; Monte Carlo bounds pass through the
same function in :func:`verification.core.montecarlo.mean_claim`. Re-running a check under ``bound_factor(0.5)`` shows
per conclusion whether a halved bound is detected (``python -m verification power``). Without a re-run the same
answer follows from the data: the *detection factor* of an instance is ``1 − (rhs − lhs)/|rhs|`` (``= lhs/rhs``
for ``rhs > 0``), the largest ``f`` at which the scaled bound is still violated there, and a Monte Carlo assertion
reports the factor at which its confidence bound crosses the scaled bound.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from verification.core import hypotheses as _hypotheses
from verification.core import jsonable as _jsonable
from verification.core import tolerances as _tolerances
from verification.core.hypotheses import *  # noqa: F403 - the monitor is importable from here too
from verification.core.hypotheses import Hypothesis, HypothesisMonitor
from verification.core.jsonable import *  # noqa: F403 - and the JSON conversion
from verification.core.jsonable import JsonRecord, json_float, to_jsonable
from verification.core.tolerances import *  # noqa: F403 - and the tolerances and the bound factor
from verification.core.tolerances import ATOL, RTOL, check_inequality, detection_factor, scaled_bound

__all__ = [
    *_tolerances.__all__,
    *_jsonable.__all__,
    *_hypotheses.__all__,
    "VERDICTS",
    "NEGATIVE_CONTROL_STATES",
    "MAX_STORED_COUNTEREXAMPLES",
    "kept_counterexamples",
    "CONCLUSION_KINDS",
    "CONCLUSION_ROLES",
    "NUMERIC_KINDS",
    "POWER_FACTOR",
    "Conclusion",
    "RESIDUAL_TIGHTNESS_FLOOR",
    "Evidence",
]

VERDICTS = ("holds", "violated", "finding", "vacuous")
NEGATIVE_CONTROL_STATES = ("detected", "missed", "none")
#: A detection at :data:`POWER_FACTOR` that rests on fewer instances than this says so (``few_instances``).
FEW_DETECTING = 10
#: At most this many counterexamples are stored in full; all of them are counted.
MAX_STORED_COUNTEREXAMPLES = 20


def kept_counterexamples(found: int, kept: int) -> dict[str, Any]:
    """What a list of counterexamples written to a file says of itself: ``counterexamples_kept`` (how many it
    holds) and, when that is fewer than the ``found`` ones, ``counterexamples_note`` saying that the first ``kept``
    of ``found`` are kept."""
    found, kept = int(found), int(kept)
    out: dict[str, Any] = {"counterexamples_kept": kept}
    if kept < found:
        out["counterexamples_note"] = (f"the first {kept} of the {found} counterexamples found are kept in full; "
                                       "all of them are counted")
    return out

#: Floor of a tightness that measures roundoff: where a conclusion is an identity whose lhs is a residual (exactly 0
#: in exact arithmetic, ~1e-15 computed) its tightness is the residual over the identity's tolerance, ~1e-6..1e-5 on
#: every machine we know, and changes with the BLAS kernel. Below this floor (1000x the roundoff seen, 1000x below
#: the tolerance) the value is roundoff and the regression comparison treats any two such values as equal.
RESIDUAL_TIGHTNESS_FLOOR = 1e-3

#: Kinds of conclusion: a numeric bound ``lhs ≤ rhs``; an identity residual (``rhs`` is a tolerance); a boolean
#: conclusion; a Monte Carlo (confidence-level) assertion ``LCB ≤ b``.
CONCLUSION_KINDS = ("bound", "identity", "boolean", "monte_carlo")
#: The kinds whose right-hand side is a bound of the theory (scaled by :func:`scaled_bound`; power is measured).
NUMERIC_KINDS = ("bound", "monte_carlo")
#: ``contract``: part of the verdict; ``literal``: the statement as printed of a FINDING (expected violated);
#: ``soft``: reported, not part of the verdict (e.g. a reconstructed reading the theory does not prove).
CONCLUSION_ROLES = ("contract", "literal", "soft")
#: Default factor of the power report: a bound too small by half.
POWER_FACTOR = 0.5
KIND_LABELS = {"bound": "numeric bound", "identity": "identity residual", "boolean": "boolean conclusion",
               "monte_carlo": "Monte Carlo assertion"}


# --------------------------------------------------------------------------------------------------------------
# Evidence
# --------------------------------------------------------------------------------------------------------------


def _instance_record(i: int, data: Mapping[str, Any] | Callable[[int], Mapping[str, Any]] | None) -> dict:
    if data is None:
        return {}
    if callable(data):
        return dict(data(i))
    rec = {}
    for key, val in data.items():
        arr = np.asarray(val)
        rec[key] = arr[i] if arr.ndim >= 1 and arr.shape[0] > i else arr
    return rec


#: The name :func:`_names` gives an ``ok_conclusion`` entry None (a row without a boolean part).
_NO_BOOLEAN = "\x00no boolean part"


def _names(id: str, conclusion, n: int, none: str | None = None) -> np.ndarray:
    if conclusion is None:
        return np.full(n, "conclusion", dtype=object)
    if isinstance(conclusion, str):
        return np.full(n, conclusion, dtype=object)
    arr = np.asarray(conclusion, dtype=object).reshape(-1)
    if arr.shape != (n,):
        raise ValueError(f"Evidence {id!r}: conclusion names have shape {arr.shape}, expected ({n},) instances")
    return np.array([none if (x is None and none is not None) else str(x) for x in arr], dtype=object)


def _kinds(id: str, kinds, names: np.ndarray, has_bound: bool) -> dict[str, str]:
    default = "bound" if has_bound else "boolean"
    present = list(dict.fromkeys(names.tolist()))
    if kinds is None:
        out = {x: default for x in present}
    elif isinstance(kinds, str):
        out = {x: kinds for x in present}
    else:
        out = {x: kinds.get(x, default) for x in present}  # a kind for an absent conclusion is not used
    for x, k in out.items():
        if k not in CONCLUSION_KINDS:
            raise ValueError(f"Evidence {id!r}: conclusion {x!r} has kind {k!r}; kinds: {CONCLUSION_KINDS}")
        if k != "boolean" and not has_bound:
            raise ValueError(f"Evidence {id!r}: conclusion {x!r} of kind {k!r} needs lhs and rhs")
    return out


def _tightness(lhs: np.ndarray, rhs: np.ndarray) -> float | None:
    """``max lhs/rhs`` over the instances with ``rhs > ATOL``: a bound below the inequality's absolute
    tolerance is indistinguishable from 0, and a ratio to it measures round-off, not tightness."""
    pos = rhs > ATOL
    if not pos.any():
        return None
    t = float(np.max(lhs[pos] / rhs[pos]))
    return t if math.isfinite(t) else None


_SAME: Any = type("_Same", (), {"__repr__": lambda self: "<detect_factor>"})()


@dataclass(frozen=True)
class Conclusion:
    """One named conclusion of a statement (eq 91, eq 92, …) over the instances that belong to it.

    ``kind`` one of :data:`CONCLUSION_KINDS`; ``role`` one of :data:`CONCLUSION_ROLES`; ``tightness`` the largest
    ``lhs/rhs`` (``rhs > ATOL``) where the hypotheses held; ``instances``/``excluded``/``counterexamples``
    counts; ``detect_factor`` the largest factor ``f`` at which the bound scaled by :func:`scaled_bound` is still
    violated on some instance (numeric kinds; for Monte Carlo the factor at which the confidence bound crosses);
    ``worst`` the instance that attains it (data to reproduce it); ``reason`` why a numeric bound cannot be
    approached on its family (declared by the statement); ``search`` the falsification search's outcome
    (:mod:`verification.core.search`); ``family_detect_factor`` the detection factor on the statement's default family
    alone (every part of it that :meth:`Evidence.merged` merges, not the designed ``TIGHT_POINTS``,
    :meth:`Evidence.at_designed_point`); ``n_detecting`` the
    number of instances whose detection factor exceeds :data:`POWER_FACTOR` (those a halved bound would fail on)."""

    name: str
    kind: str = "bound"
    role: str = "contract"
    tightness: float | None = None
    instances: int = 0
    excluded: int = 0
    counterexamples: int = 0
    detect_factor: float | None = None
    worst: dict[str, Any] | None = None
    reason: str | None = None
    search: dict[str, Any] | None = None
    family_detect_factor: float | None = _SAME  # default: detect_factor (a conclusion made on its family alone)
    n_detecting: int | None = None

    def __post_init__(self):
        if self.family_detect_factor is _SAME:
            object.__setattr__(self, "family_detect_factor", self.detect_factor)
        if self.kind not in CONCLUSION_KINDS:
            raise ValueError(f"conclusion {self.name!r}: kind must be one of {CONCLUSION_KINDS}; got {self.kind!r}")
        if self.role not in CONCLUSION_ROLES:
            raise ValueError(f"conclusion {self.name!r}: role must be one of {CONCLUSION_ROLES}; got {self.role!r}")

    @property
    def numeric(self) -> bool:
        return self.kind in NUMERIC_KINDS

    @property
    def best_ratio(self) -> float | None:
        """The largest detection factor seen: the check's, or the falsification search's if larger."""
        vals = [v for v in (self.detect_factor, (self.search or {}).get("best_ratio")) if v is not None]
        return max(vals) if vals else None

    def power(self, factor: float = POWER_FACTOR) -> dict[str, Any]:
        """Whether a bound too small by ``factor`` is detected by this conclusion's instances.

        ``status``: ``detected`` (``detect_factor > factor``), ``weak`` (not detected; ``reason`` and the search's
        best ratio say why), ``identity residual`` / ``boolean conclusion`` (no bound to scale: marked, not
        counted as weak), ``violated`` (already violated at factor 1), ``literal (finding)`` (the literal
        statement of a FINDING)."""
        out: dict[str, Any] = {"factor": float(factor)}
        if self.role == "literal":
            out["status"] = "literal (finding)"
        elif not self.numeric:
            out["status"] = KIND_LABELS[self.kind]
        elif self.counterexamples and self.role == "contract":
            out["status"] = "violated"
        elif self.detect_factor is not None and self.detect_factor > factor:
            out["status"] = "detected"
        else:
            out["status"] = "weak"
        if self.numeric:
            out["detect_factor"] = None if self.detect_factor is None else json_float(self.detect_factor)
            out["method"] = ("factor at which the confidence bound crosses" if self.kind == "monte_carlo"
                             else "max 1 - (rhs - lhs)/|rhs| (= max lhs/rhs for rhs > 0)")
            srch = (self.search or {}).get("best_ratio")
            fam = self.family_detect_factor
            # every source whose instances detect the weakened bound: the default family, the designed tight
            # points (the check's factor above the family's), the falsification search (its best ratio)
            sources = [name for name, ok in (
                ("default family", fam is not None and fam > factor),
                ("designed tight point", self.detect_factor is not None and self.detect_factor > factor
                 and not (fam is not None and fam > factor)),
                ("falsification search", srch is not None and srch > factor)) if ok]
            if self.search is not None:
                out["detection_sources"] = sources
            if out["status"] == "detected":
                out["detected_by"] = ("default family" if fam is not None and fam > factor
                                      else "designed tight point")
                if self.n_detecting is not None and factor == POWER_FACTOR:
                    out["detecting_instances"] = int(self.n_detecting)
                    if self.n_detecting < FEW_DETECTING:
                        out["few_instances"] = (
                            f"rests on {self.n_detecting} Monte Carlo assertion{'s' * (self.n_detecting != 1)} "
                            f"(each one mean over its runs: one instance by construction)"
                            if self.kind == "monte_carlo" else
                            f"rests on {self.n_detecting} instance{'s' * (self.n_detecting != 1)} (< {FEW_DETECTING})")
            elif srch is not None and srch > factor:
                out["detected_by"] = "falsification search only"
        if self.search is not None:
            out["search_best_ratio"] = self.search.get("best_ratio")
        if self.reason and out["status"] in ("weak", "detected"):
            out["reason"] = self.reason
        return to_jsonable(out)

    def to_dict(self, factor: float = POWER_FACTOR) -> dict[str, Any]:
        """``{name, kind, role, tightness, instances, excluded, counterexamples, power}`` (``search`` when run)."""
        out = {"name": self.name, "kind": self.kind, "role": self.role,
               "tightness": None if self.tightness is None else json_float(self.tightness),
               "instances": int(self.instances), "excluded": int(self.excluded),
               "counterexamples": int(self.counterexamples), "power": self.power(factor)}
        if self.search is not None:
            out["search"] = to_jsonable({k: v for k, v in self.search.items() if k != "instance"})
        return out


def _conclusions(names: np.ndarray, mask: np.ndarray, arrays: dict, good: np.ndarray, idx_held: np.ndarray,
                 kinds: Mapping[str, str], roles: Mapping[str, str], detect: np.ndarray | None,
                 instance_data) -> tuple[Conclusion, ...]:
    """Per-conclusion statistics (see :class:`Conclusion`). ``good`` is aligned with ``idx_held``."""
    out = []
    held_names = names[idx_held]
    order = list(dict.fromkeys(names.tolist()))
    for nm in order:
        sel_all = names == nm
        sel = held_names == nm
        kind = kinds.get(nm, "bound" if "lhs" in arrays else "boolean")
        tight = det = n_det = None
        worst = None
        if "lhs" in arrays and sel.any():
            lh = arrays["lhs"][idx_held[sel]]
            rh = arrays["rhs"][idx_held[sel]]
            tight = _tightness(lh, rh)
            if kind in NUMERIC_KINDS:
                df = detection_factor(lh, rh)
                if detect is not None:
                    given = detect[idx_held[sel]]
                    df = np.where(np.isnan(given), df, given)
                if np.isfinite(df).any():
                    k = int(np.nanargmax(df))
                    det = float(df[k])
                    n_det = int(np.sum(df > POWER_FACTOR))
                    i = int(idx_held[sel][k])
                    worst = to_jsonable({"instance": i, "lhs": arrays["lhs"][i], "rhs": arrays["rhs"][i],
                                         "ratio": det, **_instance_record(i, instance_data)})
        out.append(Conclusion(
            name=str(nm), kind=kind, role=roles.get(nm, "contract"), tightness=tight,
            instances=int(sel_all.sum()), excluded=int(sel_all.sum() - sel.sum()),
            counterexamples=int((~good[sel]).sum()), detect_factor=det, worst=worst,
            family_detect_factor=det, n_detecting=n_det,
        ))
    return tuple(out)


def _headline(conclusions: Sequence[Conclusion]) -> float | None:
    """The headline tightness: the maximum over the contract conclusions of a numeric kind, else over all."""
    for pool in ([c for c in conclusions if c.role == "contract" and c.numeric],
                 [c for c in conclusions if c.role == "contract"]):
        vals = [c.tightness for c in pool if c.tightness is not None]
        if vals:
            return max(vals)
    return None


@dataclass(frozen=True)
class Evidence(JsonRecord):
    """The result of one executable statement (or of its negative control).

    Fields:
      id, name          statement id ("H.13", "S4") and name.
      verdict           one of ``VERDICTS``.
      hypotheses        per-hypothesis held/failed counts and min margins.
      lhs, rhs          float64 arrays of the conclusion ``lhs ≤ rhs`` over the instances where all
                        hypotheses held (empty for purely symbolic checks).
      tightness         ``max lhs/rhs`` over those instances with ``rhs > 0``; ``None`` when not meaningful.
      instances         number of instances examined; ``excluded`` of them were excluded.
      exclusion_reasons reason → count (sums to ``excluded``).
      counterexamples   up to ``MAX_STORED_COUNTEREXAMPLES`` JSON-serialisable dicts with the data to
                        reproduce them; ``n_counterexamples`` is the total count.
      details           extra reported numbers (JSON-serialisable).
      negative_control  "detected" / "missed" / "none" (filled by ``registry.run_statement``).
      control_detected  for a negative-control Evidence: the broken hypothesis was flagged *and* the
                        conclusion was seen to fail on a flagged instance. ``None`` for ordinary checks.
      control           the negative control's own Evidence (filled by ``registry.run_statement``).
      repaired          for a FINDING: the Evidence of the repaired statement.
      seconds           wall time of the check plus its negative control.
      conclusions       the named conclusions (:class:`Conclusion`), each with its own counts and power.
      labels            the conclusion of every entry of ``lhs``/``rhs``.
      tightness_floor   set where the tightness measures roundoff (an identity residual): values below it are
                        roundoff and compare equal in the bound regression (:data:`RESIDUAL_TIGHTNESS_FLOOR`).
    """

    id: str
    name: str
    verdict: str
    hypotheses: tuple[Hypothesis, ...] = ()
    lhs: np.ndarray = field(default_factory=lambda: np.zeros(0))
    rhs: np.ndarray = field(default_factory=lambda: np.zeros(0))
    tightness: float | None = None
    instances: int = 0
    excluded: int = 0
    exclusion_reasons: dict[str, int] = field(default_factory=dict)
    counterexamples: list[dict[str, Any]] = field(default_factory=list)
    n_counterexamples: int = None  # type: ignore[assignment]  # None: len(counterexamples), set in __post_init__
    details: dict[str, Any] = field(default_factory=dict)
    negative_control: str = "none"
    control_detected: bool | None = None
    control: Evidence | None = None
    repaired: Evidence | None = None
    seconds: float = 0.0
    conclusions: tuple[Conclusion, ...] = ()
    labels: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=object))
    tightness_floor: float | None = None

    def __post_init__(self):
        if self.verdict not in VERDICTS:
            raise ValueError(f"Evidence {self.id!r}: verdict must be one of {VERDICTS}; got {self.verdict!r}")
        if self.negative_control not in NEGATIVE_CONTROL_STATES:
            raise ValueError(
                f"Evidence {self.id!r}: negative_control must be one of {NEGATIVE_CONTROL_STATES}; "
                f"got {self.negative_control!r}"
            )
        lhs = np.atleast_1d(np.asarray(self.lhs, dtype=np.float64))
        rhs = np.atleast_1d(np.asarray(self.rhs, dtype=np.float64))
        if lhs.shape != rhs.shape:
            raise ValueError(f"Evidence {self.id!r}: lhs shape {lhs.shape} != rhs shape {rhs.shape}")
        object.__setattr__(self, "lhs", lhs)
        object.__setattr__(self, "rhs", rhs)
        object.__setattr__(self, "hypotheses", tuple(self.hypotheses))
        object.__setattr__(self, "conclusions", tuple(self.conclusions))
        labels = np.asarray(self.labels, dtype=object).reshape(-1)
        if labels.size == 0 and lhs.size:
            labels = np.full(lhs.size, "conclusion", dtype=object)
        if labels.size != lhs.size:
            raise ValueError(f"Evidence {self.id!r}: {labels.size} conclusion labels for {lhs.size} instances")
        object.__setattr__(self, "labels", labels)
        if self.n_counterexamples is None:
            object.__setattr__(self, "n_counterexamples", len(self.counterexamples))
        if self.tightness is not None:
            object.__setattr__(self, "tightness", float(self.tightness))
        if not 0 <= self.excluded <= max(self.instances, 0):
            raise ValueError(
                f"Evidence {self.id!r}: excluded={self.excluded} must lie in [0, instances={self.instances}]"
            )

    # -- constructors -------------------------------------------------------------------------------------
    @classmethod
    def from_implication(
        cls,
        id: str,
        name: str,
        monitor: HypothesisMonitor | np.ndarray | None,
        lhs=None,
        rhs=None,
        *,
        ok=None,
        atol: float = ATOL,
        rtol: float = RTOL,
        tightness: float | None | str = "auto",
        instance_data: Mapping[str, Any] | Callable[[int], Mapping[str, Any]] | None = None,
        details: Mapping[str, Any] | None = None,
        conclusion: str | Sequence[str] | np.ndarray | None = None,
        kinds: str | Mapping[str, str] | None = None,
        soft: Iterable[str] = (),
        detect=None,
        ok_conclusion: str | Sequence[str] | np.ndarray | None = None,
    ) -> Evidence:
        """Evidence of ``hypotheses ⇒ lhs ≤ rhs`` over all instances.

        ``conclusion`` names the conclusion of every instance (one name, or an array over the instances;
        default ``"conclusion"``); ``kinds`` gives each name's kind (:data:`CONCLUSION_KINDS`; one kind for all,
        or a mapping; default ``bound`` with ``lhs``/``rhs``, ``boolean`` without). The right-hand side of every
        ``bound`` instance passes through :func:`scaled_bound`. Conclusions named in ``soft`` are reported with
        their counterexamples (in ``details["soft_counterexamples"]``) but do not decide the verdict. ``detect``
        (optional, per instance; NaN = not given) overrides the detection factor of an instance (Monte Carlo
        rows: the factor at which the confidence bound crosses). ``ok_conclusion`` (with both ``lhs``/``rhs`` and
        ``ok``) names the boolean part as a conclusion of its own (kind ``boolean``, same instances; an array
        entry ``None`` marks a row without a boolean part, which is left out of the boolean conclusions and whose
        ``ok`` must be True); without it the boolean part belongs to the inequality's conclusion.

        ``monitor`` is a :class:`HypothesisMonitor`, a boolean mask of the instances where the hypotheses
        held, or ``None`` (no hypotheses: every instance counts). ``lhs``, ``rhs`` (and ``ok``, an optional
        boolean conclusion for claims that are not inequalities; both are required where both are given) are
        arrays over *all* instances; the conclusion is evaluated where the hypotheses held. ``instance_data``
        (dict of per-instance arrays, or a callable ``i -> dict``) is stored with each counterexample.

        Verdict: "violated" iff some held instance breaks the conclusion; "vacuous" iff no instance held
        (including zero instances); otherwise "holds".
        """
        if lhs is None and ok is None:
            raise ValueError(f"Evidence {id!r}: give lhs and rhs, or ok")
        if (lhs is None) != (rhs is None):
            raise ValueError(f"Evidence {id!r}: lhs and rhs must be given together")
        arrays: dict[str, np.ndarray] = {}
        if lhs is not None:
            arrays["lhs"] = np.atleast_1d(np.asarray(lhs, dtype=np.float64))
            arrays["rhs"] = np.atleast_1d(np.asarray(rhs, dtype=np.float64))
        if ok is not None:
            arrays["ok"] = np.atleast_1d(np.asarray(ok, dtype=bool))
        if isinstance(monitor, HypothesisMonitor):
            n = monitor.n_instances
            mask = monitor.mask
            hyps = monitor.hypotheses()
            reasons = monitor.exclusion_reasons()
        elif monitor is None:
            n = len(next(iter(arrays.values())))
            mask = np.ones(n, dtype=bool)
            hyps, reasons = (), {}
        else:
            mask = np.asarray(monitor, dtype=bool).reshape(-1)
            n = mask.size
            hyps = ()
            reasons = {"hypotheses failed": int((~mask).sum())} if (~mask).any() else {}
        for key, arr in arrays.items():
            if arr.shape != (n,):
                raise ValueError(f"Evidence {id!r}: {key} has shape {arr.shape}, expected ({n},) instances")
        names = _names(id, conclusion, n)
        kind_of = _kinds(id, kinds, names, "lhs" in arrays)
        soft = {str(x) for x in soft}
        unknown = soft - set(names.tolist())
        if unknown and n:
            raise ValueError(f"Evidence {id!r}: soft conclusion(s) {sorted(unknown)} name no instance")
        if "lhs" in arrays:  # every numeric bound passes through scaled_bound (power, see the module docstring)
            is_bound = np.array([kind_of[x] == "bound" for x in names], dtype=bool)
            if is_bound.any():
                arrays["rhs"] = np.where(is_bound, scaled_bound(arrays["rhs"]), arrays["rhs"])
        det = None
        if detect is not None:
            det = np.atleast_1d(np.asarray(detect, dtype=np.float64))
            if det.shape != (n,):
                raise ValueError(f"Evidence {id!r}: detect has shape {det.shape}, expected ({n},) instances")
        idx_held = np.flatnonzero(mask)
        if "lhs" in arrays:
            lhs_h, rhs_h = arrays["lhs"][idx_held], arrays["rhs"][idx_held]
            good = check_inequality(lhs_h, rhs_h, atol, rtol)
        else:
            lhs_h = rhs_h = np.zeros(0)
            good = np.ones(idx_held.size, dtype=bool)
        if "ok" in arrays:
            good = good & arrays["ok"][idx_held]
        roles = {x: "soft" for x in soft}
        if ok_conclusion is not None and "ok" in arrays and "lhs" in arrays:
            # the boolean part is a conclusion of its own, over the same instances
            ok_names = _names(id, ok_conclusion, n, none=_NO_BOOLEAN)
            none_rows = ok_names == _NO_BOOLEAN
            if np.any(none_rows & ~arrays["ok"]):
                raise ValueError(f"Evidence {id!r}: a row without a boolean part (ok_conclusion None) has ok False")
            good_ineq = check_inequality(lhs_h, rhs_h, atol, rtol)
            conclusions = _conclusions(names, mask, arrays, good_ineq, idx_held, kind_of, roles, det, instance_data)
            ok_kinds = {x: "boolean" for x in ok_names.tolist()}
            conclusions += tuple(c for c in _conclusions(ok_names, mask, {"ok": arrays["ok"]}, arrays["ok"][idx_held],
                                                         idx_held, ok_kinds, roles, None, instance_data)
                                 if c.name != _NO_BOOLEAN)
            fail_name = np.where(check_inequality(arrays["lhs"], arrays["rhs"], atol, rtol), ok_names, names)
            soft_ineq = np.array([x in soft for x in names[idx_held]], dtype=bool)
            soft_ok = np.array([x in soft for x in ok_names[idx_held]], dtype=bool)
            # an instance fails the contract if a contract part of it fails
            fails = (~good_ineq & ~soft_ineq) | (~arrays["ok"][idx_held] & ~soft_ok)
            soft_fails = ~good & ~fails
            contract_seen = (~soft_ineq | ~soft_ok).any()
        else:
            conclusions = _conclusions(names, mask, arrays, good, idx_held, kind_of, roles, det, instance_data)
            fail_name = names
            is_soft = np.array([x in soft for x in names[idx_held]], dtype=bool)
            fails, soft_fails, contract_seen = ~good & ~is_soft, ~good & is_soft, (~is_soft).any()
        bad = idx_held[fails]
        soft_bad = idx_held[soft_fails]
        if not contract_seen:  # nothing of the contract was evaluated
            verdict = "vacuous"
        elif bad.size:
            verdict = "violated"
        else:
            verdict = "holds"

        def record(i):
            rec = {"instance": int(i), "conclusion": str(fail_name[i])}
            if "lhs" in arrays:
                rec["lhs"] = arrays["lhs"][i]
                rec["rhs"] = arrays["rhs"][i]
            rec.update(_instance_record(int(i), instance_data))
            return to_jsonable(rec)

        cex = [record(i) for i in bad[:MAX_STORED_COUNTEREXAMPLES]]
        details = dict(details or {})
        if soft_bad.size:
            details["soft_counterexamples"] = {
                x: [record(i) for i in soft_bad[names[soft_bad] == x][:MAX_STORED_COUNTEREXAMPLES]]
                for x in dict.fromkeys(names[soft_bad].tolist())}
        if tightness == "auto":
            tightness = _headline(conclusions) if lhs_h.size else None
        assert not isinstance(tightness, str), f"tightness must be a number, None or 'auto'; got {tightness!r}"
        return cls(
            id=id,
            name=name,
            verdict=verdict,
            hypotheses=hyps,
            lhs=lhs_h,
            rhs=rhs_h,
            tightness=tightness,
            instances=int(n),
            excluded=int(n - idx_held.size),
            exclusion_reasons=dict(reasons),
            counterexamples=cex,
            n_counterexamples=int(bad.size),
            details=to_jsonable(details),
            conclusions=conclusions,
            labels=names[idx_held] if "lhs" in arrays else np.zeros(0, dtype=object),
        )

    @classmethod
    def from_control(
        cls,
        id: str,
        name: str,
        monitor: HypothesisMonitor,
        broken: str | Sequence[str],
        lhs=None,
        rhs=None,
        *,
        ok=None,
        atol: float = ATOL,
        rtol: float = RTOL,
        instance_data: Mapping[str, Any] | Callable[[int], Mapping[str, Any]] | None = None,
        details: Mapping[str, Any] | None = None,
        conclusion=None,
        kinds=None,
    ) -> Evidence:
        """Evidence of a negative control in which hypothesis/es ``broken`` were violated on purpose.

        The conclusion is evaluated on the *flagged* instances (where some ``broken`` hypothesis failed).
        ``control_detected`` is True iff some instance is flagged and the conclusion fails on a flagged
        instance. Verdict (of the conclusion on the flagged instances): "violated" if it failed somewhere,
        "vacuous" if nothing was flagged, else "holds".
        """
        broken = [broken] if isinstance(broken, str) else list(broken)
        if not broken:
            raise ValueError(f"negative control {id!r}: name at least one broken hypothesis")
        for b in broken:
            if b not in monitor.names:
                raise ValueError(
                    f"negative control {id!r}: hypothesis {b!r} was never recorded; recorded: {monitor.names}"
                )
        flagged = np.zeros(monitor.n_instances, dtype=bool)
        for b in broken:
            flagged |= monitor.failed(b)
        ev = cls.from_implication(
            id, name, flagged, lhs, rhs, ok=ok, atol=atol, rtol=rtol, instance_data=instance_data,
            details=details, conclusion=conclusion, kinds=kinds,
        )
        detected = bool(flagged.any() and ev.n_counterexamples > 0)
        d = dict(ev.details)
        d.setdefault("broken_hypotheses", broken)
        d.setdefault("flagged_instances", int(flagged.sum()))
        return dataclasses.replace(
            ev,
            hypotheses=monitor.hypotheses(),
            exclusion_reasons={"broken hypothesis not flagged": int((~flagged).sum())} if (~flagged).any() else {},
            control_detected=detected,
            details=to_jsonable(d),
        )

    @classmethod
    def from_control_flags(cls, id: str, name: str, *, flagged: bool, conclusion_failed: bool,
                details: Mapping[str, Any] | None = None, counterexamples: Iterable[Mapping] = ()) -> Evidence:
        """Negative-control Evidence from two booleans, for controls that do not use a monitor."""
        cex = [to_jsonable(dict(c)) for c in counterexamples]
        verdict = "vacuous" if not flagged else ("violated" if conclusion_failed else "holds")
        return cls(
            id=id, name=name, verdict=verdict, instances=1, excluded=0 if flagged else 1,
            counterexamples=cex[:MAX_STORED_COUNTEREXAMPLES], n_counterexamples=len(cex),
            control_detected=bool(flagged and conclusion_failed),
            details=to_jsonable({"flagged": bool(flagged), "conclusion_failed": bool(conclusion_failed),
                                 **dict(details or {})}),
        )

    @classmethod
    def finding(cls, id: str, name: str, literal: Evidence, repaired: Evidence,
                details: Mapping[str, Any] | None = None) -> Evidence:
        """A FINDING: ``literal`` is the check of the statement as printed (expected to be violated, i.e.
        the counterexample is shown), ``repaired`` the check of the repaired statement (must hold).

        Verdict: "finding" iff the literal statement shows a counterexample and the repaired one holds;
        "violated" if the repaired statement is violated; "vacuous" if the repaired check is vacuous or the
        expected counterexample was not reproduced (the test failed to show what it exists to show; the
        reason is in ``details["finding"]``).
        """
        d = dict(details or {})
        if repaired.verdict == "violated":
            verdict, why = "violated", "repaired statement violated"
        elif repaired.verdict == "vacuous":
            verdict, why = "vacuous", "repaired statement check is vacuous"
        elif literal.n_counterexamples == 0:
            verdict, why = "vacuous", "expected counterexample to the literal statement not reproduced"
        else:
            verdict, why = "finding", "literal statement false (counterexample shown); repaired statement holds"
        d["finding"] = why
        d["literal"] = literal.to_dict()
        d["repaired"] = repaired.to_dict()
        return cls(
            id=id,
            name=name,
            verdict=verdict,
            hypotheses=literal.hypotheses,
            lhs=literal.lhs,
            rhs=literal.rhs,
            tightness=repaired.tightness,
            instances=literal.instances,
            excluded=literal.excluded,
            exclusion_reasons=dict(literal.exclusion_reasons),
            counterexamples=list(literal.counterexamples),
            n_counterexamples=literal.n_counterexamples,
            details=to_jsonable(d),
            repaired=repaired,
            conclusions=tuple(repaired.conclusions) + tuple(
                dataclasses.replace(c, role="literal") for c in literal.conclusions),
            labels=literal.labels,
        )

    def at_designed_point(self) -> Evidence:
        """This Evidence as a run at a designed point of the family (a ``TIGHT_POINTS`` entry), not on the
        statement's default family: no conclusion has a ``family_detect_factor``, so that where it is merged
        (:meth:`merged`) its detections count as a designed tight point's, not the default family's."""
        return dataclasses.replace(self, conclusions=tuple(dataclasses.replace(c, family_detect_factor=None)
                                                           for c in self.conclusions))

    @classmethod
    def merged(cls, main: Evidence, parts: Sequence[tuple[Mapping[str, Any], Evidence] | tuple[Mapping[str, Any],
               Evidence, Any]]) -> Evidence:
        """``main`` with the instances of further checks of the same statement (``parts``: ``(label, Evidence)``,
        e.g. a further part of its default family, or the tight points of the family found by the falsification
        search) added: conclusions merged by name (counts summed, tightness and detection factor the maxima; each
        part's detection facts kept: the detection factor on the default family is the largest of the parts', a
        part run at a designed point, :meth:`at_designed_point`, having none; a conclusion whose role differs from
        the one already there is kept apart, its name suffixed with ``[role]``), hypotheses summed, counterexamples
        concatenated; the verdict is ``violated`` if any part is, ``vacuous`` only if every part is; ``details``
        are ``main``'s plus ``details["added_points"]`` (one summary per part). A part may be ``(label, Evidence,
        seed)``: its summary and soft counterexamples then carry the seed it ran with. A conclusion's ``worst``
        instance from a part names it (``added_point``, and ``seed``)."""
        seeds = [{} if len(p) < 3 or p[2] is None else {"seed": p[2]} for p in parts]  # each part's seed, if given
        pairs: list[tuple[Mapping[str, Any], Evidence]] = [(p[0], p[1]) for p in parts]
        evs = [main] + [e for _, e in pairs]
        for e in evs:
            if e.id != main.id:
                raise ValueError(f"cannot merge Evidence {e.id!r} into {main.id!r}")
        if main.repaired is not None or any(e.repaired is not None for e in evs[1:]):
            raise ValueError(f"Evidence {main.id!r}: a FINDING is merged through its literal/repaired parts")
        by_name: dict[str, Conclusion] = {}
        for k, e in enumerate(evs):
            for c in e.conclusions:
                if k > 0:  # an added part: its worst instance names the part
                    worst = None if c.worst is None else {**c.worst, "added_point": dict(parts[k - 1][0]),
                                                          **seeds[k - 1]}
                    c = dataclasses.replace(c, worst=worst)
                o = by_name.get(c.name)
                if o is not None and o.role != c.role:  # e.g. a soft Monte Carlo row of an added point
                    c = dataclasses.replace(c, name=f"{c.name} [{c.role}]")
                    o = by_name.get(c.name)
                if o is None:
                    by_name[c.name] = c
                    continue
                best = c if (c.detect_factor or -math.inf) > (o.detect_factor or -math.inf) else o
                tights = [x for x in (o.tightness, c.tightness) if x is not None]
                counts = [x for x in (o.n_detecting, c.n_detecting) if x is not None]
                fams = [x for x in (o.family_detect_factor, c.family_detect_factor) if x is not None]
                by_name[c.name] = dataclasses.replace(
                    o, tightness=max(tights) if tights else None, instances=o.instances + c.instances,
                    excluded=o.excluded + c.excluded, counterexamples=o.counterexamples + c.counterexamples,
                    detect_factor=best.detect_factor, worst=best.worst,
                    family_detect_factor=max(fams) if fams else None, n_detecting=sum(counts) if counts else None)
        hyp: dict[str, list[int]] = {}
        margins: dict[str, float | None] = {}
        for e in evs:
            for h in e.hypotheses:
                acc = hyp.setdefault(h.name, [0, 0])
                acc[0] += h.held
                acc[1] += h.failed
                if h.min_margin is not None:
                    m0 = margins.get(h.name)
                    margins[h.name] = h.min_margin if m0 is None else min(m0, h.min_margin)
        reasons: dict[str, int] = {}
        for e in evs:
            for r, k in e.exclusion_reasons.items():
                reasons[r] = reasons.get(r, 0) + k
        verdicts = [e.verdict for e in evs]
        verdict = ("violated" if "violated" in verdicts else
                   "vacuous" if all(v == "vacuous" for v in verdicts) else "holds")
        tights = [e.tightness for e in evs if e.tightness is not None]
        details = dict(main.details)
        details["added_points"] = [{"point": dict(p), **sd,
                                    "instances": e.instances, "excluded": e.excluded, "verdict": e.verdict,
                                    "tightness": {c.name: c.tightness for c in e.conclusions if c.numeric}}
                                   for (p, e), sd in zip(pairs, seeds, strict=True)]
        soft: dict[str, list] = {}
        for (p, e), sd in [(({}, main), {})] + list(zip(pairs, seeds, strict=True)):
            for name, recs in (e.details.get("soft_counterexamples") or {}).items():
                soft.setdefault(name, []).extend(dict(r, point=dict(p), **sd) if p else r for r in recs)
        if soft:
            details["soft_counterexamples"] = {k: v[:MAX_STORED_COUNTEREXAMPLES] for k, v in soft.items()}
        cex = [c for e in evs for c in e.counterexamples]
        return dataclasses.replace(
            main, verdict=verdict,
            hypotheses=tuple(Hypothesis(n, held=v[0], failed=v[1], min_margin=margins.get(n)) for n, v in hyp.items()),
            lhs=np.concatenate([e.lhs for e in evs]), rhs=np.concatenate([e.rhs for e in evs]),
            labels=np.concatenate([e.labels for e in evs]),
            tightness=max(tights) if tights else None,
            instances=sum(e.instances for e in evs), excluded=sum(e.excluded for e in evs),
            exclusion_reasons=reasons, counterexamples=cex[:MAX_STORED_COUNTEREXAMPLES],
            n_counterexamples=sum(e.n_counterexamples for e in evs), details=to_jsonable(details),
            conclusions=tuple(by_name.values()))

    # -- derived ------------------------------------------------------------------------------------------
    @property
    def failed(self) -> bool:
        """True iff this result should fail a run: violated, vacuous, or a missed negative control."""
        return self.verdict in ("violated", "vacuous") or self.negative_control == "missed"

    def with_details(self, **extra: Any) -> Evidence:
        return dataclasses.replace(self, details=to_jsonable({**self.details, **extra}))

    def conclusion(self, name: str) -> Conclusion:
        """The conclusion called ``name``."""
        for c in self.conclusions:
            if c.name == name:
                return c
        raise KeyError(f"Evidence {self.id!r} has no conclusion {name!r}; conclusions: "
                       f"{[c.name for c in self.conclusions]}")

    def with_reasons(self, reasons: Mapping[str, str]) -> Evidence:
        """Attach the statement's declared reasons (conclusion name → why its bound cannot be approached)."""
        if not reasons:
            return self
        def reason(c: Conclusion) -> str | None:
            base = c.name[: -len(f" [{c.role}]")] if c.name.endswith(f" [{c.role}]") else c.name
            return reasons.get(c.name, reasons.get(base, c.reason))

        return dataclasses.replace(self, conclusions=tuple(
            dataclasses.replace(c, reason=reason(c)) for c in self.conclusions))

    def power_summary(self, factor: float = POWER_FACTOR) -> dict[str, Any]:
        """Counts of the conclusions' power states at ``factor`` (the dashboard's ``power`` column)."""
        counts: dict[str, int] = {}
        for c in self.conclusions:
            st = c.power(factor)["status"]
            counts[st] = counts.get(st, 0) + 1
        numeric = [c for c in self.conclusions if c.numeric and c.role == "contract"]
        weak = [c.name for c in numeric if c.power(factor)["status"] == "weak"]
        return {"factor": factor, "numeric": len(numeric),
                "detected": sum(c.power(factor)["status"] == "detected" for c in numeric),
                "weak": weak, "weak_without_reason": [c.name for c in numeric
                                                      if c.name in weak and not c.reason],
                "states": counts}

    # -- serialisation ------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The JSON object of the results file: exactly ``id, name, verdict, tightness, instances, excluded,
        negative_control, counterexamples`` (the count), ``seconds``, plus ``conclusions`` (one object per named
        conclusion: ``name, kind, role, tightness, instances, excluded, counterexamples, power``), ``details``
        when non-empty and ``negative_control_detail`` (:meth:`control_summary` of the control) when the statement
        has a negative control.

        ``details["figure_data"]`` (tables for the report's figures) is left out: the report writes it as CSV."""
        out: dict[str, Any] = {
            "id": self.id,
            "name": self.name,
            "verdict": self.verdict,
            "tightness": None if self.tightness is None else json_float(self.tightness),
            "instances": int(self.instances),
            "excluded": int(self.excluded),
            "negative_control": self.negative_control,
            "counterexamples": int(self.n_counterexamples),
            "seconds": float(self.seconds),
        }
        if self.conclusions:
            out["conclusions"] = [c.to_dict() for c in self.conclusions]
        if self.tightness_floor is not None:
            out["tightness_floor"] = float(self.tightness_floor)
        details = {k: v for k, v in self.details.items() if k != "figure_data"}
        if details:
            out["details"] = to_jsonable(details)
        if self.control is not None:
            out["negative_control_detail"] = self.control.control_summary()
        return out

    def control_summary(self) -> dict[str, Any]:
        """What a negative-control Evidence breaks and what it saw: ``breaks`` (the hypotheses violated on purpose,
        as the monitor names them; empty for a control from :meth:`from_control_flags`), ``description`` (the
        control's docstring, when it has one), ``instances``, ``flagged`` (instances where a broken hypothesis was
        flagged) and ``failed`` (flagged instances where the conclusion failed)."""
        d = self.details
        if "flagged_instances" in d:
            flagged = int(d["flagged_instances"])
        elif "flagged" in d:
            flagged = int(bool(d["flagged"]))
        else:
            flagged = int(self.instances - self.excluded)
        return {"breaks": [str(b) for b in d.get("broken_hypotheses", [])],
                "description": d.get("description"), "instances": int(self.instances), "flagged": flagged,
                "failed": int(self.n_counterexamples)}

    def to_record(self) -> dict[str, Any]:
        """Everything except the lhs/rhs arrays (summarised), for reports and debugging."""
        rec = self.to_dict()
        rec.update(
            hypotheses=[h.to_dict() for h in self.hypotheses],
            exclusion_reasons=dict(self.exclusion_reasons),
            counterexample_records=list(self.counterexamples),
            control_detected=self.control_detected,
            control=None if self.control is None else self.control.to_record(),
            repaired=None if self.repaired is None else self.repaired.to_record(),
            n_conclusion=int(self.lhs.size),
        )
        return to_jsonable(rec)
