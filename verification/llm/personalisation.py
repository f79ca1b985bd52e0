r"""Does Algorithm 1 personalise a real model? The pre-registered analysis of the LLM ``study`` runs.

Written before the runs; this docstring is the contract (the docs quote it) and the code below implements it
as written. Pure numpy/scipy/pandas: it reads run directories (one per seed) and never runs a model.

Pre-registration
================

**Inputs** (per run directory, one per seed). ``summary.json["personalisation"]``: ``objectives`` (the m
objectives), ``personalised_model`` (``pipeline1_wII`` in the ``study`` preset), ``new_clients`` (each ``client``, its preference vector
``prefs`` λ_i — m non-negative numbers summing to 1 — and its ``cluster``), ``models`` (every evaluated model:
``label``, ``cluster``, ``client``), ``heldout.prompts``, ``generation_models``. ``heldout_margins.csv``: one row
per (model, objective, held-out pair) with the implicit-reward margin
``β[(log π(y_w) − log π_ref(y_w)) − (log π(y_l) − log π_ref(y_l))]`` of that pair (0 for the base model
``w_ref``); every model is evaluated on the same pairs. ``generations.csv``: the sampled responses of the models
in ``generation_models`` with one ``reward_<objective>`` column per objective; the same prompts and sampling seed
for every model, so that rows are paired by ``(prompt_id, sample)``.

**Unit: a model.** The personalised models are the new clients' models named by ``personalised_model`` — in the
``study`` preset ``pipeline1_wII``, Pipeline 1 from the cluster's meta-learned ``w_II`` (the paper's method: Phase
1, Phase 2 and K adaptation steps) —, one per new client
(≥ 8 per seed in the ``study`` preset), each with its client's λ_i.

**Paired change.** ``z_{i,j}`` = the mean over the held-out pairs of objective j of
``margin(model_i) − margin(w_ref)`` on the same pair (the base model's draw and every objective-wide drift of the
pairs cancel in the difference; the base model's own change is 0).

**Primary statistic: the held-out margin slope.** Per seed s, the OLS slope of ``z_{i,j}`` on ``λ_{i,j}`` with
objective fixed effects ``α_j`` (``z_{i,j} = α_j + b·λ_{i,j} + ε``) over the personalised models i and objectives
j: ``b_s = Σ_ij (λ_ij − λ̄_j)(z_ij − z̄_j) / Σ_ij (λ_ij − λ̄_j)²``, with λ̄_j, z̄_j the means over the personalised
models of the seed. An objective that every model moves alike (a pure α_j shift) gives b = 0. Across seeds
``B = mean_s b_s``. One-sided alternative H1: B > 0 (a model moves more on the objectives its client weighs
more).

* *p-value*: a permutation test. The λ rows (whole preference vectors) are permuted across the personalised
  models, independently within each seed, and B is recomputed: P = 9999 permutations drawn from
  ``numpy.random.default_rng(seed)``; ``p = (1 + #{B_perm ≥ B}) / (1 + P)``.
* *interval*: the 95 % t-interval of the b_s over the S seeds (``mean ± t_{0.975, S−1} · sd / √S``); with one
  seed, that seed's bootstrap interval.
* *per seed*: a 95 % percentile bootstrap interval over the held-out prompts: the prompt ids are resampled with
  replacement (2000 resamples) and z is recomputed from the pairs of the resampled prompts (a prompt drawn twice
  counts twice; a resample without any pair of some objective is dropped and counted).
* *minimum detectable effect* (MDE) at 80 % power, one-sided α = 0.05: ``(z_{0.95} + z_{0.80}) · sd(B_perm)``,
  the sd of B under the permutation null from the permutation draws (z_q the standard normal quantile).
* *verdict*: ``supported`` if p < 0.05; ``not supported`` if p ≥ 0.05 and the upper end of the 95 % interval is
  below the MDE (the data exclude the effect the design could detect); otherwise ``underpowered``.

**Secondary 1: the personalisation matrix.** Per seed, rows are the new clients i and every evaluated model gets
the score ``S(i, model) = Σ_j λ_ij z_{model,j}`` (the λ_i-weighted held-out margin change; w_ref scores 0). Row i
is won by its own personalised model against a comparator when ``S(i, own personalised model) > S(i, comparator)``
(strictly). Reported per comparator, the share of the rows won:

* ``fedavg``: the ``w_fedavg`` model of the client's cluster; ``local_only``: the client's own local-only model;
  ``base``: w_ref; ``global_uniform``: the one global model trained at uniform λ;
* ``other_personalised``: the own model beats every other new client's personalised model on row i (chance
  level 1/n under the null, n personalised models in the seed);
* ``all``: the own model beats every comparator above at once (those the run recorded).

Per seed the shares (and their bootstrap intervals over the held-out prompts, as above); across seeds the mean
share with its 95 % t-interval. The pre-registered test is on ``other_personalised``: permutation p-value against
chance (λ rows permuted within each seed — the same permutation draws as the primary statistic —, statistic the
mean share over seeds, ``p = (1 + #{share_perm ≥ share}) / (1 + P)``); MDE ``(z_{0.95} + z_{0.80}) · sd`` of the
mean share under the permutation null, an excess over chance (``mean_s 1/n_s``); verdict by the same rule applied
to the interval minus chance. The other comparators' shares are descriptive (no test).

**Secondary 2: the generation rewards.** Per personalised model i and objective j:
``g_{i,j} = mean over (prompt_id, sample) of [reward_j(model_i) − reward_j(w_ref)] / sd_j``, paired on
``(prompt_id, sample)``, with ``sd_j`` the sd (ddof 1) of ``reward_j`` over the base model's samples of that seed.
The same slope statistic with objective fixed effects on g in place of z, the same permutation draws, p-value,
t-interval (one seed: the bootstrap over the generation prompts, sd_j held fixed), MDE and verdict.

Everything is seeded (``numpy.random.default_rng(seed)``) and deterministic, in float64. A malformed or missing
input raises :class:`ValueError` naming the file, column or value.

API
===

* :func:`seed_statistics` ``(run_dir)``: the per-seed numbers (z and g tables, b and its bootstrap interval, the
  matrix shares, the generation slope), JSON-able;
* :func:`sweep_statistics` ``(run_dirs, n_perm=9999, seed=0)``: ``lines`` — one dict per pre-registered statistic,
  primary first (``statistic``, ``estimate``, ``interval``, ``p_value``, ``mde``, ``verdict``, ``n_seeds``,
  ``n_units``) —, the matrix shares per comparator, the per-seed details and ``text``, a paragraph saying what the
  design could and could not detect;
* :func:`verdict` ``(p, interval, mde)``: the rule above; :func:`line_text`: one dashboard line.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

__all__ = [
    "ALPHA",
    "COMPARATORS",
    "N_BOOT",
    "N_PERM",
    "POWER",
    "STATISTICS",
    "fixed_effect_slope",
    "line_text",
    "null_test",
    "seed_statistics",
    "short_number",
    "sweep_statistics",
    "verdict",
]

#: One-sided test level and the power of the minimum detectable effect.
ALPHA = 0.05
POWER = 0.80
#: Permutations of the λ rows (across seeds together) and bootstrap resamples of the prompts (per seed).
N_PERM = 9999
N_BOOT = 2000
#: ``(z_{0.95} + z_{0.80})``: the MDE over the sd of the statistic under the null.
MDE_FACTOR = float(stats.norm.ppf(1 - ALPHA) + stats.norm.ppf(POWER))

SUMMARY = "summary.json"
MARGINS = "heldout_margins.csv"
GENERATIONS = "generations.csv"
BASE = "w_ref"
FEDAVG = "w_fedavg"
LOCAL_ONLY = "local_only"
GLOBAL_UNIFORM = "global_uniform"

#: The comparators of the personalisation matrix, in report order (``all``: every other one at once).
COMPARATORS = ("fedavg", "local_only", "base", "global_uniform", "other_personalised", "all")
#: The pre-registered statistics (``lines`` order): id -> label.
STATISTICS = {
    "heldout_margin_slope": "held-out margin slope b (primary)",
    "matrix_own_row_share": "share of own rows won against the other personalised models (personalisation matrix)",
    "generation_reward_slope": "generation reward slope (sd units)",
}
_MARGIN_COLUMNS = ("model", "cluster", "client", "objective", "pair", "prompt_id", "margin")
_GEN_COLUMNS = ("model", "clients", "prompt_id", "sample")
_PERM_CHUNK = 1024


# --------------------------------------------------------------------------------------------------- the rule


def verdict(p: float | None, interval: Sequence[float | None] | None, mde: float | None) -> str:
    """``supported`` if ``p < 0.05``; ``not supported`` if ``p ≥ 0.05`` and the interval's upper end is below the
    MDE; otherwise ``underpowered`` (also when the upper end or the MDE is missing or not finite).

    ``interval`` and ``mde`` are on the effect scale (the null value 0: for a share, the interval minus chance).
    """
    if p is None or not math.isfinite(p) or not 0.0 <= p <= 1.0:
        raise ValueError(f"verdict: p-value must be a number in [0, 1], got {p!r}")
    if p < ALPHA:
        return "supported"
    hi = None if interval is None else interval[1]
    if hi is not None and mde is not None and math.isfinite(hi) and math.isfinite(mde) and hi < mde:
        return "not supported"
    return "underpowered"


# ----------------------------------------------------------------------------------------------- the inputs


@dataclass
class _Seed:
    """One run directory, reduced to the arrays the statistics need."""

    run_dir: Path
    objectives: list[str]
    clients: list[int]
    lam: np.ndarray  # (n, m) the new clients' λ
    client_clusters: list[int]
    models: list[tuple[str, int, int]]  # (label, cluster, client), model k of the z table
    prompts: list[str]  # held-out prompt ids, p of the sums below
    sums: np.ndarray  # (n_prompts, K, m) sums of margin(model) − margin(w_ref) over a prompt's pairs
    counts: np.ndarray  # (n_prompts, m) pairs of objective j from prompt p
    pers: np.ndarray  # (n,) k of client i's personalised model
    comparators: dict[str, np.ndarray | None]  # comparator -> (n,) k per client; None: not recorded
    gen: dict[str, Any] | None = None  # the generation arrays, None: not recorded
    notes: list[str] = field(default_factory=list)

    @property
    def z(self) -> np.ndarray:
        return self.sums.sum(axis=0) / self.counts.sum(axis=0)


def _fail(where: Path | str, msg: str) -> ValueError:
    return ValueError(f"{where}: {msg}")


def _read_summary(run_dir: Path) -> dict:
    path = run_dir / SUMMARY
    if not path.is_file():
        raise _fail(path, "missing (a run directory of the study preset has summary.json)")
    try:
        summary = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise _fail(path, f"not valid JSON ({exc})") from exc
    pers = summary.get("personalisation") if isinstance(summary, dict) else None
    if not isinstance(pers, dict):
        raise _fail(path, "has no 'personalisation' object (a run of the study preset writes it)")
    for key in ("objectives", "new_clients"):
        if key not in pers:
            raise _fail(path, f"personalisation has no {key!r}")
    return pers


def _new_clients(path: Path, pers: dict) -> tuple[list[str], list[int], np.ndarray, list[int]]:
    objectives = pers["objectives"]
    if not isinstance(objectives, list) or not objectives or len(set(objectives)) != len(objectives) or \
            not all(isinstance(o, str) for o in objectives):
        raise _fail(path, f"personalisation.objectives must be a non-empty list of distinct names, got {objectives!r}")
    m = len(objectives)
    rows = pers["new_clients"]
    if not isinstance(rows, list) or len(rows) < 2:
        raise _fail(path, f"personalisation.new_clients must list at least 2 new clients, got {rows!r}")
    clients, lam, clusters = [], [], []
    for row in rows:
        try:
            client, cluster = int(row["client"]), int(row["cluster"])
            prefs = np.asarray(row["prefs"], dtype=np.float64)
        except (KeyError, TypeError, ValueError) as exc:
            raise _fail(path, f"new_clients entry {row!r} needs an int 'client', 'cluster' and {m} float 'prefs'") \
                from exc
        if prefs.shape != (m,) or not np.all(np.isfinite(prefs)) or np.any(prefs < 0) or \
                abs(prefs.sum() - 1.0) > 1e-6:
            raise _fail(path, f"new client {client}: prefs {row['prefs']!r} must be {m} non-negative numbers "
                              f"summing to 1 (objectives {objectives})")
        clients.append(client)
        lam.append(prefs)
        clusters.append(cluster)
    if len(set(clients)) != len(clients):
        raise _fail(path, f"personalisation.new_clients repeats a client: {clients}")
    lam_arr = np.array(lam)
    if np.sum((lam_arr - lam_arr.mean(axis=0)) ** 2) <= 1e-24:
        raise _fail(path, "every new client has the same prefs: the slope on λ is not defined")
    return list(objectives), clients, lam_arr, clusters


def _read_csv(path: Path, columns: Sequence[str], **kwargs) -> pd.DataFrame:
    if not path.is_file():
        raise _fail(path, "missing")
    try:
        frame = pd.read_csv(path, **kwargs)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise _fail(path, f"cannot be read as CSV ({exc})") from exc
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise _fail(path, f"missing column(s) {missing}")
    if frame.empty:
        raise _fail(path, "has no rows")
    return frame


def _numeric(path: Path, frame: pd.DataFrame, column: str, integer: bool = False) -> pd.Series:
    values = pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=np.float64)
    bad = ~np.isfinite(values)
    if integer:
        bad |= np.isfinite(values) & (values != np.round(values))
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        value = frame[column].iloc[first]
        value = value.item() if isinstance(value, np.generic) else value
        raise _fail(path, f"column {column!r} has a non-{'integer' if integer else 'finite'} value {value!r} "
                          f"(line {first + 2})")
    return pd.Series(values.astype(np.int64) if integer else values, index=frame.index)


def _index_of(path: Path, models: list[tuple[str, int, int]], label: str, *, cluster: int | None = None,
              client: int | None = None) -> int | None:
    found = [k for k, (lab, clu, cli) in enumerate(models)
             if lab == label and (cluster is None or clu == cluster) and (client is None or cli == client)]
    if len(found) > 1:
        raise _fail(path, f"model {label!r} (cluster {cluster}, client {client}) appears as {len(found)} models: "
                          f"{[models[k] for k in found]}")
    return found[0] if found else None


def _at(key: list[str], values) -> str:
    """``(objective 'o0', pair 3)``: a row's key for a message."""
    return "(" + ", ".join(f"{k} {v.item() if isinstance(v, np.generic) else v!r}"
                           for k, v in zip(key, values, strict=True)) + ")"


def _paired(path: Path, frame: pd.DataFrame, base: pd.DataFrame, key: list[str], names: list[str], what: str) \
        -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every row of ``frame`` (its unit in column ``_k``, named ``names[_k]``) with ``_r``, the position of its
    base-model row of the same ``key``; every unit must have exactly the base model's keys."""
    ref = base.reset_index(drop=True)
    if ref.duplicated(key).any():
        raise _fail(path, f"model {BASE!r} repeats {_at(key, ref.loc[ref.duplicated(key), key].iloc[0])}")
    dup = frame.duplicated(["_k", *key])
    if dup.any():
        row = frame[dup].iloc[0]
        raise _fail(path, f"{names[row['_k']]} repeats {_at(key, row[key])}")
    rows = frame.merge(ref[key].assign(_r=np.arange(len(ref))), on=key, how="left")
    stray = rows["_r"].isna().to_numpy()
    if stray.any():
        row = rows[stray].iloc[0]
        raise _fail(path, f"{names[row['_k']]} has {_at(key, row[key])}, which {BASE!r} has not: every "
                          f"model is evaluated on the same {what}")
    n = np.bincount(rows["_k"].to_numpy(), minlength=len(names))
    short = np.flatnonzero(n != len(ref))
    if len(short):
        have = set(rows.loc[rows["_k"] == short[0], "_r"])
        lacking = ref.loc[[r for r in range(len(ref)) if r not in have][0], key]
        raise _fail(path, f"{names[short[0]]} lacks {_at(key, lacking)} of {BASE!r}: every model is "
                          f"evaluated on the same {what}")
    return rows.assign(_r=rows["_r"].astype(np.int64)), ref


def _margins(path: Path, objectives: list[str], prompts_listed: list[str] | None):
    """The paired margin changes of every model, summed per prompt: models, prompts, sums, counts."""
    frame = _read_csv(path, _MARGIN_COLUMNS, dtype={"prompt_id": str, "model": str, "objective": str})
    for col in ("cluster", "client", "pair"):
        frame[col] = _numeric(path, frame, col, integer=True)
    frame["margin"] = _numeric(path, frame, "margin")
    unknown = sorted(set(frame["objective"]) - set(objectives))
    if unknown:
        raise _fail(path, f"column 'objective' has {unknown[0]!r}, not one of the run's objectives {objectives}")
    base = frame[frame["model"] == BASE]
    if base.empty:
        raise _fail(path, f"column 'model' has no {BASE!r} rows (the base model every change is paired with)")
    if base[["cluster", "client"]].drop_duplicates().shape[0] != 1:
        raise _fail(path, f"model {BASE!r} appears with several (cluster, client)")
    missing = [o for o in objectives if o not in set(base["objective"])]
    if missing:
        raise _fail(path, f"model {BASE!r} has no pair of objective {missing[0]!r}")
    models = [tuple(r) for r in frame[["model", "cluster", "client"]].drop_duplicates().itertuples(index=False)]
    models.sort(key=lambda t: (t[0] != BASE, t[0], t[1], t[2]))
    k_of = {key: k for k, key in enumerate(models)}
    frame["_k"] = [k_of[key] for key in zip(frame["model"], frame["cluster"], frame["client"], strict=True)]
    names = [f"model {lab!r} (cluster {clu}, client {cli})" for lab, clu, cli in models]
    rows, ref = _paired(path, frame, base, ["objective", "pair"], names, "held-out pairs")
    bad = rows["prompt_id"].to_numpy() != ref["prompt_id"].to_numpy()[rows["_r"]]
    if bad.any():
        row = rows[bad].iloc[0]
        at = _at(["objective", "pair"], row[["objective", "pair"]])
        raise _fail(path, f"{names[row['_k']]}: {at} has prompt_id "
                          f"{row['prompt_id']!r}, {BASE!r} has {ref['prompt_id'].iloc[row['_r']]!r}")
    prompts = sorted(set(ref["prompt_id"]))
    if prompts_listed is not None:
        extra = sorted(set(prompts) - set(prompts_listed))
        if extra:
            raise _fail(path, f"prompt_id {extra[0]!r} is not in summary.json personalisation.heldout.prompts")
    p_of = {p: i for i, p in enumerate(prompts)}
    j_of = {o: j for j, o in enumerate(objectives)}
    ref_p = ref["prompt_id"].map(p_of).to_numpy()
    ref_j = ref["objective"].map(j_of).to_numpy()
    counts = np.zeros((len(prompts), len(objectives)))
    np.add.at(counts, (ref_p, ref_j), 1)
    sums = np.zeros((len(prompts), len(models), len(objectives)))
    r = rows["_r"].to_numpy()
    np.add.at(sums, (ref_p[r], rows["_k"].to_numpy(), ref_j[r]),
              rows["margin"].to_numpy() - ref["margin"].to_numpy()[r])
    return models, prompts, sums, counts


def _generations(path: Path, objectives: list[str], personalised: str, clients: list[int]) -> dict[str, Any]:
    """The standardised paired reward changes of the personalised models, summed per generation prompt."""
    rewards = [f"reward_{o}" for o in objectives]
    frame = _read_csv(path, (*_GEN_COLUMNS, *rewards), dtype={"prompt_id": str, "model": str, "clients": str},
                      usecols=lambda c: c != "text")
    frame["sample"] = _numeric(path, frame, "sample", integer=True)
    for col in rewards:
        frame[col] = _numeric(path, frame, col)
    base = frame[frame["model"] == BASE].reset_index(drop=True)
    if base.empty:
        raise _fail(path, f"column 'model' has no {BASE!r} rows")
    sd = base[rewards].std(ddof=1).to_numpy()
    if len(base) < 2 or not np.all(np.isfinite(sd)) or np.any(sd <= 0):
        raise _fail(path, f"the sd of {rewards} over the {len(base)} samples of {BASE!r} must be positive, got {sd}")
    rows = frame[frame["model"] == personalised]
    owner = []
    for text in rows["clients"].fillna(""):
        ids = text.split()
        if len(ids) != 1 or not ids[0].lstrip("-").isdigit():
            raise _fail(path, f"a {personalised!r} row has clients {text!r}: a personalised model has one client id")
        owner.append(int(ids[0]))
    i_of = {c: i for i, c in enumerate(clients)}
    names = [f"model {personalised!r} of client {c}" for c in clients]
    lost = sorted(set(clients) - set(owner))
    if lost:
        raise _fail(path, f"no rows of {names[i_of[lost[0]]]}")
    rows = rows.assign(_k=[i_of.get(c, -1) for c in owner])
    rows, ref = _paired(path, rows[rows["_k"] >= 0], base, ["prompt_id", "sample"], names, "prompts and samples")
    prompts = sorted(set(ref["prompt_id"]))
    p_of = {p: i for i, p in enumerate(prompts)}
    ref_p = ref["prompt_id"].map(p_of).to_numpy()
    counts = np.bincount(ref_p, minlength=len(prompts)).astype(np.float64)
    sums = np.zeros((len(prompts), len(clients), len(objectives)))
    r = rows["_r"].to_numpy()
    np.add.at(sums, (ref_p[r], rows["_k"].to_numpy()), (rows[rewards].to_numpy() - ref[rewards].to_numpy()[r]) / sd)
    return {"prompts": prompts, "sums": sums, "counts": counts, "sd": sd, "n_samples": int(len(base))}


def _load(run_dir: Path | str) -> _Seed:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ValueError(f"{run_dir}: not a run directory")
    pers = _read_summary(run_dir)
    spath = run_dir / SUMMARY
    objectives, clients, lam, clusters = _new_clients(spath, pers)
    personalised = pers.get("personalised_model", "pipeline1_wII")
    heldout = pers.get("heldout") or {}
    listed = heldout.get("prompts") if isinstance(heldout, dict) else None
    prompts_listed = None if listed is None else [str(p) for p in listed]
    mpath = run_dir / str(pers.get("file", MARGINS))
    models, prompts, sums, counts = _margins(mpath, objectives, prompts_listed)
    present = set(models)
    for entry in pers.get("models") or []:
        try:
            key = (str(entry["label"]), int(entry["cluster"]), int(entry["client"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise _fail(spath, f"personalisation.models entry {entry!r} needs 'label', 'cluster', 'client'") from exc
        if key not in present:
            raise _fail(mpath, f"no rows of model {key} listed in summary.json personalisation.models")

    def per_client(label: str, by_cluster: bool, required: bool) -> np.ndarray | None:
        idx = [_index_of(mpath, models, label, cluster=c if by_cluster else None,
                         client=None if by_cluster else cl) for cl, c in zip(clients, clusters, strict=True)]
        if all(k is None for k in idx) and not required:
            return None
        for k, cl, c in zip(idx, clients, clusters, strict=True):
            if k is None:
                raise _fail(mpath, f"no rows of model {label!r} for new client {cl} (cluster {c})")
        return np.array(idx)

    own = per_client(personalised, False, True)
    assert own is not None
    base = _index_of(mpath, models, BASE)
    glob = _index_of(mpath, models, GLOBAL_UNIFORM)
    comparators: dict[str, np.ndarray | None] = {
        "fedavg": per_client(FEDAVG, True, False),
        "local_only": per_client(LOCAL_ONLY, False, False),
        "base": np.full(len(clients), base),
        "global_uniform": None if glob is None else np.full(len(clients), glob),
    }
    seed = _Seed(run_dir, objectives, clients, lam, clusters, models, prompts, sums, counts, own, comparators)
    seed.notes += [f"comparator {c!r} not recorded" for c, v in comparators.items() if v is None]
    gen_models = pers.get("generation_models") or []
    if personalised in gen_models and BASE in gen_models:
        seed.gen = _generations(run_dir / GENERATIONS, objectives, personalised, clients)
    else:
        seed.notes.append(f"generation rewards not recorded (generation_models {gen_models!r})")
    return seed


# ------------------------------------------------------------------------------------------- the statistics


def fixed_effect_slope(lam: np.ndarray, z: np.ndarray) -> np.ndarray:
    """The objective-fixed-effect slope of ``z`` (``(..., n, m)``) on ``lam`` (``(..., n, m)``), over the last two
    axes (broadcast)."""
    lc = lam - lam.mean(axis=-2, keepdims=True)
    zc = z - z.mean(axis=-2, keepdims=True)
    return np.sum(lc * zc, axis=(-2, -1)) / np.sum(lc * lc, axis=(-2, -1))


def _shares(lam: np.ndarray, z: np.ndarray, own: np.ndarray, comparators: dict[str, np.ndarray | None]) \
        -> dict[str, np.ndarray | None]:
    """Shares of the rows won by the own model, per comparator; ``lam`` ``(..., n, m)``, ``z`` ``(..., K, m)``."""
    scores = np.einsum("...im,...km->...ik", lam, z)
    rows = np.arange(len(own))
    mine = scores[..., rows, own]
    won: dict[str, np.ndarray | None] = {}
    for name, idx in comparators.items():
        won[name] = None if idx is None else mine > scores[..., rows, idx]
    others = scores[..., own].copy()
    others[..., rows, rows] = -np.inf
    won["other_personalised"] = mine > others.max(axis=-1)
    every = [w for w in won.values() if w is not None]
    won["all"] = np.logical_and.reduce(every)
    return {name: None if w is None else w.mean(axis=-1) for name, w in won.items()}


def _percentile(values: np.ndarray) -> list[float | None]:
    values = values[np.isfinite(values)]
    if not len(values):
        return [None, None]
    lo, hi = np.percentile(values, [2.5, 97.5])
    return [float(lo), float(hi)]


def _resample(rng: np.random.Generator, n_prompts: int, n_boot: int) -> np.ndarray:
    """``(n_boot, n_prompts)`` multiplicities of the prompts in resamples with replacement."""
    draws = rng.integers(0, n_prompts, size=(n_boot, n_prompts))
    counts = np.zeros((n_boot, n_prompts))
    np.add.at(counts, (np.repeat(np.arange(n_boot), n_prompts), draws.ravel()), 1)
    return counts


def _boot_means(mult: np.ndarray, sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Resampled means ``(B, K, m)`` from per-prompt sums ``(P, K, m)`` and counts ``(P, m)`` or ``(P,)``;
    NaN where a resample has no observation of an objective."""
    num = np.einsum("bp,pkm->bkm", mult, sums)
    den = mult @ counts
    den = den[:, None, :] if den.ndim == 2 else den[:, None, None]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def _seed_numbers(s: _Seed, *, seed: int, n_boot: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    z = s.z
    own = s.pers
    b = float(fixed_effect_slope(s.lam, z[own]))
    zb = _boot_means(_resample(rng, len(s.prompts), n_boot), s.sums, s.counts)
    valid = np.all(np.isfinite(zb), axis=(1, 2))
    b_boot = fixed_effect_slope(s.lam, zb[valid][:, own])
    shares = _shares(s.lam, z, own, s.comparators)
    shares_boot = _shares(s.lam, zb[valid], own, s.comparators)
    out: dict[str, Any] = {
        "run_dir": str(s.run_dir),
        "objectives": s.objectives,
        "n_personalised": len(s.clients),
        "new_clients": [{"client": c, "cluster": k, "prefs": list(map(float, lam))}
                        for c, k, lam in zip(s.clients, s.client_clusters, s.lam, strict=True)],
        "heldout": {"n_prompts": len(s.prompts),
                    "pairs_per_objective": dict(zip(s.objectives, map(int, s.counts.sum(axis=0)), strict=True))},
        "z": [{"model": lab, "cluster": clu, "client": cli, **dict(zip(s.objectives, map(float, z[k]), strict=True))}
              for k, (lab, clu, cli) in enumerate(s.models)],
        "b": b,
        "b_bootstrap_interval": _percentile(b_boot),
        "n_boot": n_boot,
        "n_boot_dropped": int(n_boot - valid.sum()),
        "matrix": {name: None if v is None else {
            "share": float(v), "bootstrap_interval": _percentile(np.asarray(shares_boot[name]))}
            for name, v in shares.items()},
        "chance_other_personalised": 1.0 / len(s.clients),
        "generation": None,
        "notes": list(s.notes),
    }
    if s.gen is not None:
        g = s.gen["sums"].sum(axis=0) / s.gen["counts"].sum()
        gb = _boot_means(_resample(rng, len(s.gen["prompts"]), n_boot), s.gen["sums"], s.gen["counts"])
        out["generation"] = {
            "g": [{"client": c, **dict(zip(s.objectives, map(float, g[i]), strict=True))}
                  for i, c in enumerate(s.clients)],
            "sd": dict(zip(s.objectives, map(float, s.gen["sd"]), strict=True)),
            "n_prompts": len(s.gen["prompts"]),
            "n_samples": s.gen["n_samples"],
            "b": float(fixed_effect_slope(s.lam, g)),
            "b_bootstrap_interval": _percentile(fixed_effect_slope(s.lam, gb)),
        }
    return out


def seed_statistics(run_dir: Path | str, *, seed: int = 0, n_boot: int = N_BOOT) -> dict[str, Any]:
    """The per-seed numbers of one run directory (JSON-able): the z table of every model, the primary slope ``b``
    with its percentile bootstrap interval over the held-out prompts (``n_boot`` resamples from
    ``default_rng(seed)``), the matrix shares per comparator with their bootstrap intervals, and the generation
    table g with its slope (``None`` where the run recorded no generations)."""
    if n_boot < 1:
        raise ValueError(f"n_boot must be at least 1, got {n_boot}")
    return _seed_numbers(_load(run_dir), seed=seed, n_boot=n_boot)


def _t_interval(values: Sequence[float]) -> list[float] | None:
    x = np.asarray(values, dtype=np.float64)
    if len(x) < 2:
        return None
    half = float(stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
    return [float(x.mean() - half), float(x.mean() + half)]


def _perm_draws(rng: np.random.Generator, seeds: list[_Seed], n_perm: int) -> dict[str, np.ndarray]:
    """Each statistic's mean over the seeds under ``n_perm`` permutations of the λ rows within each seed."""
    out = {"slope": np.zeros(n_perm), "share": np.zeros(n_perm), "gen": np.zeros(n_perm)}
    n_gen = sum(s.gen is not None for s in seeds)
    for s in seeds:
        perms = rng.permuted(np.tile(np.arange(len(s.clients)), (n_perm, 1)), axis=1)
        zp = s.z[s.pers]
        g = None if s.gen is None else s.gen["sums"].sum(axis=0) / s.gen["counts"].sum()
        rows = np.arange(len(s.clients))
        for lo in range(0, n_perm, _PERM_CHUNK):
            lam = s.lam[perms[lo:lo + _PERM_CHUNK]]
            out["slope"][lo:lo + len(lam)] += fixed_effect_slope(lam, zp) / len(seeds)
            share = _shares(lam, zp, rows, {})["other_personalised"]
            assert share is not None
            out["share"][lo:lo + len(lam)] += share / len(seeds)
            if g is not None:
                out["gen"][lo:lo + len(lam)] += fixed_effect_slope(lam, g) / n_gen
    return out


def null_test(estimate: float, draws: np.ndarray, *, exact: bool = False) -> tuple[float, float | None]:
    """The one-sided p-value of ``estimate`` against the statistic's ``draws`` under the null, and the MDE.

    ``exact``: ``draws`` is the whole null distribution (every arrangement once, the observed one included):
    ``p = #{draw ≥ estimate} / len(draws)`` and the MDE from the population sd; otherwise ``draws`` are random
    arrangements: ``p = (1 + #{draw ≥ estimate}) / (1 + len(draws))`` and the sample sd (ddof 1). A draw equal to
    the estimate up to 1e-12 relative counts as ≥. MDE ``(z_{0.95} + z_{0.80}) · sd`` (None from a single draw).
    """
    draws = np.asarray(draws, dtype=np.float64)
    scale = max(abs(estimate), float(np.max(np.abs(draws))), 1e-300)
    hits = int(np.sum(draws >= estimate - 1e-12 * scale))
    p = hits / len(draws) if exact else (1 + hits) / (1 + len(draws))
    mde = MDE_FACTOR * float(np.std(draws, ddof=0 if exact else 1)) if len(draws) > 1 else None
    return p, mde


def _line(stat: str, per_seed: list[float], boot: list[float | None] | None, draws: np.ndarray, n_units: int,
          null: float = 0.0) -> dict[str, Any]:
    estimate = float(np.mean(per_seed))
    interval = _t_interval(per_seed) if len(per_seed) > 1 else boot
    p, mde = null_test(estimate, draws)
    shifted = None if interval is None or interval[1] is None else [interval[0], interval[1] - null]
    return {"statistic": stat, "label": STATISTICS[stat], "estimate": estimate,
            "interval": list(interval) if interval is not None else [None, None], "p_value": p, "mde": mde,
            "null": null, "verdict": verdict(p, shifted, mde), "n_seeds": len(per_seed), "n_units": n_units,
            "per_seed": [float(v) for v in per_seed]}


def _not_recorded(stat: str) -> dict[str, Any]:
    return {"statistic": stat, "label": STATISTICS[stat], "estimate": None, "interval": [None, None],
            "p_value": None, "mde": None, "null": 0.0, "verdict": "not recorded", "n_seeds": 0, "n_units": 0,
            "per_seed": []}


def short_number(x: float | None) -> str:
    return "—" if x is None else f"{x:.3g}"


def line_text(line: dict[str, Any]) -> str:
    """One dashboard line: ``label: estimate [lo, hi], p, MDE — verdict``."""
    if line["estimate"] is None:
        return f"{line['label']}: not recorded"
    lo, hi = line["interval"]
    null = f" (chance {line['null']:.3g})" if line["null"] else ""
    mde = f"MDE {short_number(line['mde'])}" + (" above chance" if line["null"] else "")
    return (f"{line['label']}: {short_number(line['estimate'])}{null}, 95 % interval [{short_number(lo)}, {short_number(hi)}], "
            f"p = {line['p_value']:.4g}, {mde} — {line['verdict']} "
            f"({line['n_seeds']} seed{'s' * (line['n_seeds'] != 1)}, {line['n_units']} models)")


def _statement(lines: list[dict[str, Any]], seeds: list[dict[str, Any]]) -> str:
    n_pairs = [min(s["heldout"]["pairs_per_objective"].values()) for s in seeds]
    parts = [f"Pre-registered test over {len(seeds)} seed{'s' * (len(seeds) != 1)} "
             f"({sum(s['n_personalised'] for s in seeds)} personalised models; per seed at least {min(n_pairs)} "
             f"held-out pairs per objective from at least {min(s['heldout']['n_prompts'] for s in seeds)} prompts)."]
    for line in lines:
        name = line["label"]
        if line["estimate"] is None:
            parts.append(f"The {name} was not recorded.")
            continue
        lo, hi = line["interval"]
        mde = short_number(line["mde"])
        effect = f"an excess over chance of {mde}" if line["null"] else f"an effect of {mde}"
        chance = f" against chance {short_number(line['null'])}" if line["null"] else ""
        head = (f"The {name} is {short_number(line['estimate'])}{chance} (95 % interval [{short_number(lo)}, {short_number(hi)}], "
                f"permutation p = {line['p_value']:.3g}); the design detects {effect} or more with 80 % power at "
                f"one-sided α = 0.05 and can miss a smaller one")
        if line["verdict"] == "supported":
            parts.append(head + ": supported, the data show the effect.")
        elif line["verdict"] == "not supported":
            parts.append(head + f": not supported, the interval excludes {effect} or more (a smaller effect is "
                                "not excluded).")
        else:
            parts.append(head + f": underpowered, the data neither show an effect nor exclude {effect} (the "
                                f"interval reaches {short_number(hi - line['null'] if hi is not None else None)}"
                                f"{' above chance' if line['null'] else ''}).")
    return " ".join(parts)


def sweep_statistics(run_dirs: Sequence[Path | str], *, n_perm: int = N_PERM, seed: int = 0,
                     n_boot: int = N_BOOT) -> dict[str, Any]:
    """The pre-registered statistics over the seeds' run directories.

    ``lines``: one dict per pre-registered statistic (:data:`STATISTICS`, primary first) with ``statistic``,
    ``label``, ``estimate``, ``interval`` (95 %), ``p_value`` (one-sided permutation), ``mde`` (80 % power),
    ``null`` (0, or chance for the share), ``verdict``, ``n_seeds``, ``n_units`` (personalised models) and
    ``per_seed``; ``matrix``: per comparator the mean share over seeds with its t-interval (descriptive);
    ``seeds``: :func:`seed_statistics` of each directory; ``text``: the statement of what the design could and
    could not detect. The permutations come from ``default_rng(seed)``, the bootstrap of every seed from
    ``default_rng(seed)`` too.
    """
    if not run_dirs:
        raise ValueError("sweep_statistics: no run directories")
    if n_perm < 1 or n_boot < 1:
        raise ValueError(f"n_perm and n_boot must be at least 1, got {n_perm}, {n_boot}")
    dirs = [Path(d) for d in run_dirs]
    if len({d.resolve() for d in dirs}) != len(dirs):
        raise ValueError(f"sweep_statistics: a run directory is listed twice: {[str(d) for d in dirs]}")
    data = [_load(d) for d in dirs]
    per_seed = [_seed_numbers(s, seed=seed, n_boot=n_boot) for s in data]
    draws = _perm_draws(np.random.default_rng(seed), data, n_perm)
    n_units = sum(len(s.clients) for s in data)
    first = per_seed[0]  # with one seed, the intervals are its bootstrap intervals
    lines = [
        _line("heldout_margin_slope", [s["b"] for s in per_seed], first["b_bootstrap_interval"], draws["slope"],
              n_units),
        _line("matrix_own_row_share", [s["matrix"]["other_personalised"]["share"] for s in per_seed],
              first["matrix"]["other_personalised"]["bootstrap_interval"], draws["share"], n_units,
              null=float(np.mean([s["chance_other_personalised"] for s in per_seed]))),
    ]
    gen = [s["generation"] for s in per_seed if s["generation"] is not None]
    if gen:
        lines.append(_line("generation_reward_slope", [g["b"] for g in gen], gen[0]["b_bootstrap_interval"],
                           draws["gen"], sum(s["n_personalised"] for s in per_seed if s["generation"] is not None)))
    else:
        lines.append(_not_recorded("generation_reward_slope"))
    matrix = {}
    for name in COMPARATORS:
        recorded = [s["matrix"][name] for s in per_seed if s["matrix"][name] is not None]
        values = [r["share"] for r in recorded]
        matrix[name] = None if not values else {
            "estimate": float(np.mean(values)), "n_seeds": len(values), "per_seed": values,
            "interval": _t_interval(values) if len(values) > 1 else recorded[0]["bootstrap_interval"]}
    return {"lines": lines, "matrix": matrix, "seeds": per_seed, "n_perm": n_perm, "n_boot": n_boot, "seed": seed,
            "alpha": ALPHA, "power": POWER, "text": _statement(lines, per_seed)}
