r"""Monte Carlo protocol for statements in expectation (THEOREMS.md §3.0, "Monte Carlo protocol").

Claim form: ``E[X] <= b`` with ``X >= 0`` (e.g. ``X = ψ_new(w_K) - ψ_new*``). From ``N`` independent runs,
fix a cap ``M = κ_M·b`` in advance and set ``Y_r = min(X_r, M) ∈ [0, M]``. Since ``E Y <= E X``, a lower
confidence bound (LCB) for ``E Y`` is one for ``E X``. The claim FAILS iff ``LCB > b``.

Two one-sided LCBs at level ``1 - δ``:

* Hoeffding: ``Ȳ - M √(ln(1/δ) / (2N))``;
* empirical Bernstein (Maurer & Pontil 2009, Thm 4): ``M·[Ȳ/M - √(2 V ln(2/δ)/N) - 7 ln(2/δ)/(3(N-1))]``
  with ``V`` the unbiased sample variance of ``Y/M``.

If the claim holds, ``P(FAIL) <= δ`` for either bound. The suite uses ``δ = 1e-4`` per assertion and at most
:data:`MAX_ASSERTIONS` = 10 Monte Carlo assertions in the default run, so the family-wise false-failure
probability is at most ``1e-3`` (Bonferroni). Everything is vectorised over runs; seeds are fixed, so a run is
deterministic and the guarantee is over the choice of seed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats

__all__ = [
    "DELTA",
    "CAP_FACTOR",
    "MAX_ASSERTIONS",
    "MCResult",
    "hoeffding_lcb",
    "bernstein_lcb",
    "mean_claim",
]

#: Per-assertion false-failure probability.
DELTA = 1e-4
#: Cap ``M = CAP_FACTOR · b`` fixed in advance.
CAP_FACTOR = 5.0
#: Monte Carlo assertions allowed in the default suite (family-wise false-failure <= MAX_ASSERTIONS·DELTA).
MAX_ASSERTIONS = 10


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


def hoeffding_lcb(y: np.ndarray, M: float, delta: float = DELTA) -> float:
    """One-sided Hoeffding lower confidence bound for the mean of ``y ∈ [0, M]`` at level ``1 - δ``."""
    _check_delta(delta)
    y = np.asarray(y, dtype=np.float64)
    return float(y.mean() - M * np.sqrt(np.log(1 / delta) / (2 * y.size)))


def bernstein_lcb(y: np.ndarray, M: float, delta: float = DELTA) -> float:
    """One-sided empirical-Bernstein lower confidence bound (Maurer–Pontil) for ``y ∈ [0, M]``."""
    _check_delta(delta)
    y = np.asarray(y, dtype=np.float64) / M
    n = y.size
    V = y.var(ddof=1)
    L = np.log(2 / delta)
    return float(M * (y.mean() - np.sqrt(2 * V * L / n) - 7 * L / (3 * (n - 1))))


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

    @property
    def tightness(self) -> float:
        """``Ȳ / b``: the observed mean against the bound."""
        return self.mean_capped / self.bound

    def to_dict(self) -> dict:
        d = asdict(self)
        d["tightness"] = self.tightness
        return d


def mean_claim(samples, bound: float, *, delta: float = DELTA, cap_factor: float = CAP_FACTOR) -> MCResult:
    """Test the claim ``E[X] <= bound`` from i.i.d. samples ``X_r >= 0``.

    FAIL iff a lower confidence bound exceeds ``bound``. Both LCBs are computed at level ``δ/2`` each so that
    using the sharper of the two keeps the false-failure probability at most ``δ`` (union bound).
    """
    y, M = _capped(samples, bound, cap_factor)
    x = np.asarray(samples, dtype=np.float64).ravel()
    h = hoeffding_lcb(y, M, delta / 2)
    b = bernstein_lcb(y, M, delta / 2)
    lcb = max(h, b)
    z = stats.norm.ppf(1 - 0.001 / 2)
    se = x.std(ddof=1) / np.sqrt(x.size)
    return MCResult(
        n=int(x.size), bound=float(bound), cap=float(M), mean=float(x.mean()), mean_capped=float(y.mean()),
        lcb_hoeffding=h, lcb_bernstein=b, lcb=lcb, ci_low=float(x.mean() - z * se),
        ci_high=float(x.mean() + z * se), delta=float(delta), failed=bool(lcb > bound),
    )
