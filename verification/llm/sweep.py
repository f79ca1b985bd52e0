r"""The hypotheses of the LLM run studies across the seeds of an LLM sweep (``report --llm-sweep DIR``).

An LLM sweep folder (``python -m llm_runs sweep --preset study --seeds A:B --out DIR``) holds one ordinary run
directory per seed, ``DIR/runs/<seed>/`` (read by :func:`verification.llm.records.load_run`). Per seed,
:func:`hypotheses_across_seeds` runs the run studies of :mod:`verification.llm.studies` on that seed's run alone
(nothing is re-derived here: every number is read from a study's summary) and takes from each study the
quantities the dashboard's headline table shows for one run (:func:`verification.report.llm_section.headline_rows`):

* eq 71: share of the test rounds where it holds (Phase 1 and Phase 2, constants from the first half of Phase 1;
  Phase 2 with constants from all of Phase 1);
* Lemma H.20 (ii) on ``J*`` and on ``J*_ε``: share of negative numerators and ``σ̂`` (the smallest ratio), and the
  share of steps with ``d_M ≈ 0``;
* ``H_Cn``: its time mean for the Stage-1+2 clusters; the Phase-1 time means of the Stage-1+2, Stage-1-only and
  random clusterings of the run's comparison and Stage-1+2 over random; the share of multi-client cluster iterates
  with a common non-degenerate LP basis (H.6); and, where the run's summary records it
  (``summary.json["personalisation"]["hcn_at_w_ref"]``, the study preset), ``H_Cn`` at the base model ``w_ref`` of
  the Stage-1+2, Stage-1-only and ≥ 10 random partitions with the Stage-1+2 cluster sizes: per seed the Stage-1+2
  value's rank and mid-rank percentile among the random draws (ties count half), its ratio to the random draws'
  mean, the random draws' 2.5–97.5 % interval, and whether Stage-1-only is the Stage-1+2 partition;
* the contraction band: ``c_d`` (mean over clusters), the mean band ``ε̂_0,i``, the share of test iterates within
  the eq-75 bound and where H.19 holds;
* the new clients at the largest ``K``: Pipeline 1 (``w_I``, ``w_II``, ``w_II`` with AdamW), local-only and
  FedAvg + adaptation minus Pipeline 2 (mean over new clients), Pipeline 2's own mean gap, and the share of new
  clients where Pipeline 1 (``w_II``) ends below local-only / FedAvg + adaptation;
* preference (the dashboard's rows): Spearman of ``λ_j`` against the held-out loss drop and against the reward
  change of generated responses, and the λ-weighted reward change.

Across seeds each quantity is given as its mean over the seeds that have it, with the 95 % t-interval
``mean ± t_{0.975, S−1} · sd / √S`` (``sd`` with ``S − 1`` degrees of freedom; no interval for ``S = 1``), ``S`` the
number of seeds, clipped to the quantity's range (a share to [0, 1], a correlation to [−1, 1], ``H_Cn``, its
ratios, ``c_d`` and the band to ≥ 0; the row says ``clipped``), and beside it the synthetic value the dashboard shows (``sim.simulate``'s smoke preset, the
section's synthetic runs: pass their study results as ``synthetic_results``). Yes/no quantities (Stage-1-only =
Stage-1+2) are counted over the seeds. A seed's run that is not complete (``summary.json["status"]``) is left
out and named.

The pre-registered statistics (:func:`verification.llm.personalisation.sweep_statistics`, imported when there)
open the section: :func:`personalisation_statistics` returns their ``lines`` or why there are none. Rendering:
:func:`sweep_markdown`, :func:`sweep_html`.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from verification.engine.dask_engine import CELLS_DIR
from verification.llm.records import RunRecords, _f, _get, _pipeline_key, load_run
from verification.llm.studies import LLMStudyConfig, run_llm_studies

__all__ = ["CONFIDENCE", "RUNS_DIR", "QUANTITIES", "Quantity", "sweep_run_dirs", "load_sweep_runs", "read_sweep",
           "export_sweep", "EXPORTED_RUN_FILES", "EXPORTED_SWEEP_FILES",
           "t_interval",
           "hcn_at_w_ref", "hypotheses_across_seeds", "personalisation_statistics", "statistic_line",
           "sweep_markdown", "sweep_html"]

#: Level of the across-seed intervals.
CONFIDENCE = 0.95
#: The sub-folder of an LLM sweep that holds one run directory per seed.
RUNS_DIR = "runs"
#: Verdicts of the pre-registered statistics.
VERDICTS = ("supported", "not supported", "underpowered")


# ---------------------------------------------------------------------------------------------- the sweep folder


def sweep_run_dirs(sweep_dir) -> list[Path]:
    """The run directories ``DIR/runs/<seed>/`` of an LLM sweep, by seed (numeric names first, in order);
    ``ValueError`` naming ``DIR`` when it is not a folder or holds no run directory."""
    d = Path(sweep_dir)
    if not d.is_dir():
        raise ValueError(f"{str(d)!r} is not a directory")
    runs = d / RUNS_DIR
    if not runs.is_dir():
        raise ValueError(f"{str(d)!r} is not an LLM sweep folder: it has no {RUNS_DIR}/ sub-folder "
                         f"(python -m llm_runs sweep --out DIR writes DIR/{RUNS_DIR}/<seed>/)")
    dirs = [p for p in runs.iterdir() if p.is_dir()]
    if not dirs:
        raise ValueError(f"{str(d)!r} holds no runs: {str(runs)!r} is empty")
    return sorted(dirs, key=lambda p: (0, int(p.name), "") if p.name.isdigit() else (1, 0, p.name))


def load_sweep_runs(run_dirs: Sequence) -> list[RunRecords]:
    """Every run directory read (:func:`~verification.llm.records.load_run`; a :class:`RunRecords` is kept as it
    is); ``ValueError`` naming the directory when one is not a run directory or is a synthetic run."""
    if not run_dirs:
        raise ValueError("no run directory given")
    runs = []
    for p in run_dirs:
        r = p if isinstance(p, RunRecords) else load_run(p)
        if r.kind != "llm":
            raise ValueError(f"{str(r.path)!r} is a synthetic run (sim.simulate), not an LLM run (llm_runs run)")
        runs.append(r)
    return runs


def read_sweep(sweep_dir) -> tuple[list[Path], list[RunRecords]]:
    """The run directories of the LLM sweep ``sweep_dir`` and their runs read; ``ValueError`` naming the folder or
    the directory when it is not an LLM sweep (:func:`sweep_run_dirs`, :func:`load_sweep_runs`) or holds no
    complete run."""
    dirs = sweep_run_dirs(sweep_dir)
    runs = load_sweep_runs(dirs)
    if not any(r.status == "complete" for r in runs):
        raise ValueError(f"{str(sweep_dir)!r} holds no complete run (run statuses: "
                         f"{sorted({r.status for r in runs})})")
    return dirs, runs


#: The files of a seed's run directory that :func:`export_sweep` keeps (every input of the run studies and of the
#: pre-registered analysis); ``generations.csv`` loses its ``text`` column.
EXPORTED_RUN_FILES = ("summary.json", "trajectory.csv", "heldout_margins.csv", "global_uniform.csv",
                      "clusterings.csv", "generations.csv",
                      # the shots curve's records (verification.llm.shots: CLIENTS, SCORES, ADAPTATION, CROSS)
                      "shots_clients.csv", "shots_scores.csv", "shots_adaptation.csv", "shots_cross.csv")
#: The files of the sweep folder itself that :func:`export_sweep` keeps, besides ``cells/``.
EXPORTED_SWEEP_FILES = ("params.json", "llm_sweep.json")


def _project_relative(text: str) -> str:
    """``text`` (JSON) with every string that is an absolute path inside this project's checkout (the folder that
    holds ``verification/``) made relative to it."""
    import json

    root = Path(__file__).resolve().parents[2]

    def fix(v):
        if isinstance(v, str) and v.startswith(str(root) + "/"):
            return Path(v).relative_to(root).as_posix()
        if isinstance(v, dict):
            return {k: fix(x) for k, x in v.items()}
        if isinstance(v, list):
            return [fix(x) for x in v]
        return v

    return json.dumps(fix(json.loads(text)), indent=1) + "\n"


def export_sweep(sweep_dir, out_dir) -> Path:
    """Copy what the dashboard reads of the LLM sweep ``sweep_dir`` to ``out_dir`` (replaced as a whole, written to
    a temporary sibling first): ``params.json``, ``llm_sweep.json``, ``cells/``, and of every ``runs/<seed>/``
    the files :data:`EXPORTED_RUN_FILES` that exist, ``generations.csv`` without the generated text (its rewards
    are kept: the pre-registered analysis reads them) and ``summary.json`` with every absolute path inside this
    project's checkout (the shipped data file) written relative to it. Small enough to commit beside the
    dashboard, so a reviewer
    can re-run the analysis (:func:`verification.llm.personalisation.sweep_statistics`) on exactly what it
    shows. Returns ``out_dir``; ``ValueError`` as :func:`sweep_run_dirs` when ``sweep_dir`` is not an LLM sweep."""
    import shutil

    import pandas as pd

    src, dst = Path(sweep_dir), Path(out_dir)
    dirs = sweep_run_dirs(src)
    if dst.resolve() == src.resolve():
        return dst
    tmp = temporary_sibling(dst)
    for name in EXPORTED_SWEEP_FILES:
        if (src / name).is_file():
            shutil.copyfile(src / name, tmp / name)
    if (src / CELLS_DIR).is_dir():
        shutil.copytree(src / CELLS_DIR, tmp / CELLS_DIR)
    for d in dirs:
        target = tmp / RUNS_DIR / d.name
        target.mkdir(parents=True)
        for name in EXPORTED_RUN_FILES:
            f = d / name
            if not f.is_file():
                continue
            if name == "summary.json":
                (target / name).write_text(_project_relative(f.read_text()))
            elif name == "generations.csv":
                frame = pd.read_csv(f, dtype={"prompt_id": str, "clients": str}, keep_default_na=False)
                frame.drop(columns=[c for c in ("text",) if c in frame.columns]).to_csv(target / name, index=False)
            else:
                shutil.copyfile(f, target / name)
    return replace_folder(tmp, dst)


def temporary_sibling(dst: Path) -> Path:
    """An empty folder ``.<name>.tmp`` beside ``dst`` (an earlier one removed), to be filled and then moved to
    ``dst`` by :func:`replace_folder`."""
    import shutil

    tmp = dst.with_name(f".{dst.name}.tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    return tmp


def replace_folder(tmp: Path, dst: Path) -> Path:
    """``dst`` replaced as a whole by the filled folder ``tmp``; returns ``dst``."""
    import shutil

    if dst.exists():
        shutil.rmtree(dst)
    tmp.rename(dst)
    return dst


def _seed_labels(runs: Sequence[RunRecords]) -> list[str]:
    """Each run's seed label: the directory name of ``DIR/runs/<seed>/``, else the summary's seed; made unique by
    the directory when two runs share one."""
    labels = [r.path.name if r.path.name.isdigit() else str(r.summary.get("seed", r.path.name)) for r in runs]
    return [lab if labels.count(lab) == 1 else f"{lab} ({r.path})" for lab, r in zip(labels, runs, strict=True)]


# ---------------------------------------------------------------------------------------------- statistics


def t_interval(values, confidence: float = CONFIDENCE) -> dict:
    """Mean, sd (ddof 1), ``n`` and the t-interval (df ``n − 1``) of the finite ``values``; the interval is None
    for ``n < 2``, every number None for ``n = 0``."""
    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
    n = int(x.size)
    if n == 0:
        return dict(n=0, mean=None, sd=None, ci_low=None, ci_high=None)
    mean = float(x.mean())
    if n < 2:
        return dict(n=1, mean=mean, sd=None, ci_low=None, ci_high=None)
    sd = float(x.std(ddof=1))
    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)
    return dict(n=n, mean=mean, sd=sd, ci_low=mean - half, ci_high=mean + half)


def hcn_at_w_ref(run: RunRecords) -> dict | None:
    """What ``summary.json["personalisation"]["hcn_at_w_ref"]`` gives for one run (module docstring); None when
    the run does not record it (older runs)."""
    h = _get(run.summary, "personalisation", "hcn_at_w_ref")
    if not isinstance(h, dict):
        return None
    s12, s1 = h.get("stage1_stage2"), h.get("stage1_only")
    rnd = np.asarray([v for v in (h.get("random") or []) if v is not None], dtype=np.float64)
    rnd = rnd[np.isfinite(rnd)]
    if s12 is None or not math.isfinite(s12):
        return None
    out: dict[str, Any] = dict(stage1_stage2=float(s12), stage1_only=None if s1 is None else float(s1),
                               stage1_only_same_partition=h.get("stage1_only_same_partition"),
                               n_random=int(rnd.size), note=h.get("note"))
    if rnd.size:
        below, ties = int((rnd < s12).sum()), int((rnd == s12).sum())
        mean = float(rnd.mean())
        lo, hi = (float(q) for q in np.quantile(rnd, [0.025, 0.975]))
        out.update(random_mean=mean, random_q025=lo, random_q975=hi, rank=1 + below,
                   percentile=(below + 0.5 * ties) / rnd.size,
                   ratio_to_random_mean=float(s12) / mean if mean else None,
                   stage1_only_ratio_to_random_mean=(float(s1) / mean if mean and s1 is not None else None),
                   below_random_q025=bool(s12 < lo))
    return out


# ---------------------------------------------------------------------------------------------- the quantities


@dataclass(frozen=True)
class Quantity:
    """One row of the across-seed table: ``get(summaries, source)`` reads it from one run's study summaries
    (``{study id: summary}``) for ``source`` (``LLM`` / ``synthetic``), or from the run's ``hcn_at_w_ref``
    (``get_hcn``); ``kind``: ``mean`` (mean and t-interval) or ``count`` (yes/no, counted over seeds);
    ``bounds``: the quantity's range ``(low, high)`` (None: unbounded on that side), which the interval is clipped
    to; a share (``pct``) lies in [0, 1]."""

    key: str
    label: str
    get: Callable[[dict, str], Any] | None = None
    get_hcn: Callable[[dict], Any] | None = None
    pct: bool = False
    kind: str = "mean"
    bounds: tuple | None = None

    def range(self) -> tuple:
        return (0.0, 1.0) if self.pct else (self.bounds or (None, None))


def _s(sid: str, *keys):
    return lambda S, src: _get(S.get(sid), src, *keys)


def _mean_list(sid: str, *keys):
    def get(S, src):
        v = _get(S.get(sid), src, *keys)
        return float(np.mean(v)) if isinstance(v, list) and v else None
    return get


def _dm_zero_share(S, src):
    n0, n = _get(S.get("llm-H20-ratio"), src, "J_eps.all", "n_dm_zero"), _get(S.get("llm-H20-ratio"), src,
                                                                              "J_eps.all", "n_points")
    return n0 / n if n else None


def _comparison(name: str, key: str = "time_mean_dispersion"):
    return _s("llm-H8-dispersion", "clustering_comparison", name, key)


def _pipeline(method: str, what: str = "mean_gap_minus_pipeline2"):
    def get(S, src):
        summ = S.get("llm-pipelines") or {}
        k = _pipeline_key(summ, src)
        return None if k is None else _get(summ, src, k, method, what)
    return get


def _pipeline_frac(base: str):
    def get(S, src):
        summ = S.get("llm-pipelines") or {}
        k = _pipeline_key(summ, src)
        return None if k is None else _get(summ, src, k, f"frac_clients_pipeline1_wII_below_{base}")
    return get


def _reward(model: str, what: str):
    return lambda S, src: _get(S.get("llm-preference"), "rewards", src, model, what)


_HS = "phase1_first_half"
_NONNEG, _CORR = (0.0, None), (-1.0, 1.0)
QUANTITIES: tuple[Quantity, ...] = (
    Quantity("eq71_phase1", "eq 71 holds, share of phase1 test rounds (β̄, Δ̄ = √(H̄/ρ_min) from the first half of "
             "Phase 1)", _s("llm-eq71-trajectory", _HS, "h14", "phase1", "frac_rounds_eq71"), pct=True),
    Quantity("eq71_phase2", "eq 71 holds, share of phase2 test rounds (same constants)",
             _s("llm-eq71-trajectory", _HS, "h14", "phase2", "frac_rounds_eq71"), pct=True),
    Quantity("eq71_phase2_all_phase1", "eq 71 holds, share of Phase-2 rounds (constants from all of Phase 1)",
             _s("llm-eq71-trajectory", "phase1_for_phase2", "h14", "phase2", "frac_rounds_eq71"), pct=True),
    Quantity("h20_negative_Jstar", "H.20: negative numerator on J* (all steps)",
             _s("llm-H20-ratio", "J_star.all", "frac_negative_numerator"), pct=True),
    Quantity("h20_sigma_Jstar", "H.20: σ̂ = min ratio on J* (d_M ≈ 0 excluded)",
             _s("llm-H20-ratio", "J_star.all", "sigma_hat")),
    Quantity("h20_negative_Jeps", "H.20: negative numerator on J*_ε (all steps)",
             _s("llm-H20-ratio", "J_eps.all", "frac_negative_numerator"), pct=True),
    Quantity("h20_sigma_Jeps", "H.20: σ̂ = min ratio on J*_ε (d_M ≈ 0 excluded)",
             _s("llm-H20-ratio", "J_eps.all", "sigma_hat")),
    Quantity("h20_dm_zero", "H.20: share of steps with d_M ≈ 0 (excluded from the ratio)", _dm_zero_share,
             pct=True),
    Quantity("hcn_time_mean", "H_Cn of the Stage-1+2 clusters, time mean over the run",
             _s("llm-H8-dispersion", "time_mean_dispersion"), bounds=_NONNEG),
    Quantity("hcn_p1_stage1_stage2", "H_Cn time mean over Phase 1: Stage-1+2 clusters",
             _comparison("stage1_stage2"), bounds=_NONNEG),
    Quantity("hcn_p1_stage1_only", "H_Cn time mean over Phase 1: Stage-1-only clusters", _comparison("stage1_only"),
             bounds=_NONNEG),
    Quantity("hcn_p1_random", "H_Cn time mean over Phase 1: random clusters of the Stage-1+2 sizes (mean over the "
             "run's draws)", _comparison("random"), bounds=_NONNEG),
    Quantity("hcn_p1_ratio", "H_Cn time mean over Phase 1: Stage-1+2 / random",
             _s("llm-H8-dispersion", "clustering_comparison", "ratio_stage1_stage2_to_random.time_mean_dispersion"),
             bounds=_NONNEG),
    Quantity("hcn_wref_stage1_stage2", "H_Cn at w_ref: Stage-1+2 clusters", get_hcn=lambda h: h["stage1_stage2"],
             bounds=_NONNEG),
    Quantity("hcn_wref_stage1_only", "H_Cn at w_ref: Stage-1-only clusters", get_hcn=lambda h: h["stage1_only"],
             bounds=_NONNEG),
    Quantity("hcn_wref_random_mean", "H_Cn at w_ref: random partitions of the Stage-1+2 sizes (mean over draws)",
             get_hcn=lambda h: h.get("random_mean"), bounds=_NONNEG),
    Quantity("hcn_wref_ratio", "H_Cn at w_ref: Stage-1+2 / mean of the random draws",
             get_hcn=lambda h: h.get("ratio_to_random_mean"), bounds=_NONNEG),
    Quantity("hcn_wref_percentile", "H_Cn at w_ref: percentile of Stage-1+2 among the random draws (mid-rank; "
             "50 % = no better than random)", get_hcn=lambda h: h.get("percentile"), pct=True),
    Quantity("hcn_wref_below_q025", "H_Cn at w_ref: Stage-1+2 below the random draws' 2.5 % quantile",
             get_hcn=lambda h: h.get("below_random_q025"), kind="count"),
    Quantity("hcn_wref_same_partition", "H_Cn at w_ref: Stage-1-only is the Stage-1+2 partition",
             get_hcn=lambda h: h.get("stage1_only_same_partition"), kind="count"),
    Quantity("h6_common_basis", "H.6: common non-degenerate LP basis, share of multi-client cluster iterates (LP "
             "bases re-classified from the recorded Grams)",
             _s("llm-H8-dispersion", "h6_common_basis_frac_multi_client"), pct=True),
    Quantity("contraction_c_d", "contraction: c_d (mean over clusters, calibration window)",
             _mean_list("llm-contraction", "c_d"), bounds=_NONNEG),
    Quantity("contraction_band", "contraction: mean band ε̂_0,i (L₀ term omitted)",
             _s("llm-contraction", "band_mean"), bounds=_NONNEG),
    Quantity("contraction_within_bound", "contraction: test iterates within the eq-75 bound",
             _s("llm-contraction", "frac_test_within_bound"), pct=True),
    Quantity("contraction_h19", "contraction: H.19 holds on the test iterates (calibrated c_d, b_i)",
             _s("llm-contraction", "frac_test_h19_holds"), pct=True),
    Quantity("p1_wII_minus_p2", "Pipeline 1 (w_II) − Pipeline 2 at the largest K (mean over new clients)",
             _pipeline("pipeline1_wII")),
    Quantity("p1_wI_minus_p2", "Pipeline 1 (w_I) − Pipeline 2 at the largest K", _pipeline("pipeline1_wI")),
    Quantity("p1_wII_adamw_minus_p2", "Pipeline 1 (w_II, AdamW) − Pipeline 2 at the largest K",
             _pipeline("pipeline1_wII_adamw")),
    Quantity("local_only_minus_p2", "local only − Pipeline 2 at the largest K", _pipeline("local_only")),
    Quantity("fedavg_adapt_minus_p2", "FedAvg + adaptation − Pipeline 2 at the largest K",
             _pipeline("fedavg_adapt")),
    Quantity("p2_gap", "Pipeline 2: mean gap of the new clients", _pipeline("pipeline2", "mean_gap"),
             bounds=_NONNEG),
    Quantity("p1_wII_below_local_only", "new clients where Pipeline 1 (w_II) ends below local only",
             _pipeline_frac("local_only"), pct=True),
    Quantity("p1_wII_below_fedavg_adapt", "new clients where Pipeline 1 (w_II) ends below FedAvg + adaptation",
             _pipeline_frac("fedavg_adapt"), pct=True),
    Quantity("pref_loss_spearman_wII", "Spearman(λ_j, held-out loss drop): training clients after Phase 2 (w_II)",
             _s("llm-preference", "phase2", "spearman_lam_vs_loss_drop"), bounds=_CORR),
    Quantity("pref_loss_spearman_p1", "Spearman(λ_j, held-out loss drop): new clients after Pipeline 1 (w_II)",
             _s("llm-preference", "pipeline1_wII", "spearman_lam_vs_loss_drop"), bounds=_CORR),
    Quantity("reward_spearman_wII", "Rewards of generated responses, Spearman(λ_j, change in sd units): w_II",
             _reward("w_II", "spearman_lam_vs_change"), bounds=_CORR),
    Quantity("reward_spearman_p1", "Rewards of generated responses, Spearman(λ_j, change in sd units): Pipeline 1 "
             "(w_II)", _reward("pipeline1_wII", "spearman_lam_vs_change"), bounds=_CORR),
    Quantity("reward_weighted_wII", "Rewards of generated responses, λ-weighted change Σλ_j z_j − mean z_j: w_II",
             _reward("w_II", "mean_weighted_change")),
    Quantity("reward_weighted_p1", "Rewards of generated responses, λ-weighted change Σλ_j z_j − mean z_j: "
             "Pipeline 1 (w_II)", _reward("pipeline1_wII", "mean_weighted_change")),
)


def _value(v) -> Any:
    if v is None or isinstance(v, bool):
        return v
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _pipeline_setting(summaries: dict, src: str) -> str | None:
    summ = summaries.get("llm-pipelines") or {}
    k = _pipeline_key(summ, src)
    K = _get(summ, src, k, "pipeline1_wII", "K") if k else None
    return None if k is None else f"K = {K}, {k.replace('S=', 'S = ')}"


def hypotheses_across_seeds(run_dirs: Sequence, *, synthetic_results: Sequence | None = None,
                            config: LLMStudyConfig | None = None,
                            progress: Callable[[str], None] | None = None) -> dict:
    """The run studies on every seed's run and each study's key quantity across the seeds (module docstring).

    ``run_dirs``: the seeds' run directories (:func:`sweep_run_dirs`) or runs read; ``synthetic_results``: study results
    (:func:`~verification.llm.studies.run_llm_studies`) holding the ``synthetic`` source, whose values are shown
    beside the means. Returns a JSON-ready dict: ``seeds`` (those aggregated), ``left_out`` (seed -> why), ``rows``
    (one per :data:`QUANTITIES` entry: ``key``, ``label``, ``kind``, ``pct``, ``per_seed`` {seed: value}, ``n``,
    ``mean``, ``sd``, ``ci_low``, ``ci_high`` (kind ``mean``) or ``count`` (kind ``count``), ``synthetic``),
    ``hcn_at_w_ref`` (per seed, :func:`hcn_at_w_ref`), ``not_run`` (seed -> {study: why}), ``pipeline_setting``,
    ``confidence`` and ``text``. ``ValueError`` when a directory is not an LLM run directory."""
    progress = progress or (lambda _msg: None)
    runs = load_sweep_runs(run_dirs)
    seeds, left_out, per_seed, hcn, not_run, settings = [], {}, {}, {}, {}, {}
    for run, seed in zip(runs, _seed_labels(runs), strict=True):
        if run.status != "complete":
            left_out[seed] = f"run status {run.status!r} in {str(run.path)!r}"
            continue
        progress(f"  LLM sweep: the run studies on seed {seed} ({run.path}) ...")
        results, skipped = run_llm_studies([run], config=config)
        seeds.append(seed)
        per_seed[seed] = {st.id: st.summary for st in results}
        if skipped:
            not_run[seed] = skipped
        hcn[seed] = hcn_at_w_ref(run)
        settings[seed] = _pipeline_setting(per_seed[seed], "LLM")
    synth = {st.id: st.summary for st in (synthetic_results or ())}
    rows = []
    for q in QUANTITIES:
        vals = {}
        for s in seeds:
            h = hcn[s]
            if q.get_hcn is not None:
                vals[s] = None if h is None else _value(q.get_hcn(h))
            else:
                assert q.get is not None
                vals[s] = _value(q.get(per_seed[s], "LLM"))
        row: dict[str, Any] = dict(key=q.key, label=q.label, kind=q.kind, pct=q.pct, per_seed=vals)
        if q.kind == "count":
            have = [v for v in vals.values() if v is not None]
            row.update(n=len(have), count=int(sum(bool(v) for v in have)))
        else:
            row.update(t_interval([v for v in vals.values() if not isinstance(v, bool)]))
            lo, hi = q.range()
            if row["ci_low"] is not None:
                clipped = (lo is not None and row["ci_low"] < lo) or (hi is not None and row["ci_high"] > hi)
                row["ci_low"] = row["ci_low"] if lo is None else max(row["ci_low"], lo)
                row["ci_high"] = row["ci_high"] if hi is None else min(row["ci_high"], hi)
                row["clipped"] = bool(clipped)
        row["synthetic"] = _value(q.get(synth, "synthetic")) if (synth and q.get is not None) else None
        rows.append(row)
    distinct = sorted({v for v in settings.values() if v})
    out = dict(seeds=seeds, left_out=left_out, run_dirs=[str(r.path) for r in runs], rows=rows, hcn_at_w_ref=hcn,
               not_run=not_run, confidence=CONFIDENCE,
               pipeline_setting=distinct[0] if len(distinct) == 1 else ("; ".join(distinct) or None),
               n_seeds_with_hcn_at_w_ref=sum(h is not None for h in hcn.values()))
    out["text"] = _text(out)
    return out


def _interval_text(row: dict) -> str:
    pct = row["pct"]
    if row["kind"] == "count":
        return f"{row['count']} of {row['n']} seeds" if row["n"] else "–"
    if row["mean"] is None:
        return "–"
    if row["ci_low"] is None:
        return f"{_f(row['mean'], pct)} (one seed: no interval)"
    return f"{_f(row['mean'], pct)} [{_f(row['ci_low'], pct)}, {_f(row['ci_high'], pct)}]"


def _text(h: dict) -> str:
    lines = [f"LLM run studies over {len(h['seeds'])} seed(s) ({', '.join(h['seeds'])}): mean "
             f"[{100 * h['confidence']:.0f} % t-interval] over seeds, synthetic value beside it"]
    lines += [f"  {r['label']}: {_interval_text(r)}; synthetic {_f(r['synthetic'], r['pct'])}" for r in h["rows"]]
    lines += [f"  seed {s} left out: {why}" for s, why in h["left_out"].items()]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- pre-registered


def personalisation_statistics(run_dirs: Sequence) -> dict:
    """The pre-registered statistics of :func:`verification.llm.personalisation.sweep_statistics` on the runs
    (``lines`` and ``text``), or ``{"lines": [], "unavailable": why}`` when that module is not in this checkout
    or the runs do not record what it reads."""
    try:
        from verification.llm.personalisation import sweep_statistics
    except ImportError as exc:
        return {"lines": [], "unavailable": f"verification.llm.personalisation cannot be imported ({exc})"}
    try:
        res = sweep_statistics(list(run_dirs))
    except ValueError as exc:
        return {"lines": [], "unavailable": f"the pre-registered statistics cannot be computed: {exc}"}
    return dict(res)


def _fmt_interval(iv) -> str:
    if isinstance(iv, (list, tuple)) and len(iv) == 2:
        return "–" if iv[0] is None and iv[1] is None else f"[{_f(iv[0])}, {_f(iv[1])}]"
    return _f(iv)


def statistic_line(line: dict) -> str:
    """One pre-registered statistic as one line of text: estimate (against chance where the line has a
    ``null``), interval, p-value, MDE, verdict, seeds and units."""
    null = line.get("null")
    chance = f" (chance {_f(null)})" if null else ""
    return (f"{line.get('label') or line.get('statistic', '?')}: estimate {_f(line.get('estimate'))}{chance}, 95 % "
            f"interval {_fmt_interval(line.get('interval'))}, p = {_f(line.get('p_value'))}, minimum detectable "
            f"effect (80 % power) {_f(line.get('mde'))}{' above chance' if null else ''} — "
            f"{line.get('verdict', '?')} ({line.get('n_seeds', '?')} seeds, {line.get('n_units', '?')} units)")


# ---------------------------------------------------------------------------------------------- rendering

_HEADER = ("quantity", "mean over seeds [95 % t-interval]", "seeds", "synthetic")
_PER_SEED_NOTE = ("The run studies of each seed's run alone (verification.llm.studies); the synthetic column is "
                  "sim.simulate's smoke preset at the report's seed, the value the single-run table shows.")


def _rows(h: dict) -> list[list[str]]:
    return [[r["label"], _interval_text(r), str(r["n"]), _f(r["synthetic"], r["pct"])] for r in h["rows"]]


def _per_seed_rows(h: dict) -> list[list[str]]:
    out = [[r["label"]] + [_f(r["per_seed"].get(s), r["pct"]) for s in h["seeds"]] for r in h["rows"]]
    for label, key in (("H_Cn at w_ref: random draws' 2.5–97.5 % interval", None),
                       ("H_Cn at w_ref: rank of Stage-1+2 among the random draws (1 = smallest)", "rank")):
        cells = []
        for s in h["seeds"]:
            x = h["hcn_at_w_ref"].get(s)
            if x is None or "random_mean" not in x:
                cells.append("not recorded" if x is None else "no random draws")
            elif key is None:
                cells.append(f"[{_f(x['random_q025'])}, {_f(x['random_q975'])}]")
            else:
                cells.append(f"{x['rank']} of {x['n_random'] + 1}")
        out.append([label] + cells)
    return out


def _intro(h: dict) -> str:
    n = len(h["seeds"])
    text = (f"Hypotheses across {n} seed{'s' if n != 1 else ''} ({', '.join(h['seeds'])}): each quantity of the "
            f"single-run table as its mean over the seeds with the {100 * h['confidence']:.0f} % t-interval "
            "(df = seeds − 1), clipped to the quantity's range (shares in [0, 1], correlations in [−1, 1], H_Cn, its "
            "ratios, c_d and the band ≥ 0), beside the synthetic value.")
    if h.get("pipeline_setting"):
        text += f" New clients at {h['pipeline_setting']}."
    if h["n_seeds_with_hcn_at_w_ref"] < n:
        text += (f" H_Cn at w_ref is recorded by {h['n_seeds_with_hcn_at_w_ref']} of {n} runs "
                 "(summary.json personalisation.hcn_at_w_ref; older runs do not record it).")
    return text


def _notes(h: dict) -> list[str]:
    out = [f"seed {s} left out: {why}" for s, why in h["left_out"].items()]
    out += [f"seed {s}: study {sid} not run: {why}" for s, d in h["not_run"].items() for sid, why in d.items()]
    return out


def _md_table(header: Sequence[str], rows: list[list[str]]) -> list[str]:
    return (["| " + " | ".join(header) + " |", "|---|" + "---|" * (len(header) - 1)]
            + ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows])


def sweep_markdown(hypotheses: dict | None, statistics: dict | None) -> list[str]:
    """The sweep's part of the LLM section: the pre-registered statistics (one line each), then the across-seed
    table, then the per-seed values (in a details block)."""
    lines = ["### Pre-registered statistics", ""]
    st = statistics or {"lines": [], "unavailable": "not computed"}
    if st.get("lines"):
        lines += [f"* **{ln.get('verdict', '?')}** — {statistic_line(ln)}" for ln in st["lines"]]
    else:
        lines += [f"* none: {st.get('unavailable', 'no statistic returned')}"]
    if st.get("text"):
        lines += ["", str(st["text"])]
    lines += [""]
    if hypotheses is None:
        return lines
    lines += ["### Hypotheses across seeds", "", _intro(hypotheses), "", *_md_table(_HEADER, _rows(hypotheses)), ""]
    lines += [f"* {n}" for n in _notes(hypotheses)]
    lines += ["", "<details><summary>Per seed</summary>", "", _PER_SEED_NOTE, "",
              *_md_table(["quantity"] + [f"seed {s}" for s in hypotheses["seeds"]], _per_seed_rows(hypotheses)),
              "", "</details>", ""]
    return lines


def _html_table(header: Sequence[str], rows: list[list[str]]) -> str:
    esc = html.escape
    return ("<div class='scroll'><table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in header) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>" for r in rows) + "</table></div>")


def sweep_html(hypotheses: dict | None, statistics: dict | None) -> str:
    """:func:`sweep_markdown` as HTML."""
    esc = html.escape
    st = statistics or {"lines": [], "unavailable": "not computed"}
    parts = ["<h3>Pre-registered statistics</h3>"]
    if st.get("lines"):
        parts.append("<ul>" + "".join(f"<li><b>{esc(str(ln.get('verdict', '?')))}</b> — {esc(statistic_line(ln))}"
                                      "</li>" for ln in st["lines"]) + "</ul>")
    else:
        parts.append(f"<ul><li>none: {esc(str(st.get('unavailable', 'no statistic returned')))}</li></ul>")
    if st.get("text"):
        parts.append(f"<p>{esc(str(st['text']))}</p>")
    if hypotheses is None:
        return "\n".join(parts)
    parts += ["<h3>Hypotheses across seeds</h3>", f"<p>{esc(_intro(hypotheses))}</p>",
              _html_table(_HEADER, _rows(hypotheses))]
    notes = _notes(hypotheses)
    if notes:
        parts.append("<ul>" + "".join(f"<li>{esc(n)}</li>" for n in notes) + "</ul>")
    parts.append(f"<details><summary>Per seed</summary><p>{esc(_PER_SEED_NOTE)}</p>"
                 + _html_table(["quantity"] + [f"seed {s}" for s in hypotheses["seeds"]], _per_seed_rows(hypotheses))
                 + "</details>")
    return "\n".join(parts)
