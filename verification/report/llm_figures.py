"""Figures of the dashboard's LLM section (seaborn, PNG): the run studies of :mod:`verification.llm.studies`, the
LLM run beside the synthetic run (and beside the synthetic study of :mod:`verification.studies.synthetic` where there is one).

Same contract as :mod:`verification.report.figures`: every ``fig_*`` takes ``(rows, tables)`` (``tables``: ``{study id:
{table: DataFrame}}``) and returns ``(figure, caption)`` or raises :class:`~verification.report.figures.MissingData`; the
captions say what is measured and what is assumed. Drawn by :func:`verification.report.figures.draw_all` with
``figures=LLM_FIGURES``; every file name contains ``llm``.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from verification.report.figures import MissingData, _table

__all__ = ["LLM_FIGURES", "SOURCE_ORDER"]

#: Column order of the side-by-side panels.
SOURCE_ORDER = ("synthetic", "LLM")
_FLOOR = 1e-6  # ratios and gaps at or below this are drawn at it on a log axis
_ROUNDS = "round t (Phase 1, then Phase 2)"


def _ordered_sources(df: pd.DataFrame) -> list[str]:
    have = list(dict.fromkeys(df["source"]))
    first = [s for s in SOURCE_ORDER if s in have]
    return first + [s for s in have if s not in first]


def _pct(x) -> str:
    return "n/a" if x is None or not np.isfinite(x) else f"{100 * x:.0f}%"


def _phase_boundary(ax, df: pd.DataFrame) -> None:
    """A dotted vertical line at w_I (the last Phase-1 iterate) when the data has Phase 2."""
    if "phase" in df and (df["phase"] == "phase2").any() and (df["phase"] == "phase1").any():
        ax.axvline(float(df.loc[df["phase"] == "phase1", "t"].max()), color="#555", ls=":", lw=1)


def _label(ax, xlabel: str, ylabel: str, title: str | None = None, *, log: bool = True, legend: bool = False):
    """Axis labels, a log y axis, a small title and legend."""
    if log:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=9.5)
    if legend:
        ax.legend(fontsize=7)


def fig_llm_trajectory_hypothesis(rows, tables):
    """Eq 71: β_i^t/β̄ and Δ_i^t/Δ̄_i along training, calibration window shaded, per source."""
    pts = _table(tables, "llm-eq71-trajectory", "points",
                 ["source", "scheme", "t", "client", "beta_ratio", "delta_ratio_h14", "window", "phase", "t0"])
    byp = _table(tables, "llm-eq71-trajectory", "by_phase", ["source", "scheme", "method", "phase",
                                                              "frac_rounds_eq71"])
    scheme, method = "phase1_first_half", "h14"
    pts = pts[pts["scheme"] == scheme]
    if pts.empty:
        raise MissingData(f"no points of scheme {scheme}")
    sources = _ordered_sources(pts)
    fig, axes = plt.subplots(2, len(sources), figsize=(5.6 * len(sources), 7.0), squeeze=False, sharex="col")
    titles = []
    for c, src in enumerate(sources):
        df = pts[pts["source"] == src].copy()
        t0 = int(df["t0"].iloc[0])
        for r, (col, label) in enumerate((("beta_ratio", "β_i^t / β̄"), ("delta_ratio_h14", "Δ_i^t / Δ̄_i  (Δ̄_i = √(H̄/ρ_min))"))):
            ax = axes[r][c]
            df["y"] = df[col].clip(lower=_FLOOR)
            sns.lineplot(data=df, x="t", y="y", hue="client", units="client", estimator=None, lw=1.0,
                         palette="tab10", legend=False, ax=ax)
            ax.axhline(1.0, color="#c62828", lw=1.2, ls="--")
            ax.axvspan(float(df["t"].min()), t0 - 0.5, color="#90a4ae", alpha=0.25, lw=0)
            _phase_boundary(ax, df)
            _label(ax, _ROUNDS, label)
        b = byp[(byp["source"] == src) & (byp["scheme"] == scheme) & (byp["method"] == method)].set_index("phase")
        f1 = b["frac_rounds_eq71"].get("phase1", np.nan)
        f2 = b["frac_rounds_eq71"].get("phase2", np.nan)
        axes[0][c].set_title(f"{src}: eq 71 holds at {_pct(f1)} of the Phase-1\nand {_pct(f2)} of the Phase-2 test rounds",
                             fontsize=10)
        titles.append(f"{src} {_pct(f1)} / {_pct(f2)}")
    fig.suptitle("Trajectory hypothesis (eq 71): β and Δ against constants set on the shaded calibration window", fontsize=11, wrap=True)
    return fig, (
        "Eq 71 along the concatenated Phase-1/Phase-2 trajectory (dotted line: w_I), one line per training client. "
        "Measured: β_i(w^t) (population records) divided by β̄ = the cluster's largest β on the calibration window "
        "(shaded: Phase-1 rounds t < t0 = ⌈R/2⌉), and the deviation Δ_i^t = ‖d_i − d̄‖ divided by Δ̄_i = √(H̄/ρ_min) "
        "(Cor. H.14, H̄ = the largest H_Cn on the window). Eq 71 holds where both ratios are ≤ 1 (red line) for every "
        "client of the cluster; the constants are not fitted on the rounds they are checked on. Share of test "
        "rounds with eq 71 (Phase 1 / Phase 2): " + "; ".join(titles) + f". Ratios ≤ {_FLOOR:g} (β = 0) are drawn "
        "at that floor. Assumed: nothing beyond the records; the region 𝒩 of eq 71 is not checked.")


def fig_llm_h20_ratio(rows, tables):
    """H.20 (ii) ratio by client and phase, J* and J*_ε separately, per source."""
    pts = _table(tables, "llm-H20-ratio", "points", ["source", "index_set", "phase", "client", "ratio", "dm_zero",
                                                     "numerator_negative"])
    sources = _ordered_sources(pts)
    sets = [s for s in ("J_star", "J_eps") if s in set(pts["index_set"])]
    how = {"own_hull_from_gram": "each set's own hull, from the recorded Grams",
           "J_eps_hull_recorded": "the J*_ε hull for both sets, as recorded (no Grams in the records)"}
    denoms = [f"{src}: {how.get(str(d), str(d))}" for src in sources
              for d in ([pts.loc[pts["source"] == src, "denominator"].iloc[0]] if "denominator" in pts else ["?"])]
    fig, axes = plt.subplots(len(sources), len(sets), figsize=(6.2 * len(sets), 3.9 * len(sources)),
                             squeeze=False)
    parts = []
    for r, src in enumerate(sources):
        for c, name in enumerate(sets):
            ax = axes[r][c]
            df = pts[(pts["source"] == src) & (pts["index_set"] == name)]
            inc = df[~df["dm_zero"].astype(bool)]
            neg = float(df["numerator_negative"].astype(bool).mean())
            if len(inc):
                sns.stripplot(data=inc, x="client", y="ratio", hue="phase", dodge=True, size=3, alpha=0.6,
                              jitter=0.25, ax=ax, hue_order=["phase1", "phase2"])
                ax.set_yscale("symlog", linthresh=1e-2)
            ax.axhline(0.0, color="#c62828", lw=1)
            ax.axhline(1.0, color="k", ls="--", lw=0.8)
            sym = "J*" if name == "J_star" else "J*_ε"
            ax.set_title(f"{src}, min over {sym}: numerator < 0 at {_pct(neg)}; d_M ≈ 0 at "
                         f"{int(df['dm_zero'].astype(bool).sum())}/{len(df)}", fontsize=9.5)
            ax.set_xlabel("training client")
            ax.set_ylabel("min_j λ_j d_iᵀg_j / ‖d_M‖²  (symlog)")
            if ax.get_legend() is not None:
                if (r, c) != (0, 0):
                    ax.get_legend().remove()
                else:
                    sns.move_legend(ax, "lower left", fontsize=7, title_fontsize=7, framealpha=0.8)
            parts.append(f"{src} {sym} {_pct(neg)}")
    fig.suptitle("Lemma H.20 (ii) along training: the EPO direction's margin over J* and over J*_ε, relative to ‖d_M‖²", fontsize=11, wrap=True)
    return fig, (
        "The ratio of Lemma H.20 (ii) at every training step of every client (dots; Phase 1 and Phase 2 side by "
        "side), on the exact bottleneck set J* (left) and the near-active set J*_ε of width ε_act = 2ηλ_max B² "
        "(right). Measured: the numerator min_{j∈J} λ_j d_iᵀg_j of the population LP direction at the server model, "
        "and ‖d_M‖ of the minimum-norm element of conv{λ_j g_j : j ∈ J}: " + "; ".join(denoms) + ". Points with "
        "‖d_M‖ ≤ 1e-3 × the generator scale (the largest ‖λ_j g_j‖ over J; λ_max B without Grams) (d_M ≈ 0: "
        "below bf16/float32 gradient precision) are not "
        "drawn and counted in the titles; their numerators count for the sign. Negative numerators (below −1e-9 "
        "× the squared generator scale, LP roundoff): " + "; ".join(parts) + ". σ > 0 in (ii) needs every dot "
        "above the red line. Assumed: B = the largest gradient norm recorded so far (it sets ε_act); for the LLM "
        "run ψ* is estimated, which does not enter the ratio.")


def fig_llm_dispersion(rows, tables):
    """H_Cn along training by clustering: the synthetic study, and each run (its Stage-1+2 clusters along Phase 1
    and 2, and the Stage-1-only and random clusterings along Phase 1 where the run recorded them)."""
    run = _table(tables, "llm-H8-dispersion", "by_round", ["source", "clustering", "draw", "cluster", "size", "t",
                                                            "dispersion", "phase"])
    syn = tables.get("study-H8-dispersion", {}).get("by_round")
    have_syn = syn is not None and not syn.empty and {"clustering", "round", "mean_dispersion"} <= set(syn.columns)
    sources = _ordered_sources(run)
    n = len(sources) + (1 if have_syn else 0)
    fig, axes = plt.subplots(1, n, figsize=(5.4 * n, 4.4), squeeze=False)
    axes = list(axes[0])
    order = ("stage1_stage2", "stage1_only", "random")
    palette = dict(zip(order, ["#1565c0", "#ef6c00", "#757575"], strict=True))
    parts = []
    if have_syn:
        ax = axes.pop(0)
        sns.lineplot(data=syn, x="round", y="mean_dispersion", hue="clustering", errorbar=("pi", 100), ax=ax,
                     hue_order=[h for h in order if h in set(syn["clustering"])], palette=palette)
        ax.set_yscale("log")
        ax.set_xlabel("Phase-1 round")
        ax.set_ylabel("mean over clusters of H_Cn(w^t)")
        ax.set_title("synthetic study (planted F1, every clustering trained)", fontsize=10)
        tm = syn.groupby("clustering")["mean_dispersion"].mean()
        parts.append("synthetic study, time mean over Phase 1: " + ", ".join(f"{k} {tm[k]:.3g}" for k in order
                                                                          if k in tm))
    for ax, src in zip(axes, sources, strict=True):
        df = run[run["source"] == src]
        # mean over the clusters of one clustering (one draw) at each iterate
        per = df.groupby(["clustering", "draw", "t"], sort=True)["dispersion"].mean().reset_index()
        floor = _FLOOR * max(float(per["dispersion"].max()), 1e-300)
        per["H"] = per["dispersion"].clip(lower=floor)
        have = [c for c in order if c in set(per["clustering"])]
        same = ("same_as_stage1_stage2" in df and "stage1_only" in have
                and bool(df.loc[df["clustering"] == "stage1_only", "same_as_stage1_stage2"].astype(bool).all()))
        shown = {c: (f"{c} (= stage1_stage2: same partition)" if c == "stage1_only" and same else c) for c in have}
        per["shown"] = per["clustering"].map(shown)
        pal = {shown[c]: palette[c] for c in have}
        sns.lineplot(data=per, x="t", y="H", hue="shown", hue_order=[shown[c] for c in have], palette=pal,
                     style="shown", dashes={shown[c]: ((4, 2) if c == "stage1_only" and same else "") for c in have},
                     marker="o", ms=3, errorbar=("pi", 100), estimator="mean", ax=ax)
        _phase_boundary(ax, df)
        compared = len(have) > 1
        _label(ax, _ROUNDS, "mean over clusters of H_Cn(w^t)",
               f"{src} run: " + ("Stage-1+2 vs Stage-1-only vs random" if compared else "Stage-1+2 clusters only"),
               legend=True)
        tm = per[per["t"] <= per.loc[per["clustering"] != "stage1_stage2", "t"].max()] if compared else per
        tm = tm.groupby(["clustering", "draw"])["dispersion"].mean().groupby("clustering").mean()
        parts.append(f"{src} run, time mean over " + ("Phase 1: " if compared else "the run: ")
                     + ", ".join(f"{k} {tm[k]:.3g}" for k in have))
    fig.suptitle("Direction dispersion H_Cn along training by clustering (Remark H.8)", fontsize=11, wrap=True)
    return fig, (
        "H_Cn(w^t) = Σ ρ_i ‖d_i − d̄‖² of the population LP directions at each cluster's server model, averaged "
        "over the clusters of a clustering (band: range over the random draws). Each clustering is trained: Phase 1 "
        "from w_ref with the same configuration, every cluster its own server model; random = uniform partitions "
        "with exactly the Stage-1+2 cluster sizes; a Stage-1-only partition equal to Stage-1+2 is not trained "
        "again. Left (if drawn): the synthetic study study-H8-dispersion (planted F1). Then each recorded run: its "
        "Stage-1+2 clusters along Phase 1 and Phase 2 (dotted: w_I) and, where the run recorded the comparison "
        "(an LLM run's clusterings.csv), the other clusterings along Phase 1; a run without it (sim.simulate) shows "
        "Stage-1+2 only. Remark H.8 motivates Stage 2 by a smaller H_Cn; H.5 fails for the LLM run (per-client "
        "data), so H_Cn is measured, not bounded by eq 10. " + "; ".join(parts) + ".")


def fig_llm_pipelines(rows, tables):
    """New clients: gap against k for Pipeline 1 / AdamW / baselines, with Pipeline 2's level, per source and S."""
    df = _table(tables, "llm-pipelines", "gap_vs_k", ["source", "batch_size", "k", "gap", "method", "client", "k_max"])
    p2 = _table(tables, "llm-pipelines", "pipeline2", ["source", "batch_size", "client", "pipeline2_gap"])
    panels = [(s, S) for s in _ordered_sources(df) for S in sorted(df.loc[df["source"] == s, "batch_size"].unique())]
    ncols = min(2, len(panels))
    nrows = -(-len(panels) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(6.2 * ncols, 4.3 * nrows), squeeze=False)
    for ax in axes.ravel()[len(panels):]:
        ax.set_visible(False)
    order = ["pipeline1_wI", "pipeline1_wII", "pipeline1_wII_adamw", "local_only", "fedavg_adapt"]
    palette = dict(zip(order, ["#1565c0", "#2e7d32", "#ef6c00", "#757575", "#8e24aa"], strict=True))
    parts = []
    for ax, (src, S) in zip(axes.ravel(), panels, strict=False):
        sub = df[(df["source"] == src) & (df["batch_size"] == S)]
        p2s = p2[(p2["source"] == src) & (p2["batch_size"] == S)]["pipeline2_gap"]
        sns.lineplot(data=sub, x="k", y="gap", hue="method", hue_order=[m for m in order if m in set(sub["method"])],
                     palette=palette, marker="o", ms=4, errorbar=("pi", 100), ax=ax)
        ax.axhline(float(p2s.mean()), color="k", ls="--", lw=1.3, label="Pipeline 2 (data-rich)")
        # symlog: the gaps span decades and Pipeline 2's may be 0 (an LLM run's psi_hat* is its best value)
        thresh = 1e-3 * max(float(sub["gap"].abs().max()), 1e-300)
        ax.set_yscale("symlog", linthresh=thresh)
        ax.set_ylim(bottom=min(-0.3 * thresh, float(sub["gap"].min()), float(p2s.min())))  # 0 above the frame
        K = int(sub["k_max"].max())
        gapK = sub[(sub["k"] == K) & (sub["method"] == "pipeline1_wII")]["gap"].mean() - float(p2s.mean())
        _label(ax, "adaptation step k (fresh batch of S samples each)", "gap ψ_new(w_k) − ψ̂*_new (symlog)",
               f"{src}, S = {S:g}: Pipeline 1 (w_II) − Pipeline 2 at K = {K}: {gapK:.3g}", log=False, legend=True)
        parts.append(f"{src} (S = {S:g}, K = {K}): {gapK:.3g}")
    fig.suptitle("New clients: Pipeline 1 vs Pipeline 2 and the baselines against K", fontsize=11, wrap=True)
    return fig, (
        "Gap of the new clients' Chebyshev value after k adaptation steps (mean over the new clients; band: their "
        "range) for Pipeline 1 from w_I and from w_II with the preset's preconditioner (lagged RMSprop: H.41 holds "
        "by construction), Pipeline 1 from w_II with AdamW (H.41 (a)-(c) fail: Remark H.42), local-only training "
        "from w_ref and FedAvg + adaptation, against Pipeline 2 (dashed: its final gap, data-rich local training "
        "from w_II). For the LLM run ψ̂*_new is an estimate (≥ ψ*: the best ψ_new seen in the run, which Pipeline 2 "
        "attained, so its gap is 0), and every gap is under-estimated by the same amount per client; the synthetic "
        "ψ* is planted. One panel per run and new-client batch size S (the LLM run has one S). Eq 91 is not drawn: "
        "its constants μ_PL, L₀ and σ₀² are not estimable from the records (it is drawn with exact constants in the "
        "F3 adaptation figure). Pipeline 1 (w_II) − Pipeline 2 at the largest K: " + "; ".join(parts) + ".")


def fig_llm_contraction(rows, tables):
    """r̂_i^t against the two-phase band and the contraction bound, per source."""
    df = _table(tables, "llm-contraction", "trajectory", ["source", "client", "t", "gap", "band", "bound", "phase"])
    consts = _table(tables, "llm-contraction", "constants", ["source", "c_d", "t0"])
    sources = _ordered_sources(df)
    fig, axes = plt.subplots(1, len(sources), figsize=(5.8 * len(sources), 4.4), squeeze=False)
    parts = []
    for ax, src in zip(axes[0], sources, strict=True):
        sub = df[df["source"] == src].copy()
        floor = _FLOOR * max(float(sub["gap"].max()), 1e-300)
        clients = sorted(sub["client"].unique())
        colors = dict(zip(clients, sns.color_palette("tab10", len(clients)), strict=False))
        for i in clients:
            g = sub[sub["client"] == i].sort_values("t")
            ax.plot(g["t"], g["gap"].clip(lower=floor), color=colors[i], lw=1.3)
            ax.plot(g["t"], g["bound"], color=colors[i], lw=0.9, ls="--")
            ax.axhline(float(g["band"].iloc[0]), color=colors[i], lw=0.8, ls=":")
        c = consts[consts["source"] == src]
        t0 = int(c["t0"].iloc[0])
        ax.axvspan(float(sub["t"].min()), t0 - 0.5, color="#90a4ae", alpha=0.25, lw=0)
        _phase_boundary(ax, sub)
        test = sub[sub["t"] >= t0]
        inside = float((test["gap"] <= test["bound"] * (1 + 1e-12)).mean()) if len(test) else np.nan
        _label(ax, _ROUNDS, "r̂_i^t = ψ_i(w^t) − ψ̂_i*",
               f"{src}: c_d = {', '.join(f'{x:.3g}' for x in c.groupby('cluster')['c_d'].first())}; "
               f"r̂ within bound at {_pct(inside)} of test iterates")
        parts.append(f"{src}: mean band {c['band'].mean():.3g}, within bound {_pct(inside)}")
    fig.suptitle("Contraction into the two-phase band (Cor. H.32) with constants from the calibration window", fontsize=11, wrap=True)
    return fig, (
        "Per training client (colour): the recorded gap r̂_i^t (solid), the band ε̂_0,i of eq 74 (dotted) and the "
        "bound (1 − η_min c_d)^{t−t0} r̂^{t0} + ε̂_0,i of eq 75 from t0 on (dashed). Constants estimated on the "
        "shaded calibration window only: B (largest recorded gradient norm), Δ̄_i = √(H̄/ρ_min), and H.19's (c_d, "
        "b_i) from the window's J*_ε margins and gaps (one c_d minimising max ε_0,i). L₀ is not recorded, so the "
        "κ_η η term is omitted (the band is a lower estimate of eq 74's). For the LLM run r̂ uses ψ̂* ≥ ψ*, so it "
        "under-estimates the suboptimality and makes eq 51 look easier to satisfy; ψ̂_i* is the smallest ψ_i the run "
        f"saw, so r̂ = 0 where that is attained (drawn at the floor {_FLOOR:g}·max). " + "; ".join(parts) + ".")


def fig_llm_preference(rows, tables):
    """Held-out loss, held-out accuracy and generated-response reward changes per objective against the client's
    λ_j (LLM runs), for each client's personalised model."""
    df = _table(tables, "llm-preference", "changes", ["source", "client", "after", "objective", "lam",
                                                      "heldout_loss_change", "acc_change"])
    prefer = [a for a in ("pipeline1_wII", "phase2", "phase1") if a in set(df["after"])]
    if not prefer:
        raise MissingData("no after-phase of interest in llm-preference")
    rew = tables.get("llm-preference", {}).get("rewards")
    have_rew = rew is not None and not rew.empty
    panels = [("heldout_loss_change", "held-out DPO loss: after − before", df, prefer[:2], "after"),
              ("acc_change", "held-out accuracy: after − before", df, prefer[:2], "after")]
    if have_rew:
        models = [m for m in ("pipeline1_wII", "w_II") if m in set(rew["model"])]
        panels.append(("change_sd_units", "reward of generated responses: after − before\n(within-prompt sd units)",
                       rew, models, "model"))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.6 * len(panels), 4.4), squeeze=False)
    parts = []
    for ax, (col, label, data, which, key) in zip(axes[0], panels, strict=True):
        sub = data[data[key].isin(which)]
        sns.scatterplot(data=sub, x="lam", y=col, hue="objective", style=key, s=45, ax=ax)
        if col == "change_sd_units" and "change_se_sd_units" in sub:
            ax.errorbar(sub["lam"], sub[col], yerr=sub["change_se_sd_units"].fillna(0.0), fmt="none", ecolor="#999",
                        lw=0.8, zorder=0)
        ax.axhline(0.0, color="k", lw=0.8)
        ax.set_xlabel("client's weight λ_j of the objective")
        ax.set_ylabel(label)
        ok = sub["lam"].nunique() > 1 and sub[col].nunique() > 1
        rho = sub["lam"].rank().corr(sub[col].rank()) if ok else np.nan
        ax.set_title(f"Spearman(λ_j, change) = {rho:.2f} over {len(sub)} (client, objective) pairs", fontsize=9.5)
        sns.move_legend(ax, "best", fontsize=7, title_fontsize=7, framealpha=0.8)
        parts.append(f"{label.splitlines()[0]}: Spearman {rho:.2f}")
    fig.suptitle("Does the personalised model move toward the client's preference?", fontsize=11, wrap=True)
    rew_text = (
        "Right: the reward of responses the model generates to evaluation prompts no client trains on, against the "
        "base model's responses to the same prompts with the same sampling seed (paired; bars: ± one standard "
        "error), in units of the objective's within-prompt reward sd on the data file. "
        if have_rew else "Not recorded: reward of generated responses. ")
    return fig, (
        "Per (client, objective), for each client's personalised model (a training client: its cluster's w_II after "
        "Phase 2; a new client: Pipeline 1 from w_II): the change of the held-out DPO loss (left; negative = better) "
        "and of the held-out preference accuracy (middle) from the base model, against the client's weight λ_j of "
        "that objective. If personalisation works, the loss falls more (accuracy, reward rise more) for larger λ_j. "
        "The held-out pairs are shared by all clients and few, so accuracy moves in coarse steps; clients of one "
        "cluster share their model. " + rew_text + "; ".join(parts) + ".")


LLM_FIGURES = {
    "llm_trajectory_hypothesis.png": fig_llm_trajectory_hypothesis,
    "llm_h20_ratio.png": fig_llm_h20_ratio,
    "llm_dispersion_by_clustering.png": fig_llm_dispersion,
    "llm_pipelines_vs_k.png": fig_llm_pipelines,
    "llm_contraction.png": fig_llm_contraction,
    "llm_preference.png": fig_llm_preference,
}
