r"""Simulation grids on the Dask engine (``python -m verification grid``): the gap between Pipeline 1 and Pipeline 2
of Algorithm 1 for a new client, as a function of its budget ``K`` (steps) × ``S`` (samples per step) and of the
preference spread.

.. code-block:: text

    python -m verification grid K=1,4,16,64 S=4,16,64 delta_lambda=0.02,0.05,0.2 --seeds A:B
                                [--preset smoke|paper] [--workers K | --scheduler ADDRESS] --out DIR

Each cell is one point of the grid at one seed: ``python -m sim.simulate --preset PRESET --seed SEED`` with the new
clients' Pipeline 1 budget set to ``K`` steps of fresh batches of ``S`` samples (:class:`sim.algorithm.AdaptConfig`
``K``, ``S``; the AdamW run likewise) and the planted preference spread ``s_u = delta_lambda`` of the problem
(:func:`sim.simulate.preset_variant`): the mixing weights of every client are ``u_i = |u_0 (1 + s_u ξ)|``, so
``s_u`` sets the preference spread ``δ_λ = max ‖λ_new − λ_i‖`` over a cluster, which each cell also measures
(``delta_lambda`` of its summary; ``delta_lambda_realized`` in the grid table). A grid axis left out keeps the
preset's value. The cell's result is the ``summary.json`` of ``sim.simulate`` (without the trajectory) and the
gaps

    gap_wII = mean over new clients of [ψ_new(Pipeline 1 from w_II) − ψ_new(Pipeline 2)],

and ``gap_wI`` likewise from ``w_I`` (ψ_new − ψ*_new at the end of each pipeline; Pipeline 2 is data-rich local
training, so the gap is what the few-shot budget costs). The folder ``DIR`` holds ``cells/<point>/<seed>.json``
(``<point>`` = ``K=4,S=16,delta_lambda=0.05``), ``params.json`` (the preset), ``grid.csv`` and ``grid.json``: per
grid point the number of seeds, the mean of each gap over the seeds and its two-sided 95% Student-t confidence
interval ``mean ± t_{0.975, n−1} s/√n`` (seeds independent), and ``figures/pipeline_gap.png``: the mean gap
against ``K`` with its confidence band, one line per ``S``, one panel per preference spread.
"""

from __future__ import annotations

import itertools
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sim.cli import atomic_write_text
from sim.simulate import PRESETS, preset_variant, simulate
from verification.core.evidence import to_jsonable
from verification.core.registry import print_traceback
from verification.engine.dask_engine import (
    CELLS_DIR,
    Cell,
    CellFolderError,
    CellRun,
    folder_params,
    read_cell,
    run_cells,
    write_params,
)

__all__ = ["GRID_KIND", "AXES", "CONFIDENCE", "GridError", "GridPoint", "parse_axes", "grid_points", "grid_params",
           "grid_cell", "grid_cells", "run_grid", "read_grid_cells", "summarize_grid", "write_grid"]

GRID_KIND = "prefalign-verify simulation grid"
#: The grid's axes and what each sets: the new clients' Pipeline 1 steps K and batch S, the planted spread.
AXES = {"K": "steps of Pipeline 1 (AdaptConfig.K)", "S": "samples per step of Pipeline 1 (AdaptConfig.S)",
        "delta_lambda": "planted preference spread s_u of the problem (ProblemSpec.spread)"}
#: Two-sided level of the confidence intervals over seeds.
CONFIDENCE = 0.95
GAPS = {"gap_wII": "pipeline1_wII", "gap_wI": "pipeline1_wI"}


class GridError(ValueError):
    """A grid specification that cannot be run (an unknown axis, a bad value)."""


@dataclass(frozen=True)
class GridPoint:
    K: int
    S: int
    delta_lambda: float

    @property
    def name(self) -> str:
        return f"K={self.K},S={self.S},delta_lambda={self.delta_lambda!r}"


def _axis_values(axis: str, text: str, preset: str) -> list:
    vals = []
    for part in text.split(","):
        part = part.strip()
        try:
            v = int(part, 10) if axis in ("K", "S") else float(part)
        except ValueError:
            kind = "integers" if axis in ("K", "S") else "numbers"
            raise GridError(f"{axis}: values must be {kind} separated by commas; got {part!r}") from None
        if axis in ("K", "S") and v < 1:
            raise GridError(f"{axis}: values must be >= 1; got {v}")
        if axis == "delta_lambda" and not (math.isfinite(v) and v >= 0):
            raise GridError(f"delta_lambda: values must be finite and >= 0; got {part!r}")
        if axis == "S" and v > PRESETS[preset].problem.new_samples:
            raise GridError(f"S: {v} exceeds the {PRESETS[preset].problem.new_samples} samples of a new client of "
                            f"preset {preset!r}")
        if v not in vals:
            vals.append(v)
    return vals


def parse_axes(specs: list[str], preset: str = "smoke") -> dict[str, list]:
    """The grid axes from ``["K=1,4", "S=4,16", "delta_lambda=0.05"]``; an axis left out keeps ``preset``'s value.
    Raises :class:`GridError` naming the bad item."""
    if preset not in PRESETS:
        raise GridError(f"unknown preset {preset!r}; presets: {', '.join(sorted(PRESETS))}")
    axes: dict[str, list] = {}
    for spec in specs:
        axis, sep, text = spec.partition("=")
        axis = axis.strip()
        if not sep or not text.strip():
            raise GridError(f"grid axes are AXIS=V1,V2,... with AXIS one of {', '.join(AXES)}; got {spec!r}")
        if axis not in AXES:
            raise GridError(f"unknown grid axis {axis!r} in {spec!r}; axes: {', '.join(AXES)}")
        if axis in axes:
            raise GridError(f"grid axis {axis} given twice")
        axes[axis] = _axis_values(axis, text, preset)
    p = PRESETS[preset]
    axes.setdefault("K", [p.config.adapt.K])
    axes.setdefault("S", [p.config.adapt.S])
    axes.setdefault("delta_lambda", [p.problem.spread])
    return {a: axes[a] for a in AXES}


def grid_points(axes: dict[str, list]) -> list[GridPoint]:
    return [GridPoint(int(k), int(s), float(d)) for d, s, k in itertools.product(
        axes["delta_lambda"], axes["S"], axes["K"])]


def grid_params(preset: str) -> dict[str, Any]:
    return folder_params(GRID_KIND, preset=preset)


def grid_cell(preset: str, K: int, S: int, delta_lambda: float, seed: int) -> dict[str, Any]:
    """One grid cell (runs on a worker): the ``sim.simulate`` summary of ``preset`` with the grid point's
    ``K``, ``S`` and spread at ``seed``, plus ``grid`` (the point) and the gaps ``gap_wII``, ``gap_wI``. A run
    that raises gives ``{"grid", "seed", "error"}`` (traceback on the worker's stderr)."""
    t0 = time.perf_counter()
    point = {"K": int(K), "S": int(S), "delta_lambda": float(delta_lambda)}
    try:
        _, summary = simulate(preset_variant(PRESETS[preset], K=K, S=S, spread=delta_lambda), seed)
    except Exception as exc:  # noqa: BLE001 - recorded as the cell's result; the grid goes on
        print_traceback(exc)
        return {"grid": point, "preset": preset, "seed": int(seed), "error": repr(exc)}
    final = summary["mean_final_gap"]
    summary.update(preset=preset, seed=int(seed), seconds=time.perf_counter() - t0, grid=point,
                   **{g: final[p] - final["pipeline2"] for g, p in GAPS.items()})
    return to_jsonable(summary)


def _cell_path(out: Path, point: GridPoint, seed: int) -> Path:
    return out / CELLS_DIR / point.name / f"{int(seed)}.json"


def grid_cells(out: str | Path, preset: str, points: list[GridPoint], seeds) -> list[Cell]:
    out = Path(out)
    return [Cell(f"{pt.name}/{seed}", _cell_path(out, pt, seed), grid_cell,
                 (preset, pt.K, pt.S, pt.delta_lambda, int(seed))) for seed in seeds for pt in points]


def run_grid(client, out: str | Path, preset: str, points: list[GridPoint], seeds, *, progress: bool = True
             ) -> CellRun:
    """Run the grid cells not yet in ``out`` on the cluster of ``client`` (``params.json`` first)."""
    write_params(out, grid_params(preset))
    return run_cells(client, grid_cells(out, preset, points, seeds), desc="grid", progress=progress)


def read_grid_cells(out: str | Path, points: list[GridPoint], seeds) -> dict[GridPoint, dict[int, dict]]:
    """The finished cells: ``{point: {seed: result}}`` (raises :class:`CellFolderError` for an unreadable one)."""
    out = Path(out)
    found: dict[GridPoint, dict[int, dict]] = {pt: {} for pt in points}
    for pt in points:
        for seed in seeds:
            p = _cell_path(out, pt, seed)
            if not p.is_file():
                continue
            rec = read_cell(p)
            if not isinstance(rec, dict) or rec.get("grid") != {"K": pt.K, "S": pt.S, "delta_lambda": pt.delta_lambda}:
                raise CellFolderError(f"{str(p)!r} is not a result of the grid point {pt.name}: remove it to compute "
                                      "the cell again")
            found[pt][int(seed)] = rec
    return found


def _mean_ci(x: np.ndarray) -> tuple[float, float, float, float]:
    """(mean, standard deviation, CI low, CI high) of the values ``x`` over seeds (NaN interval for n < 2)."""
    from scipy import stats

    n = x.size
    if n == 0:
        return (math.nan,) * 4
    m = float(x.mean())
    if n < 2:
        return m, math.nan, math.nan, math.nan
    sd = float(x.std(ddof=1))
    h = float(stats.t.ppf(0.5 + CONFIDENCE / 2, n - 1)) * sd / math.sqrt(n)
    return m, sd, m - h, m + h


def summarize_grid(cells: dict[GridPoint, dict[int, dict]]):
    """The grid table (a DataFrame, one row per grid point): ``K, S, delta_lambda, seeds, errors``, per gap
    ``<gap>_mean, <gap>_sd, <gap>_ci_low, <gap>_ci_high``, the mean final gaps of Pipeline 1 from w_II and of
    Pipeline 2, and the mean realised spread ``delta_lambda_realized``."""
    import pandas as pd

    rows = []
    for pt, by_seed in cells.items():
        ok = [r for r in by_seed.values() if "error" not in r]
        row: dict[str, Any] = {"K": pt.K, "S": pt.S, "delta_lambda": pt.delta_lambda, "seeds": len(ok),
                               "errors": len(by_seed) - len(ok)}
        for g in GAPS:
            m, sd, lo, hi = _mean_ci(np.array([r[g] for r in ok], dtype=np.float64))
            row.update({f"{g}_mean": m, f"{g}_sd": sd, f"{g}_ci_low": lo, f"{g}_ci_high": hi})
        for name in ("pipeline1_wII", "pipeline2"):
            row[f"{name}_mean"] = float(np.mean([r["mean_final_gap"][name] for r in ok])) if ok else math.nan
        row["delta_lambda_realized"] = float(np.mean([r["delta_lambda"] for r in ok])) if ok else math.nan
        rows.append(row)
    return pd.DataFrame(rows)


def write_grid(out: str | Path, table, *, preset: str, seeds, run: CellRun | None = None) -> None:
    """Write ``grid.csv`` and ``grid.json`` to ``out`` (the figure ``figures/pipeline_gap.png`` is the report's:
    :func:`verification.report.figures.draw_grid`)."""
    out = Path(out)
    atomic_write_text(out / "grid.csv", table.to_csv(index=False))
    seeds = list(seeds)
    doc = {**grid_params(preset), "confidence": CONFIDENCE, "seeds": [seeds[0], seeds[-1] + 1],
           "gaps": {g: f"mean over new clients of psi_new({p}) - psi_new(pipeline2)" for g, p in GAPS.items()},
           "points": table.to_dict(orient="records")}
    if run is not None:
        doc["last_run"] = {"computed": len(run.written), "kept": len(run.kept), "failed": run.failed,
                           "wall_seconds": run.seconds}
    atomic_write_text(out / "grid.json", json.dumps(to_jsonable(doc), indent=1, allow_nan=False) + "\n")


def screen(table, out: Path, run: CellRun | None, drawn: dict[str, str], missing: dict[str, str]) -> str:
    lines = []
    if run is not None:
        lines += run.screen_lines("grid", out / CELLS_DIR)
    lines.append(f"  Pipeline 1 (from w_II) minus Pipeline 2, mean over seeds [{100 * CONFIDENCE:.0f}% CI]:")
    for r in table.to_dict(orient="records"):
        lines.append(f"    K={r['K']:<4} S={r['S']:<5} delta_lambda={r['delta_lambda']:<8g} "
                     f"(realised {r['delta_lambda_realized']:.3g}, {r['seeds']} seeds): {r['gap_wII_mean']:.4g} "
                     f"[{r['gap_wII_ci_low']:.3g}, {r['gap_wII_ci_high']:.3g}]"
                     + (f"  ({r['errors']} cells raised)" if r["errors"] else ""))
    lines.append(f"  wrote {out / 'grid.csv'}, {out / 'grid.json'}"
                 + "".join(f", {out / 'figures' / f}" for f in drawn))
    lines += [f"  figure {f} not drawn: {why}" for f, why in missing.items()]
    return "\n".join(lines)
