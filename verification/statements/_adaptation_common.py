r"""Shared helpers of the new-client adaptation statements H.39–H.45 and Thm-A (THEOREMS.md §1.9, §3.0 F3).

Everything here is built on :class:`sim.problems.CommonMinimizer` (family F3: ``ψ_new(w) = t + λ_{j*} q(w)``,
``q(w) = ½‖w − c‖²_Q``, stochastic direction ``d̃ = λ_{j*}(Q(w − c) + ξ̄_S)``), whose constants are exact:
``L₀ = λ_{j*}‖Q‖``, ``μ_PL = μ = λ_{j*}λ_min(Q)``, ``σ₀² = λ_{j*}² tr Σ_ξ``, ``ψ_new* = t``, ``w_new* = c``.

* eq 89–91 right-hand sides (:func:`rhs_91`, :func:`floor_term`), the step condition ``α ≤ p₋/(L₀p₊²)``;
* exact moments for a deterministic ``P`` (the problem's :meth:`~CommonMinimizer.moment_recursion`) and, for the
  biased-direction negative control only, the same recursion with a constant bias (:func:`exact_moments`);
* a run engine vectorised over Monte Carlo runs (:func:`run_adaptation`) for ``P_k ∈`` {identity, fixed,
  lagged RMSprop (``P_k`` from ``v_{k−1}``: 𝓕_k-measurable), RMSprop from the current sample (AdamW-style: not
  measurable)}. The lagged RMSprop is the formula of :func:`sim.algorithm.pipeline1`
  (``preconditioner="rmsprop_lagged"``, :func:`sim.algorithm.rmsprop_diagonal`: relative to the directions' own
  scale, clipped to ``[p₋, p₊]``); :func:`pipeline1_crosscheck` runs ``pipeline1`` itself on the same
  noise through a small adapter (:class:`F3Runs`, :class:`F3Batches`) and compares the trajectories;
* the non-measurable adversarial preconditioner of T-H43(e)(2) on the 1-D instance (:func:`run_adversarial_1d`);
* the F3-compatible F1-type cluster of T-H44(a) and its Phase-1/Phase-2 outputs ``w_I``, ``w_II`` from
  :func:`sim.algorithm.phase1` / :func:`sim.algorithm.phase2`, with the eq 92 quantities (:func:`cluster_starts`);
* ``L_β`` (O-12, §1.11) and a Hotelling test of a mean vector; Monte Carlo bookkeeping (:func:`mc_record`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
from scipy import stats

from sim.algorithm import (
    CLIPPED_PRECONDITIONERS,
    AdaptConfig,
    ClientSource,
    Phase1Config,
    Phase2Config,
    PreconditionerState,
    clip_shares,
    phase1,
    phase2,
    pipeline1,
    preconditioned_step,
)
from sim.constants import descent_margin_constants, loss_bound_at_optima
from sim.preference import adjustment, normalizer
from sim.problems import CommonMinimizer, PlantedQuadraticCluster
from verification.evidence import Evidence, check_inequality, to_jsonable
from verification.montecarlo import (
    CAP_FACTOR,
    MCResult,
    assertion_record,
    chi2_capped_mean,
    mean_claim,
    required_runs,
)

KINDS = ("identity", "fixed", "rmsprop_lagged", "rmsprop_current")
#: preconditioners whose ``P_k`` is computed from ``𝓕_k`` only (H.41(a) by construction)
MEASURABLE_KINDS = ("identity", "fixed", "rmsprop_lagged")


# ----------------------------------------------------------------------------------------------- instances


def one_dim_instance(w0: float = 3.0, noise_var: float = 1.0) -> CommonMinimizer:
    """The 1-D F3 instance ``ψ = 1 + ½w²`` (``Q = 1``, ``λ = (1)``, ``t = 1``, ``c = 0``, ``Σ_ξ = noise_var``):
    ``L₀ = μ_PL = 1``, ``σ₀² = noise_var``."""
    return CommonMinimizer(np.eye(1), np.zeros(1), np.array([1.0]), 1.0, np.array([[noise_var]]),
                           np.array([float(w0)]))


def isotropic(prob: CommonMinimizer) -> CommonMinimizer:
    """``prob`` with ``Q = I`` (condition number 1): ``L₀ = μ_PL = λ_{j*}``, so with ``P = I`` and
    ``α = 1/L₀`` the iteration reaches ``c`` up to noise in one step and eq 90/91 hold with equality for ``K ≥ 1``
    (``E gap_K = ½α²λ³ tr Σ/S`` = the floor ``L₀ασ₀²/(2μS)``)."""
    return dataclasses.replace(prob, hessian=np.eye(prob.n_params))


def random_orthogonal(rng: np.random.Generator, n: int) -> np.ndarray:
    """Haar orthogonal matrix (QR of a Gaussian matrix with the sign fix)."""
    A = rng.standard_normal((n, n))
    Qm, R = np.linalg.qr(A)
    return Qm * np.sign(np.diag(R))


def spectral_preconditioner(U: np.ndarray, p_minus: float, p_plus: float) -> np.ndarray:
    """``P = U diag(linspace(p₋, p₊, n)) Uᵀ`` (symmetric, spectrum exactly ``[p₋, p₊]``)."""
    n = U.shape[0]
    P = (U * np.linspace(p_minus, p_plus, n)) @ U.T
    return 0.5 * (P + P.T)


# ----------------------------------------------------------------------------------------------- eq 89–91


def alpha_max(prob: CommonMinimizer, p_minus: float, p_plus: float) -> float:
    """Largest step of H.43/H.44: ``p₋/(L₀p₊²)``."""
    return float(p_minus / (prob.L0 * p_plus**2))


def rate(prob: CommonMinimizer, alpha: float, p_minus: float) -> float:
    """Contraction factor ``1 − αμ_PL p₋``."""
    return float(1.0 - alpha * prob.mu_pl * p_minus)


def floor_term(prob: CommonMinimizer, alpha: float, S: int, p_minus: float, p_plus: float) -> float:
    """Statistical floor ``L₀αp₊²σ₀²/(2μ_PL p₋ S)`` of eq 90/91."""
    return float(prob.L0 * alpha * p_plus**2 * prob.sigma0_sq / (2.0 * prob.mu_pl * p_minus * S))


def rhs_91(prob: CommonMinimizer, alpha: float, S: int, K: int, p_minus: float, p_plus: float,
           delta0: float) -> np.ndarray:
    """``(1 − αμ_PL p₋)^k Δ₀ + L₀αp₊²σ₀²/(2μ_PL p₋ S)`` for ``k = 0..K`` (eq 90/91, Thm-A's ``δ₀``)."""
    k = np.arange(K + 1)
    return rate(prob, alpha, p_minus) ** k * float(delta0) + floor_term(prob, alpha, S, p_minus, p_plus)


def rhs_89(prob: CommonMinimizer, alpha: float, S: int, p_minus: float, p_plus: float, gap) -> np.ndarray:
    """One-step bound eq 89: ``(1 − αμ_PL p₋) r + L₀α²p₊²σ₀²/(2S)``."""
    return (rate(prob, alpha, p_minus) * np.asarray(gap, dtype=np.float64)
            + prob.L0 * alpha**2 * p_plus**2 * prob.sigma0_sq / (2.0 * S))


def gap_of(prob: CommonMinimizer, W) -> np.ndarray:
    """``ψ_new(w) − ψ_new* = λ_{j*} q(w)`` (exact F3 identity, free of the ``t``-cancellation round-off)."""
    e = np.asarray(W, dtype=np.float64) - prob.centre
    return 0.5 * prob.lam_star * np.einsum("...a,ab,...b->...", e, prob.hessian, e)


def exact_moments(prob: CommonMinimizer, alpha: float, S: int, K: int, P=None, w0=None, bias=None):
    """Exact mean ``(K+1, n)`` and second moment ``(K+1, n, n)`` of ``e_k = w_k − c``.

    Without ``bias`` this is :meth:`CommonMinimizer.moment_recursion`. With a constant bias ``b`` in the
    direction (``d̃ = ∇ψ + b + λ_{j*}ξ̄_S``; negative controls only): ``m_{k+1} = T m_k − αPb``,
    ``C_{k+1} = T C_k Tᵀ + α²λ²PΣ_ξP/S`` (covariance), second moment ``C + m mᵀ``."""
    if bias is None:
        return prob.moment_recursion(alpha, S, K, P, w0)
    n = prob.n_params
    P = np.eye(n) if P is None else np.asarray(P, dtype=np.float64)
    w0 = prob.w0 if w0 is None else np.asarray(w0, dtype=np.float64)
    b = np.broadcast_to(np.asarray(bias, dtype=np.float64), (n,))
    lam = prob.lam_star
    T = np.eye(n) - alpha * lam * P @ prob.hessian
    noise = (alpha * lam) ** 2 * P @ prob.noise_cov @ P / S
    mean = np.empty((K + 1, n))
    second = np.empty((K + 1, n, n))
    m, C = w0 - prob.centre, np.zeros((n, n))
    for k in range(K + 1):
        mean[k], second[k] = m, C + np.outer(m, m)
        m, C = T @ m - alpha * P @ b, T @ C @ T.T + noise
    return mean, second


def exact_gap(prob: CommonMinimizer, alpha: float, S: int, K: int, P=None, w0=None, bias=None) -> np.ndarray:
    """``E ψ_new(w_k) − ψ_new* = ½λ_{j*} tr(Q M_k)``, ``k = 0..K`` (exact)."""
    if bias is None:
        return prob.expected_gap(alpha, S, K, P, w0)
    _, M = exact_moments(prob, alpha, S, K, P, w0, bias)
    return 0.5 * prob.lam_star * np.einsum("ab,kba->k", prob.hessian, M)


def exact_sq_dist(prob: CommonMinimizer, alpha: float, S: int, K: int, P=None, w0=None) -> np.ndarray:
    """``E‖w_k − c‖² = tr M_k``, ``k = 0..K`` (exact)."""
    _, M = prob.moment_recursion(alpha, S, K, P, w0)
    return np.trace(M, axis1=1, axis2=2)


def gaussian_endpoint_samples(prob: CommonMinimizer, rng, alpha: float, S: int, K: int, P, w0, n: int):
    """Exact samples of ``w_K`` for a deterministic ``P``: ``w_K`` is Gaussian with the exact mean and covariance
    of the moment recursion (the noise is Gaussian and the map is affine)."""
    mean, M = prob.moment_recursion(alpha, S, K, P, w0)
    m = mean[K]
    C = M[K] - np.outer(m, m)
    ev, U = np.linalg.eigh(0.5 * (C + C.T))
    root = U * np.sqrt(np.maximum(ev, 0.0))
    return prob.centre + m + rng.standard_normal((n, prob.n_params)) @ root.T


# ----------------------------------------------------------------------------------------------- runs


@dataclass(frozen=True, eq=False)
class AdaptRuns:
    """Vectorised Pipeline-1 runs: iterates ``W`` ``(K+1, N, n)``, gaps ``ψ_new(w_k) − ψ*`` ``(K+1, N)``,
    spectrum bounds of ``P_k`` ``p_min``, ``p_max`` ``(K, N)``; ``kind``, ``alpha``, ``S``; ``P_last``: the
    diagonal ``P_k`` of the last step (RMSprop kinds) ``(N, n)``; ``p_at_lower``, ``p_at_upper`` ``(K, N)``: the
    share of coordinates of ``P_k`` at ``p₋`` / ``p₊`` (:func:`sim.algorithm.clip_shares`, as ``pipeline1``'s
    records; NaN for the kinds without clips)."""

    W: np.ndarray
    gaps: np.ndarray
    p_min: np.ndarray
    p_max: np.ndarray
    kind: str
    alpha: float
    S: int
    P_last: np.ndarray | None
    p_at_lower: np.ndarray | None = None
    p_at_upper: np.ndarray | None = None

    @property
    def w_K(self) -> np.ndarray:
        return self.W[-1]


def run_adaptation(prob: CommonMinimizer, rng, *, alpha: float, S: int, K: int, n_runs: int,
                   kind: str = "identity", p_minus: float = 1.0, p_plus: float = 1.0, P=None, w0=None,
                   bias=None, noise=None, beta2: float | None = None, eps: float | None = None) -> AdaptRuns:
    """``K`` steps of eq 88, ``w_{k+1} = w_k − αP_k d̃(w_k)``, for ``n_runs`` independent runs at once.

    ``d̃ = λ_{j*}(Q(w − c) + ξ̄_S)`` from :meth:`CommonMinimizer.sample_direction` (fresh batch each step), plus
    ``bias`` if given; ``noise`` ``(K, N, n)`` supplies ``ξ̄_S`` explicitly (cross-check with ``pipeline1``).
    ``kind``: ``identity``; ``fixed`` (``P``); ``rmsprop_lagged`` — ``P_k = diag(clip(1/(r_j/s + eps), p₋, p₊))``
    with ``r_j = √v_{k−1,j}``, ``s = mean_j r_j`` (:func:`sim.algorithm.rmsprop_diagonal`: scale-invariant),
    ``v_k = β₂v_{k−1} + (1−β₂)d̃_k²``, ``P_0 = clip(1)·I``: the formula of :func:`sim.algorithm.pipeline1`, computed
    *before* the step's batch is drawn; ``rmsprop_current`` — the same with ``v_k`` (current sample included, as
    AdamW): not 𝓕_k-measurable. Each step is one call of :func:`sim.algorithm.preconditioned_step`.
    ``beta2``/``eps`` default to :class:`sim.algorithm.AdaptConfig`'s."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}; got {kind!r}")
    dflt = AdaptConfig()
    b2 = dflt.beta2 if beta2 is None else float(beta2)
    ep = dflt.eps if eps is None else float(eps)
    n = prob.n_params
    w = np.array(np.broadcast_to(prob.w0 if w0 is None else w0, (n_runs, n)), dtype=np.float64)
    W = np.empty((K + 1, n_runs, n))
    W[0] = w
    pmin = np.empty((K, n_runs))
    pmax = np.empty((K, n_runs))
    at_lo = np.full((K, n_runs), np.nan)
    at_hi = np.full((K, n_runs), np.nan)
    lam, c, Q = prob.lam_star, prob.centre, prob.hessian
    if kind == "fixed":
        if P is None:
            raise ValueError("kind='fixed' needs P")
        P = np.asarray(P, dtype=np.float64)
    state = PreconditionerState.zeros((n_runs, n))
    pdiag = None
    for k in range(K):
        if noise is None:
            d = prob.sample_direction(rng, w, S)
        else:
            d = lam * ((w - c) @ Q + noise[k])
        if bias is not None:
            d = d + bias
        w, pd_ = preconditioned_step(w, d, k, state, preconditioner=kind, alpha=alpha, P=P, p_minus=p_minus,
                                     p_plus=p_plus, beta2=b2, eps=ep)
        pmin[k], pmax[k] = pd_.min(axis=1), pd_.max(axis=1)
        if kind in CLIPPED_PRECONDITIONERS:
            pdiag = pd_
            at_lo[k], at_hi[k] = clip_shares(pd_, p_minus, p_plus)
        W[k + 1] = w
    return AdaptRuns(W=W, gaps=gap_of(prob, W), p_min=pmin, p_max=pmax, kind=kind, alpha=float(alpha), S=int(S),
                     P_last=None if pdiag is None else pdiag.copy(), p_at_lower=at_lo, p_at_upper=at_hi)


def run_adversarial_1d(rng, *, n_runs: int, K: int, w0: float, alpha: float, p_minus: float, p_plus: float,
                       S: int = 1, noise_sd: float = 1.0, chunk: int = 500, measurable: bool = False):
    """T-H43(e)(2) on ``ψ = 1 + ½w²`` (``d̃ = w + ξ̄_S``): ``P_k = p₊`` if ``d̃_k w_k < 0`` else ``p₋`` — chosen
    from the *current* sample (H.41(a) broken; the spectrum stays in ``[p₋, p₊]``). ``measurable=True`` uses
    ``d̃_{k−1}`` instead (lagged: 𝓕_k-measurable). Returns ``(w_K (N,), P_0 (N,))``."""
    w = np.full(n_runs, float(w0))
    prev = np.zeros(n_runs)
    P0 = None
    sd = noise_sd / np.sqrt(S)
    for k0 in range(0, K, chunk):
        Z = rng.standard_normal((min(chunk, K - k0), n_runs)) * sd
        for z in Z:
            d = w + z
            s = prev * w if measurable else d * w
            P = np.where(s < 0.0, p_plus, p_minus)
            if P0 is None:
                P0 = P.copy()
            prev = d
            w = w - alpha * P * d
    return w, P0


# ----------------------------------------------------------------------------------------------- pipeline1 adapter


@dataclass(frozen=True, eq=False)
class F3Runs:
    """:class:`sim.algorithm.ClientProblem` view of ``n_runs`` independent copies ("clients") of an F3 new
    client (preference ``λ_new``, ``ψ* = t``): population losses and gradients are F3's."""

    prob: CommonMinimizer
    n_runs: int

    @property
    def prefs(self) -> np.ndarray:
        return np.broadcast_to(self.prob.prefs, (self.n_runs, self.prob.n_objectives)).copy()

    @property
    def psi_star(self) -> np.ndarray:
        return np.full(self.n_runs, self.prob.psi_star)

    @property
    def n_clients(self) -> int:
        return self.n_runs

    @property
    def n_params(self) -> int:
        return self.prob.n_params

    @property
    def n_objectives(self) -> int:
        return self.prob.n_objectives

    def losses_per_client(self, w) -> np.ndarray:
        return self.prob.losses(w)

    def grads_per_client(self, w) -> np.ndarray:
        return self.prob.grads(w)


@dataclass(frozen=True, eq=False)
class F3Batches:
    """:class:`sim.algorithm.SampleData` for :class:`F3Runs`: client ``r`` holds samples ``ξ_{r,s} ~ N(0, Σ_ξ)``;
    the batch gradient of every objective is ``Q(w − c) + ξ̄`` (so the Chebyshev direction on the batch is
    ``λ_{j*}(Q(w − c) + ξ̄)``, F3's ``d̃``); the batch *losses* are the population losses, so the batch
    bottleneck is the population bottleneck ``j*`` (the H.39/H.43 idealisation, O-25)."""

    problem: F3Runs
    noise: np.ndarray  # (N, n_samples, n_w)

    @property
    def n_samples(self) -> np.ndarray:
        return np.full(self.noise.shape[0], self.noise.shape[1])

    def sample_losses(self, w, client, idx=None) -> np.ndarray:
        return self.problem.prob.losses(w)

    def sample_grads(self, w, client, idx=None) -> np.ndarray:
        xi = self.noise[int(client)]
        xbar = xi.mean(axis=0) if idx is None else xi[np.asarray(idx)].mean(axis=-2)
        g = (np.asarray(w, dtype=np.float64) - self.problem.prob.centre) @ self.problem.prob.hessian + xbar
        return np.repeat(g[..., :, None], self.problem.prob.n_objectives, axis=-1)

    def episode(self, rng, client, size: int) -> np.ndarray:
        return np.sort(rng.choice(self.noise.shape[1], size=int(size), replace=False))


def pipeline1_crosscheck(prob: CommonMinimizer, rng, *, alpha: float, S: int, K: int, n_runs: int, kind: str,
                         p_minus: float, p_plus: float, P=None) -> dict:
    """Run :func:`sim.algorithm.pipeline1` (``direction="chebyshev"``, preconditioner ``kind``) and
    :func:`run_adaptation` on the same noise; return the largest trajectory difference and ``pipeline1``'s
    recorded spectrum bounds ``p_min``, ``p_max`` of ``P_k`` ``(K, N)`` and the largest difference between the
    recorded clip shares ``p_at_lower``, ``p_at_upper`` and those of the vectorised runs (0 where both are NaN)."""
    ev, U = np.linalg.eigh(prob.noise_cov)
    xi = rng.standard_normal((n_runs, K * S, prob.n_params)) @ (U * np.sqrt(np.maximum(ev, 0.0))).T
    runs = F3Runs(prob, n_runs)
    src = ClientSource(runs, F3Batches(runs, xi))
    batches = np.broadcast_to(np.arange(K * S).reshape(K, S), (n_runs, K, S))
    cfg = AdaptConfig(K=K, S=S, alpha_adapt=alpha, preconditioner=kind, p_minus=p_minus, p_plus=p_plus,
                      direction="chebyshev", P=P)
    res = pipeline1(src, np.arange(n_runs), prob.w0, cfg, batches=batches)
    noise = xi.reshape(n_runs, K, S, prob.n_params).mean(axis=2).transpose(1, 0, 2)
    mine = run_adaptation(prob, rng, alpha=alpha, S=S, K=K, n_runs=n_runs, kind=kind, p_minus=p_minus,
                          p_plus=p_plus, P=P, noise=noise)
    rec = res.records[res.records["local_steps"] == 1].sort_values(["round", "client"])
    scale = max(1.0, float(np.abs(mine.W).max()))
    shares = []
    for col, arr in (("p_at_lower", mine.p_at_lower), ("p_at_upper", mine.p_at_upper)):
        a, b = rec[col].to_numpy(np.float64).reshape(K, n_runs), arr
        diff = np.where(np.isnan(a) & np.isnan(b), 0.0, np.abs(a - b))
        shares.append(float(np.max(np.where(np.isnan(diff), np.inf, diff), initial=0.0)))  # NaN on one side: inf
    return {
        "max_abs_diff": float(np.abs(res.trajectory - mine.W).max()),
        "scale": scale,
        "p_min": rec["p_min"].to_numpy().reshape(K, n_runs),
        "p_max": rec["p_max"].to_numpy().reshape(K, n_runs),
        "clip_share_diff": max(shares),
        "p_at_lower": rec["p_at_lower"].to_numpy(np.float64).reshape(K, n_runs),
        "p_at_upper": rec["p_at_upper"].to_numpy(np.float64).reshape(K, n_runs),
    }


# ----------------------------------------------------------------------------------------------- statistics


def hotelling(X: np.ndarray, mean0, delta: float) -> dict:
    """Hotelling T² test of ``E X = mean0`` from i.i.d. rows ``X`` ``(N, p)`` (exact for Gaussian rows):
    ``F = (N − p)/(p(N − 1)) · N(x̄ − mean0)ᵀŜ⁻¹(x̄ − mean0) ~ F(p, N − p)``; reject iff ``F > F_{1−δ}``."""
    X = np.asarray(X, dtype=np.float64)
    N, p = X.shape
    d = X.mean(axis=0) - np.asarray(mean0, dtype=np.float64)
    Sh = np.atleast_2d(np.cov(X, rowvar=False))
    T2 = float(N * d @ np.linalg.solve(Sh, d))
    F = (N - p) / (p * (N - 1)) * T2
    crit = float(stats.f.ppf(1.0 - delta, p, N - p))
    return {"F": F, "F_crit": crit, "p_value": float(stats.f.sf(F, p, N - p)), "N": N, "dim": p,
            "delta": float(delta), "max_abs_mean_error": float(np.abs(d).max()), "rejected": bool(F > crit)}


def mc_record(label: str, res: MCResult, **extra) -> dict:
    """One Monte Carlo assertion for ``details["mc_assertions"]``."""
    d = res.to_dict()
    d.update(label=label, **extra)
    return to_jsonable(d)


def mc_claim(label: str, samples, bound: float, *, delta: float, **extra) -> tuple[MCResult, dict]:
    res = mean_claim(samples, bound, delta=delta)
    return res, mc_record(label, res, **extra)


#: Why the lagged-RMSprop Monte Carlo rows cannot approach their bound (power report and dashboard).
MC_RMSPROP_REASON = (
    "the bound's floor L0 alpha p+^2 sigma0^2/(2 mu_PL p- S) with alpha = p-/(L0 p+^2) equals sigma0^2/(2 mu_PL S) "
    "whatever the preconditioner, while the realised steps alpha P_k <= p-/(L0 p+) are shorter by up to p+/p-, and "
    "on the reference F3 instance (kappa_Q = 6) contraction at mu_PL and noise at L0 cost another factor (the "
    "stored falsification search's best ratio over (p+/p-, S, K) is shown beside this reason). The tight instance of the same claim (Q = I, P = I, "
    "alpha = 1/L0: E X = b) is run by Monte Carlo in this statement and detects a bound too small by 2")


#: ``ν = E min(X, κ_M b')/b'`` of the tight instance against a halved bound ``b' = b/2``: ``X = bξ²`` with
#: ``ξ ~ N(0, 1)``, so ``ν = 2 E min(χ²₁, κ_M/2)`` (:func:`verification.montecarlo.chi2_capped_mean`) ``≈ 1.618``.
TIGHT_NU = 2.0 * chi2_capped_mean(CAP_FACTOR / 2.0)
TIGHT_K = 5


def tight_mc(rows: Rows, rng, label: str, *, quantity: str, delta: float, conclusion: str | None = None,
             K: int = TIGHT_K, soft: bool = False) -> tuple[dict, dict]:
    """A Monte Carlo assertion on an instance where the expectation *equals* its bound, with a sample size that
    detects a bound too small by 2 with probability ``>= 0.99`` at the assertion's ``δ``.

    Instance: the 1-D F3 problem ``ψ = 1 + ½w²`` (``L₀ = μ_PL = μ = σ₀² = 1``), ``S = 1``, ``P = I``
    (``p₋ = p₊ = 1``), ``α = p₋/(L₀p₊²) = 1``: then ``w_{k+1} = w_k − (w_k + ξ_k) = −ξ_k``, so for every ``K ≥ 1``
    ``ψ(w_K) − ψ* = ½ξ²`` with mean ``½`` = RHS91 (``(1 − αμp₋)^K Δ₀ = 0`` plus the floor ``½``), and
    ``‖w_K − c‖² = ξ²`` with mean ``1 = (2/μ)·RHS91``. Both are ``X = bξ²``: ``ν`` = :data:`TIGHT_NU` and
    ``N = required_runs(ν, δ)`` (:func:`verification.montecarlo.required_runs`: ``N ≥ κ_M²(√(ln(2/δ)/2) +
    √(ln 100/2))²/(ν − 1)²``). ``quantity``: ``"gap"`` (eq 90/91/Thm-A's δ₀) or ``"sq_dist"`` (eq 93/96).
    The run uses :func:`run_adaptation` (the engine of every other Monte Carlo row)."""
    if quantity not in ("gap", "sq_dist"):
        raise ValueError(f"quantity must be 'gap' or 'sq_dist'; got {quantity!r}")
    p1 = one_dim_instance(w0=3.0, noise_var=1.0)
    n_runs = required_runs(TIGHT_NU, delta)
    runs = run_adaptation(p1, rng, alpha=1.0, S=1, K=K, n_runs=n_runs, kind="identity", p_minus=1.0, p_plus=1.0)
    b91 = float(rhs_91(p1, 1.0, 1, K, 1.0, 1.0, float(gap_of(p1, p1.w0)))[-1])
    if quantity == "gap":
        X, b = runs.gaps[-1], b91
    else:
        X, b = np.sum((runs.w_K - p1.centre) ** 2, axis=1), 2.0 / p1.mu_pl * b91
    res, rec = mc_claim(label, X, b, delta=delta, N=n_runs, nu=TIGHT_NU)
    hyp, mg = adaptation_hyps(p1, alpha=1.0, p_minus=1.0, p_plus=1.0, spec_min=runs.p_min.min(),
                              spec_max=runs.p_max.max())
    h39 = h39_along(p1, runs.W)
    hyp.update({H_BN: bool(h39["bottleneck_ok"].all()), H_PL: bool(pl_ok(h39).all())})
    rows.add_mc(label, res, conclusion=conclusion, hyp=hyp, margins=mg, P="identity", S=1, K=K, alpha=1.0,
                N=n_runs, soft=soft)
    power = {"instance": "psi = 1 + w^2/2, alpha = S = P = 1: X = b xi^2, E X = b (tight)", "N": n_runs,
             "nu": TIGHT_NU, "delta": delta,
             "rule": "N >= kappa_M^2 (sqrt(ln(2/delta)/2) + sqrt(ln(100)/2))^2 / (nu - 1)^2 detects b/2 w.p. >= 0.99"}
    return rec | {"power": power}, assertion_record(label, delta, N=n_runs, tight=True)


# ----------------------------------------------------------------------------------------------- H.39 along iterates


def h39_along(prob: CommonMinimizer, W) -> dict:
    """H.39 at the points ``W`` ``(..., n)``: bottleneck ``argmax_j λ_j l_j = j*`` where ``q > 0``; PL in the form
    ``2μ_PL(ψ − ψ*) ≤ ‖∇ψ‖²`` (eq 86); the exact gap identity ``ψ − t = λ_{j*}q`` (round-off check)."""
    W = np.asarray(W, dtype=np.float64).reshape(-1, prob.n_params)
    L = prob.losses(W)
    wl = prob.prefs * L
    gap = gap_of(prob, W)
    grad = prob.direction(W)
    return {
        "bottleneck_ok": (np.argmax(wl, axis=1) == prob.j_star) | (gap == 0.0),
        "pl_lhs": 2.0 * prob.mu_pl * gap,
        "pl_rhs": np.einsum("na,na->n", grad, grad),
        "gap_identity_err": float(np.max(np.abs(wl.max(axis=1) - prob.t - gap))) if W.size else 0.0,
    }


def pl_ok(h39: dict) -> np.ndarray:
    """eq 86 at each point of :func:`h39_along` (deterministic tolerance)."""
    return check_inequality(h39["pl_lhs"], h39["pl_rhs"])


# ----------------------------------------------------------------------------------------------- L_beta (O-12)


def beta_lipschitz(prob: CommonMinimizer, rng, points, radius: float, *, n_ball: int = 20000,
                   safety: float = 1.1, n_grid: int = 100_001) -> dict:
    """``L_β`` := ``safety ×`` the largest ``‖∇_w β_new(w)‖ = ‖G A_new/Z_new‖`` (identity I3) over ``points`` and
    ``n_ball`` uniform points of the ball ``B(c, radius)`` (§1.11, T-H44: sampling with a ×1.1 safety factor).

    Also returns ``sup_1d``, an upper bound of ``‖∇β‖`` on the ball from F3's one-dimensional reduction:
    ``β`` depends on ``w`` only through ``q``, ``∇_wβ = β'(q) Q(w − c)`` and ``‖Q(w − c)‖ ≤ √(2‖Q‖q)``, so
    ``‖∇β‖ ≤ max_{q ≤ ½‖Q‖R²} |β'(q)|√(2‖Q‖q)`` (dense grid). ``L_β ≥ sup_1d`` is monitored as a hypothesis."""
    n = prob.n_params
    u = rng.standard_normal((n_ball, n))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    r = radius * rng.random(n_ball) ** (1.0 / n)
    pts = np.concatenate([np.asarray(points, dtype=np.float64).reshape(-1, n), prob.centre + r[:, None] * u])
    L = prob.losses(pts)
    G = prob.grads(pts)
    g = np.einsum("nam,nm->na", G, adjustment(L, prob.prefs)) / normalizer(L, prob.prefs)[:, None]
    sampled = float(np.linalg.norm(g, axis=1).max())
    Qn = prob.objective_smoothness
    q = np.linspace(0.0, 0.5 * Qn * radius**2, n_grid)
    m, t, lam = prob.n_objectives, prob.t, prob.prefs
    lh = (t + lam[None, :] * q[:, None]) / (q[:, None] + m * t)
    dlh = t * (m * lam[None, :] - 1.0) / (q[:, None] + m * t) ** 2
    dbeta = (dlh * np.log(m * lh)).sum(axis=1)
    sup_1d = float(np.max(np.abs(dbeta) * np.sqrt(2.0 * Qn * q)))
    return {"L_beta": safety * sampled, "sampled_max": sampled, "safety": safety, "sup_1d": sup_1d,
            "radius": float(radius), "n_points": int(pts.shape[0]),
            "method": "1.1 x max ||G A/Z|| over the iterates and uniform ball points (THEOREMS §1.11, T-H44)"}


def _beta_q_terms(prob: CommonMinimizer, s) -> tuple[np.ndarray, np.ndarray]:
    """F3's one-dimensional reduction of ``β_new``: with ``s = q(w) = ½‖w − c‖²_Q``,
    ``ĺ_j(s) = (t + λ_j s)/(s + mt)`` and ``β(s) = Σ_j ĺ_j log(mĺ_j)``, so ``β'(s) = Σ_j ĺ_j'(s) log(mĺ_j(s))`` with
    ``ĺ_j'(s) = t(mλ_j − 1)/(s + mt)²``. ``ĺ_j`` runs monotonically from ``1/m`` (at ``s = 0``) towards ``λ_j``, so
    ``ĺ_j'`` and ``log(mĺ_j)`` share the sign of ``mλ_j − 1`` and every term of ``β'`` is ``≥ 0``. Returns
    ``(|ĺ_j'(s)|, |log(mĺ_j(s))|)``, ``(..., m)`` each; ``β'(s)`` is the sum of their products."""
    m, t, lam = prob.n_objectives, prob.t, prob.prefs
    s = np.asarray(s, dtype=np.float64)[..., None]
    lh = (t + lam * s) / (s + m * t)
    return np.abs(t * (m * lam - 1.0) / (s + m * t) ** 2), np.abs(np.log(m * lh))


def beta_segment_constant(prob: CommonMinimizer, points, *, cell_ratio: float = 1e-3, s_min: float = 1e-9) -> dict:
    """Per point ``w``, an upper bound ``M(w)`` of the mean-value constant of ``β_new`` on the segment ``[c, w]``,
    ``sup_{ξ∈[c, w]} ‖∇_wβ_new(ξ)‖``, so that ``β_new(w) = β_new(w) − β_new(c) ≤ M(w)‖w − c‖`` (mean-value
    inequality; ``β_new(c) = 0``).

    Exact reduction (F3): ``β`` depends on ``w`` only through ``q``, ``∇β(ξ) = β'(q(ξ))Q(ξ − c)``; on the segment
    ``ξ_τ = c + τe`` (``e = w − c``, ``q(ξ_τ) = τ²q``) ``‖∇β(ξ_τ)‖ = β'(τ²q)τ‖Qe‖``, so
    ``sup_τ ‖∇β(ξ_τ)‖ = (‖Qe‖/√q)·sup_{s≤q} φ(s)`` with ``φ(s) = √s β'(s)``. The supremum of ``φ`` is bounded on cells
    ``[s_k, s_{k+1}]`` (``s_0 = 0``, then geometric from ``s_min·max q`` with ratio ``1 + cell_ratio``; the last cell
    ends at the point's own ``q``): ``√s ≤ √s_{k+1}``, ``|ĺ_j'|`` decreases in ``s`` (``≤`` its value at ``s_k``) and
    ``|log(mĺ_j)|`` is monotone (``≤`` the larger endpoint value), so ``φ ≤ √s_{k+1}Σ_j|ĺ_j'(s_k)|·max_ends
    |log(mĺ_j)|`` on the cell (:func:`_beta_q_terms`: every term of ``β'`` is ``≥ 0``, no cancellation). The bound
    exceeds the supremum by a relative ``O(cell_ratio)``. Returns ``{"M", "q", "cells"}``."""
    e = np.asarray(points, dtype=np.float64).reshape(-1, prob.n_params) - prob.centre
    Qe = e @ prob.hessian
    q = 0.5 * np.einsum("na,na->n", e, Qe)
    qmax = float(q.max()) if q.size else 0.0
    if qmax <= 0.0:
        return {"M": np.zeros(q.size), "q": q, "cells": 0}
    k = int(np.ceil(np.log(1.0 / s_min) / np.log1p(cell_ratio)))
    s = np.r_[0.0, s_min * qmax * (1.0 + cell_ratio) ** np.arange(k + 1)]
    d, x = _beta_q_terms(prob, s)
    cell = np.sqrt(s[1:]) * (d[:-1] * np.maximum(x[:-1], x[1:])).sum(axis=-1)
    upto = np.maximum.accumulate(cell)  # upto[k]: bound of sup φ on [0, s_{k+1}]
    i = np.searchsorted(s, q, side="right") - 1  # s_i <= q < s_{i+1}
    _, xq = _beta_q_terms(prob, q)
    last = np.sqrt(q) * (d[i] * np.maximum(x[i], xq)).sum(axis=-1)  # the cell [s_i, q]
    phi = np.maximum(np.where(i >= 1, upto[np.maximum(i - 1, 0)], 0.0), last)
    with np.errstate(divide="ignore", invalid="ignore"):
        M = np.where(q > 0.0, np.linalg.norm(Qe, axis=1) * phi / np.sqrt(q), 0.0)
    return {"M": M, "q": q, "cells": int(s.size - 1)}


# ----------------------------------------------------------------------------------------------- quartic (QG control)


def quartic_psi(lam: float, t: float, W, c) -> np.ndarray:
    """``ψ(w) = t + λ‖w − c‖⁴`` (QG fails near ``c`` for every ``μ > 0``)."""
    e = np.asarray(W, dtype=np.float64) - c
    return t + lam * np.einsum("...a,...a->...", e, e) ** 2


def quartic_grad(lam: float, W, c) -> np.ndarray:
    e = np.asarray(W, dtype=np.float64) - c
    return 4.0 * lam * np.einsum("...a,...a->...", e, e)[..., None] * e


# ----------------------------------------------------------------------------------------------- F1-type cluster


@dataclass(frozen=True, eq=False)
class ClusterStarts:
    """Outputs of Phase 1 / Phase 2 on the F3-compatible cluster (T-H44(a)) and the eq 92 quantities.

    ``starts``: name → ``w_0`` (``w_ref``, ``w_I``, ``w_II``); ``delta0``, ``g_opt``, ``linf``: ``Δ₀(w_0)``,
    ``G_opt(w_0)``, ``‖l(w_0)‖_∞``; ``delta_lambda`` (2-norm, max over the cluster); ``L_star`` (eq 80);
    ``eps0_bar``: name → ``ε̄_0`` (``w_I``: eq 64; ``w_II``: two-phase eq 74); ``transient``: name →
    ``(1/N)Σ_iΠ_t(1 − η_t c_d) r_i^{0}``; ``constants``: the H.19 constants (reported)."""

    cluster: PlantedQuadraticCluster
    starts: dict
    delta0: dict
    g_opt: dict
    linf: dict
    delta_lambda: float
    L_star: float
    eps0_bar: dict
    transient: dict
    constants: dict


#: Why the adaptation boxes (H.39-41, H.43, H.44, H.45, Thm A) do not reach the search's stress corners
#: (:data:`verification.search.REACH`): they vary the preconditioner spread, S and K on F3 instances whose shape
#: is fixed by THEOREMS.md §3.0, so m, the conditioning, lambda_min and collinearity are not searched there.
F3_FIXED = {
    "m >= 10": "F3's new client has m = 3 objectives sharing one minimiser (THEOREMS.md §3.0); m is not searched in "
               "this box",
    "conditioning >= 1e6": "F3's Hessian spectrum is fixed ([0.5, 3], kappa_Q = 6, or Q = I for the tight instance); "
                           "the conditioning is not searched in this box",
    "lambda_min <= 1e-12": "F3's lambda_new = (0.5, 0.3, 0.2) is fixed; lambda_min is not searched in this box",
    "near-collinear Gram": "all of F3's objectives share one Hessian and one minimiser (their gradients are exactly "
                           "collinear at every w); the box has no further collinearity to vary",
}

def f3_cluster(prob: CommonMinimizer, rng, n_clients: int, spread: float) -> PlantedQuadraticCluster:
    """F1-type cluster whose new client is ``prob`` (T-H44(a)): the common objectives
    ``l_j = ½(w − c)ᵀQ(w − c) + t/λ_new^{(j)}`` and clients ``λ_i = normalize(λ_new ⊙ |1 + s ξ_i|)`` near
    ``λ_new``. Every ``ψ_i`` is minimised at ``c`` (all objectives share it): ``w_i* = c``,
    ``ψ_i* = max_j λ_ij t/λ_new^{(j)}``."""
    m = prob.n_objectives
    lam = prob.prefs * np.abs(1.0 + spread * rng.standard_normal((n_clients, m)))
    lam = lam / lam.sum(axis=1, keepdims=True)
    offsets = prob.offsets
    psi_star = (lam * offsets).max(axis=1)
    return PlantedQuadraticCluster(
        centres=np.tile(prob.centre, (m, 1)), hessians=np.tile(prob.hessian, (m, 1, 1)), offsets=offsets.copy(),
        u0=prob.prefs.copy(), mixing=lam.copy(), prefs=lam, w_star=np.tile(prob.centre, (n_clients, 1)),
        psi_star=psi_star, spread=float(spread))


def cluster_starts(prob: CommonMinimizer, rng, *, n_clients: int = 4, spread: float = 0.05,
                   w_ref=None, rounds_I: int = 20, rounds_II: int = 20, eta_I_factor: float = 0.1,
                   eta_II_factor: float = 0.2) -> ClusterStarts:
    """``w_I`` (Phase 1, ``τ = 1``, population gradients, ``η_I = eta_I_factor/‖Q‖``) and ``w_II`` (Phase 2 from
    ``w_I`` with population gradients and ``K = 1``, ``η_II = eta_II_factor/‖Q‖``: the regime covered by
    H.32, O-27) on :func:`f3_cluster`; eq 92 quantities at ``w_ref``, ``w_I``, ``w_II``.

    H.19 constants ``(c_d, b_i)`` by :func:`sim.constants.descent_margin_constants` on the recorded trajectory
    (margins ``m_i`` on ``J*_ε`` with the round's ``ε_act``; §1.11, O-8; for ``w_II`` with ``η = max(η_I, η_II)``,
    O-23); ``B``: the largest gradient norm recorded (the gradient norm decreases along each segment of this
    quadratic gradient iteration, so it bounds the segments too); ``L₀ = ‖Q‖`` (exact)."""
    cl = f3_cluster(prob, rng, n_clients, spread)
    Qn = prob.objective_smoothness
    w_ref = prob.w0 if w_ref is None else np.asarray(w_ref, dtype=np.float64)
    clients = np.arange(n_clients)
    c1 = Phase1Config(rounds=rounds_I, tau=1, eta_local=eta_I_factor / Qn, alpha_server=1.0)
    r1 = phase1(cl, clients, w_ref, c1, rng)
    c2 = Phase2Config(rounds=rounds_II, S=None, K=1, eta_meta_inner=eta_II_factor / Qn, alpha_server=1.0)
    r2 = phase2(cl, clients, r1.w, c2, rng, round_offset=rounds_I, B_start=r1.B)
    rec1 = r1.records[r1.records["round"] < rounds_I].sort_values(["round", "client"])
    rec2 = r2.records[r2.records["round"] < rounds_II].sort_values(["round", "client"])

    def arr(rec, col, T):
        return rec[col].to_numpy().reshape(T, n_clients).T  # (N, T)

    m1, g1 = arr(rec1, "margin_Jeps", rounds_I), arr(rec1, "gap", rounds_I)
    m2, g2 = arr(rec2, "margin_Jeps", rounds_II), arr(rec2, "gap", rounds_II)
    dev1, dev2 = arr(rec1, "deviation", rounds_I), arr(rec2, "deviation", rounds_II)
    B = float(max(r1.B, r2.B))
    lam_max = cl.prefs.max(axis=1)
    eta_I, eta_II = c1.eta_eff, c2.eta_eff
    k1 = descent_margin_constants(m1, g1, eta_I, lam_max, B, Qn, dev1)
    k2 = descent_margin_constants(np.concatenate([m1, m2], 1), np.concatenate([g1, g2], 1), max(eta_I, eta_II),
                                  lam_max, B, Qn, np.concatenate([dev1, dev2], 1))
    r0 = g1[:, 0]
    trans_I = float(np.mean((1.0 - eta_I * k1.c_d) ** rounds_I * r0))
    trans_II = float(np.mean((1.0 - eta_I * k2.c_d) ** rounds_I * (1.0 - eta_II * k2.c_d) ** rounds_II * r0))
    starts = {"w_ref": w_ref.copy(), "w_I": r1.w.copy(), "w_II": r2.w.copy()}
    lam_new = prob.prefs
    dl = float(np.linalg.norm(cl.prefs - lam_new, axis=1).max())
    L_star = float(loss_bound_at_optima(prob.losses(prob.centre), cl.losses(cl.w_star)))
    d0, go, li = {}, {}, {}
    for k, w in starts.items():
        d0[k] = float(gap_of(prob, w))
        go[k] = float(np.mean(cl.chebyshev(w) - cl.psi_star))
        li[k] = float(np.max(prob.losses(w)))
    consts = {
        "L0_objectives": Qn, "B": B, "eta_I": eta_I, "eta_II": eta_II, "rounds_I": rounds_I,
        "rounds_II": rounds_II, "c_d_I": k1.c_d, "b_I": k1.b, "eps0_I": k1.eps0, "residual_I": k1.residual_max,
        "c_d_II": k2.c_d, "b_II": k2.b, "eps0_hat_II": k2.eps0, "residual_II": k2.residual_max,
        "deviation_max": float(max(dev1.max(), dev2.max())), "lambda_clients": cl.prefs,
        "step_status_counts": {"phase1": r1.step_status_counts, "phase2": r2.step_status_counts},
        "method": ("c_d, b_i: sim.constants.descent_margin_constants on the recorded iterates (log grid in "
                   "(0, 1/eta], THEOREMS §1.11); B: max recorded gradient norm; L0 = ||Q|| exact"),
    }
    return ClusterStarts(cluster=cl, starts=starts, delta0=d0, g_opt=go, linf=li, delta_lambda=dl, L_star=L_star,
                         eps0_bar={"w_I": k1.eps0_mean, "w_II": k2.eps0_mean},
                         transient={"w_I": trans_I, "w_II": trans_II}, constants=consts)


# ----------------------------------------------------------------------------------------------- controls


def combine_controls(sid: str, name: str, parts: dict) -> Evidence:
    """One negative-control Evidence from several: detected iff *every* part is detected; the first part's
    arrays are kept, every part is summarised in ``details["controls"]``, and ``details["broken_hypotheses"]``
    (``"<part>: <hypothesis>"``) and ``details["flagged_instances"]`` (summed) say what the parts break and saw."""
    first = next(iter(parts.values()))
    summary = {
        k: {"detected": bool(ev.control_detected), "instances": ev.instances,
            "flagged": ev.details.get("flagged_instances"), "conclusion_failed": ev.n_counterexamples,
            "broken": ev.details.get("broken_hypotheses"), "details": ev.details,
            "counterexamples": ev.counterexamples[:3]}
        for k, ev in parts.items()
    }
    n_cex = sum(ev.n_counterexamples for ev in parts.values())
    cex = [dict(c, control=k) for k, ev in parts.items() for c in ev.counterexamples[:5]]
    broken = [f"{k}: {b}" for k, ev in parts.items() for b in (ev.details.get("broken_hypotheses") or [k])]
    flagged = sum(ev.control_summary()["flagged"] for ev in parts.values())
    return dataclasses.replace(
        first, control_detected=all(bool(ev.control_detected) for ev in parts.values()),
        counterexamples=to_jsonable(cex), n_counterexamples=n_cex,
        instances=sum(ev.instances for ev in parts.values()),
        excluded=sum(ev.excluded for ev in parts.values()),
        exclusion_reasons={f"{k}: {r}": c for k, ev in parts.items() for r, c in ev.exclusion_reasons.items()},
        details=to_jsonable({"controls": summary, "broken_hypotheses": broken, "flagged_instances": flagged}),
    )


class Rows:
    """Accumulates conclusion rows (``lhs``, ``rhs``, optional boolean ``ok``) with per-row hypotheses
    (name → bool) and per-row data, to build a :class:`HypothesisMonitor` and an Evidence.

    Every block belongs to a named conclusion (``conclusion``, default: the block's label) of a kind
    (:data:`verification.evidence.CONCLUSION_KINDS`); :meth:`add_mc` adds a Monte Carlo assertion with its
    crossing factor. :meth:`evidence_args` gives the ``conclusion``/``kinds``/``detect`` arguments of
    :meth:`Evidence.from_implication`."""

    def __init__(self):
        self.lhs: list[np.ndarray] = []
        self.rhs: list[np.ndarray] = []
        self.ok: list[np.ndarray] = []
        self.hyp: list[dict] = []
        self.margins: list[dict] = []
        self.data: list[dict] = []
        self.sizes: list[int] = []
        self.names: list[str] = []
        self.kinds: dict[str, str] = {}
        self.detect: list[np.ndarray] = []
        self.soft: set[str] = set()

    def add(self, kind: str, lhs, rhs, *, ok=None, hyp: dict | None = None, margins: dict | None = None,
            conclusion: str | None = None, ckind: str = "bound", detect=None, soft: bool = False, **data) -> None:
        lhs = np.asarray(lhs, dtype=np.float64).ravel()
        rhs = np.asarray(rhs, dtype=np.float64).ravel()
        n = max(lhs.size, rhs.size, 1 if ok is None else np.asarray(ok).size)
        lhs = np.broadcast_to(lhs, (n,)).copy()
        rhs = np.broadcast_to(rhs, (n,))
        name = kind if conclusion is None else conclusion
        if self.kinds.get(name, ckind) != ckind:
            raise ValueError(f"conclusion {name!r} given as {ckind!r} and as {self.kinds[name]!r}")
        self.kinds[name] = ckind
        self.names.append(name)
        if soft:
            self.soft.add(name)
        self.detect.append(np.full(n, np.nan) if detect is None
                           else np.broadcast_to(np.asarray(detect, np.float64), (n,)).copy())
        self.lhs.append(lhs)
        self.rhs.append(np.array(rhs))
        self.ok.append(np.ones(n, bool) if ok is None else np.broadcast_to(np.asarray(ok, bool), (n,)).copy())
        self.hyp.append({k: np.broadcast_to(np.asarray(v, bool), (n,)).copy() for k, v in (hyp or {}).items()})
        self.margins.append({k: np.broadcast_to(np.asarray(v, np.float64), (n,)).copy()
                             for k, v in (margins or {}).items()})
        d = {"kind": np.full(n, kind, dtype=object)}
        for k, v in data.items():
            a = np.asarray(v)
            d[k] = np.broadcast_to(a, (n,)).copy() if a.ndim == 0 or a.shape == (n,) else np.full(n, str(v),
                                                                                                  dtype=object)
        self.data.append(d)
        self.sizes.append(n)

    def add_mc(self, label: str, res: MCResult, *, conclusion: str | None = None, soft: bool = False,
               **kw) -> None:
        """A Monte Carlo assertion ``LCB ≤ b`` (``b`` as scaled by the power factor) with its crossing factor;
        ``soft``: reported, not part of the verdict (and so outside the family-wise budget)."""
        self.add(label, res.lcb, res.bound, conclusion=conclusion, ckind="monte_carlo", detect=res.crossing,
                 soft=soft, **kw)

    @property
    def n(self) -> int:
        return int(sum(self.sizes))

    def evidence_args(self) -> dict:
        """``conclusion``, ``kinds`` and ``detect`` for :meth:`Evidence.from_implication`."""
        names = np.concatenate([np.full(s, nm, dtype=object) for nm, s in zip(self.names, self.sizes, strict=True)])
        det = np.concatenate(self.detect) if self.detect else np.zeros(0)
        return {"conclusion": names, "kinds": dict(self.kinds), "detect": det, "soft": sorted(self.soft)}

    def arrays(self):
        lhs = np.concatenate(self.lhs) if self.lhs else np.zeros(0)
        rhs = np.concatenate(self.rhs) if self.rhs else np.zeros(0)
        ok = np.concatenate(self.ok) if self.ok else np.zeros(0, bool)
        return lhs, rhs, ok

    def monitor(self, order=()):
        """A monitor over all rows: a hypothesis not given for a block counts as not applicable (held)."""
        from verification.evidence import HypothesisMonitor

        names = list(order)
        for h in self.hyp:
            for k in h:
                if k not in names:
                    names.append(k)
        mon = HypothesisMonitor(self.n)
        for name in names:
            held = np.concatenate([h.get(name, np.ones(s, bool)) for h, s in zip(self.hyp, self.sizes, strict=True)])
            mg = np.concatenate([m.get(name, np.full(s, np.inf)) for m, s in zip(self.margins, self.sizes,
                                                                                  strict=True)])
            mon.record(name, held, margin=np.where(np.isinf(mg), np.where(held, np.inf, -1.0), mg))
        return mon

    def instance_data(self):
        keys: list[str] = []
        for d in self.data:
            for k in d:
                if k not in keys:
                    keys.append(k)
        out = {}
        for k in keys:
            out[k] = np.concatenate([d.get(k, np.full(s, None, dtype=object)) for d, s in
                                     zip(self.data, self.sizes, strict=True)])
        return out


# ----------------------------------------------------------------------------------------------- hypothesis names

H_F3 = "H.39 by construction: F3 (Q > 0, unique largest lambda_new entry; stable bottleneck j*, PL with mu_PL <= L0)"
H_BN = "H.39(i): bottleneck argmax_j lambda_j l_j(w_k) = j* at the iterates"
H_PL = "H.39(ii) eq 86: ||grad psi||^2 >= 2 mu_PL (psi - psi*) at the iterates"
H_UNB = "H.40: unbiased direction, fresh batch of S samples per step (construction)"
H_MEAS = "H.41(a): P_k F_k-measurable (computed before the step's batch is drawn)"
H_SPEC = "H.41(b): P_k symmetric with spectrum in [p_-, p_+]"
H_NOMOM = "H.41(c),(d): no momentum, no weight decay"
H_STEP = "step condition 0 < alpha <= p_-/(L0 p_+^2)"
H_H19 = "H.19 on the shared iterates with the estimated (c_d, b_i) (residual <= 0)"
H_ETA = "eta c_d <= 1 (H.29)"
H_NEW = "new client: same l_j, not in training, ||lambda_new - lambda_i|| <= delta_lambda"


def h19_hyps(cs: ClusterStarts, key: str) -> tuple[dict, dict]:
    """Hypotheses of the eq 92 / eq 95 bound at ``w_I`` or ``w_II`` (H.19 on the recorded iterates with the
    estimated constants; ``η c_d ≤ 1``, with ``η = max(η_I, η_II)`` for ``w_II``) and their margins."""
    c = cs.constants
    if key == "w_I":
        cd, eta, res = c["c_d_I"], c["eta_I"], c["residual_I"]
    else:
        cd, eta, res = c["c_d_II"], max(c["eta_I"], c["eta_II"]), c["residual_II"]
    return ({H_NEW: True, H_H19: res <= 1e-12, H_ETA: eta * cd <= 1 + 1e-12},
            {H_H19: -res, H_ETA: 1.0 - eta * cd})
H_QG = "H.34: psi_new - psi* >= (mu/2)||w - w*||^2 on the region (QG)"


def adaptation_hyps(prob: CommonMinimizer, *, alpha: float, p_minus: float, p_plus: float, spec_min, spec_max,
                    measurable=True, unbiased=True, no_momentum=True, f3=True) -> tuple[dict, dict]:
    """Per-row hypotheses of H.43/H.44 (construction flags, spectrum and step condition with margins)."""
    amax = alpha_max(prob, p_minus, p_plus)
    smin = np.asarray(spec_min, dtype=np.float64)
    smax = np.asarray(spec_max, dtype=np.float64)
    spec_margin = np.minimum(smin - p_minus, p_plus - smax)
    f3_ok = bool(f3) and prob.mu_pl > 0 and prob.mu_pl <= prob.L0 * (1 + 1e-12)
    hyp = {H_F3: f3_ok, H_UNB: unbiased, H_MEAS: measurable, H_SPEC: spec_margin >= -1e-12 * max(1.0, p_plus),
           H_NOMOM: no_momentum, H_STEP: (alpha > 0) and (alpha <= amax * (1 + 1e-12))}
    margins = {H_SPEC: spec_margin, H_STEP: amax - alpha}
    return hyp, margins
