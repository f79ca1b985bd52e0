r"""The rules of the run studies of :mod:`verification.llm.studies` (:class:`LLMStudyConfig`), their calibration
window and the helpers every study shares. Every public name is importable from :mod:`verification.llm.studies` too.

**Calibration window** (studies llm-eq71-trajectory and llm-contraction). A constant that a hypothesis is checked
against is never estimated on the rounds it is checked on. Two schemes:

* ``phase1_first_half``: the constants come from the Phase-1 iterates ``t < t_cal = max(1, ⌈R/2⌉)`` (``R``
  Phase-1 rounds); the check runs on every later iterate (the rest of Phase 1, ``w_I``, and Phase 2 up to
  ``w_II``): ``t_0 = t_cal``;
* ``phase1_for_phase2``: the constants come from every Phase-1 iterate (``w_ref .. w_I``), the check runs on the
  Phase-2 iterates.

``β̄`` (one per cluster, as in eq 71) is the largest ``β_i`` of the cluster's clients on the window. ``Δ̄_i`` by two
methods: ``h14`` — Corollary H.14 with ``Δ̄_i = √(H̄/ρ_min)``, ``H̄`` the largest ``H_Cn`` on the window (the choice
the seed names after Theorem H.31); ``window`` — ``Δ̄_i`` the largest ``Δ_i`` of client ``i`` on the window. The
region ``𝒩`` of eq 71 is not recorded and not checked.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from verification.llm.records import (
    RunRecords,
)
from verification.studies.synthetic import _num

__all__ = ["CALIBRATION_SCHEMES", "DEVIATION_METHODS", "COMPARE_RTOL", "LLMStudyConfig", "RunDataMissing",
           "calibration_masks"]


#: Calibration schemes of the eq-71 and contraction studies (module docstring).
CALIBRATION_SCHEMES = ("phase1_first_half", "phase1_for_phase2")
#: Methods for Δ̄_i (module docstring).
DEVIATION_METHODS = ("h14", "window")
#: Relative tolerance of the comparisons β ≤ β̄, Δ ≤ Δ̄, r̂ ≤ bound (records are read back from CSV exactly; this
#: only absorbs the rounding of the constants' own arithmetic).
COMPARE_RTOL = 1e-12


@dataclass(frozen=True)
class LLMStudyConfig:
    """Rules of the run studies.

    ``dm_zero_rtol``: an iterate with ``‖d_M‖ ≤ dm_zero_rtol · scale`` is a "d_M ≈ 0" point, ``scale`` the largest
    hull generator ``‖λ_j g_j‖`` of the index set (from the recorded Grams), else ``λ_max B``, which bounds every
    generator (1e-3 is above the relative precision of bf16/float32 gradients, so a ``d_M`` that small is not
    distinguishable from 0 in an LLM run): excluded from the ratio, counted, its numerator still counted for the
    sign. ``dm_zero_sensitivity``: further thresholds whose counts are reported. ``negative_rtol``: a numerator
    below ``-negative_rtol · scale²`` is negative (LP roundoff: the margin is computed from the same float64 Gram
    the LP solved with); the strict count ``< 0`` is reported as well.
    ``headline_scheme`` / ``headline_method``: the calibration scheme and ``Δ̄`` method of the summary's headline
    numbers and the figures."""

    dm_zero_rtol: float = 1e-3
    dm_zero_sensitivity: tuple = (1e-2, 1e-3, 1e-4, 1e-6)
    negative_rtol: float = 1e-9
    headline_scheme: str = "phase1_first_half"
    headline_method: str = "h14"

    def __post_init__(self):
        for name in ("dm_zero_rtol", "negative_rtol"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"LLMStudyConfig.{name} must be a finite number >= 0; got {v!r}")
        if self.headline_scheme not in CALIBRATION_SCHEMES:
            raise ValueError(f"LLMStudyConfig.headline_scheme must be one of {CALIBRATION_SCHEMES}; "
                             f"got {self.headline_scheme!r}")
        if self.headline_method not in DEVIATION_METHODS:
            raise ValueError(f"LLMStudyConfig.headline_method must be one of {DEVIATION_METHODS}; "
                             f"got {self.headline_method!r}")


# ================================================================================================ helpers


class RunDataMissing(ValueError):
    """The runs given to a study do not record what it reads (reported by :func:`~verification.llm.studies.run_llm_studies`, not raised)."""


def _clean(obj):
    """JSON-ready summary: numbers via :func:`verification.studies.synthetic._num` (NaN/inf -> None), strings kept."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, str):
        return obj
    return _num(obj)


def _sources(runs: Sequence[RunRecords]) -> list[tuple[str, RunRecords]]:
    """``(source key, run)``: the run's label (``LLM`` / ``synthetic``), made unique by the directory name."""
    if not runs:
        raise ValueError("no run to study: pass at least one RunRecords")
    labels = [r.label for r in runs]
    out = []
    for r in runs:
        key = r.label if labels.count(r.label) == 1 else f"{r.label}:{r.path.name}"
        out.append((key, r))
    return out


def _le(a, b) -> np.ndarray:
    """``a ≤ b`` up to :data:`COMPARE_RTOL` (NaN compares False)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return a <= b + COMPARE_RTOL * np.maximum(np.abs(b), np.abs(a))


def _frac(mask) -> float | None:
    m = np.asarray(mask, dtype=bool)
    return float(m.mean()) if m.size else None


def calibration_masks(it: pd.DataFrame, scheme: str) -> tuple[np.ndarray, np.ndarray, int]:
    """Calibration and test masks of the iterates ``it`` (:func:`~verification.llm.records.training_iterates`)
    under ``scheme`` (:data:`CALIBRATION_SCHEMES`), and ``t_0`` (the first test iterate)."""
    p1 = it["phase"] == "phase1"
    R = int(it.loc[p1, "round"].max())
    if scheme == "phase1_first_half":
        t0 = max(1, math.ceil(R / 2))
        cal = (it["t"] < t0).to_numpy()
    elif scheme == "phase1_for_phase2":
        t0 = R + 1
        cal = p1.to_numpy()
    else:
        raise ValueError(f"scheme must be one of {CALIBRATION_SCHEMES}; got {scheme!r}")
    return cal, ~cal, t0


def _cluster_constants(it: pd.DataFrame, cal: np.ndarray) -> pd.DataFrame:
    """Per (cluster, client) on the calibration rows: β̄ (cluster max), H̄ (cluster max), ρ_min, Δ̄ by both
    methods, and the largest recorded gradient bound ``B``."""
    c = it[cal]
    rows = []
    for cl, g in c.groupby("cluster", sort=True):
        beta_bar = float(g["beta"].max())
        H_bar = float(g["dispersion"].max())
        rho_min = float(it.loc[it["cluster"] == cl, "rho"].min())
        for i, gi in g.groupby("client", sort=True):
            rows.append(dict(cluster=int(cl), client=int(i), beta_bar=beta_bar, dispersion_bar=H_bar, rho_min=rho_min,
                             delta_bar_h14=math.sqrt(max(H_bar, 0.0) / rho_min),
                             delta_bar_window=float(gi["deviation"].max()), grad_bound_cal=float(g["grad_bound"].max()),
                             n_calibration_rounds=int(gi["t"].nunique())))
    return pd.DataFrame(rows)
