"""Records and results of Algorithm 1 (:mod:`sim.algorithm`): the record columns, the result types of a phase, of
the new-client pipelines and of a full run, and the recorder that collects a phase's rows into one tidy DataFrame
(handing each round's rows to an ``on_rows`` sink as they are made)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from sim.cluster import Clustering
from sim.direction import STATUSES
from sim.source import Source

Progress = Callable[[str, int, int], None]
#: Receives the record rows of each round as they are made (a DataFrame with the records' columns).
RowSink = Callable[[pd.DataFrame], None]


#: Columns of every record DataFrame, in order.
RECORD_COLUMNS = (
    "phase", "round", "t", "cluster", "client", "rho",
    "psi", "psi_star", "gap", "beta", "gain", "lp_mode", "lp_status", "lp_from_step",
    "d_norm", "deviation", "dispersion", "margin_Jstar", "margin_Jeps", "dM_norm", "eps_act", "grad_bound", "n_Jeps",
    "n_lp_steps", "n_optimal", "n_relaxed", "n_fallback", "n_infeasible", "n_iteration_limit",
    "n_solver_error", "n_descent_steps",
    "local_steps", "batch_size", "eta_local", "eta_meta_inner", "alpha_server", "eta_eff", "alpha_adapt",
    "preconditioner", "p_min", "p_max", "p_at_lower", "p_at_upper",
)
_COUNT_COLUMNS = tuple(f"n_{s}" for s in STATUSES)


@dataclass(frozen=True, eq=False)
class PhaseResult:
    """Output of :func:`phase1`, :func:`phase2` or :func:`fedavg` for one cluster.

    ``w``: the final model ``(n_w,)``; ``trajectory``: ``(R+1, n_w)`` server models ``w_0..w_R`` (None with
    ``keep_trajectory=False``), both in the source's array type; ``records``: the tidy DataFrame (rows
    ``round = 0..R``); ``step_status_counts``: statuses of every LP solved by training steps;
    ``diagnostic_status_counts``: statuses of the separate diagnostic LPs; ``B``: the gradient bound at the end."""

    w: Any
    trajectory: Any
    records: pd.DataFrame
    step_status_counts: dict
    diagnostic_status_counts: dict
    B: float


@dataclass(frozen=True, eq=False)
class AdaptResult:
    """Output of :func:`pipeline1` / :func:`pipeline2` / :func:`local_only` for a batch of new clients.

    ``w``: final models ``(n, n_w)``; ``trajectory``: ``(K+1, n, n_w)`` (None with ``keep_trajectory=False``), both
    in the source's array type; ``gap``: final ``ψ_i(w) - ψ_i*`` ``(n,)``; ``beta``: final ``β_i`` ``(n,)``;
    ``records``: DataFrame; ``step_status_counts``; ``steps``: steps taken."""

    w: Any
    trajectory: Any
    gap: np.ndarray
    beta: np.ndarray
    records: pd.DataFrame
    step_status_counts: dict
    steps: int


@dataclass(frozen=True, eq=False)
class AlgorithmResult:
    """Output of :func:`run_algorithm`. ``records``: every row of every phase; ``summary``: final gaps and counts;
    ``w_ref`` ``(n_w,)`` and ``w_I``, ``w_II``, ``w_fedavg`` ``(n_clusters, n_w)`` in the source's array type."""

    clustering: Clustering
    train_clients: np.ndarray
    new_clients: np.ndarray
    assignment: np.ndarray
    w_ref: Any
    w_I: Any
    w_II: Any
    w_fedavg: Any
    phases: dict
    adaptation: dict
    records: pd.DataFrame
    summary: dict


def _zero_counts() -> dict:
    return {s: 0 for s in STATUSES}


def _add_counts(total: dict, status: np.ndarray) -> None:
    for s in STATUSES:
        total[s] += int(np.count_nonzero(status == s))


class _Recorder:
    """Collects per-round column arrays; builds one DataFrame at the end. ``extra`` columns of a row (the source's
    :func:`_record_metrics`) follow :data:`RECORD_COLUMNS` in the order first seen; ``sink`` receives the rows of
    every ``add`` as a DataFrame at once (records written as a run goes)."""

    def __init__(self, sink: RowSink | None = None):
        self.parts: list[dict] = []
        self.extra: list[str] = []
        self.sink = sink

    def add(self, extra: dict | None = None, **cols) -> None:
        n = next((int(v.shape[0]) for v in cols.values() if isinstance(v, np.ndarray) and v.ndim == 1), None)
        if n is None:
            raise ValueError(f"a record row needs a per-client column; got {sorted(cols)}")
        part = {k: (v if isinstance(v, np.ndarray) and v.ndim == 1 else np.full(n, v)) for k, v in cols.items()}
        for k, v in (extra or {}).items():
            part[k] = np.broadcast_to(np.asarray(v), (n,))
            if k not in self.extra:
                self.extra.append(k)
        self.parts.append(part)
        if self.sink is not None:
            self.sink(self._frame([part]))

    def _frame(self, parts: list[dict]) -> pd.DataFrame:
        cols = RECORD_COLUMNS + tuple(self.extra)
        if not parts:
            return pd.DataFrame({c: [] for c in cols})
        sizes = [len(next(iter(p.values()))) for p in parts]
        return pd.DataFrame({c: np.concatenate([p[c] if c in p else np.full(n, np.nan)
                                                for p, n in zip(parts, sizes, strict=True)]) for c in cols})

    def frame(self, params: dict) -> pd.DataFrame:
        df = self._frame(self.parts)
        df.attrs["params"] = params
        return df


def _record_metrics(src: Source, W, clients: np.ndarray, losses: np.ndarray) -> dict | None:
    """Extra record columns of the rows ``W`` from the source's optional ``record_metrics(W, clients, losses)``
    (``{name: (n,) float64}``, e.g. per-objective losses and held-out accuracy of an LLM source); None without."""
    fn = getattr(src, "record_metrics", None)
    return None if fn is None else fn(W, clients, losses)


_NAN_COLS = dict(deviation=np.nan, dispersion=np.nan, margin_Jstar=np.nan, margin_Jeps=np.nan, dM_norm=np.nan,
                 eps_act=np.nan, grad_bound=np.nan, n_Jeps=np.nan, rho=np.nan, eta_local=np.nan, eta_meta_inner=np.nan,
                 alpha_server=np.nan, eta_eff=np.nan, alpha_adapt=np.nan, preconditioner="none", p_min=np.nan,
                 p_max=np.nan, p_at_lower=np.nan, p_at_upper=np.nan, local_steps=np.nan, batch_size=np.nan)
