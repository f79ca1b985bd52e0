"""Figures of the report (seaborn, PNG). Each figure has one message, labelled axes and a caption.

Every ``fig_*`` function takes the result rows and the figure-data tables (``{statement or study id: {table:
DataFrame}}``) and returns ``(figure, caption)``, or raises :class:`MissingData` naming what it needed, so the
dashboard can say which figure is missing and why instead of drawing an empty one.
"""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Iterator
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

__all__ = ["MissingData", "FIGURES", "FIGURE_STATEMENTS", "SWEEP_FIGURES", "GRID_FIGURES", "draw_all", "draw_grid"]

VERDICT_COLORS = {"holds": "#2e7d32", "finding": "#ef6c00", "violated": "#c62828", "vacuous": "#6a1b9a",
                  "error": "#424242"}


class MissingData(LookupError):
    """A figure's data is not in the run (its statement or study did not report it)."""


def _table(tables, sid: str, name: str, columns) -> pd.DataFrame:
    df = tables.get(sid, {}).get(name)
    if df is None:
        raise MissingData(f"table {name!r} of {sid} not reported")
    miss = [c for c in columns if c not in df.columns]
    if miss:
        raise MissingData(f"table {name!r} of {sid} lacks columns {miss}")
    if df.empty:
        raise MissingData(f"table {name!r} of {sid} is empty")
    return df


def fig_tightness(rows, tables):
    """Tightness (observed / bound) of every statement with a bound, coloured by verdict."""
    df = pd.DataFrame([{"id": r["id"], "tightness": r["tightness"], "verdict": r["verdict"]} for r in rows
                       if isinstance(r.get("tightness"), (int, float)) and r["tightness"] is not None
                       and np.isfinite(r["tightness"]) and r["tightness"] > 0])
    if df.empty:
        raise MissingData("no statement reported a positive tightness")
    df = df.sort_values("tightness")
    fig, ax = plt.subplots(figsize=(7, 0.28 * len(df) + 1.5))
    sns.scatterplot(data=df, x="tightness", y="id", hue="verdict", palette=VERDICT_COLORS, s=60, ax=ax)
    ax.axvline(1.0, color="k", ls="--", lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("tightness = max observed lhs / bound rhs (log scale; 1 = bound attained)")
    ax.set_ylabel("statement")
    ax.set_title("How close each checked bound comes to being attained")
    return fig, "Tightness of every statement: the largest observed ratio of the conclusion's two sides."


def fig_mixed_cluster_penalty(rows, tables):
    """H.16: ascent of the uniform clients' objectives over the eq 48 and eq 48′ bounds, against ρ⁺."""
    df = _table(tables, "H.16", "penalty", ["bound", "rho_plus", "ratio", "violated"]).copy()
    df["ratio"] = df["ratio"].clip(lower=1e-4)  # ratio <= 0: the objective decreases; drawn on the floor
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, (label, sub) in zip(axes, df.groupby("bound", sort=True), strict=False):
        ok = sub[~sub["violated"]]
        bad = sub[sub["violated"]]
        ax.scatter(ok["rho_plus"], ok["ratio"], s=8, alpha=0.35, color="#1565c0", label="bound holds")
        if len(bad):
            ax.scatter(bad["rho_plus"], bad["ratio"], s=28, marker="x", color="#c62828",
                       label=f"counterexample ({len(bad)})")
        ax.axhline(1.0, color="k", ls="--", lw=1)
        ax.set_yscale("log")
        ax.set_xlabel("ρ⁺ (aggregation mass of the balancing clients)")
        ax.set_title(label)
        ax.legend(loc="lower right", fontsize=8)
    axes[0].set_ylabel("ascent / bound  (> 1: violated)")
    fig.suptitle("Mixed-cluster penalty (Lemma H.16): eq 48 fails, the repaired eq 48′ holds")
    return fig, ("H.16 mixed clusters: the first-order ascent of a uniform client's objective divided by the "
                 "literal eq 48 bound (left; counterexamples marked ×) and by the repaired eq 48′ bound (right). "
                 "Ratios <= 1e-4 (objectives that decrease) are drawn at 1e-4.")


def fig_dispersion_scaling(rows, tables):
    """H.7/H.11: H_Cn against the within-cluster variance of A, and its δ_λ² scaling."""
    cl = _table(tables, "H.11", "clusters", ["dispersion", "adjustment_variance", "delta_lambda_sq", "bound"])
    sc = _table(tables, "H.11", "scaling", ["series", "delta_lambda", "dispersion", "valid"])
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    ax = axes[0]
    cl = cl[(cl["dispersion"] > 1e-24) & (cl["adjustment_variance"] > 0)]  # H at round-off: identical directions
    ax.scatter(cl["adjustment_variance"], cl["dispersion"], s=14, alpha=0.6, color="#1565c0",
               label="clusters with a common basis (H.6)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("Σ ρ_i ‖A_i − Ā‖²  (within-cluster variance of the adjustments)")
    ax.set_ylabel("H_Cn = Σ ρ_i ‖d_i − d̄‖²")
    ax.set_title("Direction dispersion follows the variance of A (eq 10)")
    ax.legend(fontsize=8)
    ax = axes[1]
    valid = sc[sc["valid"]]
    for _, sub in valid.groupby("series"):
        ax.plot(sub["delta_lambda"], sub["dispersion"], marker="o", ms=3, lw=1, alpha=0.8)
    if len(valid):
        x = np.geomspace(valid["delta_lambda"].min(), valid["delta_lambda"].max(), 10)
        y0 = valid["dispersion"].median() / valid["delta_lambda"].median() ** 2
        ax.plot(x, y0 * x**2, "k--", lw=1.5, label="slope 2 (H ∝ δ_λ²)")
        ax.legend(fontsize=8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("preference spread δ_λ")
    ax.set_ylabel("H_Cn")
    ax.set_title("H_Cn = O(δ_λ²) as the spread shrinks (Cor. H.11)")
    return fig, ("Left: direction dispersion H_Cn against the ρ-weighted variance of the adjustment vectors, for "
                 "clusters sharing a non-degenerate LP basis (clusters whose H is at round-off level, < 1e-24, are not drawn). Right: H_Cn along scaling series of shrinking "
                 "preference spread δ_λ (one line per series) against the slope-2 reference of Cor. H.11.")


_TICK_LABELS = {-1e6: "−10⁶", -1e4: "−10⁴", -1e2: "−100", -1.0: "−1", 0.0: "0", 1.0: "1", 1e2: "100", 1e4: "10⁴"}


def fig_h20_ratio(rows, tables):
    """Study: distribution of the Lemma H.20 (ii) ratio min_j λ_j dᵀg_j / ‖d_M‖² on J* and on J*_ε."""
    df = _table(tables, "study-H20-ratio", "points", ["phase", "index_set", "margin", "dm_norm_sq", "dm_zero"])
    df = df[~df["dm_zero"].astype(bool)].copy()
    if df.empty:
        raise MissingData("every point of study-H20-ratio had d_M = 0")
    df["ratio"] = df["margin"] / df["dm_norm_sq"]
    sets = sorted(df["index_set"].unique())
    fig, axes = plt.subplots(1, len(sets), figsize=(5.5 * len(sets), 4.2), squeeze=False)
    for ax, name in zip(axes[0], sets, strict=True):
        sub = df[df["index_set"] == name]
        sns.ecdfplot(data=sub, x="ratio", hue="phase", ax=ax)
        ax.set_xscale("symlog", linthresh=1e-2)
        lo, hi = float(sub["ratio"].min()), float(sub["ratio"].max())
        ticks = [t for t in (-1e6, -1e4, -1e2, -1.0, 0.0, 1.0, 1e2, 1e4) if lo <= t <= hi or t in (0.0, 1.0)]
        ax.set_xticks(ticks)
        ax.set_xticklabels([_TICK_LABELS[t] for t in ticks])
        ax.axvline(0.0, color="#c62828", lw=1)
        ax.axvline(1.0, color="k", ls="--", lw=1)
        neg_col = "numerator_negative" if "numerator_negative" in sub else None
        neg = float(sub[neg_col].astype(bool).mean()) if neg_col else float((sub["margin"] < 0).mean())
        ax.set_title(f"index set {name}: numerator < 0 at {100 * neg:.1f}% of points")
        ax.set_xlabel("min_j λ_j dᵀg_j / ‖d_M‖²  (symlog; σ = its minimum)")
        ax.set_ylabel("fraction of (client, round) points")
    fig.suptitle("Lemma H.20 (ii) along training: the EPO direction's margin relative to ‖d_M‖²")
    return fig, ("Study of the Lemma H.20 (ii) ratio along Phase-1 and Phase-2 trajectories (empirical CDFs per "
                 "phase). Points with d_M = 0 are excluded and counted in the study's tables. A positive minimum "
                 "σ is what H.20 needs; the red line marks 0, the dashed line 1.")


def fig_adaptation_gap(rows, tables):
    """Study: E[ψ(w_K) − ψ*] against K for several S and preconditioners, with the eq 91 bound."""
    df = _table(tables, "study-adamw-adaptation", "gap_vs_k",
                ["preconditioner", "batch_size", "k", "mean_gap", "bound"])
    df = df[df["k"] > 0]
    sizes = sorted(df["batch_size"].unique())
    fig, axes = plt.subplots(1, len(sizes), figsize=(3.6 * len(sizes), 4.0), sharey=True, squeeze=False)
    pres = sorted(df["preconditioner"].unique(), key=lambda p: (p.startswith("adamw"), p))
    palette = dict(zip(pres, sns.color_palette("tab10"), strict=False))
    styles = {p: (":" if p == "adamw_no_weight_decay" else "-") for p in pres}
    for ax, S in zip(axes[0], sizes, strict=True):
        sub = df[df["batch_size"] == S]
        for pre in pres:
            g = sub[sub["preconditioner"] == pre]
            ax.plot(g["k"], g["mean_gap"], marker="o", ms=3, lw=2.2 if pre.startswith("adamw") else 1.3,
                    ls=styles[pre], color=palette[pre], label=pre)
        b = sub[sub["preconditioner"] == "identity"] if (sub["preconditioner"] == "identity").any() else sub
        b = b.groupby("k", as_index=False)["bound"].first()
        ax.plot(b["k"], b["bound"], "k--", lw=1.5, label="eq 91 bound")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"S = {S}")
        ax.set_xlabel("adaptation steps K")
    axes[0][0].set_ylabel("E[ψ_new(w_K) − ψ*_new]")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, frameon=False)
    fig.suptitle("New-client adaptation: idealised, lagged-RMSprop and AdamW preconditioners against eq 91")
    fig.subplots_adjust(bottom=0.25)
    return fig, ("Expected adaptation gap after K steps with fresh batches of size S (family F3; exact moments "
                 "for fixed P, seeded Monte Carlo means otherwise) against the eq 91 bound of Prop. H.44(a) "
                 "(identity P). AdamW violates H.41 (momentum, non-measurable v_k, weight decay) and is not "
                 "covered by the bound.")


def fig_contraction(rows, tables):
    """H.29/H.31: r_i^t against the bound (1 − ηc_d)^{t−t0} r^{t0} + ε_{0,i} and the band ε_{0,i}, per client."""
    df = _table(tables, "H.29", "band", ["t", "client", "r", "bound", "band"])
    clients = sorted(df["client"].unique())
    fig, axes = plt.subplots(1, len(clients), figsize=(4.2 * len(clients), 3.8), sharey=True, squeeze=False)
    for ax, i in zip(axes[0], clients, strict=True):
        sub = df[df["client"] == i].sort_values("t")
        ax.plot(sub["t"], sub["r"], color="#1565c0", lw=1.6, label="r_i^t = ψ_i(w^t) − ψ_i*")
        ax.plot(sub["t"], sub["bound"], color="k", ls="--", lw=1.2, label="(1 − ηc_d)^{t−t0} r^{t0} + ε_0,i")
        ax.axhline(float(sub["band"].iloc[0]), color="#ef6c00", lw=1.2, label="band ε_0,i")
        ax.set_yscale("log")
        ax.set_title(f"client {i}")
        ax.set_xlabel("round t")
    axes[0][0].set_ylabel("Chebyshev gap r_i^t")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.suptitle("Contraction of every client's Chebyshev gap into a horizon-independent band (Cor. H.29 / Thm H.31)")
    fig.subplots_adjust(bottom=0.25)
    return fig, ("One shared-iteration run (family F1): each client's gap r_i^t stays below the contraction bound "
                 "(dashed) from t0 on and ends inside its band ε_0,i (orange); c_d and b_i: "
                 + _constants_caption(df["constants"].iloc[0] if "constants" in df else "") + ".")


def _constants_caption(label: str) -> str:
    if label == "in-sample":
        return ("the T-H31 design's in-sample constants, estimated on the iterates shown (the held-out sets show no "
                "contraction phase on these runs: their bands already cover r^{t0}, or H.19 fails early)")
    return f"{label} constants, not estimated on the iterates shown, with H.19 holding at every step" if label \
        else "the run's constants"


def fig_nesting(rows, tables):
    """H.29 items 3: ψ_i^{t+1} − ψ_i^t against the inflation slack ε_{i,t} (nesting of the admissible sets)."""
    df = _table(tables, "H.29", "nesting", ["t", "client", "psi_increase", "slack"])
    fig, ax = plt.subplots(figsize=(10, 4.2))
    for i, sub in df.groupby("client"):
        sub = sub.sort_values("t")
        ax.plot(sub["t"], sub["psi_increase"], lw=1.2, label=f"client {i}: ψ_i^(t+1) − ψ_i^t")
        ax.plot(sub["t"], sub["slack"], lw=1.0, ls="--", color=ax.lines[-1].get_color(), alpha=0.8)
    ax.axhline(0.0, color="k", lw=0.8)
    ax.set_yscale("symlog", linthresh=1e-6)
    ax.set_xlabel("round t")
    ax.set_ylabel("change of ψ_i per round (symlog)")
    ax.set_title("Nesting of admissible sets: ψ_i^(t+1) ≤ ψ_i^t + ε_i,t (dashed: ε_i,t)")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return fig, ("Admissible sets nest (eq 67–68): the per-round change of every client's Chebyshev value (solid) "
                 "never exceeds the inflation slack ε_i,t (dashed, same colour); where the slack is 0 the nesting "
                 "is exact and ψ_i decreases.")


def fig_double_well(rows, tables):
    """H.29 negative control: the double well F4 stays at the spurious minimum, far above its claimed band."""
    df = _table(tables, "H.29", "control_double_well", ["t", "eta", "r", "band"])
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for eta, sub in df.groupby("eta"):
        sub = sub.sort_values("t")
        line = ax.plot(sub["t"], sub["r"], lw=1.6, label=f"r_t, η = {eta:g}")[0]
        ax.axhline(float(sub["band"].iloc[0]), ls="--", color=line.get_color(),
                   label=f"claimed band ε_0 = {float(sub['band'].iloc[0]):.3g} (η = {eta:g})")
    ax.set_yscale("log")
    ax.set_xlabel("step t")
    ax.set_ylabel("gap r_t = ψ(w_t) − ψ*")
    ax.set_title("Double well F4: without the descent margin H.19 the band claim fails")
    ax.legend(fontsize=8)
    return fig, ("Double-well control (example H.18(a)): started at w = 1.2 the iteration settles at the spurious "
                 "minimum with r ≈ 0.5, far above the band ε_0 that H.19's constant estimated on the left well "
                 "would give; the monitor flags H.19 at every iterate.")


FIGURES = {
    "contraction.png": fig_contraction,
    "nesting.png": fig_nesting,
    "double_well_control.png": fig_double_well,
    "tightness_overview.png": fig_tightness,
    "mixed_cluster_penalty.png": fig_mixed_cluster_penalty,
    "dispersion_scaling.png": fig_dispersion_scaling,
    "h20_ratio_distribution.png": fig_h20_ratio,
    "adaptation_gap.png": fig_adaptation_gap,
}

#: The statements each figure of :data:`FIGURES` illustrates (their documentation pages show it): the statement whose
#: figure data it draws, or for a study's figure the statements the study is about.
FIGURE_STATEMENTS: dict[str, tuple[str, ...]] = {
    "contraction.png": ("H.29",),
    "nesting.png": ("H.29",),
    "double_well_control.png": ("H.29",),
    "tightness_overview.png": (),
    "mixed_cluster_penalty.png": ("H.16",),
    "dispersion_scaling.png": ("H.11",),
    "h20_ratio_distribution.png": ("H.20",),
    "adaptation_gap.png": ("H.42", "H.44"),
}


def fig_sweep_tightness(rows, tables):
    """A sweep over seeds: the spread of each statement's tightness over the seeds, points coloured by verdict."""
    df = _table(tables, "sweep", "tightness", ["id", "seed", "tightness", "verdict"])
    df = df[np.isfinite(df["tightness"])]
    pos = df[df["tightness"] > 0]
    if pos.empty:
        raise MissingData("no statement of the sweep reported a positive tightness")
    left_out = len(df) - len(pos)
    order = list(dict.fromkeys(pos["id"]))
    n_seeds = int(df.groupby("id")["seed"].nunique().max())
    fig, ax = plt.subplots(figsize=(8, 0.42 * len(order) + 1.8))
    spread = pos.groupby("id")["tightness"].agg(["min", "median", "max"]).reindex(order)
    ys = np.arange(len(order))
    ax.hlines(ys, spread["min"], spread["max"], color="#90a4ae", lw=6, alpha=0.45, zorder=1, label="min to max")
    ax.scatter(spread["median"], ys, marker="|", s=400, color="k", zorder=3, label="median")
    sns.stripplot(data=pos, x="tightness", y="id", order=order, hue="verdict", palette=VERDICT_COLORS, size=3.5,
                  alpha=0.7, jitter=0.2, ax=ax)
    ax.axvline(1.0, color="k", ls="--", lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("tightness = max observed lhs / bound rhs per seed (log scale; 1 = bound attained)")
    ax.set_ylabel("statement")
    ax.set_title(f"Tightness over {n_seeds} seeds per statement")
    ax.legend(fontsize=8, loc="lower left")
    note = f" {left_out} value(s) <= 0 (a bound side below zero) are not drawn." if left_out else ""
    return fig, ("Sweep over seeds: each statement's tightness at every seed (dots, coloured by verdict), its range "
                 "over the seeds (grey bar) and its median (black tick)." + note)


#: Figures of the sweep section of the dashboard (``report --sweep DIR``; table ``tables["sweep"]["tightness"]``).
SWEEP_FIGURES = {"sweep_tightness.png": fig_sweep_tightness}


def fig_pipeline_gap(rows, tables):
    """A simulation grid: the Pipeline 1 (from w_II) vs Pipeline 2 gap against K, per S and preference spread."""
    df = _table(tables, "grid", "points", ["K", "S", "delta_lambda", "seeds", "gap_wII_mean", "gap_wII_ci_low",
                                           "gap_wII_ci_high", "delta_lambda_realized"])
    df = df[df["seeds"] > 0].sort_values(["delta_lambda", "S", "K"])
    if df.empty:
        raise MissingData("no grid point has a finished cell")
    spreads = list(dict.fromkeys(df["delta_lambda"]))
    s_values = list(dict.fromkeys(sorted(df["S"])))
    colors = dict(zip(s_values, sns.color_palette("viridis", len(s_values)), strict=True))
    fig, axes = plt.subplots(1, len(spreads), figsize=(max(4.2 * len(spreads), 6.5) + 1.0, 4.4), sharey=True,
                             squeeze=False)
    positive = bool((df["gap_wII_ci_low"] > 0).all())  # a log scale only when every band stays above 0
    for ax, dl in zip(axes[0], spreads, strict=True):
        sub = df[df["delta_lambda"] == dl]
        for S, g in sub.groupby("S", sort=True):
            ax.plot(g["K"], g["gap_wII_mean"], marker="o", ms=4, lw=1.6, color=colors[S], label=f"S = {S}")
            ax.fill_between(g["K"], g["gap_wII_ci_low"], g["gap_wII_ci_high"], color=colors[S], alpha=0.2, lw=0)
        ax.set_xscale("log", base=2)
        if positive:
            ax.set_yscale("log")
        ax.set_xlabel("K (steps of Pipeline 1)")
        ax.set_title(f"spread s_u = {dl:g} (δ_λ ≈ {sub['delta_lambda_realized'].mean():.2g})")
    axes[0][0].set_ylabel("gap ψ_new: Pipeline 1 (w_II) − Pipeline 2")
    axes[0][-1].legend(title="samples per step", fontsize=8)
    n = int(df["seeds"].min())
    fig.suptitle(f"Pipeline 1 vs Pipeline 2 for a new client (mean, 95% CI over {n}+ seeds)", fontsize=12)
    return fig, ("Simulation grid (planted F1, Algorithm 1): the mean over seeds of the new clients' gap between "
                 "Pipeline 1 (K steps of S fresh samples each, from the Phase 2 model w_II) and Pipeline 2 "
                 "(data-rich local training), with its two-sided 95% Student-t confidence band over seeds; one "
                 "panel per planted preference spread s_u (δ_λ: the realised spread max ‖λ_new − λ_i‖ in the "
                 "new client's cluster, mean over seeds).")


#: The figure of a simulation grid (``python -m verification grid``; table ``tables["grid"]["points"]``).
GRID_FIGURES = {"pipeline_gap.png": fig_pipeline_gap}


def draw_grid(out: Path, table) -> tuple[dict[str, str], dict[str, str]]:
    """Draw the figures of a simulation grid (:data:`GRID_FIGURES`, from the table of
    :func:`verification.engine.grid.summarize_grid`) into ``out/figures``; returns ({file: caption},
    {file: why not drawn})."""
    return draw_all(Path(out) / "figures", [], {"grid": {"points": table}}, figures=GRID_FIGURES)


@contextlib.contextmanager
def plot_jitter_seeded(name: str) -> Iterator[None]:
    """Draw with numpy's global random state seeded from the figure's file ``name`` and restored afterwards:
    seaborn's strip plots jitter their dots with ``np.random`` (no generator can be passed), and a figure must come
    out the same on every report (``make report`` reproduces the committed PNG files). Nothing the checks compute
    uses the global state."""
    state = np.random.get_state()  # noqa: NPY002 - the state seaborn draws from, restored below
    np.random.seed(zlib.crc32(name.encode()))  # noqa: NPY002 - seaborn takes no generator
    try:
        yield
    finally:
        np.random.set_state(state)  # noqa: NPY002


def draw_all(fig_dir: Path, rows, tables, figures=None) -> tuple[dict[str, str], dict[str, str]]:
    """Draw every figure of ``figures`` (default :data:`FIGURES`); returns ({file: caption}, {file: why
    missing}). A missing figure's file left in ``fig_dir`` by an earlier report is removed, so the folder holds
    only what this report drew."""
    fig_dir = Path(fig_dir)
    fig_dir.mkdir(parents=True, exist_ok=True)
    sns.set_theme(style="whitegrid", context="notebook")
    drawn, missing = {}, {}
    for name, fn in (FIGURES if figures is None else figures).items():
        try:
            with plot_jitter_seeded(name):
                fig, caption = fn(rows, tables)
        except MissingData as exc:
            missing[name] = str(exc)
            (fig_dir / name).unlink(missing_ok=True)
            continue
        fig.tight_layout(rect=(0, 0.06, 1, 1) if fig.legends else (0, 0, 1, 1))
        fig.savefig(fig_dir / name, dpi=110)
        plt.close(fig)
        drawn[name] = caption
    return drawn, missing
