"""The record files of an LLM run (:mod:`llm_runs.runs.run`): ``trajectory.csv`` written as the rows come
(:class:`RecordWriter`), ``summary.json`` (:func:`write_json`), and what the summary computes from the records: the
final ``ψ̂_i*`` and the gaps against it (:func:`rebase_psi_star`, :func:`set_gaps`), the theory's hypotheses along
the run, the gradient conflict at the base model and the new clients' adaptation table.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from sim import cli

__all__ = ["RecordWriter", "adaptation_table", "gradient_conflict_table", "hypothesis_diagnostics", "rebase_psi_star", "set_gaps",
           "write_json"]


class RecordWriter:
    """Appends record rows to ``path`` (CSV) as they are made, with the columns of the first rows it gets; the
    file is replaced at the end by :meth:`finish`."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.columns: list[str] | None = None
        self.rows = 0

    def __call__(self, frame: pd.DataFrame) -> None:
        header = self.columns is None
        if header:
            self.columns = list(frame.columns)
        frame.reindex(columns=self.columns).to_csv(self.path, mode="w" if header else "a", header=header,
                                                   index=False)
        self.rows += len(frame)

    def finish(self, records: pd.DataFrame) -> None:
        cli.atomic_write_text(self.path, records.to_csv(index=False))


def _json_default(x):
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        return float(x)
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, np.bool_):
        return bool(x)
    return str(x)


def write_json(path: Path, obj: dict) -> None:
    cli.atomic_write_text(path, json.dumps(obj, indent=1, default=_json_default, allow_nan=True))


def _where(row) -> str:
    """Where a record row comes from: its phase and round (and clustering of the comparison, if any)."""
    out = f"{row['phase']} round {int(row['round'])}"
    if isinstance(row.get("clustering"), str):
        out += f" ({row['clustering']} clustering, draw {int(row['draw'])})"
    return out


def set_gaps(records: pd.DataFrame, psi_star: np.ndarray) -> pd.DataFrame:
    """``records`` with ``psi_star`` and ``gap = psi − psi_star`` recomputed from the per-client ``psi_star``."""
    recs = records.copy()
    recs["psi_star"] = np.asarray(psi_star, dtype=np.float64)[recs["client"].to_numpy(np.int64)]
    recs["gap"] = recs["psi"] - recs["psi_star"]
    return recs


def rebase_psi_star(records: pd.DataFrame, summary: dict, psi_star: np.ndarray, *,
                    extra: pd.DataFrame | None = None) -> tuple[pd.DataFrame, dict, dict]:
    """Lower every client's ``ψ̂_i*`` to the smallest ``ψ_i`` in ``records`` and ``extra`` (further records of the
    run, e.g. the clustering comparison; each ``ψ_i`` is an upper bound of ``ψ_i*``), and recompute the records'
    ``psi_star`` and ``gap`` and the gaps of :func:`sim.algorithm.run_algorithm`'s ``summary`` (computed against
    ``psi_star``). Returns the records, the summary and, per client, the estimate before and after and where the
    minimum came from (``extra``'s gaps: :func:`set_gaps` with the ``final`` estimates)."""
    final = np.asarray(psi_star, dtype=np.float64).copy()
    where: dict[int, str] = {}
    seen = records if extra is None or extra.empty else pd.concat([records, extra], ignore_index=True)
    for i, grp in seen.groupby("client"):
        i = int(i)
        k = grp["psi"].idxmin()
        where[i] = "psi_star_estimate (Pipeline 2 on the client's own data)"
        if grp.at[k, "psi"] < final[i]:
            final[i] = float(grp.at[k, "psi"])
            where[i] = _where(grp.loc[k])
    recs = set_gaps(records, final)
    shift = np.asarray(psi_star, dtype=np.float64) - final  # new gap = old gap + shift
    out = json.loads(json.dumps(summary, default=_json_default))
    for c in out.get("clusters", []):
        for key in ("gap_w_ref", "gap_w_I", "gap_w_II", "gap_fedavg"):
            c[key] = [g + float(shift[i]) for g, i in zip(c[key], c["clients"], strict=True)]
    for row in out.get("new_clients", []):
        i = row["client"]
        row["psi_star"] = float(final[i])
        for key in ("start_gap", "final_gap"):
            row[key] = {k: v + float(shift[i]) for k, v in row[key].items()}
    if out.get("new_clients"):
        for key, src in (("mean_final_gap", "final_gap"), ("mean_start_gap", "start_gap")):
            out[key] = {k: float(np.mean([r[src][k] for r in out["new_clients"]])) for k in out[key]}
    info = {int(i): {"estimate_before_run": float(psi_star[i]), "final": float(final[i]), "attained_in": where[i]}
            for i in sorted(where)}
    return recs, out, info


def hypothesis_diagnostics(records: pd.DataFrame) -> dict:
    """The theory's hypotheses along the run, per phase: β (H.22's β̄), the H.19 margins (their sign), H_Cn."""
    out = {}
    for phase, g in records.groupby("phase", sort=False):
        steps = g[g["lp_status"] != "none"]
        d: dict[str, object] = {"rows": int(len(g)), "beta_max": float(g["beta"].max()),
                                "beta_median": float(g["beta"].median())}
        for col in ("margin_Jstar", "margin_Jeps"):
            v = steps[col].dropna()
            if len(v):
                d[f"{col}_min"] = float(v.min())
                d[f"{col}_positive_share"] = float((v > 0).mean())
        disp = g["dispersion"].dropna()
        if len(disp):
            d["dispersion_max"] = float(disp.max())
            d["dispersion_last"] = float(disp.iloc[-1])
        gain = steps["gain"].dropna()
        if len(gain):
            d["gain_positive_share"] = float((gain > 0).mean())
        modes = steps["lp_mode"].value_counts()
        d["lp_modes"] = {str(k): int(v) for k, v in modes.items()}
        out[str(phase)] = d
    return out


def gradient_conflict_table(clients: np.ndarray, losses: np.ndarray, gram: np.ndarray, objectives) -> dict:
    """The normalised Gram (cosines of the per-objective gradients) of every client, and per objective pair its
    mean, min and max over clients."""
    norms = np.sqrt(np.diagonal(gram, axis1=1, axis2=2))
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = gram / (norms[:, :, None] * norms[:, None, :])
    per_client = [{"client": int(i), "losses": losses[c].tolist(), "grad_norms": norms[c].tolist(),
                   "cosine": cos[c].tolist()} for c, i in enumerate(clients)]
    pairs = []
    m = len(objectives)
    for a in range(m):
        for b in range(a + 1, m):
            v = cos[:, a, b]
            pairs.append({"a": objectives[a], "b": objectives[b], "mean": float(np.mean(v)), "min": float(np.min(v)),
                          "max": float(np.max(v)), "negative_share": float(np.mean(v < 0))})
    return {"per_client": per_client, "pairs": pairs}


def adaptation_table(summary: dict, objectives, records: pd.DataFrame) -> list[dict]:
    """Per new client: final r̂ of every pipeline and baseline, and its held-out accuracy at the end of each."""
    rows = []
    for r in summary.get("new_clients", []):
        i = r["client"]
        acc = {}
        for phase, g in records[records["client"] == i].groupby("phase"):
            last = g[g["round"] == g["round"].max()].iloc[-1]
            acc[str(phase)] = {o: float(last.get(f"heldout_acc_{o}", math.nan)) for o in objectives}
        rows.append({**r, "final_heldout_accuracy": acc})
    return rows
