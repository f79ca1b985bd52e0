r"""Regression of an LLM run's summary quantities against a committed baseline (``python -m verification
llm-regression``).

An LLM run (``python -m llm_runs run``) on CPU with a fixed seed repeats itself up to floating-point noise: the
forward and backward passes run in bfloat16 autocast or float32, and a different torch thread count (or CPU
kernel) changes the order of the reductions. So its quantities are compared with tolerances that match that noise,
measured rather than guessed: a baseline is made from two or more runs of the same preset and seed (e.g. twice with
the default thread count and once with another), and every quantity gets

* ``exact`` comparison when it is discrete (cluster labels, LP status counts, LP modes) and every run agreed;
* otherwise ``|x − x₀| ≤ atol + rtol·|x₀|`` with ``rtol = max(RTOL_FLOOR, FACTOR · spread)``, ``spread`` the
  largest relative difference between the runs, ``RTOL_FLOOR`` the bfloat16 unit roundoff ``2⁻⁸`` (a quantity
  that came out bitwise equal in every run still gets that much), and ``atol = ATOL`` for values at 0.

A discrete quantity that differed between the baseline's runs is not compared (it is listed as unstable). The
quantities (:func:`run_quantities`) are read from the records only (:mod:`verification.llm.records`), so a change
of ``summary.json``'s layout does not move them: per client ``ψ_i`` at the base model ``w_ref``, at ``w_I`` and
``w_II`` and at the end of every adaptation pipeline, the ψ* estimate of each client, the cluster of each training
client, the LP status counts and the mean held-out accuracy of each objective at the end of each phase.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from verification.core.regression import Regression
from verification.llm.records import (
    ADAPTATION_PHASES,
    PIPELINE2_PHASE,
    PSI_STAR_PHASE,
    RunRecords,
    objective_columns,
)

__all__ = ["RTOL_FLOOR", "ATOL", "FACTOR", "run_quantities", "make_baseline", "compare_run", "load_baseline",
           "baseline_text", "regression_text"]

#: bfloat16 unit roundoff: the smallest relative tolerance of a continuous quantity.
RTOL_FLOOR = 2.0**-8
#: Absolute tolerance (quantities at 0, e.g. a gap of the best iterate).
ATOL = 1e-6
#: The tolerance is this multiple of the spread measured between the baseline's runs.
FACTOR = 10.0
_STATUS_COLS = ("n_optimal", "n_relaxed", "n_fallback", "n_infeasible", "n_iteration_limit", "n_solver_error",
                "n_descent_steps")


def _final(records, phase: str):
    g = records[records["phase"] == phase]
    return g[g["round"] == g.groupby("client")["round"].transform("max")].drop_duplicates("client", keep="last")


def run_quantities(run: RunRecords) -> dict[str, Any]:
    """The run's regression quantities: name -> number (continuous) or list/int (discrete: names start with
    ``exact.``)."""
    r = run.records
    q: dict[str, Any] = {}
    p1 = r[r["phase"] == "phase1"]
    for _, row in p1[p1["round"] == 0].iterrows():
        q[f"psi.w_ref.client{int(row['client'])}"] = float(row["psi"])
    for phase in ("phase1", "phase2", *ADAPTATION_PHASES, PIPELINE2_PHASE, PSI_STAR_PHASE):
        for _, row in _final(r, phase).iterrows():
            q[f"psi.{phase}.client{int(row['client'])}"] = float(row["psi"])
    for _, row in p1.drop_duplicates("client").iterrows():
        q[f"exact.cluster.client{int(row['client'])}"] = int(row["cluster"])
    for col in _STATUS_COLS:
        if col in r.columns:
            q[f"exact.lp_steps.{col}"] = int(r[col].sum())
    acc = objective_columns(run, "heldout_acc")
    for phase in ("phase1", "phase2", *ADAPTATION_PHASES, PIPELINE2_PHASE):
        f = _final(r, phase)
        for o, c in acc.items():
            if len(f):
                q[f"heldout_acc.{phase}.{o}"] = float(f[c].mean())
    return q


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), abs(b), ATOL)


def make_baseline(runs: list[RunRecords], *, notes: str = "") -> dict:
    """A baseline from repeated runs of one preset and seed (:data:`FACTOR`, :data:`RTOL_FLOOR`): values of the
    first run, tolerances from the spread between all of them."""
    if len(runs) < 2:
        raise ValueError(f"a baseline needs >= 2 runs of the same preset and seed to measure the noise; got {len(runs)}")
    qs = [run_quantities(r) for r in runs]
    keys = [k for k in qs[0] if all(k in q for q in qs[1:])]
    presets = {(r.summary.get("preset"), r.summary.get("seed")) for r in runs}
    if len(presets) != 1:
        raise ValueError(f"the runs must share one preset and seed; got {sorted(map(str, presets))}")
    out: dict[str, dict] = {}
    unstable = []
    for k in keys:
        vals = [q[k] for q in qs]
        if k.startswith("exact."):
            if all(v == vals[0] for v in vals):
                out[k] = {"value": vals[0], "compare": "exact"}
            else:
                unstable.append(k)
            continue
        spread = max(_rel(v, vals[0]) for v in vals)
        out[k] = {"value": vals[0], "compare": "tolerance", "spread": spread,
                  "rtol": max(RTOL_FLOOR, FACTOR * spread), "atol": ATOL}
    preset, seed = presets.pop()
    env = [r.summary.get("environment", {}) for r in runs]
    return {"preset": preset, "seed": seed, "n_runs": len(runs),
            "threads": [e.get("threads") for e in env], "torch": sorted({str(e.get("torch")) for e in env}),
            "rule": f"exact for discrete quantities; rtol = max({RTOL_FLOOR:g} (bf16 unit roundoff), {FACTOR:g} x "
                    f"the largest relative spread between the runs), atol = {ATOL:g}",
            "notes": notes, "unstable_not_compared": unstable, "quantities": out}


def load_baseline(path) -> dict:
    """Read a baseline written by :func:`make_baseline` (``ValueError`` naming the file when it is not one)."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except OSError as exc:
        raise ValueError(f"cannot read LLM baseline {str(p)!r}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ValueError(f"LLM baseline {str(p)!r} is not JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("quantities"), dict):
        raise ValueError(f"LLM baseline {str(p)!r} has no 'quantities' object")
    return doc


def compare_run(run: RunRecords, baseline: dict) -> Regression:
    """Compare ``run`` with ``baseline``: a :class:`~verification.core.regression.Regression` whose failures name each
    quantity outside its tolerance (and each baseline quantity the run lacks)."""
    reg = Regression()
    s = run.summary
    if (s.get("preset"), s.get("seed")) != (baseline.get("preset"), baseline.get("seed")):
        reg.failures.append(f"run is preset {s.get('preset')!r} seed {s.get('seed')!r}, the baseline preset "
                            f"{baseline.get('preset')!r} seed {baseline.get('seed')!r}")
        return reg
    q = run_quantities(run)
    for k, spec in baseline["quantities"].items():
        if k not in q:
            reg.failures.append(f"{k}: in the baseline, not in the run")
            continue
        reg.compared += 1
        v, v0 = q[k], spec["value"]
        if spec["compare"] == "exact":
            if v != v0:
                reg.failures.append(f"{k}: {v!r}, baseline {v0!r} (exact)")
            continue
        tol = spec["atol"] + spec["rtol"] * abs(v0)
        if not (math.isfinite(v) and abs(v - v0) <= tol):
            reg.failures.append(f"{k}: {v!r}, baseline {v0!r} (|diff| {abs(v - v0):.3g} > {tol:.3g})")
        elif abs(v - v0) > 0:
            reg.notes.append(f"{k}: moved by {abs(v - v0):.3g} (tolerance {tol:.3g})")
    reg.new = sorted(set(q) - set(baseline["quantities"]))
    return reg


def regression_text(reg: Regression) -> str:
    """The comparison of one run: quantities compared, regressions (each named), moves within tolerance."""
    lines = [f"LLM baseline comparison: {reg.compared} quantities compared, {len(reg.failures)} regression(s)"]
    lines += [f"  REGRESSION {f}" for f in reg.failures]
    lines += [f"  note {n}" for n in reg.notes]
    if reg.new:
        lines.append(f"  not in the baseline: {', '.join(reg.new)}")
    return "\n".join(lines)


def _max_spread(baseline: dict) -> float:
    sp = [v.get("spread", 0.0) for v in baseline["quantities"].values() if v["compare"] == "tolerance"]
    return float(np.max(sp)) if sp else 0.0


def baseline_text(baseline: dict) -> str:
    """One paragraph: what the baseline holds and how its tolerances were measured."""
    n_ex = sum(v["compare"] == "exact" for v in baseline["quantities"].values())
    n_tol = len(baseline["quantities"]) - n_ex
    return (f"LLM baseline: preset {baseline['preset']}, seed {baseline['seed']}, {baseline['n_runs']} runs (torch "
            f"threads {baseline['threads']}); {n_ex} exact and {n_tol} toleranced quantities; largest relative "
            f"spread between the runs {_max_spread(baseline):.3g}; {baseline['rule']}.")

