r"""The records of one run of Algorithm 1, read from its run directory: the one place that knows the file layout.

A *run directory* holds ``trajectory.csv`` (one row per phase, round and client: every column of
:data:`sim.algorithm.RECORD_COLUMNS`, then, for an LLM run, per-objective columns) and ``summary.json``. Two
programs write one:

* ``python -m sim.simulate --out DIR`` (a planted F1 problem: ``ψ_i*`` is planted, so the recorded gap
  ``r_i = ψ_i − ψ_i*`` is exact; no per-objective columns);
* ``python -m llm_runs run --out DIR`` (LoRA fine-tuning of a real LLM: ``ψ_i*`` is unknown and *estimated*, the
  recorded gap is ``r̂_i = ψ_i − ψ̂_i*`` with ``ψ̂_i* ≥ ψ_i*``, so ``r̂_i`` under-estimates the true suboptimality;
  per-objective columns ``loss_<objective>``, ``heldout_loss_<objective>``, ``heldout_acc_<objective>``; the
  clients' preferences in ``summary.json``; the clients' Grams and LP weights at the population-diagnostic rows,
  ``gram_<j>_<k>`` and ``mu_<j>`` (:mod:`sim.source`, ``record_lp_inputs``); and, optionally, ``clusterings.csv``:
  Phase 1 trained again for the Stage-1-only and random clusterings of Remark H.8's comparison, the same columns
  after ``clustering`` and ``draw``).

:func:`load_run` reads either, checks that the columns the studies use are there (a missing one is a
``ValueError`` naming the file and the column) and returns a :class:`RunRecords`. Everything that depends on a
column name or a summary field of the LLM run is in this module (:data:`LLM_PREFIXES`, :func:`objective_columns`,
:func:`_llm_prefs`), so a renamed column is changed here once. Verification never imports ``llm_runs`` or torch:
the run is only read.

Iterate conventions (THEOREMS.md §1.10): training rows hold population diagnostics at the round's server model
``w_r``; the row ``round = R`` of a phase holds the phase output (no step). Phase 2 starts at ``w_I``, so its
``round = 0`` row is the same iterate as Phase 1's last row (``t = R``). :func:`training_iterates` returns every
iterate of the concatenated trajectory once (Phase 1 rounds ``0..R``, Phase 2 rounds ``1..R'``);
:func:`step_rows` the rows at which a training step is taken (``local_steps > 0``; Phase 2's ``round = 0`` row is
its first step, with Phase 2's step size).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from sim.algorithm import RECORD_COLUMNS

__all__ = [
    "TRAJECTORY_FILE",
    "SUMMARY_FILE",
    "CLUSTERINGS_FILE",
    "TRAINING_PHASES",
    "ADAPTATION_PHASES",
    "PIPELINE2_PHASE",
    "PSI_STAR_PHASE",
    "LLM_PREFIXES",
    "REQUIRED_COLUMNS",
    "RunRecords",
    "load_run",
    "objective_columns",
    "training_iterates",
    "step_rows",
    "lambda_max",
    "lp_inputs",
    "clustering_comparison",
    "cluster_key",
]

TRAJECTORY_FILE = "trajectory.csv"
SUMMARY_FILE = "summary.json"
#: Optional: Phase 1 of the clusterings compared with Algorithm 1's (``python -m llm_runs run``).
CLUSTERINGS_FILE = "clusterings.csv"
#: The federated training phases of Algorithm 1, in trajectory order.
TRAINING_PHASES = ("phase1", "phase2")
#: New-client runs of :func:`sim.algorithm.run_algorithm` (Pipeline 1 from w_I / w_II, its AdamW run, the
#: baselines) and Pipeline 2, as record phases.
ADAPTATION_PHASES = ("pipeline1_wI", "pipeline1_wII", "pipeline1_wII_adamw", "local_only", "fedavg_adapt")
PIPELINE2_PHASE = "pipeline2"
#: Records of an LLM run's Pipeline-2 estimate of ψ_i* (before Algorithm 1).
PSI_STAR_PHASE = "psi_star_estimate"
#: Per-objective column prefixes of an LLM run: the client's population loss, the held-out DPO loss and the
#: held-out preference accuracy (ties count 1/2) of each objective at the row's model.
LLM_PREFIXES = {"loss": "loss_", "heldout_loss": "heldout_loss_", "heldout_acc": "heldout_acc_"}
#: Record columns the studies read (a run directory without one of them is rejected).
REQUIRED_COLUMNS = ("phase", "round", "t", "cluster", "client", "rho", "psi", "psi_star", "gap", "beta", "gain",
                    "lp_mode", "d_norm", "deviation", "dispersion", "margin_Jstar", "margin_Jeps", "dM_norm",
                    "eps_act", "grad_bound", "n_Jeps", "local_steps", "batch_size", "eta_eff", "alpha_adapt",
                    "preconditioner", "p_min", "p_max")
assert set(REQUIRED_COLUMNS) <= set(RECORD_COLUMNS)


@dataclass(frozen=True, eq=False)
class RunRecords:
    """One run directory, read.

    ``kind``: ``"llm"`` (the summary names a model) or ``"sim"``; ``records``: ``trajectory.csv``; ``summary``:
    ``summary.json``; ``objectives``: the objective names of an LLM run (None for a synthetic run, whose
    objectives are numbered); ``prefs``: client -> ``λ_i`` where the summary records it (an LLM run), else empty;
    ``psi_star``: ``"planted"`` (exact) or ``"estimated"`` (``ψ̂* ≥ ψ*``: the recorded gap under-estimates the
    suboptimality); ``status``: the run's status (``"complete"`` for a finished run); ``clusterings``: the records
    of ``clusterings.csv`` (None when the run has none)."""

    path: Path
    kind: str
    records: pd.DataFrame
    summary: dict
    objectives: tuple | None
    prefs: dict = field(default_factory=dict)
    psi_star: str = "planted"
    status: str = "complete"
    clusterings: pd.DataFrame | None = None

    @property
    def label(self) -> str:
        """``"LLM"`` or ``"synthetic"`` (the figures' column titles)."""
        return "LLM" if self.kind == "llm" else "synthetic"

    def describe(self) -> str:
        """One line: what ran (preset, model, clients, seed) and how ψ* is known."""
        s = self.summary
        if self.kind == "llm":
            model = (s.get("model") or {}).get("name", "an LLM")
            what = f"LLM run, preset {s.get('preset', '?')}, model {model}, seed {s.get('seed', '?')}"
        else:
            what = f"synthetic run (planted F1, sim.simulate), preset {s.get('preset', '?')}, seed {s.get('seed', '?')}"
        n_train, n_new = s.get("n_train_clients"), s.get("n_new_clients")
        if n_train is None:  # an LLM summary nests Algorithm 1's summary
            alg = s.get("algorithm") or {}
            n_train, n_new = alg.get("n_train_clients"), alg.get("n_new_clients")
        psi = ("ψ_i* planted (exact gaps)" if self.psi_star == "planted" else
               "ψ_i* estimated (ψ̂* ≥ ψ*: the recorded gaps under-estimate the suboptimality)")
        status = "" if self.status == "complete" else f"; run status {self.status!r}"
        return f"{what}: {n_train} training and {n_new} new clients; {psi}{status}"


def _read_summary(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise ValueError(f"cannot read run summary {str(path)!r}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ValueError(f"run summary {str(path)!r} is not JSON: {exc}") from None


def _llm_prefs(summary: dict) -> dict[int, np.ndarray]:
    """client -> λ_i from an LLM summary (``clients.clients[*].prefs``); empty when not recorded."""
    out = {}
    for c in ((summary.get("clients") or {}).get("clients") or []):
        if "client" in c and "prefs" in c:
            out[int(c["client"])] = np.asarray(c["prefs"], dtype=np.float64)
    return out


def load_run(path) -> RunRecords:
    """Read the run directory ``path`` (see the module docstring); ``ValueError`` naming the file, or the missing
    columns, when it is not a run directory of either kind."""
    d = Path(path)
    traj, summ = d / TRAJECTORY_FILE, d / SUMMARY_FILE
    for f in (traj, summ):
        if not f.is_file():
            raise ValueError(f"{str(d)!r} is not a run directory: {f.name} is missing")
    summary = _read_summary(summ)
    try:
        records = pd.read_csv(traj, low_memory=False)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read {str(traj)!r}: {exc}") from None
    missing = [c for c in REQUIRED_COLUMNS if c not in records.columns]
    if missing:
        raise ValueError(f"{str(traj)!r} lacks the record columns {missing} (the schema of sim.algorithm.RECORD_COLUMNS)")
    if records.empty:
        raise ValueError(f"{str(traj)!r} has no rows")
    kind = "llm" if ("model" in summary or "objectives" in summary) else "sim"
    objectives = tuple(summary["objectives"]) if kind == "llm" and summary.get("objectives") else None
    if kind == "llm" and objectives:
        missing = [LLM_PREFIXES["loss"] + o for o in objectives if LLM_PREFIXES["loss"] + o not in records.columns]
        if missing:
            raise ValueError(f"{str(traj)!r} lacks the per-objective columns {missing} of an LLM run")
    psi_star = "estimated" if kind == "llm" else "planted"
    clusterings = None
    cf = d / CLUSTERINGS_FILE
    listed = [c for c in ((summary.get("clustering_comparison") or {}).get("clusterings") or [])
              if isinstance(c, dict) and c.get("trained") and c.get("clustering") != "stage1_stage2"]
    if listed and not cf.is_file():
        raise ValueError(f"{str(d)!r}: summary.json lists trained clusterings of the comparison but "
                         f"{CLUSTERINGS_FILE} is missing")
    if cf.is_file():
        try:
            clusterings = pd.read_csv(cf, low_memory=False)
        except (OSError, ValueError) as exc:
            raise ValueError(f"cannot read {str(cf)!r}: {exc}") from None
        missing = [c for c in ("clustering", "draw", "cluster", "client", "round", "dispersion")
                   if c not in clusterings.columns]
        if missing:
            raise ValueError(f"{str(cf)!r} lacks the columns {missing}")
    return RunRecords(path=d, kind=kind, records=records, summary=summary, objectives=objectives,
                      prefs=_llm_prefs(summary) if kind == "llm" else {}, psi_star=psi_star,
                      status=str(summary.get("status", "complete")), clusterings=clusterings)


def objective_columns(run: RunRecords, what: str) -> dict[str, str]:
    """objective -> column of the per-objective quantity ``what`` (a key of :data:`LLM_PREFIXES`) that the run
    records (empty for a synthetic run, or when the run does not record it)."""
    if what not in LLM_PREFIXES:
        raise ValueError(f"what must be one of {sorted(LLM_PREFIXES)}; got {what!r}")
    if not run.objectives:
        return {}
    cols = {o: LLM_PREFIXES[what] + o for o in run.objectives}
    return cols if all(c in run.records.columns for c in cols.values()) else {}


def training_iterates(run: RunRecords) -> pd.DataFrame:
    """Every iterate of the concatenated Phase-1/Phase-2 trajectory once per (cluster, client): Phase 1 rows
    ``round = 0..R`` (``w_ref .. w_I``) and Phase 2 rows ``round >= 1`` (up to ``w_II``), sorted by ``t``."""
    r = run.records
    p1 = r[r["phase"] == "phase1"]
    p2 = r[(r["phase"] == "phase2") & (r["round"] >= 1)]
    if p1.empty:
        raise ValueError(f"run {str(run.path)!r} has no Phase-1 records")
    return pd.concat([p1, p2]).sort_values(["cluster", "t", "client"], kind="stable").reset_index(drop=True)


def step_rows(run: RunRecords) -> pd.DataFrame:
    """The training rows at which a step is taken (``local_steps > 0``) in Phase 1 and Phase 2."""
    r = run.records
    return r[r["phase"].isin(TRAINING_PHASES) & (r["local_steps"] > 0)].reset_index(drop=True)


def lambda_max(run: RunRecords, rows: pd.DataFrame) -> np.ndarray:
    """``λ_max,i = ‖λ_i‖_∞`` of the client of every row: from the recorded preferences (an LLM run), else
    recovered from the row's near-active width ``ε_act = 2·eta_eff·λ_max·B²`` (``eps_act``, ``eta_eff``,
    ``grad_bound``; exact up to rounding). NaN where neither is recorded."""
    clients = rows["client"].to_numpy(np.int64)
    if run.prefs:
        table = {i: float(np.max(p)) for i, p in run.prefs.items()}
        return np.array([table.get(int(i), math.nan) for i in clients])
    with np.errstate(divide="ignore", invalid="ignore"):
        return (rows["eps_act"] / (2.0 * rows["eta_eff"] * rows["grad_bound"] ** 2)).to_numpy(np.float64)


def lp_inputs(run: RunRecords, rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray] | None:
    """``(C, μ)`` of ``rows``: the Grams ``(n, m, m)`` and LP weights ``(n, m)`` recorded in the columns
    ``gram_<j>_<k>`` / ``mu_<j>`` (:mod:`sim.source`, ``record_lp_inputs``); None when the run does not record
    them. Rows without them (adaptation rows) are NaN."""
    mus = sorted((c for c in rows.columns if c.startswith("mu_") and c[3:].isdigit()), key=lambda c: int(c[3:]))
    m = len(mus)
    if m == 0 or [int(c[3:]) for c in mus] != list(range(m)):
        return None
    need = [f"gram_{j}_{k}" for j in range(m) for k in range(j, m)]
    if any(c not in rows.columns for c in need):
        return None
    C = np.empty((len(rows), m, m))
    for j in range(m):
        for k in range(j, m):
            C[:, j, k] = C[:, k, j] = rows[f"gram_{j}_{k}"].to_numpy(np.float64)
    return C, rows[mus].to_numpy(np.float64)


def clustering_comparison(run: RunRecords) -> list[dict]:
    """The clusterings of ``clusterings.csv`` as the run describes them (``summary.json``:
    ``clustering_comparison.clusterings``: ``clustering``, ``draw``, ``clusters`` (client ids), ``trained`` and,
    for one not trained again, ``same_as``); empty when not recorded."""
    info = run.summary.get("clustering_comparison") or {}
    return [dict(c) for c in info.get("clusterings", []) if isinstance(c, dict)]


def cluster_key(run: RunRecords) -> str:
    """The Stage-1 key of the run's clustering (``"ordering"`` or ``"bottleneck"``, :class:`sim.algorithm.
    ClusterConfig`): from the LLM run's preset (``preset_config.algorithm.cluster``) or the synthetic run's
    parameters (``params.cluster``); ``ValueError`` when the summary records neither."""
    s = run.summary
    for path in (("preset_config", "algorithm", "cluster"), ("params", "cluster")):
        d = s
        for k in path:
            d = d.get(k) if isinstance(d, dict) else None
        if isinstance(d, dict) and d.get("key") in ("ordering", "bottleneck"):
            return str(d["key"])
    raise ValueError(f"run summary {str(run.path / SUMMARY_FILE)!r} records no clustering key "
                     "(preset_config.algorithm.cluster.key or params.cluster.key)")
