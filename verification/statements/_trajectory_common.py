r"""Shared helpers of the shared-iteration statements H.25, H.28, H.29, H.31, Cor-C, H.32, H.37 (private module:
the leading underscore keeps it out of statement discovery, see :mod:`verification.registry`).

Nothing here re-implements a formula or the iteration: trajectories come from
:func:`sim.algorithm.shared_iteration` (eq 55) or :func:`sim.algorithm.phase1`/:func:`sim.algorithm.phase2`, and
the per-iterate quantities from the :mod:`sim` kernels (:func:`sim.direction.lp_direction`,
:func:`sim.hull.near_active_set`, :func:`sim.hull.descent_margin`, :func:`sim.cluster.deviations`,
:func:`sim.constants.descent_margin_constants`, :func:`sim.constants.band_radius`, ...). The helpers only assemble
them.

* :func:`lp_at_points` / :func:`margins_at_points` — every client's EPO LP direction ``d_i(w)``, the shared
  direction ``d̄ = Σρ_i d_i``, ``Δ_i = ‖d̄ − d_i‖``, ``ψ_i``, ``r_i = ψ_i − ψ_i*``, ``β_i`` and the H.19 margin
  ``m_i(w) = min_{j ∈ J*_{i,ε}} λ_ij d_iᵀg_ij`` with ``ε_act = 2ηλ_max,i B²`` (``η`` may vary per point).
* :func:`f1_chain` — one T-H31 run (§3.1 "T-H28 / T-H29 / T-H31 / Cor-C"): F1 cluster, shared iteration, and the
  H.19 constants ``(c_d, b_i)``, ``Δ̄_i``, ``β̄_i`` estimated on **held-out iterates** — the iterates ``t ≥ t_0`` of
  a companion run of the same problem and step size from another start — so that they are never fitted to the
  iterates they are checked on (the verdict's constants; H.19, ``β ≤ β̄``, ``Δ ≤ Δ̄`` are then *monitored* on the
  checked run). Two held-out sets: the §1.11 choice on the grid ``[c_min, 1/η]`` (it often selects
  ``c_d = 1/η``, where ``q = 0`` and eq 65 reduces to ``r ≤ ε_0``) and the same on ``[c_min, 1/(2η)]``
  (``ηc_d ≤ ½``: a contraction with ``q ≥ ½``). The T-H31 design's in-sample constants (estimated on the checked
  iterates themselves) and the region constants on an independent uniform sample of ``𝒩`` (O-8) are reported.
  Runs are memoised on ``(rng state, parameters)`` and the generator is advanced exactly as a fresh computation
  would advance it, so the four statements that share the design share the work without changing any number.
* :func:`double_well_chain`, :func:`kink_chain` — the H.18 examples (F4, F5) run through
  :func:`sim.algorithm.shared_iteration` via a one-client adapter, with the constants the T-H31(e) design
  prescribes (strict ``c_d`` on the claimed region; ``B``, ``L₀`` on the visited interval).
* :func:`downsample` — figure tables of at most ``max_rows`` rows.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, fields
from functools import lru_cache

import numpy as np

from sim.algorithm import shared_iteration
from sim.cluster import aggregation_weights, deviations, shared_direction
from sim.constants import (
    descent_margin_constants,
    gradient_bound,
    gradient_bound_quadratic_ball,
    smoothness_hessian_max,
    smoothness_quadratic,
    strict_descent_constant,
)
from sim.direction import lp_direction
from sim.hull import descent_margin, eps_act, near_active_set
from sim.preference import chebyshev
from sim.problems import DoubleWell, Kink, PlantedQuadraticCluster
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
    """The falsification-search box of the T-H31 design (:mod:`verification.search`), shared by H.28, H.29, H.31,
    Cor-C and H.37: preference spread ``s_u``, step size ``ηL₀``, start noise, ``m``, ``n_w``, ``N``; one run of
    ``rounds`` rounds per evaluation (``fixed``: further fields of ``config_cls``)."""
    from verification.search import F1_SHAPE, LAMBDA_MIN, PLANTED_LAMBDA, Param, SearchSpace

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
        """Per-step slack ``ε_{i,t} = η[λ_max,i(BΔ_i^t + L₀B²η/2) + b_i − c_d r_i^t]_+`` ``(T+1, N)`` (§1.8) for the
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


# ============================================================================================ 1-D controls


class OneClient:
    """A one-client :class:`sim.algorithm.ClientProblem` over a 1-D example (F4 :class:`DoubleWell`, F5
    :class:`Kink`): ``losses_per_client``/``grads_per_client`` evaluate the example at each client's point."""

    n_clients = 1
    n_params = 1

    def __init__(self, example, psi_star: float):
        self.example = example
        self.prefs = np.asarray(example.prefs, dtype=np.float64)[None]
        self.psi_star = np.array([float(psi_star)])
        self.n_objectives = int(example.n_objectives)

    def losses_per_client(self, w):
        return self.example.losses(w)

    def grads_per_client(self, w):
        return self.example.grads(w)


@dataclass(frozen=True, eq=False)
class OneDimChain:
    """A 1-D example run through the shared iteration with the T-H31(e) constants (single client, ``Δ = 0``).

    ``w`` (T+1,), ``gap`` (T+1,), ``margin`` (T+1,) (with ``ε_act = 2ηλ_max B²``), ``c_d`` strict on the claimed
    region, ``b = 0``, ``B``/``L0`` as described by ``method``; ``region_margin`` (T+1,) ``≥ 0`` iff ``w^t ∈ 𝒩``;
    ``eps0`` the band radius eq 64; ``lam_min``; ``q_star`` (m,) the ray point of the optimum."""

    family: str
    eta: float
    w: np.ndarray
    gap: np.ndarray
    psi: np.ndarray
    margin: np.ndarray
    losses: np.ndarray
    grad_norm: np.ndarray
    c_d: float
    b: float
    B: float
    L0: float
    eps0: float
    region_margin: np.ndarray
    lam_max: float
    lam_min: float
    q_star: np.ndarray
    w_star: float
    mu_qg: float | None
    method: str
    extra: dict

    @property
    def q(self) -> float:
        return 1.0 - self.eta * self.c_d

    def summary(self) -> dict:
        return dict(family=self.family, eta=self.eta, c_d=self.c_d, b=self.b, B=self.B, L0=self.L0, eps0=self.eps0,
                    eta_c_d=self.eta * self.c_d, final_w=float(self.w[-1]), final_gap=float(self.gap[-1]),
                    iterates_outside_region=int((self.region_margin < 0).sum()), iterates=int(self.w.size),
                    method=self.method, **self.extra)


def _fd_second_derivative(example, x: np.ndarray, h: float = 1e-5) -> np.ndarray:
    """``l''`` by central differences of the example's gradient (F4's gradient is a cubic: error ``4h²``)."""
    xp, xm = (x + h)[:, None], (x - h)[:, None]
    return ((example.grads(xp) - example.grads(xm))[:, 0, 0] / (2 * h))


@lru_cache(maxsize=16)
def double_well_chain(eta: float, w0: float, steps: int, region: tuple, n_region: int, eps_mode: float) -> OneDimChain:
    """F4 from ``w0`` with step ``eta`` (T-H31(e)). ``ψ*`` and ``w*`` by the dense grid of F-OPT step 3; strict
    ``c_d = min l'(w)²/r(w)`` on a uniform grid of the claimed region (left well); ``B = max |l'|`` and
    ``L₀ = max |l''|`` (central differences of ``l'``) on a dense grid of the visited interval (its convex hull,
    which contains every segment)."""
    dw = DoubleWell()
    mins = dw.minima()
    w_star, psi_star = mins.global_w, mins.global_value
    src = OneClient(dw, psi_star)
    traj = shared_iteration(src, np.array([0]), np.array([w0]), None, eta, steps, eps_mode=eps_mode)
    lo, hi = float(traj.min()), float(traj.max())
    hull = np.linspace(lo, hi, 4001)
    B = float(gradient_bound(dw.grads(np.concatenate([hull, traj[:, 0]])[:, None])))
    L0 = float(smoothness_hessian_max(_fd_second_derivative(dw, hull)[:, None, None]))
    rlo, rhi = region
    Wr = np.linspace(rlo, rhi, n_region)[:, None]
    pr = lp_at_points(src, Wr, src.psi_star, eps_mode=eps_mode)
    mr, _, _ = margins_at_points(pr, eta, B)
    strict = strict_descent_constant(mr[:, 0], np.maximum(pr.gap[:, 0], 0.0))
    pl = lp_at_points(src, traj, src.psi_star, eps_mode=eps_mode)
    mt, _, _ = margins_at_points(pl, eta, B)
    c_d = strict.c_d
    eps0 = (1.0 / c_d) * (0.5 * L0 * B * B * eta)  # eq 64 with λ_max = 1, Δ̄ = 0 (one client), b = 0
    lp_is_gd = bool(np.allclose(pl.d[:, 0, 0], dw.grads(traj)[:, 0, 0], rtol=0, atol=1e-12))
    mu_qg = float(_fd_second_derivative(dw, np.array([w_star]))[0])
    return OneDimChain(
        family="F4 double well", eta=eta, w=traj[:, 0], gap=pl.gap[:, 0], psi=pl.psi[:, 0], margin=mt[:, 0],
        losses=pl.losses[:, 0], grad_norm=pl.grad_norm[:, 0].max(axis=-1), c_d=c_d, b=0.0, B=B, L0=L0, eps0=eps0,
        region_margin=np.minimum(traj[:, 0] - rlo, rhi - traj[:, 0]), lam_max=1.0, lam_min=1.0,
        q_star=np.array([psi_star]), w_star=w_star, mu_qg=mu_qg,
        method=(f"strict c_d = min m/r on a uniform grid of the claimed region N = [{rlo:g}, {rhi:g}] (left well); B = max|l'| "
                "and L0 = max|l''| (central differences of l') on the visited interval; eps0 = L0 B^2 eta/(2 c_d); "
                "QG constant mu = l''(w*) (left well)"),
        extra=dict(w_star=w_star, psi_star=psi_star, spurious_minimum=[float(mins.w[1]), float(mins.values[1])],
                   lp_is_gradient_descent=lp_is_gd),
    )


@lru_cache(maxsize=16)
def kink_chain(eta: float, w0: float, steps: int, region: tuple, n_region: int, eps_mode: float) -> OneDimChain:
    """F5 from ``w0`` with step ``eta`` (``ε_act = η``); strict ``c_d = min m/r`` on a uniform grid of the claimed
    region ``𝒩 = {region[0] ≤ |w| ≤ region[1]}`` (outside the ``ε_act`` band); ``B = 1``, ``L₀ = 0`` exact."""
    kink = Kink()
    src = OneClient(kink, kink.psi_star)
    traj = shared_iteration(src, np.array([0]), np.array([w0]), None, eta, steps, eps_mode=eps_mode)
    rlo, rhi = region
    half = np.linspace(rlo, rhi, n_region // 2)
    Wr = np.concatenate([-half[::-1], half])[:, None]
    pr = lp_at_points(src, Wr, src.psi_star, eps_mode=eps_mode)
    mr, _, _ = margins_at_points(pr, eta, kink.B)
    strict = strict_descent_constant(mr[:, 0], np.maximum(pr.gap[:, 0], 0.0))
    pl = lp_at_points(src, traj, src.psi_star, eps_mode=eps_mode)
    mt, ea, mask = margins_at_points(pl, eta, kink.B)
    c_d = strict.c_d
    lam_max = float(kink.prefs.max())
    eps0 = (lam_max / c_d) * (0.5 * kink.L0 * kink.B**2 * eta)  # = 0: L0 = 0, Δ̄ = 0, b = 0
    w = traj[:, 0]
    band = (np.abs(w) > 0) & (np.abs(w) < ea[:, 0])
    return OneDimChain(
        family="F5 kink", eta=eta, w=w, gap=pl.gap[:, 0], psi=pl.psi[:, 0], margin=mt[:, 0], losses=pl.losses[:, 0],
        grad_norm=pl.grad_norm[:, 0].max(axis=-1), c_d=c_d, b=0.0, B=kink.B, L0=kink.L0, eps0=eps0,
        region_margin=np.minimum(np.abs(w) - rlo, rhi - np.abs(w)), lam_max=lam_max, lam_min=float(kink.prefs.min()),
        q_star=kink.psi_star / kink.prefs, w_star=0.0, mu_qg=None,
        method=(f"strict c_d = min m/r on a uniform grid of the claimed region N = {{{rlo:g} <= |w| <= {rhi:g}}} (outside the "
                "eps_act band); B = 1, L0 = 0 exact (linear losses); eps0 = 0"),
        extra=dict(iterates_in_eps_act_band=int(band.sum()),
                   both_objectives_near_active_in_band=bool(mask[band, 0].all()) if band.any() else None,
                   min_margin_in_band=float(mt[band, 0].min()) if band.any() else None),
    )


def one_dim_controls(cfg: ChainConfig) -> list[OneDimChain]:
    """The F4 runs (every ``dw_etas``) and the F5 run of :class:`ChainConfig`."""
    out = [double_well_chain(float(e), float(cfg.dw_w0), int(cfg.dw_steps), tuple(cfg.dw_region),
                             int(cfg.n_region_1d), float(cfg.eps_mode)) for e in cfg.dw_etas]
    out.append(kink_chain(float(cfg.kink_eta), float(cfg.kink_w0), int(cfg.kink_steps), tuple(cfg.kink_region),
                          int(cfg.n_region_1d), float(cfg.eps_mode)))
    return out


H_QG = "H.34 quadratic growth at the final iterate: psi_i - psi_i* >= (mu_i/2)||w - w_i*||^2"


def one_dim_step_hyps(c: OneDimChain) -> dict[str, np.ndarray]:
    """Hypothesis margins at every step ``t = 0..T−1`` of a 1-D control run (``≥ 0`` where held)."""
    r, T = np.maximum(c.gap, 0.0), c.w.size - 1
    minloss = c.losses.min(axis=-1)
    return {
        H_REGION: c.region_margin[:-1],
        H_H19: c.b - (c.c_d * r[:-1] - c.margin[:-1]) + 1e-12,
        H_STEP: np.full(T, 1.0 - c.eta * c.c_d),
        H_POS: np.minimum(minloss[:-1], minloss[1:]),
        H_GRAD: c.B - np.maximum(c.grad_norm[:-1], c.grad_norm[1:]),
    }


def one_dim_rows(rows: RowSet, c: OneDimChain, checks, *, tail: int = 50) -> None:
    """Rows of the chain conclusions for a 1-D control run (``t0 = 0``, one client, ``Δ = 0``).

    ``checks`` ⊆ {"eq 62", "eq 63", "eq 65", "eq 66", "H.31 item 1", "eq 72", "eq 73"}; each check is named
    ``"<check> [<family> eta=<η>]"`` so that a control can require every family to show the failure."""
    tag = f"[{c.family} eta={c.eta:g}]"
    r = np.maximum(c.gap, 0.0)
    T = c.w.size - 1
    q = c.q
    hs = one_dim_step_hyps(c)
    win = {k: np.minimum.accumulate(v) for k, v in hs.items()}  # steps 0..T'-1 for T' = 1..T
    tt = np.arange(T)
    repro = dict(c.summary(), w0=float(c.w[0]), steps=int(T))
    quad = c.lam_max * 0.5 * c.L0 * c.B**2 * c.eta
    if "eq 62" in checks:
        rows.add(f"eq 62 {tag}", r[1:], q * r[:-1] + c.eta * (quad + c.b), hyps=hs,
                 info={"t": tt, "w": c.w[:-1], "r": r[:-1]}, repro=repro)
    if "eq 63" in checks:
        slack = c.eta * np.maximum(quad + c.b - c.c_d * r[:-1], 0.0)
        rows.add(f"eq 63 {tag}", c.psi[1:] - c.psi[:-1], slack, hyps=hs, info={"t": tt, "w": c.w[:-1]},
                 repro=repro)
    if "eq 65" in checks:
        rows.add(f"eq 65 {tag}", r[1:], q * r[:-1] + c.eta * c.c_d * c.eps0, hyps=hs,
                 info={"t": tt, "w": c.w[:-1], "r": r[:-1]}, repro=repro)
    Ts = np.arange(1, T + 1)
    qT = q ** Ts
    if "eq 66" in checks:
        rows.add(f"eq 66 {tag}", r[1:], qT * r[0] + (1 - qT) * c.eps0, hyps=win,
                 info={"T": Ts, "w_T": c.w[1:]}, repro=repro)
    if "H.31 item 1" in checks:
        rows.add(f"H.31 item 1 {tag}", r[1:], qT * r[0] + c.eps0, hyps=win, info={"T": Ts, "w_T": c.w[1:]},
                 repro=repro)
    if "eq 72" in checks:
        sel = np.arange(max(1, T - tail + 1), T + 1)
        m = c.losses.shape[-1]
        lhs = c.losses[sel] - c.q_star[None]
        rhs = ((q ** sel) * r[0] + c.eps0)[:, None] / c.lam_min
        rows.add(f"eq 72 {tag}", lhs, np.broadcast_to(rhs, lhs.shape),
                 hyps={k: np.repeat(v[sel - 1], m) for k, v in win.items()},
                 info={"T": np.repeat(sel, m), "j": np.tile(np.arange(m), sel.size)}, repro=repro)
    if "eq 73" in checks and c.mu_qg is not None:
        dist2 = (c.w[-1] - c.w_star) ** 2
        hyps = {k: v[-1] for k, v in win.items()}
        hyps[H_QG] = r[-1] - 0.5 * c.mu_qg * dist2 + 1e-12
        rows.add(f"eq 73 {tag}", dist2, (2.0 / c.mu_qg) * (q**T * r[0] + c.eps0), hyps=hyps,
                 info={"T": T, "w_T": c.w[-1], "mu": c.mu_qg}, repro=repro)


def one_dim_figure(controls) -> dict:
    """Figure table of the double-well control(s): ``t, eta, r, band (claimed ε_0), bound (q^t r^0 + ε_0)``."""
    cols = {"t": [], "eta": [], "r": [], "band": [], "bound": []}
    for c in controls:
        if not c.family.startswith("F4"):
            continue
        t = np.arange(c.w.size)
        cols["t"].append(t)
        cols["eta"].append(np.full(t.size, c.eta))
        cols["r"].append(np.maximum(c.gap, 0.0))
        cols["band"].append(np.full(t.size, c.eps0))
        cols["bound"].append(c.q**t * max(c.gap[0], 0.0) + c.eps0)
    if not cols["t"]:
        return {}
    tab = {k: np.concatenate(v) for k, v in cols.items()}
    return downsample(tab, 2000)


# ============================================================================================ figure tables


def downsample(table: dict, max_rows: int = 2000, key: str = "t") -> dict:
    """Keep at most ``max_rows`` rows of a column table, thinning the distinct values of ``key`` evenly."""
    cols = {k: np.asarray(v) for k, v in table.items()}
    n = len(next(iter(cols.values())))
    if n <= max_rows:
        return {k: v.tolist() for k, v in cols.items()}
    keys = np.unique(cols[key])
    per = max(1, n // keys.size)
    n_keep = max(2, max_rows // per)
    kept = keys[np.unique(np.linspace(0, keys.size - 1, n_keep).round().astype(int))]
    sel = np.isin(cols[key], kept)
    return {k: v[sel].tolist() for k, v in cols.items()}


def summary(x) -> dict:
    a = np.asarray(x, dtype=np.float64).ravel()
    a = a[np.isfinite(a)]
    if a.size == 0:
        return {"n": 0}
    return {"n": int(a.size), "min": float(a.min()), "median": float(np.median(a)), "max": float(a.max())}


# ============================================================================================ evidence assembly


def one_dim_control(stmt_id: str, name: str, cfg: ChainConfig, checks, *, tail: int = 50):
    """The shared negative control of the chain statements: F4 double well and F5 kink, where H.19 (and
    ``w ∈ 𝒩``) fail; ``checks`` are the conclusions of the statement evaluated on those runs."""
    controls = one_dim_controls(cfg)
    rows = RowSet()
    for c in controls:
        one_dim_rows(rows, c, checks, tail=tail)
    details = dict(controls=[c.summary() for c in controls], figure_data={"double_well": one_dim_figure(controls)})
    return rows.control(stmt_id, name, [H_REGION, H_H19], details, groups=("F4 double well", "F5 kink"))


def _conclusion_of(check: str) -> str:
    """``"eq 62 (c_d sweep)"`` → ``"eq 62"``: the conclusion a check label belongs to."""
    base = check.rsplit(" (", 1)[0] if check.endswith(")") and " (" in check else check
    return base.strip()


class RowSet:
    """Rows of conclusions ``lhs ≤ rhs`` from several blocks (checks), with per-row hypothesis margins.

    ``add(check, lhs, rhs, hyps, info, repro)``: ``hyps`` maps a hypothesis name to margins (``≥ 0`` where it
    holds; NaN fails) over the block's rows — a hypothesis a block does not give is *not applicable* there;
    ``info`` maps names to per-row arrays (or scalars) stored with a counterexample; ``repro`` is a JSON-able dict
    (the data that reproduces the block's instance) stored with each of its counterexamples."""

    def __init__(self):
        self.blocks: list[dict] = []

    def add(self, check: str, lhs, rhs, hyps=None, info=None, repro=None, *, conclusion: str | None = None,
            kind: str = "bound") -> None:
        """One block; ``conclusion`` names the conclusion it belongs to (default: the check label without a
        trailing parenthesis, e.g. ``"eq 62 (c_d sweep)"`` → ``"eq 62"``), ``kind`` its kind."""
        lhs = np.asarray(lhs, dtype=np.float64)
        rhs = np.broadcast_to(np.asarray(rhs, dtype=np.float64), lhs.shape).ravel()
        lhs = lhs.ravel()
        n = lhs.size
        h = {k: np.broadcast_to(np.asarray(v, dtype=np.float64), (n,)).ravel() if np.ndim(v) <= 1
             else np.asarray(v, dtype=np.float64).ravel() for k, v in (hyps or {}).items()}
        for k, v in h.items():
            if v.shape != (n,):
                raise ValueError(f"block {check!r}: hypothesis {k!r} has {v.size} margins for {n} rows")
        inf = {}
        for k, v in (info or {}).items():
            a = np.asarray(v)
            if a.ndim == 0:
                inf[k] = np.broadcast_to(a, (n,))
            elif a.size == n:
                inf[k] = a.ravel()
            else:  # one vector per row, e.g. a point w: shape (n, ...)
                inf[k] = a
            if inf[k].shape[0] != n:
                raise ValueError(f"block {check!r}: info {k!r} has {inf[k].size} entries for {n} rows")
        name = conclusion if conclusion is not None else _conclusion_of(check)
        self.blocks.append(dict(check=check, lhs=lhs, rhs=rhs, hyps=h, info=inf, repro=repro or {},
                                conclusion=name, kind=kind))

    def conclusion_args(self) -> dict:
        """``conclusion`` names (per row) and ``kinds`` for :meth:`Evidence.from_implication`."""
        names = [np.full(b["lhs"].size, b["conclusion"], dtype=object) for b in self.blocks]
        kinds: dict[str, str] = {}
        for b in self.blocks:
            if kinds.setdefault(b["conclusion"], b["kind"]) != b["kind"]:
                raise ValueError(f"conclusion {b['conclusion']!r} given as {b['kind']!r} and {kinds[b['conclusion']]!r}")
        return {"conclusion": np.concatenate(names) if names else np.zeros(0, dtype=object), "kinds": kinds}

    @property
    def n(self) -> int:
        return sum(b["lhs"].size for b in self.blocks)

    def arrays(self):
        lhs = np.concatenate([b["lhs"] for b in self.blocks]) if self.blocks else np.zeros(0)
        rhs = np.concatenate([b["rhs"] for b in self.blocks]) if self.blocks else np.zeros(0)
        return lhs, rhs

    def monitor(self):
        from verification.evidence import HypothesisMonitor

        mon = HypothesisMonitor(self.n)
        names: list[str] = []
        for b in self.blocks:
            for k in b["hyps"]:
                if k not in names:
                    names.append(k)
        for name in names:
            idx, mg = [], []
            start = 0
            for b in self.blocks:
                size = b["lhs"].size
                if name in b["hyps"]:
                    idx.append(np.arange(start, start + size))
                    mg.append(b["hyps"][name])
                start += size
            idx = np.concatenate(idx)
            mg = np.concatenate(mg)
            mon.record(name, np.nan_to_num(mg, nan=-np.inf) >= 0, margin=mg, index=idx)
        return mon

    def instance_data(self):
        starts = np.cumsum([0] + [b["lhs"].size for b in self.blocks])

        def rec(i: int) -> dict:
            k = int(np.searchsorted(starts, i, side="right") - 1)
            b = self.blocks[k]
            j = i - int(starts[k])
            out = {"check": b["check"], "row_in_check": j}
            out.update({name: arr[j] for name, arr in b["info"].items()})
            out["reproduce"] = b["repro"]
            return out

        return rec

    def check_counts(self, mask=None) -> dict:
        """Rows per check (and, with the monitor's mask, rows evaluated / failed)."""
        from verification.evidence import check_inequality

        out = {}
        start = 0
        for b in self.blocks:
            size = b["lhs"].size
            sel = slice(start, start + size)
            held = np.ones(size, bool) if mask is None else mask[sel]
            ok = check_inequality(b["lhs"], b["rhs"])
            d = out.setdefault(b["check"], {"rows": 0, "evaluated": 0, "violated": 0, "max_ratio": None})
            d["rows"] += size
            d["evaluated"] += int(held.sum())
            d["violated"] += int((held & ~ok).sum())
            pos = held & (b["rhs"] > 0)
            if pos.any():
                r = float(np.max(b["lhs"][pos] / b["rhs"][pos]))
                d["max_ratio"] = r if d["max_ratio"] is None else max(d["max_ratio"], r)
            start += size
        return out

    def evidence(self, stmt_id: str, name: str, details: dict, tightness_exclude=()):
        """Evidence of the implication over all rows. ``tightness_exclude``: substrings of check names left out of
        the headline tightness (e.g. a sharp scalar lemma); their own ratios stay in ``details["checks"]``."""
        from verification.evidence import Evidence

        mon = self.monitor()
        lhs, rhs = self.arrays()
        d = dict(details)
        d["checks"] = self.check_counts(mon.mask)
        tightness = "auto"
        if tightness_exclude:
            keep = np.concatenate([np.full(b["lhs"].size, not any(x in b["check"] for x in tightness_exclude))
                                   for b in self.blocks])
            sel = keep & mon.mask & (rhs > 0)
            tightness = float(np.max(lhs[sel] / rhs[sel])) if sel.any() else None
            d["tightness_excludes"] = list(tightness_exclude)
        return Evidence.from_implication(stmt_id, name, mon, lhs, rhs, instance_data=self.instance_data(), details=d,
                                         tightness=tightness, **self.conclusion_args())

    def control(self, stmt_id: str, name: str, broken, details: dict, groups=()):
        """Negative-control Evidence (:meth:`Evidence.from_control`). With ``groups`` (substrings of check
        names, e.g. the control families) the control counts as detected only if *every* group has a flagged
        row whose conclusion fails (each family must show the failure on its own)."""
        import dataclasses

        from verification.evidence import Evidence

        mon = self.monitor()
        lhs, rhs = self.arrays()
        broken = [broken] if isinstance(broken, str) else list(broken)
        flagged = np.zeros(self.n, bool)
        for bname in broken:
            if bname in mon.names:
                flagged |= mon.failed(bname)
        d = dict(details)
        counts = self.check_counts(flagged)
        d["checks_on_flagged_rows"] = counts
        per_group = {g: any(v["violated"] > 0 for k, v in counts.items() if g in k) for g in groups}
        if groups:
            d["detected_per_group"] = per_group
        ev = Evidence.from_control(stmt_id, name, mon, [b for b in broken if b in mon.names], lhs, rhs,
                                   instance_data=self.instance_data(), details=d, **self.conclusion_args())
        if groups and ev.control_detected and not all(per_group.values()):
            ev = dataclasses.replace(ev, control_detected=False)
        return ev
