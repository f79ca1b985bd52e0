r"""The T-H31 chains of the shared-iteration statements H.25, H.28, H.29, H.31, Cor-C, H.32, H.37: every client's LP at the iterates and the H.19 margins, the F1 chain with its held-out constants, and the hypotheses per step and window (private module: the leading underscore keeps it out of statement discovery, see :mod:`verification.core.registry`).

Nothing here re-implements a formula or the iteration: trajectories come from
:func:`sim.algorithm.shared_iteration` (eq 55) or :func:`sim.algorithm.phase1`/:func:`sim.algorithm.phase2`, and
the per-iterate quantities from the :mod:`sim` kernels (:func:`sim.direction.lp_direction`,
:func:`sim.hull.near_active_set`, :func:`sim.hull.descent_margin`, :func:`sim.cluster.deviations`,
:func:`sim.constants.descent_margin_constants`, :func:`sim.constants.band_radius`, ...). The helpers only assemble
them.

* :func:`lp_at_points` / :func:`margins_at_points` — every client's EPO LP direction ``d_i(w)``, the shared
  direction ``d̄ = Σρ_i d_i``, ``Δ_i = ‖d̄ − d_i‖``, ``ψ_i``, ``r_i = ψ_i − ψ_i*``, ``β_i`` and the H.19 margin
  ``m_i(w) = min_{j ∈ J*_{i,ε}} λ_ij d_iᵀg_ij`` with ``ε_act = 2ηλ_max,i B²`` (``η`` may vary per point).
* :func:`f1_chain` — one T-H31 run (docs/spec/statements.md#t-h28, docs/spec/statements.md#t-h29, docs/spec/statements.md#t-h31, docs/spec/statements.md#t-cor-c): F1 cluster, shared iteration, and the
  H.19 constants ``(c_d, b_i)``, ``Δ̄_i``, ``β̄_i`` estimated on **held-out iterates** — the iterates ``t ≥ t_0`` of
  a companion run of the same problem and step size from another start — so that they are never fitted to the
  iterates they are checked on (the verdict's constants; H.19, ``β ≤ β̄``, ``Δ ≤ Δ̄`` are then *monitored* on the
  checked run). Two held-out sets: the docs/spec/constants.md#constants choice on the grid ``[c_min, 1/η]``
  (it often selects ``c_d = 1/η``, where ``q = 0`` and eq 65 reduces to ``r ≤ ε_0``) and the same on ``[c_min,
  1/(2η)]`` (``ηc_d ≤ ½``: a contraction with ``q ≥ ½``). The T-H31 design's in-sample constants (estimated on
  the checked iterates themselves) and the region constants on an independent uniform sample of ``𝒩`` (O-8)
  are reported. Runs are memoised on ``(rng state, parameters)`` and the generator is advanced exactly as a
  fresh computation would advance it, so the four statements that share the design share the work without
  changing any number.

The one-dimensional controls are in :mod:`._one_dim_chains`, the evidence rows in :mod:`._trajectory_rows`.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, fields

import numpy as np

from sim.algorithm import shared_iteration
from sim.cluster import aggregation_weights, deviations, shared_direction
from sim.constants import (
    descent_margin_constants,
    gradient_bound,
    gradient_bound_quadratic_ball,
    smoothness_quadratic,
    strict_descent_constant,
)
from sim.direction import lp_direction
from sim.hull import descent_margin, eps_act, near_active_set
from sim.preference import chebyshev
from sim.problems import PlantedQuadraticCluster
from sim.roundoff import generator_state, set_generator_state

#: LP statuses that carry a solution of the LP that was asked for (the relaxed dom LP keeps ``Cμ ≥ 0``).
SOLVED_STATUSES = ("optimal", "relaxed")

# Hypothesis names shared by the trajectory statements (one wording everywhere).
H_POS = "H.1-H.3 positivity: losses > 0 at w^t and w^{t+1}"
H_GRAD = "H.1-H.3 gradient bound: ||g_ij|| <= B at w^t and w^{t+1} (segment by convexity)"
H_DBAR = "||dbar^t|| <= B"
H_LP = "LP solved at w^t (optimal or relaxed)"
H_H19 = "H.19 (eq 51) at w^t: c_d r_i - m_i <= b_i"
H_REGION = "w^t in N (region of the H.19 constants)"
H_BETA = "beta_i(w^t) <= beta_bar_i"
H_DEV = "Delta_i^t <= Delta_bar_i"
H_STEP = "0 < eta_t c_d <= 1"


# ============================================================================================ point quantities


@dataclass(frozen=True, eq=False)
class PointLP:
    """EPO LP of every client at points ``W`` ``(T, n_w)``; arrays ``(T, N, ...)``.

    losses (T, N, m), grads (T, N, n_w, m), prefs (T, N, m), d (T, N, n_w) (zero rows where unsolved),
    dbar (T, n_w), status/mode (T, N), beta, psi, gap, deviation (T, N), grad_norm (T, N, m).
    """

    losses: np.ndarray
    grads: np.ndarray
    prefs: np.ndarray
    d: np.ndarray
    dbar: np.ndarray
    status: np.ndarray
    mode: np.ndarray
    beta: np.ndarray
    psi: np.ndarray
    gap: np.ndarray
    deviation: np.ndarray
    grad_norm: np.ndarray

    @property
    def solved(self) -> np.ndarray:
        return np.isin(self.status, SOLVED_STATUSES)


def lp_at_points(problem, W, psi_star, rho=None, *, eps_mode: float) -> PointLP:
    """Evaluate a :class:`sim.algorithm.ClientProblem` (every client at the same points ``W`` ``(T, n_w)``)."""
    W = np.atleast_2d(np.asarray(W, dtype=np.float64))
    N = problem.n_clients
    rho = aggregation_weights(N=N) if rho is None else np.asarray(rho, dtype=np.float64)
    WW = np.broadcast_to(W[:, None, :], (W.shape[0], N, W.shape[1]))
    l = np.asarray(problem.losses_per_client(WW))
    G = np.asarray(problem.grads_per_client(WW))
    lam = np.broadcast_to(np.asarray(problem.prefs, dtype=np.float64), l.shape)
    C = np.swapaxes(G, -1, -2) @ G
    C = 0.5 * (C + np.swapaxes(C, -1, -2))
    res = lp_direction(l, lam, C, eps_mode=eps_mode)
    solved = np.isin(res.status, SOLVED_STATUSES)
    mu = np.where(solved[..., None], res.weights, 0.0)
    d = np.einsum("tnwm,tnm->tnw", G, mu)
    psi = chebyshev(l, lam)
    return PointLP(
        losses=l, grads=G, prefs=lam, d=d, dbar=shared_direction(d, rho), status=res.status, mode=res.mode,
        beta=res.beta, psi=psi, gap=psi - np.asarray(psi_star, dtype=np.float64)[None, :],
        deviation=deviations(d, rho), grad_norm=np.linalg.norm(G, axis=-2),
    )


def margins_at_points(pl: PointLP, eta, B: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """H.19 margins ``m_i(w)`` ``(T, N)`` with ``ε_act = 2 η_t λ_max,i B²`` (``eta`` scalar or ``(T,)``).

    Returns ``(margin, eps_act (T, N), near-active mask (T, N, m))``."""
    T = pl.losses.shape[0]
    eta_t = np.broadcast_to(np.asarray(eta, dtype=np.float64), (T,))
    ea = eps_act(eta_t[:, None], pl.prefs, B)
    mask = near_active_set(pl.losses, pl.prefs, ea)
    return descent_margin(pl.d, pl.grads, pl.prefs, mask), ea, mask


# ============================================================================================ memo on rng state


_MEMO: OrderedDict = OrderedDict()
_MEMO_SIZE = 256


def _state_key(rng: np.random.Generator) -> str:
    # a jittered generator (sim.roundoff.JitteredGenerator) draws other numbers from the same bit state
    return repr(generator_state(rng))


def memo_rng(fn):
    """Memoise ``fn(rng, **params)`` on the generator's state and the parameters; on a hit the generator is set
    to the state a fresh call would have left, so results and later draws are identical either way."""

    def wrapper(rng: np.random.Generator, **params):
        key = (fn.__name__, _state_key(rng), tuple(sorted((k, repr(v)) for k, v in params.items())))
        hit = _MEMO.get(key)
        if hit is not None:
            _MEMO.move_to_end(key)
            out, post = hit
            set_generator_state(rng, post)
            return out
        out = fn(rng, **params)
        _MEMO[key] = (out, generator_state(rng))
        if len(_MEMO) > _MEMO_SIZE:
            _MEMO.popitem(last=False)
        return out

    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


# ============================================================================================ configuration


@dataclass(frozen=True)
class ChainConfig:
    """Parameters of the T-H31 design shared by H.28, H.29, H.31 and Cor-C (and their negative controls).

    F1 runs: ``n_runs`` clusters of ``n_clients`` clients (``m`` objectives, ``n_w`` parameters); run ``k`` uses
    spread ``spreads[k % 3]`` and ``η = eta_factors[(k // 3) % 3] / L₀``; ``w^0 = u_0ᵀ[c_j] + start_noise·ξ``;
    ``rounds`` = T; constants on the iterates ``t ≥ t0``. Region ``𝒩 = B(mean w_i*, R)`` with
    ``R = max(region_min_radius, region_cover·max_{t≥t0}‖w^t − mean w_i*‖)`` and ``n_region`` uniform points.
    Controls: F4 double well (``dw_*``) and F5 kink (``kink_*``)."""

    n_runs: int = 9
    m: int = 3
    n_w: int = 4
    n_clients: int = 3
    spreads: tuple = (0.0, 0.02, 0.1)
    eta_factors: tuple = (0.01, 0.03, 0.1)
    rounds: int = 400
    t0: int = 50
    start_noise: float = 0.5
    eps_mode: float = 1e-10
    n_grid: int = 200
    c_min: float = 1e-4
    n_region: int = 1000
    region_min_radius: float = 0.3
    region_cover: float = 1.1
    kappa_Q: float = 3.0  # F1 conditioning of each Q_j (sim.problems.PlantedQuadraticCluster.make)
    s_c: float = 1.0  # F1 centre spread (small with kappa_Q = 1: nearly collinear gradients)
    # F4 double well (T-H31(e))
    dw_etas: tuple = (0.01, 0.003)
    dw_w0: float = 1.2
    dw_steps: int = 1500
    dw_region: tuple = (-1.4, -0.6)
    n_region_1d: int = 2001
    # F5 kink (H.18(b))
    kink_eta: float = 0.1
    kink_w0: float = 0.5
    kink_steps: int = 80
    kink_region: tuple = (0.2, 0.9)

    def chain_params(self, k: int) -> dict:
        return dict(
            m=self.m, n_w=self.n_w, n_clients=self.n_clients,
            spread=float(self.spreads[k % len(self.spreads)]),
            eta_factor=float(self.eta_factors[(k // len(self.spreads)) % len(self.eta_factors)]),
            rounds=self.rounds, t0=self.t0, start_noise=self.start_noise, eps_mode=self.eps_mode,
            n_grid=self.n_grid, c_min=self.c_min, n_region=self.n_region,
            region_min_radius=self.region_min_radius, region_cover=self.region_cover,
            kappa_Q=self.kappa_Q, s_c=self.s_c,
        )


def chain_fields() -> tuple[str, ...]:
    return tuple(f.name for f in fields(ChainConfig))


def chain_search(config_cls, *, rounds: int = 120, t0: int = 30, **fixed):
    """The falsification-search box of the T-H31 design (:mod:`verification.core.search`), shared by H.28, H.29, H.31,
    Cor-C and H.37: preference spread ``s_u``, step size ``ηL₀``, start noise, ``m``, ``n_w``, ``N``; one run of
    ``rounds`` rounds per evaluation (``fixed``: further fields of ``config_cls``)."""
    from verification.core.search import F1_SHAPE, LAMBDA_MIN, PLANTED_LAMBDA, Param, SearchSpace

    def config(p):
        return config_cls(n_runs=1, m=p["m"], n_w=max(p["n_w"], p["m"]), n_clients=p["n_clients"],
                          spreads=(p["spread"],), eta_factors=(p["eta_factor"],), rounds=rounds, t0=t0,
                          start_noise=p["start_noise"], n_region=300, kappa_Q=p["kappa_Q"], s_c=p["s_c"], **fixed)

    return SearchSpace(
        params=(Param("spread", 1e-3, 0.5, "log"), Param("eta_factor", 3e-3, 0.5, "log"),
                Param("start_noise", 0.02, 3.0, "log"), Param("m", 2, 12, "int"), Param("n_w", 2, 12, "int"),
                Param("n_clients", 2, 5, "int"), *F1_SHAPE),
        config=config,
        family="F1 shared-iteration runs: preference spread, step size eta L0, start noise, m, n_w, N, "
               "conditioning kappa_Q, centre spread s_c",
        excluded={LAMBDA_MIN: PLANTED_LAMBDA},
    )


# ============================================================================================ F1 chain run


@dataclass(frozen=True, eq=False)
class RegionConstants:
    """H.19 constants on an independent uniform sample of ``𝒩 = B(center, R)`` (O-8) and their check on the
    iterates. ``B`` is the exact F1 gradient bound on the ball; ``resid`` ``(T+1, N)`` is
    ``c_d r_i − b_i − m_i`` at the iterates with the region's ``ε_act`` (``> 0``: the iterate violates them)."""

    center: np.ndarray
    R: float
    B: float
    c_d: float
    b: np.ndarray
    eps0: np.ndarray
    deviation_bar: np.ndarray
    strict_c_d: float
    resid: np.ndarray
    inside: np.ndarray  # (T+1,) iterate in the ball
    n_points: int
    margin_iterates: np.ndarray | None = None  # (T+1, N) H.19 margins at the iterates with the region's width
    beta_bar: np.ndarray | None = None  # largest beta_i on the region sample
    half: object = None  # the constants on the grid capped at 1/(2 eta_max)
    dist: np.ndarray | None = None  # (T+1,) distance of the iterates from the centre


@dataclass(frozen=True, eq=False)
class ConstantSet:
    """One set of H.19 constants the chain H.28 → H.29 → H.31 is checked with, and where it came from.

    ``c_d``, ``b`` (N), ``eps0`` (N) (eq 64), ``B`` (the gradient bound the set's ``ε_act`` and band use),
    ``margin`` ``(T+1, N)`` the H.19 margins at the checked iterates with that width, ``deviation_bar`` and
    ``beta_bar`` (N) the set's ``Δ̄_i`` and ``β̄_i``, and ``region_margin`` ``(T+1,)`` (``R − ‖w^t − center‖``) when
    the constants hold on a region only. Every hypothesis they carry is *monitored* at the checked iterates."""

    label: str
    c_d: float
    b: np.ndarray
    eps0: np.ndarray
    B: float
    margin: np.ndarray
    deviation_bar: np.ndarray
    beta_bar: np.ndarray
    source: str
    region_margin: np.ndarray | None = None

    def q(self, eta: float) -> float:
        return 1.0 - eta * self.c_d

    def summary(self, eta: float) -> dict:
        return dict(c_d=self.c_d, eta_c_d=eta * self.c_d, b=self.b, eps0=self.eps0, B=self.B,
                    deviation_bar=self.deviation_bar, beta_bar=self.beta_bar, source=self.source)


@dataclass(frozen=True, eq=False)
class ChainRun:
    """One shared-iteration run on F1 with everything the chain H.25 → H.28 → H.29 → H.31 needs.

    Arrays over iterates are ``(T+1, N)`` (``t = 0..T``). ``consts`` are the verdict's constants
    (:class:`sim.constants.DescentMarginConstants`) estimated on the held-out companion run's iterates ``t ≥ t0``
    (``heldout``: its margins, gaps, deviations and start), ``consts_half`` the same on the grid capped at
    ``1/(2η)``; ``consts_insample`` the T-H31 design's constants on the checked iterates (reported only);
    ``region`` the O-8 region constants.
    """

    problem: PlantedQuadraticCluster
    params: dict
    eta: float
    L0: float
    B: float
    w0: np.ndarray
    traj: np.ndarray
    pl: PointLP
    margin: np.ndarray
    eps_act: np.ndarray
    consts: object
    beta_bar: np.ndarray
    region: RegionConstants
    step_residual: float  # max |w^{t+1} − (w^t − η d̄^t)|: the trajectory is eq 55 with these directions
    consts_half: object = None
    consts_insample: object = None
    heldout: dict | None = None

    def constant_sets(self) -> list[ConstantSet]:
        """The constant sets the chain is checked with: three not estimated on the checked iterates — the held-out
        companion run's (grid ``[c_min, 1/η]``), the region sample's (O-8) and the region sample's on
        ``[c_min, 1/(2η)]`` (``ηc_d ≤ ½``) — and, last, the T-H31 design's in-sample constants (fitted on the
        checked iterates: H.19 holds there by construction, so these rows test the implication chain itself)."""
        rg = self.region
        out = [ConstantSet("held-out run", self.c_d, np.asarray(self.consts.b), self.eps0, self.B, self.margin,
                           np.asarray(self.consts.deviation_bar), self.beta_bar,
                           "iterates t >= t0 of a companion run (same problem and eta, another start)")]
        if self.heldout is not None and rg.margin_iterates is not None:
            for label, c in (("region sample", rg), ("region sample, eta c_d <= 1/2", rg.half)):
                out.append(ConstantSet(label, float(c.c_d), np.asarray(c.b), np.asarray(c.eps0), rg.B,
                                       rg.margin_iterates, np.asarray(rg.deviation_bar), np.asarray(rg.beta_bar),
                                       f"{rg.n_points} uniform points of the ball B(mean w_i*, R = {rg.R:.4g}) "
                                       "(O-8); B = exact F1 bound on the ball", rg.R - rg.dist))
        ins = self.consts_insample
        if ins is not None:
            late = slice(self.t0, None)
            out.append(ConstantSet("in-sample", float(ins.c_d), np.asarray(ins.b), np.asarray(ins.eps0), self.B,
                                   self.margin, np.asarray(ins.deviation_bar), self.pl.beta[late].max(axis=0),
                                   "fitted on the checked iterates t >= t0 (T-H31 design: tests the implication)"))
        return out

    @property
    def t0(self) -> int:
        return int(self.params["t0"])

    @property
    def T(self) -> int:
        return self.traj.shape[0] - 1

    @property
    def N(self) -> int:
        return self.problem.n_clients

    @property
    def lam_max(self) -> np.ndarray:
        return self.problem.prefs.max(axis=1)

    @property
    def lam_min(self) -> np.ndarray:
        return self.problem.prefs.min(axis=1)

    @property
    def c_d(self) -> float:
        return float(self.consts.c_d)

    @property
    def q(self) -> float:
        """Contraction factor ``1 − η c_d``."""
        return 1.0 - self.eta * self.c_d

    @property
    def eps0(self) -> np.ndarray:
        return np.asarray(self.consts.eps0)

    def slack(self, cs: ConstantSet | None = None) -> np.ndarray:
        """Per-step slack ``ε_{i,t} = η[λ_max,i(BΔ_i^t + L₀B²η/2) + b_i − c_d r_i^t]_+`` ``(T+1, N)``
        (docs/spec/iteration.md#iteration) for the
        constant set ``cs`` (default: the held-out run's)."""
        cs = self.constant_sets()[0] if cs is None else cs
        base = self.lam_max[None] * (cs.B * self.pl.deviation + 0.5 * self.L0 * cs.B**2 * self.eta)
        return self.eta * np.maximum(base + np.asarray(cs.b)[None] - cs.c_d * self.gap, 0.0)

    @property
    def gap(self) -> np.ndarray:
        return self.pl.gap

    def summary(self) -> dict:
        """Per-run constants for ``details`` (both estimates, O-8)."""
        rg = self.region
        late = slice(self.t0, None)
        viol = rg.resid[late] > 0
        ins = self.consts_insample
        half = self.consts_half
        return dict(
            spread=self.params["spread"], eta=self.eta, eta_factor=self.params["eta_factor"], L0=self.L0, B=self.B,
            heldout_constants=dict(c_d=self.c_d, b=self.consts.b, eps0=self.eps0, eta_c_d=self.eta * self.c_d,
                                   deviation_bar=self.consts.deviation_bar, beta_bar=self.beta_bar,
                                   source="iterates t >= t0 of a companion run (same problem and eta, another start)"),
            heldout_half_constants=(None if half is None else dict(c_d=half.c_d, b=half.b, eps0=half.eps0,
                                                                   eta_c_d=self.eta * half.c_d)),
            insample_constants=(None if ins is None else dict(c_d=ins.c_d, b=ins.b, eps0=ins.eps0,
                                                              eta_c_d=self.eta * ins.c_d,
                                                              note="estimated on the checked iterates (reported)")),
            region_constants=dict(R=rg.R, B=rg.B, c_d=rg.c_d, b=rg.b, eps0=rg.eps0, strict_c_d=rg.strict_c_d,
                                  n_points=rg.n_points, eta_c_d=self.eta * rg.c_d,
                                  half=None if rg.half is None else dict(c_d=rg.half.c_d, b=rg.half.b,
                                                                         eps0=rg.half.eps0,
                                                                         eta_c_d=self.eta * rg.half.c_d)),
            iterates_violating_region_constants=int(viol.sum()),
            iterates_checked_against_region=int(viol.size),
            first_violating_iterate=(None if not viol.any() else int(self.t0 + np.argwhere(viol)[0, 0])),
            eps0_region_over_eps0_iterates=float(rg.eps0.max() / self.eps0.max()),
            step_residual=self.step_residual,
        )


def _ball_points(rng, center, radius, n):
    v = rng.standard_normal((n, center.size))
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    rad = radius * rng.uniform(0.0, 1.0, n) ** (1.0 / center.size)
    return center + rad[:, None] * v


def region_constants(rng, P, traj, pl: PointLP, t0: int, eta_points, widths_eta, *, eps_mode, n_region,
                     region_min_radius, region_cover, n_grid, c_min) -> RegionConstants:
    """O-8 region constants: :func:`sim.constants.descent_margin_constants` on ``n_region`` uniform points of
    ``𝒩 = B(mean_i w_i*, R)``, ``R = max(region_min_radius, region_cover·max_{t≥t0}‖w^t − mean w_i*‖)``, with the
    exact F1 gradient bound on the ball. The margin of a sample point is the smallest over the near-active widths
    of every step size in ``widths_eta`` (H.19 must hold for each width in force, O-23); the ``c_d`` grid is
    ``[c_min, 1/max(widths_eta)]`` and the band uses ``max(widths_eta)``. ``resid`` checks the iterates with the
    width of the step in force at each iterate (``eta_points``, scalar or ``(T+1,)``)."""
    eta_max = float(max(widths_eta))
    lam_max = P.prefs.max(axis=1)
    L0 = float(smoothness_quadratic(P.hessians))
    center = P.w_star.mean(axis=0)
    dist = np.linalg.norm(traj - center, axis=1)
    R = max(region_min_radius, region_cover * float(dist[t0:].max()))
    B_reg = float(gradient_bound_quadratic_ball(P.hessians, P.centres, center, R))
    A = _ball_points(rng, center, R, n_region)
    pa = lp_at_points(P, A, P.psi_star, eps_mode=eps_mode)
    ok = pa.solved.all(axis=1)
    ma = np.min([margins_at_points(pa, float(e), B_reg)[0] for e in widths_eta], axis=0)
    rc = descent_margin_constants(ma[ok].T, pa.gap[ok].T, eta_max, lam_max, B_reg, L0, pa.deviation[ok].T,
                                  n_grid=n_grid, c_min=c_min)
    strict = strict_descent_constant(ma[ok], np.maximum(pa.gap[ok], 0.0))
    half = descent_margin_constants(ma[ok].T, pa.gap[ok].T, eta_max, lam_max, B_reg, L0, pa.deviation[ok].T,
                                    c_grid=np.geomspace(min(c_min, 0.5 / eta_max), 0.5 / eta_max, n_grid))
    m_it_reg, _, _ = margins_at_points(pl, eta_points, B_reg)
    resid = rc.c_d * np.maximum(pl.gap, 0.0) - rc.b[None] - m_it_reg
    return RegionConstants(center=center, R=R, B=B_reg, c_d=rc.c_d, b=rc.b, eps0=rc.eps0,
                           deviation_bar=rc.deviation_bar, strict_c_d=strict.c_d, resid=resid, inside=dist <= R,
                           n_points=int(ok.sum()), margin_iterates=m_it_reg, beta_bar=pa.beta[ok].max(axis=0),
                           half=half, dist=dist)


@memo_rng
def f1_chain(rng: np.random.Generator, *, m, n_w, n_clients, spread, eta_factor, rounds, t0, start_noise, eps_mode,
             n_grid, c_min, n_region, region_min_radius, region_cover, kappa_Q=3.0, s_c=1.0) -> ChainRun:
    """One T-H31 run (see :class:`ChainConfig`). Constants:

    * ``L₀ = max_j ‖Q_j‖`` (:func:`sim.constants.smoothness_quadratic`, exact);
    * ``B = max_{t,j} ‖g_j(w^t)‖`` over all iterates (:func:`sim.constants.gradient_bound`); exact on every
      segment ``[w^t, w^{t+1}]`` because ``w ↦ ‖Q_j(w − c_j)‖`` is convex (its max on a segment is at an end);
    * iterate constants: :func:`sim.constants.descent_margin_constants` on ``t0 ≤ t ≤ T`` (``c_d`` on a log grid of
      ``[c_min, 1/η]`` minimising ``max_i ε_{0,i}``, ``b_i = max(0, max_t(c_d r_i − m_i))``, ``Δ̄_i = max_t Δ_i^t``);
      ``β̄_i = max_{t ≥ t0} β_i(w^t)``;
    * region constants (O-8): the same procedure on ``n_region`` uniform points of ``𝒩 = B(mean w_i*, R)``,
      ``B`` = exact F1 bound on the ball (:func:`sim.constants.gradient_bound_quadratic_ball`).
    """
    P = PlantedQuadraticCluster.make(rng, m=m, n_w=n_w, n_clients=n_clients, spread=spread, kappa_Q=kappa_Q, s_c=s_c)
    N = P.n_clients
    L0 = float(smoothness_quadratic(P.hessians))
    eta = eta_factor / L0
    w0 = P.u0 @ P.centres + start_noise * rng.standard_normal(P.n_params)
    traj = shared_iteration(P, np.arange(N), w0, None, eta, rounds, eps_mode=eps_mode)
    pl = lp_at_points(P, traj, P.psi_star, eps_mode=eps_mode)
    # held-out companion run: same problem and step size, another start; the verdict's constants come from it
    w0_h = P.u0 @ P.centres + start_noise * rng.standard_normal(P.n_params)
    traj_h = shared_iteration(P, np.arange(N), w0_h, None, eta, rounds, eps_mode=eps_mode)
    pl_h = lp_at_points(P, traj_h, P.psi_star, eps_mode=eps_mode)
    B = float(max(gradient_bound(pl.grads), gradient_bound(pl_h.grads)))  # exact on both runs' segments
    margin, ea, _ = margins_at_points(pl, eta, B)
    margin_h, _, _ = margins_at_points(pl_h, eta, B)
    step_res = float(np.abs(traj[1:] - (traj[:-1] - eta * pl.dbar[:-1])).max()) if rounds else 0.0
    lam_max = P.prefs.max(axis=1)
    late = slice(t0, None)
    est = (margin_h[late].T, pl_h.gap[late].T, eta, lam_max, B, L0, pl_h.deviation[late].T)
    consts = descent_margin_constants(*est, n_grid=n_grid, c_min=c_min)
    consts_half = descent_margin_constants(*est, c_grid=np.geomspace(min(c_min, 0.5 / eta), 0.5 / eta, n_grid))
    consts_in = descent_margin_constants(margin[late].T, pl.gap[late].T, eta, lam_max, B, L0, pl.deviation[late].T,
                                         n_grid=n_grid, c_min=c_min)
    beta_bar = pl_h.beta[late].max(axis=0)

    region = region_constants(rng, P, traj, pl, t0, eta, (eta,), eps_mode=eps_mode, n_region=n_region,
                              region_min_radius=region_min_radius, region_cover=region_cover, n_grid=n_grid,
                              c_min=c_min)
    params = dict(m=m, n_w=n_w, n_clients=n_clients, spread=spread, eta_factor=eta_factor, rounds=rounds, t0=t0,
                  start_noise=start_noise, eps_mode=eps_mode)
    return ChainRun(problem=P, params=params, eta=eta, L0=L0, B=B, w0=w0, traj=traj, pl=pl, margin=margin,
                    eps_act=ea, consts=consts, beta_bar=beta_bar, region=region, step_residual=step_res,
                    consts_half=consts_half, consts_insample=consts_in,
                    heldout=dict(w0=w0_h, margin=margin_h, gap=pl_h.gap, deviation=pl_h.deviation, beta=pl_h.beta))


def f1_chains(cfg: ChainConfig, rng: np.random.Generator) -> list[ChainRun]:
    return [f1_chain(rng, **cfg.chain_params(k)) for k in range(cfg.n_runs)]


def step_hypotheses(run: ChainRun, cs: ConstantSet | None = None) -> dict[str, np.ndarray]:
    """Hypothesis margins (``≥ 0`` where held) of the one-step bound at every step ``t = 0..T−1`` and client,
    shape ``(T, N)``, for the constant set ``cs`` (default: the run's first verdict set, the held-out run's).

    H.1–H.3 (positivity and ``‖g_ij‖ ≤ B`` at both ends of ``[w^t, w^{t+1}]``; ``‖d̄^t‖ ≤ B``), LP solved, H.19 at
    ``w^t`` (``b_i − (c_d r_i^t − m_i^t)``, with ``1e-12`` of rounding allowance), ``β_i ≤ β̄_i``,
    ``Δ_i^t ≤ Δ̄_i``, ``1 − η c_d`` (``η c_d ≤ 1``), and ``w^t ∈ 𝒩`` for constants of a region."""
    cs = run.constant_sets()[0] if cs is None else cs
    pl, T, N = run.pl, run.T, run.N
    minloss = pl.losses.min(axis=(1, 2))
    gmax = pl.grad_norm.max(axis=(1, 2))
    bc = lambda a: np.broadcast_to(np.asarray(a)[:, None], (T, N))  # noqa: E731
    out = {
        H_POS: bc(np.minimum(minloss[:-1], minloss[1:])),
        H_GRAD: bc(cs.B - np.maximum(gmax[:-1], gmax[1:])),
        H_DBAR: bc(cs.B - np.linalg.norm(pl.dbar[:-1], axis=1)),
        H_LP: bc(np.where(pl.solved[:-1].all(axis=1), 1.0, -1.0)),
        H_H19: np.asarray(cs.b)[None] - (cs.c_d * np.maximum(pl.gap[:-1], 0.0) - cs.margin[:-1]) + 1e-12,
        H_BETA: np.asarray(cs.beta_bar)[None] - pl.beta[:-1] + 1e-12,
        H_DEV: np.asarray(cs.deviation_bar)[None] - pl.deviation[:-1] + 1e-12,
        H_STEP: np.full((T, N), 1.0 - run.eta * cs.c_d),
    }
    if cs.region_margin is not None:
        out[H_REGION] = bc(cs.region_margin[:-1])
    return out


def window_hypotheses(step_hyps: dict[str, np.ndarray], t0: int) -> dict[str, np.ndarray]:
    """Margins of "the hypotheses hold at every step ``t0 ≤ t < T'`` and for every client", for
    ``T' = t0+1..T``: shape ``(T − t0, N)`` (the same value for every client)."""
    out = {}
    for k, v in step_hyps.items():
        per_t = np.asarray(v)[t0:].min(axis=1)
        cum = np.minimum.accumulate(per_t)
        out[k] = np.broadcast_to(cum[:, None], (cum.size, np.asarray(v).shape[1]))
    return out


def sweep_constants(run: ChainRun, n_sweep: int) -> list[ConstantSet]:
    """``n_sweep`` other admissible H.19 constants of the run: ``c_d`` at evenly spaced indices of the run's grid
    (``[c_min, 1/η]``), each with ``b_i(c_d) = max(0, max_{t≥t0}(c_d r_i − m_i))`` over the held-out companion
    run's iterates and ``ε_{0,i}(c_d)`` from :func:`sim.constants.descent_margin_constants` on that single grid
    value. H.19 with each is monitored on the checked run; the theorem must hold wherever it does (no tuning: the
    values are fixed by the grid)."""
    if n_sweep <= 0:
        return []
    grid = np.asarray(run.consts.c_grid)
    idx = np.unique(np.linspace(0, grid.size - 1, n_sweep).round().astype(int))
    late = slice(run.t0, None)
    h = run.heldout
    out = []
    for c in grid[idx]:
        dc = descent_margin_constants(h["margin"][late].T, h["gap"][late].T, run.eta, run.lam_max, run.B, run.L0,
                                      h["deviation"][late].T, c_grid=np.array([c]))
        out.append(ConstantSet("c_d sweep", float(dc.c_d), np.asarray(dc.b), np.asarray(dc.eps0), run.B, run.margin,
                               np.asarray(dc.deviation_bar), run.beta_bar,
                               "held-out run, c_d fixed by the grid, b_i(c_d) on the companion's iterates"))
    return out


def set_repro(run: ChainRun, k: int, cs: ConstantSet) -> dict:
    """:func:`run_repro` with the constant set the rows used."""
    return dict(run_repro(run, k), constants=cs.label, c_d_used=cs.c_d, b_used=cs.b, eps0_used=cs.eps0,
                B_used=cs.B, constants_source=cs.source)


def run_repro(run: ChainRun, k: int) -> dict:
    """What reproduces a chain run: the call order (run ``k`` of the statement's seed) and its parameters."""
    return dict(source=f"f1_chain call {k} of the statement's rng (ChainConfig.chain_params({k}))", **run.params,
                eta=run.eta, B=run.B, L0=run.L0, c_d=run.c_d, b=run.consts.b, eps0=run.eps0, w0=run.w0,
                constants_from="held-out companion run from w0_heldout",
                w0_heldout=None if run.heldout is None else run.heldout["w0"])
