r"""Calibration of the Monte Carlo protocol at the boundary: the false-failure rate of every budgeted assertion,
measured.

Every confidence-level assertion of the default run (:data:`verification.core.montecarlo.ASSERTIONS`, 24 of them) is
tested at ``δ = FAMILY_WISE_BUDGET / 24`` (:data:`verification.core.montecarlo.DELTA`), and the family-wise
false-failure probability is stated to be at most ``1e-3`` (Bonferroni). This module measures it: each assertion
is run ``R`` times on synthetic draws whose true mean is exactly at its bound, with the assertion's own estimator,
sample size ``N`` and ``δ``, and the failures are counted.

Mean claims ``E X <= b`` (:func:`verification.core.montecarlo.mean_claim`: FAIL iff ``max(Hoeffding, empirical
Bernstein) LCB > b``, each at ``δ/2``, of ``Y = min(X, M)``, ``M = CAP_FACTOR·b``), two distribution families:

* ``two_point``: the least favourable law of a ``[0, M]``-bounded variable, ``X ∈ {0, M}`` with
  ``P(X = M) = b/M``, so ``E X = b`` exactly. ``Ȳ`` and ``V`` depend only on the count ``C ~ Binomial(N, b/M)`` of
  ``M``'s, so the failure probability is also computed exactly, ``Σ_c P(C = c)·1{FAIL at c}`` (every ``c`` from 0
  to ``N``, through the same LCB code): an exact cross-check of the replications, which draw the full samples;
* ``own_samples``: the claim's own samples from the default run (seed :data:`verification.core.registry.DEFAULT_SEED`,
  read through :func:`verification.core.montecarlo.recorded_claims`), rescaled by the ``s`` with
  ``mean(min(s·x, M)) = b`` under their empirical law (bisection; the ``s`` kept has the mean at or just above
  ``b``), and resampled ``N`` with replacement. A claim whose samples cannot reach ``b`` (``M·P(x > 0) < b``) has
  only the two-point row.

A composite assertion (H.39-41's H.40 + H.41(a), ThmA's claim over three ``S``) fails when any of its sub-tests
fails; its sub-tests are drawn independently in each replication and the composite is counted once. H.39-41's
Hotelling sub-tests are F tests, exact for the Gaussian rows of its family: their rejection probability is their
``δ``, added to the replicated rate by the union bound (not replicated); the replicated part then has
``δ − δ_exact`` of the assertion's ``δ``, and gets ``R·δ/(δ − δ_exact)`` replications.

H.17's order-statistic tests (a count ``K`` of fresh points below the estimation sample's minimum, or above its
maximum, against the critical value ``k_crit``) are distribution-free: for i.i.d. continuous ratios ``K`` depends
on the ranks only, so the replications draw ``n_est + n_fresh`` uniforms and count; the exact rate is
``P(K > k_crit)`` under ``BetaBinomial(n_fresh, 1, n_est)``. Their rate is not far below ``δ`` (the quantile is
discrete), so they get ``order_statistic_replications`` (default :func:`default_order_statistic_replications`: the
committed study's 4,000,000 at its ``R`` of 300,000, in proportion otherwise) for a tight upper bound.

Per assertion and family: failures ``k`` out of ``R``, the rate, the one-sided 95 % Clopper–Pearson bounds
(:func:`verification.engine.sweep.clopper_pearson`) and the exact rate where it is known. An assertion's upper bound is
the largest over its families (plus the exact part of a composite). Family-wise: the sum of the per-assertion upper
bounds (union bound), with the sum of the lower bounds below it, and the status ``"shown <= 1e-3"`` iff that sum is
at most :data:`verification.core.montecarlo.FAMILY_WISE_BUDGET`. (The assertions are independent, so their deviations
partly cancel and the sum of one-sided 95 % bounds covers the summed rate at least as often in the normal regime;
the ``simultaneous`` entry repeats the sum with every Clopper–Pearson bound taken at ``1 − 0.05/(number of
bounds)``, so that all of them hold at once with probability ``>= 0.95`` whatever the regime.) The sweep's Clopper–Pearson figure over seeds stays as the end-to-end check.

The full-size result (``R = 300,000``, 4,000,000 replications per order-statistic test, seed 0: the defaults, each
recorded in the file) is committed as ``verification/data/mc_calibration.json`` (:data:`DATA_FILE`,
:func:`load_calibration`); ``python -m verification mc-calibration`` with its defaults recomputes it.
"""

from __future__ import annotations

import json
import math
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from verification.core.montecarlo import (
    ASSERTIONS,
    CAP_FACTOR,
    DELTA,
    FAMILY_WISE_BUDGET,
    protocol_lcbs,
    recorded_claims,
)
from verification.engine.sweep import CP_ALPHA, clopper_pearson

__all__ = [
    "DEFAULT_REPLICATIONS",
    "DEFAULT_SEED",
    "DEFAULT_ORDER_STATISTIC_REPLICATIONS",
    "default_order_statistic_replications",
    "DATA_FILE",
    "FAMILIES",
    "MeanSubtest",
    "ExactSubtest",
    "Assertion",
    "budgeted_assertions",
    "boundary_scale",
    "two_point_exact",
    "replicate_mean",
    "replicate_order_statistic",
    "order_statistic_exact",
    "calibrate",
    "run_calibration",
    "load_calibration",
    "table",
]

#: Replications per assertion (the mean claims) of the full-size study: those of the committed file.
DEFAULT_REPLICATIONS = 300_000
#: Seed of the calibration's own generator (each assertion and family draws from ``default_rng([seed, row, family])``).
DEFAULT_SEED = 0
#: Replications per order-statistic test of H.17 at :data:`DEFAULT_REPLICATIONS` (their rate is close to ``δ``, so
#: they get more): those of the committed file.
DEFAULT_ORDER_STATISTIC_REPLICATIONS = 4_000_000


def default_order_statistic_replications(replications: int) -> int:
    """The order-statistic tests' replications that go with ``replications`` per mean claim when none are given:
    :data:`DEFAULT_ORDER_STATISTIC_REPLICATIONS` at :data:`DEFAULT_REPLICATIONS` (the committed study), in the same
    proportion otherwise (rounded up)."""
    return -(-int(replications) * DEFAULT_ORDER_STATISTIC_REPLICATIONS // DEFAULT_REPLICATIONS)

#: The committed full-size result.
DATA_FILE = Path(__file__).parents[1] / "data" / "mc_calibration.json"
#: Distribution families of a mean claim at its boundary.
FAMILIES = ("two_point", "own_samples")
#: What each family of draws is (the result's ``families``).
FAMILY_TEXT = {
    "two_point": "X in {0, M}, P(X = M) = b/M (E X = b): the least favourable law of a [0, M]-bounded variable; "
                 "exact rate: the binomial sum over the count of M's",
    "own_samples": "the claim's own samples of the default run, rescaled so that mean(min(s x, M)) = b, resampled "
                   "N with replacement",
    "uniform_ranks": "n_est + n_fresh i.i.d. uniforms (the test depends on ranks only); exact rate: "
                     "P(K > k_crit) under BetaBinomial(n_fresh, 1, n_est)",
}
#: Level of the exact-versus-replicated agreement check (two-sided Clopper–Pearson interval).
AGREEMENT_ALPHA = 1e-3
MEAN_ESTIMATOR = "max(Hoeffding, empirical Bernstein) LCB at delta/2 each of min(X, 5b); FAIL iff LCB > b"
ORDER_ESTIMATOR = "order statistic: K fresh points beyond the estimation extreme; FAIL iff K > k_crit"
_CHUNK = 500_000  # array elements per replication block
#: The exact two-point sum runs over the counts ``c`` of probability at least this (the rest is reported as
#: ``omitted_mass``).
_PMF_FLOOR = 1e-40

#: An LCB of capped samples along the last axis, ``lcb(y, M, delta) -> array`` (the protocol's by default).
LCB = Callable[[np.ndarray, float, float], np.ndarray]


def _protocol_lcb(y: np.ndarray, M: float, delta: float) -> np.ndarray:
    return protocol_lcbs(y, M, delta)[2]


@dataclass(frozen=True)
class MeanSubtest:
    """One mean claim as the default run tested it: bound ``b``, cap ``M``, ``δ`` and its own samples."""

    label: str
    bound: float
    cap: float
    delta: float
    n: int
    samples: np.ndarray | None = None


@dataclass(frozen=True)
class ExactSubtest:
    """A sub-test whose false-rejection probability is known exactly (not replicated)."""

    label: str
    delta: float
    law: str


@dataclass(frozen=True)
class Assertion:
    """One budgeted assertion: a (composite of) mean claim(s), or one of H.17's order-statistic tests."""

    statement: str
    label: str
    delta: float
    kind: str  # "mean" | "order_statistic"
    mean: tuple[MeanSubtest, ...] = ()
    exact: tuple[ExactSubtest, ...] = ()
    n_est: int = 0
    n_fresh: int = 0
    k_crit: int = 0
    side: str = ""  # order statistic: "below" (fresh below the estimation minimum) or "above" (above the maximum)

    @property
    def estimator(self) -> str:
        return MEAN_ESTIMATOR if self.kind == "mean" else ORDER_ESTIMATOR

    @property
    def n(self) -> list[int]:
        """The sample sizes: ``N`` of each mean sub-test, or ``[n_est, n_fresh]``."""
        return [s.n for s in self.mean] if self.kind == "mean" else [self.n_est, self.n_fresh]


# ------------------------------------------------------------------------------------------ the assertions


def _match_claim(rec: dict, log: list, stmt_id: str):
    hits = [c for c in log if c.result.n == rec["n"] and c.result.bound == rec["bound"] and c.result.lcb == rec["lcb"]]
    if len(hits) != 1:
        raise ValueError(f"{stmt_id}: the mean claim {rec['label']!r} matches {len(hits)} recorded calls of mean_claim")
    return hits[0]


def _mean_assertions(stmt_id: str, details: dict, log: list) -> list[Assertion]:
    listed = (details.get("mc_assertions") or {}).get("assertions", [])
    records = {a["label"]: a for a in listed}
    cas = details["confidence_assertions"]
    out = []
    for i, ca in enumerate(cas):
        # by label; else by position where the Monte Carlo records and the budget are listed one for one
        rec = records.get(ca["label"], listed[i] if len(listed) == len(cas) else None)
        if rec is None:
            raise ValueError(f"{stmt_id}: no Monte Carlo record for the budgeted assertion {ca['label']!r}")
        mean, exact = [], []
        for sub in rec.get("subtests", [rec]):
            if "lcb" in sub:
                c = _match_claim(sub, log, stmt_id)
                mean.append(MeanSubtest(sub["label"], c.result.bound, c.result.cap, c.result.delta, c.result.n,
                                        c.samples))
            elif "F_crit" in sub:
                exact.append(ExactSubtest(sub["label"], float(sub["delta"]),
                                          f"Hotelling F({sub['dim']}, {sub['N'] - sub['dim']}), Gaussian rows: "
                                          "rejection probability = its delta"))
            else:
                raise ValueError(f"{stmt_id}: sub-test {sub.get('label')!r} is neither a mean claim nor an F test")
        spent = sum(s.delta for s in mean) + sum(s.delta for s in exact)
        if spent > ca["delta"] * (1 + 1e-9):
            raise ValueError(f"{stmt_id}: the sub-tests of {ca['label']!r} spend {spent} > its delta {ca['delta']}")
        out.append(Assertion(stmt_id, ca["label"], float(ca["delta"]), "mean", tuple(mean), tuple(exact)))
    return out


def _order_statistic_assertions(stmt_id: str, details: dict, k_crit_of: Callable[[int, int, float], int]) -> list:
    problems = details["problems"]
    out = []
    for x, ca in enumerate(details["confidence_assertions"]):
        p = problems[x // 2]
        side = "below" if x % 2 == 0 else "above"
        if not ca["label"].startswith(f"{p['label']}: "):
            raise ValueError(f"{stmt_id}: assertion {ca['label']!r} is not of problem {p['label']!r}")
        k = k_crit_of(int(p["n_fresh"]), int(p["n_est"]), float(ca["delta"]))
        if k != p["k_crit"]:
            raise ValueError(f"{stmt_id}: k_crit {p['k_crit']} of {p['label']} is not the statement's rule ({k})")
        out.append(Assertion(stmt_id, ca["label"], float(ca["delta"]), "order_statistic", n_est=int(p["n_est"]),
                             n_fresh=int(p["n_fresh"]), k_crit=int(p["k_crit"]), side=side))
    return out


def budgeted_assertions(seed: int | None = None) -> list[Assertion]:
    """Every budgeted assertion of the default run, in :data:`~verification.core.montecarlo.ASSERTIONS` order: each
    statement's check runs once at its default Config and ``seed`` (default: the registry's), inside
    :func:`~verification.core.montecarlo.recorded_claims`, and its ``details["confidence_assertions"]`` are matched to
    the recorded mean claims (by sample size, bound and LCB) or to H.17's problems."""
    from verification.core import registry
    from verification.statements import h17_near_aligned_regime as h17

    seed = registry.DEFAULT_SEED if seed is None else seed
    out: list[Assertion] = []
    for stmt_id, count in ASSERTIONS.items():
        stmt = registry.get_statement(stmt_id)
        with recorded_claims() as log:
            ev = stmt.run(registry.statement_config(stmt), registry.statement_rng(seed))
        details = ev.details
        if len(details.get("confidence_assertions") or []) != count:
            raise ValueError(f"{stmt_id}: {len(details.get('confidence_assertions') or [])} budgeted assertions in "
                             f"the default run; ASSERTIONS says {count}")
        if stmt_id == h17.STATEMENT_ID:
            out += _order_statistic_assertions(stmt_id, details, h17._k_crit)
        else:
            out += _mean_assertions(stmt_id, details, log)
    return out


# ------------------------------------------------------------------------------------------ mean claims


def _capped_mean(x: np.ndarray, s: float, M: float) -> float:
    return float(np.minimum(s * x, M).mean())


def boundary_scale(samples, bound: float, cap: float) -> float | None:
    """The factor ``s`` with ``mean(min(s·x, M)) = b`` (the smallest ``s`` found with the mean ``>= b``, relative
    bracket ``< 1e-14``); None when no ``s`` reaches ``b`` (``M·P(x > 0) < b``)."""
    x = np.asarray(samples, dtype=np.float64).ravel()
    if cap * np.mean(x > 0) < bound:
        return None
    lo = bound / x.mean()  # min(s x, M) <= s x: the capped mean at lo is <= b
    if _capped_mean(x, lo, cap) >= bound:
        return lo
    hi = 2 * lo
    while _capped_mean(x, hi, cap) < bound:
        lo, hi = hi, 2 * hi
    while hi - lo > 1e-14 * hi:
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        lo, hi = (mid, hi) if _capped_mean(x, mid, cap) < bound else (lo, mid)
    return hi


def _two_point_draws(rng: np.random.Generator, shape: tuple, bound: float, cap: float) -> np.ndarray:
    """``X ∈ {0, M}`` with ``P(X = M) = b/M``: exact (uniform integers) when ``M/b`` is an integer."""
    ratio = cap / bound
    if abs(ratio - round(ratio)) < 1e-12 and 1 < round(ratio) <= 255:
        hit = rng.integers(0, round(ratio), shape, dtype=np.uint8) == 0
    else:
        hit = rng.random(shape) < bound / cap
    return hit * cap


def two_point_exact(sub: MeanSubtest, *, lcb: LCB = _protocol_lcb) -> dict:
    """Exact failure probability of the claim on the two-point law: ``Σ_c P(C = c)·1{LCB(c) > b}`` with
    ``C ~ Binomial(N, b/M)`` and the LCB evaluated (by ``lcb``) on the sample with ``c`` values ``M``, for every
    ``c`` with ``P(C = c) >= 1e-40`` (the others' mass is ``omitted_mass``). Also the smallest
    failing count, whether the failing counts are all counts from it on, and the closest any ``c`` comes to the
    bound (relative): where that is at roundoff level, the order of the values could flip a decision."""
    n, p = sub.n, sub.bound / sub.cap
    pmf = stats.binom.pmf(np.arange(n + 1), n, p)
    kept = np.flatnonzero(pmf >= _PMF_FLOOR)  # a contiguous range: the binomial law is unimodal
    lo, hi = int(kept[0]), int(kept[-1])
    counts = np.arange(lo, hi + 1)
    fails = np.zeros(counts.size, bool)
    margin = np.inf
    pos = np.arange(n)
    step = max(1, _CHUNK // n)
    for j in range(0, counts.size, step):
        cs = counts[j:j + step]
        v = lcb((pos[None, :] < cs[:, None]) * sub.cap, sub.cap, sub.delta)
        fails[j:j + cs.size] = v > sub.bound
        margin = min(margin, float(np.min(np.abs(v - sub.bound))) / sub.bound)
    first = int(np.argmax(fails)) if fails.any() else None
    return {"exact": float(pmf[counts[fails]].sum()), "counts": [lo, hi],
            "omitted_mass": float(pmf[:lo].sum() + pmf[hi + 1:].sum()),
            "first_failing_count": None if first is None else int(counts[first]),
            "failing_counts_contiguous": bool(first is None or fails[first:].all()),
            "closest_relative_margin": margin}


def replicate_mean(subs: Sequence[MeanSubtest], family: str, replications: int, rng: np.random.Generator, *,
                   lcb: LCB = _protocol_lcb, scales: Sequence[float | None] | None = None) -> int:
    """Replications (of ``replications``) in which at least one of the claims ``subs`` fails, each claim drawn
    independently at its boundary from ``family`` (``two_point`` or ``own_samples``, the latter rescaled by
    ``scales``, default :func:`boundary_scale`), with ``N`` its own sample size."""
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}; got {family!r}")
    if replications < 1:
        raise ValueError(f"replications must be >= 1; got {replications!r}")
    sizes = [s.n for s in subs]
    pools: list[np.ndarray | None] = []
    for j, s in enumerate(subs):
        if family == "own_samples":
            sc = boundary_scale(s.samples, s.bound, s.cap) if scales is None else scales[j]
            if sc is None:
                raise ValueError(f"the samples of {s.label!r} cannot reach the bound")
            pools.append(np.minimum(sc * np.asarray(s.samples, dtype=np.float64), s.cap))
        else:
            pools.append(None)
    step = max(1, _CHUNK // max(sizes))
    failures = 0
    for r0 in range(0, replications, step):
        m = min(step, replications - r0)
        any_fail = np.zeros(m, bool)
        for s, size, pool in zip(subs, sizes, pools, strict=True):
            if pool is None:
                y = _two_point_draws(rng, (m, size), s.bound, s.cap)
            else:
                y = np.take(pool, rng.integers(0, pool.size, (m, size)))
            any_fail |= lcb(y, s.cap, s.delta) > s.bound
        failures += int(any_fail.sum())
    return failures


# ------------------------------------------------------------------------------------------ order statistics


def replicate_order_statistic(n_est: int, n_fresh: int, k_crit: int, replications: int, rng: np.random.Generator,
                              side: str = "below") -> int:
    """Replications in which more than ``k_crit`` of ``n_fresh`` i.i.d. uniforms fall below the minimum (``side``
    ``"below"``) or above the maximum (``"above"``) of ``n_est`` further ones."""
    if side not in ("below", "above"):
        raise ValueError(f"side must be 'below' or 'above'; got {side!r}")
    if replications < 1:
        raise ValueError(f"replications must be >= 1; got {replications!r}")
    step = max(1, _CHUNK // (n_est + n_fresh))
    failures = 0
    for r0 in range(0, replications, step):
        m = min(step, replications - r0)
        u = rng.random((m, n_est + n_fresh))
        est, fresh = u[:, :n_est], u[:, n_est:]
        if side == "below":
            K = (fresh < est.min(axis=1)[:, None]).sum(axis=1)
        else:
            K = (fresh > est.max(axis=1)[:, None]).sum(axis=1)
        failures += int((K > k_crit).sum())
    return failures


def order_statistic_exact(n_est: int, n_fresh: int, k_crit: int) -> float:
    """``P(K > k_crit)`` for ``K ~ BetaBinomial(n_fresh, 1, n_est)``."""
    return float(stats.betabinom(n_fresh, 1, n_est).sf(k_crit))


# ------------------------------------------------------------------------------------------ the study


def _counts(k: int, R: int, alpha: float) -> dict:
    lo, hi = clopper_pearson(k, R, alpha)
    return {"failures": k, "replications": R, "rate": k / R, "cp_lower": lo, "cp_upper": hi}


def _agreement(k: int, R: int, exact: float) -> bool:
    lo, hi = clopper_pearson(k, R, AGREEMENT_ALPHA / 2)
    return bool(lo <= exact <= hi)


def _calibrate_mean(a: Assertion, R: int, seed: int, row: int, alpha: float, lcb: LCB) -> dict:
    fams: dict[str, Any] = {}
    exact_part = 1.0 - float(np.prod([1.0 - e.delta for e in a.exact]))
    if 0.0 < exact_part < a.delta:  # the replicated part has delta - exact_part of the row's delta: R scales with it
        R = math.ceil(R * a.delta / (a.delta - exact_part))
    # two-point law: replicated and exact
    k = replicate_mean(a.mean, "two_point", R, np.random.default_rng([seed, row, 0]), lcb=lcb)
    cache: dict[tuple, dict] = {}
    for s in a.mean:
        key = (s.n, s.bound, s.cap, s.delta)
        if key not in cache:
            cache[key] = two_point_exact(s, lcb=lcb)
    subs = [cache[(s.n, s.bound, s.cap, s.delta)] for s in a.mean]
    ex = 1.0 - float(np.prod([1.0 - d["exact"] for d in subs]))
    fams["two_point"] = {**_counts(k, R, alpha), "exact": ex, "agrees_with_exact": _agreement(k, R, ex),
                         "subtests": [{"label": s.label, "N": s.n, "delta": s.delta, **d}
                                      for s, d in zip(a.mean, subs, strict=True)]}
    # the claim's own samples, rescaled to the boundary
    scales = [boundary_scale(s.samples, s.bound, s.cap) if s.samples is not None else None for s in a.mean]
    if any(sc is None for sc in scales):
        bad = [s.label for s, sc in zip(a.mean, scales, strict=True) if sc is None]
        fams["own_samples"] = {"skipped": f"samples cannot reach the bound (or were not recorded): {bad}"}
    else:
        k = replicate_mean(a.mean, "own_samples", R, np.random.default_rng([seed, row, 1]), lcb=lcb,
                           scales=scales)
        fams["own_samples"] = {**_counts(k, R, alpha), "exact": None, "subtests": [
            {"label": s.label, "N": s.n, "delta": s.delta, "scale": sc,
             "observed_capped_mean_over_bound": float(np.minimum(s.samples, s.cap).mean() / s.bound),
             "rescaled_capped_mean_over_bound": _capped_mean(s.samples, sc, s.cap) / s.bound}
            for s, sc in zip(a.mean, scales, strict=True) if s.samples is not None and sc is not None]}
    return {"families": fams, "exact_part": exact_part,
            "exact_subtests": [{"label": e.label, "delta": e.delta, "law": e.law} for e in a.exact]}


def _calibrate_order(a: Assertion, R: int, seed: int, row: int, alpha: float) -> dict:
    k = replicate_order_statistic(a.n_est, a.n_fresh, a.k_crit, R, np.random.default_rng([seed, row, 0]), a.side)
    ex = order_statistic_exact(a.n_est, a.n_fresh, a.k_crit)
    return {"families": {"uniform_ranks": {**_counts(k, R, alpha), "exact": ex,
                                           "agrees_with_exact": _agreement(k, R, ex)}},
            "exact_part": 0.0, "exact_subtests": [], "n_est": a.n_est, "n_fresh": a.n_fresh, "k_crit": a.k_crit,
            "side": a.side}


def calibrate(assertions: Sequence[Assertion], *, replications: int = DEFAULT_REPLICATIONS,
              order_statistic_replications: int | None = None, seed: int = DEFAULT_SEED,
              progress: Callable[[int, int, dict], None] | None = None, lcb: LCB = _protocol_lcb) -> dict:
    """The calibration of ``assertions`` (JSON-ready; module docstring): per assertion its families' counts,
    Clopper–Pearson bounds and exact rates, its ``upper`` bound, and the family-wise sum and status. ``lcb``
    replaces the protocol's bound of the mean claims (a negative control: an invalid bound must be caught)."""
    if replications < 1:
        raise ValueError(f"replications must be >= 1; got {replications!r}")
    R_os = (default_order_statistic_replications(replications) if order_statistic_replications is None
            else order_statistic_replications)
    if R_os < 1:
        raise ValueError(f"order_statistic_replications must be >= 1; got {R_os!r}")
    rows = []
    for i, a in enumerate(assertions):
        t0 = time.process_time()
        if a.kind == "mean":
            body = _calibrate_mean(a, replications, seed, i, CP_ALPHA, lcb)
        else:
            body = _calibrate_order(a, R_os, seed, i, CP_ALPHA)
        fams = {f: d for f, d in body["families"].items() if "failures" in d}
        e = body["exact_part"]
        exacts = [d["exact"] for d in fams.values() if d.get("exact") is not None]
        row = {"statement": a.statement, "label": a.label, "kind": a.kind, "estimator": a.estimator, "N": a.n,
               "delta": a.delta, **body,
               "rate": max(d["rate"] for d in fams.values()) + e,
               "lower": max(d["cp_lower"] for d in fams.values()) + e,
               "upper": max(d["cp_upper"] for d in fams.values()) + e,
               "exact": (max(exacts) + e - max(exacts) * e) if exacts else None,
               "exact_family": next((f for f, d in fams.items() if d.get("exact") is not None), None),
               "cpu_seconds": time.process_time() - t0}
        row["upper_within_delta"] = bool(row["upper"] <= a.delta)
        rows.append(row)
        if progress is not None:
            progress(i + 1, len(assertions), row)
    return {"what": "false-failure rate of every budgeted confidence-level assertion at its boundary (true mean = "
                    "bound), replicated with the assertion's own estimator, N and delta",
            "families": FAMILY_TEXT, "replications": replications, "order_statistic_replications": R_os,
            "seed": seed, "confidence": 1 - CP_ALPHA, "cap_factor": CAP_FACTOR, "delta": DELTA,
            "family_wise_budget": FAMILY_WISE_BUDGET, "rows": rows, "family_wise": _family_wise(rows)}


def _family_wise(rows: list[dict]) -> dict:
    upper = float(sum(r["upper"] for r in rows))
    lower = float(sum(r["lower"] for r in rows))
    exact = [r["exact"] for r in rows]
    n_bounds = sum(1 for r in rows for d in r["families"].values() if "failures" in d)
    alpha_each = CP_ALPHA / max(n_bounds, 1)
    simul = 0.0
    for r in rows:
        simul += max(clopper_pearson(d["failures"], d["replications"], alpha_each)[1]
                      for d in r["families"].values() if "failures" in d) + r["exact_part"]
    agree = [d["agrees_with_exact"] for r in rows for d in r["families"].values() if "agrees_with_exact" in d]
    return {
        "assertions": len(rows), "budget": FAMILY_WISE_BUDGET,
        "upper_sum": upper, "lower_sum": lower, "interval": [lower, upper],
        "rate_sum": float(sum(r["rate"] for r in rows)),
        "exact_sum": float(sum(exact)) if all(v is not None for v in exact) else None,
        "status": "shown <= 1e-3" if upper <= FAMILY_WISE_BUDGET else "not shown",
        "simultaneous": {"bounds": n_bounds, "alpha_each": alpha_each, "upper_sum": simul,
                         "status": "shown <= 1e-3" if simul <= FAMILY_WISE_BUDGET else "not shown"},
        "replications_agree_with_exact": bool(all(agree)),
    }


def run_calibration(*, replications: int = DEFAULT_REPLICATIONS, order_statistic_replications: int | None = None,
                    seed: int = DEFAULT_SEED, statement_seed: int | None = None,
                    progress: Callable[[int, int, dict], None] | None = None) -> dict:
    """The full study: :func:`budgeted_assertions` (the default run of every budgeted statement) and
    :func:`calibrate`, with the CPU seconds, wall seconds and CPU model."""
    from sim import cli
    from verification.core import registry

    c0, w0 = time.process_time(), time.perf_counter()
    assertions = budgeted_assertions(statement_seed)
    c_stmt = time.process_time() - c0
    out = calibrate(assertions, replications=replications, order_statistic_replications=order_statistic_replications,
                    seed=seed, progress=progress)
    out["statement_seed"] = registry.DEFAULT_SEED if statement_seed is None else statement_seed
    out["runtime"] = {"cpu_seconds": time.process_time() - c0, "cpu_seconds_statements": c_stmt,
                      "wall_seconds": time.perf_counter() - w0, "cpu_model": _cpu_model(), "cpu": cli.cpu_name(),
                      "python": platform.python_version(), "numpy": np.__version__}
    return out


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_calibration(path: str | Path = DATA_FILE) -> dict:
    """The committed calibration (``verification/data/mc_calibration.json``) or another result file."""
    return json.loads(Path(path).read_text(encoding="utf-8"))


# ------------------------------------------------------------------------------------------ the table


def _g(v) -> str:
    return "-" if v is None else f"{v:.3g}"


def table(result: dict) -> str:
    """The calibration as a text table: one line per assertion and family, then the family-wise sum."""
    head = ("statement", "assertion", "N", "delta", "family", "k/R", "rate", "CP upper", "exact")
    lines = []
    for r in result["rows"]:
        lab = r["label"] if len(r["label"]) <= 48 else r["label"][:45] + "..."
        n = "+".join(map(str, r["N"])) if r["kind"] == "order_statistic" else (
            str(r["N"][0]) if len(set(r["N"])) == 1 and len(r["N"]) == 1 else f"{len(r['N'])}x{max(r['N'])}")
        for fam, d in r["families"].items():
            if "failures" not in d:
                lines.append((r["statement"], lab, n, f"{r['delta']:.3g}", fam, "skipped", "-", "-", "-"))
                continue
            lines.append((r["statement"], lab, n, f"{r['delta']:.3g}", fam, f"{d['failures']}/{d['replications']}",
                          _g(d["rate"]), _g(d["cp_upper"] + r["exact_part"]),
                          _g(None if d.get("exact") is None else d["exact"] + r["exact_part"])))
    widths = [max(len(h), *(len(x[k]) for x in lines)) for k, h in enumerate(head)]
    numeric = {2, 3, 5, 6, 7, 8}

    def fmt(vals):
        return "  ".join(v.rjust(w) if k in numeric else v.ljust(w) for k, (v, w) in enumerate(zip(vals, widths,
                                                                                                 strict=True)))

    fw = result["family_wise"]
    out = [fmt(head), fmt(["-" * w for w in widths])] + [fmt(x) for x in lines]
    out.append("")
    out.append(f"family-wise ({fw['assertions']} assertions): sum of the one-sided {result['confidence']:.0%} "
               f"Clopper-Pearson upper bounds {fw['upper_sum']:.3g} (interval [{fw['lower_sum']:.3g}, "
               f"{fw['upper_sum']:.3g}]), observed {fw['rate_sum']:.3g}, exact {_g(fw['exact_sum'])} against "
               f"{fw['budget']:g}: {fw['status']}")
    sim = fw["simultaneous"]
    out.append(f"simultaneous (all {sim['bounds']} bounds at once, each at 1 - {sim['alpha_each']:.3g}): "
               f"{sim['upper_sum']:.3g}: {sim['status']}; replicated rates agree with the exact ones: "
               f"{'yes' if fw['replications_agree_with_exact'] else 'NO'}")
    return "\n".join(out)
