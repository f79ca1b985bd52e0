"""The run studies of the outcome of training (:mod:`verification.llm.studies`): ``llm-pipelines`` (Pipeline 1
from ``w_I``, ``w_II``, AdamW vs Pipeline 2 and the baselines for the new clients against ``k ≤ K`` and ``S``;
eq 91) and ``llm-preference`` (per objective, held-out preference accuracy and DPO loss before and after training
against the client's ``λ``). Every public name is importable from :mod:`verification.llm.studies` too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from verification.llm.records import (
    ADAPTATION_PHASES,
    PIPELINE2_PHASE,
    RunRecords,
    objective_columns,
    reward_columns,
    reward_scales,
)
from verification.llm.study_config import LLMStudyConfig, RunDataMissing, _clean, _frac, _sources
from verification.studies.synthetic import StudyResult, _num

__all__ = ["PIPELINE_METHODS", "study_pipelines_run", "study_preference_run"]


# ================================================================================================ pipelines


#: Adaptation methods of the pipelines study: record phase -> (label, start, optimiser, covered by H.41).
PIPELINE_METHODS = {
    "pipeline1_wI": ("Pipeline 1 from w_I", "w_I", "preset", True),
    "pipeline1_wII": ("Pipeline 1 from w_II", "w_II", "preset", True),
    "pipeline1_wII_adamw": ("Pipeline 1 from w_II, AdamW", "w_II", "adamw", False),
    "local_only": ("local only (from w_ref)", "w_ref", "preset", True),
    "fedavg_adapt": ("FedAvg + adaptation", "w_FedAvg", "preset", True),
}
assert set(PIPELINE_METHODS) == set(ADAPTATION_PHASES)
_IDEALISED = ("identity", "fixed", "rmsprop_lagged")


def study_pipelines_run(runs: Sequence[RunRecords], config: LLMStudyConfig | None = None) -> StudyResult:
    """Pipeline 1 vs Pipeline 2 vs the baselines for every new client against ``k ≤ K`` (and ``S`` across runs)."""
    del config
    rows, p2_rows, const_rows = [], [], []
    if not runs:
        raise ValueError("no run to study: pass at least one RunRecords")
    for run in runs:  # runs of one kind (label) form one source; their S values are its S axis
        src = run.label
        r = run.records
        p2 = r[r["phase"] == PIPELINE2_PHASE]
        if p2.empty:
            continue
        p2_final = p2.sort_values("round").groupby("client")["gap"].last()
        adapt = r[r["phase"].isin(ADAPTATION_PHASES)]
        S_run = float(adapt["batch_size"].dropna().iloc[0]) if adapt["batch_size"].notna().any() else math.nan
        for i, v in p2_final.items():
            p2_rows.append(dict(source=src, run=run.path.name, batch_size=S_run, client=int(i), pipeline2_gap=float(v),
                                pipeline2_steps=int(p2.loc[p2["client"] == i, "round"].max())))
        for phase, (label, start, _, _) in PIPELINE_METHODS.items():
            g = r[r["phase"] == phase]
            if g.empty:
                continue
            S = float(g["batch_size"].dropna().iloc[0]) if g["batch_size"].notna().any() else math.nan
            K = int(g["round"].max())
            pre = str(g["preconditioner"].iloc[0])
            for i, gi in g.groupby("client", sort=True):
                gi = gi.sort_values("round")
                p2v = float(p2_final.get(i, math.nan))
                rows.append(pd.DataFrame(dict(
                    source=src, run=run.path.name, client=int(i), cluster=int(gi["cluster"].iloc[0]), method=phase,
                    method_label=label, start=start, preconditioner=pre, batch_size=S, k_max=K, k=gi["round"].to_numpy(),
                    gap=gi["gap"].to_numpy(np.float64), gap_minus_pipeline2=gi["gap"].to_numpy(np.float64) - p2v,
                    alpha=float(gi["alpha_adapt"].iloc[0]), psi_star=run.psi_star)))
                steps = gi[gi["local_steps"] > 0]
                const_rows.append(dict(
                    source=src, run=run.path.name, client=int(i), method=phase, preconditioner=pre, batch_size=S, k_max=K,
                    alpha=float(gi["alpha_adapt"].iloc[0]), delta0=float(gi["gap"].iloc[0]),
                    gap_at_k_max=float(gi["gap"].iloc[-1]),
                    p_min_observed=_num(steps["p_min"].min()), p_max_observed=_num(steps["p_max"].max()),
                    h41_by_construction=pre in _IDEALISED,
                    mean_contraction_per_step=_num((max(float(gi["gap"].iloc[-1]), 0.0)
                                                    / float(gi["gap"].iloc[0])) ** (1.0 / K))
                    if K > 0 and float(gi["gap"].iloc[0]) > 0 else None))
    if not rows:
        raise RunDataMissing("no run has new clients (adaptation records and Pipeline 2)")
    table = pd.concat(rows, ignore_index=True)
    p2t = pd.DataFrame(p2_rows)
    consts = pd.DataFrame(const_rows)
    at_K = table[table["k"] == table["k_max"]]
    summary: dict = {}
    for (src, S), g in at_K.groupby(["source", "batch_size"], sort=True):
        d: dict[str, Any] = {}
        for phase, gm in g.groupby("method", sort=False):
            d[phase] = dict(K=int(gm["k_max"].iloc[0]), mean_gap=_num(gm["gap"].mean()),
                            mean_gap_minus_pipeline2=_num(gm["gap_minus_pipeline2"].mean()),
                            max_gap_minus_pipeline2=_num(gm["gap_minus_pipeline2"].max()), n_clients=int(len(gm)))
        p = p2t[(p2t["source"] == src) & (p2t["batch_size"] == S)]
        d["pipeline2"] = dict(mean_gap=_num(p["pipeline2_gap"].mean()), n_clients=int(len(p)))
        wide = g.pivot_table(index="client", columns="method", values="gap")
        if "pipeline1_wII" in wide:
            for base in ("local_only", "fedavg_adapt"):
                if base in wide:
                    d[f"frac_clients_pipeline1_wII_below_{base}"] = _frac(wide["pipeline1_wII"] < wide[base])
        summary.setdefault(src, {})[f"S={int(S) if math.isfinite(S) else 'nan'}"] = d
    summary["eq91"] = (
        "not evaluated: eq 91 needs mu_PL (PL constant of psi_new on the adaptation region), L0 and the per-sample "
        "variance sigma0^2; an adaptation row records psi, the gap, beta, the LP mode and the preconditioner range "
        "but no gradient information (dM_norm, margins and Gram are NaN/absent there), so none of the three can be "
        "estimated from the records. Recorded: alpha, Delta_0 = the gap at k = 0, and p_-/p_+ observed (table "
        "constants). The bound with exact constants is evaluated on family F3 by study-adamw-adaptation.")
    notes = (
        "New clients (did not take part in training) after k = 0..K adaptation steps with fresh batches of S samples "
        "(records of run_algorithm: pipeline1_wI / pipeline1_wII = Pipeline 1 from the cluster's w_I / w_II with the "
        "preset's preconditioner (rmsprop_lagged: F_k-measurable, clipped to [p_-, p_+], no momentum, no weight "
        "decay: H.41 holds by construction), pipeline1_wII_adamw = the same from w_II with AdamW (violates H.41 (a), "
        "(b), (c), and (d) when weight decay > 0: Remark H.42), local_only = the same optimiser from w_ref, "
        "fedavg_adapt = the linear-scalarisation direction from FedAvg's model), against Pipeline 2 (data-rich local "
        "training from w_II: the returned, best iterate, last pipeline2 row). gap = psi_new - psi_hat*_new (an LLM "
        "run: psi_hat* estimated, >= psi*, gaps under-estimated; synthetic: planted). gap_minus_pipeline2 at k = K is "
        "the Pipeline 1 vs 2 gap of Prop. H.44(c). K is the run's adaptation budget; S varies only across runs "
        "(one S per run: runs of one kind, LLM or synthetic, form one source whose runs at several S give the S axis; runs at the same S are pooled). mean_contraction_per_step = (gap_K/gap_0)^(1/K), "
        "descriptive (not an estimate of 1 - alpha mu_PL p_-, which also absorbs the noise floor).")
    return StudyResult("llm-pipelines", "Pipeline 1 vs Pipeline 2 and baselines for new clients against K and S",
                       dict(gap_vs_k=table, pipeline2=p2t, constants=consts), _clean(summary), notes)


# ================================================================================================ preference


def study_preference_run(runs: Sequence[RunRecords], config: LLMStudyConfig | None = None) -> StudyResult:
    """Per client and objective: held-out preference accuracy and held-out DPO loss before and after, against λ."""
    del config
    rows = []
    for src, run in _sources(runs):
        acc = objective_columns(run, "heldout_acc")
        hl = objective_columns(run, "heldout_loss")
        if not acc or not run.prefs:
            continue
        r = run.records
        # before: the client's model at w_ref (Phase 1 round 0 for a training client, local_only k = 0 for a new one)
        before = pd.concat([r[(r["phase"] == "phase1") & (r["round"] == 0)],
                            r[(r["phase"] == "local_only") & (r["round"] == 0)]]).drop_duplicates("client")
        before = before.set_index("client")
        ends = {}
        for phase in ("phase1", "phase2") + ADAPTATION_PHASES + (PIPELINE2_PHASE,):
            g = r[r["phase"] == phase]
            if len(g):
                ends[phase] = g[g["round"] == g.groupby("client")["round"].transform("max")].drop_duplicates(
                    "client", keep="last").set_index("client")
        for phase, end in ends.items():
            for i in end.index:
                if i not in before.index or int(i) not in run.prefs:
                    continue
                lam = run.prefs[int(i)]
                for j, o in enumerate(run.objectives or ()):
                    a0, a1 = float(before.at[i, acc[o]]), float(end.at[i, acc[o]])
                    l0 = float(before.at[i, hl[o]]) if hl else math.nan
                    l1 = float(end.at[i, hl[o]]) if hl else math.nan
                    rows.append(dict(source=src, client=int(i), after=phase, objective=o, lam=float(lam[j]),
                                     lam_rank=int((-lam).argsort().argsort()[j]), acc_before=a0, acc_after=a1,
                                     acc_change=a1 - a0, heldout_loss_before=l0, heldout_loss_after=l1,
                                     heldout_loss_change=l1 - l0))
    table = pd.DataFrame(rows)
    summary: dict = {}
    if table.empty:
        summary["available"] = False
        summary["reason"] = ("no run records held-out accuracy per objective and the clients' preferences (a "
                             "synthetic run has neither)")
    else:
        summary["available"] = True
        for (src, after), g in table.groupby(["source", "after"], sort=False):
            per_client = []
            for _i, gc in g.groupby("client"):
                lam = gc["lam"].to_numpy()
                m = lam.size
                per_client.append(dict(
                    weighted_acc_change=float(lam @ gc["acc_change"].to_numpy() - gc["acc_change"].mean()),
                    weighted_loss_change=float(lam @ gc["heldout_loss_change"].to_numpy()
                                               - gc["heldout_loss_change"].mean()),
                    top_objective_loss_drop_largest=_strictly_largest(-gc["heldout_loss_change"].to_numpy(), lam)
                    if m else None))
            pc = pd.DataFrame(per_client)
            summary.setdefault(src, {})[after] = dict(
                n_clients=int(g["client"].nunique()),
                spearman_lam_vs_acc_change=_spearman(g["lam"], g["acc_change"]),
                spearman_lam_vs_loss_drop=_spearman(g["lam"], -g["heldout_loss_change"]),
                mean_weighted_acc_change=_num(pc["weighted_acc_change"].mean()),
                mean_weighted_loss_change=_num(pc["weighted_loss_change"].mean()),
                frac_clients_top_objective_loss_drop_largest=_frac(pc["top_objective_loss_drop_largest"]),
            )
    rewards = _reward_changes(runs)
    if rewards.empty:
        summary["rewards"] = None
        summary["not_recorded"] = ("reward of generated responses before and after: no run has generations.csv "
                                   "(python -m llm_runs run writes it unless the preset's generation is None)")
    else:
        summary["rewards"] = _reward_summary(rewards)
    notes = (
        "Does the personalised model move toward the client's preference? Per client and objective j: held-out "
        "preference accuracy (share of held-out pairs the model ranks as the objective's reward does; ties 1/2) and "
        "held-out DPO loss of objective j, before (the base model w_ref: Phase-1 round 0 for a training client, "
        "local_only k = 0 for a new client) and after each phase (a training client's cluster model w_I, w_II; a "
        "new client's adapted model per pipeline). The held-out pairs are shared by all clients, so clients of one "
        "cluster see the same numbers for the cluster model. weighted_acc_change = sum_j lambda_j d_acc_j - mean_j "
        "d_acc_j (> 0: accuracy rose more on the objectives the client weights more); weighted_loss_change the same "
        "for the loss (< 0: the loss fell more on the client's heavier objectives); spearman over (client, "
        "objective) pairs of lambda_j against the change. Few held-out pairs make the accuracy coarse (steps of "
        "1/(2 n_pairs)); the loss is the finer measure. Rewards of generated responses (table rewards, summary "
        "rewards; generations.csv of an LLM run): every model of the run answered the same evaluation prompts (none "
        "trained on) with the same sampling seed; per client, objective and model the mean reward over the "
        "(prompt, sample) responses against the base model's responses to the same prompt and sample (paired "
        "differences: mean, standard error), in units of the objective's within-prompt reward sd on the data file "
        "(change_sd_units), so objectives are comparable. A client's models: the base model; a training client's "
        "cluster models w_I, w_II and FedAvg; a new client's adapted models (each pipeline). weighted_change = "
        "sum_j lambda_j z_j - mean_j z_j (> 0: the rewards rose more on the objectives the client weights more); "
        "spearman over (client, objective) pairs of lambda_j against z_j; top_objective_gain_largest: the client's "
        "largest z_j is on its largest lambda_j. Few prompts and samples make these noisy: read the standard errors.")
    return StudyResult("llm-preference", "Held-out preference accuracy, loss and rewards of generated responses "
                       "per objective against the client's lambda", dict(changes=table, rewards=rewards),
                       _clean(summary), notes)


def _strictly_largest(x: np.ndarray, lam: np.ndarray) -> bool:
    """Whether ``x`` is strictly largest at the client's largest weight ``λ_j`` (a tie is not)."""
    top = int(np.argmax(lam))
    return bool(x.size == 1 or x[top] > np.delete(x, top).max())


def _spearman(a: pd.Series, b: pd.Series) -> float | None:
    """Spearman's rank correlation; None when either side is constant or has fewer than 3 values."""
    a, b = pd.Series(a).reset_index(drop=True), pd.Series(b).reset_index(drop=True)
    if len(a) < 3 or a.nunique() < 2 or b.nunique() < 2:
        return None
    return _num(a.rank().corr(b.rank()))


def _reward_changes(runs: Sequence[RunRecords]) -> pd.DataFrame:
    """Per (source, client, model, objective): the reward of the model's generated responses against the base
    model's, paired by (prompt, sample), in the objective's units and in within-prompt sd units."""
    rows = []
    for src, run in _sources(runs):
        cols = reward_columns(run)
        scales = reward_scales(run)
        if not cols or not run.prefs:
            continue
        g = run.generations
        if g is None:
            continue
        base = g[g["model"] == "w_ref"].set_index(["prompt_id", "sample"])
        for _, m in g[g["model"] != "w_ref"].groupby(["model", "cluster", "clients"], sort=False):
            label = str(m["model"].iloc[0])
            m = m.set_index(["prompt_id", "sample"])
            pair = m.index.intersection(base.index)
            clients = [int(x) for x in str(m["clients"].iloc[0]).split()]
            for i in clients:
                if i not in run.prefs:
                    continue
                lam = run.prefs[i]
                for j, o in enumerate(run.objectives or ()):
                    d = m.loc[pair, cols[o]].to_numpy(np.float64) - base.loc[pair, cols[o]].to_numpy(np.float64)
                    sd = scales.get(o, math.nan)
                    se = float(d.std(ddof=1) / math.sqrt(d.size)) if d.size > 1 else math.nan
                    rows.append(dict(source=src, client=i, model=label, cluster=int(m["cluster"].iloc[0]),
                                     role="new" if len(clients) == 1 else "train", objective=o, lam=float(lam[j]),
                                     n_responses=int(d.size), reward_before=float(base.loc[pair, cols[o]].mean()),
                                     reward_after=float(m.loc[pair, cols[o]].mean()), change=float(d.mean()),
                                     change_se=se, reward_sd=sd, change_sd_units=float(d.mean()) / sd,
                                     change_se_sd_units=se / sd))
    return pd.DataFrame(rows)


def _reward_summary(t: pd.DataFrame) -> dict:
    out: dict = {}
    for (src, model), g in t.groupby(["source", "model"], sort=False):
        per = []
        for _, gc in g.groupby("client"):
            lam, z = gc["lam"].to_numpy(), gc["change_sd_units"].to_numpy()
            per.append(dict(weighted=float(lam @ z - z.mean()), top=_strictly_largest(z, lam)))
        pc = pd.DataFrame(per)
        out.setdefault(src, {})[model] = dict(
            n_clients=int(g["client"].nunique()), n_responses=int(g["n_responses"].max()),
            spearman_lam_vs_change=_spearman(g["lam"], g["change_sd_units"]),
            mean_weighted_change=_num(pc["weighted"].mean()),
            frac_clients_top_objective_gain_largest=_frac(pc["top"]),
            mean_change_sd_units={o: _num(v) for o, v in g.groupby("objective")["change_sd_units"].mean().items()},
            mean_se_sd_units=_num(g["change_se_sd_units"].mean()))
    return out
