"""The hypotheses of a check: a :class:`HypothesisMonitor` evaluates each checklist item at the points actually used
and records, per instance, whether it held (with a margin where one exists); :class:`Hypothesis` is its summary of
one item. The conclusion of a check is evaluated on the instances where every monitored hypothesis held
(:meth:`verification.core.evidence.Evidence.from_implication`). Every name is importable from
:mod:`verification.core.evidence` too.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from verification.core.jsonable import to_jsonable
from verification.core.tolerances import ATOL, POSITIVITY_RTOL, RTOL, inequality_margin

__all__ = ["Hypothesis", "HypothesisMonitor"]


@dataclass(frozen=True)
class Hypothesis:
    """Summary of one checklist item over the instances: held / failed counts and the smallest margin.

    ``min_margin`` is the smallest recorded margin (``≥ 0`` means held); ``None`` when no margin was given.
    """

    name: str
    held: int
    failed: int
    min_margin: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return to_jsonable(dataclasses.asdict(self))


class HypothesisMonitor:
    """Accumulates, per hypothesis, whether it held at each instance, with margins.

    Instances are indexed ``0..n_instances−1``. Each :meth:`record` call ANDs into the hypothesis' per-instance
    status (a hypothesis checked at several points of one instance holds iff it held at all of them) and keeps
    the smallest margin. An instance where a hypothesis was never evaluated counts as *held* for it (not
    applicable). :attr:`mask` is the set of instances where every hypothesis held and no explicit exclusion
    applies; the conclusion is evaluated there only.

    Use it batched (arrays of length ``n_instances``) or instance by instance (``index=i``); the number of
    instances can grow with :meth:`add_instances`.
    """

    def __init__(self, n_instances: int = 0):
        if int(n_instances) < 0:
            raise ValueError(f"n_instances must be >= 0; got {n_instances!r}")
        self._n = int(n_instances)
        self._held: dict[str, np.ndarray] = {}
        self._evaluated: dict[str, np.ndarray] = {}
        self._margin: dict[str, np.ndarray] = {}
        self._order: list[str] = []
        self._exclusions: dict[str, np.ndarray] = {}

    # -- size ---------------------------------------------------------------------------------------------
    @property
    def n_instances(self) -> int:
        return self._n

    def add_instances(self, k: int = 1) -> range:
        """Append ``k`` new instances (hypotheses not yet evaluated there) and return their indices."""
        k = int(k)
        if k < 0:
            raise ValueError(f"add_instances: k must be >= 0; got {k}")
        start = self._n
        self._n += k
        for store, fill in ((self._held, True), (self._evaluated, False), (self._margin, np.inf)):
            for name, arr in store.items():
                store[name] = np.concatenate([arr, np.full(k, fill, dtype=arr.dtype)])
        for reason, arr in self._exclusions.items():
            self._exclusions[reason] = np.concatenate([arr, np.zeros(k, dtype=bool)])
        return range(start, self._n)

    def _ensure(self, name: str) -> None:
        if name not in self._held:
            self._held[name] = np.ones(self._n, dtype=bool)
            self._evaluated[name] = np.zeros(self._n, dtype=bool)
            self._margin[name] = np.full(self._n, np.inf)
            self._order.append(name)

    def _index(self, index) -> Any:
        if index is None:
            return slice(None)
        if isinstance(index, (int, np.integer)):
            if not 0 <= int(index) < self._n:
                raise ValueError(f"instance index {index} out of range 0..{self._n - 1}")
            return int(index)
        return index

    # -- recording ----------------------------------------------------------------------------------------
    def record(self, name: str, held, margin=None, index=None) -> np.ndarray:
        """Record hypothesis ``name``: ``held`` (bool, scalar or array) at ``index`` (default: all instances).

        ``margin`` (optional, same shape) is a signed slack, ``≥ 0`` where held. NaN margins count as failed.
        Returns the boolean ``held`` array as recorded (after broadcasting).
        """
        if self._n == 0 and index is None and np.ndim(held) == 1:
            self.add_instances(len(held))
        self._ensure(name)
        idx = self._index(index)
        target_shape = np.shape(self._held[name][idx])
        h = np.asarray(held, dtype=bool)
        try:
            h = np.broadcast_to(h, target_shape)
        except ValueError as exc:
            raise ValueError(
                f"hypothesis {name!r}: held has shape {np.shape(held)}, expected {target_shape}"
            ) from exc
        self._held[name][idx] &= h
        self._evaluated[name][idx] = True
        if margin is not None:
            mg = np.broadcast_to(np.asarray(margin, dtype=np.float64), target_shape)
            mg = np.where(np.isnan(mg), -np.inf, mg)
            self._margin[name][idx] = np.minimum(self._margin[name][idx], mg)
        return np.array(h)

    def require_nonnegative(self, name: str, margin, tol: float = 0.0, index=None) -> np.ndarray:
        """Record hypothesis ``margin ≥ −tol`` (NaN fails)."""
        mg = np.asarray(margin, dtype=np.float64)
        return self.record(name, mg >= -tol, margin=mg, index=index)

    def require_inequality(self, name: str, lhs, rhs, atol: float = ATOL, rtol: float = RTOL,
                           index=None) -> np.ndarray:
        """Record hypothesis ``lhs ≤ rhs`` with the deterministic tolerance of :func:`check_inequality`."""
        mg = inequality_margin(lhs, rhs, atol, rtol)
        return self.record(name, mg >= 0, margin=mg, index=index)

    def require_positive(self, name: str, x, scale=1.0, rtol: float = POSITIVITY_RTOL,
                         index=None) -> np.ndarray:
        """Record hypothesis ``x > rtol·|scale|`` (strict positivity); the margin is ``x − rtol·|scale|``."""
        x = np.asarray(x, dtype=np.float64)
        thr = rtol * np.abs(np.asarray(scale, dtype=np.float64))
        return self.record(name, x > thr, margin=x - thr, index=index)

    def exclude(self, reason: str, mask, index=None) -> None:
        """Exclude instances for a reason that is not a checklist hypothesis (e.g. "LP infeasible")."""
        if self._n == 0 and index is None and np.ndim(mask) == 1:
            self.add_instances(len(mask))
        if reason not in self._exclusions:
            self._exclusions[reason] = np.zeros(self._n, dtype=bool)
        idx = self._index(index)
        m = np.broadcast_to(np.asarray(mask, dtype=bool), np.shape(self._exclusions[reason][idx]))
        self._exclusions[reason][idx] |= m

    # -- summaries ----------------------------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        return list(self._order)

    def held(self, name: str) -> np.ndarray:
        """Per-instance status of hypothesis ``name`` (True = held or not evaluated)."""
        if name not in self._held:
            raise ValueError(f"unknown hypothesis {name!r}; recorded: {self._order}")
        return self._held[name].copy()

    def failed(self, name: str) -> np.ndarray:
        """Per-instance mask where hypothesis ``name`` was evaluated and failed."""
        return ~self.held(name)

    @property
    def mask(self) -> np.ndarray:
        """Instances where every hypothesis held and no exclusion applies."""
        m = np.ones(self._n, dtype=bool)
        for arr in self._held.values():
            m &= arr
        for arr in self._exclusions.values():
            m &= ~arr
        return m

    def hypotheses(self) -> tuple[Hypothesis, ...]:
        out = []
        for name in self._order:
            ev = self._evaluated[name]
            h = self._held[name]
            mg = self._margin[name][ev]
            finite_given = mg[mg != np.inf]
            out.append(
                Hypothesis(
                    name=name,
                    held=int(np.sum(h & ev)),
                    failed=int(np.sum(~h)),
                    min_margin=float(finite_given.min()) if finite_given.size else None,
                )
            )
        return tuple(out)

    def exclusion_reasons(self) -> dict[str, int]:
        """Each excluded instance is attributed to its first failed hypothesis (recording order), else to its
        first explicit exclusion reason; the counts add up to the number of excluded instances."""
        reasons: dict[str, int] = {}
        remaining = np.ones(self._n, dtype=bool)
        for name in self._order:
            hit = remaining & ~self._held[name]
            if hit.any():
                reasons[name] = int(hit.sum())
            remaining &= ~hit
        for reason, arr in self._exclusions.items():
            hit = remaining & arr
            if hit.any():
                reasons[reason] = reasons.get(reason, 0) + int(hit.sum())
            remaining &= ~hit
        return reasons
