r"""Monte Carlo protocol for statements in expectation (docs/spec/tolerances.md#monte-carlo, "Monte Carlo protocol").

Claim form: ``E[X] <= b`` with ``X >= 0`` (e.g. ``X = ψ_new(w_K) - ψ_new*``). From ``N`` independent runs,
fix a cap ``M = κ_M·b`` in advance and set ``Y_r = min(X_r, M) ∈ [0, M]``. Since ``E Y <= E X``, a lower
confidence bound (LCB) for ``E Y`` is one for ``E X``. The claim FAILS iff ``LCB > b``.

Two one-sided LCBs at level ``1 - δ``:

* Hoeffding: ``Ȳ - M √(ln(1/δ) / (2N))``;
* empirical Bernstein (Maurer & Pontil 2009, Thm 4): ``M·[Ȳ/M - √(2 V ln(2/δ)/N) - 7 ln(2/δ)/(3(N-1))]``
  with ``V`` the unbiased sample variance of ``Y/M``.

If the claim holds, ``P(FAIL) <= δ`` for either bound. Everything is vectorised over runs; seeds are fixed, so a
run is deterministic and the guarantee is over the choice of seed. The bounds are computed along the last axis of
an array (:func:`hoeffding_lcbs`, :func:`bernstein_lcbs`, :func:`protocol_lcbs`: one implementation, which the
scalar :func:`hoeffding_lcb`, :func:`bernstein_lcb` and :func:`mean_claim` call), so the calibration study
(:mod:`verification.engine.mc_calibration`) evaluates the same formulas on many replicated samples at once; inside
:func:`recorded_claims` every :func:`mean_claim` also hands its samples to the caller (nothing is stored in results).

**One family-wise budget.** Every confidence-level assertion of the default run — the Monte Carlo mean claims of
H.39-41, H.43, H.44, H.45 and Thm-A and the order-statistic tests of H.17 — shares one budget: the family-wise
false-failure probability is at most :data:`FAMILY_WISE_BUDGET` ``= 1e-3`` (Bonferroni). :data:`ASSERTIONS`
lists how many assertions each statement makes in the default run; each gets ``δ = 1e-3 / Σ ASSERTIONS``
(:func:`assertion_delta`) and records what it used in ``details["confidence_assertions"]``
(:func:`assertion_record`); the report sums them and a test checks that the sum adds up.

**Power.** Every bound passes through :func:`verification.core.evidence.scaled_bound` (the power report's factor ``f``:
the assertion is tested against ``f·b``, with the cap ``κ_M·f·b``), and :func:`crossing_factor` gives, from the
samples, the factor ``f*`` at which the lower confidence bound crosses the scaled bound: a bound too small by
``f`` is detected iff ``f < f*``. Sample sizes for power (:func:`required_runs`): to detect a bound too small by a
factor 2 with probability ``>= 1 − β`` at level ``δ`` on an instance where ``E X = b``, let ``b' = b/2``,
``M' = κ_M b'`` and ``ν = E min(X, M')/b'`` (> 1). The Hoeffding LCB at ``δ/2`` (the weaker of the two used) is
``Ȳ − M'√(ln(2/δ)/(2N))``, and ``P(Ȳ < E Y − M'√(ln(1/β)/(2N))) ≤ β`` (Hoeffding again), so the failure is
detected with probability ``>= 1 − β`` as soon as
``N >= κ_M² (√(ln(2/δ)/2) + √(ln(1/β)/2))² / (ν − 1)²``.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats

__all__ = [
    "FAMILY_WISE_BUDGET",
    "ASSERTIONS",
    "DELTA",
    "CAP_FACTOR",
    "POWER_PROBABILITY",
    "MCResult",
    "assertion_delta",
    "assertion_record",
    "hoeffding_lcb",
    "bernstein_lcb",
    "hoeffding_lcbs",
    "bernstein_lcbs",
    "protocol_lcbs",
    "RecordedClaim",
    "recorded_claims",
    "mean_claim",
    "crossing_factor",
    "required_runs",
    "chi2_capped_mean",
]

#: Family-wise false-failure probability of every confidence-level assertion of the default run together.
FAMILY_WISE_BUDGET = 1e-3
#: Confidence-level assertions of the default run, per statement (H.17: 6 problems × 2 order-statistic tests).
ASSERTIONS = {"H.17": 12, "H.39-41": 1, "H.43": 2, "H.44": 5, "H.45": 2, "ThmA": 2}
#: Per-assertion false-failure probability: the budget split evenly (Bonferroni).
DELTA = FAMILY_WISE_BUDGET / sum(ASSERTIONS.values())
#: Cap ``M = CAP_FACTOR · b`` fixed in advance.
CAP_FACTOR = 5.0
#: Probability with which a bound too small by a factor 2 must be detected on a tight instance.
POWER_PROBABILITY = 0.99


def assertion_delta(stmt_id: str) -> float:
    """The per-assertion ``δ`` of statement ``stmt_id`` (raises for a statement outside the budget)."""
    if stmt_id not in ASSERTIONS:
        raise ValueError(f"statement {stmt_id!r} has no confidence-level assertions in the budget; "
                         f"budgeted: {sorted(ASSERTIONS)}")
    return DELTA


def assertion_record(label: str, delta: float, **extra) -> dict:
    """One entry of ``details["confidence_assertions"]``: what an assertion spent of the budget."""
    _check_delta(delta)
    return {"label": str(label), "delta": float(delta), **extra}


def _capped(samples, bound: float, cap_factor: float) -> tuple[np.ndarray, float]:
    x = np.asarray(samples, dtype=np.float64).ravel()
    if x.size < 2:
        raise ValueError(f"samples must hold at least 2 runs; got {x.size}")
    if not np.all(np.isfinite(x)):
        raise ValueError("samples contain a non-finite value")
    if np.any(x < 0):
        raise ValueError(f"samples must be >= 0 (claim form E[X] <= b with X >= 0); min is {x.min()!r}")
    if not (np.isfinite(bound) and bound > 0):
        raise ValueError(f"bound must be finite and > 0; got {bound!r}")
    if not (np.isfinite(cap_factor) and cap_factor >= 1):
        raise ValueError(f"cap_factor must be >= 1; got {cap_factor!r}")
    M = cap_factor * bound
    return np.minimum(x, M), M


def _check_delta(delta: float) -> None:
    if not 0 < delta < 1:
        raise ValueError(f"delta must lie in (0, 1); got {delta!r}")


def hoeffding_lcbs(y, M: float, delta: float = DELTA) -> np.ndarray:
    """One-sided Hoeffding lower confidence bounds at level ``1 - δ`` for the mean of ``y ∈ [0, M]``, one per sample
    along the last axis of ``y`` (``(..., N)``): ``Ȳ - M √(ln(1/δ) / (2N))``."""
    _check_delta(delta)
    y = np.asarray(y, dtype=np.float64)
    return y.mean(axis=-1) - M * np.sqrt(np.log(1 / delta) / (2 * y.shape[-1]))


def bernstein_lcbs(y, M: float, delta: float = DELTA) -> np.ndarray:
    """One-sided empirical-Bernstein lower confidence bounds (Maurer–Pontil) for ``y ∈ [0, M]``, one per sample
    along the last axis of ``y`` (``(..., N)``)."""
    _check_delta(delta)
    y = np.asarray(y, dtype=np.float64) / M
    n = y.shape[-1]
    V = y.var(axis=-1, ddof=1)
    L = np.log(2 / delta)
    return M * (y.mean(axis=-1) - np.sqrt(2 * V * L / n) - 7 * L / (3 * (n - 1)))


def protocol_lcbs(y, M: float, delta: float = DELTA) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The protocol's bounds of capped samples ``y ∈ [0, M]`` along the last axis: ``(Hoeffding, Bernstein, their
    maximum)``, each bound at ``δ/2`` (so the maximum, the LCB :func:`mean_claim` tests, is valid at ``1 - δ``)."""
    h = hoeffding_lcbs(y, M, delta / 2)
    b = bernstein_lcbs(y, M, delta / 2)
    return h, b, np.maximum(h, b)


def hoeffding_lcb(y: np.ndarray, M: float, delta: float = DELTA) -> float:
    """One-sided Hoeffding lower confidence bound for the mean of ``y ∈ [0, M]`` at level ``1 - δ``."""
    return float(hoeffding_lcbs(np.ravel(y), M, delta))


def bernstein_lcb(y: np.ndarray, M: float, delta: float = DELTA) -> float:
    """One-sided empirical-Bernstein lower confidence bound (Maurer–Pontil) for ``y ∈ [0, M]``."""
    return float(bernstein_lcbs(np.ravel(y), M, delta))


def _lcbs_over_factors(x_sorted: np.ndarray, bound: float, factors: np.ndarray, delta: float,
                      cap_factor: float) -> np.ndarray:
    """max(Hoeffding, Bernstein) LCB (each at ``δ/2``) of ``E min(X, κ f b)`` for every ``f`` in ``factors``."""
    n = x_sorted.size
    M = cap_factor * factors * bound
    k = np.searchsorted(x_sorted, M, side="right")  # samples below the cap
    c1 = np.concatenate([[0.0], np.cumsum(x_sorted)])
    c2 = np.concatenate([[0.0], np.cumsum(x_sorted**2)])
    s1 = c1[k] + M * (n - k)  # Σ min(x, M)
    s2 = c2[k] + M**2 * (n - k)
    ybar = s1 / n
    d = delta / 2
    hoef = ybar - M * np.sqrt(np.log(1 / d) / (2 * n))
    m1, m2 = ybar / M, s2 / (n * M**2)
    var = np.maximum(m2 - m1**2, 0.0) * n / (n - 1)
    L = np.log(2 / d)
    bern = M * (m1 - np.sqrt(2 * var * L / n) - 7 * L / (3 * (n - 1)))
    return np.maximum(hoef, bern)


def crossing_factor(samples, bound: float, *, delta: float = DELTA, cap_factor: float = CAP_FACTOR) -> float:
    """The factor ``f*`` at which the lower confidence bound of ``E X`` crosses the scaled bound ``f·b`` (the
    cap scales with it, ``κ_M f b``): the largest ``f`` of a log grid of ``[1e-4, 1e3]`` (20 points per decade,
    refined twice by 64-point grids: relative precision ``< 1e-4``) with ``LCB(f) > f·b``; 0 when none. A bound
    too small by ``f`` is detected iff ``f < f*``; the claim itself fails iff ``f* > 1``."""
    x = np.sort(np.asarray(samples, dtype=np.float64).ravel())
    grid = np.geomspace(1e-4, 1e3, 141)
    for _ in range(3):
        fails = _lcbs_over_factors(x, bound, grid, delta, cap_factor) > grid * bound
        if not fails.any():
            return 0.0
        i = int(np.flatnonzero(fails)[-1])
        if i == grid.size - 1:
            return float(grid[-1])
        grid = np.geomspace(grid[i], grid[i + 1], 64)  # fails at the first point, not at the last
    return float(grid[0])


def required_runs(nu: float, delta: float = DELTA, *, power: float = POWER_PROBABILITY,
                  cap_factor: float = CAP_FACTOR) -> int:
    """Runs that detect a bound too small by 2 with probability ``>= power`` at level ``δ`` (module docstring):
    ``N = ⌈κ_M² (√(ln(2/δ)/2) + √(ln(1/(1 − power))/2))² / (ν − 1)²⌉`` with ``ν = E min(X, κ_M b')/b'`` and
    ``b' = b/2`` the halved bound (``ν > 1`` is needed: the capped mean must exceed the halved bound)."""
    _check_delta(delta)
    if not (0.0 < power < 1.0):
        raise ValueError(f"power must lie in (0, 1); got {power!r}")
    if not (np.isfinite(nu) and nu > 1.0):
        raise ValueError(f"nu = E min(X, cap)/b' must exceed 1 for a halved bound to be detectable; got {nu!r}")
    z = np.sqrt(np.log(2 / delta) / 2) + np.sqrt(np.log(1 / (1 - power)) / 2)
    return int(np.ceil(cap_factor**2 * z**2 / (nu - 1.0) ** 2))


def chi2_capped_mean(a: float) -> float:
    """``E min(χ²₁, a) = P(χ²₃ ≤ a) + a P(χ²₁ > a)`` (``E[ξ² 1{ξ² ≤ a}] = P(χ²₃ ≤ a)`` for ``ξ ~ N(0, 1)``)."""
    return float(stats.chi2.cdf(a, 3) + a * stats.chi2.sf(a, 1))


@dataclass(frozen=True)
class MCResult:
    """Outcome of one Monte Carlo assertion ``E[X] <= bound``."""

    n: int
    bound: float
    cap: float
    mean: float  # mean of the uncapped X
    mean_capped: float
    lcb_hoeffding: float
    lcb_bernstein: float
    lcb: float  # the larger (sharper) of the two: each is valid at level 1 - δ, so their max is valid at 1 - 2δ
    ci_low: float  # two-sided 99.9 % interval of E[X] (normal approximation), reported only
    ci_high: float
    delta: float
    failed: bool
    crossing: float = 0.0  # the factor at which the LCB crosses the scaled bound (crossing_factor)
    factor: float = 1.0  # the bound factor in force (the assertion was tested against factor · b)

    @property
    def tightness(self) -> float:
        """``Ȳ / b``: the observed mean against the bound."""
        return self.mean_capped / self.bound

    def to_dict(self) -> dict:
        d = asdict(self)
        d["tightness"] = self.tightness
        return d


@dataclass(frozen=True)
class RecordedClaim:
    """One :func:`mean_claim` call seen by :func:`recorded_claims`: its samples (a copy) and its result."""

    samples: np.ndarray
    result: MCResult


_RECORDED: contextvars.ContextVar[list | None] = contextvars.ContextVar("recorded_claims", default=None)


@contextlib.contextmanager
def recorded_claims() -> Iterator[list[RecordedClaim]]:
    """Within the block, every :func:`mean_claim` call appends a :class:`RecordedClaim` to the yielded list, in call
    order: how the calibration study reads each claim's own samples from a default run without storing them in
    its results."""
    log: list[RecordedClaim] = []
    token = _RECORDED.set(log)
    try:
        yield log
    finally:
        _RECORDED.reset(token)


def mean_claim(samples, bound: float, *, delta: float = DELTA, cap_factor: float = CAP_FACTOR,
               with_crossing: bool = True) -> MCResult:
    """Test the claim ``E[X] <= bound`` from i.i.d. samples ``X_r >= 0``.

    FAIL iff a lower confidence bound exceeds ``bound``. Both LCBs are computed at level ``δ/2`` each so that
    using the sharper of the two keeps the false-failure probability at most ``δ`` (union bound). The bound passes
    through :func:`verification.core.evidence.scaled_bound` (the power report's factor; the identity by default), and
    ``crossing`` is the factor at which the LCB crosses it (:func:`crossing_factor`, relative to ``bound``; NaN
    with ``with_crossing=False``, for repeated calls in tests of the protocol itself).
    """
    from verification.core.evidence import active_bound_factor, scaled_bound

    _capped(samples, bound, cap_factor)  # validates the unscaled claim
    crossing = (crossing_factor(samples, bound, delta=delta, cap_factor=cap_factor) if with_crossing
                else float("nan"))
    bound = scaled_bound(float(bound))
    y, M = _capped(samples, bound, cap_factor)
    x = np.asarray(samples, dtype=np.float64).ravel()
    h, b, lcb = (float(v) for v in protocol_lcbs(y, M, delta))
    z = stats.norm.ppf(1 - 0.001 / 2)
    se = x.std(ddof=1) / np.sqrt(x.size)
    res = MCResult(
        n=int(x.size), bound=float(bound), cap=float(M), mean=float(x.mean()), mean_capped=float(y.mean()),
        lcb_hoeffding=h, lcb_bernstein=b, lcb=lcb, ci_low=float(x.mean() - z * se),
        ci_high=float(x.mean() + z * se), delta=float(delta), failed=bool(lcb > bound),
        crossing=crossing, factor=active_bound_factor(),
    )
    log = _RECORDED.get()
    if log is not None:
        log.append(RecordedClaim(samples=x.copy(), result=res))
    return res
