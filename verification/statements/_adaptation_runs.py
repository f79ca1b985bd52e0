r"""The runs of the new-client adaptation statements (private module): a run engine vectorised over Monte Carlo runs
(:func:`run_adaptation`) for ``P_k ∈`` :data:`KINDS`, the non-measurable adversarial preconditioner of
T-H43(e)(2) on the 1-D instance (:func:`run_adversarial_1d`), the cross-check against
:func:`sim.algorithm.pipeline1` (:func:`pipeline1_crosscheck`), and the F3-compatible F1-type cluster of T-H44(a)
with its Phase-1/Phase-2 outputs ``w_I``, ``w_II`` (:func:`cluster_starts`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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
from sim.problems import CommonMinimizer, PlantedQuadraticCluster
from verification.statements._adaptation_theory import gap_of

KINDS = ("identity", "fixed", "rmsprop_lagged", "rmsprop_current")
#: preconditioners whose ``P_k`` is computed from ``𝓕_k`` only (H.41(a) by construction)
MEASURABLE_KINDS = ("identity", "fixed", "rmsprop_lagged")


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
#: (:data:`verification.core.search.REACH`): they vary the preconditioner spread, S and K on F3 instances whose shape
#: is fixed by docs/spec/tolerances.md#checks, so m, the conditioning, lambda_min and collinearity are not
#: searched there.
F3_FIXED = {
    "m >= 10": "F3's new client has m = 3 objectives sharing one minimiser (docs/spec/problems.md#families); m is not searched in "
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
    (margins ``m_i`` on ``J*_ε`` with the round's ``ε_act``; docs/spec/constants.md#constants,
    docs/spec/open-points.md#o-8; for ``w_II`` with ``η = max(η_I, η_II)``, O-23); ``B``: the largest gradient
    norm recorded (the gradient norm decreases along each segment of this
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
                   "(0, 1/eta], docs/spec/constants.md#constants); B: max recorded gradient norm; L0 = ||Q|| exact"),
    }
    return ClusterStarts(cluster=cl, starts=starts, delta0=d0, g_opt=go, linf=li, delta_lambda=dl, L_star=L_star,
                         eps0_bar={"w_I": k1.eps0_mean, "w_II": k2.eps0_mean},
                         transient={"w_I": trans_I, "w_II": trans_II}, constants=consts)
