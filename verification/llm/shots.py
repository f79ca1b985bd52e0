r"""The shots curve: does Algorithm 1 beat local-only and FedAvg, and by how much against the oracle, as the new
client's own data grows? The pre-registered analysis.

Written before any run of the curve; this docstring is the contract (the docs quote it) and the code below
implements it as written. Pure numpy/scipy/pandas: it reads the records the curve's runs write and never runs a
model. The helpers it shares with the study's analysis (the verdict rule, the objective-fixed-effect slope, the
p-value and MDE from a null distribution, the number format) are those of
:mod:`verification.llm.personalisation`; the t-interval over seeds is :func:`verification.llm.sweep.t_interval`.

Pre-registration
================

**Design.** Seeds are independent replications (within a seed the new clients share the training clients and the
cluster models). In each seed, every new client i belongs to a cluster (the one Algorithm 1 assigns it), has a
preference λ_i over the m objectives (m non-negative numbers summing to 1) and its own held-out pairs per objective
(labelled by that objective's reward; no comparison is shared between two objectives' pairs of a client). At every
budget b (pairs per objective of the new client; the pre-registered budgets 1, 2, 4, 8, 16 and, where the gate
needs it, 64) every method of :data:`METHODS` is scored on every new client:

* ``pipeline1_wII`` — Algorithm 1 (Pipeline 1 from the cluster's meta-learned ``w_II``): **the primary method**;
* ``pipeline1_wI`` — Pipeline 1 from the cluster's ``w_I``; ``pipeline2`` — Pipeline 2;
* ``local`` — trained on the client's own b pairs per objective only; ``fedavg`` — its cluster's FedAvg model
  (adapted to the client or not, as the adaptation records say); ``global`` — the one global model trained at the
  uniform preference; ``base`` — the base model; ``oracle`` — a model trained directly at λ_i with ample data.

**Records** (one run directory per seed; CSV, one header line; the curve's run writes them, this module reads
them with :func:`read_records`; every number float64, every id an integer):

* ``shots_clients.csv`` — one row per (new client, objective): ``seed, client, cluster, objective, lam``
  (``lam`` = λ_ij; the cluster the same on every row of a client).
* ``shots_scores.csv`` — one row per (client, budget, method, objective), **every** method at **every** budget (a
  model that does not depend on the budget — ``base``, ``oracle``, ``global``, an unadapted ``fedavg`` — is
  written at each budget with the same numbers): ``seed, client, budget, method, objective, n_pairs, acc, z``.
  ``acc`` = acc_ij, the share of client i's ``n_pairs`` held-out pairs of objective j on which the model's
  implicit-reward margin ``β[(log π(y_w) − log π_ref(y_w)) − (log π(y_l) − log π_ref(y_l))]`` is positive, a
  margin of exactly 0 counting 1/2 (so ``2·acc·n_pairs`` is an integer; the base model's margins are 0 and its
  acc is 1/2); ``z`` = z_ij, the mean margin change against the base model on the same pairs (0 for ``base``).
  The λ-weighted numbers are formed here, not written by the run: ``acc_i = Σ_j λ_ij acc_ij`` and
  ``z_i = Σ_j λ_ij z_ij``.
* ``shots_adaptation.csv`` — one row per (client, budget, method that adapts): ``seed, client, budget, method,
  psi0, psiK, alpha, p_minus, p_plus, L0_hat``. ``psi0`` and ``psiK``: the client's Chebyshev objective
  ``ψ_i(w) = max_j λ_ij l_ij(w)`` on its own b pairs per objective at the adaptation's first iterate w_0 and its
  last w_K; ``alpha``: the step size; ``p_minus``, ``p_plus``: the clip range of the preconditioner
  (``p₋I ⪯ P_k ⪯ p₊I``); ``L0_hat``: the largest secant along the run,
  ``L̂0 = max_{k<K} ‖g_{k+1} − g_k‖ / ‖w_{k+1} − w_k‖``, with g_k the full-batch gradient of ψ_i (the active
  objective's, λ-weighted) on the client's b pairs per objective at w_k (over the trained parameters; steps with
  ``w_{k+1} = w_k`` skipped; 0 when every step is). ``pipeline1_wII`` and ``pipeline1_wI`` are recorded at every
  (client, budget); any other method that adapts (``pipeline2``, ``local``, ``fedavg``) at every (client, budget)
  or at none.
* ``shots_cross.csv`` (optional; written by every seed or by none) — the cross-score table of ``pipeline1_wII``:
  ``seed, budget, method, model_client, pairs_client, objective, acc``: the model of client ``model_client``
  scored on client ``pairs_client``'s objective pairs, as ``acc`` above, for every ordered pair of distinct clients
  of one cluster (``method`` is ``pipeline1_wII``; the diagonal is ``shots_scores.csv``'s).

**Unit: a seed.** Every statistic is computed per seed (a mean over its new clients, or its clusters) and
averaged over the seeds; intervals are 95 % t-intervals over the seeds; each seed's null is drawn independently.

**Primary statistics, per budget b** (one-sided, H1: > 0):

1. *gain over local-only*: ``d_s = mean_i [acc_i(pipeline1_wII) − acc_i(local)]``, the statistic ``mean_s d_s``;
2. *gain over the cluster's FedAvg*: the same with ``fedavg`` in place of ``local``.

Null: sign flips of the seeds' d_s (the two methods exchangeable within a seed). All ``2^S`` flips when
``2^S ≤ n_perm + 1`` (exact: ``p = #{flip ≥ observed} / 2^S``, the identity included), otherwise ``n_perm`` random
flips (``p = (1 + #{flip ≥ observed}) / (1 + n_perm)``). MDE at 80 % power, one-sided α = 0.05:
``(z_{0.95} + z_{0.80}) · sd`` of the sign-flip null of the centred ``d_s − mean_s d_s``, i.e.
``(z_{0.95} + z_{0.80}) · sqrt(Σ_s (d_s − d̄)²) / S`` (centred, so that an effect does not inflate its own MDE).
With S seeds the smallest attainable p is ``2^−S`` (1/256 at 8 seeds): the report notes a test whose smallest p
cannot clear Holm's first step ``α/k`` over the family of k tests (``p_min`` on every line).

3. *share of the oracle's ceiling* (reported, not tested), for every method M other than ``base`` and ``oracle``:
   ``mean_s [A_s(M) − A_s(base)] / mean_s [A_s(oracle) − A_s(base)]`` with ``A_s`` the seed's mean acc_i; undefined
   (None) when the oracle's mean is not above the base model's; 95 % percentile interval from ``n_boot`` resamples
   of the seeds (a resample whose denominator is ≤ 0 is dropped and counted).

**Personalisation contrasts that respect the clusters, per budget b** (of ``pipeline1_wII``'s margin change
z_ij; one-sided, H1: > 0; each with its own null):

4. *cluster-level slope*: per seed, the clusters' mean λ (Λ_c, the mean of λ_i over the cluster's new clients)
   and mean change (Z_c likewise); the OLS slope of Z_cj on Λ_cj with objective fixed effects
   (:func:`~verification.llm.personalisation.fixed_effect_slope`, each cluster one unit); the statistic is its
   mean over seeds. Null: the clusters' Λ rows permuted among the clusters, independently within each seed.
5. *within-cluster slope* — the K-step adaptation's own contribution: per seed,
   ``Σ_ij (λ_ij − Λ_c(i)j)(z_ij − Z_c(i)j) / Σ_ij (λ_ij − Λ_c(i)j)²`` (deviations from the client's cluster mean,
   per objective: cluster × objective fixed effects, which contain the objective fixed effects; a cluster of one
   client contributes nothing); the statistic is its mean over seeds. Null: λ rows permuted among the clients
   within each cluster, within each seed (every difference between clusters is held fixed).
6. *own model against its cluster-mates* (only where ``shots_cross.csv`` is recorded): A_ik = Σ_j λ_ij acc_j(model
   of client k on client i's pairs); per seed ``mean_i [A_ii − mean_{k≠i in c(i)} A_ik]`` over the clients of
   clusters with at least 2 new clients; the statistic is its mean over seeds. Null: the models' labels permuted
   within each cluster (client i scored against model π(i)), within each seed.

For 4–6, each seed's null set is enumerated exactly (every permutation once) when it holds at most
:data:`ENUMERATE_MAX` arrangements, and the mean over seeds is exact (every combination once) when the product of
the seeds' set sizes is at most ``n_perm + 1``; otherwise ``n_perm`` draws, each seed's arrangement uniform and
independent. p-values as for 1–2; MDE ``(z_{0.95} + z_{0.80}) · sd`` of the statistic under its null
(:func:`~verification.llm.personalisation.null_test`).

**Multiplicity.** The family is every tested statistic (1, 2, 4, 5, and 6 where the cross table is recorded)
at every pre-registered budget. Holm's step-down correction over the whole family (:func:`holm`): ``p_holm``.
The verdict of each line is :func:`~verification.llm.personalisation.verdict` applied to ``p_holm``:
``supported`` if ``p_holm < 0.05``, ``not supported`` if the interval's upper end is below the MDE (the MDE at
the unadjusted α, so the rule is, if anything, slow to say "not supported"), ``underpowered`` otherwise. The raw p
is reported beside it.

**w_I beside w_II.** Every adaptation's table row of ``pipeline1_wII`` has ``pipeline1_wI`` (and ``pipeline2``)
beside it at the same budget, and a descriptive line per budget gives ``mean_s mean_i [acc_i(pipeline1_wII) −
acc_i(pipeline1_wI)]`` with its t-interval (reported, not tested): the meta-learned start's share.

**ψ-raising adaptations.** An adaptation with ``psiK > psi0`` (strictly) is flagged: ``psi_raised`` lists seed,
client, budget, method, ψ0, ψK, α, p₋, p₊, L̂0, ``h43_ratio = α·L̂0·p₊²/p₋`` and ``h43_held`` (Lemma H.43's step
condition ``0 < α ≤ p₋/(L0 p₊²)`` with L̂0 for L0, i.e. ``h43_ratio ≤ 1``); the report counts them (in total, per
method and budget) and checks the condition on every adaptation. A secant lower-bounds the smoothness constant on
a region that holds the iterates and segments, so a violated condition with L̂0 is violated with L0 too, while a
held one is only not refuted. **They stay in every statistic**: a flagged model is scored like any other, the
flags are reported beside the statistics, nothing is dropped.

**Stopping rule.** The seeds and the budgets are fixed in advance (the curve's preset states them and passes
them to :func:`shots_report`); the analysis runs once, on the complete grid (every seed × budget × method ×
client × objective). Records of a seed or budget outside the plan, or a missing cell, are a :class:`ValueError`:
no seed is added or dropped after seeing the data, no interim look decides whether to run more.

Everything is seeded (one ``numpy.random.default_rng(seed)``, used in a fixed order) and deterministic, in
float64. Malformed input — a missing column, a NaN, an unknown method, a budget recorded for fewer than 2 seeds,
an incomplete grid — raises :class:`ValueError` naming the table, the column or the value, before any statistic.

API
===

* :class:`ShotsRecords`, :func:`read_records` ``(run_dirs)``: the four tables;
* :func:`shots_report` ``(records, seeds=, budgets=, n_perm=9999, seed=0)``: ``table`` (per method × budget: mean
  acc and λ-weighted margin change with t-intervals over seeds, the share of the oracle's ceiling), ``lines`` (the
  tested family with ``p_value``, ``p_holm``, ``mde``, ``verdict``), ``descriptive`` (ceiling share and w_II − w_I
  per budget), ``adaptation`` (the ψ-raise flags and the H.43 check), JSON-able;
* :func:`holm`, :func:`h43_ratio`, :func:`line_text` (one line), :func:`shots_figure` (the curve, PNG).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from verification.llm.personalisation import (
    ALPHA,
    MDE_FACTOR,
    POWER,
    fixed_effect_slope,
    null_test,
    short_number,
    verdict,
)
from verification.llm.sweep import t_interval

__all__ = [
    "ADAPTATION",
    "ADAPTING",
    "CLIENTS",
    "COLUMNS",
    "CROSS",
    "ENUMERATE_MAX",
    "METHODS",
    "N_BOOT",
    "N_PERM",
    "PRIMARY",
    "SCORES",
    "STATISTICS",
    "ShotsRecords",
    "h43_ratio",
    "holm",
    "line_text",
    "read_records",
    "shots_figure",
    "shots_report",
]

#: The methods scored at every budget, in report order; the primary method first.
METHODS = ("pipeline1_wII", "pipeline1_wI", "pipeline2", "local", "fedavg", "global", "base", "oracle")
PRIMARY = "pipeline1_wII"
#: Methods that may have adaptation records; the first two must.
ADAPTING = ("pipeline1_wII", "pipeline1_wI", "pipeline2", "local", "fedavg")
#: Permutations / sign flips when the null is drawn, bootstrap resamples of the seeds for the ceiling share.
N_PERM = 9999
N_BOOT = 2000
#: A seed's permutation set is enumerated when it has at most this many arrangements.
ENUMERATE_MAX = 40320

CLIENTS = "shots_clients.csv"
SCORES = "shots_scores.csv"
ADAPTATION = "shots_adaptation.csv"
CROSS = "shots_cross.csv"

#: The tested statistics (Holm's family, per budget) and the reported ones: id -> label.
STATISTICS = {
    "gain_over_local": "gain over local-only, acc(w_II) − acc(local)",
    "gain_over_fedavg": "gain over the cluster's FedAvg, acc(w_II) − acc(FedAvg)",
    "cluster_slope": "cluster-level margin slope (cluster-mean change on cluster-mean λ)",
    "within_cluster_slope": "within-cluster margin slope (the adaptation's own)",
    "own_vs_mates": "own model against its cluster-mates, λ-weighted accuracy",
    "ceiling_share": "share of the oracle's ceiling reached by w_II",
    "wII_minus_wI": "acc(w_II) − acc(w_I)",
}
_TESTED = ("gain_over_local", "gain_over_fedavg", "cluster_slope", "within_cluster_slope", "own_vs_mates")

_COLUMNS = {
    CLIENTS: (("seed", "int"), ("client", "int"), ("cluster", "int"), ("objective", "str"), ("lam", "float")),
    SCORES: (("seed", "int"), ("client", "int"), ("budget", "int"), ("method", "str"), ("objective", "str"),
             ("n_pairs", "int"), ("acc", "float"), ("z", "float")),
    ADAPTATION: (("seed", "int"), ("client", "int"), ("budget", "int"), ("method", "str"), ("psi0", "float"),
                 ("psiK", "float"), ("alpha", "float"), ("p_minus", "float"), ("p_plus", "float"),
                 ("L0_hat", "float")),
    CROSS: (("seed", "int"), ("budget", "int"), ("method", "str"), ("model_client", "int"), ("pairs_client", "int"),
            ("objective", "str"), ("acc", "float")),
}
#: The column names of each record file, in order (the curve's run writes them so).
COLUMNS = {name: tuple(c for c, _ in cols) for name, cols in _COLUMNS.items()}
_KEYS = {CLIENTS: ("seed", "client", "objective"), SCORES: ("seed", "client", "budget", "method", "objective"),
         ADAPTATION: ("seed", "client", "budget", "method"),
         CROSS: ("seed", "budget", "method", "model_client", "pairs_client", "objective")}


# ----------------------------------------------------------------------------------------------- the records


@dataclass(frozen=True)
class ShotsRecords:
    """The curve's records (the tables of the module docstring), all seeds together; ``cross`` None: not
    recorded."""

    clients: pd.DataFrame
    scores: pd.DataFrame
    adaptation: pd.DataFrame
    cross: pd.DataFrame | None = None


def read_records(run_dirs: Sequence[Path | str]) -> ShotsRecords:
    """The four tables of the run directories (one per seed), concatenated. A missing file, a directory holding
    more than one seed or a seed held by two directories raises :class:`ValueError` naming it."""
    if not run_dirs:
        raise ValueError("read_records: no run directories")
    tables: dict[str, list[pd.DataFrame]] = {CLIENTS: [], SCORES: [], ADAPTATION: [], CROSS: []}
    owner: dict[int, Path] = {}
    for d in map(Path, run_dirs):
        for name in (CLIENTS, SCORES, ADAPTATION, CROSS):
            path = d / name
            if not path.is_file():
                if name == CROSS:
                    continue
                raise ValueError(f"{path}: missing")
            try:
                frame = pd.read_csv(path)
            except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
                raise ValueError(f"{path}: cannot be read as CSV ({exc})") from exc
            if "seed" in frame.columns:
                seeds = sorted(set(frame["seed"].tolist()))
                if len(seeds) != 1:
                    raise ValueError(f"{path}: a run directory holds one seed, found seeds {seeds}")
                s = seeds[0]
                if s in owner and owner[s] != d:
                    raise ValueError(f"seed {s!r} is in two run directories: {owner[s]} and {d}")
                owner[s] = d
            tables[name].append(frame)
    n_cross = len(tables[CROSS])
    if n_cross not in (0, len(run_dirs)):
        raise ValueError(f"{CROSS}: written by {n_cross} of {len(run_dirs)} run directories (by every seed or none)")
    cat = {k: pd.concat(v, ignore_index=True) if v else None for k, v in tables.items()}
    assert cat[CLIENTS] is not None and cat[SCORES] is not None and cat[ADAPTATION] is not None
    return ShotsRecords(cat[CLIENTS], cat[SCORES], cat[ADAPTATION], cat[CROSS])


def _key_text(frame: pd.DataFrame, name: str, row: int) -> str:
    keys = [k for k in _KEYS[name] if k in frame.columns]
    return "(" + ", ".join(f"{k} {_plain(frame[k].iloc[row])!r}" for k in keys) + ")"


def _plain(v: Any) -> Any:
    return v.item() if isinstance(v, np.generic) else v


def _checked(name: str, frame: pd.DataFrame) -> pd.DataFrame:
    """The table with its columns typed: a missing column, an empty table, a non-finite number or a non-integer id
    raises naming the table, the column, the value and the row's key."""
    if not isinstance(frame, pd.DataFrame):
        raise ValueError(f"{name}: expected a DataFrame, got {type(frame).__name__}")
    missing = [c for c, _ in _COLUMNS[name] if c not in frame.columns]
    if missing:
        raise ValueError(f"{name}: missing column(s) {missing}")
    if frame.empty:
        raise ValueError(f"{name}: has no rows")
    out = pd.DataFrame(index=range(len(frame)))
    frame = frame.reset_index(drop=True)
    for column, kind in _COLUMNS[name]:
        raw = frame[column]
        if kind == "str":
            bad = raw.isna().to_numpy() | (raw.astype(str).str.strip() == "").to_numpy()
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise ValueError(f"{name}: column {column!r} has an empty value {_plain(raw.iloc[i])!r} at row "
                                 f"{i} {_key_text(frame, name, i)}")
            out[column] = raw.astype(str).to_numpy()
            continue
        values = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64)
        bad = ~np.isfinite(values)
        if kind == "int":
            bad |= np.isfinite(values) & (values != np.round(values))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            what = "integer" if kind == "int" else "finite"
            raise ValueError(f"{name}: column {column!r} has a non-{what} value {_plain(raw.iloc[i])!r} at row {i} "
                             f"{_key_text(frame, name, i)}")
        out[column] = values.astype(np.int64) if kind == "int" else values
    dup = out.duplicated(list(_KEYS[name]))
    if dup.any():
        i = int(np.flatnonzero(dup.to_numpy())[0])
        raise ValueError(f"{name}: row {i} repeats the key {_key_text(out, name, i)}")
    return out


def _methods(name: str, frame: pd.DataFrame, allowed: Sequence[str], what: str) -> None:
    unknown = sorted(set(frame["method"]) - set(METHODS))
    if unknown:
        raise ValueError(f"{name}: unknown method {unknown[0]!r} (the methods are {list(METHODS)})")
    other = sorted(set(frame["method"]) - set(allowed))
    if other:
        raise ValueError(f"{name}: method {other[0]!r} {what} (allowed: {list(allowed)})")


@dataclass
class _Seed:
    """One seed's arrays: clients in ascending order, their clusters, λ and, per (budget, method), acc and z."""

    seed: int
    clients: np.ndarray  # (n,)
    cluster: np.ndarray  # (n,) the index of the client's cluster among the seed's clusters (ascending labels)
    lam: np.ndarray  # (n, m)
    acc: dict[tuple[int, str], np.ndarray]  # (n, m)
    z: dict[tuple[int, str], np.ndarray]  # (n, m)
    cross: dict[int, np.ndarray] | None = None  # budget -> (n, n, m): model k on client i's pairs; NaN outside

    @property
    def members(self) -> list[np.ndarray]:
        return [np.flatnonzero(self.cluster == c) for c in range(int(self.cluster.max()) + 1)]


def _plan(seeds: Sequence[int], budgets: Sequence[int]) -> tuple[list[int], list[int]]:
    seeds_l, budgets_l = [int(s) for s in seeds], [int(b) for b in budgets]
    if len(seeds_l) < 2 or len(set(seeds_l)) != len(seeds_l):
        raise ValueError(f"seeds {list(seeds)!r}: the plan needs at least 2 distinct seeds (a t-interval and a "
                         "sign-flip test over seeds)")
    if not budgets_l or len(set(budgets_l)) != len(budgets_l) or min(budgets_l) < 1:
        raise ValueError(f"budgets {list(budgets)!r}: the plan needs distinct budgets of at least 1 pair")
    return seeds_l, sorted(budgets_l)


def _outside(name: str, frame: pd.DataFrame, column: str, plan: list[int]) -> None:
    extra = sorted(set(frame[column]) - set(plan))
    if extra:
        raise ValueError(f"{name}: {column} {extra[0]} is not in the pre-registered {column}s {plan} (the analysis "
                         "runs once, on the planned grid)")


def _load(records: ShotsRecords, seeds: list[int], budgets: list[int]) -> tuple[list[_Seed], list[str], pd.DataFrame]:
    """Validate every table against the plan and build the per-seed arrays (ValueError before any statistic)."""
    clients = _checked(CLIENTS, records.clients)
    scores = _checked(SCORES, records.scores)
    adapt = _checked(ADAPTATION, records.adaptation)
    cross = None if records.cross is None else _checked(CROSS, records.cross)
    _methods(SCORES, scores, METHODS, "")
    _methods(ADAPTATION, adapt, ADAPTING, "does not adapt")
    if cross is not None:
        _methods(CROSS, cross, (PRIMARY,), "has no cross scores in the pre-registration")
    objectives = list(dict.fromkeys(clients["objective"]))
    for name, frame in ((SCORES, scores), (CROSS, cross)):
        if frame is not None:
            unknown = sorted(set(frame["objective"]) - set(objectives))
            if unknown:
                raise ValueError(f"{name}: unknown objective {unknown[0]!r} (the objectives are {objectives})")
    for name, frame in ((SCORES, scores), (ADAPTATION, adapt), (CROSS, cross)):
        if frame is None:
            continue
        for b, group in frame.groupby("budget"):
            got = sorted(set(group["seed"]))
            if len(got) < 2:
                raise ValueError(f"{name}: budget {b} is recorded for {len(got)} seed ({got}); every budget needs at "
                                 "least 2 seeds (a t-interval and a sign-flip test over seeds)")
    for name, frame in ((CLIENTS, clients), (SCORES, scores), (ADAPTATION, adapt), (CROSS, cross)):
        if frame is not None:
            _outside(name, frame, "seed", seeds)
            if "budget" in frame.columns:
                _outside(name, frame, "budget", budgets)
    if (clients["lam"] < 0).any():
        i = int(np.flatnonzero(clients["lam"].to_numpy() < 0)[0])
        raise ValueError(f"{CLIENTS}: negative lam {clients['lam'][i]!r} at {_key_text(clients, CLIENTS, i)}")
    bad = (scores["acc"] < 0) | (scores["acc"] > 1) | (scores["n_pairs"] < 1)
    halves = 2 * scores["acc"] * scores["n_pairs"]
    bad |= (halves - np.round(halves)).abs() > 1e-6
    bad |= (scores["method"] == "base") & (scores["z"] != 0)
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        raise ValueError(f"{SCORES}: acc {scores['acc'][i]!r} with n_pairs {scores['n_pairs'][i]!r}, z "
                         f"{scores['z'][i]!r} at {_key_text(scores, SCORES, i)}: acc must be a share of the pairs in "
                         "halves, n_pairs ≥ 1, and the base model's z 0")
    bad = (adapt["alpha"] <= 0) | (adapt["p_minus"] <= 0) | (adapt["p_plus"] < adapt["p_minus"]) | \
        (adapt["L0_hat"] < 0)
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        row = adapt.iloc[i]
        raise ValueError(f"{ADAPTATION}: alpha {row['alpha']!r}, p_minus {row['p_minus']!r}, p_plus "
                         f"{row['p_plus']!r}, L0_hat {row['L0_hat']!r} at {_key_text(adapt, ADAPTATION, i)}: need "
                         "alpha > 0, 0 < p_minus ≤ p_plus, L0_hat ≥ 0")

    data = []
    for s in seeds:
        cs = clients[clients["seed"] == s]
        if cs.empty:
            raise ValueError(f"{CLIENTS}: seed {s} has no new clients")
        ids = np.array(sorted(set(cs["client"])))
        lam = cs.pivot(index="client", columns="objective", values="lam").reindex(index=ids, columns=objectives)
        if lam.isna().any().any():
            i, j = np.argwhere(lam.isna().to_numpy())[0]
            raise ValueError(f"{CLIENTS}: seed {s}, client {ids[i]} has no lam for objective {objectives[j]!r}")
        lam_a = lam.to_numpy(dtype=np.float64)
        off = np.abs(lam_a.sum(axis=1) - 1) > 1e-6
        if off.any():
            i = int(np.flatnonzero(off)[0])
            raise ValueError(f"{CLIENTS}: seed {s}, client {ids[i]}: lam {lam_a[i].tolist()} does not sum to 1")
        n_labels = cs.groupby("client")["cluster"].nunique().reindex(ids)
        if (n_labels > 1).any():
            c = int(n_labels.index[(n_labels > 1).to_numpy()][0])
            raise ValueError(f"{CLIENTS}: seed {s}, client {c} is in clusters "
                             f"{sorted(set(cs.loc[cs['client'] == c, 'cluster']))}")
        labels = cs.groupby("client")["cluster"].first().reindex(ids).to_numpy()
        order = sorted(set(labels.tolist()))
        cluster = np.array([order.index(v) for v in labels])
        ss = scores[scores["seed"] == s]
        unknown = sorted(set(ss["client"]) - set(ids.tolist()))
        if unknown:
            raise ValueError(f"{SCORES}: seed {s}, client {unknown[0]} is not a new client of {CLIENTS}")
        grid = pd.MultiIndex.from_product([budgets, METHODS, ids], names=["budget", "method", "client"])
        wide = ss.set_index(["budget", "method", "client", "objective"])[["acc", "z"]].unstack("objective")
        wide = wide.reindex(index=grid, columns=pd.MultiIndex.from_product([["acc", "z"], objectives]))
        hole = wide["acc"].isna().to_numpy()
        if hole.any():
            r, j = np.argwhere(hole)[0]
            b, method, c = grid[r]
            raise ValueError(f"{SCORES}: no row for seed {s}, budget {b}, method {method!r}, client {c}, objective "
                             f"{objectives[j]!r} (the grid is complete or not analysed)")
        shape = (len(budgets), len(METHODS), len(ids), len(objectives))
        acc_a = wide["acc"].to_numpy(dtype=np.float64).reshape(shape)
        z_a = wide["z"].to_numpy(dtype=np.float64).reshape(shape)
        acc = {(b, m): acc_a[q, k] for q, b in enumerate(budgets) for k, m in enumerate(METHODS)}
        z = {(b, m): z_a[q, k] for q, b in enumerate(budgets) for k, m in enumerate(METHODS)}
        seed_data = _Seed(s, ids, cluster, lam_a, acc, z)
        lam_c = _cluster_means(seed_data, lam_a)
        if len(order) < 2 or np.sum((lam_c - lam_c.mean(axis=0)) ** 2) <= 1e-24:
            raise ValueError(f"{CLIENTS}: seed {s}: the clusters' mean λ do not vary (clusters {order}): the "
                             "cluster-level slope is not defined")
        if np.sum((lam_a - lam_c[cluster]) ** 2) <= 1e-24:
            raise ValueError(f"{CLIENTS}: seed {s}: no λ varies within a cluster: the within-cluster slope is not "
                             "defined")
        if cross is not None:
            seed_data.cross = _cross_arrays(cross[cross["seed"] == s], seed_data, budgets, objectives)
        data.append(seed_data)
    present = {m: adapt[adapt["method"] == m] for m in ADAPTING}
    for method, rows in present.items():
        if rows.empty and method not in (PRIMARY, "pipeline1_wI"):
            continue
        have = set(zip(rows["seed"], rows["client"], rows["budget"], strict=True))
        for sd in data:
            for c in sd.clients:
                for b in budgets:
                    if (sd.seed, int(c), b) not in have:
                        raise ValueError(f"{ADAPTATION}: no row for seed {sd.seed}, client {c}, budget {b}, method "
                                         f"{method!r} (recorded at every client and budget or at none)")
    known = {(sd.seed, int(c)) for sd in data for c in sd.clients}
    stray = [k for k in zip(adapt["seed"], adapt["client"], strict=True) if k not in known]
    if stray:
        raise ValueError(f"{ADAPTATION}: seed {stray[0][0]}, client {stray[0][1]} is not a new client of {CLIENTS}")
    return data, objectives, adapt


def _cross_arrays(rows: pd.DataFrame, sd: _Seed, budgets: list[int], objectives: list[str]) -> dict[int, np.ndarray]:
    n, m = sd.lam.shape
    pos = {int(c): i for i, c in enumerate(sd.clients)}
    obj = {o: j for j, o in enumerate(objectives)}
    for column in ("model_client", "pairs_client"):
        stray = sorted(set(rows[column]) - set(pos))
        if stray:
            raise ValueError(f"{CROSS}: seed {sd.seed}, {column} {stray[0]} is not a new client of {CLIENTS}")
    out = {}
    for b in budgets:
        arr = np.full((n, n, m), np.nan)
        rb = rows[rows["budget"] == b]
        arr[[pos[c] for c in rb["pairs_client"]], [pos[c] for c in rb["model_client"]],
            [obj[o] for o in rb["objective"]]] = rb["acc"].to_numpy()
        for i in range(n):
            arr[i, i] = sd.acc[(b, PRIMARY)][i]
            for k in sd.members[sd.cluster[i]]:
                for j in range(m):
                    if np.isnan(arr[i, k, j]):
                        raise ValueError(f"{CROSS}: no row for seed {sd.seed}, budget {b}, model_client "
                                         f"{sd.clients[k]}, pairs_client {sd.clients[i]}, objective "
                                         f"{objectives[j]!r} (every ordered pair of one cluster)")
        out[b] = arr
    return out


# ------------------------------------------------------------------------------------------------ the nulls


def _within_arrangements(members: list[np.ndarray], n: int, rng: np.random.Generator, n_perm: int) \
        -> tuple[np.ndarray, bool]:
    """Arrangements ``(N, n)`` (client i takes the row of client ``π(i)``) that permute within each group of
    ``members``; every one once (``True``) when there are at most :data:`ENUMERATE_MAX`, else ``n_perm`` uniform
    draws (``False``)."""
    size = math.prod(math.factorial(len(g)) for g in members)
    if size > ENUMERATE_MAX:
        out = np.tile(np.arange(n), (n_perm, 1))
        for g in members:
            out[:, g] = rng.permuted(np.tile(g, (n_perm, 1)), axis=1)
        return out, False
    per_group = [np.array(list(itertools.permutations(g.tolist())), dtype=np.int64).reshape(-1, len(g))
                 for g in members]
    out = np.tile(np.arange(n), (size, 1))
    for g, choice in zip(members, _product_rows(per_group), strict=True):
        out[:, g] = choice
    return out, True


def _product_rows(arrays: list[np.ndarray]) -> list[np.ndarray]:
    """Rows of every combination of one row of each array (the first array's row varying slowest)."""
    grids = np.meshgrid(*[np.arange(len(a)) for a in arrays], indexing="ij")
    return [a[g.ravel()] for a, g in zip(arrays, grids, strict=True)]


def _combine(values: list[np.ndarray], exact: list[bool], rng: np.random.Generator, n_perm: int) \
        -> tuple[np.ndarray, bool]:
    """The null draws of the mean over seeds of a per-seed statistic, from each seed's values under its
    arrangements (``exact``: every arrangement once, the observed first; otherwise ``n_perm`` random draws).
    Every combination once when all are exact and their number is at most ``n_perm + 1``."""
    if all(exact) and math.prod(len(v) for v in values) <= n_perm + 1:
        total = values[0]
        for v in values[1:]:
            total = (total[:, None] + v[None, :]).ravel()
        return total / len(values), True
    draws = np.zeros(n_perm)
    for v, ex in zip(values, exact, strict=True):
        draws += v[rng.integers(0, len(v), n_perm)] if ex else v[:n_perm]
    return draws / len(values), False


def _sign_flip_values(d: np.ndarray) -> list[np.ndarray]:
    return [np.array([x, -x]) for x in d]


def _cluster_means(sd: _Seed, x: np.ndarray) -> np.ndarray:
    return np.array([x[g].mean(axis=0) for g in sd.members])


def _cluster_slope_values(sd: _Seed, z: np.ndarray, perms: np.ndarray) -> np.ndarray:
    """The cluster-level slope under each permutation ``perms`` ``(N, C)`` of the clusters' mean-λ rows."""
    return fixed_effect_slope(_cluster_means(sd, sd.lam)[perms], _cluster_means(sd, z))


def _within_slope_values(sd: _Seed, z: np.ndarray, perms: np.ndarray) -> np.ndarray:
    """The within-cluster slope under each within-cluster arrangement ``perms`` ``(N, n)`` of the λ rows (the
    cluster means, and so the denominator, are the same under every one; z's deviations sum to 0 in a cluster)."""
    dlam = sd.lam - _cluster_means(sd, sd.lam)[sd.cluster]
    dz = z - _cluster_means(sd, z)[sd.cluster]
    return np.einsum("Nim,im->N", sd.lam[perms], dz) / np.sum(dlam * dlam)


def _mates_values(sd: _Seed, cross: np.ndarray, perms: np.ndarray) -> np.ndarray:
    """Own-vs-mates under each within-cluster relabelling ``perms`` of the models (client i against model π(i))."""
    same = sd.cluster[:, None] == sd.cluster[None, :]
    scores = np.where(same, np.einsum("im,ikm->ik", sd.lam, np.nan_to_num(cross)), 0.0)  # A_ik in i's cluster
    size = np.array([len(sd.members[c]) for c in sd.cluster], dtype=np.float64)
    rows = np.flatnonzero(size >= 2)
    own = scores[rows[None, :], perms[:, rows]]
    rest = (scores[rows].sum(axis=1) - own) / (size[rows] - 1)
    return (own - rest).mean(axis=1)


# ------------------------------------------------------------------------------------------- the statistics


def holm(p_values: Sequence[float]) -> np.ndarray:
    """Holm's step-down adjusted p-values: with the k p-values in ascending order p_(1) ≤ … ≤ p_(k),
    ``p̃_(i) = max_{j ≤ i} min(1, (k − j + 1) p_(j))``, returned in the input order."""
    p = np.asarray(p_values, dtype=np.float64)
    if p.ndim != 1 or not np.all(np.isfinite(p)) or np.any((p < 0) | (p > 1)):
        raise ValueError(f"holm: p-values must be numbers in [0, 1], got {list(p_values)!r}")
    order = np.argsort(p, kind="stable")
    k = len(p)
    adjusted = np.minimum(1.0, np.maximum.accumulate((k - np.arange(k)) * p[order]))
    out = np.empty(k)
    out[order] = adjusted
    return out


def h43_ratio(alpha, L0_hat, p_minus, p_plus) -> np.ndarray:
    """``α·L̂0·p₊²/p₋``: Lemma H.43's step condition ``0 < α ≤ p₋/(L0 p₊²)`` holds with L̂0 iff it is ≤ 1."""
    return np.asarray(alpha, dtype=np.float64) * np.asarray(L0_hat) * np.asarray(p_plus) ** 2 / np.asarray(p_minus)


def _interval(values: np.ndarray) -> list[float | None]:
    t = t_interval(values)
    return [t["ci_low"], t["ci_high"]]


def _tested(stat: str, budget: int, per_seed: np.ndarray, draws: np.ndarray, exact: bool, n_units: int) \
        -> dict[str, Any]:
    estimate = float(np.mean(per_seed))
    p, mde = null_test(estimate, draws, exact=exact)
    return {"statistic": stat, "label": STATISTICS[stat], "budget": budget, "tested": True, "estimate": estimate,
            "interval": _interval(per_seed), "p_value": p, "p_min": 1 / len(draws) if exact else 1 / (1 + len(draws)),
            "p_holm": None, "exact": exact, "mde": mde,
            "verdict": None, "n_seeds": len(per_seed), "n_units": n_units, "per_seed": [float(v) for v in per_seed]}


def _reported(stat: str, budget: int, estimate: float | None, interval: list[float | None], per_seed,
              n_units: int, **extra) -> dict[str, Any]:
    return {"statistic": stat, "label": STATISTICS[stat], "budget": budget, "tested": False, "estimate": estimate,
            "interval": interval, "n_seeds": len(per_seed), "n_units": n_units,
            "per_seed": [None if v is None else float(v) for v in per_seed], **extra}


def _ceiling(num: np.ndarray, den: np.ndarray, rng: np.random.Generator, n_boot: int) \
        -> tuple[float | None, list[float | None], int]:
    """Ratio of the seeds' mean gains over base, its percentile interval over resampled seeds, resamples dropped."""
    estimate = float(num.mean() / den.mean()) if den.mean() > 0 else None
    idx = rng.integers(0, len(num), size=(n_boot, len(num)))
    bn, bd = num[idx].mean(axis=1), den[idx].mean(axis=1)
    ok = bd > 0
    if not ok.any():
        return estimate, [None, None], n_boot
    lo, hi = np.percentile(bn[ok] / bd[ok], [2.5, 97.5])
    return estimate, [float(lo), float(hi)], int(n_boot - ok.sum())


def _weighted(sd: _Seed, table: dict, budget: int, method: str) -> np.ndarray:
    """Per client ``Σ_j λ_ij x_ij``."""
    return np.einsum("im,im->i", sd.lam, table[(budget, method)])


def _adaptation(adapt: pd.DataFrame, budgets: list[int]) -> dict[str, Any]:
    ratio = h43_ratio(adapt["alpha"], adapt["L0_hat"], adapt["p_minus"], adapt["p_plus"])
    frame = adapt.assign(h43_ratio=ratio, h43_held=ratio <= 1.0).sort_values(["seed", "client", "budget", "method"])
    raised = frame[frame["psiK"] > frame["psi0"]]
    rows = [{k: _plain(v) for k, v in r.items()} for r in raised.to_dict("records")]
    for r in rows:
        r["h43_held"] = bool(r["h43_held"])
    count = {m: {str(b): int(((raised["method"] == m) & (raised["budget"] == b)).sum()) for b in budgets}
             for m in sorted(set(frame["method"]), key=ADAPTING.index)}
    return {"n_adaptations": len(frame), "n_psi_raised": len(rows), "psi_raised": rows,
            "psi_raised_by_method_budget": count,
            "h43": {"n_held": int(frame["h43_held"].sum()), "n_violated": int((~frame["h43_held"]).sum()),
                    "ratio_max": float(ratio.max()),
                    "n_violated_psi_raised": int((~raised["h43_held"]).sum())},
            "methods": sorted(set(frame["method"]), key=ADAPTING.index),
            "fedavg_adapted": bool((frame["method"] == "fedavg").any())}


def shots_report(records: ShotsRecords, *, seeds: Sequence[int], budgets: Sequence[int], n_perm: int = N_PERM,
                 seed: int = 0, n_boot: int = N_BOOT) -> dict[str, Any]:
    """The pre-registered analysis of the curve (module docstring), JSON-able.

    ``seeds``, ``budgets``: the plan, stated before the runs; the records must hold exactly its grid. Returns
    ``plan``; ``table`` (per method × budget: ``acc`` and ``z`` — the λ-weighted accuracy and margin change — as
    mean, t-interval and per-seed values, ``ceiling_share`` with its interval); ``lines`` (the tested family, in
    budget order: ``statistic``, ``label``, ``budget``, ``estimate``, ``interval``, ``p_value``, ``p_holm``,
    ``exact``, ``mde``, ``verdict``, ``n_seeds``, ``n_units``, ``per_seed``); ``descriptive`` (the ceiling share
    and w_II − w_I per budget, not tested); ``family_size``; ``adaptation`` (the ψ-raise flags and H.43 check).
    """
    if n_perm < 1 or n_boot < 1:
        raise ValueError(f"n_perm and n_boot must be at least 1, got {n_perm}, {n_boot}")
    plan_seeds, plan_budgets = _plan(seeds, budgets)
    data, objectives, adapt = _load(records, plan_seeds, plan_budgets)
    out = _analyse(data, plan_budgets, n_perm=n_perm, seed=seed, n_boot=n_boot)
    return {"plan": {"seeds": plan_seeds, "budgets": plan_budgets, "methods": list(METHODS),
                     "objectives": objectives, "cross_scores": all(sd.cross is not None for sd in data)},
            **out, "adaptation": _adaptation(adapt, plan_budgets),
            "n_perm": n_perm, "n_boot": n_boot, "seed": seed, "alpha": ALPHA, "power": POWER}


def _analyse(data: list[_Seed], budgets: list[int], *, n_perm: int, seed: int, n_boot: int) -> dict[str, Any]:
    """The statistics of validated seeds: ``table``, ``lines`` (Holm-adjusted), ``descriptive``, ``family_size``
    and ``notes``."""
    rng = np.random.default_rng(seed)
    n_units = sum(len(sd.clients) for sd in data)
    has_cross = all(sd.cross is not None for sd in data)
    cluster_sets, within_sets = [], []
    for sd in data:
        n_clusters = len(sd.members)
        if math.factorial(n_clusters) <= ENUMERATE_MAX:
            cluster_sets.append((np.array(list(itertools.permutations(range(n_clusters)))), True))
        else:
            cluster_sets.append((rng.permuted(np.tile(np.arange(n_clusters), (n_perm, 1)), axis=1), False))
        within_sets.append(_within_arrangements(sd.members, len(sd.clients), rng, n_perm))

    table, lines, descriptive = [], [], []
    for b in budgets:
        means = {m: np.array([_weighted(sd, sd.acc, b, m).mean() for sd in data]) for m in METHODS}
        zmeans = {m: np.array([_weighted(sd, sd.z, b, m).mean() for sd in data]) for m in METHODS}
        den = means["oracle"] - means["base"]
        for m in METHODS:
            share: float | None = None
            share_iv: list[float | None] = [None, None]
            dropped = 0
            if m not in ("base", "oracle"):
                share, share_iv, dropped = _ceiling(means[m] - means["base"], den, rng, n_boot)
            table.append({"method": m, "budget": b, "acc": float(means[m].mean()), "acc_interval": _interval(means[m]),
                          "acc_per_seed": means[m].tolist(), "z": float(zmeans[m].mean()),
                          "z_interval": _interval(zmeans[m]), "ceiling_share": share,
                          "ceiling_share_interval": share_iv, "ceiling_boot_dropped": dropped})
            if m == PRIMARY:
                ratios = [float(g / o) if o > 0 else None for g, o in zip(means[m] - means["base"], den,
                                                                           strict=True)]
                descriptive.append(_reported("ceiling_share", b, share, share_iv, ratios, n_units,
                                             boot_dropped=dropped))
        d = means[PRIMARY] - means["pipeline1_wI"]
        descriptive.append(_reported("wII_minus_wI", b, float(d.mean()), _interval(d), d, n_units))
        for stat, comparator in (("gain_over_local", "local"), ("gain_over_fedavg", "fedavg")):
            d = means[PRIMARY] - means[comparator]
            draws, exact = _combine(_sign_flip_values(d), [True] * len(d), rng, n_perm)
            line = _tested(stat, b, d, draws, exact, n_units)
            line["mde"] = MDE_FACTOR * float(np.sqrt(np.sum((d - d.mean()) ** 2))) / len(d)
            lines.append(line)
        for stat, values_of, sets in (("cluster_slope", _cluster_slope_values, cluster_sets),
                                      ("within_cluster_slope", _within_slope_values, within_sets)):
            values = [values_of(sd, sd.z[(b, PRIMARY)], perms) for sd, (perms, _) in zip(data, sets, strict=True)]
            observed = np.array([values_of(sd, sd.z[(b, PRIMARY)], np.arange(len(perms[0]))[None, :])[0]
                                 for sd, (perms, _) in zip(data, sets, strict=True)])
            draws, exact = _combine(values, [ex for _, ex in sets], rng, n_perm)
            lines.append(_tested(stat, b, observed, draws, exact, n_units))
        if has_cross:
            mates, own = [], []
            for sd, (perms, _) in zip(data, within_sets, strict=True):
                assert sd.cross is not None
                mates.append(_mates_values(sd, sd.cross[b], perms))
                own.append(_mates_values(sd, sd.cross[b], np.arange(len(sd.clients))[None, :])[0])
            draws, exact = _combine(mates, [ex for _, ex in within_sets], rng, n_perm)
            lines.append(_tested("own_vs_mates", b, np.array(own), draws, exact,
                                 sum(int(sum(len(g) for g in sd.members if len(g) >= 2)) for sd in data)))
    for line, p in zip(lines, holm([line["p_value"] for line in lines]), strict=True):
        line["p_holm"] = float(p)
        line["verdict"] = verdict(float(p), line["interval"], line["mde"])
    notes = []
    level = ALPHA / len(lines)
    coarse = list(dict.fromkeys(line["statistic"] for line in lines if line["p_min"] >= level))
    if coarse:
        notes.append(f"with {len(data)} seeds the smallest attainable p-value of {', '.join(coarse)} is not below "
                     f"α/{len(lines)} = {level:.3g} (Holm's first step over the family of {len(lines)} tests): such a "
                     "line can be supported only once enough of the family is")
    return {"table": table, "lines": lines, "descriptive": descriptive, "family_size": len(lines), "notes": notes}


# ------------------------------------------------------------------------------------------------ the output


def line_text(line: dict[str, Any]) -> str:
    """One line of the report: ``label (budget b): estimate [lo, hi], p, Holm p, MDE — verdict``; a reported
    (untested) line ends ``(reported, not tested)``."""
    lo, hi = line["interval"]
    head = (f"{line['label']} (budget {line['budget']}): {short_number(line['estimate'])}, 95 % interval "
            f"[{short_number(lo)}, {short_number(hi)}]")
    tail = f"({line['n_seeds']} seed{'s' * (line['n_seeds'] != 1)}, {line['n_units']} clients)"
    if not line["tested"]:
        return f"{head} — reported, not tested {tail}"
    return (f"{head}, p = {line['p_value']:.4g}{' (exact)' if line['exact'] else ''}, Holm p = "
            f"{line['p_holm']:.4g}, MDE {short_number(line['mde'])} — {line['verdict']} {tail}")


def shots_figure(report: dict[str, Any], path: Path | str) -> Path:
    """The shots curve as a PNG at ``path``: the λ-weighted held-out accuracy against the budget (pairs per
    objective, log2 axis), one line per method, 95 % t-intervals over the seeds as error bars."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = pd.DataFrame(report["table"])
    budgets = report["plan"]["budgets"]
    fig = Figure(figsize=(6.4, 4.2))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    methods = [m for m in METHODS if m in set(rows["method"])]
    for k, method in enumerate(methods):
        r = rows[rows["method"] == method].sort_values("budget")
        x = r["budget"].to_numpy(dtype=np.float64) * 2 ** (0.04 * (k - (len(methods) - 1) / 2))
        y = r["acc"].to_numpy(dtype=np.float64)
        iv = np.array([[np.nan if v is None else v for v in i] for i in r["acc_interval"]], dtype=np.float64)
        err = np.abs(np.vstack([y - iv[:, 0], iv[:, 1] - y]))
        ax.errorbar(x, y, yerr=np.nan_to_num(err), marker="o", ms=3.5, lw=2.2 if method == PRIMARY else 1.2,
                    capsize=2.5, label=method)
    ax.set_xscale("log", base=2)
    ax.set_xticks(budgets, [str(b) for b in budgets])
    ax.set_xlabel("pairs per objective of the new client (budget)")
    ax.set_ylabel("held-out λ-weighted preference accuracy")
    n = len(report["plan"]["seeds"])
    ax.set_title(f"The shots curve: mean over {n} seeds, 95 % t-intervals", fontsize=9.5)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=150)
    return out
